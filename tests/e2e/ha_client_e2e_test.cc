// The C++ client and the CLI against several coordinators (docs/API.md, "Several coordinators"):
// tests/hostile/fake_ha.py puts a proxy per coordinator url in front of one real `traincoord
// serve`, each playing the leader, a standby (421 not_leader), a deposed leader answering with
// an older term, or one that is down, and losing replies on demand. The workers must find the
// leader, follow it when it moves, ignore a deposed leader, and train every job exactly once.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include "server_process.h"
#include "traincoord/client.h"

#ifndef TRAINCOORD_SOURCE_DIR
#define TRAINCOORD_SOURCE_DIR "."
#endif

namespace traincoord {
namespace {

using std::chrono::milliseconds;
using testing::run_command;
using testing::ServerProcess;
using testing::TempDir;

constexpr const char* kRun = R"(
name = "ha"
[data]
train_batches = 24
dev_batches = 6
order = "shuffled"
seed = 3
[schedule]
epochs = 2
iters_per_worker = 2
[leases]
timeout = 2
)";

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

rapidjson::Document parse(const std::string& text) {
  rapidjson::Document d;
  d.Parse(text.c_str());
  EXPECT_FALSE(d.HasParseError()) << text;
  return d;
}

// A free loopback port nothing listens on (bound, then closed).
uint16_t closed_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// The fake coordinators (tests/hostile/fake_ha.py) in front of `upstream`, killed by their pid
// when this goes out of scope (also when the test fails).
class FakeHa {
 public:
  FakeHa(const std::string& upstream, int count) : log_(dir_.path() + "/fake_ha.log") {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      const std::string script = std::string(TRAINCOORD_SOURCE_DIR) + "/tests/hostile/fake_ha.py";
      const std::string n = std::to_string(count);
      execl("/usr/bin/python3", "python3", script.c_str(), upstream.c_str(), "--count", n.c_str(),
            nullptr);
      _exit(127);
    }
    for (int i = 0; i < 200 && urls_.empty(); ++i) {  // up to 10 s
      const std::string text = read_text(log_);
      if (text.rfind("ports ", 0) == 0 && text.find('\n') != std::string::npos) {
        std::istringstream ports(text.substr(6, text.find('\n') - 6));
        for (std::string p; ports >> p;) urls_.push_back("http://127.0.0.1:" + p);
      } else {
        std::this_thread::sleep_for(milliseconds(50));
      }
    }
  }
  ~FakeHa() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return !urls_.empty(); }
  const std::string& url(size_t i) const { return urls_.at(i); }
  // Sets what coordinator i plays (fields merged); returns its counters.
  rapidjson::Document set(size_t i, const std::string& json) {
    auto r = client::post(url(i), "/__fake_ha", json);
    EXPECT_TRUE(r) << (r ? "" : r.error().message);
    return parse(r ? *r : "{}");
  }
  rapidjson::Document stats(size_t i) {
    auto r = client::get(url(i), "/__fake_ha");
    EXPECT_TRUE(r) << (r ? "" : r.error().message);
    return parse(r ? *r : "{}");
  }
  // The requests coordinator i met while playing `mode` whose path holds `path`.
  size_t requests(size_t i, const std::string& mode, const std::string& path) {
    auto s = stats(i);
    size_t n = 0;
    if (!s.HasMember("requests")) return 0;
    for (const auto& r : s["requests"].GetArray()) {
      const std::string text = r.GetString();
      if (text.rfind(mode + " ", 0) == 0 && text.find(path) != std::string::npos) ++n;
    }
    return n;
  }
  std::string leader_of(uint64_t term) const {
    return R"({"mode": "leader", "term": )" + std::to_string(term) + "}";
  }
  std::string standby_of(size_t leader, uint64_t term) const {
    return R"({"mode": "standby", "leader": ")" + url(leader) + R"(", "leader_term": )" +
           std::to_string(term) + "}";
  }

 private:
  TempDir dir_;
  std::string log_;
  pid_t pid_ = -1;
  std::vector<std::string> urls_;
};

