#include "client/reply.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "traincoord/client.h"

namespace traincoord::client {
namespace {

constexpr std::string_view kAcquire = "POST /v1/runs/r/acquire";
constexpr std::string_view kComplete = "POST /v1/runs/r/complete";

const std::string kJob =
    R"({"lease": 7, "attempt": 1, "set": "train", "epoch": 1, "index": 0, "jobs_in_epoch": 4,
        "batches": [0, 1]})";

// The message of the error a reply parse gave, or "" when it parsed.
template <typename T>
std::string refusal(const Result<T>& r) {
  if (r) return "";
  EXPECT_EQ(r.error().code, "bad_reply");
  return r.error().message;
}

TEST(Reply, WellFormedRepliesAreRead) {
  auto a = reply::acquired(R"({"status": "job", "job": )" + kJob + "}", false, kAcquire);
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_EQ(a->jobs.size(), 1u);
  EXPECT_EQ(a->jobs[0].lease, 7u);
  EXPECT_EQ(a->jobs[0].batches, (std::vector<uint64_t>{0, 1}));
  auto f = reply::acquired(R"({"status": "finished", "state": "completed", "reason": "done"})",
                           true, kAcquire);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->status, reply::Acquired::Status::kFinished);
  EXPECT_EQ(f->finished.state, "completed");
  auto c = reply::completion(R"({"outcomes": [{"outcome": "accepted", "counted": true}],
      "next": {"status": "job", "jobs": [)" +
                                 kJob + "]}}",
                             true, 1, true, kComplete);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->outcomes[0].outcome, "accepted");
  ASSERT_TRUE(c->next);
  EXPECT_EQ(c->next->jobs.size(), 1u);
  auto r = reply::registration(R"({"worker": 3, "heartbeat_interval_ms": 333})", "POST /w");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->worker, 3u);
  EXPECT_EQ(*r->heartbeat_interval_ms, 333);
}

TEST(Reply, AMalformedReplyIsAnErrorNamingTheRequestAndTheField) {
  EXPECT_NE(refusal(reply::acquired(R"({"status": "job"})", false, kAcquire))
                .find("the reply to POST /v1/runs/r/acquire lacks field 'job'"),
            std::string::npos);
  EXPECT_NE(
      refusal(reply::acquired(R"({"status": "job"})", true, kAcquire)).find("lacks field 'jobs'"),
      std::string::npos);
  EXPECT_NE(refusal(reply::acquired(R"({"status": "job", "jobs": []})", true, kAcquire))
                .find("empty 'jobs'"),
            std::string::npos);
  EXPECT_NE(refusal(reply::acquired(R"({"status": "job", "jobs": [7]})", true, kAcquire))
                .find("'jobs[0]' that is not an object"),
            std::string::npos);
  EXPECT_NE(refusal(reply::acquired(R"({"status": "job", "job": {"lease": "7"}})", false, kAcquire))
                .find("'job.lease' that is not an unsigned integer"),
            std::string::npos);
  EXPECT_NE(refusal(reply::acquired(R"({"status": "job", "job": {"lease": -1}})", false, kAcquire))
                .find("'job.lease'"),
            std::string::npos);
  std::string batches = kJob;
  batches.replace(batches.find("[0, 1]"), 6, R"([0, "x"])");
  EXPECT_NE(
      refusal(reply::acquired(R"({"status": "job", "job": )" + batches + "}", false, kAcquire))
          .find("'job.batches'"),
      std::string::npos);
  EXPECT_NE(refusal(reply::acquired(R"({"status": 1})", false, kAcquire))
                .find("'status' that is not a string"),
            std::string::npos);
  EXPECT_NE(refusal(reply::acquired(R"({"status": "later"})", false, kAcquire))
                .find("unknown value 'later'"),
            std::string::npos);
  EXPECT_NE(refusal(reply::acquired(R"({"status": "finished"})", false, kAcquire))
                .find("lacks field 'state'"),
            std::string::npos);
  EXPECT_NE(refusal(reply::acquired("[1]", false, kAcquire)).find("is not a JSON object"),
            std::string::npos);
  EXPECT_NE(refusal(reply::acquired("", false, kAcquire)).find("is not a JSON object"),
            std::string::npos);
  EXPECT_NE(refusal(reply::completion(R"({"outcome": "accepted"})", false, 1, false, kComplete))
                .find("lacks field 'counted'"),
            std::string::npos);
  EXPECT_NE(refusal(reply::completion(R"({"outcome": "accepted", "counted": true})", false, 1, true,
                                      kComplete))
                .find("lacks field 'next'"),
            std::string::npos);
  EXPECT_NE(refusal(reply::completion(R"({"outcome": "accepted", "counted": true,
                                          "next": {"status": "job"}})",
                                      false, 1, true, kComplete))
                .find("lacks field 'next.job'"),
            std::string::npos);
  EXPECT_NE(refusal(reply::completion(R"({"outcomes": [{"outcome": "accepted", "counted": 1}]})",
                                      true, 1, false, kComplete))
                .find("'outcomes[0].counted' that is not true or false"),
            std::string::npos);
  EXPECT_NE(refusal(reply::completion(R"({"outcomes": []})", true, 2, false, kComplete))
                .find("0 outcomes for 2 completions"),
            std::string::npos);
  EXPECT_NE(refusal(reply::registration(R"({"worker": "0"})", "POST /v1/runs/r/workers"))
                .find("'worker' that is not an unsigned 32-bit integer"),
            std::string::npos);
  EXPECT_NE(refusal(reply::registration(R"({"worker": 0, "heartbeat_interval_ms": "x"})",
                                        "POST /v1/runs/r/workers"))
                .find("POST /v1/runs/r/workers has field 'heartbeat_interval_ms' that is not an "
                      "integer"),
            std::string::npos);
}

