// The coordinator is killed with SIGKILL at random moments while real workers train, and
// restarted on the same data dir each time. At the end nothing a worker was told is lost:
// every batch of every epoch was completed exactly once, every accepted completion is in the
// store, the epoch losses are those of the completions, and early stopping decided as it
// would have without a crash. The seed is printed; TRAINCOORD_CRASH_SEED=N replays its kills.
#include <gtest/gtest.h>

#include <rapidjson/document.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/early_stop.h"
#include "server_process.h"
#include "store/sqlite.h"
#include "traincoord/client.h"

namespace traincoord {
namespace {

using testing::ServerProcess;
using testing::TempDir;

constexpr int kTrainBatches = 120;
constexpr int kDevBatches = 12;
constexpr int kEpochs = 8;

constexpr const char* kRun = R"(
name = "crash"
[data]
train_batches = 120
dev_batches = 12
order = "shuffled"
seed = 11
[schedule]
epochs = 8
[leases]
timeout = 1.0
[early_stop]
rule = "patience"
patience = 2
)";

// The loss every worker reports for a job: a function of the job alone, so that whichever
// worker completes it, the epoch losses are known in advance. Dev losses fall, then rise from
// epoch 3 on: patience 2 stops after dev epoch 4.
double loss_of(const std::string& set, int64_t epoch, uint64_t index) {
  if (set == "dev")
    return (epoch < 3 ? 1.0 - 0.1 * static_cast<double>(epoch)
                      : 0.7 + 0.05 * static_cast<double>(epoch)) +
           0.001 * static_cast<double>(index);
  return 2.0 / (1.0 + static_cast<double>(epoch)) + 0.0001 * static_cast<double>(index);
}

struct Accepted {
  std::string set;
  int64_t epoch;
  uint64_t index;
  uint64_t lease;
  std::vector<uint64_t> batches;
  double loss;
  uint64_t samples;
};

// With both durabilities: "fsync" commits on the store thread; "os" mostly on the engine's own
// thread (HttpServer's commit_here), the store thread taking a wave only while it writes one.
// A SIGKILL loses neither (the OS keeps what was written).
class CrashRecovery : public ::testing::TestWithParam<const char*> {};

INSTANTIATE_TEST_SUITE_P(Durability, CrashRecovery, ::testing::Values("fsync", "os"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param);
                         });

