// The C++ client's rendezvous calls (client/rendezvous.h) against the real binary: two nodes join
// a run's rendezvous and are given the layout of one round, typed as the core's assignment; a
// rank's failure ends the round for both; a node that leaves after its ranks finished is gone
// without ending the round; the coordinator's refusals arrive with their codes.
#include "client/rendezvous.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "server_process.h"

namespace traincoord {
namespace {

using std::chrono::milliseconds;
using testing::ServerProcess;
using testing::TempDir;

constexpr const char* kRun = R"(
name = "rdzv"
[data]
train_batches = 4
dev_batches = 2
[schedule]
epochs = 1
)";

const std::string kSecretA = "a-secret-of-node-a-0123456789";
const std::string kSecretB = "b-secret-of-node-b-0123456789";
constexpr milliseconds kTimeout{5'000};

NodeJoin node(const std::string& name, const std::string& secret, uint16_t master_port) {
  NodeJoin join;
  join.node = name;
  join.secret = secret;
  join.addr = "127.0.0.1";
  join.nproc = 2;
  join.master_port = master_port;
  join.min_nodes = 2;
  join.max_nodes = 2;
  join.settle_ms = 0;
  join.node_timeout_ms = 60'000;  // (no node is lost while the test runs)
  return join;
}

class RendezvousE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = ServerProcess::start({"--config", dir_.write("rdzv.toml", kRun), "--in-memory"});
    ASSERT_NE(server_, nullptr);
    rdzv_.emplace(server_->url(), "rdzv", "");
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;  // killed by its pid when the test ends
  std::optional<client::Rendezvous> rdzv_;
};

TEST_F(RendezvousE2E, TwoNodesFormARoundThatAFailureEnds) {
  auto a = rdzv_->join(node("a", kSecretA, 29500), kTimeout);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(a->state, NodeState::kWaiting);
  EXPECT_EQ(a->run_state, RunState::kRunning);
  auto b = rdzv_->join(node("b", kSecretB, 29501), kTimeout);
  ASSERT_TRUE(b) << b.error().message;
  ASSERT_EQ(b->state, NodeState::kRunning);
  auto polled = rdzv_->poll("a", kSecretA, kTimeout);
  ASSERT_TRUE(polled) << polled.error().message;
  ASSERT_EQ(polled->state, NodeState::kRunning);
  // One layout: node ranks 0 and 1 of 2, four ranks, node rank 0's address and port as master.
  EXPECT_EQ(polled->round, b->round);
  EXPECT_EQ(polled->group, b->group);
  EXPECT_EQ(polled->nnodes, 2u);
  EXPECT_EQ(b->world_size, 4u);
  EXPECT_EQ(polled->node_rank + b->node_rank, 1u);
  EXPECT_EQ(polled->rank_offset + b->rank_offset, 2u);
  EXPECT_EQ(polled->master_addr, "127.0.0.1");
  EXPECT_EQ(polled->master_port, b->master_port);
  EXPECT_EQ(polled->master_port, polled->node_rank == 0 ? 29500 : 29501);

  auto failed = rdzv_->fail("b", kSecretB, b->round, "rank 3 exited with 1", kTimeout);
  ASSERT_TRUE(failed) << failed.error().message;
  EXPECT_EQ(failed->state, NodeState::kRestart);
  auto told = rdzv_->poll("a", kSecretA, kTimeout);
  ASSERT_TRUE(told) << told.error().message;
  EXPECT_EQ(told->state, NodeState::kRestart);
  EXPECT_NE(told->why.find("rank 3 exited with 1"), std::string::npos) << told->why;
}

TEST_F(RendezvousE2E, ANodeThatLeavesIsGoneAndRefusalsCarryTheirCodes) {
  ASSERT_TRUE(rdzv_->join(node("a", kSecretA, 29500), kTimeout));
  auto b = rdzv_->join(node("b", kSecretB, 29501), kTimeout);
  ASSERT_TRUE(b && b->state == NodeState::kRunning);
  // Another agent under a's name, with another secret: refused with the code.
  auto thief = rdzv_->join(node("a", kSecretB, 29502), kTimeout);
  ASSERT_FALSE(thief);
  EXPECT_EQ(thief.error().http_status, 409);
  EXPECT_EQ(thief.error().code, client::codes::kNodeSecretMismatch);
  // Other settings than the nodes present: refused, naming the setting.
  NodeJoin other = node("c", "c-secret-of-node-c-0123456789", 29503);
  other.max_nodes = 3;
  auto conflict = rdzv_->join(other, kTimeout);
  ASSERT_FALSE(conflict);
  EXPECT_EQ(conflict.error().code, client::codes::kRendezvousSettingsConflict);

  // b's ranks finished: it leaves, without ending the round a still runs in.
  ASSERT_TRUE(rdzv_->leave("b", kSecretB, kTimeout));
  auto a = rdzv_->poll("a", kSecretA, kTimeout);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(a->state, NodeState::kRunning);
  auto gone = rdzv_->poll("b", kSecretB, kTimeout);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().http_status, 404);
}

TEST(RendezvousE2EUnreachable, ACoordinatorThatIsNotThereIsAnErrorNotAnAssignment) {
  const client::Rendezvous nowhere("http://127.0.0.1:9", "rdzv", "");
  auto polled = nowhere.poll("a", kSecretA, milliseconds(2'000));
  ASSERT_FALSE(polled);
  EXPECT_EQ(polled.error().http_status, 0);
  EXPECT_EQ(polled.error().code, client::codes::kUnreachable);
}

}  // namespace
}  // namespace traincoord