class HaClient : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string config = dir_.path() + "/ha.toml";
    std::ofstream(config) << kRun;
    server_ = ServerProcess::start({"--config", config, "--in-memory"});
    ASSERT_NE(server_, nullptr);
    fake_ = std::make_unique<FakeHa>(server_->url(), 2);
    ASSERT_TRUE(fake_->started());
  }

  client::Options options(const std::string& url, const std::string& name) const {
    client::Options o;
    o.url = url;
    o.run = "ha";
    o.worker_name = name;
    o.long_poll = milliseconds(1000);
    o.give_up_after = milliseconds(20'000);
    o.initial_backoff = milliseconds(20);
    o.max_backoff = milliseconds(200);
    return o;
  }

  std::string both() const { return fake_->url(0) + "," + fake_->url(1); }

  rapidjson::Document status() {
    auto r = client::get(server_->url(), "/v1/runs/ha?epochs=0");
    EXPECT_TRUE(r) << (r ? "" : r.error().message);
    return parse(r ? *r : "{}");
  }

  // Every job of the run was counted exactly once.
  void expect_every_job_counted_once() {
    auto s = status();
    ASSERT_TRUE(s.IsObject() && s.HasMember("progress"));
    EXPECT_STREQ(s["state"].GetString(), "completed");
    const uint64_t planned = s["progress"]["jobs_planned"].GetUint64();
    EXPECT_EQ(s["progress"]["jobs_done"].GetUint64(), planned);
    EXPECT_EQ(s["counters"]["completions_accepted"].GetUint64(), planned);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<FakeHa> fake_;
};

// What the workers were told was counted: (set, epoch, index) → times.
using Counted = std::map<std::tuple<std::string, int64_t, uint64_t>, int>;

TEST_F(HaClient, AWorkerGivenAStandbyFirstFindsTheLeader) {
  fake_->set(0, fake_->standby_of(1, 4));
  fake_->set(1, fake_->leader_of(4));
  auto worker = client::Worker::connect(options(both(), "w0"));
  ASSERT_TRUE(worker) << worker.error().message;
  Counted counted;
  auto job = (*worker)->next();
  while (job && *job) {
    const client::Job j = **job;
    job = (*worker)->complete_and_next(j, {0.5, j.batches.size(), {}, 0});
    if (job && (*worker)->last_completed().counted) ++counted[{j.set, j.epoch, j.index}];
  }
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_EQ((*worker)->finished()->state, "completed");
  for (const auto& [key, times] : counted) EXPECT_EQ(times, 1);
  EXPECT_GE(fake_->requests(0, "standby", "/workers"), 1u);  // it asked the standby first
  EXPECT_EQ(fake_->requests(0, "standby", "/acquire"), 0u);  // then stayed with the leader
  expect_every_job_counted_once();
}

TEST_F(HaClient, TheLeaderAStandbyNamesIsFollowedEvenWhenNotListed) {
  FakeHa third(server_->url(), 1);  // leads; not in the worker's list
  ASSERT_TRUE(third.started());
  third.set(0, R"({"mode": "leader", "term": 6})");
  fake_->set(0, R"({"mode": "standby", "leader": ")" + third.url(0) + R"(", "leader_term": 6})");
  fake_->set(1, R"({"mode": "down"})");
  auto o = options(both(), "w0");
  o.heartbeats = false;
  auto worker = client::Worker::connect(o);
  ASSERT_TRUE(worker) << worker.error().message;
  auto job = (*worker)->next();
  ASSERT_TRUE(job && *job);
  EXPECT_EQ(fake_->stats(1)["refused"].GetInt(), 0);  // went to the leader named, not round
  EXPECT_GE(third.requests(0, "leader", "/acquire"), 1u);
}

// Leadership moves twice mid-run (each time to a new term): a worker on the blocking calls and
// one on a JobStream follow it, their heartbeats too, and every job is counted once.
TEST_F(HaClient, LeadershipMovesMidRunAndEveryJobIsCountedOnce) {
  fake_->set(0, fake_->leader_of(7));
  fake_->set(1, fake_->standby_of(0, 7));
  std::atomic<bool> stream_ok{false};
  std::string stream_error;
  std::thread streamer([&] {
    auto worker = client::Worker::connect(options(both(), "streamer"));
    if (!worker) {
      stream_error = worker.error().message;
      return;
    }
    client::JobStream stream(**worker, 2);
    for (auto job = stream.next(); job; job = stream.next()) {
      if (!*job) {
        stream_ok = stream.close().has_value();
        return;
      }
      std::this_thread::sleep_for(milliseconds(20));
      stream.complete(**job, {0.5, (*job)->batches.size(), {}, 0});
    }
    stream_error = "the stream failed";
  });
  auto worker = client::Worker::connect(options(both(), "w0"));
  ASSERT_TRUE(worker) << worker.error().message;
  size_t done = 0;
  auto job = (*worker)->next();
  while (job && *job) {
    const client::Job j = **job;
    if (++done == 4) {  // 0 → 1, term 8, with a pause for heartbeats (every 2 / 3 s) to go
      fake_->set(1, fake_->leader_of(8));
      fake_->set(0, fake_->standby_of(1, 8));
      std::this_thread::sleep_for(milliseconds(1500));
    } else if (done == 10) {  // 1 → 0, term 9
      fake_->set(0, fake_->leader_of(9));
      fake_->set(1, fake_->standby_of(0, 9));
    }
    std::this_thread::sleep_for(milliseconds(20));
    job = (*worker)->complete_and_next(j, {0.5, j.batches.size(), {}, 0});
  }
  ASSERT_TRUE(job) << job.error().message;
  streamer.join();
  EXPECT_TRUE(stream_ok) << stream_error;
  EXPECT_EQ((*worker)->finished()->state, "completed");
  EXPECT_GE(fake_->requests(1, "leader", "/complete"), 1u);
  EXPECT_GE(fake_->requests(0, "standby", "/complete") + fake_->requests(0, "standby", "/acquire"),
            1u);
  EXPECT_GE(fake_->requests(1, "leader", "/heartbeat"), 1u);  // the heartbeats followed
  expect_every_job_counted_once();
}

// A worker that holds a job and sends nothing else: its heartbeats meet the standby, are told
// where the leader is, and keep the lease alive there.
TEST_F(HaClient, HeartbeatsAloneFollowTheLeader) {
  fake_->set(0, fake_->leader_of(2));
  fake_->set(1, fake_->standby_of(0, 2));
  auto worker = client::Worker::connect(options(both(), "w0"));
  ASSERT_TRUE(worker) << worker.error().message;
  auto job = (*worker)->next();
  ASSERT_TRUE(job && *job);
  fake_->set(1, fake_->leader_of(3));
  fake_->set(0, fake_->standby_of(1, 3));
  for (int i = 0; i < 100 && fake_->requests(1, "leader", "/heartbeat") == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_GE(fake_->requests(0, "standby", "/heartbeat"), 1u);
  EXPECT_GE(fake_->requests(1, "leader", "/heartbeat"), 1u);
  auto done = (*worker)->complete(**job, {0.5, (*job)->batches.size(), {}, 0});
  ASSERT_TRUE(done) << done.error().message;
  EXPECT_EQ(done->outcome, "accepted");
}

// The leader counts a completion and dies before its reply leaves; the retry (the same request)
// reaches the new leader, which answers "duplicate": counted once.
TEST_F(HaClient, ACompletionWhoseReplyWasLostIsAnsweredDuplicateByTheNewLeader) {
  fake_->set(0, fake_->leader_of(3));
  fake_->set(1, fake_->standby_of(0, 3));
  auto o = options(both(), "w0");
  o.heartbeats = false;
  auto worker = client::Worker::connect(o);
  ASSERT_TRUE(worker) << worker.error().message;
  auto job = (*worker)->next();
  ASSERT_TRUE(job && *job);
  fake_->set(1, fake_->leader_of(4));
  // Coordinator 0 (deposed, not knowing it yet) forwards the completion (counted), loses the
  // reply, and is down from then on.
  fake_->set(0, R"({"drop_reply": {"path": "/complete", "count": 1, "then": {"mode": "down"}}})");
  auto done = (*worker)->complete(**job, {0.5, (*job)->batches.size(), {}, 0});
  ASSERT_TRUE(done) << done.error().message;
  EXPECT_EQ(fake_->stats(0)["dropped_replies"].GetInt(), 1);
  EXPECT_EQ(done->outcome, "duplicate");
  EXPECT_FALSE(done->counted);
  EXPECT_GE(fake_->requests(1, "leader", "/complete"), 1u);
  auto s = status();
  EXPECT_EQ(s["counters"]["completions_accepted"].GetUint64(), 1u);
  EXPECT_EQ(s["counters"]["completions_duplicate"].GetUint64(), 1u);
  // The rest of the run through the new leader: every job once.
  auto next = (*worker)->next();
  while (next && *next) {
    const client::Job j = **next;
    next = (*worker)->complete_and_next(j, {0.5, j.batches.size(), {}, 0});
  }
  ASSERT_TRUE(next) << next.error().message;
  expect_every_job_counted_once();
}

// A deposed leader that does not know it answers with an older term than the worker saw: its
// answer ("the run is finished") is ignored, and the request goes to the leader.
TEST_F(HaClient, AnAnswerOfAnOlderTermIsIgnored) {
  fake_->set(0, fake_->leader_of(5));
  fake_->set(1, R"({"mode": "stale", "term": 3})");
  auto o = options(both(), "w0");
  o.heartbeats = false;
  auto worker = client::Worker::connect(o);  // registers at coordinator 0: term 5 seen
  ASSERT_TRUE(worker) << worker.error().message;
  fake_->set(0, R"({"refuse": {"path": "/acquire", "count": 1}})");
  auto job = (*worker)->next();  // refused at 0, a stale answer at 1, then 0 again
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_TRUE(job->has_value()) << "took the stale answer: " << (*worker)->finished()->reason;
  EXPECT_EQ(fake_->stats(1)["stale"].GetInt(), 1);
  EXPECT_EQ(fake_->stats(0)["refused"].GetInt(), 1);
}

TEST_F(HaClient, ASingleUrlBehavesAsBefore) {
  auto worker = client::Worker::connect(options(server_->url(), "w0"));
  ASSERT_TRUE(worker) << worker.error().message;
  auto job = (*worker)->next();
  while (job && *job) {
    const client::Job j = **job;
    job = (*worker)->complete_and_next(j, {0.5, j.batches.size(), {}, 0});
  }
  ASSERT_TRUE(job) << job.error().message;
  expect_every_job_counted_once();
  // Unreachable: the message of one coordinator, as before.
  const std::string gone = "http://127.0.0.1:" + std::to_string(closed_port());
  auto o = options(gone, "w1");
  o.give_up_after = milliseconds(600);
  auto refused = client::Worker::connect(o);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, client::codes::kUnreachable);
  EXPECT_NE(refused.error().message.find("the coordinator at " + gone + " has not answered"),
            std::string::npos)
      << refused.error().message;
}

TEST_F(HaClient, WithEveryCoordinatorDownItGivesUpNamingEachUrl) {
  const std::string a = "http://127.0.0.1:" + std::to_string(closed_port());
  const std::string b = "http://127.0.0.1:" + std::to_string(closed_port());
  auto o = options(a + ", " + b, "w0");
  o.give_up_after = milliseconds(800);
  auto worker = client::Worker::connect(o);
  ASSERT_FALSE(worker);
  EXPECT_EQ(worker.error().code, client::codes::kUnreachable);
  const std::string& m = worker.error().message;
  EXPECT_NE(m.find("give_up_after 800 ms"), std::string::npos) << m;
  EXPECT_NE(m.find(a + ": cannot connect"), std::string::npos) << m;
  EXPECT_NE(m.find(b + ": cannot connect"), std::string::npos) << m;
  // And the tools: one round over the list, naming each.
  auto got = client::get(a + "," + b, "/v1/runs/ha");
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message.find(a), std::string::npos) << got.error().message;
  EXPECT_NE(got.error().message.find(b), std::string::npos) << got.error().message;
}

