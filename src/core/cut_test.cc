// Checkpoint cuts, restores and groups in the core: what a cut keeps, what a restore undoes, and
// every refusal (docs/SEMANTICS.md, "Checkpoint cuts").
#include <gtest/gtest.h>

#include <vector>

#include "core/run.h"
#include "core/run_codec.h"

namespace traincoord {
namespace {

// One train epoch of 6 batches in jobs of 3 (two jobs), no dev set, in order.
RunConfig two_jobs() {
  RunConfig c;
  c.name = "cuts";
  c.train_batches = 6;
  c.order = BatchOrder::kSequential;
  c.iters_per_worker = 3;
  c.epochs = 1;
  c.validation_every = 0;
  c.lease_timeout_ms = 1000;
  return c;
}

Completion report(double loss, uint64_t samples) { return Completion{loss, samples, {}}; }

template <typename T>
std::string_view reason_of(const Result<T>& r) {
  return r ? std::string_view("ok") : r.error().reason;
}

class CutTest : public ::testing::Test {
 protected:
  Job take(traincoord::Run& run, WorkerId w) {
    auto a = run.acquire(w);
    EXPECT_TRUE(a && a->status == AcquireStatus::kJob);
    return a ? a->job : Job{};
  }
  ManualClock clock_;
};

TEST_F(CutTest, APartlyTrainedJobKeepsItsTrainedBatchesAcrossARestore) {
  traincoord::Run run(two_jobs(), clock_);
  ASSERT_EQ(*run.join_group("g1"), GroupState::kCurrent);
  EXPECT_EQ(run.generation(), 1u);
  const WorkerId w = run.join("rank0");
  const Job first = take(run, w);
  const Job second = take(run, w);
  ASSERT_EQ(first.positions.count, 3u);
  ASSERT_TRUE(run.complete(w, second.lease, report(2.0, 30)));
  // The checkpoint: job 0 has 2 of its 3 batches trained, at a mean loss of 1.0 over 20 samples.
  auto share = run.cut(w, "g1", 1, 0, 1, {CutPart{first.lease, 2, report(1.0, 20)}});
  ASSERT_TRUE(share) << share.error().message;
  EXPECT_TRUE(share->complete);
  const Cut* cut = run.find_cut(share->cut);
  ASSERT_NE(cut, nullptr);
  EXPECT_EQ(cut->jobs_done, 1u);
  EXPECT_EQ(cut->partial_jobs, 1u);
  EXPECT_EQ(cut->partial_batches, 2u);
  // The group goes on and finishes the run, then dies before its next checkpoint.
  ASSERT_TRUE(run.complete(w, first.lease, report(9.0, 30)));
  ASSERT_EQ(run.state(), RunState::kCompleted);

  // A new group must restore: it may register, not work.
  ASSERT_EQ(*run.join_group("g2"), GroupState::kRestoreRequired);
  const WorkerId w2 = run.join("rank0-new");
  auto refused = run.admit("g2");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().reason, error_reason::kRestoreRequired);

  auto restored = run.restore("g2", share->cut);
  ASSERT_TRUE(restored) << restored.error().message;
  EXPECT_TRUE(restored->restored);
  EXPECT_EQ(restored->generation, 2u);
  EXPECT_EQ(restored->withdrawn_jobs, 1u);  // job 0, completed after the cut
  EXPECT_EQ(run.state(), RunState::kRunning);
  EXPECT_TRUE(run.admit("g2"));
  auto stale = run.admit("g1");
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().reason, error_reason::kStaleGeneration);

  // Only job 0's last batch is handed out again.
  const Job rest = take(run, w2);
  EXPECT_EQ(rest.index, first.index);
  EXPECT_EQ(rest.positions.first, first.positions.first + 2);
  EXPECT_EQ(rest.positions.count, 1u);
  std::vector<uint64_t> batches;
  run.batches_of(rest, &batches);
  EXPECT_EQ(batches, std::vector<uint64_t>{2});
  ASSERT_TRUE(run.complete(w2, rest.lease, report(4.0, 10)));
  ASSERT_EQ(run.state(), RunState::kCompleted);
  // The epoch's loss is that of the final lineage: (2*30 + 1*20 + 4*10) / 60; the 9.0 of the
  // withdrawn completion is gone.
  EXPECT_DOUBLE_EQ(run.epochs()[0].loss, 2.0);
  EXPECT_EQ(run.epochs()[0].samples, 60u);
  EXPECT_EQ(run.epochs()[0].done, 2u);
  EXPECT_EQ(run.counters().restores, 1u);
  EXPECT_EQ(run.counters().jobs_withdrawn, 1u);
}

