// End-to-end tests of `traincoord serve`: the real binary on a free loopback port, driven by
// the C++ client, by raw HTTP, and by the example worker program.
#include <gtest/gtest.h>

#include <rapidjson/document.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "config/config_file.h"
#include "server_process.h"
#include "sim/simulation.h"
#include "traincoord/client.h"

namespace traincoord {
namespace {

using testing::raw_exchange;
using testing::run_command;
using testing::ServerProcess;
using testing::TempDir;

constexpr const char* kRun = R"(
name = "e2e"
[data]
train_batches = 30
dev_batches = 6
order = "shuffled"
seed = 3
[schedule]
epochs = 3
iters_per_worker = 2
[leases]
timeout = 0.5
)";

rapidjson::Document parse(const std::string& text) {
  rapidjson::Document d;
  d.Parse(text.c_str());
  EXPECT_FALSE(d.HasParseError()) << text;
  return d;
}

// What the workers were told was counted, per (set, epoch): the batches trained.
class Ledger {
 public:
  void add(const std::string& set, int64_t epoch, const std::vector<uint64_t>& batches) {
    std::lock_guard lock(mu_);
    auto& b = batches_[{set, epoch}];
    b.insert(batches.begin(), batches.end());
  }
  // Lines "accepted SET EPOCH INDEX B,B,..." from example_worker.
  void add_output(const std::string& output) {
    std::istringstream in(output);
    std::string word, set, list;
    int64_t epoch;
    uint64_t index;
    while (in >> word) {
      if (word != "accepted") {
        std::getline(in, word);
        continue;
      }
      in >> set >> epoch >> index >> list;
      std::vector<uint64_t> batches;
      std::istringstream items(list);
      for (std::string item; std::getline(items, item, ',');) batches.push_back(std::stoull(item));
      add(set, epoch, batches);
    }
  }
  // Every batch of every planned epoch exactly once.
  void expect_exactly_once(uint64_t train, uint64_t dev, int64_t epochs) const {
    for (int64_t e = 0; e < epochs; ++e) {
      for (const auto& [set, n] :
           {std::pair<std::string, uint64_t>{"train", train}, {"dev", dev}}) {
        auto it = batches_.find({set, e});
        ASSERT_NE(it, batches_.end()) << set << " epoch " << e << " never trained";
        EXPECT_EQ(it->second.size(), n) << set << " epoch " << e;
        for (uint64_t b = 0; b < n; ++b) {
          EXPECT_EQ(it->second.count(b), 1u) << set << " epoch " << e << " batch " << b;
        }
      }
    }
    EXPECT_EQ(batches_.size(), static_cast<size_t>(2 * epochs));
  }

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, int64_t>, std::multiset<uint64_t>> batches_;
};

client::Options options_for(const ServerProcess& server, const std::string& name) {
  client::Options o;
  o.url = server.url();
  o.run = "e2e";
  o.worker_name = name;
  o.long_poll = std::chrono::milliseconds(2000);
  o.give_up_after = std::chrono::milliseconds(20000);
  return o;
}

// A worker loop on the C++ client; returns how the run finished.
std::string work(const client::Options& options, Ledger* ledger) {
  auto worker = client::Worker::connect(options);
  if (!worker) return "connect failed: " + worker.error().message;
  auto job = (*worker)->next();
  while (job && *job) {
    const client::Job j = **job;
    job = (*worker)->complete_and_next(
        j, {0.1 * static_cast<double>(j.epoch + 1), j.batches.size(), {}, 0});
    if (job && (*worker)->last_completed().counted) ledger->add(j.set, j.epoch, j.batches);
  }
  if (!job) return "error: " + job.error().message;
  return (*worker)->finished()->state;
}

// The same on several jobs per request (next_jobs / complete_and_next_jobs).
std::string work_in_groups(const client::Options& options, size_t n, Ledger* ledger) {
  auto worker = client::Worker::connect(options);
  if (!worker) return "connect failed: " + worker.error().message;
  auto jobs = (*worker)->next_jobs(n);
  while (jobs && !jobs->empty()) {
    std::vector<std::pair<client::Job, client::Completion>> done;
    for (const client::Job& j : *jobs) {
      done.push_back({j, {0.1 * static_cast<double>(j.epoch + 1), j.batches.size(), {}, 0}});
    }
    jobs = (*worker)->complete_and_next_jobs(done, n);
    if (!jobs) break;
    const auto& outcomes = (*worker)->last_outcomes();
    if (outcomes.size() != done.size()) return "outcomes missing";
    for (size_t i = 0; i < done.size(); ++i) {
      if (outcomes[i].counted)
        ledger->add(done[i].first.set, done[i].first.epoch, done[i].first.batches);
    }
  }
  if (!jobs) return "error: " + jobs.error().message;
  return (*worker)->finished()->state;
}

// The same through a JobStream: jobs fetched ahead and completions sent behind, on a thread
// of its own. `stop_after`: close the stream after that many jobs (what it fetched ahead
// goes back), and return "stopped".
std::string work_streamed(const client::Options& options, size_t depth, Ledger* ledger,
                          int stop_after = -1) {
  auto worker = client::Worker::connect(options);
  if (!worker) return "connect failed: " + worker.error().message;
  client::JobStream stream(**worker, depth);
  std::vector<client::Job> sent;
  int taken = 0;
  auto job = stream.next();
  while (job && *job) {
    const client::Job j = **job;
    stream.complete(j, {0.1 * static_cast<double>(j.epoch + 1), j.batches.size(), {}, 0});
    sent.push_back(j);
    if (++taken == stop_after) break;
    job = stream.next();
  }
  if (!job) return "error: " + job.error().message;
  if (auto closed = stream.close(); !closed) return "close: " + closed.error().message;
  const auto outcomes = stream.outcomes();
  if (outcomes.size() != sent.size()) return "outcomes missing";
  for (size_t i = 0; i < sent.size(); ++i) {
    if (outcomes[i].counted) ledger->add(sent[i].set, sent[i].epoch, sent[i].batches);
  }
  if (taken == stop_after) return "stopped";
  return (*worker)->finished()->state;
}

class ServerE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = dir_.write("e2e.toml", kRun);
    server_ = ServerProcess::start(server_args());
    ASSERT_NE(server_, nullptr);
  }

  std::vector<std::string> server_args(bool in_memory = false) const {
    if (in_memory) return {"--config", config_, "--in-memory"};
    return {"--config", config_, "--data-dir", dir_.path() + "/data"};
  }

  // Workers "a" (0) and "b" (1); a holds every train job of epoch 0, so b's acquire parks.
  void lease_every_train_job_to_a() {
    const std::string url = server_->url();
    ASSERT_TRUE(client::post(url, "/v1/runs/e2e/workers", R"({"name": "a"})"));
    ASSERT_TRUE(client::post(url, "/v1/runs/e2e/workers", R"({"name": "b"})"));
    for (int i = 0; i < 15; ++i) {
      ASSERT_TRUE(client::post(url, "/v1/runs/e2e/acquire", R"({"worker": 0})"));
    }
  }

  rapidjson::Document status() {
    auto body = client::get(server_->url(), "/v1/runs/e2e");
    EXPECT_TRUE(body) << body.error().message;
    return parse(body ? *body : "{}");
  }

  TempDir dir_;
  std::string config_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(ServerE2E, ClientWorkersFinishTheRunWithEveryBatchTrainedOnce) {
  Ledger ledger;
  std::vector<std::string> results(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = work(options_for(*server_, "t" + std::to_string(i)), &ledger); });
  }
  for (auto& t : threads) t.join();
  for (const std::string& r : results) EXPECT_EQ(r, "completed");
  ledger.expect_exactly_once(30, 6, 3);
  auto s = status();
  EXPECT_STREQ(s["state"].GetString(), "completed");
  ASSERT_EQ(s["epochs"].Size(), 6u);
  EXPECT_NEAR(s["epochs"][0]["loss"].GetDouble(), 0.1, 1e-12);
  EXPECT_NEAR(s["epochs"][4]["loss"].GetDouble(), 0.3, 1e-12);
}

