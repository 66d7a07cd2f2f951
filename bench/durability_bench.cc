// Durability costs, side by side in one run (docs/PERFORMANCE.md):
//  1. job cycles per second through the real server with --in-memory, --durability os and
//     --durability fsync, driven by W client threads on keep-alive connections;
//  2. restart time against history size: a run with N completed jobs is written to a data
//     dir, then restored as `traincoord serve` does on start.
//
//   build/durability_bench --traincoord build/traincoord [--workers 16] [--seconds 5]
//                          [--history 10000,100000,1000000]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "../tests/e2e/server_process.h"
#include "config/config_file.h"
#include "server/api.h"
#include "server/coordinator.h"
#include "server/restore.h"
#include "store/store.h"
#include "traincoord/client.h"

namespace traincoord {
namespace {

constexpr const char* kRun = R"(
name = "bench"
[data]
train_batches = 1000000000
[schedule]
epochs = 1
[leases]
timeout = 60.0
)";

double cycles_per_second(const std::string& url, int workers, double seconds) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> cycles{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      client::Options o;
      o.url = url;
      o.run = "bench";
      o.worker_name = "b" + std::to_string(w);
      o.heartbeats = false;
      auto worker = client::Worker::connect(o);
      if (!worker) return;
      client::Completion done;
      done.loss = 0.5;
      done.samples = 32;
      auto job = (*worker)->next();
      uint64_t mine = 0;
      while (job && *job && !stop) {
        job = (*worker)->complete_and_next(**job, done);
        ++mine;
      }
      cycles += mine;
    });
  }
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(cycles) / elapsed;
}

// A bench that could not write what it measures must stop, not report a figure.
template <typename T>
void must(const Result<T>& r, const char* what) {
  if (!r) {
    std::fprintf(stderr, "durability_bench: %s failed: %s\n", what, r.error().message.c_str());
    std::exit(1);
  }
}

// Writes a run with `jobs` completed jobs into `dir`, as the server would (one commit per 64
// requests), in-process for speed.
void write_history(const std::string& dir, uint64_t jobs) {
  StoreOptions o;
  o.dir = dir;
  o.durability = Durability::kOs;
  auto store = std::move(*Store::open(o));
  ServerClock clock;
  clock.go_live(0);
  Engine engine(clock);
  Api api(engine, clock);
  JournalObserver observer(*store);
  api.set_observer(&observer);
  must(engine.create_run(*parse_run_config(kRun, "bench")), "create_run");
  store->add_run("bench", "toml", kRun, 0);
  auto post = [&](const std::string& target, const std::string& body) {
    const TimeMs t = clock.hold();
    auto r = api.handle({"POST", target, body, {}});
    clock.release();
    store->add_record("bench", t, RecordKind::kRequest, target, body, 200);
    return std::get<HttpReply>(r).body;
  };
  post("/v1/runs/bench/workers", R"({"name": "w"})");
  std::string reply = post("/v1/runs/bench/acquire", R"({"worker": 0})");
  for (uint64_t i = 0; i < jobs; ++i) {
    const auto at = reply.find("\"lease\":");
    const std::string lease = reply.substr(at + 8, reply.find(',', at) - at - 8);
    reply = post("/v1/runs/bench/complete", R"({"worker": 0, "lease": )" + lease +
                                                R"(, "loss": 0.5, "samples": 32, "next": true})");
    if (i % 64 == 63) {
      must(store->commit(engine), "commit");
      must(store->snapshot_due(engine, clock.now()), "snapshot");
    }
  }
  must(store->commit(engine), "commit");
}

double restore_seconds(const std::string& dir, uint64_t* records) {
  StoreOptions o;
  o.dir = dir;
  const auto start = std::chrono::steady_clock::now();
  auto store = std::move(*Store::open(o));
  ServerClock clock;
  Engine engine(clock);
  Api api(engine, clock);
  auto report = restore_engine(*store, engine, api, clock);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *records = report ? report->records : 0;
  return s;
}

}  // namespace
}  // namespace traincoord

int main(int argc, char** argv) {
  using namespace traincoord;
  CLI::App app{"traincoord durability benchmark"};
  std::string binary;
  int workers = 16;
  double seconds = 5;
  std::vector<uint64_t> history = {10'000, 100'000, 1'000'000};
  app.add_option("--traincoord", binary, "the traincoord binary")->required();
  app.add_option("--workers", workers, "client threads");
  app.add_option("--seconds", seconds, "seconds per mode");
  app.add_option("--history", history, "completed jobs per restart measurement")->delimiter(',');
  CLI11_PARSE(app, argc, argv);

  testing::TempDir dir;
  const std::string config = dir.write("bench.toml", kRun);
  std::printf("job cycles per second, %d workers, %.0f s each, loopback:\n", workers, seconds);
  double memory = 0;
  struct Mode {
    const char* name;
    std::vector<std::string> args;
  };
  for (const Mode& m :
       {Mode{"in-memory", {"--in-memory"}},
        Mode{"os", {"--durability", "os", "--data-dir", dir.path() + "/os"}},
        Mode{"fsync", {"--durability", "fsync", "--data-dir", dir.path() + "/fsync"}}}) {
    std::vector<std::string> args = {"--config", config};
    args.insert(args.end(), m.args.begin(), m.args.end());
    auto server = testing::ServerProcess::start(args, 0, binary);
    if (!server) return 1;
    const double rate = cycles_per_second(server->url(), workers, seconds);
    if (memory == 0) memory = rate;
    std::printf("  %-10s %9.0f cycles/s   %.2fx in-memory\n", m.name, rate, rate / memory);
  }

  std::printf("restart time against history (snapshot every 100000 records):\n");
  for (uint64_t jobs : history) {
    const std::string data = dir.path() + "/history-" + std::to_string(jobs);
    const auto start = std::chrono::steady_clock::now();
    write_history(data, jobs);
    const double wrote =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    uint64_t records = 0;
    const double restore = restore_seconds(data, &records);
    const auto bytes = std::filesystem::file_size(data + "/traincoord.db");
    std::printf(
        "  %9llu completed jobs: restart %.3f s (%llu log records replayed), "
        "database %.0f MiB, written in %.1f s\n",
        static_cast<unsigned long long>(jobs), restore, static_cast<unsigned long long>(records),
        static_cast<double>(bytes) / (1 << 20), wrote);
  }
  return 0;
}
