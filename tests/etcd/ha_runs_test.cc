// Leadership per run end to end (docs/HA.md "Leadership per run"): a real 3-member etcd cluster,
// two coordinators on one prefix, each creating one run of its config file and leading it;
// workers on both runs; one coordinator killed with SIGKILL: only its run moves, the other run
// keeps its leader and term and its workers see no failover; both runs finish with every job of
// every epoch counted exactly once. Every process is stopped by its PID, also when the test
// fails.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

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

std::string run_toml(const std::string& name) {
  return "name = \"" + name + R"("
[data]
train_batches = 40
dev_batches = 4
[schedule]
epochs = 2
iters_per_worker = 1
[leases]
timeout = 30.0
max_attempts = 100
on_job_failure = "skip"
[early_stop]
rule = "none"
)";
}

// The run as `url` serves it: completed, each job of each epoch counted once.
void expect_completed_exactly_once(const std::string& url, const std::string& run, RunLog& log) {
  Reply status = http(url, "GET", "/v1/runs/" + run + "?epochs=1000");
  ASSERT_EQ(status.status, 200) << status.body;
  rapidjson::Document d;
  d.Parse(status.body.c_str());
  EXPECT_STREQ(d["state"].GetString(), "completed") << run;
  int64_t jobs = 0;
  ASSERT_EQ(d["epochs"].Size(), 4u);  // 2 train, 2 dev
  for (const auto& e : d["epochs"].GetArray()) {
    EXPECT_EQ(e["done"].GetInt64(), e["jobs"].GetInt64()) << run;
    EXPECT_EQ(e["failed"].GetInt64(), 0) << run;
    jobs += e["jobs"].GetInt64();
  }
  EXPECT_EQ(jobs, 2 * 40 + 2 * 4);
  EXPECT_EQ(d["counters"]["completions_accepted"].GetInt64(), jobs) << run;
  std::lock_guard lock(log.mu);
  for (const auto& [job, n] : log.accepted) EXPECT_EQ(n, 1) << run << " " << std::get<0>(job);
  // (a completion whose reply died with its leader was told "duplicate" on its retry: at most
  // one per worker is missing from the workers' count)
  EXPECT_GE(static_cast<int64_t>(log.accepted.size()), jobs - 3);
}