// Workers taking 1, 2 and 3 jobs per request share a run: every batch once, the same losses.
TEST_F(ServerE2E, WorkersTakingSeveralJobsPerRequestFinishTheRunExactlyOnce) {
  Ledger ledger;
  std::vector<std::string> results(3);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      const auto options = options_for(*server_, "g" + std::to_string(i));
      results[i] = i == 0 ? work(options, &ledger) : work_in_groups(options, i + 1, &ledger);
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& r : results) EXPECT_EQ(r, "completed");
  ledger.expect_exactly_once(30, 6, 3);
  auto s = status();
  EXPECT_STREQ(s["state"].GetString(), "completed");
  EXPECT_EQ(s["counters"]["completions_accepted"].GetUint64(), 3u * (15 + 3));
  EXPECT_NEAR(s["epochs"][2]["loss"].GetDouble(), 0.2, 1e-12);
}

// Workers on JobStreams (2 and 8 jobs ahead) and a plain worker share a run; one more stops
// early, and the jobs it had fetched ahead go back untouched (no failed attempt).
TEST_F(ServerE2E, WorkersOnJobStreamsFinishTheRunExactlyOnce) {
  Ledger ledger;
  EXPECT_EQ(work_streamed(options_for(*server_, "quitter"), 4, &ledger, 3), "stopped");
  std::vector<std::string> results(3);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      const auto options = options_for(*server_, "s" + std::to_string(i));
      results[i] =
          i == 0 ? work(options, &ledger) : work_streamed(options, i == 1 ? 2 : 8, &ledger);
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& r : results) EXPECT_EQ(r, "completed");
  ledger.expect_exactly_once(30, 6, 3);
  auto s = status();
  EXPECT_STREQ(s["state"].GetString(), "completed");
  EXPECT_EQ(s["counters"]["failure_reports"].GetUint64(), 0u);
  EXPECT_EQ(s["counters"]["lease_expiries"].GetUint64(), 0u);
  EXPECT_NEAR(s["epochs"][2]["loss"].GetDouble(), 0.2, 1e-12);
}

// With several I/O threads the engine runs on a thread of its own (with one, on the I/O
// thread): the same answers either way, with durability on.
TEST_F(ServerE2E, WithSeveralIoThreadsTheEngineThreadServesTheSameRun) {
  server_.reset();
  std::vector<std::string> args = server_args();
  args.insert(args.end(), {"--io-threads", "3"});
  server_ = ServerProcess::start(args);
  ASSERT_NE(server_, nullptr);
  Ledger ledger;
  std::vector<std::string> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = work(options_for(*server_, "t" + std::to_string(i)), &ledger); });
  }
  for (auto& t : threads) t.join();
  for (const std::string& r : results) EXPECT_EQ(r, "completed");
  ledger.expect_exactly_once(30, 6, 3);
  EXPECT_STREQ(status()["state"].GetString(), "completed");
}

TEST_F(ServerE2E, AKilledWorkersJobIsHandedToAnotherAfterItsLeaseExpires) {
  // The example worker dies (no goodbye) while holding its third job.
  int exit_status = 0;
  const std::string died =
      run_command(std::string(EXAMPLE_WORKER_BIN) + " --url " + server_->url() +
                      " --run e2e --name doomed --die-after 2",
                  &exit_status);
  EXPECT_EQ(exit_status, 137);
  ASSERT_NE(died.find("dying while holding train 0 2"), std::string::npos) << died;
  Ledger ledger;
  ledger.add_output(died);

  // Two survivors (one example worker process on a JobStream, one client thread) finish the
  // run.
  std::string survivor_output;
  std::thread process([&] {
    survivor_output = run_command(std::string(EXAMPLE_WORKER_BIN) + " --url " + server_->url() +
                                  " --run e2e --name survivor --job-ms 1 --prefetch 2");
  });
  EXPECT_EQ(work(options_for(*server_, "thread"), &ledger), "completed");
  process.join();
  ledger.add_output(survivor_output);
  ledger.expect_exactly_once(30, 6, 3);

  auto s = status();
  EXPECT_STREQ(s["state"].GetString(), "completed");
  EXPECT_GE(s["counters"]["lease_expiries"].GetUint64(), 1u);
  EXPECT_GE(s["counters"]["rehandouts"].GetUint64(), 1u);
}

