// The cut ledger on its own (core/cut_ledger.h): gathering shares, completing a cut, which cuts
// it keeps, and the paired assertions of what a complete cut promises. The same behaviour as
// Run offers it is in cut_test.cc and cut_simulation_test.cc.
#include "core/cut_ledger.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace traincoord {
namespace {

constexpr uint64_t kBatchesPerJob = 3;

Completion report(double loss, uint64_t samples) { return Completion{loss, samples, {}}; }

// A run's progress at a cut: one open train epoch of 4 jobs of 3 batches; job 0 done, job 1
// under live lease 7, job 2 handed back (queued again), job 3 never handed out.
RunProgress progress_now() {
  RunProgress p;
  Epoch e;
  e.plan = EpochPlan{0, SetKind::kTrain, 0, 4};
  e.set_batches = 12;
  e.done = 1;
  e.leased = 1;
  e.fold_report(report(2.0, 30));
  e.cursor = 3;
  e.active[1] = Epoch::ActiveJob{1, 0, 7, {}};
  e.active[2] = Epoch::ActiveJob{1, 0, 0, {}};
  e.requeue.push_back(2);
  p.epochs.push_back(e);
  p.running = {0};
  p.latest_of_set[0] = 0;
  return p;
}

std::string_view reason_of(const Result<void>& r) { return r ? "ok" : r.error().reason; }

// A ledger with cut 1 of group "g" (one rank) complete, job 1 two batches in.
class CompleteCut : public ::testing::Test {
 protected:
  void SetUp() override {
    Cut& cut = ledger_.add_share("g", 1, 1, 0, 1, {Cut::Share{0, 1, 2, report(1.0, 20)}}, 5);
    ASSERT_EQ(ledger_.complete(cut, progress_now(), 6), 0u);
    cut_ = ledger_.find(1);
    ASSERT_NE(cut_, nullptr);
  }
  CutLedger ledger_{5, kBatchesPerJob};
  const Cut* cut_ = nullptr;
};

TEST(CutLedger, ACutCompletesOnceEveryRankGaveItsShare) {
  CutLedger ledger(5, kBatchesPerJob);
  auto fresh = ledger.check_share("g", 1, 1, 2);
  ASSERT_TRUE(fresh);
  EXPECT_FALSE(*fresh);
  Cut& cut = ledger.add_share("g", 1, 3, 1, 2, {Cut::Share{0, 1, 2, report(1.0, 20)}}, 5);
  EXPECT_EQ(cut.id, 1u);
  EXPECT_EQ(cut.generation, 3u);
  EXPECT_FALSE(cut.complete());
  EXPECT_EQ(ledger.latest(), nullptr);

  // The same rank again: the reply it had, nothing changes.
  auto repeated = ledger.check_share("g", 1, 1, 2);
  ASSERT_TRUE(repeated && *repeated);
  EXPECT_EQ((*repeated)->cut, 1u);
  EXPECT_FALSE((*repeated)->complete);
  EXPECT_EQ((*repeated)->ranks, std::vector<uint32_t>{1});
  // Another world size, or a job that rank 1's share has already: refused.
  auto mismatch = ledger.check_share("g", 1, 0, 3);
  ASSERT_FALSE(mismatch);
  EXPECT_EQ(mismatch.error().reason, error_reason::kCutMismatch);
  EXPECT_EQ(reason_of(ledger.check_part("g", 1, 9, 0, 1)), error_reason::kLeaseNotHeld);
  EXPECT_EQ(reason_of(ledger.check_part("g", 1, 9, 0, 2)), "ok");
  EXPECT_EQ(reason_of(ledger.check_part("g", 2, 9, 0, 1)), "ok");  // another cut

  // Rank 0 gives its share (no job partly trained): the cut is full, and completing it saves
  // the progress.
  ASSERT_TRUE(ledger.check_share("g", 1, 0, 2));
  Cut& full = ledger.add_share("g", 1, 3, 0, 2, {}, 6);
  EXPECT_EQ(&full, &cut);
  EXPECT_EQ(full.ranks, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(ledger.complete(full, progress_now(), 7), 0u);
  ASSERT_TRUE(full.complete());
  EXPECT_EQ(*full.completed_at, 7);
  EXPECT_TRUE(full.shares.empty());
  EXPECT_EQ(full.jobs_done, 1u);
  EXPECT_EQ(full.partial_jobs, 1u);
  EXPECT_EQ(full.partial_batches, 2u);
  const Epoch& e = full.saved.epochs[0];
  // No lease survives: the job in flight is queued again, ahead of the one handed back.
  EXPECT_EQ(e.leased, 0u);
  EXPECT_EQ(e.active.at(1).live, 0u);
  EXPECT_EQ(e.requeue.positions(), (std::vector<uint64_t>{1, 2}));
  // The share's batches are trained, and its report is in the aggregates: (2*30 + 1*20) / 50.
  EXPECT_EQ(e.trained, (std::map<uint64_t, uint64_t>{{1, 2}}));
  EXPECT_EQ(e.finite_jobs, 2u);
  EXPECT_DOUBLE_EQ(e.weighted_loss, 1.6);
  EXPECT_EQ(ledger.latest(), &full);
  EXPECT_EQ(ledger.broken_promise(full), "");
}

TEST(CutLedger, ASharesNonFiniteLossIsCountedAndAJobDoneMeanwhileIsNotPartlyTrained) {
  CutLedger ledger(5, kBatchesPerJob);
  // Job 1's share, and a share of job 0, done whole meanwhile through another lease.
  Cut& cut = ledger.add_share(
      "g", 1, 1, 0, 1, {Cut::Share{0, 1, 1, report(NAN, 3)}, Cut::Share{0, 0, 1, report(1, 1)}}, 5);
  EXPECT_EQ(ledger.complete(cut, progress_now(), 6), 1u);
  EXPECT_EQ(cut.partial_jobs, 1u);
  EXPECT_EQ(cut.saved.epochs[0].nonfinite_jobs, 1u);
  EXPECT_EQ(cut.saved.epochs[0].trained.count(0), 0u);
}

TEST(CutLedger, KeepsTheLatestCompleteCutsAndAtMostSoManyPendingOnes) {
  CutLedger ledger(2, kBatchesPerJob);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    Cut& cut = ledger.add_share("g", seq, 1, 0, 1, {}, 1);
    ledger.complete(cut, progress_now(), 1);
    ledger.keep_latest();
  }
  ASSERT_EQ(ledger.cuts().size(), 2u);
  EXPECT_EQ(ledger.cuts().front().id, 2u);
  auto gone = ledger.check_restorable(1, "r");
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().reason, error_reason::kCutNotFound);
  EXPECT_NE(gone.error().message.find("(it keeps cuts 2, 3)"), std::string::npos);
  for (uint64_t seq = 10; seq < 10 + CutLedger::kPendingKept + 1; ++seq) {
    ledger.add_share("g", seq, 1, 0, 2, {}, 1);  // one rank of two: pending
  }
  size_t pending = 0;
  for (const Cut& c : ledger.cuts()) pending += !c.complete();
  EXPECT_EQ(pending, CutLedger::kPendingKept);
  EXPECT_EQ(ledger.find(4), nullptr);  // the oldest pending one was dropped
  auto pending_one = ledger.check_restorable(20, "r");
  ASSERT_FALSE(pending_one);
  EXPECT_EQ(pending_one.error().reason, error_reason::kCutIncomplete);
  EXPECT_TRUE(ledger.check_restorable(3, "r"));
  EXPECT_EQ(ledger.inconsistency("g", 1), "");
  EXPECT_NE(ledger.inconsistency("h", 1), "");  // pending cuts of a group not current
  ledger.drop_pending();
  EXPECT_EQ(ledger.cuts().size(), 2u);
  EXPECT_EQ(ledger.latest()->id, 3u);
}