TEST_F(CutTest, ACutIsCompleteOnceEveryRankGaveItsShare) {
  traincoord::Run run(two_jobs(), clock_);
  ASSERT_TRUE(run.join_group("g"));
  const WorkerId a = run.join("a");
  const WorkerId b = run.join("b");
  const Job ja = take(run, a);
  const Job jb = take(run, b);
  auto first = run.cut(b, "g", 1, 1, 2, {CutPart{jb.lease, 1, report(1, 1)}});
  ASSERT_TRUE(first);
  EXPECT_FALSE(first->complete);
  EXPECT_EQ(run.latest_cut(), nullptr);
  // The same share again changes nothing.
  auto again = run.cut(b, "g", 1, 1, 2, {CutPart{jb.lease, 1, report(1, 1)}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->cut, first->cut);
  EXPECT_FALSE(again->complete);
  // An incomplete cut cannot be restored.
  ASSERT_EQ(*run.join_group("other"), GroupState::kCurrent);  // no complete cut: takes over
  EXPECT_EQ(run.cuts().size(), 0u);  // the pending cut of the group before is dropped
  (void)ja;
}

TEST_F(CutTest, IncompleteCutIsNotRestorable) {
  traincoord::Run run(two_jobs(), clock_);
  ASSERT_TRUE(run.join_group("g"));
  const WorkerId a = run.join("a");
  ASSERT_TRUE(run.cut(a, "g", 1, 0, 1, {}));  // cut 1, complete
  auto pending = run.cut(a, "g", 2, 0, 2, {});
  ASSERT_TRUE(pending);
  ASSERT_FALSE(pending->complete);
  auto r = run.restore("h", pending->cut);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().reason, error_reason::kCutIncomplete);
  auto mismatch = run.cut(a, "g", 2, 1, 3, {});
  ASSERT_FALSE(mismatch);
  EXPECT_EQ(mismatch.error().reason, error_reason::kCutMismatch);
}

TEST_F(CutTest, EveryRefusalNamesItsCause) {
  traincoord::Run run(two_jobs(), clock_);
  ASSERT_TRUE(run.join_group("g"));
  const WorkerId a = run.join("a");
  const WorkerId b = run.join("b");
  const Job ja = take(run, a);
  const Job jb = take(run, b);
  auto code_of = [](const auto& r) { return r ? ErrorCode::kInvalidArgument : r.error().code; };

  // Another worker's lease.
  EXPECT_EQ(reason_of(run.cut(a, "g", 1, 0, 1, {CutPart{jb.lease, 1, report(1, 1)}})),
            error_reason::kLeaseNotYours);
  // A lease never issued.
  EXPECT_EQ(reason_of(run.cut(a, "g", 1, 0, 1, {CutPart{99, 1, report(1, 1)}})),
            error_reason::kLeaseUnknown);
  // A worker never registered.
  EXPECT_EQ(reason_of(run.cut(7, "g", 1, 0, 1, {})), error_reason::kWorkerNotRegistered);
  // Batches: none, or the whole job (that is a completion).
  auto none = run.cut(a, "g", 1, 0, 1, {CutPart{ja.lease, 0, report(1, 1)}});
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().field, "parts");
  auto whole = run.cut(a, "g", 1, 0, 1, {CutPart{ja.lease, 3, report(1, 1)}});
  ASSERT_FALSE(whole);
  EXPECT_EQ(whole.error().field, "parts");
  // The same lease twice.
  auto twice = run.cut(a, "g", 1, 0, 1,
                       {CutPart{ja.lease, 1, report(1, 1)}, CutPart{ja.lease, 1, report(1, 1)}});
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().field, "parts");
  // Rank, world size, seq, group.
  EXPECT_EQ(code_of(run.cut(a, "g", 1, 2, 2, {})), ErrorCode::kInvalidArgument);
  EXPECT_EQ(run.cut(a, "g", 1, 2, 2, {}).error().field, "rank");
  EXPECT_EQ(run.cut(a, "g", 1, 0, 0, {}).error().field, "world_size");
  EXPECT_EQ(run.cut(a, "g", 0, 0, 1, {}).error().field, "seq");
  EXPECT_EQ(run.cut(a, "", 1, 0, 1, {}).error().field, "group");
  // A lease the worker held but gave back: not held any more.
  ASSERT_TRUE(run.release(a, {ja.lease}));
  EXPECT_EQ(reason_of(run.cut(a, "g", 1, 0, 1, {CutPart{ja.lease, 1, report(1, 1)}})),
            error_reason::kLeaseNotHeld);
  // Nothing refused left a cut behind.
  EXPECT_TRUE(run.cuts().empty());

  // Restores: an unknown cut, the current group restoring, a stale group, a cancelled run.
  ASSERT_TRUE(run.cut(b, "g", 1, 0, 1, {}));
  EXPECT_EQ(reason_of(run.restore("h", 42)), error_reason::kCutNotFound);
  EXPECT_EQ(reason_of(run.restore("g", 1)), error_reason::kRestoreConflict);
  EXPECT_EQ(run.restore("", 1).error().field, "group");
  ASSERT_TRUE(run.restore("h", 1));
  EXPECT_FALSE(run.restore("h", 1)->restored);  // the same target again: nothing to do
  EXPECT_EQ(reason_of(run.restore("h", std::nullopt)), error_reason::kRestoreConflict);
  EXPECT_EQ(reason_of(run.restore("g", 1)), error_reason::kStaleGeneration);
  EXPECT_EQ(reason_of(run.join_group("g")), error_reason::kStaleGeneration);
  EXPECT_EQ(reason_of(run.cut(b, "g", 2, 0, 1, {})), error_reason::kStaleGeneration);
  run.cancel("by hand");
  EXPECT_EQ(reason_of(run.restore("i", 1)), error_reason::kRunCancelled);
}