TEST_F(ServerE2E, MalformedRequestsGetClearErrorsAndChangeNothing) {
  const uint16_t port = server_->port();
  EXPECT_EQ(raw_exchange(port, "HELLO THERE\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(raw_exchange(port, "POST /v1/runs/e2e/acquire HTTP/1.1\r\nHost: x\r\n\r\n", 500)
                .rfind("HTTP/1.1 411", 0),
            0u);
  const std::string big = "POST /v1/runs/e2e/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                          std::to_string(4 << 20) + "\r\n\r\n" + std::string(1 << 16, 'x');
  EXPECT_EQ(raw_exchange(port, big).rfind("HTTP/1.1 413", 0), 0u);
  const std::string bad_json =
      "POST /v1/runs/e2e/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{\"a\":";
  const std::string reply = raw_exchange(port, bad_json, 500);
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  EXPECT_NE(reply.find("not valid JSON"), std::string::npos);
  EXPECT_EQ(raw_exchange(port, "DELETE /v1/runs/e2e/acquire HTTP/1.1\r\nHost: x\r\n\r\n", 500)
                .rfind("HTTP/1.1 405", 0),
            0u);
  EXPECT_EQ(
      raw_exchange(port, "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 500).rfind("HTTP/1.1 404", 0),
      0u);

  // Pipelined requests in one write are answered in order on the same connection.
  const std::string two =
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /v1/runs/e2e/workers HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\n"
      "{\"name\": \"p1\"}\n"
      "GET /v1/runs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const std::string replies = raw_exchange(port, two);
  const auto first = replies.find("\"status\":\"ok\"");
  const auto second = replies.find("\"worker\":0");
  const auto third = replies.find("\"runs\":[");
  EXPECT_NE(first, std::string::npos) << replies;
  EXPECT_NE(second, std::string::npos) << replies;
  EXPECT_NE(third, std::string::npos) << replies;
  EXPECT_LT(first, second);
  EXPECT_LT(second, third);

  // The server is still up, and the run untouched but for the one registration.
  auto s = status();
  EXPECT_STREQ(s["state"].GetString(), "running");
  EXPECT_EQ(s["progress"]["jobs_done"].GetUint64(), 0u);
  EXPECT_EQ(s["counters"]["handouts"].GetUint64(), 0u);
}

TEST_F(ServerE2E, AnAcquireLongPollsAtTheEpochBarrierUntilWorkAppears) {
  const std::string url = server_->url();
  auto post = [&](const std::string& path, const std::string& body) {
    auto r = client::post(url, "/v1/runs/e2e/" + path, body, std::chrono::seconds(30));
    EXPECT_TRUE(r) << r.error().message;
    return parse(r ? *r : "{}");
  };
  post("workers", R"({"name": "holder"})");
  post("workers", R"({"name": "waiter"})");
  std::vector<uint64_t> leases;
  for (int i = 0; i < 15; ++i) {
    leases.push_back(post("acquire", R"({"worker": 0})")["job"]["lease"].GetUint64());
  }
  for (size_t i = 0; i + 1 < leases.size(); ++i) {
    post("complete", R"({"worker": 0, "loss": 1, "lease": )" + std::to_string(leases[i]) + "}");
  }
  std::string waited;
  std::thread waiter([&] {
    auto r = client::post(url, "/v1/runs/e2e/acquire", R"({"worker": 1, "wait_ms": 20000})",
                          std::chrono::seconds(30));
    waited = r ? *r : r.error().message;
  });
  // Give the waiter time to be parked at the barrier (the test holds either way), while
  // heartbeats keep the last train job alive.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  post("heartbeat", R"({"worker": 0})");
  post("complete", R"({"worker": 0, "loss": 1, "lease": )" + std::to_string(leases.back()) + "}");
  waiter.join();
  auto d = parse(waited);
  ASSERT_TRUE(d.IsObject()) << waited;
  EXPECT_STREQ(d["status"].GetString(), "job") << waited;
  EXPECT_STREQ(d["job"]["set"].GetString(), "dev") << waited;
}

// A request that arrives while the one before it on the same connection is held (a parked
// acquire) waits in the socket: nothing reads it until the reply is written, and its bytes'
// readiness was reported while no read was queued. It is answered all the same: the server
// waits for the socket before it reads, and the wait re-arms the socket (epoll_ctl MOD),
// which reports bytes already there. (A reactor that only waited for new bytes would leave
// it unanswered.)
TEST_F(ServerE2E, ARequestSentWhileTheOneBeforeItIsHeldIsAnswered) {
  ASSERT_NO_FATAL_FAILURE(lease_every_train_job_to_a());
  const int fd = testing::connect_loopback(server_->port());
  ASSERT_GE(fd, 0);
  auto send_all = [fd](const std::string& bytes) { return testing::send_all(fd, bytes); };
  const std::string held = R"({"worker": 1, "wait_ms": 400})";
  ASSERT_TRUE(send_all("POST /v1/runs/e2e/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                       std::to_string(held.size()) + "\r\n\r\n" + held));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // (held by then, or not: either
  ASSERT_TRUE(send_all("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));  // way it must answer)
  std::string replies;
  for (int i = 0; i < 200 && replies.find("\"status\":\"ok\"") == std::string::npos; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    replies.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const auto first = replies.find("\"retry_after_ms\"") != std::string::npos
                         ? replies.find("\"retry_after_ms\"")
                         : replies.find("\"lease\"");
  const auto second = replies.find("\"status\":\"ok\"");
  EXPECT_NE(first, std::string::npos) << replies;
  ASSERT_NE(second, std::string::npos) << "the second request was never answered: " << replies;
  EXPECT_LT(first, second) << replies;
}

TEST_F(ServerE2E, AParkedAcquireIsAnsweredWaitWhenItsWaitRunsOut) {
  const std::string url = server_->url();
  ASSERT_NO_FATAL_FAILURE(lease_every_train_job_to_a());
  auto r = client::post(url, "/v1/runs/e2e/acquire", R"({"worker": 1, "wait_ms": 200})");
  ASSERT_TRUE(r) << r.error().message;
  auto d = parse(*r);
  EXPECT_STREQ(d["status"].GetString(), "wait") << *r;
  EXPECT_GT(d["retry_after_ms"].GetInt64(), 0);
}

// Issue 16, item 12: a coordinator stopped (SIGSTOP, a stalled VM) for longer than the lease
// timeout expired every healthy worker's lease when it ran again, and charged each a failed
// attempt. The time it did not run is not counted against the leases: the heartbeats the
// workers sent meanwhile (waiting in the socket) reach it in time.
TEST(Pause, WorkersLeasesSurviveACoordinatorStoppedLongerThanTheLeaseTimeout) {
  TempDir dir;
  const std::string config = dir.write("pause.toml", R"(
name = "pause"
[data]
train_batches = 4
[schedule]
epochs = 1
[leases]
timeout = 2.0
)");
  auto server = ServerProcess::start({"--config", config, "--data-dir", dir.path() + "/data"});
  ASSERT_NE(server, nullptr);
  const std::string url = server->url();
  auto post = [&](const std::string& path, const std::string& body) {
    auto r = client::post(url, "/v1/runs/pause/" + path, body, std::chrono::seconds(60));
    EXPECT_TRUE(r) << path << ": " << r.error().message;
    return parse(r ? *r : "{}");
  };
  const int workers[] = {0, 1};
  std::vector<uint64_t> leases;
  for (int w : workers) {
    post("workers", R"({"name": "w)" + std::to_string(w) + R"("})");
    leases.push_back(
        post("acquire", R"({"worker": )" + std::to_string(w) + "}")["job"]["lease"].GetUint64());
  }
  auto heartbeat = [&](int w) {
    return R"({"worker": )" + std::to_string(w) + R"(, "leases": [)" +
           std::to_string(leases[static_cast<size_t>(w)]) + "]}";
  };
  for (int w : workers) post("heartbeat", heartbeat(w));

  server->signal(SIGSTOP);
  // Stopped for 2.5 lease timeouts: on the raw clock every lease would have run out.
  std::this_thread::sleep_for(std::chrono::milliseconds(5000));
  // The workers heartbeat on schedule; their requests wait in the socket until it runs again.
  std::vector<std::string> replies(2);
  std::vector<std::thread> heartbeats;
  for (int w : workers) {
    heartbeats.emplace_back([&, w] {
      auto r =
          client::post(url, "/v1/runs/pause/heartbeat", heartbeat(w), std::chrono::seconds(60));
      replies[static_cast<size_t>(w)] = r ? *r : r.error().message;
    });
  }
  server->signal(SIGCONT);
  for (std::thread& t : heartbeats) t.join();

  for (int w : workers) {
    const size_t i = static_cast<size_t>(w);
    auto d = parse(replies[i]);
    ASSERT_TRUE(d.IsObject() && d.HasMember("leases")) << replies[i];
    ASSERT_EQ(d["leases"].Size(), 1u) << "worker " << w << " lost its lease: " << replies[i];
    EXPECT_EQ(d["leases"][0].GetUint64(), leases[i]);
    auto done = post("complete", R"({"worker": )" + std::to_string(w) +
                                     R"(, "loss": 1, "lease": )" + std::to_string(leases[i]) + "}");
    EXPECT_STREQ(done["outcome"].GetString(), "accepted") << w;
  }
  auto body = client::get(url, "/v1/runs/pause");
  ASSERT_TRUE(body) << body.error().message;
  auto s = parse(*body);
  EXPECT_EQ(s["counters"]["lease_expiries"].GetUint64(), 0u) << *body;
  EXPECT_EQ(s["counters"]["rehandouts"].GetUint64(), 0u) << *body;
}

// A worker holds a job when the coordinator is killed; while it is down the client retries;
// the restarted coordinator resumes from its data dir and accepts the completion.
TEST_F(ServerE2E, TheClientRetriesAcrossACoordinatorRestartAndItsCompletionCounts) {
  client::Options o = options_for(*server_, "survivor");
  o.heartbeats = false;
  auto worker = client::Worker::connect(o);
  ASSERT_TRUE(worker) << worker.error().message;
  auto job = (*worker)->next();
  ASSERT_TRUE(job && *job);

  const uint16_t port = server_->port();
  server_->kill(SIGKILL);
  std::thread restart([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    server_ = ServerProcess::start(server_args(), port);
  });
  auto next = (*worker)->complete_and_next(**job, {0.5, 2, {}, 0});
  restart.join();
  ASSERT_NE(server_, nullptr);
  ASSERT_TRUE(next) << next.error().message;
  EXPECT_TRUE(next->has_value());
  EXPECT_EQ((*worker)->last_completed().outcome, "accepted");
  auto s = status();
  EXPECT_EQ(s["progress"]["jobs_done"].GetUint64(), 1u);
  EXPECT_EQ(s["workers"][0]["name"], "survivor");
}

// Without a data dir the restarted coordinator starts afresh: the client registers again and
// reports its completion as lost (the job will be handed out again).
TEST_F(ServerE2E, AnInMemoryCoordinatorForgetsAndTheClientCarriesOn) {
  server_->kill(SIGKILL);
  server_ = ServerProcess::start(server_args(/*in_memory=*/true));
  ASSERT_NE(server_, nullptr);
  client::Options o = options_for(*server_, "survivor");
  o.heartbeats = false;
  auto worker = client::Worker::connect(o);
  ASSERT_TRUE(worker) << worker.error().message;
  auto job = (*worker)->next();
  ASSERT_TRUE(job && *job);
  const uint16_t port = server_->port();
  server_->kill(SIGKILL);
  std::thread restart([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    server_ = ServerProcess::start(server_args(true), port);
  });
  auto next = (*worker)->complete_and_next(**job, {0.5, 2, {}, 0});
  restart.join();
  ASSERT_NE(server_, nullptr);
  ASSERT_TRUE(next) << next.error().message;
  EXPECT_TRUE(next->has_value());
  EXPECT_EQ((*worker)->last_completed().outcome, "lost");
}

TEST_F(ServerE2E, TheClientGivesUpWhenTheCoordinatorIsGoneForGood) {
  client::Options o = options_for(*server_, "lonely");
  o.give_up_after = std::chrono::milliseconds(300);
  o.heartbeats = false;
  auto worker = client::Worker::connect(o);
  ASSERT_TRUE(worker);
  server_->kill(SIGKILL);
  auto job = (*worker)->next();
  ASSERT_FALSE(job);
  EXPECT_EQ(job.error().code, "unreachable");
  EXPECT_NE(job.error().message.find("giving up"), std::string::npos) << job.error().message;
}

TEST_F(ServerE2E, ConnectingToAnUnknownRunFailsAtOnce) {
  client::Options o = options_for(*server_, "x");
  o.run = "nope";
  auto worker = client::Worker::connect(o);
  ASSERT_FALSE(worker);
  EXPECT_EQ(worker.error().http_status, 404);
  EXPECT_NE(worker.error().message.find("no run named nope"), std::string::npos);
}

// simulate and the real server, given the same config and the same completion order (FIFO),
// hand out the same jobs and compute the same epoch losses.
TEST_F(ServerE2E, SimulateAndTheServerAgree) {
  auto config = load_run_config(config_);
  ASSERT_TRUE(config);
  SimulationOptions options;
  options.workers = 3;
  options.losses.by_epoch[{SetKind::kTrain, 1}] = 0.7;
  options.losses.by_epoch[{SetKind::kDev, 2}] = 0.4;
  auto sim = simulate(*config, options);
  ASSERT_TRUE(sim);

  // The same loop as simulate(), over HTTP.
  const std::string url = server_->url();
  auto post = [&](const std::string& path, const std::string& body) {
    auto r = client::post(url, "/v1/runs/e2e/" + path, body);
    EXPECT_TRUE(r) << r.error().message;
    return parse(r ? *r : "{}");
  };
  struct Held {
    int worker;
    uint64_t lease;
    std::string set;
    int64_t epoch;
    uint64_t batches;
  };
  std::vector<Held> holding;
  std::vector<int> waiting;
  std::vector<std::string> handouts;
  auto take = [&](int w, const rapidjson::Value& a) {
    const std::string status = a["status"].GetString();
    if (status == "job") {
      const auto& j = a["job"];
      std::string line = "w" + std::to_string(w) + " " + j["set"].GetString() + " " +
                         std::to_string(j["epoch"].GetInt64()) + " " +
                         std::to_string(j["index"].GetUint64()) + " [";
      for (const auto& b : j["batches"].GetArray()) line += std::to_string(b.GetUint64()) + ",";
      handouts.push_back(line + "]");
      holding.push_back({w, j["lease"].GetUint64(), j["set"].GetString(), j["epoch"].GetInt64(),
                         j["batches"].Size()});
    } else if (status == "wait") {
      waiting.push_back(w);
    }
  };
  for (int w = 0; w < 3; ++w) post("workers", R"({"name": "w)" + std::to_string(w) + "\"}");
  for (int w = 0; w < 3; ++w) {
    auto a = post("acquire", R"({"worker": )" + std::to_string(w) + "}");
    take(w, a);
  }
  while (!holding.empty()) {
    const Held h = holding.front();
    holding.erase(holding.begin());
    const double loss =
        options.losses.loss(h.set == "train" ? SetKind::kTrain : SetKind::kDev, h.epoch);
    std::ostringstream body;
    body.precision(17);
    body << R"({"worker": )" << h.worker << R"(, "lease": )" << h.lease << R"(, "loss": )" << loss
         << R"(, "samples": )" << h.batches << R"(, "next": true})";
    auto r = post("complete", body.str());
    ASSERT_TRUE(r.IsObject() && r.HasMember("next"));
    take(h.worker, r["next"]);
    std::vector<int> retry;
    retry.swap(waiting);
    for (int w : retry) take(w, post("acquire", R"({"worker": )" + std::to_string(w) + "}"));
  }

  std::vector<std::string> expected;
  for (const Handout& h : sim->handouts) {
    std::string line = h.worker + " " + std::string(set_name(h.job.set)) + " " +
                       std::to_string(h.job.epoch) + " " + std::to_string(h.job.index) + " [";
    for (uint64_t b : h.batches) line += std::to_string(b) + ",";
    expected.push_back(line + "]");
  }
  EXPECT_EQ(handouts, expected);

  auto s = status();
  ASSERT_EQ(s["epochs"].Size(), sim->epochs.size());
  for (size_t i = 0; i < sim->epochs.size(); ++i) {
    EXPECT_DOUBLE_EQ(s["epochs"][static_cast<rapidjson::SizeType>(i)]["loss"].GetDouble(),
                     sim->epochs[i].loss);
  }
  EXPECT_STREQ(s["state"].GetString(), std::string(run_state_name(sim->state)).c_str());
}

TEST_F(ServerE2E, StatusAndRunsCommandsShowTheRun) {
  Ledger ledger;
  EXPECT_EQ(work(options_for(*server_, "solo"), &ledger), "completed");
  int code = -1;
  const std::string status =
      run_command(std::string(TRAINCOORD_BIN) + " status --url " + server_->url(), &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(status.find("run e2e: completed"), std::string::npos) << status;
  EXPECT_NE(status.find("solo"), std::string::npos) << status;
  const std::string runs =
      run_command(std::string(TRAINCOORD_BIN) + " runs --url " + server_->url(), &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(runs.find("e2e"), std::string::npos) << runs;
  run_command(std::string(TRAINCOORD_BIN) + " status nope --url " + server_->url() + " 2>&1",
              &code);
  EXPECT_EQ(code, 3);
}

}  // namespace
}  // namespace traincoord

namespace traincoord {
namespace {

// `traincoord serve` run to completion of its start-up checks: its exit status and what it said.
std::pair<int, std::string> serve_once(const std::vector<std::string>& args) {
  std::string command = std::string(TRAINCOORD_BIN) + " serve";
  for (const std::string& a : args) command += " '" + a + "'";
  int status = -1;
  const std::string out = run_command(
      command + " --listen 127.0.0.1:0 2>&1 & sleep 1; kill $! 2>/dev/null; wait $!", &status);
  return {status, out};
}

class Durability : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = dir_.write("run.toml", kRun);
    data_ = dir_.path() + "/data";
    auto server = ServerProcess::start({"--config", config_, "--data-dir", data_});
    ASSERT_NE(server, nullptr);
    ASSERT_TRUE(client::post(server->url(), "/v1/runs/e2e/workers", R"({"name": "a"})"));
    ASSERT_TRUE(client::post(server->url(), "/v1/runs/e2e/acquire", R"({"worker": 0})"));
  }
  std::string changed(const std::string& from, const std::string& to) {
    std::string text = kRun;
    text.replace(text.find(from), from.size(), to);
    return dir_.write("changed.toml", text);
  }
  TempDir dir_;
  std::string config_, data_;
};

TEST_F(Durability, AChangedConfigIsRefusedNamingTheFields) {
  const std::string file = changed("train_batches = 30", "train_batches = 31");
  auto [status, out] = serve_once({"--config", file, "--data-dir", data_});
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("data.train_batches"), std::string::npos) << out;
  // Even when asked: the sizes shape the plan of a started run.
  auto [status2, out2] =
      serve_once({"--config", file, "--data-dir", data_, "--apply-config-changes"});
  EXPECT_EQ(status2, 2) << out2;
  EXPECT_NE(out2.find("cannot change data.train_batches"), std::string::npos) << out2;
}

// A long-polled acquire for two jobs, answered when another worker's completions open the dev
// epoch, is logged as what it was: after a crash the restored run has handed out as much.
TEST_F(Durability, AParkedAcquireOfSeveralJobsIsRestoredAsItWasAnswered) {
  auto server = ServerProcess::start({"--config", config_, "--data-dir", data_});
  ASSERT_NE(server, nullptr);
  const std::string url = server->url();
  ASSERT_TRUE(client::post(url, "/v1/runs/e2e/workers", R"({"name": "b"})"));
  // Worker a holds lease 1 (SetUp); it takes the other 14 train jobs of epoch 0.
  auto rest = client::post(url, "/v1/runs/e2e/acquire", R"({"worker": 0, "jobs": 14})");
  ASSERT_TRUE(rest);
  ASSERT_EQ(parse(*rest)["jobs"].Size(), 14u);
  std::string parked_reply;
  std::thread parked([&] {
    auto r = client::post(url, "/v1/runs/e2e/acquire",
                          R"({"worker": 1, "wait_ms": 10000, "jobs": 2, "request": 5})");
    if (r) parked_reply = *r;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (parked by then, or answered
  std::string completions;                                      //  the same way a bit later)
  for (int lease = 1; lease <= 15; ++lease) {
    completions += (lease > 1 ? "," : "") + std::string(R"({"lease": )") + std::to_string(lease) +
                   R"(, "loss": 0.5, "samples": 2})";
  }
  ASSERT_TRUE(client::post(url, "/v1/runs/e2e/complete",
                           R"({"worker": 0, "completions": [)" + completions + "]}"));
  parked.join();
  ASSERT_FALSE(parked_reply.empty());
  auto answer = parse(parked_reply);
  ASSERT_STREQ(answer["status"].GetString(), "job") << parked_reply;
  ASSERT_EQ(answer["jobs"].Size(), 2u);
  EXPECT_STREQ(answer["jobs"][0]["set"].GetString(), "dev");
  auto before = parse(*client::get(url, "/v1/runs/e2e"));
  EXPECT_EQ(before["counters"]["handouts"].GetUint64(), 17u);

  server->kill(SIGKILL);
  server = ServerProcess::start({"--config", config_, "--data-dir", data_});
  ASSERT_NE(server, nullptr);
  auto after = parse(*client::get(server->url(), "/v1/runs/e2e"));
  EXPECT_EQ(after["counters"]["handouts"].GetUint64(), 17u);
  EXPECT_EQ(after["progress"]["jobs_done"].GetUint64(), 15u);
}

TEST_F(Durability, AChangedLeaseTimeoutIsAppliedWhenAsked) {
  const std::string file = changed("timeout = 0.5", "timeout = 2.5");
  auto [status, out] = serve_once({"--config", file, "--data-dir", data_});
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("leases.timeout"), std::string::npos) << out;
  auto server =
      ServerProcess::start({"--config", file, "--data-dir", data_, "--apply-config-changes"});
  ASSERT_NE(server, nullptr);
  auto body = client::get(server->url(), "/v1/runs/e2e");
  ASSERT_TRUE(body);
  auto d = parse(*body);
  EXPECT_EQ(d["config"]["lease_timeout_ms"].GetInt64(), 2500);
  EXPECT_EQ(d["counters"]["handouts"].GetUint64(), 1u);  // the run went on where it was
}

// A change applied with --apply-config-changes to a run whose lengths came from files stores
// the config as its creation did: with the lengths inline (durable_config_text). A later start
// needs neither the files nor the config file: the run is restored from the data dir alone,
// with the changed value, and the lengths it was planned with.
TEST(DurabilityConfig, AnAppliedChangeKeepsTheLengthsReadFromFiles) {
  TempDir dir;
  std::string train;
  for (int i = 0; i < 20; ++i) train += std::to_string(1 + i % 7) + "\n";
  dir.write("train.txt", train);
  dir.write("dev.txt", "1\n2\n3\n");
  const std::string run = R"(
name = "lengthy"
[data]
train_samples = 20
dev_samples = 3
train_lengths = "train.txt"
dev_lengths = "dev.txt"
[schedule]
mode = "steps"
epochs = 2
batch_budget = 12.0
[leases]
timeout = 10
)";
  const std::string data = dir.path() + "/data";
  const std::string first = dir.write("lengthy.toml", run);
  {
    auto server = ServerProcess::start({"--config", first, "--data-dir", data});
    ASSERT_NE(server, nullptr);
  }
  std::string changed = run;
  changed.replace(changed.find("timeout = 10"), 12, "timeout = 20");
  const std::string second = dir.write("changed.toml", changed);
  {
    auto server =
        ServerProcess::start({"--config", second, "--data-dir", data, "--apply-config-changes"});
    ASSERT_NE(server, nullptr);
  }
  std::filesystem::remove(dir.path() + "/train.txt");
  std::filesystem::remove(dir.path() + "/dev.txt");
  std::filesystem::remove(first);
  std::filesystem::remove(second);
  auto server = ServerProcess::start({"--data-dir", data});
  ASSERT_NE(server, nullptr) << "the run's stored config needs the files it was read from";
  auto body = client::get(server->url(), "/v1/runs/lengthy");
  ASSERT_TRUE(body) << body.error().message;
  auto d = parse(*body);
  EXPECT_EQ(d["config"]["lease_timeout_ms"].GetInt64(), 20000) << *body;
  EXPECT_NE(body->find("\"steps\""), std::string::npos) << *body;
}

// schedule.epochs raised on a run that completed (--apply-config-changes, issue 34): the run
// goes on with the epochs added, the change survives a kill -9, and every batch of every epoch
// is trained once.
TEST(DurabilityEpochs, RaisedEpochsOfACompletedRunAreTrainedOnceAcrossAKillNine) {
  TempDir dir;
  auto with_epochs = [&](const std::string& name, int epochs) {
    std::string text = kRun;
    text.replace(text.find("epochs = 3"), 10, "epochs = " + std::to_string(epochs));
    return dir.write(name, text);
  };
  const std::string one = with_epochs("one.toml", 1), three = with_epochs("three.toml", 3);
  const std::string data = dir.path() + "/data";
  Ledger ledger;
  {
    auto server = ServerProcess::start({"--config", one, "--data-dir", data});
    ASSERT_NE(server, nullptr);
    ASSERT_EQ(work(options_for(*server, "a"), &ledger), "completed");
  }
  auto [status, out] = serve_once({"--config", three, "--data-dir", data});
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("schedule.epochs"), std::string::npos) << out;

  auto server =
      ServerProcess::start({"--config", three, "--data-dir", data, "--apply-config-changes"});
  ASSERT_NE(server, nullptr);
  auto s = parse(*client::get(server->url(), "/v1/runs/e2e"));
  EXPECT_STREQ(s["state"].GetString(), "running");
  bool said = false;
  for (const auto& e : s["events"].GetArray()) {
    said |= std::string(e["kind"].GetString()) == "config_changed" &&
            std::string(e["text"].GetString()).find("schedule.epochs") != std::string::npos;
  }
  EXPECT_TRUE(said) << "no config_changed event naming schedule.epochs";
  ASSERT_EQ(work_streamed(options_for(*server, "b"), 2, &ledger, 5), "stopped");

  server->kill(SIGKILL);  // the raised target and the 5 jobs of epoch 1 are kept
  auto [status2, out2] =
      serve_once({"--config", one, "--data-dir", data, "--apply-config-changes"});
  EXPECT_EQ(status2, 2) << out2;  // lowered below the epoch opened
  EXPECT_NE(out2.find("schedule.epochs: the run has opened train epoch 1 already"),
            std::string::npos)
      << out2;
  server = ServerProcess::start({"--config", three, "--data-dir", data});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(work(options_for(*server, "c"), &ledger), "completed");
  ledger.expect_exactly_once(30, 6, 3);
}

TEST_F(Durability, InspectShowsARunWithoutAServer) {
  int status = -1;
  const std::string out =
      run_command(std::string(TRAINCOORD_BIN) + " inspect --data-dir " + data_ + " 2>&1", &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("run e2e: running"), std::string::npos) << out;
  EXPECT_NE(out.find("1 running"), std::string::npos) << out;
  const std::string json = run_command(
      std::string(TRAINCOORD_BIN) + " inspect --data-dir " + data_ + " e2e --json", &status);
  EXPECT_EQ(parse(json)["counters"]["handouts"].GetUint64(), 1u);
}

TEST_F(Durability, ACorruptDatabaseIsRefusedAndLeftAsItWas) {
  const std::string db = data_ + "/traincoord.db";
  std::filesystem::remove(data_ + "/traincoord.db-wal");
  std::filesystem::remove(data_ + "/traincoord.db-shm");
  {
    std::fstream f(db, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f << "garbage garbage garbage";
  }
  const auto size = std::filesystem::file_size(db);
  auto [status, out] = serve_once({"--config", config_, "--data-dir", data_});
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("did not change it"), std::string::npos) << out;
  EXPECT_EQ(std::filesystem::file_size(db), size);
}

}  // namespace
}  // namespace traincoord

namespace traincoord {
namespace {

using testing::server_closes;

class Limits : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = dir_.write("run.toml", kRun);
    server_ = ServerProcess::start(
        {"--config", config_, "--in-memory", "--max-connections", "3", "--read-timeout", "1",
         "--max-runs", "1", "--max-workers-per-run", "2", "--max-requests-per-connection", "2"});
    ASSERT_NE(server_, nullptr);
  }
  TempDir dir_;
  std::string config_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(Limits, ASlowlorisClientIsCutOffAfterTheReadTimeout) {
  // Half a request, then nothing: the server closes the connection (read timeout 1 s; we wait
  // up to 10 s for it).
  EXPECT_TRUE(server_closes(server_->port(), "POST /v1/runs/e2e/acquire HTTP/1.1\r\nHo", 10000));
  EXPECT_TRUE(client::get(server_->url(), "/healthz"));
}

TEST_F(Limits, ConnectionsBeyondTheLimitAreClosed) {
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) {
    int fd = -1;
    ASSERT_FALSE(server_closes(server_->port(), "", 300, &fd)) << "connection " << i;
    held.push_back(fd);
  }
  EXPECT_TRUE(server_closes(server_->port(), "", 5000));  // the fourth
  for (int fd : held) close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(client::get(server_->url(), "/healthz"));  // room again
}

TEST_F(Limits, AConnectionIsClosedAfterItsRequestLimit) {
  const std::string get = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string replies = raw_exchange(server_->port(), get + get + get, 2000);
  size_t count = 0;
  for (size_t at = replies.find("HTTP/1.1 200"); at != std::string::npos;
       at = replies.find("HTTP/1.1 200", at + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 2u) << replies;  // the second reply says Connection: close, then it closes
  EXPECT_NE(replies.find("Connection: close"), std::string::npos) << replies;
}

TEST_F(Limits, RunsAndWorkersPerRunAreCapped) {
  auto more =
      client::post(server_->url(), "/v1/runs", R"({"name": "x", "data": {"train_batches": 1}})");
  ASSERT_FALSE(more);
  EXPECT_EQ(more.error().http_status, 409);
  EXPECT_NE(more.error().message.find("--max-runs"), std::string::npos);
  EXPECT_TRUE(client::post(server_->url(), "/v1/runs/e2e/workers", R"({"name": "a"})"));
  EXPECT_TRUE(client::post(server_->url(), "/v1/runs/e2e/workers", R"({"name": "b"})"));
  auto third = client::post(server_->url(), "/v1/runs/e2e/workers", R"({"name": "c"})");
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().http_status, 409);
  EXPECT_TRUE(
      client::post(server_->url(), "/v1/runs/e2e/workers", R"({"name": "a"})"));  // a rejoin
}

TEST_F(Limits, DeeplyNestedJsonIsRefusedWithoutCrashing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto r = client::post(server_->url(), "/v1/runs/e2e/acquire", deep);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().http_status, 400);
  auto config = client::post(server_->url(), "/v1/runs", "{\"a\":" + std::string(50000, '[') + "}");
  ASSERT_FALSE(config);
  EXPECT_LT(config.error().http_status, 500);
  EXPECT_TRUE(client::get(server_->url(), "/healthz"));
}

}  // namespace
}  // namespace traincoord