// A coordinator cannot make the heartbeat thread spin (0 ms), nor sleep past any lease.
TEST(Reply, TheHeartbeatIntervalAskedForIsBoundedBothWays) {
  auto asked = [](const char* ms) {
    auto r = reply::registration(
        std::string(R"({"worker": 0, "heartbeat_interval_ms": )") + ms + "}", "POST /w");
    EXPECT_TRUE(r.has_value());
    return r ? r->heartbeat_interval_ms.value_or(-1) : -1;
  };
  EXPECT_EQ(asked("0"), kHeartbeatIntervalMin.count());
  EXPECT_EQ(asked("-5"), kHeartbeatIntervalMin.count());
  EXPECT_EQ(asked("250"), 250);
  EXPECT_EQ(asked("86400000"), kHeartbeatIntervalMax.count());
}

// A reply nested 200,000 deep is read without recursion: a bad_reply, not a stack overflow.
TEST(Reply, AReplyNestedAnyDepthIsABadReplyNotACrash) {
  const size_t depth = 200'000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  auto r = reply::registration(nested, "POST /v1/runs/r/workers");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, codes::kBadReply);
  auto inner = reply::acquired(R"({"status": "wait", "x": )" + nested + "}", false, "POST /a");
  EXPECT_TRUE(inner.has_value());  // a deep member the client does not read is harmless
  auto e = reply::error(409, R"({"error": )" + nested + "}", "POST /v1/runs/r/acquire");
  EXPECT_EQ(e.code, "http_409");
}

