// High availability, two things a run's life adds to a failover (docs/HA.md "Changing a run's
// config" and "Rebalancing"), each against a real etcd (one member: what is tested is the
// coordinators', not etcd's), coordinators on free ports and in-process workers that follow
// 421 not_leader (etcd/ha_workers.h). Every process is stopped by its PID, also when a test
// fails.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <atomic>
#include <csignal>
#include <thread>

#include "e2e/server_process.h"
#include "etcd/etcd_cluster.h"
#include "etcd/ha_http.h"
#include "etcd/ha_workers.h"

namespace traincoord {
namespace {

using testing::EtcdCluster;
using testing::eventually;
using testing::http;
using testing::Reply;
using testing::RunLog;
using testing::runs_of;
using testing::ServerProcess;
using testing::TempDir;
using testing::work;

constexpr int kTrain = 12, kDev = 2;

std::string run_toml(const std::string& name, int epochs) {
  return "name = \"" + name + "\"\n[data]\ntrain_batches = " + std::to_string(kTrain) +
         "\ndev_batches = " + std::to_string(kDev) +
         "\n[schedule]\nepochs = " + std::to_string(epochs) + R"(
iters_per_worker = 1
[leases]
timeout = 30.0
max_attempts = 100
on_job_failure = "skip"
[early_stop]
rule = "none"
)";
}

// The run as `url` serves it: completed over `epochs` train epochs (and as many dev ones), each
// job of each epoch counted once by the coordinator, and told "accepted" at most once to the
// workers. Returns its status body.
std::string expect_completed_exactly_once(const std::string& url, const std::string& run,
                                          int epochs, RunLog& log) {
  Reply status = http(url, "GET", "/v1/runs/" + run + "?epochs=1000");
  EXPECT_EQ(status.status, 200) << status.body;
  rapidjson::Document d;
  d.Parse(status.body.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("epochs")) {
    ADD_FAILURE() << status.body;
    return status.body;
  }
  EXPECT_STREQ(d["state"].GetString(), "completed") << run;
  EXPECT_EQ(d["epochs"].Size(), static_cast<size_t>(2 * epochs)) << status.body;
  int64_t jobs = 0;
  for (const auto& e : d["epochs"].GetArray()) {
    EXPECT_EQ(e["done"].GetInt64(), e["jobs"].GetInt64()) << run;
    EXPECT_EQ(e["failed"].GetInt64(), 0) << run;
    jobs += e["jobs"].GetInt64();
  }
  EXPECT_EQ(jobs, epochs * (kTrain + kDev)) << run;
  EXPECT_EQ(d["counters"]["completions_accepted"].GetInt64(), jobs) << run;
  std::lock_guard lock(log.mu);
  for (const auto& [job, n] : log.accepted) EXPECT_EQ(n, 1) << run << " " << std::get<0>(job);
  // (a completion whose reply was dropped at a hand-over was told "duplicate" on its retry: at
  // most one per worker is missing from the workers' count)
  EXPECT_GE(static_cast<int64_t>(log.accepted.size()), jobs - 2) << run;
  return status.body;
}

// --apply-config-changes under HA: a run trained one epoch under coordinator a; b, started with
// the file raised to two epochs and the flag, takes the run over and applies the change
// (journalled); c, started with the old file and no flag, takes it over from b in the middle of
// the second epoch, serves the raised epochs (it does not undo the change), and the run ends
// with every job of both epochs counted once.
TEST(HighAvailabilityConfig, AChangeAppliedAtTakeoverSurvivesTheNextTakeover) {
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.started());
  TempDir dir;
  const std::string journal = "etcd://" + cluster.endpoints() + "/cfg";
  const std::string one = dir.write("x1.toml", run_toml("x", 1));
  const std::string two = dir.write("x2.toml", run_toml("x", 2));
  RunLog log;
  {
    auto a = ServerProcess::start({"--config", one, "--journal", journal});
    ASSERT_TRUE(a);
    ASSERT_TRUE(eventually([&] { return http(a->url(), "GET", "/v1/runs/x").status == 200; }));
    testing::WorkerThreads workers;
    for (int w = 0; w < 2; ++w) {
      workers.threads.emplace_back([&, w] { work({a->url()}, "x", w, log); });
    }
    workers.join();
    ASSERT_FALSE(log.failed);
    expect_completed_exactly_once(a->url(), "x", 1, log);
    a->kill(SIGTERM);  // (its lease revoked: the next coordinator need not wait out its TTL)
  }
  auto b = ServerProcess::start({"--config", two, "--journal", journal, "--apply-config-changes"});
  ASSERT_TRUE(b);
  ASSERT_TRUE(eventually([&] { return http(b->url(), "GET", "/v1/runs/x").status == 200; }));
  ASSERT_TRUE(eventually([&] {
    return b->read_output().find("applied the changed schedule.epochs to run x") !=
           std::string::npos;
  })) << b->output();
  {
    const Reply on_b = http(b->url(), "GET", "/v1/runs/x");
    EXPECT_NE(on_b.body.find("\"config_changed\""), std::string::npos) << on_b.body;
    EXPECT_NE(on_b.body.find("\"epochs\":2"), std::string::npos) << on_b.body;
  }
  auto c = ServerProcess::start({"--config", one, "--journal", journal});
  ASSERT_TRUE(c);
  ASSERT_TRUE(eventually([&] { return std::get<1>(runs_of(c->url())["x"]) == b->url(); }));
  // Half of the second epoch under b, then b stops and c takes the run over.
  std::atomic<bool> gate{true};
  const int before = log.completions.load();
  testing::WorkerThreads workers{{}, &gate};
  for (int w = 2; w < 4; ++w) {
    workers.threads.emplace_back([&, w] {
      work({b->url(), c->url()}, "x", w, log, &gate, before + kTrain / 2);
    });
  }
  const bool halfway =
      eventually([&] { return log.completions.load() >= before + kTrain / 2 || log.failed; });
  b->kill(SIGTERM);
  ASSERT_TRUE(eventually([&] { return http(c->url(), "GET", "/v1/runs/x").status == 200; }))
      << c->read_output();
  workers.join();
  ASSERT_TRUE(halfway);
  ASSERT_FALSE(log.failed) << c->read_output();
  expect_completed_exactly_once(c->url(), "x", 2, log);
  const std::string said = c->read_output();
  EXPECT_NE(said.find("took run x over"), std::string::npos) << said;
  EXPECT_EQ(said.find("applied"), std::string::npos) << said;
}

