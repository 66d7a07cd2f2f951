// The rendezvous replies as the C++ client reads them (client/rendezvous.h): what the server's
// own handlers write reads back into the core's types, and a reply the client cannot trust is a
// bad_reply naming the request and the field, never a guess.
#include "client/rendezvous.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "client/reply.h"
#include "server/api.h"

namespace traincoord::client {
namespace {

constexpr std::string_view kPoll = "POST /v1/runs/r/nodes/poll";

const std::string kRunning = R"({"state": "running", "round": 3, "restart_count": 2,
    "run_state": "running", "node_rank": 1, "nnodes": 2, "world_size": 4, "rank_offset": 2,
    "master_addr": "10.0.0.1", "master_port": 29500, "group": "rdzv-r3"})";

// The message of a refused parse ("" when it parsed).
template <typename T>
std::string refusal(const Result<T>& r) {
  if (r) return "";
  EXPECT_EQ(r.error().code, "bad_reply");
  return r.error().message;
}

// kRunning with `key`'s value replaced by `value` (raw JSON), or without it (value empty).
std::string running_with(const std::string& key, const std::string& value) {
  std::string body = kRunning;
  const size_t at = body.find("\"" + key + "\"");
  EXPECT_NE(at, std::string::npos) << key;
  size_t end = body.find_first_of(",}", body.find(':', at));
  if (value.empty()) {  // (the last field: its comma before it goes too)
    const size_t from = body[end] == ',' ? at : body.rfind(',', at);
    body.erase(from, (body[end] == ',' ? end + 1 : end) - from);
  } else {
    const size_t colon = body.find(':', at);
    body.replace(colon + 1, end - colon - 1, " " + value);
  }
  return body;
}

TEST(RendezvousReply, ARunningNodeReadsIntoTheCoresAssignment) {
  auto a = reply::assignment(kRunning, kPoll);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(a->state, NodeState::kRunning);
  EXPECT_EQ(a->round, 3u);
  EXPECT_EQ(a->restart_count, 2u);
  EXPECT_EQ(a->run_state, RunState::kRunning);
  EXPECT_EQ(a->node_rank, 1u);
  EXPECT_EQ(a->nnodes, 2u);
  EXPECT_EQ(a->world_size, 4u);
  EXPECT_EQ(a->rank_offset, 2u);
  EXPECT_EQ(a->master_addr, "10.0.0.1");
  EXPECT_EQ(a->master_port, 29500);
  EXPECT_EQ(a->group, "rdzv-r3");
}

TEST(RendezvousReply, WaitingAndRestartNeedNoLayoutAndRestartSaysWhy) {
  auto waiting = reply::assignment(
      R"({"state": "waiting", "round": 1, "restart_count": 0, "run_state": "completed"})", kPoll);
  ASSERT_TRUE(waiting) << waiting.error().message;
  EXPECT_EQ(waiting->state, NodeState::kWaiting);
  EXPECT_EQ(waiting->run_state, RunState::kCompleted);
  auto restart = reply::assignment(R"({"state": "restart", "round": 2, "restart_count": 1,
      "run_state": "running", "why": "rank 3 exited with 1"})",
                                   kPoll);
  ASSERT_TRUE(restart) << restart.error().message;
  EXPECT_EQ(restart->state, NodeState::kRestart);
  EXPECT_EQ(restart->why, "rank 3 exited with 1");
  EXPECT_NE(refusal(reply::assignment(
                R"({"state": "restart", "round": 2, "restart_count": 1, "run_state": "running"})",
                kPoll)),
            "");
}

TEST(RendezvousReply, AStateTheClientDoesNotKnowIsRefusedNamingTheKnownOnes) {
  const std::string message =
      refusal(reply::assignment(running_with("state", "\"paused\""), kPoll));
  EXPECT_NE(message.find(std::string(kPoll)), std::string::npos) << message;
  EXPECT_NE(message.find("'state' that is 'paused'"), std::string::npos) << message;
  EXPECT_NE(message.find("waiting, running, restart"), std::string::npos) << message;
  const std::string run = refusal(reply::assignment(running_with("run_state", "\"done\""), kPoll));
  EXPECT_NE(run.find("'run_state' that is 'done'"), std::string::npos) << run;
  EXPECT_NE(run.find("early_stopped"), std::string::npos) << run;
}