TEST(Reply, AnErrorReplyGivesItsCodeAndFieldOrTheStatusWhenItIsNotJson) {
  auto e = reply::error(
      404, R"({"error": {"code": "lease_unknown", "message": "lease 9 ...", "field": "lease"}})",
      "POST /v1/runs/r/complete");
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.code, "lease_unknown");
  EXPECT_EQ(e.message, "lease 9 ...");
  EXPECT_EQ(e.field, "lease");
  EXPECT_TRUE(reply::forgotten(e));
  EXPECT_FALSE(reply::unregistered(e));
  auto plain = reply::error(502, "<html>bad gateway</html>", "GET /v1/runs/r", "Bad Gateway");
  EXPECT_EQ(plain.code, "http_502");
  EXPECT_EQ(plain.message,
            "GET /v1/runs/r was answered HTTP 502 Bad Gateway: <html>bad "
            "gateway</html>");
  auto odd = reply::error(404, R"({"error": {"code": 7, "message": ["x"]}})", "GET /x");
  EXPECT_EQ(odd.code, "http_404");
  EXPECT_FALSE(reply::forgotten(odd));  // a 404 without a code is not a forgotten lease
  // An error that is not an object, and a redirect: the request, the status, where it points.
  auto nope = reply::error(409, R"({"error": "nope"})", "POST /v1/runs/r/workers", "Conflict");
  EXPECT_EQ(nope.code, "http_409");
  EXPECT_NE(nope.message.find("POST /v1/runs/r/workers was answered HTTP 409 Conflict"),
            std::string::npos);
  EXPECT_NE(nope.message.find("nope"), std::string::npos);
  auto moved = reply::error(302, "", "POST /v1/runs/r/workers", "Found", "http://elsewhere:1/");
  EXPECT_EQ(moved.code, "http_302");
  EXPECT_NE(moved.message.find("HTTP 302 Found, to http://elsewhere:1/"), std::string::npos);
}

// The client's names for the codes are the server's (core/error.h).
TEST(Reply, TheClientsCodesAreTheCoordinators) {
  EXPECT_EQ(codes::kRunNotFound, error_reason::kRunNotFound);
  EXPECT_EQ(codes::kWorkerNotRegistered, error_reason::kWorkerNotRegistered);
  EXPECT_EQ(codes::kLeaseUnknown, error_reason::kLeaseUnknown);
  EXPECT_EQ(codes::kLeaseNotYours, error_reason::kLeaseNotYours);
  EXPECT_EQ(codes::kStaleGeneration, error_reason::kStaleGeneration);
  EXPECT_EQ(codes::kRestoreRequired, error_reason::kRestoreRequired);
  EXPECT_EQ(codes::kLeaseNotHeld, error_reason::kLeaseNotHeld);
  EXPECT_EQ(codes::kCutMismatch, error_reason::kCutMismatch);
  EXPECT_EQ(codes::kCutNotFound, error_reason::kCutNotFound);
  EXPECT_EQ(codes::kCutIncomplete, error_reason::kCutIncomplete);
  EXPECT_EQ(codes::kNodeSecretMismatch, error_reason::kNodeSecretMismatch);
  EXPECT_EQ(codes::kRendezvousFull, error_reason::kRendezvousFull);
  EXPECT_EQ(codes::kRendezvousSettingsConflict, error_reason::kRendezvousSettingsConflict);
  EXPECT_EQ(codes::kRestoreConflict, error_reason::kRestoreConflict);
  EXPECT_EQ(codes::kGroupMismatch, error_reason::kGroupMismatch);
  EXPECT_EQ(codes::kRunCancelled, error_reason::kRunCancelled);
}

const std::string kCut =
    R"({"id": 4, "group": "g/1", "seq": 2, "generation": 3, "complete": true, "world_size": 2,
        "ranks": [0, 1], "created_ago_ms": 1500, "completed_ago_ms": 1000, "state": "running",
        "epoch": 1, "set": "train", "jobs_done": 9, "partial_jobs": 2, "partial_batches": 3})";