// An election in progress (no leader known anywhere): the worker waits and retries until one is
// elected.
TEST_F(HaClient, DuringAnElectionTheWorkerWaitsForTheNewLeader) {
  fake_->set(0, R"({"mode": "standby", "leader": null, "retry_after_ms": 30})");
  fake_->set(1, R"({"mode": "standby", "leader": null, "retry_after_ms": 30})");
  std::thread elect([&] {
    for (int i = 0; i < 400 && fake_->stats(1)["not_leader"].GetInt() < 3; ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    fake_->set(1, fake_->leader_of(2));
    fake_->set(0, fake_->standby_of(1, 2));
  });
  auto worker = client::Worker::connect(options(both(), "w0"));
  elect.join();
  ASSERT_TRUE(worker) << worker.error().message;
  EXPECT_GE(fake_->stats(0)["not_leader"].GetInt(), 1);
}

// `traincoord status` and `history` take the list and go to the leader.
TEST_F(HaClient, StatusAndHistoryFollowTheLeader) {
  fake_->set(0, fake_->standby_of(1, 2));
  fake_->set(1, fake_->leader_of(2));
  int code = -1;
  const std::string out = run_command(
      std::string(TRAINCOORD_BIN) + " status ha --json --url '" + both() + "' 2>&1", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"run\""), std::string::npos) << out;
  const std::string csv = run_command(
      std::string(TRAINCOORD_BIN) + " history ha --format csv --url '" + both() + "' 2>&1", &code);
  EXPECT_EQ(code, 0) << csv;
  EXPECT_GE(fake_->requests(1, "leader", "/v1/runs/ha"), 2u);
  // Every coordinator down: exit 1, each url named.
  fake_->set(0, R"({"mode": "down"})");
  fake_->set(1, R"({"mode": "down"})");
  const std::string down =
      run_command(std::string(TRAINCOORD_BIN) + " status ha --url '" + both() + "' 2>&1", &code);
  EXPECT_EQ(code, 1) << down;
  EXPECT_NE(down.find(fake_->url(0)), std::string::npos) << down;
  EXPECT_NE(down.find(fake_->url(1)), std::string::npos) << down;
}

}  // namespace
}  // namespace traincoord