TEST_F(CompleteCut, ARestoreDropsTheCutsAfterIt) {
  Cut& second = ledger_.add_share("g", 2, 1, 0, 1, {}, 7);
  ledger_.complete(second, progress_now(), 8);
  ledger_.add_share("g", 3, 1, 0, 2, {}, 9);  // pending
  const Cut& restored = ledger_.restore(1);
  EXPECT_EQ(restored.id, 1u);
  EXPECT_EQ(ledger_.cuts().size(), 1u);
  EXPECT_EQ(ledger_.latest(), &restored);
}

// The promise, broken one way at a time: each is named.
TEST_F(CompleteCut, BrokenPromisesAreNamed) {
  EXPECT_EQ(ledger_.broken_promise(*cut_), "");
  auto broken = [&](auto tamper) {
    Cut c = *cut_;
    tamper(c);
    return ledger_.broken_promise(c);
  };
  EXPECT_NE(broken([](Cut& c) { c.jobs_done = 2; }).find("jobs done"), std::string::npos);
  EXPECT_NE(broken([](Cut& c) { c.partial_batches = 3; }).find("partly trained"),
            std::string::npos);
  EXPECT_NE(broken([](Cut& c) { c.saved.epochs[0].active.at(2).live = 9; }).find("lease"),
            std::string::npos);
  EXPECT_NE(broken([](Cut& c) { c.saved.epochs[0].leased = 1; }).find("lease"), std::string::npos);
  EXPECT_NE(broken([](Cut& c) { c.saved.epochs[0].trained[1] = 3; }).find("trained whole"),
            std::string::npos);
  EXPECT_NE(broken([](Cut& c) {
              c.saved.epochs[0].trained[3] = 1;
              c.saved.epochs[0].finite_jobs = 5;
            }).find("not active"),
            std::string::npos);
  EXPECT_NE(broken([](Cut& c) { c.saved.epochs[0].requeue.pop_back(); }).find("queued"),
            std::string::npos);
  EXPECT_NE(broken([](Cut& c) { c.saved.epochs[0].cursor = 4; }).find("handed out"),
            std::string::npos);
  EXPECT_NE(broken([](Cut& c) { c.saved.epochs[0].finite_jobs = 1; }).find("aggregates"),
            std::string::npos);
  EXPECT_NE(broken([](Cut& c) { c.saved.running.clear(); }).find("running"), std::string::npos);
  EXPECT_NE(broken([](Cut& c) { c.saved.state = RunState::kEarlyStopped; }).find("early"),
            std::string::npos);
  EXPECT_NE(
      broken([](Cut& c) { c.saved.early_stop.observed.emplace_back(0, 1.0); }).find("observed"),
      std::string::npos);
  // A snapshot holding such a cut (as a damaged one would) is inconsistent.
  Cut& tampered = const_cast<Cut&>(*cut_);
  tampered.jobs_done = 7;
  EXPECT_NE(ledger_.inconsistency("g", 1).find("breaks its promise"), std::string::npos);
  tampered.jobs_done = 1;
}

