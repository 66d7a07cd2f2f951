#include "core/rendezvous.h"

#include <gtest/gtest.h>

namespace traincoord {
namespace {

NodeJoin node(const std::string& name, uint32_t min, uint32_t max, uint32_t nproc = 2) {
  NodeJoin j;
  j.node = name;
  j.addr = "10.0.0." + name.substr(name.size() - 1);
  j.nproc = nproc;
  j.master_port = 29500;
  j.min_nodes = min;
  j.max_nodes = max;
  j.settle_ms = 1000;
  j.node_timeout_ms = 5000;
  return j;
}

TEST(Rendezvous, FormsWhenMaxNodesJoinedAndNumbersTheRanks) {
  Rendezvous r;
  auto a = r.join(node("n1", 1, 2), 0);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->state, NodeState::kWaiting);  // 1 of max 2, settle not over
  auto b = r.join(node("n2", 1, 2, 3), 10);
  ASSERT_TRUE(b);
  ASSERT_EQ(b->state, NodeState::kRunning);
  EXPECT_EQ(b->node_rank, 1u);
  EXPECT_EQ(b->rank_offset, 2u);
  EXPECT_EQ(b->world_size, 5u);
  EXPECT_EQ(b->master_addr, "10.0.0.1");
  EXPECT_EQ(b->master_port, 29500);
  auto first = r.poll("n1", 20);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->state, NodeState::kRunning);
  EXPECT_EQ(first->node_rank, 0u);
  EXPECT_EQ(first->round, 1u);
  EXPECT_EQ(first->restart_count, 0u);
}

TEST(Rendezvous, FormsWithMinNodesOnceTheSettleTimePassed) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 3), 0));
  EXPECT_EQ(r.poll("n1", 999)->state, NodeState::kWaiting);
  auto a = r.poll("n1", 1000);
  EXPECT_EQ(a->state, NodeState::kRunning);
  EXPECT_EQ(a->nnodes, 1u);
  // A node joining a running round waits for the next one.
  auto late = r.join(node("n2", 1, 3), 1100);
  EXPECT_EQ(late->state, NodeState::kWaiting);
  EXPECT_EQ(r.poll("n1", 1200)->state, NodeState::kRunning);
}

TEST(Rendezvous, AFailedRankEndsTheRoundAndTheNextOneTakesTheLateNode) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 2), 0));
  ASSERT_EQ(r.poll("n1", 1000)->state, NodeState::kRunning);
  ASSERT_TRUE(r.join(node("n2", 1, 2), 1100));  // waits for the next round
  ASSERT_TRUE(r.fail("n1", 1, "rank 0 exited with 1", 1200));
  auto n1 = r.poll("n1", 1300);
  EXPECT_EQ(n1->state, NodeState::kRestart);
  EXPECT_NE(n1->why.find("rank 0 exited with 1"), std::string::npos);
  // n1 joins again: with n2 already in round 2, the round is full at once.
  auto again = r.join(node("n1", 1, 2), 1400);
  ASSERT_EQ(again->state, NodeState::kRunning);
  EXPECT_EQ(again->round, 2u);
  EXPECT_EQ(again->restart_count, 1u);
  EXPECT_EQ(again->nnodes, 2u);
  EXPECT_EQ(again->node_rank, 0u);  // node ranks follow the order the nodes first joined
  EXPECT_EQ(r.poll("n2", 1500)->node_rank, 1u);
  // A failure reported for an old round changes nothing.
  ASSERT_TRUE(r.fail("n1", 1, "late", 1600));
  EXPECT_EQ(r.poll("n1", 1700)->state, NodeState::kRunning);
}

TEST(Rendezvous, ALostNodeEndsTheRoundAndTheRestGoOnWithoutIt) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 2), 0));
  ASSERT_TRUE(r.join(node("n2", 1, 2), 0));
  ASSERT_EQ(r.poll("n1", 100)->state, NodeState::kRunning);
  // n2 falls silent; n1 keeps polling.
  for (TimeMs t = 1000; t <= 5000; t += 1000) ASSERT_EQ(r.poll("n1", t)->state, NodeState::kRunning);
  auto lost = r.poll("n1", 5200);
  EXPECT_EQ(lost->state, NodeState::kRestart);
  EXPECT_NE(lost->why.find("node n2 lost"), std::string::npos) << lost->why;
  auto again = r.join(node("n1", 1, 2), 5300);
  EXPECT_EQ(again->state, NodeState::kWaiting);
  auto alone = r.poll("n1", 6300);  // min 1: forms alone after the settle time
  EXPECT_EQ(alone->state, NodeState::kRunning);
  EXPECT_EQ(alone->nnodes, 1u);
  EXPECT_EQ(alone->world_size, 2u);
  EXPECT_FALSE(r.poll("n2", 6400));  // n2 must join again
}

TEST(Rendezvous, AnAgentThatRestartsEndsItsRound) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 1), 0));
  ASSERT_EQ(r.poll("n1", 1)->state, NodeState::kRunning);
  auto again = r.join(node("n1", 1, 1), 2);
  EXPECT_EQ(again->state, NodeState::kRunning);
  EXPECT_EQ(again->round, 2u);
  EXPECT_NE(r.last_end().find("joined again"), std::string::npos);
}

TEST(Rendezvous, RefusesAgentsThatDisagreeOrBadNumbers) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 2), 0));
  auto other = r.join(node("n2", 2, 2), 0);
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code, ErrorCode::kConflict);
  NodeJoin bad = node("n3", 3, 2);
  EXPECT_EQ(r.join(bad, 0).error().field, "nnodes");
  bad = node("n3", 1, 2, 0);
  EXPECT_EQ(r.join(bad, 0).error().field, "nproc");
  EXPECT_FALSE(r.poll("nobody", 0));
}

TEST(Rendezvous, ANodeThatLeavesDoesNotEndTheRound) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 2, 2), 0));
  ASSERT_TRUE(r.join(node("n2", 2, 2), 0));
  ASSERT_TRUE(r.leave("n1", 10));
  auto n2 = r.poll("n2", 20);
  EXPECT_EQ(n2->state, NodeState::kRunning);
  EXPECT_EQ(n2->round, 1u);
}

}  // namespace
}  // namespace traincoord
