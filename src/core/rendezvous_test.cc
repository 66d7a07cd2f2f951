#include "core/rendezvous.h"

#include <gtest/gtest.h>

#include "core/clock.h"
#include "core/run.h"
#include "core/run_codec.h"

namespace traincoord {
namespace {

// Each node's agent draws its own secret.
std::string secret_of(const std::string& name) { return "secret-of-" + name + "-0123456789"; }

NodeJoin node(const std::string& name, uint32_t min, uint32_t max, uint32_t nproc = 2) {
  NodeJoin j;
  j.node = name;
  j.addr = "10.0.0." + name.substr(name.size() - 1);
  j.secret = secret_of(name);
  j.nproc = nproc;
  j.master_port = 29500;
  j.min_nodes = min;
  j.max_nodes = max;
  j.settle_ms = 1000;
  j.node_timeout_ms = 5000;
  return j;
}

// What refused `r` (a test that expects a refusal must not crash when it is accepted).
template <typename T>
std::string reason_of(const Result<T>& r) {
  return r ? "(accepted)" : std::string(r.error().reason);
}
template <typename T>
std::string field_of(const Result<T>& r) {
  return r ? "(accepted)" : r.error().field;
}

Result<NodeAssignment> poll(Rendezvous& r, const std::string& name, TimeMs now) {
  return r.poll(name, secret_of(name), now);
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
  auto first = poll(r, "n1", 20);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->state, NodeState::kRunning);
  EXPECT_EQ(first->node_rank, 0u);
  EXPECT_EQ(first->round, 1u);
  EXPECT_EQ(first->restart_count, 0u);
}

TEST(Rendezvous, FormsWithMinNodesOnceTheSettleTimePassed) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 3), 0));
  EXPECT_EQ(poll(r, "n1", 999)->state, NodeState::kWaiting);
  auto a = poll(r, "n1", 1000);
  EXPECT_EQ(a->state, NodeState::kRunning);
  EXPECT_EQ(a->nnodes, 1u);
  // A node joining a running round waits for the next one.
  auto late = r.join(node("n2", 1, 3), 1100);
  EXPECT_EQ(late->state, NodeState::kWaiting);
  EXPECT_EQ(poll(r, "n1", 1200)->state, NodeState::kRunning);
}

TEST(Rendezvous, AFailedRankEndsTheRoundAndTheNextOneTakesTheLateNode) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 2), 0));
  ASSERT_EQ(poll(r, "n1", 1000)->state, NodeState::kRunning);
  ASSERT_TRUE(r.join(node("n2", 1, 2), 1100));  // waits for the next round
  ASSERT_TRUE(r.fail("n1", secret_of("n1"), 1, "rank 0 exited with 1", 1200));
  auto n1 = poll(r, "n1", 1300);
  EXPECT_EQ(n1->state, NodeState::kRestart);
  EXPECT_NE(n1->why.find("rank 0 exited with 1"), std::string::npos);
  // n1 joins again: with n2 already in round 2, the round is full at once.
  auto again = r.join(node("n1", 1, 2), 1400);
  ASSERT_EQ(again->state, NodeState::kRunning);
  EXPECT_EQ(again->round, 2u);
  EXPECT_EQ(again->restart_count, 1u);
  EXPECT_EQ(again->nnodes, 2u);
  EXPECT_EQ(again->node_rank, 0u);  // node ranks follow the order the nodes first joined
  EXPECT_EQ(poll(r, "n2", 1500)->node_rank, 1u);
  // A failure reported for an old round changes nothing.
  ASSERT_TRUE(r.fail("n1", secret_of("n1"), 1, "late", 1600));
  EXPECT_EQ(poll(r, "n1", 1700)->state, NodeState::kRunning);
}

TEST(Rendezvous, ALostNodeEndsTheRoundAndTheRestGoOnWithoutIt) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 2), 0));
  ASSERT_TRUE(r.join(node("n2", 1, 2), 0));
  ASSERT_EQ(poll(r, "n1", 100)->state, NodeState::kRunning);
  // n2 falls silent; n1 keeps polling.
  for (TimeMs t = 1000; t <= 5000; t += 1000)
    ASSERT_EQ(poll(r, "n1", t)->state, NodeState::kRunning);
  auto lost = poll(r, "n1", 5200);
  EXPECT_EQ(lost->state, NodeState::kRestart);
  EXPECT_NE(lost->why.find("node n2 lost"), std::string::npos) << lost->why;
  auto again = r.join(node("n1", 1, 2), 5300);
  EXPECT_EQ(again->state, NodeState::kWaiting);
  auto alone = poll(r, "n1", 6300);  // min 1: forms alone after the settle time
  EXPECT_EQ(alone->state, NodeState::kRunning);
  EXPECT_EQ(alone->nnodes, 1u);
  EXPECT_EQ(alone->world_size, 2u);
  EXPECT_FALSE(poll(r, "n2", 6400));  // n2 must join again
}