namespace traincoord {
namespace {

// TLS: a throw-away CA, server and client certificates (tests/tls/make-certs) made per test.
class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = dir_.write("run.toml", kRun);
    pki_ = dir_.path() + "/pki";
    int status = -1;
    run_command(std::string(TRAINCOORD_SOURCE_DIR) + "/tests/tls/make-certs " + pki_, &status);
    ASSERT_EQ(status, 0) << "make-certs failed";
    unsetenv("TRAINCOORD_CA_FILE");
  }
  void serve(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--config",        config_,     "--in-memory",
                                     "--read-timeout",  "1",         "--tls-cert",
                                     pki("server.pem"), "--tls-key", pki("server-key.pem")};
    args.insert(args.end(), extra.begin(), extra.end());
    server_ = ServerProcess::start(args);
    ASSERT_NE(server_, nullptr);
    ASSERT_EQ(server_->url().rfind("https://", 0), 0u) << server_->output();
  }
  std::string pki(const std::string& file) const { return pki_ + "/" + file; }
  client::Options options(const std::string& name, const std::string& ca = "ca.pem") const {
    client::Options o = options_for(*server_, name);
    o.ca_file = pki(ca);
    o.give_up_after = std::chrono::milliseconds(3000);
    return o;
  }
  TempDir dir_;
  std::string config_, pki_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(Tls, WorkersFinishTheRunOverHttpsWithEveryBatchTrainedOnce) {
  serve();
  Ledger ledger;
  std::string a, b;
  std::thread ta([&] { a = work(options("a"), &ledger); });
  std::thread tb([&] { b = work(options("b"), &ledger); });
  ta.join();
  tb.join();
  EXPECT_EQ(a, "completed");
  EXPECT_EQ(b, "completed");
  ledger.expect_exactly_once(30, 6, 3);
  // traincoord status over https, trusting the CA through the environment.
  int status = -1;
  const std::string out = run_command("TRAINCOORD_CA_FILE=" + pki("ca.pem") + " " + TRAINCOORD_BIN +
                                          " status e2e --url " + server_->url(),
                                      &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("completed"), std::string::npos) << out;
}

