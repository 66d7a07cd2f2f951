// Chaos, bounded (docs/HA.md "Chaos"): a real 3-member etcd cluster, two coordinators, three
// C++ workers (examples/cpp_worker) and two Python workers (the real client, python/traincoord:
// tests/etcd/chaos_worker.py), all given both urls, running flat out. Seeded (the seed is
// printed; TRAINCOORD_CHAOS_SEED replays it):
//   1. a coordinator is killed with SIGKILL (by its PID) at a random moment, and started again
//      on its port, TRAINCOORD_CHAOS_KILLS times (default 3; 20 by hand): first the one serving
//      the run (every run has a failover), then a random one (leader or standby); with
//      TRAINCOORD_CHAOS_LEADER_ONLY=1, always the one serving the run (N kills, N failovers);
//   2. one etcd member is killed: the run goes on; it comes back;
//   3. two etcd members (a majority) are killed: nothing is acknowledged to a worker meanwhile
//      (no "accepted" line, no coordinator answers a write), the workers wait; the members come
//      back, and the run goes on;
// and at the end: the run stopped early where an undisturbed run of the same config does (the
// same early-stop decisions, judged on the same dev losses), each job of each of its epochs
// counted exactly once (the coordinator's ledger and its history: one completion per job), no
// job told "accepted" to two workers, and every completion a worker was told was accepted is in
// the coordinator's history, under that worker. Prints each failover's time (from the kill of
// the leader to the other serving the run). The workers' time to finish is bounded by the run's
// size and by its progress (see finish_workers). Every process is stopped by its PID, also when
// the test fails.
#include <gtest/gtest.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "e2e/server_process.h"
#include "etcd/etcd_cluster.h"
#include "etcd/ha_http.h"