TEST_F(CutTest, ANewGroupWithoutCutsTakesOverAndVoidsTheLeasesOfTheGroupBefore) {
  traincoord::Run run(two_jobs(), clock_);
  ASSERT_TRUE(run.join_group("g1"));
  const WorkerId w = run.join("rank0");
  const Job held = take(run, w);
  ASSERT_EQ(*run.join_group("g2"), GroupState::kCurrent);
  EXPECT_EQ(run.generation(), 2u);
  EXPECT_EQ(run.counters().leases_voided, 1u);
  EXPECT_FALSE(run.admit("g1"));
  // The voided lease's late completion (had it got through) is not counted, and the job is
  // open again for the new group.
  auto late = run.complete(w, held.lease, report(1, 1));
  ASSERT_TRUE(late);
  EXPECT_EQ(late->outcome, CompletionOutcome::kGivenUp);
  const Job again = take(run, w);
  EXPECT_EQ(again.index, held.index);
  EXPECT_EQ(again.attempt, 2u);
}

// A checkpoint of a cut this ledger never had (the coordinator kept the run in memory and was
// started again): the group took the run over without a restore, then restores that cut. The
// answer says the cut is missing and why, not that the group is already current (issue 33).
TEST_F(CutTest, RestoringACutTheLedgerNeverHadSaysSoNotThatTheGroupIsCurrent) {
  traincoord::Run run(two_jobs(), clock_);
  ASSERT_EQ(*run.join_group("g"), GroupState::kCurrent);  // no cut: it takes the run over
  auto missing = run.restore("g", 3);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().reason, error_reason::kCutNotFound);
  EXPECT_NE(missing.error().message.find("has no cut 3"), std::string::npos)
      << missing.error().message;
  EXPECT_NE(missing.error().message.find("another ledger"), std::string::npos)
      << missing.error().message;
  EXPECT_EQ(reason_of(run.restore("g", std::nullopt)), error_reason::kRestoreConflict);
}

TEST_F(CutTest, UngroupedWorkersAreNeverFencedNorVoidedByTheFirstGroup) {
  traincoord::Run run(two_jobs(), clock_);
  const WorkerId solo = run.join("solo");
  const Job held = take(run, solo);
  EXPECT_TRUE(run.admit(""));
  ASSERT_EQ(*run.join_group("g1"), GroupState::kCurrent);  // the first group: nothing to void
  EXPECT_EQ(run.counters().leases_voided, 0u);
  auto done = run.complete(solo, held.lease, report(1, 1));
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->counted());
}