TEST(RendezvousReply, AMissingOrMistypedFieldIsRefusedNamingIt) {
  for (const char* key : {"state", "round", "restart_count", "run_state", "node_rank", "nnodes",
                          "world_size", "rank_offset", "master_addr", "master_port", "group"}) {
    const std::string message = refusal(reply::assignment(running_with(key, ""), kPoll));
    EXPECT_NE(message.find(std::string("lacks field '") + key + "'"), std::string::npos)
        << key << ": " << message;
  }
  EXPECT_NE(refusal(reply::assignment(running_with("round", "\"3\""), kPoll))
                .find("'round' that is not an unsigned integer"),
            std::string::npos);
  EXPECT_NE(refusal(reply::assignment(running_with("node_rank", "-1"), kPoll)), "");
  EXPECT_NE(refusal(reply::assignment(running_with("group", "7"), kPoll)), "");
  EXPECT_NE(refusal(reply::assignment("not json", kPoll)).find("is not a JSON object"),
            std::string::npos);
  EXPECT_NE(refusal(reply::assignment("[1]", kPoll)), "");
}

TEST(RendezvousReply, ALayoutThatDoesNotHoldTogetherIsRefused) {
  EXPECT_NE(refusal(reply::assignment(running_with("node_rank", "2"), kPoll))
                .find("node_rank 2, not below nnodes 2"),
            std::string::npos);
  EXPECT_NE(refusal(reply::assignment(running_with("rank_offset", "4"), kPoll))
                .find("rank_offset 4, not below world_size 4"),
            std::string::npos);
  EXPECT_NE(refusal(reply::assignment(running_with("master_port", "70000"), kPoll))
                .find("'master_port' that is 70000"),
            std::string::npos);
  EXPECT_NE(refusal(reply::assignment(running_with("master_addr", "\"\""), kPoll))
                .find("empty field 'master_addr'"),
            std::string::npos);
  EXPECT_NE(
      refusal(reply::assignment(running_with("group", "\"\""), kPoll)).find("empty field 'group'"),
      std::string::npos);
}

TEST(RendezvousReply, LeaveMustSayLeft) {
  constexpr std::string_view kLeave = "POST /v1/runs/r/nodes/leave";
  EXPECT_TRUE(reply::left(R"({"left": true})", kLeave));
  EXPECT_NE(refusal(reply::left(R"({"left": false})", kLeave)).find("'left': false"),
            std::string::npos);
  EXPECT_NE(refusal(reply::left(R"({})", kLeave)).find("lacks field 'left'"), std::string::npos);
}

// Paired with the server (server/api.cc): what its handlers write for waiting, running and a
// restart reads back into the same assignment.
TEST(RendezvousReply, WhatTheServerWritesReadsBack) {
  ManualClock clock;
  Engine engine(clock);
  Api api(engine, clock);
  auto post = [&](const std::string& target, const std::string& body) {
    auto r = api.handle({"POST", target, body, {}});
    EXPECT_TRUE(std::holds_alternative<HttpReply>(r));
    const HttpReply reply = std::get<HttpReply>(r);
    EXPECT_EQ(reply.status / 100, 2) << target << ": " << reply.body;
    return reply.body;
  };
  post("/v1/runs", R"({"name": "r", "data": {"train_batches": 4, "dev_batches": 2},
      "schedule": {"epochs": 1}})");
  auto join = [&](const std::string& node) {
    return post("/v1/runs/r/nodes/join",
                R"({"node": ")" + node + R"(", "secret": "0123456789abcdef0123456789abcdef)" +
                    node + R"(", "addr": "10.0.0.1", "nproc": 2, "master_port": 29500,
                    "min_nodes": 2, "max_nodes": 2, "settle_ms": 0, "node_timeout_ms": 5000})");
  };
  auto a = reply::assignment(join("a"), "join a");
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(a->state, NodeState::kWaiting);
  auto b = reply::assignment(join("b"), "join b");
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ(b->state, NodeState::kRunning);
  EXPECT_EQ(b->world_size, 4u);
  EXPECT_EQ(b->nnodes, 2u);
  EXPECT_EQ(b->master_addr, "10.0.0.1");
  EXPECT_EQ(b->group, "rdzv-r" + std::to_string(b->round));
  auto failed = reply::assignment(
      post("/v1/runs/r/nodes/fail",
           R"({"node": "b", "secret": "0123456789abcdef0123456789abcdefb", "round": )" +
               std::to_string(b->round) + R"(, "why": "rank 3 exited with 1"})"),
      "fail b");
  ASSERT_TRUE(failed) << failed.error().message;
  EXPECT_EQ(failed->state, NodeState::kRestart);
  EXPECT_NE(failed->why.find("rank 3 exited with 1"), std::string::npos) << failed->why;
}

}  // namespace
}  // namespace traincoord::client