TEST_F(Tls, AClientThatDoesNotTrustTheCertificateFailsAtOnceWithATlsError) {
  serve();
  auto w = client::Worker::connect(options("a", "other-ca.pem"));
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, "tls") << w.error().message;
  EXPECT_NE(w.error().message.find("certificate"), std::string::npos) << w.error().message;
  // Nothing reached the run.
  setenv("TRAINCOORD_CA_FILE", pki("ca.pem").c_str(), 1);
  auto body = client::get(server_->url(), "/v1/runs/e2e");
  ASSERT_TRUE(body) << body.error().message;
  EXPECT_EQ(parse(*body)["workers"].Size(), 0u) << *body;
}

TEST_F(Tls, ACertificateForAnotherHostIsRefused) {
  std::vector<std::string> args = {"--config",
                                   config_,
                                   "--in-memory",
                                   "--tls-cert",
                                   pki("wrong-host.pem"),
                                   "--tls-key",
                                   pki("wrong-host-key.pem")};
  server_ = ServerProcess::start(args);
  ASSERT_NE(server_, nullptr);
  auto w = client::Worker::connect(options("a"));  // the right CA, the wrong name
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, "tls") << w.error().message;
}

TEST_F(Tls, PlainHttpToTheTlsPortIsDroppedAndCounted) {
  serve();
  const std::string reply =
      raw_exchange(server_->port(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(reply.find("HTTP/1.1 200"), std::string::npos) << reply;
  // A connection that never starts its handshake is cut after the read timeout (1 s).
  EXPECT_TRUE(testing::server_closes(server_->port(), "", 10000));
  setenv("TRAINCOORD_CA_FILE", pki("ca.pem").c_str(), 1);
  auto metrics = client::get(server_->url(), "/metrics");
  ASSERT_TRUE(metrics) << metrics.error().message;
  const auto at = metrics->find("\ntraincoord_tls_handshake_failures_total ");
  ASSERT_NE(at, std::string::npos) << *metrics;
  EXPECT_GE(std::stoi(metrics->substr(at + 41)), 2) << metrics->substr(at, 60);
}

TEST_F(Tls, ClientCertificatesAreRequiredWhenTheServerHasAClientCa) {
  serve({"--tls-client-ca", pki("ca.pem")});
  auto none = client::Worker::connect(options("none"));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, "tls") << none.error().message;

  client::Options stranger = options("stranger");
  stranger.cert_file = pki("other-client.pem");
  stranger.key_file = pki("other-client-key.pem");
  auto refused = client::Worker::connect(stranger);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, "tls") << refused.error().message;

  client::Options good = options("good");
  good.cert_file = pki("client.pem");
  good.key_file = pki("client-key.pem");
  Ledger ledger;
  EXPECT_EQ(work(good, &ledger), "completed");
  ledger.expect_exactly_once(30, 6, 3);
}

