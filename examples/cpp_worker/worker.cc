// An example C++ worker: takes jobs from a coordinator and "trains" on them (a sleep and a
// synthetic loss), using the traincoord client library. Each counted completion is printed as
//   accepted SET EPOCH INDEX BATCH,BATCH,...
// so a test can check that every batch was trained exactly once. On a step-mode run
// (docs/SEMANTICS.md, "Step mode") the worker is one rank of a synchronous group; each of its
// counted batches is printed as
//   accepted SET EPOCH INDEX rank=R step=S/STEPS samples=N:SAMPLE,SAMPLE,...
// and its completion reports the batch's sample count.
//
//   example_worker --url http://127.0.0.1:8470 --run example --name w0 --job-ms 5 [--prefetch 2]
//   example_worker ... --group g1 --rank 0 --world-size 3   # a rank (`traincoord launch` sets
//                                  # TRAINCOORD_GROUP, RANK and WORLD_SIZE, read when no flag)
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "traincoord/client.h"

int main(int argc, char** argv) {
  CLI::App app{"An example traincoord worker"};
  traincoord::client::Options options;
  // `traincoord launch` says where to go in the environment; flags override it.
  if (const char* v = std::getenv("TRAINCOORD_URL")) options.url = v;
  if (const char* v = std::getenv("TRAINCOORD_RUN")) options.run = v;
  if (const char* v = std::getenv("TRAINCOORD_WORKER")) options.worker_name = v;
  int job_ms = 0;
  int die_after = -1;
  double give_up_s = 60;
  app.add_option("--url", options.url, "the coordinator")->capture_default_str();
  app.add_option("--run", options.run, "the run (default: $TRAINCOORD_RUN)");
  app.add_option("--name", options.worker_name, "this worker's stable name");
  app.add_option("--job-ms", job_ms, "milliseconds each job takes");
  app.add_option("--die-after", die_after,
                 "exit abruptly (no goodbye) while holding the job after this many completions");
  app.add_option("--give-up-after", give_up_s, "seconds an unreachable coordinator is retried");
  size_t prefetch = 0;
  app.add_option("--prefetch", prefetch,
                 "jobs fetched ahead on a thread of their own (a JobStream; 0: one round trip "
                 "per job)");
  uint32_t rank = 0;
  uint32_t world_size = 0;
  auto* rank_flag = app.add_option("--rank", rank,
                                   "this worker's rank in its group (step mode; default: $RANK "
                                   "when a group is set)");
  auto* world_size_flag = app.add_option("--world-size", world_size,
                                         "the ranks of the group (default: $WORLD_SIZE when a "
                                         "group is set)");
  rank_flag->needs(world_size_flag);
  world_size_flag->needs(rank_flag);
  app.add_option("--group", options.group,
                 "the group: one start of the training job (default: $TRAINCOORD_GROUP)");
  CLI11_PARSE(app, argc, argv);
  if (*rank_flag) {
    options.rank = rank;
    options.world_size = world_size;
  }
  if (auto from_env = traincoord::client::rank_from_environment(options); !from_env) {
    std::cerr << "example_worker: " << from_env.error().message << "\n";
    return 2;
  }
  if (options.run.empty()) {
    std::cerr << "example_worker: no run to work on: start it with `traincoord launch --config "
                 "RUN.toml -- example_worker` (it sets TRAINCOORD_URL and TRAINCOORD_RUN), or "
                 "give --url http://HOST:8470 --run RUN, or set TRAINCOORD_URL and "
                 "TRAINCOORD_RUN\n";
    return 2;
  }
  options.give_up_after = std::chrono::milliseconds(static_cast<int64_t>(give_up_s * 1000));

  // Every failure names the coordinator, what happened (the client's message names the
  // request) and the code a program would decide on.
  auto report = [&](const traincoord::client::ClientError& e) {
    std::cerr << "example_worker: " << options.url << ": " << e.message << " (" << e.code << ")\n";
    return 1;
  };
  auto worker = traincoord::client::Worker::connect(options);
  if (!worker) return report(worker.error());
  auto& w = **worker;
  // A synthetic loss that falls with the epoch: enough to watch a loss curve move.
  auto train = [&](const traincoord::client::Job& j) {
    std::this_thread::sleep_for(std::chrono::milliseconds(job_ms));
    const double loss =
        1.0 / (1.0 + static_cast<double>(j.epoch)) + 0.001 * static_cast<double>(j.index % 7);
    // A step-mode job's batch is its samples; a job-mode job's, batches of 32 samples.
    const uint64_t samples = j.step_mode() ? j.samples.size() : j.batches.size() * 32;
    traincoord::client::Completion done;
    done.loss = loss;
    done.samples = samples;
    done.metrics = {{"accuracy", 1.0 - loss / 2}};
    return done;
  };
  auto print_accepted = [](const traincoord::client::Job& j) {
    if (j.step_mode()) {
      std::string samples;
      for (uint64_t x : j.samples) samples += (samples.empty() ? "" : ",") + std::to_string(x);
      std::cout << "accepted " << j.set << " " << j.epoch << " " << j.index << " rank=" << j.rank
                << " step=" << j.step << "/" << j.steps << " samples=" << j.samples.size() << ":"
                << samples << std::endl;
      return;
    }
    std::string batches;
    for (uint64_t b : j.batches) batches += (batches.empty() ? "" : ",") + std::to_string(b);
    std::cout << "accepted " << j.set << " " << j.epoch << " " << j.index << " " << batches
              << std::endl;
  };
  if (prefetch > 0) {
    traincoord::client::JobStream stream(w, prefetch);
    std::vector<traincoord::client::Job> sent;
    auto job = stream.next();
    for (; job && *job; job = stream.next()) {
      if (static_cast<int>(sent.size()) == die_after) {
        std::cout << "dying while holding " << (*job)->set << " " << (*job)->epoch << " "
                  << (*job)->index << std::endl;
        _exit(137);
      }
      stream.complete(**job, train(**job));
      sent.push_back(**job);
    }
    auto closed = stream.close();
    const auto outcomes = stream.outcomes();
    for (size_t i = 0; i < outcomes.size() && i < sent.size(); ++i) {
      if (outcomes[i].counted) print_accepted(sent[i]);
    }
    if (!job || !closed) return report(!job ? job.error() : closed.error());
    std::cout << "finished: " << w.finished()->state << ": " << w.finished()->reason << std::endl;
    return 0;
  }
  int completed = 0;
  auto job = w.next();
  while (job && *job) {
    const traincoord::client::Job& j = **job;
    if (completed == die_after) {
      std::cout << "dying while holding " << j.set << " " << j.epoch << " " << j.index << std::endl;
      _exit(137);  // like a SIGKILL: no leave, no completion
    }
    auto next = w.complete_and_next(j, train(j));
    if (next && w.last_completed().counted) print_accepted(j);
    ++completed;
    job = std::move(next);
  }
  if (!job) return report(job.error());
  std::cout << "finished: " << w.finished()->state << ": " << w.finished()->reason << std::endl;
  return 0;
}