TEST(Rendezvous, AnAgentThatRestartsEndsItsRound) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 1), 0));
  ASSERT_EQ(poll(r, "n1", 1)->state, NodeState::kRunning);
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
  EXPECT_EQ(other.error().reason, error_reason::kRendezvousSettingsConflict);
  NodeJoin bad = node("n3", 3, 2);
  EXPECT_EQ(field_of(r.join(bad, 0)), "nnodes");
  bad = node("n3", 1, 2, 0);
  EXPECT_EQ(field_of(r.join(bad, 0)), "nproc");
  EXPECT_FALSE(poll(r, "nobody", 0));
}

TEST(Rendezvous, ANodeThatLeavesDoesNotEndTheRound) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 2, 2), 0));
  ASSERT_TRUE(r.join(node("n2", 2, 2), 0));
  ASSERT_TRUE(r.leave("n1", secret_of("n1"), 10));
  auto n2 = poll(r, "n2", 20);
  EXPECT_EQ(n2->state, NodeState::kRunning);
  EXPECT_EQ(n2->round, 1u);
}

// ---- Item 10: the settings that bind the whole round agree across the nodes. ----

TEST(Rendezvous, ANodeTimeoutThatDiffersFromTheOthersIsRefusedNamingTheField) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 3), 0));
  ASSERT_TRUE(r.join(node("n2", 1, 3), 0));
  ASSERT_EQ(poll(r, "n1", 1000)->state, NodeState::kRunning);
  NodeJoin hasty = node("n3", 1, 3);
  hasty.node_timeout_ms = 1000;  // (within the bounds: only the disagreement is wrong)
  auto refused = r.join(hasty, 1100);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kConflict);
  EXPECT_EQ(refused.error().reason, error_reason::kRendezvousSettingsConflict);
  EXPECT_NE(refused.error().message.find("node_timeout_ms 5000"), std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("node n3 sent 1000"), std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("--node-timeout"), std::string::npos);
  // The members are not dropped 1 s later: their timeout is still their own.
  for (TimeMs t = 2000; t <= 4000; t += 1000) {
    ASSERT_EQ(poll(r, "n1", t)->state, NodeState::kRunning);
    ASSERT_EQ(poll(r, "n2", t)->state, NodeState::kRunning) << t;
  }
  EXPECT_EQ(r.node_timeout_ms(), 5000);
}

TEST(Rendezvous, ASettleTimeThatDiffersIsRefusedToo) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 3), 0));
  NodeJoin other = node("n2", 1, 3);
  other.settle_ms = 60'000;
  auto refused = r.join(other, 10);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().reason, error_reason::kRendezvousSettingsConflict);
  EXPECT_NE(refused.error().message.find("settle_ms 1000"), std::string::npos);
  EXPECT_NE(refused.error().message.find("sent 60000"), std::string::npos);
  EXPECT_EQ(poll(r, "n1", 1000)->state, NodeState::kRunning);  // settled after 1 s, not 60
}

TEST(Rendezvous, NewSettingsOnceEveryNodeLeftOrWasLost) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 1), 0));
  ASSERT_TRUE(r.leave("n1", secret_of("n1"), 10));
  NodeJoin next = node("n2", 1, 2);
  next.node_timeout_ms = 9000;
  ASSERT_TRUE(r.join(next, 20));
  EXPECT_EQ(r.node_timeout_ms(), 9000);
  // n2 lost (silent past its timeout): n3 may bring settings of its own.
  NodeJoin later = node("n3", 2, 2);
  ASSERT_TRUE(r.join(later, 20 + 9001));
  EXPECT_EQ(r.min_nodes(), 2u);
}

TEST(Rendezvous, TimeoutsAndSettleTimesAreBounded) {
  Rendezvous r;
  NodeJoin j = node("n1", 1, 1);
  j.node_timeout_ms = 100;  // every member dropped 0.1 s after it was last heard of
  EXPECT_EQ(field_of(r.join(j, 0)), "node_timeout_ms");
  j.node_timeout_ms = 3'600'000;  // a node locking the settings for an hour
  EXPECT_EQ(field_of(r.join(j, 0)), "node_timeout_ms");
  j = node("n1", 1, 1);
  j.settle_ms = kMaxSettleMs + 1;
  EXPECT_EQ(field_of(r.join(j, 0)), "settle_ms");
  EXPECT_TRUE(r.nodes().empty());  // a refused join changes nothing
}

