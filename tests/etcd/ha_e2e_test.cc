// High availability end to end (docs/HA.md): a real 3-member etcd cluster on loopback, two
// `traincoord serve --journal etcd://...` coordinators, workers running flat out; the leader is
// killed with SIGKILL in the middle of the run; the standby takes over and the run finishes with
// every job of every epoch completed exactly once. Every process is stopped by its PID, also
// when the test fails.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "e2e/server_process.h"
#include "etcd/etcd_cluster.h"
#include "etcd/ha_http.h"

namespace traincoord {
namespace {

using testing::EtcdCluster;
using testing::header;
using testing::http;
using testing::read_file;
using testing::Reply;
using testing::ServerProcess;
using testing::TempDir;
using testing::WorkerProcess;

constexpr const char* kRun = R"(name = "ha"
[data]
train_batches = 60
dev_batches = 6
[schedule]
epochs = 3
iters_per_worker = 1
[leases]
timeout = 30.0
max_attempts = 100
on_job_failure = "skip"
[early_stop]
rule = "none"
)";

// The coordinators, the way clients reach them: a request goes to the one believed to lead; on
// no answer or 421 it goes to the leader the 421 names, or to the other, until one answers
// (at most 20 s in all), with the same body (and request id).
class Coordinators {
 public:
  explicit Coordinators(std::vector<std::string> urls) : urls_(std::move(urls)) {}
  Reply post(const std::string& target, const std::string& body) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    size_t at = current_.load();
    while (std::chrono::steady_clock::now() < deadline) {
      Reply r = http(urls_[at], "POST", target, body);
      if (r.status != 0 && r.status != 421) {
        current_ = at;
        return r;
      }
      if (r.status == 421) {
        rapidjson::Document d;
        d.Parse(r.body.c_str());
        const auto& leader = d["error"]["leader"];
        if (leader.IsString()) {
          for (size_t i = 0; i < urls_.size(); ++i) {
            if (urls_[i] == leader.GetString() && i != at) {
              at = i;
              break;
            }
          }
          continue;
        }
      }
      at = (at + 1) % urls_.size();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return {};
  }