// A live change under HA (`traincoord apply-config`, POST /v1/runs/{run}/config): sent to both
// coordinators' URLs, it goes to the run's leader a, which applies it and writes it with a
// snapshot in the run's next fenced txn; b, a standby started with the old file and no flag,
// takes the run over when a stops and serves the raised epochs from etcd; the run ends with
// every job of both epochs counted once.
TEST(HighAvailabilityConfig, ALiveChangeOnTheLeaderIsServedByTheNextLeader) {
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.started());
  TempDir dir;
  const std::string journal = "etcd://" + cluster.endpoints() + "/live";
  const std::string one = dir.write("x1.toml", run_toml("x", 1));
  const std::string two = dir.write("x2.toml", run_toml("x", 2));
  RunLog log;
  auto a = ServerProcess::start({"--config", one, "--journal", journal});
  ASSERT_TRUE(a);
  ASSERT_TRUE(eventually([&] { return http(a->url(), "GET", "/v1/runs/x").status == 200; }));
  auto b = ServerProcess::start({"--config", one, "--journal", journal});
  ASSERT_TRUE(b);
  ASSERT_TRUE(eventually([&] { return std::get<1>(runs_of(b->url())["x"]) == a->url(); }));
  {
    testing::WorkerThreads workers;
    for (int w = 0; w < 2; ++w) {
      workers.threads.emplace_back([&, w] { work({a->url()}, "x", w, log); });
    }
    workers.join();
  }
  ASSERT_FALSE(log.failed);
  expect_completed_exactly_once(a->url(), "x", 1, log);
  int status = -1;
  const std::string said =
      testing::run_command(std::string(TRAINCOORD_BIN) + " apply-config " + two + " --url " +
                               b->url() + "," + a->url() + " 2>&1",
                           &status);
  EXPECT_EQ(status, 0) << said;
  EXPECT_NE(said.find("applied the changed schedule.epochs to run x"), std::string::npos) << said;
  a->kill(SIGTERM);  // (its lease revoked: b need not wait out its TTL)
  ASSERT_TRUE(eventually([&] { return http(b->url(), "GET", "/v1/runs/x").status == 200; }))
      << b->read_output();
  {
    testing::WorkerThreads workers;
    for (int w = 2; w < 4; ++w) {
      workers.threads.emplace_back([&, w] { work({b->url()}, "x", w, log); });
    }
    workers.join();
  }
  ASSERT_FALSE(log.failed) << b->read_output();
  expect_completed_exactly_once(b->url(), "x", 2, log);
}