TEST(Reply, TheRepliesOfCutsAreRead) {
  auto r = reply::registration(
      R"({"worker": 3, "generation": 2, "group": "g", "group_state": "restore_required",
          "latest_cut": 4})",
      "POST /w");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->generation, 2u);
  EXPECT_TRUE(r->restore_required);
  EXPECT_EQ(r->latest_cut, 4u);
  auto plain = reply::registration(R"({"worker": 3, "generation": 1, "latest_cut": null})", "w");
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_FALSE(plain->restore_required);
  EXPECT_FALSE(plain->latest_cut);

  auto share = reply::cut_share(
      R"({"cut": 4, "complete": false, "ranks": [1], "world_size": 2, "generation": 3})", "c");
  ASSERT_TRUE(share) << share.error().message;
  EXPECT_EQ(share->cut, 4u);
  EXPECT_EQ(share->ranks, std::vector<uint32_t>{1});

  auto cut = reply::cut(kCut, "c");
  ASSERT_TRUE(cut) << cut.error().message;
  EXPECT_EQ(cut->group, "g/1");
  EXPECT_EQ(cut->created_ago.count(), 1500);
  EXPECT_EQ(cut->completed_ago->count(), 1000);
  EXPECT_EQ(cut->epoch, 1);
  EXPECT_EQ(cut->partial_batches, 3u);
  // An incomplete cut has no run state yet.
  auto pending = reply::cut(
      R"({"id": 5, "group": "g", "seq": 1, "generation": 1, "complete": false, "world_size": 3,
          "ranks": [2], "created_ago_ms": 10, "completed_ago_ms": null})",
      "c");
  ASSERT_TRUE(pending) << pending.error().message;
  EXPECT_FALSE(pending->completed_ago);
  EXPECT_FALSE(pending->epoch);

  auto list = reply::cut_list(
      R"({"keep": 5, "generation": 3, "group": null, "cuts": [)" + kCut + "]}", "c");
  ASSERT_TRUE(list) << list.error().message;
  EXPECT_EQ(list->group, "");
  ASSERT_EQ(list->cuts.size(), 1u);
  EXPECT_EQ(list->cuts[0].jobs_done, 9u);

  auto restored = reply::restored(
      R"({"restored": true, "cut": null, "generation": 4, "withdrawn_jobs": 0,
          "leases_voided": 2, "state": "running"})",
      "r");
  ASSERT_TRUE(restored) << restored.error().message;
  EXPECT_FALSE(restored->cut);
  EXPECT_EQ(restored->leases_voided, 2u);
}

TEST(Reply, AMalformedCutReplyNamesTheField) {
  EXPECT_NE(refusal(reply::cut_share(R"({"cut": 4, "complete": false, "ranks": [-1],
      "world_size": 2, "generation": 3})",
                                     "POST /v1/runs/r/cuts"))
                .find("POST /v1/runs/r/cuts has field 'ranks'"),
            std::string::npos);
  std::string no_jobs = kCut;
  no_jobs.replace(no_jobs.find(R"("jobs_done": 9)"), 14, R"("jobs_done": "9")");
  EXPECT_NE(refusal(reply::cut(no_jobs, "c")).find("'jobs_done'"), std::string::npos);
  EXPECT_NE(refusal(reply::cut_list(R"({"keep": 5, "generation": 3, "group": null,
      "cuts": [{"id": 1}]})",
                                    "c"))
                .find("'cuts[0].group'"),
            std::string::npos);
  EXPECT_NE(refusal(reply::registration(R"({"worker": 1, "group_state": "sleepy"})", "w"))
                .find("'group_state'"),
            std::string::npos);
  EXPECT_NE(refusal(reply::restored(R"({"restored": true})", "r")).find("'generation'"),
            std::string::npos);
}

// A coordinator on a loopback port that answers each request with the next canned reply, and
// records the request lines and bodies it was sent.
class FakeCoordinator {
 public:
  explicit FakeCoordinator(std::vector<std::pair<int, std::string>> replies)
      : replies_(replies.begin(), replies.end()) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(listen(listener_, 4), 0);
    socklen_t len = sizeof addr;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeCoordinator() {
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  void serve() {
    while (true) {
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      while (answer(fd)) {
      }
      close(fd);
    }
  }

  // One request on `fd`; false when the connection ended or no reply is left.
  bool answer(int fd) {
    std::string in;
    char buf[4096];
    size_t head_end;
    while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) return false;
      in.append(buf, static_cast<size_t>(n));
    }
    size_t length = 0;
    if (auto at = in.find("Content-Length: "); at != std::string::npos && at < head_end) {
      length = std::stoul(in.substr(at + 16));
    }
    while (in.size() < head_end + 4 + length) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) return false;
      in.append(buf, static_cast<size_t>(n));
    }
    std::pair<int, std::string> reply;
    {
      std::lock_guard lock(mu_);
      requests_.push_back(in.substr(0, in.find("\r\n")) + " " + in.substr(head_end + 4, length));
      if (replies_.empty()) return false;
      reply = std::move(replies_.front());
      replies_.pop_front();
    }
    const std::string out = "HTTP/1.1 " + std::to_string(reply.first) +
                            " X\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(reply.second.size()) + "\r\n\r\n" + reply.second;
    return write(fd, out.data(), out.size()) == static_cast<ssize_t>(out.size());
  }

  int listener_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::deque<std::pair<int, std::string>> replies_;
  std::vector<std::string> requests_;
};