TEST_F(CutTest, ARestoreUndoesEpochsAndEarlyStopTakenAfterTheCut) {
  RunConfig c;
  c.name = "es";
  c.train_batches = 1;
  c.dev_batches = 1;
  c.epochs = 5;
  c.validation_every = 1;
  c.early_stop.kind = EarlyStopKind::kPatience;
  c.early_stop.patience.patience = 1;
  traincoord::Run run(c, clock_);
  ASSERT_TRUE(run.join_group("g1"));
  const WorkerId w = run.join("w");
  auto train_and_validate = [&](double dev_loss) {
    ASSERT_TRUE(run.complete(w, take(run, w).lease, report(1, 1)));
    ASSERT_TRUE(run.complete(w, take(run, w).lease, report(dev_loss, 1)));
  };
  train_and_validate(1.0);  // epoch 0
  ASSERT_TRUE(run.cut(w, "g1", 1, 0, 1, {}));
  const EarlyStopState at_cut = run.early_stop().state();
  const size_t epochs_at_cut = run.epochs().size();
  train_and_validate(2.0);  // epoch 1: worse, patience 1 stops the run
  ASSERT_EQ(run.state(), RunState::kEarlyStopped);

  ASSERT_EQ(*run.join_group("g2"), GroupState::kRestoreRequired);
  auto restored = run.restore("g2", 1);
  ASSERT_TRUE(restored);
  EXPECT_EQ(restored->withdrawn_jobs, 2u);
  EXPECT_EQ(run.state(), RunState::kRunning);
  EXPECT_EQ(run.epochs().size(), epochs_at_cut);
  EXPECT_EQ(run.early_stop().state().observed.size(), at_cut.observed.size());
  EXPECT_FALSE(run.early_stop().state().stopped);
  // Epoch 1 is trained again from its start, and with a better dev loss the run goes on.
  const Job j = take(run, w);
  EXPECT_EQ(j.epoch, 1);
  EXPECT_EQ(j.set, SetKind::kTrain);
  ASSERT_TRUE(run.complete(w, j.lease, report(1, 1)));
  ASSERT_TRUE(run.complete(w, take(run, w).lease, report(0.5, 1)));
  EXPECT_EQ(run.state(), RunState::kRunning);
  EXPECT_EQ(run.early_stop().state().best_epoch, 1);
}

TEST_F(CutTest, KeepsTheLatestCutsAndAnOlderOneCanStillBeRestored) {
  RunConfig c = two_jobs();
  c.keep_cuts = 2;
  traincoord::Run run(c, clock_);
  ASSERT_TRUE(run.join_group("g"));
  const WorkerId w = run.join("w");
  for (uint64_t seq = 1; seq <= 3; ++seq) ASSERT_TRUE(run.cut(w, "g", seq, 0, 1, {}));
  ASSERT_EQ(run.cuts().size(), 2u);
  EXPECT_EQ(run.cuts().front().id, 2u);
  EXPECT_EQ(run.find_cut(1), nullptr);
  auto dropped = run.restore("h", 1);
  ASSERT_FALSE(dropped);
  EXPECT_EQ(dropped.error().reason, error_reason::kCutNotFound);
  EXPECT_NE(dropped.error().message.find("2, 3"), std::string::npos) << dropped.error().message;
  auto older = run.restore("h", 2);  // not the latest
  ASSERT_TRUE(older) << older.error().message;
  EXPECT_EQ(older->cut, 2u);
}

TEST_F(CutTest, CutsAndGroupsSurviveASnapshot) {
  traincoord::Run run(two_jobs(), clock_);
  ASSERT_TRUE(run.join_group("g1"));
  const WorkerId w = run.join("w");
  const Job first = take(run, w);
  ASSERT_TRUE(run.cut(w, "g1", 1, 0, 1, {CutPart{first.lease, 1, report(3, 10)}}));
  ASSERT_TRUE(run.cut(w, "g1", 2, 0, 2, {CutPart{first.lease, 2, report(3, 10)}}));  // pending
  ASSERT_TRUE(run.join_group("g2"));
  ASSERT_TRUE(run.restore("g2", 1));
  const std::string bytes = RunCodec::save(run);
  auto loaded = RunCodec::load(two_jobs(), bytes, clock_);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(RunCodec::save(**loaded), bytes);
  traincoord::Run& back = **loaded;
  EXPECT_EQ(back.generation(), 2u);
  EXPECT_EQ(back.group(), "g2");
  EXPECT_FALSE(back.admit("g1"));
  ASSERT_NE(back.latest_cut(), nullptr);
  EXPECT_EQ(back.latest_cut()->id, 1u);
  // The partly trained job is handed out with its remaining batches, as before the snapshot.
  auto a = back.acquire(w);
  ASSERT_TRUE(a && a->status == AcquireStatus::kJob);
  EXPECT_EQ(a->job.index, first.index);
  EXPECT_EQ(a->job.positions.count, 2u);
  // A snapshot missing its end is refused, not half read.
  EXPECT_FALSE(RunCodec::load(two_jobs(), bytes.substr(0, bytes.size() - 3), clock_));
}