// ---- Item 11: a member leaving never rewrites the others' assignment. ----

TEST(Rendezvous, AMemberThatLeavesStaysCountedInTheRoundsLayout) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 2, 2, 4), 0));
  ASSERT_TRUE(r.join(node("n2", 2, 2, 4), 0));
  const NodeAssignment before = *poll(r, "n2", 10);
  ASSERT_EQ(before.state, NodeState::kRunning);
  ASSERT_EQ(before.world_size, 8u);
  ASSERT_EQ(before.rank_offset, 4u);
  ASSERT_TRUE(r.leave("n1", secret_of("n1"), 20));  // node rank 0 (the master) finished
  const NodeAssignment after = *poll(r, "n2", 30);
  EXPECT_EQ(after.state, NodeState::kRunning);
  EXPECT_EQ(after.world_size, 8u);
  EXPECT_EQ(after.rank_offset, 4u);
  EXPECT_EQ(after.node_rank, 1u);
  EXPECT_EQ(after.nnodes, 2u);
  EXPECT_EQ(after.master_addr, "10.0.0.1");
  EXPECT_EQ(after.master_port, 29500);
}

TEST(Rendezvous, ANodeUnderTheNameOfAMemberThatLeftWaitsForTheNextRound) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 2, 2), 0));
  ASSERT_TRUE(r.join(node("n2", 2, 2), 0));
  ASSERT_TRUE(r.leave("n1", secret_of("n1"), 10));
  NodeJoin other = node("n1", 2, 2, 8);
  other.secret = "another-agent-secret-000";
  auto joined = r.join(other, 20);
  ASSERT_TRUE(joined);
  EXPECT_EQ(joined->state, NodeState::kWaiting);  // the round runs on, with its layout
  const NodeAssignment n2 = *poll(r, "n2", 30);
  EXPECT_EQ(n2.state, NodeState::kRunning);
  EXPECT_EQ(n2.round, 1u);
  EXPECT_EQ(n2.world_size, 4u);
}

TEST(Rendezvous, WhenEveryMemberLeftTheWaitingNodesFormTheNextRound) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 1), 0));
  ASSERT_EQ(poll(r, "n1", 1)->state, NodeState::kRunning);
  ASSERT_EQ(r.join(node("n2", 1, 1), 2)->state, NodeState::kWaiting);
  ASSERT_TRUE(r.leave("n1", secret_of("n1"), 3));
  const NodeAssignment n2 = *poll(r, "n2", 4);
  EXPECT_EQ(n2.state, NodeState::kRunning);
  EXPECT_EQ(n2.round, 2u);
  EXPECT_EQ(n2.world_size, 2u);
  EXPECT_EQ(n2.master_addr, "10.0.0.2");
}

// ---- Item 12: only a node's own agent speaks for it; the rendezvous is bounded. ----

TEST(Rendezvous, OnlyTheSecretANodeJoinedWithSpeaksForIt) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 2, 2), 0));
  ASSERT_TRUE(r.join(node("n2", 2, 2), 0));
  const std::string wrong = "not-the-secret-of-n2";
  NodeJoin impostor = node("n2", 2, 2);
  impostor.secret = wrong;
  auto join = r.join(impostor, 10);  // would end the round as "n2 joined again"
  ASSERT_FALSE(join);
  EXPECT_EQ(join.error().code, ErrorCode::kConflict);
  EXPECT_EQ(join.error().reason, error_reason::kNodeSecretMismatch);
  EXPECT_EQ(reason_of(r.poll("n2", wrong, 10)), error_reason::kNodeSecretMismatch);
  EXPECT_EQ(reason_of(r.fail("n2", wrong, 1, "x", 10)), error_reason::kNodeSecretMismatch);
  EXPECT_EQ(reason_of(r.leave("n2", wrong, 10)), error_reason::kNodeSecretMismatch);
  // Nothing changed: the round runs, n2 is still there and still the same.
  EXPECT_EQ(r.round(), 1u);
  ASSERT_EQ(r.nodes().size(), 2u);
  const NodeAssignment n2 = *poll(r, "n2", 20);
  EXPECT_EQ(n2.state, NodeState::kRunning);
  EXPECT_EQ(n2.round, 1u);
  EXPECT_EQ(r.nodes()[1].last_seen, 20);
}