// The run as a restore leaves it must be what the cut saved.
TEST_F(CompleteCut, ARestoreThatLeavesTheRunAsTheCutSavedItPasses) {
  ledger_.assert_restored(*cut_, cut_->saved);  // (returns: nothing broken)
}

using CompleteCutDeathTest = CompleteCut;

TEST_F(CompleteCutDeathTest, ARestoreThatLosesWhatTheCutSavedStopsTheProgram) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto restoring = [&](auto tamper) {
    RunProgress p = cut_->saved;
    tamper(p);
    ledger_.assert_restored(*cut_, p);
  };
  const char* kBroken = "does not leave the run as the cut saved it";
  // A completed job open again: the jobs done no longer add up to the cut's.
  EXPECT_DEATH(restoring([](RunProgress& p) {
                 p.epochs[0].done = 0;
                 p.epochs[0].active[0] = Epoch::ActiveJob{};
                 p.epochs[0].requeue.push_back(0);
               }),
               "its epochs 0");
  // Partly trained batches lost, or trained again.
  EXPECT_DEATH(restoring([](RunProgress& p) { p.epochs[0].trained.clear(); }), kBroken);
  // Other aggregates, another metric.
  EXPECT_DEATH(restoring([](RunProgress& p) { p.epochs[0].weighted_loss += 1; }), kBroken);
  EXPECT_DEATH(restoring([](RunProgress& p) { p.epochs[0].fold_report(report(1, 1)); }), kBroken);
  // Early stopping or the schedule not as saved.
  EXPECT_DEATH(restoring([](RunProgress& p) { p.early_stop.wait = 1; }), kBroken);
  EXPECT_DEATH(restoring([](RunProgress& p) { p.next_epoch = 3; }), kBroken);
  // A lease left alive by the restore.
  EXPECT_DEATH(restoring([](RunProgress& p) { p.epochs[0].active.at(1).live = 4; }), kBroken);
}

TEST(CutLedgerDeathTest, ACutWhoseProgressBreaksItsPromiseStopsTheProgramWhenItCompletes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CutLedger ledger(5, kBatchesPerJob);
  Cut& cut = ledger.add_share("g", 1, 1, 0, 1, {}, 5);
  RunProgress p = progress_now();
  p.epochs[0].done = 3;  // more jobs done than were handed out
  EXPECT_DEATH(ledger.complete(cut, p, 6), "cut 1 breaks its promise");
  // A share that would leave its job trained whole.
  Cut& other = ledger.add_share("g", 2, 1, 0, 1, {Cut::Share{0, 1, 3, report(1, 1)}}, 5);
  EXPECT_DEATH(ledger.complete(other, progress_now(), 6), "trained whole");
}

}  // namespace
}  // namespace traincoord