TEST_F(CutTest, AWorkerIsFencedByTheGroupItRegisteredWithWhateverItsRequestsName) {
  traincoord::Run run(two_jobs(), clock_);
  ASSERT_TRUE(run.join_group("g1"));
  const WorkerId old = run.join("rank0", "g1");
  const WorkerId solo = run.join("solo");  // ungrouped
  const Job held = take(run, old);
  ASSERT_TRUE(run.cut(old, "g1", 1, 0, 1, {}));
  EXPECT_TRUE(run.admit(old, ""));
  EXPECT_TRUE(run.admit(old, "g1"));

  ASSERT_EQ(*run.join_group("g2"), GroupState::kRestoreRequired);
  const WorkerId fresh = run.join("rank0-b", "g2");
  EXPECT_EQ(reason_of(run.admit(fresh, "")), error_reason::kRestoreRequired);
  ASSERT_TRUE(run.restore("g2", 1));

  // The old group's worker, naming no group or the group that replaced its own: stale.
  EXPECT_EQ(reason_of(run.admit(old, "")), error_reason::kStaleGeneration);
  EXPECT_EQ(reason_of(run.admit(old, "g2")), error_reason::kStaleGeneration);
  EXPECT_EQ(reason_of(run.cut(old, "g2", 1, 0, 1, {CutPart{held.lease, 1, report(1, 1)}})),
            error_reason::kStaleGeneration);
  EXPECT_TRUE(run.cuts().size() == 1 && run.cuts().front().id == 1u);  // no share was taken
  // The new group's worker: its own group or none; another group is a mismatch.
  EXPECT_TRUE(run.admit(fresh, ""));
  EXPECT_TRUE(run.admit(fresh, "g2"));
  EXPECT_EQ(reason_of(run.admit(fresh, "g3")), error_reason::kGroupMismatch);
  EXPECT_EQ(reason_of(run.admit(fresh, "g1")), error_reason::kStaleGeneration);
  // An ungrouped worker is judged by what its request names, as before.
  EXPECT_TRUE(run.admit(solo, ""));
  EXPECT_TRUE(run.admit(solo, "g2"));
  EXPECT_EQ(reason_of(run.admit(solo, "g1")), error_reason::kStaleGeneration);
  // Registering again under the new group makes the name the new group's.
  EXPECT_EQ(run.join("rank0", "g2"), old);
  EXPECT_TRUE(run.admit(old, ""));
}

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

TEST_F(CutTest, AWorkersGroupSurvivesASnapshotAndAnOlderSnapshotReadsItsWorkersUngrouped) {
  traincoord::Run run(two_jobs(), clock_);
  ASSERT_TRUE(run.join_group("g1"));
  const WorkerId w = run.join("w", "g1");
  ASSERT_TRUE(run.cut(w, "g1", 1, 0, 1, {}));
  ASSERT_TRUE(run.join_group("g2"));
  ASSERT_TRUE(run.restore("g2", 1));
  const std::string bytes = RunCodec::save(run);
  auto loaded = RunCodec::load(two_jobs(), bytes, clock_);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ((*loaded)->workers()[w].group, "g1");
  EXPECT_EQ(reason_of((*loaded)->admit(w, "")), error_reason::kStaleGeneration);
  // The same snapshot as format 6 wrote it: no worker groups at its end (nor format 8's).
  const std::string tail = format8_tail(run);
  ASSERT_EQ(bytes.substr(bytes.size() - tail.size()), tail);
  std::string v6 = bytes.substr(0, bytes.size() - tail.size() - 3);  // group: length 2, "g1"
  ASSERT_EQ(static_cast<uint8_t>(v6[5]), 11u);                       // (after the 5-byte magic)
  v6[5] = 6;
  auto old = RunCodec::load(two_jobs(), v6, clock_);
  ASSERT_TRUE(old) << old.error().message;
  EXPECT_EQ((*old)->workers()[w].group, "");
  EXPECT_TRUE((*old)->admit(w, ""));  // ungrouped, as it was then
  EXPECT_EQ(reason_of((*old)->admit(w, "g1")), error_reason::kStaleGeneration);
}

}  // namespace
}  // namespace traincoord