Options options_for(const FakeCoordinator& fake) {
  Options o;
  o.url = fake.url();
  o.run = "r";
  o.worker_name = "w";
  o.heartbeats = false;
  o.give_up_after = std::chrono::milliseconds(200);
  o.long_poll = std::chrono::milliseconds(0);
  return o;
}

const std::string kRegistered = R"({"worker": 0, "heartbeat_interval_ms": 1000})";

TEST(ClientReplies, AMalformedReplyFailsTheCallWithBadReplyInsteadOfCrashing) {
  FakeCoordinator fake({{200, kRegistered},
                        {200, R"({"status": "job"})"},
                        {200, R"({"status": "job", "job": {"lease": 1}})"},
                        {200, R"({"status": "job", "jobs": "all"})"}});
  auto worker = Worker::connect(options_for(fake));
  ASSERT_TRUE(worker) << worker.error().message;
  auto job = (*worker)->next();
  ASSERT_FALSE(job);
  EXPECT_EQ(job.error().code, "bad_reply");
  EXPECT_NE(job.error().message.find("the reply to POST /v1/runs/r/acquire lacks field 'job'"),
            std::string::npos)
      << job.error().message;
  job = (*worker)->next();
  ASSERT_FALSE(job);
  EXPECT_NE(job.error().message.find("'job.attempt'"), std::string::npos) << job.error().message;
  auto jobs = (*worker)->next_jobs(2);
  ASSERT_FALSE(jobs);
  EXPECT_NE(jobs.error().message.find("'jobs' that is not an array"), std::string::npos)
      << jobs.error().message;
}

TEST(ClientReplies, AMalformedRegistrationFailsConnect) {
  FakeCoordinator fake({{200, R"({"worker": -1})"}});
  auto worker = Worker::connect(options_for(fake));
  ASSERT_FALSE(worker);
  EXPECT_EQ(worker.error().code, "bad_reply");
  EXPECT_NE(worker.error().message.find("'worker'"), std::string::npos);
}

// The client decides on the code: worker_not_registered makes it register again (whatever the
// message says), lease_unknown makes a completion "lost", and another 404 is an error.
TEST(ClientReplies, TheClientActsOnErrorCodesNotOnMessages) {
  const std::string job = R"({"status": "job", "job": )" + kJob + "}";
  FakeCoordinator fake(
      {{200, kRegistered},
       {404, R"({"error": {"code": "worker_not_registered", "message": "who are you?"}})"},
       {200, R"({"worker": 5})"},
       {200, job},
       {404, R"({"error": {"code": "lease_unknown", "message": "no idea"}})"},
       {404, R"({"error": {"code": "run_not_found", "message": "worker 0 has not registered"}})"}});
  auto worker = Worker::connect(options_for(fake));
  ASSERT_TRUE(worker) << worker.error().message;
  auto got = (*worker)->next();
  ASSERT_TRUE(got) << got.error().message;
  ASSERT_TRUE(*got);
  EXPECT_EQ((*worker)->id(), 5u);
  Completion half;
  half.loss = 0.5;
  half.samples = 2;
  auto done = (*worker)->complete(**got, half);
  ASSERT_TRUE(done) << done.error().message;
  EXPECT_EQ(done->outcome, "lost");
  auto gone = (*worker)->complete(**got, half);
  ASSERT_FALSE(gone);  // the text says "has not registered", but the code is run_not_found
  EXPECT_EQ(gone.error().code, "run_not_found");
  const auto requests = fake.requests();
  ASSERT_EQ(requests.size(), 6u);
  EXPECT_EQ(requests[2].rfind("POST /v1/runs/r/workers", 0), 0u) << requests[2];
  EXPECT_NE(requests[3].find("\"worker\":5"), std::string::npos) << requests[3];
}