namespace traincoord {
namespace {

using testing::EtcdCluster;
using testing::http;
using testing::port_of;
using testing::read_file;
using testing::Reply;
using testing::ServerProcess;
using testing::TempDir;
using testing::WorkerProcess;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

class Chaos : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.started());
    started_ = Clock::now();
    kills_ = std::max(0, env_int("TRAINCOORD_CHAOS_KILLS", 3));
    leader_only_ = env_int("TRAINCOORD_CHAOS_LEADER_ONLY", 0) != 0;
    seed_ = static_cast<uint64_t>(
        env_int("TRAINCOORD_CHAOS_SEED", static_cast<int>(std::random_device{}() & 0x7fffffff)));
    std::printf(
        "chaos: seed %llu (TRAINCOORD_CHAOS_SEED=%llu replays it), %d coordinator kills (%s)\n",
        static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(seed_), kills_,
        leader_only_ ? "each of the leader" : "the first of the leader, then of a random one");
    rng_.seed(seed_);
    // Long enough that the chaos ends before the run does: ~200 jobs per kill, and more. The
    // workers' dev loss is 1 / (1 + epoch) + a little: dev epoch 0 is the best so far (a new
    // best; the run goes on), dev epoch 1 (~0.503) beats the stopping threshold: the run stops
    // early after two of its three epochs.
    std::ostringstream run;
    run << "name = \"chaos\"\n[data]\ntrain_batches = " << kTrainPerKill * (kills_ + 4)
        << "\ndev_batches = " << kDev << "\n[schedule]\nepochs = 3\nvalidation_every = 1\n"
        << "[leases]\ntimeout = 30.0\nmax_attempts = 100\non_job_failure = \"skip\"\n"
        << "[early_stop]\nrule = \"patience\"\npatience = 2\nstopping_threshold = 0.6\n";
    config_ = dir_.write("chaos.toml", run.str());
    journal_ = "etcd://" + cluster_.endpoints() + "/chaos";
  }

  std::unique_ptr<ServerProcess> start_coordinator(uint16_t port = 0) {
    return ServerProcess::start({"--config", config_, "--journal", journal_}, port);
  }

  // The workers of a run, given `urls` (the coordinators, separated by commas): three of the C++
  // client, two of the Python client (py0 in `for job in run.jobs()`, py1 completing each job
  // at once), each taking `job_ms` a job; their output in `out_prefix`N.out.
  void start_workers(const std::string& urls, int job_ms, const std::string& out_prefix) {
    for (int w = 0; w < 5; ++w) {
      const std::string out = out_prefix + std::to_string(w) + ".out";
      const std::string name = (w < 3 ? "w" : "py") + std::to_string(w < 3 ? w : w - 3);
      if (w < 3) {
        workers_.push_back(std::make_unique<WorkerProcess>(
            std::vector<std::string>{EXAMPLE_WORKER_BIN, "--url", urls, "--run", "chaos", "--name",
                                     name, "--job-ms", std::to_string(job_ms), "--give-up-after",
                                     "60"},
            out));
      } else {
        workers_.push_back(std::make_unique<WorkerProcess>(
            std::vector<std::string>{
                "/usr/bin/env", "PYTHONPATH=" + std::string(TRAINCOORD_SOURCE_DIR) + "/python",
                "PYTHONDONTWRITEBYTECODE=1", "TRAINCOORD_URL=" + urls, "TRAINCOORD_RUN=chaos",
                "TRAINCOORD_WORKER=" + name, "/usr/bin/python3",
                std::string(TRAINCOORD_SOURCE_DIR) + "/tests/etcd/chaos_worker.py",
                w == 3 ? "loop" : "each", std::to_string(job_ms)},
            out));
      }
      worker_names_.push_back(name);
      worker_outs_.push_back(out);
    }
  }

  // Which coordinator serves the run now (-1: none).
  int leader() {
    for (int i = 0; i < 2; ++i) {
      if (coordinators_[i] &&
          http(urls_[i], "GET", "/v1/runs/chaos?epochs=0", "", 1000).status == 200)
        return i;
    }
    return -1;
  }

  // Waits (at most `seconds`) until a coordinator serves the run; returns it (-1: none did).
  int await_leader(int seconds = 30) {
    for (int i = 0; i < seconds * 20; ++i) {
      if (int l = leader(); l >= 0) return l;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

  // The run's status from its leader (a null document when none answers).
  rapidjson::Document status(const std::string& query = "?epochs=0") {
    rapidjson::Document d;
    for (int i = 0; i < 2; ++i) {
      const Reply r = http(urls_[i], "GET", "/v1/runs/chaos" + query, "", 2000);
      if (r.status == 200) {
        d.Parse(r.body.c_str());
        return d;
      }
    }
    d.Parse("null");
    return d;
  }
  int64_t accepted_by_leader() {
    rapidjson::Document d = status();
    return d.IsObject() ? d["counters"]["completions_accepted"].GetInt64() : -1;
  }
  bool running() {
    rapidjson::Document d = status();
    return d.IsObject() && std::string(d["state"].GetString()) == "running";
  }
  // Waits (at most `seconds`) until the leader has accepted `more` completions beyond `from`.
  bool progresses(int64_t from, int64_t more, int seconds = 30) {
    for (int i = 0; i < seconds * 10; ++i) {
      if (accepted_by_leader() >= from + more) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // The workers' "OUTCOME SET EPOCH INDEX ..." lines ("accepted" by both clients, also
  // "duplicate" and others by the Python one): job ("SET EPOCH INDEX") -> the names of the
  // workers told it was `outcome`, one per line.
  std::map<std::string, std::vector<std::string>> told(const std::string& outcome = "accepted") {
    std::map<std::string, std::vector<std::string>> jobs;
    for (size_t w = 0; w < worker_outs_.size(); ++w) {
      std::istringstream lines(read_file(worker_outs_[w]));
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind(outcome + " ", 0) != 0) continue;
        std::istringstream words(line.substr(outcome.size() + 1));
        std::string set, epoch, index;
        words >> set >> epoch >> index;
        jobs[set + " " + epoch + " " + index].push_back(worker_names_[w]);
      }
    }
    return jobs;
  }
  // How many "accepted" lines the workers that print them as soon as told have printed (py0's
  // may come later: it prints a completion's once the loop hands it the next job).
  size_t told_count() {
    size_t n = 0;
    for (const auto& [job, names] : told())
      n += std::count_if(names.begin(), names.end(),
                         [](const std::string& name) { return name != "py0"; });
    return n;
  }

  // The jobs of the run (and of the undisturbed one): two train epochs and two dev epochs.
  int64_t run_jobs() const { return 2 * kTrainPerKill * (kills_ + 4) + 2 * kDev; }

  // Waits until every worker has exited; returns their exit statuses (-1: still running). Bounded
  // by the run's size (120 s and 1 s per 25 of its jobs: a long run on a loaded machine; the
  // run's 20-kill variant under load 11 finished 9,624 jobs at ~60 a second) and by its progress:
  // gives up once neither the leader's accepted completions nor the workers that exited have
  // changed for 90 s.
  std::vector<int> finish_workers() {
    double bound = 120.0 + static_cast<double>(run_jobs()) / 25.0;
    if (!std::getenv("TRAINCOORD_CHAOS_KILLS")) {
      // Under ctest (its TIMEOUT is 120 s for every etcd test) the test fails by itself first,
      // so its fixtures stop every process by PID: what is left of 105 s from SetUp.
      bound = std::min(bound, std::max(5.0, 105.0 - seconds_since(started_)));
    }
    const auto from = Clock::now();
    auto moved = from;
    std::pair<int64_t, size_t> seen{-1, 0};  // (accepted completions, workers exited)
    std::vector<int> exited(workers_.size(), -1);
    while (seconds_since(from) < bound && seconds_since(moved) < 90.0) {
      size_t done = 0;
      for (size_t w = 0; w < workers_.size(); ++w) {
        exited[w] = workers_[w]->wait(0);
        done += exited[w] == -1 ? 0 : 1;
      }
      if (done == workers_.size()) break;
      const std::pair<int64_t, size_t> now{std::max<int64_t>(seen.first, accepted_by_leader()),
                                           done};
      if (now != seen) {
        seen = now;
        moved = Clock::now();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    std::printf("chaos: the workers finished in %.1f s (bound %.0f s)\n", seconds_since(from),
                bound);
    return exited;
  }

  std::string say_all() {
    std::string s;
    for (int i = 0; i < 2; ++i) {
      if (coordinators_[i])
        s += "\ncoordinator " + urls_[i] + ":\n" + coordinators_[i]->read_output();
    }
    for (size_t w = 0; w < worker_outs_.size(); ++w) {
      const std::string out = read_file(worker_outs_[w]);
      s += "\nworker " + worker_names_[w] + " (last lines):\n" +
           out.substr(out.size() > 1500 ? out.size() - 1500 : 0);
    }
    return s;
  }

  EtcdCluster cluster_;
  TempDir dir_;
  Clock::time_point started_ = Clock::now();
  int kills_ = 3;
  bool leader_only_ = false;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string config_, journal_;
  std::unique_ptr<ServerProcess> coordinators_[2];
  std::string urls_[2];
  std::vector<std::unique_ptr<WorkerProcess>> workers_;
  std::vector<std::string> worker_names_, worker_outs_;
  static constexpr int kTrainPerKill = 200, kDev = 12;
};

// The coordinator's history of `run` from `url` (JSON lines): job ("SET EPOCH INDEX") -> the
// workers its counted completions name, one per completion.
std::map<std::string, std::vector<std::string>> history_jobs(const std::string& url) {
  std::map<std::string, std::vector<std::string>> jobs;
  const Reply r = http(url, "GET", "/v1/runs/chaos/history?format=jsonl", "", 10000);
  EXPECT_EQ(r.status, 200) << r.body;
  std::istringstream lines(r.body);
  for (std::string line; std::getline(lines, line);) {
    rapidjson::Document d;
    d.Parse(line.c_str());
    if (d.HasParseError() || !d.IsObject() || std::string(d["kind"].GetString()) != "job") continue;
    jobs[std::string(d["set"].GetString()) + " " + std::to_string(d["epoch"].GetInt64()) + " " +
         std::to_string(d["job"].GetInt64())]
        .push_back(d["worker"].IsString() ? d["worker"].GetString() : "?");
  }
  return jobs;
}

// Whether two JSON values are the same, numbers within 1e-12 (a mean summed in another order).
bool same_json(const rapidjson::Value& a, const rapidjson::Value& b) {
  if (a.IsNumber() && b.IsNumber()) return std::fabs(a.GetDouble() - b.GetDouble()) <= 1e-12;
  if (a.GetType() != b.GetType()) return false;
  if (a.IsObject()) {
    if (a.MemberCount() != b.MemberCount()) return false;
    for (const auto& m : a.GetObject()) {
      if (!b.HasMember(m.name) || !same_json(m.value, b[m.name])) return false;
    }
    return true;
  }
  if (a.IsArray()) {
    if (a.Size() != b.Size()) return false;
    for (rapidjson::SizeType i = 0; i < a.Size(); ++i) {
      if (!same_json(a[i], b[i])) return false;
    }
    return true;
  }
  return a == b;
}

std::string json_text(const rapidjson::Value& v) {
  rapidjson::StringBuffer out;
  rapidjson::Writer<rapidjson::StringBuffer> w(out);
  v.Accept(w);
  return out.GetString();
}

TEST_F(Chaos, CoordinatorsAndEtcdMembersKilledAtRandomTheRunCountsEachJobOnce) {
  coordinators_[0] = start_coordinator();
  ASSERT_TRUE(coordinators_[0]);
  urls_[0] = coordinators_[0]->url();
  ASSERT_EQ(await_leader(), 0);
  coordinators_[1] = start_coordinator();
  ASSERT_TRUE(coordinators_[1]);
  urls_[1] = coordinators_[1]->url();
  start_workers(urls_[1] + "," + urls_[0], 20, dir_.path() + "/w");
  ASSERT_TRUE(progresses(0, 30)) << say_all();

  // 1. Coordinators killed at random moments.
  std::vector<double> failovers;
  for (int k = 0; k < kills_; ++k) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 1500)(rng_)));
    ASSERT_TRUE(running()) << "the run ended before kill " << k + 1 << "; make it longer"
                           << say_all();
    const int drawn = std::uniform_int_distribution<int>(0, 1)(rng_);
    const bool of_leader = leader_only_ || k == 0;
    const int led = of_leader ? await_leader() : leader();
    ASSERT_TRUE(!of_leader || led >= 0)
        << "no coordinator serves the run before kill " << k + 1 << say_all();
    const int victim = of_leader ? led : drawn;
    const auto killed_at = Clock::now();
    coordinators_[victim]->kill(SIGKILL);
    coordinators_[victim].reset();
    const int now_leads = await_leader();
    ASSERT_GE(now_leads, 0) << "no coordinator serves the run after kill " << k + 1 << say_all();
    if (victim == led) {
      failovers.push_back(seconds_since(killed_at));
      std::printf("chaos: kill %d: the leader %s; %s serves the run %.2f s later\n", k + 1,
                  urls_[victim].c_str(), urls_[now_leads].c_str(), failovers.back());
    } else {
      std::printf("chaos: kill %d: the standby %s\n", k + 1, urls_[victim].c_str());
    }
    coordinators_[victim] = start_coordinator(port_of(urls_[victim]));
    ASSERT_TRUE(coordinators_[victim]) << "cannot start " << urls_[victim] << " again";
  }
  if (!failovers.empty()) {
    std::sort(failovers.begin(), failovers.end());
    std::printf("chaos: %zu failovers: min %.2f s, median %.2f s, max %.2f s\n", failovers.size(),
                failovers.front(), failovers[failovers.size() / 2], failovers.back());
  }

  // 2. One etcd member killed: the run goes on.
  ASSERT_TRUE(running()) << "the run ended before the etcd kills; make it longer" << say_all();
  const size_t one = std::uniform_int_distribution<size_t>(0, 2)(rng_);
  cluster_.kill(one);
  std::printf("chaos: etcd member %zu killed\n", one);
  EXPECT_TRUE(progresses(accepted_by_leader(), 30))
      << "no progress with one etcd member down" << say_all();
  ASSERT_TRUE(cluster_.restart(std::vector<size_t>{one}));

  // 3. A majority killed: nothing acknowledged meanwhile; back, the run goes on.
  ASSERT_TRUE(running()) << "the run ended before the majority kill; make it longer" << say_all();
  const size_t keep = std::uniform_int_distribution<size_t>(0, 2)(rng_);
  std::vector<size_t> majority;
  for (size_t i = 0; i < 3; ++i) {
    if (i != keep) majority.push_back(i);
  }
  for (size_t i : majority) cluster_.kill(i);
  std::printf("chaos: etcd members %zu and %zu killed (member %zu alone)\n", majority[0],
              majority[1], keep);
  // (a reply of a write etcd committed before the kill may still be on its way)
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const size_t told_before = told_count();
  const auto outage = Clock::now();
  int probes = 0;
  // (past the 5 s a journal write takes to give up on etcd: a coordinator that answered a wave
  // whose write failed would be seen here)
  while (seconds_since(outage) < 6.0) {
    for (int i = 0; i < 2; ++i) {
      const Reply r = http(urls_[i], "POST", "/v1/runs/chaos/workers",
                           R"({"name": "probe)" + std::to_string(probes++) + "\"}", 1000);
      EXPECT_NE(r.status, 200) << urls_[i] << " took a write without an etcd majority: " << r.body;
    }
  }
  EXPECT_EQ(told_count(), told_before) << "a worker was told a job was accepted while etcd "
                                          "could commit nothing";
  for (size_t w = 0; w < workers_.size(); ++w) {
    EXPECT_EQ(workers_[w]->wait(0), -1)
        << "worker " << w << " gave up during the outage" << say_all();
  }
  ASSERT_TRUE(cluster_.restart(majority)) << "etcd members did not come back";
  const auto back = Clock::now();
  ASSERT_GE(await_leader(), 0) << say_all();
  std::printf("chaos: etcd back; a coordinator serves the run %.2f s later\n", seconds_since(back));

  // The run finishes (stopped early after dev epoch 1, as decided below): each job of each of
  // its epochs counted once.
  const std::vector<int> exited = finish_workers();
  for (size_t w = 0; w < workers_.size(); ++w) {
    EXPECT_EQ(exited[w], 0) << "worker " << worker_names_[w] << say_all();
  }
  rapidjson::Document d = status("?epochs=1000");
  ASSERT_TRUE(d.IsObject()) << say_all();
  EXPECT_STREQ(d["state"].GetString(), "early_stopped");
  int64_t jobs = 0;
  ASSERT_EQ(d["epochs"].Size(), 4u);  // train 0, dev 0, train 1, dev 1 (then the stop)
  for (const auto& e : d["epochs"].GetArray()) {
    EXPECT_EQ(e["done"].GetInt64(), e["jobs"].GetInt64());
    EXPECT_EQ(e["failed"].GetInt64(), 0);
    jobs += e["jobs"].GetInt64();
  }
  EXPECT_EQ(jobs, run_jobs());
  EXPECT_EQ(d["counters"]["completions_accepted"].GetInt64(), jobs);
  // No job told "accepted" to two workers; the coordinator's history (the completions it
  // counted since it started: a snapshot does not keep them) names each job once, and under
  // the worker that was told it was accepted (none lost, none given to another).
  const auto jobs_told = told();
  for (const auto& [job, names] : jobs_told) {
    EXPECT_EQ(names.size(), 1u) << "told accepted twice: " << job;
  }
  const auto history = history_jobs(urls_[leader() >= 0 ? leader() : 0]);
  EXPECT_GT(history.size(), 0u);
  EXPECT_LE(static_cast<int64_t>(history.size()), jobs);
  size_t in_history = 0;
  for (const auto& [job, names] : history) {
    EXPECT_EQ(names.size(), 1u) << "counted twice: " << job;
    auto it = jobs_told.find(job);
    if (it == jobs_told.end()) continue;  // (its reply was lost: told duplicate, if told)
    in_history += 1;
    EXPECT_EQ(it->second[0], names[0]) << job << " was told accepted to " << it->second[0]
                                       << ", the coordinator counted " << names[0] << "'s";
  }
  // (a completion whose reply died with a leader is told "duplicate" on its retry: missing
  // from the "accepted" lines, never counted twice; the Python workers say so)
  EXPECT_LE(static_cast<int64_t>(jobs_told.size()), jobs);
  EXPECT_GE(static_cast<int64_t>(jobs_told.size()), jobs - 5 * (kills_ + 2));
  size_t by_python = 0;
  for (const auto& [job, names] : jobs_told) by_python += names[0].rfind("py", 0) == 0 ? 1 : 0;
  EXPECT_GT(by_python, 0u) << "the Python workers had no completion accepted" << say_all();
  const auto duplicates = told("duplicate");
  rapidjson::Document stopped;
  stopped.CopyFrom(d["early_stop"], stopped.GetAllocator());
  std::printf(
      "chaos: seed %llu: %lld jobs, each counted once (%zu told accepted, %zu of them to "
      "the Python workers; %zu told duplicate; %zu in the serving leader's history); "
      "%s\n",
      static_cast<unsigned long long>(seed_), static_cast<long long>(jobs), jobs_told.size(),
      by_python, duplicates.size(), in_history, d["reason"].GetString());

  // An undisturbed run of the same config, the same workers (no job time), a coordinator of its
  // own on the same etcd cluster: the same early-stop decisions.
  for (int i = 0; i < 2; ++i) coordinators_[i].reset();
  workers_.clear();
  worker_names_.clear();
  worker_outs_.clear();
  const auto calm_from = Clock::now();
  journal_ = "etcd://" + cluster_.endpoints() + "/calm";
  coordinators_[0] = start_coordinator();
  ASSERT_TRUE(coordinators_[0]);
  urls_[0] = coordinators_[0]->url();
  ASSERT_EQ(await_leader(), 0);
  start_workers(urls_[0], 0, dir_.path() + "/calm");
  const std::vector<int> calm_exited = finish_workers();
  for (size_t w = 0; w < workers_.size(); ++w) {
    EXPECT_EQ(calm_exited[w], 0) << "worker " << worker_names_[w] << say_all();
  }
  rapidjson::Document calm = status("?epochs=1000");
  ASSERT_TRUE(calm.IsObject()) << say_all();
  EXPECT_STREQ(calm["state"].GetString(), "early_stopped");
  EXPECT_EQ(calm["counters"]["completions_accepted"].GetInt64(), jobs);
  EXPECT_TRUE(same_json(calm["early_stop"], stopped))
      << "undisturbed: " << json_text(calm["early_stop"]) << "\nchaos: " << json_text(stopped);
  EXPECT_STREQ(calm["reason"].GetString(), d["reason"].GetString());
  EXPECT_EQ(calm["early_stop"]["stopped_at_epoch"].GetInt64(), 1);
  std::printf("chaos: the undisturbed run took %.1f s; the same early-stop decisions\n",
              seconds_since(calm_from));
}

}  // namespace
}  // namespace traincoord