 private:
  std::vector<std::string> urls_;
  std::atomic<size_t> current_{0};
};

std::unique_ptr<ServerProcess> coordinator(const EtcdCluster& cluster, const std::string& config,
                                           const std::string& prefix) {
  return ServerProcess::start(
      {"--config", config, "--journal", "etcd://" + cluster.endpoints() + prefix});
}

// Waits (at most 20 s) until `url` leads run "ha".
bool leads(const std::string& url) {
  for (int i = 0; i < 200; ++i) {
    if (http(url, "GET", "/v1/runs/ha?epochs=0").status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(HighAvailability, AStandbyAnswersNotLeaderNamingTheLeader) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  TempDir dir;
  const std::string config = dir.write("ha.toml", kRun);
  auto a = coordinator(cluster, config, "/standby");
  ASSERT_TRUE(a);
  ASSERT_TRUE(leads(a->url()));
  auto b = coordinator(cluster, config, "/standby");
  ASSERT_TRUE(b);
  const Reply led = http(a->url(), "GET", "/v1/runs/ha?epochs=0");
  EXPECT_EQ(header(led, "Traincoord-Leader"), a->url());
  const std::string term = header(led, "Traincoord-Term");
  ASSERT_FALSE(term.empty()) << led.headers;
  EXPECT_GT(std::stoll(term), 0);
  // (Leadership is per run: creating run "ha" again on b is misdirected too.)
  const std::string create_ha = R"({"name": "ha", "data": {"train_batches": 60, "dev_batches": 6},)"
                                R"( "schedule": {"epochs": 3, "iters_per_worker": 1}})";
  for (const auto& [method, target, body] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GET", "/v1/runs/ha", "{}"},
           {"POST", "/v1/runs/ha/workers", "{}"},
           {"POST", "/v1/runs", create_ha}}) {
    Reply r;
    for (int i = 0; i < 50 && r.status != 421; ++i) {  // (until it has read the leader key)
      r = http(b->url(), method, target, body);
      rapidjson::Document d;
      d.Parse(r.body.c_str());
      if (r.status == 421 && d["error"]["leader"].IsNull()) r.status = 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(r.status, 421) << method << " " << target << ": " << r.body;
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    EXPECT_STREQ(d["error"]["code"].GetString(), "not_leader");
    EXPECT_EQ(std::string(d["error"]["leader"].GetString()), a->url());
    EXPECT_EQ(d["error"]["term"].GetInt64(), std::stoll(term));
    EXPECT_GT(d["error"]["retry_after_ms"].GetInt(), 0);
    EXPECT_EQ(header(r, "Traincoord-Leader"), a->url());
    EXPECT_EQ(header(r, "Traincoord-Term"), term);
  }
  // Non-run endpoints are answered by every coordinator.
  EXPECT_EQ(http(b->url(), "GET", "/v1/runs").status, 200);
  EXPECT_EQ(http(b->url(), "GET", "/metrics").status, 200);
}

// Runs "ha" with 4 workers against two coordinators, `disrupt`s the leader `a` a third into
// the run, and checks that the run finishes with each job of each epoch counted once.
void run_through(const std::string& prefix, const std::function<void(ServerProcess& a)>& disrupt,
                 std::unique_ptr<ServerProcess>* a_out = nullptr,
                 std::unique_ptr<ServerProcess>* b_out = nullptr) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  TempDir dir;
  const std::string config = dir.write("ha.toml", kRun);
  auto a = coordinator(cluster, config, prefix);
  ASSERT_TRUE(a);
  ASSERT_TRUE(leads(a->url()));
  auto b = coordinator(cluster, config, prefix);
  ASSERT_TRUE(b);
  Coordinators both({a->url(), b->url()});

  using Job = std::tuple<std::string, int64_t, int64_t>;  // set, epoch, index
  std::mutex mu;
  std::map<Job, int> accepted;  // as the workers were told
  std::atomic<int> completions{0};
  std::atomic<bool> killed{false};
  std::atomic<int64_t> first_job_after_kill_ns{0};
  std::atomic<bool> failed{false};
  auto worker = [&](int w) {
    Reply reg = both.post("/v1/runs/ha/workers", R"({"name": "w)" + std::to_string(w) + "\"}");
    if (reg.status != 200) {
      failed = true;
      return;
    }
    const std::string me =
        R"({"worker": )" +
        reg.body.substr(reg.body.find("\"worker\":") + 9,
                        reg.body.find_first_of(",}", reg.body.find("\"worker\":")) -
                            reg.body.find("\"worker\":") - 9);
    uint64_t request = static_cast<uint64_t>(w) * 1'000'000;
    std::string body = me + R"(, "wait_ms": 2000, "request": )" + std::to_string(++request) + "}";
    std::string target = "/v1/runs/ha/acquire";
    std::optional<Job> held;
    for (int step = 0; step < 2000; ++step) {
      Reply r = both.post(target, body);
      if (r.status != 200) {
        failed = true;
        ADD_FAILURE() << target << " " << body << " -> " << r.status << " " << r.body
                      << "\nA: " << http(a->url(), "GET", "/v1/runs/ha?epochs=0").headers
                      << "\nB: " << http(b->url(), "GET", "/v1/runs/ha?epochs=0").headers;
        return;
      }
      rapidjson::Document d;
      d.Parse(r.body.c_str());
      if (held && d.HasMember("counted") && d["counted"].GetBool()) {
        std::lock_guard lock(mu);
        accepted[*held] += 1;
        completions += 1;
      }
      const rapidjson::Value& next = d.HasMember("next") ? d["next"] : d;
      const std::string status = next["status"].GetString();
      if (status == "finished") return;
      if (status == "job") {
        if (killed && first_job_after_kill_ns == 0) {
          first_job_after_kill_ns = std::chrono::steady_clock::now().time_since_epoch().count();
        }
        const auto& job = next["job"];
        held = Job{job["set"].GetString(), job["epoch"].GetInt64(), job["index"].GetInt64()};
        target = "/v1/runs/ha/complete";
        body = me + R"(, "lease": )" + std::to_string(job["lease"].GetUint64()) +
               R"(, "loss": 0.5, "samples": 1, "next": true, "wait_ms": 2000, "request": )" +
               std::to_string(++request) + "}";
      } else {
        held.reset();
        target = "/v1/runs/ha/acquire";
        body = me + R"(, "wait_ms": 2000, "request": )" + std::to_string(++request) + "}";
      }
    }
  };
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) workers.emplace_back(worker, w);
  // SIGKILL the leader once a third of the run's jobs are done.
  for (int i = 0; i < 600 && completions < 70 && !failed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto kill_at = std::chrono::steady_clock::now();
  killed = true;
  disrupt(*a);
  for (auto& t : workers) t.join();
  ASSERT_FALSE(failed) << "a said:\n" << a->read_output() << "\nb said:\n" << b->read_output();
  ASSERT_GT(first_job_after_kill_ns.load(), 0);
  std::printf(
      "failover: %.2f s from the disruption to the first job handed out after it\n",
      static_cast<double>(first_job_after_kill_ns.load() - kill_at.time_since_epoch().count()) /
          1e9);

  // The run is complete; each job of each epoch counted once (as the server counts, and as
  // the workers were told).
  Reply status = http(b->url(), "GET", "/v1/runs/ha?epochs=1000");
  ASSERT_EQ(status.status, 200) << status.body;
  rapidjson::Document d;
  d.Parse(status.body.c_str());
  EXPECT_STREQ(d["state"].GetString(), "completed");
  int64_t jobs = 0;
  ASSERT_EQ(d["epochs"].Size(), 6u);  // 3 train, 3 dev
  for (const auto& e : d["epochs"].GetArray()) {
    EXPECT_EQ(e["done"].GetInt64(), e["jobs"].GetInt64());
    EXPECT_EQ(e["failed"].GetInt64(), 0);
    jobs += e["jobs"].GetInt64();
  }
  EXPECT_EQ(jobs, 3 * 60 + 3 * 6);
  EXPECT_EQ(d["counters"]["completions_accepted"].GetInt64(), jobs);
  std::lock_guard lock(mu);
  for (const auto& [job, n] : accepted) EXPECT_EQ(n, 1) << std::get<0>(job) << std::get<1>(job);
  // (a completion whose reply died with the leader was told "duplicate" on its retry: at most
  // one per worker is missing from the workers' count)
  EXPECT_GE(static_cast<int64_t>(accepted.size()), jobs - 4);
  EXPECT_EQ(header(status, "Traincoord-Leader"), b->url());
  // (the etcd cluster goes with this scope: what must outlive it is checked by the caller
  // before)
  if (a_out) {
    // The old leader, if alive, stood by again: it answers not_leader naming b.
    Reply r;
    for (int i = 0; i < 100; ++i) {
      r = http(a->url(), "GET", "/v1/runs/ha");
      if (r.status == 421 && r.body.find(b->url()) != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(r.status, 421) << r.body;
    EXPECT_NE(r.body.find("\"leader\":\"" + b->url() + "\""), std::string::npos) << r.body;
  }
  (void)b_out;
}

TEST(HighAvailability, TheLeaderKilledMidRunTheStandbyFinishesItExactlyOnce) {
  run_through("/kill", [](ServerProcess& a) { a.kill(SIGKILL); });
}

TEST(HighAvailability, ALeaderPausedPastItsLeaseStepsDownAndCommitsNothing) {
  std::unique_ptr<ServerProcess> keep_a;
  run_through(
      "/pause",
      [](ServerProcess& a) {
        a.signal(SIGSTOP);
        std::this_thread::sleep_for(std::chrono::seconds(6));
        a.signal(SIGCONT);
      },
      &keep_a);
}

int64_t accepted_completions(const std::string& url) {
  const Reply r = http(url, "GET", "/v1/runs/ha?epochs=0");
  if (r.status != 200) return -1;
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  return d.HasParseError() ? -1 : d["counters"]["completions_accepted"].GetInt64();
}

// The clients as users run them, against the real coordinators: C++ workers given both URLs
// (as TRAINCOORD_URL=a,b would) find the leader, follow the failover when it is SIGKILLed, and
// the run finishes with every job of every epoch counted once; each worker's "accepted" lines
// name each job at most once.
TEST(HighAvailability, RealClientsGivenBothUrlsFollowTheFailover) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  TempDir dir;
  const std::string config = dir.write("ha.toml", kRun);
  auto a = coordinator(cluster, config, "/clients");
  ASSERT_TRUE(a);
  ASSERT_TRUE(leads(a->url()));
  auto b = coordinator(cluster, config, "/clients");
  ASSERT_TRUE(b);
  // The standby first in the list: the workers must follow its not_leader to a.
  const std::string urls = b->url() + "," + a->url();
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int w = 0; w < 3; ++w) {
    workers.push_back(std::make_unique<WorkerProcess>(
        std::vector<std::string>{EXAMPLE_WORKER_BIN, "--url", urls, "--run", "ha", "--name",
                                 "w" + std::to_string(w), "--job-ms", "20", "--give-up-after",
                                 "60"},
        dir.path() + "/w" + std::to_string(w) + ".out"));
  }
  // And a worker of the Python client, given the same list.
  workers.push_back(std::make_unique<WorkerProcess>(
      std::vector<std::string>{"/usr/bin/env",
                               "PYTHONPATH=" + std::string(TRAINCOORD_SOURCE_DIR) + "/python",
                               "/usr/bin/python3", "-c",
                               "import sys, time, traincoord\n"
                               "run = traincoord.Run(sys.argv[1], 'ha', 'py', give_up_after=60)\n"
                               "for job in run.jobs():\n"
                               "    time.sleep(0.02)\n"
                               "    job.complete(loss=0.5, samples=1)\n"
                               "print('finished', run.finished.state)\n",
                               urls},
      dir.path() + "/w3.out"));
  for (int i = 0; i < 600 && accepted_completions(a->url()) < 60; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(accepted_completions(a->url()), 60) << a->read_output();
  a->kill(SIGKILL);
  for (size_t w = 0; w < workers.size(); ++w) {
    EXPECT_EQ(workers[w]->wait(100), 0)
        << "worker " << w << " said:\n"
        << read_file(dir.path() + "/w" + std::to_string(w) + ".out");
  }
  Reply status = http(b->url(), "GET", "/v1/runs/ha?epochs=1000");
  ASSERT_EQ(status.status, 200) << status.body;
  rapidjson::Document d;
  d.Parse(status.body.c_str());
  EXPECT_STREQ(d["state"].GetString(), "completed");
  int64_t jobs = 0;
  for (const auto& e : d["epochs"].GetArray()) {
    EXPECT_EQ(e["done"].GetInt64(), e["jobs"].GetInt64());
    jobs += e["jobs"].GetInt64();
  }
  EXPECT_EQ(jobs, 3 * 60 + 3 * 6);
  EXPECT_EQ(d["counters"]["completions_accepted"].GetInt64(), jobs);
  std::map<std::string, int> told;  // "set epoch index" -> workers told it was accepted
  for (size_t w = 0; w < workers.size(); ++w) {
    std::istringstream lines(read_file(dir.path() + "/w" + std::to_string(w) + ".out"));
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("accepted ", 0) != 0) continue;
      std::istringstream words(line.substr(9));
      std::string set, epoch, index;
      words >> set >> epoch >> index;
      told[set + " " + epoch + " " + index] += 1;
    }
  }
  for (const auto& [job, n] : told) EXPECT_EQ(n, 1) << job;
  // (a completion whose reply died with the leader is told "duplicate" on its retry, so a
  // job may be missing from the lines; the ledger's count above is the exactly-once check)
  EXPECT_GT(told.size(), 0u);
}

}  // namespace
}  // namespace traincoord