TEST(HighAvailabilityPerRun, ACoordinatorKilledMovesOnlyItsRunTheOtherKeepsItsLeader) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  TempDir dir;
  const std::string journal = "etcd://" + cluster.endpoints() + "/sweep";
  auto a =
      ServerProcess::start({"--config", dir.write("x.toml", run_toml("x")), "--journal", journal});
  ASSERT_TRUE(a);
  ASSERT_TRUE(eventually([&] { return http(a->url(), "GET", "/v1/runs/x").status == 200; }));
  auto b =
      ServerProcess::start({"--config", dir.write("y.toml", run_toml("y")), "--journal", journal});
  ASSERT_TRUE(b);
  ASSERT_TRUE(eventually([&] { return http(b->url(), "GET", "/v1/runs/y").status == 200; }))
      << b->read_output();
  // Each leads the run it created, and says so; each names the other as the other run's leader.
  ASSERT_TRUE(eventually([&] {
    auto ra = runs_of(a->url()), rb = runs_of(b->url());
    return ra.size() == 2 && rb.size() == 2 && std::get<1>(ra["y"]) == b->url() &&
           std::get<1>(rb["x"]) == a->url();
  })) << http(a->url(), "GET", "/v1/coordinator").body
      << "\n"
      << http(b->url(), "GET", "/v1/coordinator").body;
  auto ra = runs_of(a->url()), rb = runs_of(b->url());
  EXPECT_EQ(std::get<0>(ra["x"]), "leader");
  EXPECT_EQ(std::get<1>(ra["x"]), a->url());
  EXPECT_EQ(std::get<0>(ra["y"]), "standby");
  EXPECT_EQ(std::get<0>(rb["y"]), "leader");
  EXPECT_EQ(std::get<0>(rb["x"]), "standby");
  const int64_t y_term = std::get<2>(rb["y"]);
  EXPECT_GT(y_term, 0);
  EXPECT_EQ(std::get<2>(ra["y"]), y_term);
  EXPECT_EQ(http(a->url(), "GET", "/v1/runs/y").status, 421);
  EXPECT_EQ(http(b->url(), "GET", "/v1/runs/x").status, 421);
  // GET /v1/runs lists both runs on each, with their leader; only the run led here has its
  // summary (docs/HA.md "Leadership per run").
  {
    rapidjson::Document d;
    d.Parse(http(a->url(), "GET", "/v1/runs").body.c_str());
    ASSERT_TRUE(d.IsObject() && d.HasMember("runs"));
    std::map<std::string, const rapidjson::Value*> listed;
    for (const auto& r : d["runs"].GetArray()) listed[r["run"].GetString()] = &r;
    ASSERT_EQ(listed.size(), 2u);
    const auto& x = *listed["x"];
    const auto& y = *listed["y"];
    EXPECT_TRUE(x["led_here"].GetBool());
    EXPECT_EQ(std::string(x["leader"].GetString()), a->url());
    EXPECT_TRUE(x.HasMember("state"));  // its summary
    EXPECT_FALSE(y["led_here"].GetBool());
    EXPECT_EQ(std::string(y["leader"].GetString()), b->url());
    EXPECT_EQ(y["term"].GetInt64(), y_term);
    EXPECT_FALSE(y.HasMember("state"));
    // `traincoord runs` says so: y's line names its leader instead of stale figures.
    const std::string printed =
        testing::run_command(std::string(TRAINCOORD_BIN) + " runs --url " + a->url());
    EXPECT_NE(printed.find("led by " + b->url()), std::string::npos) << printed;
    EXPECT_NE(printed.find("running"), std::string::npos) << printed;  // x, led here
  }

  RunLog xs, ys;
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&, w] { work({a->url(), b->url()}, "x", w, xs); });
    workers.emplace_back([&, w] { work({b->url(), a->url()}, "y", w, ys); });
  }
  // SIGKILL a (the leader of x) once a fifth of x's jobs are done.
  for (int i = 0; i < 600 && xs.completions < 18 && !xs.failed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int y_before_kill = ys.completions.load();
  const auto killed_at = std::chrono::steady_clock::now();
  a->kill(SIGKILL);
  // (how long x goes unserved: from the kill to b answering it)
  if (eventually([&] { return http(b->url(), "GET", "/v1/runs/x?epochs=0").status == 200; })) {
    std::printf(
        "failover of run x: %.2f s from the SIGKILL to b serving it; run y served by b "
        "throughout\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
  }
  for (auto& t : workers) t.join();
  ASSERT_FALSE(xs.failed || ys.failed) << "b said:\n" << b->read_output();

  // x moved to b; y never moved: the same leader and term all along, and its workers were
  // never misdirected nor left without an answer.
  expect_completed_exactly_once(b->url(), "x", xs);
  expect_completed_exactly_once(b->url(), "y", ys);
  rb = runs_of(b->url());
  EXPECT_EQ(std::get<0>(rb["x"]), "leader");
  EXPECT_GT(std::get<2>(rb["x"]), y_term);
  EXPECT_EQ(std::get<0>(rb["y"]), "leader");
  EXPECT_EQ(std::get<2>(rb["y"]), y_term);
  EXPECT_EQ(ys.misdirected.load(), 0);
  EXPECT_EQ(ys.terms, (std::set<std::string>{std::to_string(y_term)}));
  EXPECT_GT(ys.completions.load(), y_before_kill);
  EXPECT_GE(xs.terms.size(), 2u);  // x's workers saw its new term
  EXPECT_GT(xs.misdirected.load(), 0);
  const std::string said = b->read_output();
  EXPECT_NE(said.find("leading run x"), std::string::npos) << said;
  EXPECT_EQ(said.find("no longer leading run y"), std::string::npos) << said;
}

}  // namespace
}  // namespace traincoord