TEST(Rendezvous, ALostNodesNameIsFreeForAnotherSecret) {
  Rendezvous r;
  ASSERT_TRUE(r.join(node("n1", 1, 1), 0));
  NodeJoin restarted = node("n1", 1, 1);
  restarted.secret = "a-restarted-agent-secret";
  EXPECT_EQ(reason_of(r.join(restarted, 5000)), error_reason::kNodeSecretMismatch);
  auto joined = r.join(restarted, 5001);  // n1 lost: the name is free
  ASSERT_TRUE(joined) << joined.error().message;
  EXPECT_FALSE(poll(r, "n1", 5002));  // the old secret no longer speaks for it
  EXPECT_TRUE(r.poll("n1", restarted.secret, 5002));
}

TEST(Rendezvous, HoldsTheMembersAndAsManyWaitingAndNoMore) {
  Rendezvous r;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(r.join(node("n" + std::to_string(i), 1, 2), i)) << i;
  }
  auto full = r.join(node("n9", 1, 2), 10);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().reason, error_reason::kRendezvousFull);
  EXPECT_EQ(r.nodes().size(), 4u);
  EXPECT_TRUE(r.join(node("n3", 1, 2), 11));  // a node present may join again
  ASSERT_TRUE(r.leave("n3", secret_of("n3"), 12));
  EXPECT_TRUE(r.join(node("n9", 1, 2), 13));  // room again
}

TEST(Rendezvous, AcceptsAddressesAndHostNamesOnly) {
  for (const char* ok : {"10.0.0.1", "::1", "fe80::1", "node-7", "gpu7.cluster.example.com"}) {
    EXPECT_TRUE(valid_node_addr(ok)) << ok;
  }
  for (const char* bad : {"", "a b", "-node", "node-", "a..b", "10.0.0.300", "http://x", "x/../y",
                          "host:80", "név", "1.2.3.4.5"}) {
    EXPECT_FALSE(valid_node_addr(bad)) << bad;
  }
  EXPECT_FALSE(valid_node_addr(std::string(64, 'a')));
  Rendezvous r;
  NodeJoin j = node("n1", 1, 1);
  j.addr = "evil host";
  EXPECT_EQ(field_of(r.join(j, 0)), "addr");
  j = node("n1", 1, 1);
  j.secret = "short";
  EXPECT_EQ(field_of(r.join(j, 0)), "secret");
  j.secret = std::string(20, 'x') + "\n";
  EXPECT_EQ(field_of(r.join(j, 0)), "secret");
  EXPECT_TRUE(r.nodes().empty());
}

// ---- The snapshot keeps it all (format 6), and reads format 5. ----

RunConfig small_run() {
  RunConfig c;
  c.name = "small";
  c.train_batches = 4;
  c.dev_batches = 2;
  c.order = BatchOrder::kSequential;
  c.epochs = 2;
  c.validation_every = 1;
  c.lease_timeout_ms = 1000;
  return c;
}

TEST(RendezvousSnapshot, KeepsTheSecretsAndTheRoundsLayout) {
  ManualClock clock;
  traincoord::Run run(small_run(), clock);
  Rendezvous& r = run.rendezvous();
  ASSERT_TRUE(r.join(node("n1", 2, 2, 4), 0));
  ASSERT_TRUE(r.join(node("n2", 2, 2, 4), 0));
  ASSERT_TRUE(r.leave("n1", secret_of("n1"), 10));
  const std::string saved = RunCodec::save(run);
  auto loaded = RunCodec::load(small_run(), saved, clock);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(RunCodec::save(**loaded), saved);
  Rendezvous& back = (*loaded)->rendezvous();
  EXPECT_EQ(reason_of(back.poll("n2", "not-the-secret-of-n2", 20)),
            error_reason::kNodeSecretMismatch);
  const NodeAssignment n2 = *poll(back, "n2", 20);
  EXPECT_EQ(n2.world_size, 8u);
  EXPECT_EQ(n2.rank_offset, 4u);
  EXPECT_EQ(n2.master_addr, "10.0.0.1");
}

