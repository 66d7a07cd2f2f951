// Chaos, bounded (docs/HA.md "Chaos"): a real 3-member etcd cluster, two coordinators and three
// C++ workers (examples/cpp_worker) given both urls, running flat out. Seeded (the seed is
// printed; TRAINCOORD_CHAOS_SEED replays it):
//   1. a random coordinator is killed with SIGKILL (by its PID) at a random moment, and started
//      again on its port, TRAINCOORD_CHAOS_KILLS times (default 3; 20 by hand);
//   2. one etcd member is killed: the run goes on; it comes back;
//   3. two etcd members (a majority) are killed: nothing is acknowledged to a worker meanwhile
//      (no "accepted" line, no coordinator answers a write), the workers wait; the members come
//      back, and the run goes on;
// and at the end the run is complete with each job of each epoch counted exactly once (the
// coordinator's ledger), and no job was told "accepted" to two workers. Prints each failover's
// time (from the kill of the leader to the other serving the run). Every process is stopped by
// its PID, also when the test fails.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <thread>

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
    kills_ = std::max(0, env_int("TRAINCOORD_CHAOS_KILLS", 3));
    seed_ = static_cast<uint64_t>(
        env_int("TRAINCOORD_CHAOS_SEED", static_cast<int>(std::random_device{}() & 0x7fffffff)));
    std::printf("chaos: seed %llu (TRAINCOORD_CHAOS_SEED=%llu replays it), %d coordinator kills\n",
                static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(seed_),
                kills_);
    rng_.seed(seed_);
    // Long enough that the chaos ends before the run does: ~100 jobs per kill, and more.
    std::ostringstream run;
    run << "name = \"chaos\"\n[data]\ntrain_batches = " << 120 * (kills_ + 4)
        << "\ndev_batches = 12\n[schedule]\nepochs = 2\n[leases]\ntimeout = 30.0\n"
        << "max_attempts = 100\non_job_failure = \"skip\"\n[early_stop]\nrule = \"none\"\n";
    config_ = dir_.write("chaos.toml", run.str());
    journal_ = "etcd://" + cluster_.endpoints() + "/chaos";
  }

  std::unique_ptr<ServerProcess> start_coordinator(uint16_t port = 0) {
    return ServerProcess::start({"--config", config_, "--journal", journal_}, port);
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

  // The workers' "accepted SET EPOCH INDEX ..." lines: how many workers were told each job.
  std::map<std::string, int> told() {
    std::map<std::string, int> jobs;
    for (size_t w = 0; w < workers_.size(); ++w) {
      std::istringstream lines(read_file(worker_out(w)));
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind("accepted ", 0) != 0) continue;
        std::istringstream words(line.substr(9));
        std::string set, epoch, index;
        words >> set >> epoch >> index;
        jobs[set + " " + epoch + " " + index] += 1;
      }
    }
    return jobs;
  }
  size_t told_count() {
    size_t n = 0;
    for (const auto& [job, k] : told()) n += static_cast<size_t>(k);
    return n;
  }
  std::string worker_out(size_t w) const { return dir_.path() + "/w" + std::to_string(w) + ".out"; }

  std::string say_all() {
    std::string s;
    for (int i = 0; i < 2; ++i) {
      if (coordinators_[i])
        s += "\ncoordinator " + urls_[i] + ":\n" + coordinators_[i]->read_output();
    }
    for (size_t w = 0; w < workers_.size(); ++w) {
      const std::string out = read_file(worker_out(w));
      s += "\nworker " + std::to_string(w) + " (last lines):\n" +
           out.substr(out.size() > 1500 ? out.size() - 1500 : 0);
    }
    return s;
  }

  EtcdCluster cluster_;
  TempDir dir_;
  int kills_ = 3;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string config_, journal_;
  std::unique_ptr<ServerProcess> coordinators_[2];
  std::string urls_[2];
  std::vector<std::unique_ptr<WorkerProcess>> workers_;
};

TEST_F(Chaos, CoordinatorsAndEtcdMembersKilledAtRandomTheRunCountsEachJobOnce) {
  coordinators_[0] = start_coordinator();
  ASSERT_TRUE(coordinators_[0]);
  urls_[0] = coordinators_[0]->url();
  ASSERT_EQ(await_leader(), 0);
  coordinators_[1] = start_coordinator();
  ASSERT_TRUE(coordinators_[1]);
  urls_[1] = coordinators_[1]->url();
  for (int w = 0; w < 3; ++w) {
    workers_.push_back(std::make_unique<WorkerProcess>(
        std::vector<std::string>{EXAMPLE_WORKER_BIN, "--url", urls_[1] + "," + urls_[0], "--run",
                                 "chaos", "--name", "w" + std::to_string(w), "--job-ms", "20",
                                 "--give-up-after", "60"},
        worker_out(static_cast<size_t>(w))));
  }
  ASSERT_TRUE(progresses(0, 30)) << say_all();

  // 1. Coordinators killed at random moments.
  std::vector<double> failovers;
  for (int k = 0; k < kills_; ++k) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 1500)(rng_)));
    ASSERT_TRUE(running()) << "the run ended before kill " << k + 1 << "; make it longer"
                           << say_all();
    const int victim = std::uniform_int_distribution<int>(0, 1)(rng_);
    const int led = leader();
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

  // The run finishes: each job of each epoch counted once.
  for (size_t w = 0; w < workers_.size(); ++w) {
    EXPECT_EQ(workers_[w]->wait(120), 0) << "worker " << w << say_all();
  }
  rapidjson::Document d = status("?epochs=1000");
  ASSERT_TRUE(d.IsObject()) << say_all();
  EXPECT_STREQ(d["state"].GetString(), "completed");
  int64_t jobs = 0;
  ASSERT_EQ(d["epochs"].Size(), 4u);  // 2 train, 2 dev
  for (const auto& e : d["epochs"].GetArray()) {
    EXPECT_EQ(e["done"].GetInt64(), e["jobs"].GetInt64());
    EXPECT_EQ(e["failed"].GetInt64(), 0);
    jobs += e["jobs"].GetInt64();
  }
  EXPECT_EQ(jobs, 2 * 120 * (kills_ + 4) + 2 * 12);
  EXPECT_EQ(d["counters"]["completions_accepted"].GetInt64(), jobs);
  const auto jobs_told = told();
  for (const auto& [job, n] : jobs_told) EXPECT_EQ(n, 1) << "told accepted twice: " << job;
  // (a completion whose reply died with a leader is told "duplicate" on its retry: missing
  // from the lines, never counted twice)
  EXPECT_LE(static_cast<int64_t>(jobs_told.size()), jobs);
  EXPECT_GE(static_cast<int64_t>(jobs_told.size()), jobs - 3 * (kills_ + 2));
  std::printf("chaos: seed %llu: %lld jobs, each counted once\n",
              static_cast<unsigned long long>(seed_), static_cast<long long>(jobs));
}

}  // namespace
}  // namespace traincoord