TEST_P(CrashRecovery, KillNineAtRandomMomentsLosesNothing) {
  const uint64_t seed = std::getenv("TRAINCOORD_CRASH_SEED")
                            ? std::strtoull(std::getenv("TRAINCOORD_CRASH_SEED"), nullptr, 10)
                            : std::random_device{}();
  std::printf("crash test seed %llu (replay with TRAINCOORD_CRASH_SEED=%llu)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  SCOPED_TRACE("TRAINCOORD_CRASH_SEED=" + std::to_string(seed));
  TempDir dir;
  const std::string config = dir.write("crash.toml", kRun);
  const std::vector<std::string> args = {
      "--config",         config, "--data-dir",   dir.path() + "/data",
      "--snapshot-every", "50",   "--durability", GetParam()};
  std::unique_ptr<ServerProcess> server = ServerProcess::start(args);
  ASSERT_NE(server, nullptr);
  const uint16_t port = server->port();
  const std::string url = server->url();

  std::mutex mu;
  std::vector<Accepted> accepted;
  std::atomic<bool> workers_done{false};
  std::vector<std::string> endings(4);
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      client::Options o;
      o.url = url;
      o.run = "crash";
      o.worker_name = "w" + std::to_string(w);
      o.long_poll = std::chrono::milliseconds(500);
      o.request_timeout = std::chrono::milliseconds(2000);
      o.connect_timeout = std::chrono::milliseconds(500);
      o.initial_backoff = std::chrono::milliseconds(10);
      o.max_backoff = std::chrono::milliseconds(100);
      o.give_up_after = std::chrono::seconds(60);
      auto worker = client::Worker::connect(o);
      if (!worker) {
        endings[w] = "connect: " + worker.error().message;
        return;
      }
      auto job = (*worker)->next();
      while (job && *job) {
        const client::Job j = **job;
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        const double loss = loss_of(j.set, j.epoch, j.index);
        job = (*worker)->complete_and_next(j, {loss, j.batches.size() * 10, {}, 0});
        // "duplicate": this lease's completion was counted by an earlier try whose reply a
        // crash swallowed. Either way the worker was told its work counts.
        const std::string& outcome = (*worker)->last_completed().outcome;
        if (job && (outcome == "accepted" || outcome == "duplicate")) {
          std::lock_guard lock(mu);
          accepted.push_back(
              {j.set, j.epoch, j.index, j.lease, j.batches, loss, j.batches.size() * 10});
        }
      }
      endings[w] = job ? (*worker)->finished()->state : "error: " + job.error().message;
    });
  }

  // The killer: at least 30 SIGKILLs at random moments, each followed by a restart.
  std::mt19937_64 rng(seed);
  int kills = 0;
  // (under ctest's TIMEOUT of 120 s, with room for the checks after it)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  std::thread killer([&] {
    while (kills < 30 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 120));
      server->kill(SIGKILL);
      ++kills;
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
      const auto before = std::chrono::steady_clock::now();
      server = ServerProcess::start(args, port);
      if (!server) return;
      if (std::getenv("CRASH_VERBOSE")) {
        std::fprintf(stderr, "kill %d: restart took %lld ms\n", kills,
                     static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                std::chrono::steady_clock::now() - before)
                                                .count()));
      }
    }
  });
  killer.join();
  for (auto& t : workers) t.join();
  ASSERT_NE(server, nullptr) << "the coordinator did not restart";
  EXPECT_GE(kills, 30);
  for (const std::string& e : endings) EXPECT_EQ(e, "early_stopped");

  auto body = client::get(url, "/v1/runs/crash");
  ASSERT_TRUE(body) << body.error().message;
  rapidjson::Document status;
  status.Parse(body->c_str());
  EXPECT_STREQ(status["state"].GetString(), "early_stopped");

  // Every batch of every epoch the run went through, exactly once.
  std::map<std::pair<std::string, int64_t>, std::multiset<uint64_t>> batches;
  std::map<std::pair<std::string, int64_t>, std::pair<double, uint64_t>> sums;
  std::set<std::pair<std::string, int64_t>> seen_jobs_dupe_check;
  for (const Accepted& a : accepted) {
    batches[{a.set, a.epoch}].insert(a.batches.begin(), a.batches.end());
    auto& s = sums[{a.set, a.epoch}];
    s.first += a.loss * static_cast<double>(a.samples);
    s.second += a.samples;
  }
  const int64_t stopped_at = status["early_stop"]["stopped_at_epoch"].GetInt64();
  for (int64_t e = 0; e <= stopped_at; ++e) {
    for (const auto& [set, n] :
         {std::pair<std::string, int>{"train", kTrainBatches}, {"dev", kDevBatches}}) {
      const auto& got = batches[{set, e}];
      EXPECT_EQ(got.size(), static_cast<size_t>(n)) << set << " epoch " << e;
      EXPECT_EQ(std::set<uint64_t>(got.begin(), got.end()).size(), static_cast<size_t>(n))
          << set << " epoch " << e << " has a batch twice";
    }
  }
  EXPECT_EQ(batches.size(), static_cast<size_t>(2 * (stopped_at + 1)));

  // Every completion a worker was told counts is in the store, with its loss.
  auto db = sqlite::Db::open(dir.path() + "/data/traincoord.db", true);
  ASSERT_TRUE(db);
  // (read once: `completions` is a view over a row per commit, without an index by lease)
  std::map<uint64_t, std::vector<double>> stored;  // lease -> its losses in the store
  auto stmt = db->prepare("SELECT lease, loss FROM completions WHERE run = 'crash'");
  ASSERT_TRUE(stmt);
  while (true) {
    auto row = stmt->step();
    ASSERT_TRUE(row) << row.error().message;
    if (!*row) break;
    stored[static_cast<uint64_t>(stmt->int64(0))].push_back(stmt->real(1));
  }
  for (const Accepted& a : accepted) {
    auto it = stored.find(a.lease);
    ASSERT_NE(it, stored.end()) << "accepted lease " << a.lease << " is not in the store";
    ASSERT_EQ(it->second.size(), 1u) << "lease " << a.lease << " is in the store twice";
    EXPECT_DOUBLE_EQ(it->second[0], a.loss);
  }
  EXPECT_EQ(stored.size(), accepted.size());

  // The epoch losses are those of the completions, as a run without crashes computes them.
  EarlyStopConfig rule;
  rule.kind = EarlyStopKind::kPatience;
  rule.patience.patience = 2;
  EarlyStopRule replay(rule);
  int64_t replay_stop = -1;
  for (const auto& e : status["epochs"].GetArray()) {
    const std::pair<std::string, int64_t> key{e["set"].GetString(), e["epoch"].GetInt64()};
    const double expected = sums[key].first / static_cast<double>(sums[key].second);
    EXPECT_NEAR(e["loss"].GetDouble(), expected, 1e-12 * std::fabs(expected))
        << key.first << " epoch " << key.second;
    if (key.first == "dev" && replay_stop < 0 && replay.observe(key.second, expected, true)) {
      replay_stop = key.second;
    }
  }
  // And early stopping decided what it decides without crashes.
  EXPECT_EQ(stopped_at, replay_stop);
  EXPECT_EQ(stopped_at, 4);
  std::printf("crash test: %d kills, %zu completions accepted\n", kills, accepted.size());
}

}  // namespace
}  // namespace traincoord