// A coordinator started later gets runs handed over: a leads the three runs of its config files,
// with workers on each; b joins; a, above its fair share (ceil(3 / 2) = 2) while b leads none,
// hands one run over after the hold time (b's campaign takes it), and no more; every job of
// every epoch of every run is counted once.
TEST(HighAvailabilityRebalance, ALateCoordinatorIsHandedARunAndEveryJobCountsOnce) {
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.started());
  TempDir dir;
  const std::string journal = "etcd://" + cluster.endpoints() + "/sweep";
  const std::vector<std::string> names{"r1", "r2", "r3"};
  std::vector<std::string> args{"--journal", journal};
  for (const std::string& n : names) {
    args.push_back("--config");
    args.push_back(dir.write(n + ".toml", run_toml(n, 2)));
  }
  auto a = ServerProcess::start(args);
  ASSERT_TRUE(a);
  ASSERT_TRUE(eventually([&] {
    auto ra = runs_of(a->url());
    return ra.size() == 3 && std::get<0>(ra["r1"]) == "leader" &&
           std::get<0>(ra["r2"]) == "leader" && std::get<0>(ra["r3"]) == "leader";
  })) << http(a->url(), "GET", "/v1/coordinator").body;
  std::atomic<bool> gate{true};
  std::map<std::string, RunLog> logs;
  for (const std::string& n : names) logs[n];
  testing::WorkerThreads workers{{}, &gate};
  for (const std::string& n : names) {
    for (int w = 0; w < 2; ++w) {
      // (a third of the run before the gate: work is left for after the hand-over)
      workers.threads.emplace_back(
          [&, n, w] { work({a->url()}, n, w, logs[n], &gate, (kTrain + kDev) * 2 / 3); });
    }
  }
  auto b = ServerProcess::start({"--journal", journal});  // (no config files: it serves etcd's)
  ASSERT_TRUE(b);
  std::string led_by_b;
  const bool handed = eventually([&] {
    for (const auto& [run, view] : runs_of(b->url())) {
      if (std::get<0>(view) == "leader") led_by_b = run;
    }
    return !led_by_b.empty();
  });
  // The workers know only a: they follow its 421s to b.
  workers.join();
  ASSERT_TRUE(handed) << a->read_output() << "\n" << http(b->url(), "GET", "/v1/coordinator").body;
  const std::string a_said = a->read_output();
  EXPECT_NE(a_said.find("run " + led_by_b + " handed over to balance the runs"), std::string::npos)
      << a_said;
  auto ra = runs_of(a->url()), rb = runs_of(b->url());
  int led_by_a = 0, led_b = 0;
  for (const std::string& n : names) {
    led_by_a += std::get<0>(ra[n]) == "leader" ? 1 : 0;
    led_b += std::get<0>(rb[n]) == "leader" ? 1 : 0;
    EXPECT_FALSE(logs[n].failed) << n;
    const std::string& leader = std::get<0>(ra[n]) == "leader" ? a->url() : b->url();
    expect_completed_exactly_once(leader, n, 2, logs[n]);
  }
  EXPECT_EQ(led_by_a, 2);  // its fair share; no ping-pong
  EXPECT_EQ(led_b, 1);
  // The run handed over: a answers 421 naming b; b's term is newer.
  const Reply moved = http(a->url(), "GET", "/v1/runs/" + led_by_b);
  EXPECT_EQ(moved.status, 421);
  EXPECT_NE(moved.body.find(b->url()), std::string::npos) << moved.body;
  EXPECT_GE(logs[led_by_b].terms.size(), 2u);
  EXPECT_EQ(a_said.find("handed over to balance the runs", a_said.find("handed over") + 1),
            std::string::npos)
      << "a handed over more than one run:\n"
      << a_said;
}

}  // namespace
}  // namespace traincoord