// Appends `v` as the codec's varint.
// The bytes formats 8 to 11 append to a snapshot of a run of job-mode epochs only: each
// worker's world size and rank (0, 0), the group's world size (0), each epoch's step layout
// (0, 0, no segment), the run's and those of its cuts' (8); each epoch's frozen cost (three
// doubles 0.0, all zero bytes) and speeds (none), and no cost model (9); each worker's samples,
// the run's series and the mode, jobs (10); each epoch not re-planned (0), as layouts (11).
std::string format8_tail(const traincoord::Run& run) {
  size_t epochs = run.epochs().size();
  for (const Cut& cut : run.cuts()) epochs += cut.saved.epochs.size();
  return std::string(2 * run.workers().size() + 1 + 3 * epochs + 25 * epochs + 1, '\0') +
         RunCodec::format10_bytes(run) + '\0' + std::string(epochs, '\0');
}

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void text(std::string& out, const std::string& s) {
  varint(out, s.size());
  out += s;
}

TEST(RendezvousSnapshot, ReadsAFormat5Snapshot) {
  ManualClock clock;
  traincoord::Run run(small_run(), clock);
  std::string bytes = RunCodec::save(run);
  const std::string tail = format8_tail(run);
  ASSERT_EQ(bytes.substr(bytes.size() - tail.size()), tail);
  bytes.resize(bytes.size() - tail.size());
  // An empty rendezvous ends a format 6 snapshot: nodes 0, round 1, formed 0, members 0,
  // master "" and port 0, last_join 0, min 0, max 0, settle 0, timeout 0, last_end "".
  const std::string empty6("\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 12);
  ASSERT_EQ(bytes.substr(bytes.size() - empty6.size()), empty6);
  bytes.resize(bytes.size() - empty6.size());
  ASSERT_EQ(bytes[5], 11);  // (magic: 5 bytes, then the format; no workers: no groups after)
  bytes[5] = 5;
  // Format 5's rendezvous: two nodes of a formed round 1, neither with a secret.
  varint(bytes, 2);
  for (const char* name : {"n1", "n2"}) {
    text(bytes, name);
    text(bytes, std::string("10.0.0.") + name[1]);
    varint(bytes, 3);      // nproc
    varint(bytes, 29500);  // master_port
    varint(bytes, 1);      // round
    varint(bytes, 0);      // last_seen (zigzag 0)
  }
  varint(bytes, 1);  // round
  varint(bytes, 1);  // formed
  varint(bytes, 2);
  text(bytes, "n1");
  text(bytes, "n2");
  varint(bytes, 0);      // last_join
  varint(bytes, 2);      // min
  varint(bytes, 2);      // max
  varint(bytes, 2000);   // settle 1000 (zigzag)
  varint(bytes, 10000);  // timeout 5000 (zigzag)
  text(bytes, "");
  auto loaded = RunCodec::load(small_run(), bytes, clock);
  ASSERT_TRUE(loaded) << loaded.error().message;
  Rendezvous& r = (*loaded)->rendezvous();
  EXPECT_EQ(r.node_timeout_ms(), 5000);
  // Its nodes have no secret: their agents (of before secrets) are still heard.
  const auto n2 = r.poll("n2", "", 10);
  ASSERT_TRUE(n2) << n2.error().message;
  EXPECT_EQ(n2->state, NodeState::kRunning);
  EXPECT_EQ(n2->world_size, 6u);
  EXPECT_EQ(n2->rank_offset, 3u);
  EXPECT_EQ(n2->master_addr, "10.0.0.1");
  // Saved again, in the current format, it reads back the same.
  const std::string again = RunCodec::save(**loaded);
  EXPECT_EQ(again[5], 11);
  auto reloaded = RunCodec::load(small_run(), again, clock);
  ASSERT_TRUE(reloaded) << reloaded.error().message;
  EXPECT_EQ(RunCodec::save(**reloaded), again);
}

TEST(RendezvousSnapshot, RefusesAnInconsistentRendezvous) {
  ManualClock clock;
  traincoord::Run run(small_run(), clock);
  std::string bytes = RunCodec::save(run);
  bytes.resize(bytes.size() - format8_tail(run).size() - 12);  // (the empty rendezvous, as above)
  bytes[5] = 5;
  varint(bytes, 0);  // no nodes
  varint(bytes, 1);  // round 1
  varint(bytes, 1);  // formed, but
  varint(bytes, 0);  // without members
  varint(bytes, 0);  // last_join
  varint(bytes, 1);  // min
  varint(bytes, 1);  // max
  varint(bytes, 0);  // settle
  varint(bytes, 0);  // timeout
  text(bytes, "");
  auto loaded = RunCodec::load(small_run(), bytes, clock);
  ASSERT_FALSE(loaded);
  EXPECT_NE(loaded.error().message.find("formed rendezvous round of 0 members"), std::string::npos)
      << loaded.error().message;
}

}  // namespace
}  // namespace traincoord