// Several coordinators: a 421 not_leader names the leader (or none, during an election).
TEST(Reply, NotLeaderNamesTheLeaderItsTermAndTheWait) {
  auto named = reply::not_leader(
      421, R"({"error": {"code": "not_leader", "message": "m", "leader": "http://b:8470",
              "term": 12, "retry_after_ms": 250}})");
  ASSERT_TRUE(named);
  EXPECT_EQ(named->leader, "http://b:8470");
  EXPECT_EQ(named->term, 12u);
  EXPECT_EQ(named->retry_after_ms, 250);
  auto election =
      reply::not_leader(421, R"({"error": {"code": "not_leader", "leader": null, "term": null,
              "retry_after_ms": 99999999}})");
  ASSERT_TRUE(election);
  EXPECT_EQ(election->leader, "");
  EXPECT_FALSE(election->term);
  EXPECT_EQ(election->retry_after_ms, 10'000);  // bounded
  auto odd = reply::not_leader(421, R"({"error": {"code": "not_leader", "leader": 5}})");
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->leader, "");
  EXPECT_EQ(odd->retry_after_ms, 100);
  EXPECT_FALSE(reply::not_leader(421, R"({"error": {"code": "http_421"}})"));
  EXPECT_FALSE(reply::not_leader(421, "not json"));
  EXPECT_FALSE(reply::not_leader(409, R"({"error": {"code": "not_leader"}})"));
  EXPECT_EQ(std::string(codes::kNotLeader), "not_leader");
}

// Step mode (docs/SEMANTICS.md, "Step mode"): a job is one rank's batch of one step, its
// samples listed.
const std::string kStepJob =
    R"({"lease": 9, "attempt": 1, "set": "train", "epoch": 2, "index": 5, "jobs_in_epoch": 12,
        "batches": [], "rank": 2, "step": 1, "steps": 4, "loss_scale": 0.75,
        "samples": [17, 3, 22], "lease_expires_in_ms": 5000})";

// kStepJob with `field` set to `value` (a JSON text), or left out when `value` is empty.
std::string step_job_with(const std::string& field, const std::string& value) {
  rapidjson::Document d;
  d.Parse(kStepJob.c_str());
  d.RemoveMember(field.c_str());
  // Rebuilt by hand so that the value's JSON text is exactly `value`.
  std::string body = "{";
  for (const auto& m : d.GetObject()) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    m.value.Accept(w);
    body += "\"" + std::string(m.name.GetString()) + "\": " + b.GetString() + ", ";
  }
  if (!value.empty()) body += "\"" + field + "\": " + value + ", ";
  body.resize(body.size() - 2);
  return body + "}";
}

TEST(Reply, AStepModeJobCarriesItsRankStepLossScaleAndSamples) {
  auto a = reply::acquired(R"({"status": "job", "jobs": [)" + kStepJob + "]}", true, kAcquire);
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_EQ(a->jobs.size(), 1u);
  const Job& j = a->jobs[0];
  EXPECT_TRUE(j.step_mode());
  EXPECT_EQ(j.rank, 2u);
  EXPECT_EQ(j.step, 1u);
  EXPECT_EQ(j.steps, 4u);
  EXPECT_DOUBLE_EQ(j.loss_scale, 0.75);
  EXPECT_EQ(j.samples, (std::vector<uint64_t>{17, 3, 22}));
  EXPECT_TRUE(j.batches.empty());
  // An integer loss scale is a number too, and an empty batch (fewer samples than ranks) is one.
  auto empty = reply::acquired(
      R"({"status": "job", "job": )" + step_job_with("loss_scale", "0") + "}", false, kAcquire);
  ASSERT_TRUE(empty) << empty.error().message;
  EXPECT_EQ(empty->jobs[0].loss_scale, 0.0);
  auto no_samples = reply::acquired(
      R"({"status": "job", "job": )" + step_job_with("samples", "[]") + "}", false, kAcquire);
  ASSERT_TRUE(no_samples) << no_samples.error().message;
  EXPECT_TRUE(no_samples->jobs[0].samples.empty());
  EXPECT_TRUE(no_samples->jobs[0].step_mode());
  // In the "next" of a completion as well.
  auto c = reply::completion(
      R"({"outcome": "accepted", "counted": true, "next": {"status": "job", "job": )" + kStepJob +
          "}}",
      false, 1, true, kComplete);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->next->jobs[0].samples.size(), 3u);
}