TEST_F(Tls, BadTlsSettingsAreRefusedAtStartNamingTheFlag) {
  auto [status, out] =
      serve_once({"--config", config_, "--in-memory", "--tls-cert", pki("server.pem")});
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("--tls-key"), std::string::npos) << out;

  std::tie(status, out) = serve_once({"--config", config_, "--in-memory", "--tls-cert",
                                      pki("server.pem"), "--tls-key", pki("client-key.pem")});
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("does not match"), std::string::npos) << out;

  std::tie(status, out) = serve_once({"--config", config_, "--in-memory", "--tls-cert",
                                      pki("missing.pem"), "--tls-key", pki("server-key.pem")});
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("missing.pem"), std::string::npos) << out;

  // Off loopback, plain HTTP only when asked for.
  const std::string command = std::string(TRAINCOORD_BIN) + " serve --in-memory --config " +
                              config_ + " --listen 0.0.0.0:0 2>&1";
  out = run_command(command, &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("--tls-cert"), std::string::npos) << out;
  EXPECT_NE(out.find("--allow-plain-http"), std::string::npos) << out;
}

}  // namespace
}  // namespace traincoord

namespace traincoord {
namespace {

// Timeouts are deadlines checked by the I/O thread's sweeper: they cut silent connections, but
// never a request that is with the engine (a long poll).
class Timeouts : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string run = kRun;
    run.replace(run.find("timeout = 0.5"), 13, "timeout = 60");  // no lease expires here
    config_ = dir_.write("run.toml", run);
    server_ = ServerProcess::start(
        {"--config", config_, "--in-memory", "--read-timeout", "1", "--idle-timeout", "1"});
    ASSERT_NE(server_, nullptr);
  }
  TempDir dir_;
  std::string config_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(Timeouts, AnIdleConnectionIsClosedAfterTheIdleTimeout) {
  int fd = -1;
  // One request answered, then silence: closed after ~1 s (we wait up to 10 s).
  EXPECT_TRUE(testing::server_closes(server_->port(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                                     10000, &fd));
}

TEST_F(Timeouts, ALongPollOutlivesTheReadAndIdleTimeouts) {
  // Two workers: one takes every job of epoch 0, so the other's acquire parks at the barrier
  // for its whole wait (3 s, past both 1 s timeouts) and is answered "wait", not cut off.
  ASSERT_TRUE(client::post(server_->url(), "/v1/runs/e2e/workers", R"({"name": "a"})"));
  ASSERT_TRUE(client::post(server_->url(), "/v1/runs/e2e/workers", R"({"name": "b"})"));
  for (int i = 0; i < 15; ++i) {  // the 15 train jobs of epoch 0
    auto r = client::post(server_->url(), "/v1/runs/e2e/acquire", R"({"worker": 0})");
    ASSERT_TRUE(r) << r.error().message;
  }
  const std::string reply =
      raw_exchange(server_->port(),
                   "POST /v1/runs/e2e/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\n\r\n"
                   R"({"worker": 1, "wait_ms": 3000})",
                   8000);
  EXPECT_NE(reply.find("HTTP/1.1 200"), std::string::npos) << reply;
  EXPECT_NE(reply.find("\"wait\""), std::string::npos) << reply;
}

}  // namespace
}  // namespace traincoord