TEST(Reply, AJobModeJobIsNotAStepModeJob) {
  auto a = reply::acquired(R"({"status": "job", "job": )" + kJob + "}", false, kAcquire);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_FALSE(a->jobs[0].step_mode());
  EXPECT_TRUE(a->jobs[0].samples.empty());
  EXPECT_EQ(a->jobs[0].loss_scale, 1.0);
}

TEST(Reply, AStepModeJobWithAFieldMissingOrOfAnotherTypeIsABadReply) {
  auto refused = [](const std::string& job) {
    return refusal(reply::acquired(R"({"status": "job", "job": )" + job + "}", false, kAcquire));
  };
  for (const char* field : {"rank", "step", "steps", "loss_scale", "samples"}) {
    EXPECT_NE(refused(step_job_with(field, "")).find(std::string("lacks field 'job.") + field),
              std::string::npos)
        << field;
  }
  EXPECT_NE(refused(step_job_with("rank", "-1")).find("'job.rank' that is not an unsigned 32"),
            std::string::npos);
  EXPECT_NE(refused(step_job_with("rank", "4294967296")).find("'job.rank'"), std::string::npos);
  EXPECT_NE(refused(step_job_with("step", "1.5")).find("'job.step' that is not an unsigned"),
            std::string::npos);
  EXPECT_NE(refused(step_job_with("steps", "\"4\"")).find("'job.steps' that is not an unsigned"),
            std::string::npos);
  EXPECT_NE(refused(step_job_with("loss_scale", "\"1\""))
                .find("'job.loss_scale' that is not a "
                      "number"),
            std::string::npos);
  EXPECT_NE(refused(step_job_with("loss_scale", "null")).find("'job.loss_scale'"),
            std::string::npos);
  EXPECT_NE(refused(step_job_with("loss_scale", "-0.5"))
                .find("'job.loss_scale' that is not a "
                      "finite number of at least 0"),
            std::string::npos);
  EXPECT_NE(refused(step_job_with("samples", "3")).find("'job.samples' that is not an array"),
            std::string::npos);
  EXPECT_NE(refused(step_job_with("samples", "[1, -2]")).find("'job.samples' that holds a value"),
            std::string::npos);
  EXPECT_NE(refused(step_job_with("samples", "[1, \"2\"]")).find("'job.samples'"),
            std::string::npos);
  EXPECT_NE(refused(step_job_with("step", "4")).find("'job.step' 4 not below its 'steps' 4"),
            std::string::npos);
  // In a list of jobs, the message names the item.
  EXPECT_NE(refusal(reply::acquired(R"({"status": "job", "jobs": [)" + kStepJob + ", " +
                                        step_job_with("samples", "{}") + "]}",
                                    true, kAcquire))
                .find("'jobs[1].samples'"),
            std::string::npos);
}

TEST(Reply, StepModeRefusalsHaveTheirCodes) {
  const ClientError e = reply::error(
      409, R"({"error": {"code": "rank_required", "message": "register with your rank"}})",
      kAcquire);
  EXPECT_EQ(e.code, codes::kRankRequired);
  EXPECT_EQ(e.http_status, 409);
  EXPECT_EQ(reply::error(409, R"({"error": {"code": "world_size_mismatch", "message": "m"}})",
                         "POST /v1/runs/r/workers")
                .code,
            codes::kWorldSizeMismatch);
  EXPECT_EQ(std::string(codes::kRankRequired), "rank_required");
  EXPECT_EQ(std::string(codes::kWorldSizeMismatch), "world_size_mismatch");
}

}  // namespace
}  // namespace traincoord::client
