#include "core/run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "core/engine.h"

namespace traincoord {
namespace {

RunConfig small_config() {
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

Completion loss_of(double loss, uint64_t samples = 1) {
  Completion c;
  c.loss = loss;
  c.samples = samples;
  return c;
}

class RunTest : public ::testing::Test {
 protected:
  Job take(traincoord::Run& run, WorkerId w) {
    auto a = run.acquire(w);
    EXPECT_TRUE(a.has_value());
    EXPECT_EQ(a->status, AcquireStatus::kJob);
    return a->job;
  }
  void finish_job(traincoord::Run& run, WorkerId w, const Job& job, double loss = 1.0) {
    auto c = run.complete(w, job.lease, loss_of(loss));
    ASSERT_TRUE(c.has_value()) << c.error().message;
    EXPECT_EQ(c->outcome, CompletionOutcome::kAccepted);
  }
  ManualClock clock_;
};

TEST_F(RunTest, HandsOutEveryJobOfTheEpochInOrderThenValidates) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId w = run.join("w");
  std::vector<std::pair<SetKind, uint64_t>> order;
  for (int i = 0; i < 12; ++i) {
    auto a = run.acquire(w);
    ASSERT_TRUE(a);
    if (a->status != AcquireStatus::kJob) break;
    order.emplace_back(a->job.set, a->job.index);
    finish_job(run, w, a->job);
  }
  const std::vector<std::pair<SetKind, uint64_t>> expected = {
      {SetKind::kTrain, 0}, {SetKind::kTrain, 1}, {SetKind::kTrain, 2}, {SetKind::kTrain, 3},
      {SetKind::kDev, 0},   {SetKind::kDev, 1},   {SetKind::kTrain, 0}, {SetKind::kTrain, 1},
      {SetKind::kTrain, 2}, {SetKind::kTrain, 3}, {SetKind::kDev, 0},   {SetKind::kDev, 1}};
  EXPECT_EQ(order, expected);
  EXPECT_EQ(run.state(), RunState::kCompleted);
  auto last = run.acquire(w);
  EXPECT_EQ(last->status, AcquireStatus::kFinished);
  EXPECT_EQ(last->state, RunState::kCompleted);
}

TEST_F(RunTest, WaitsAtTheEpochBarrierUntilStragglersFinish) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId a = run.join("a"), b = run.join("b");
  std::vector<Job> held;
  for (int i = 0; i < 3; ++i) held.push_back(take(run, a));
  const Job straggler = take(run, b);
  for (const Job& j : held) finish_job(run, a, j);
  auto wait = run.acquire(a);
  EXPECT_EQ(wait->status, AcquireStatus::kWait);
  EXPECT_GT(wait->retry_after_ms, 0);
  finish_job(run, b, straggler);
  const Job dev = take(run, a);
  EXPECT_EQ(dev.set, SetKind::kDev);  // validation sees the finished train epoch
}

TEST_F(RunTest, OverlapModeStartsTheNextEpochWhileStragglersFinish) {
  RunConfig c = small_config();
  c.overlap_epochs = true;
  c.validation_every = 0;
  c.dev_batches = 0;
  traincoord::Run run(c, clock_);
  const WorkerId a = run.join("a");
  std::vector<Job> held;
  for (int i = 0; i < 5; ++i) held.push_back(take(run, a));
  EXPECT_EQ(held[4].epoch, 1);
  EXPECT_EQ(held[4].index, 0u);
}

TEST_F(RunTest, SeedCompatHandsOutTrainJobsBeforeTheSameEpochsDevJobs) {
  RunConfig c = small_config();
  c.seed_compat = true;
  traincoord::Run run(c, clock_);
  const WorkerId a = run.join("a");
  std::vector<std::pair<int64_t, SetKind>> order;
  for (int i = 0; i < 8; ++i) {
    const Job j = take(run, a);
    order.emplace_back(j.epoch, j.set);
  }
  const std::vector<std::pair<int64_t, SetKind>> expected = {
      {0, SetKind::kTrain}, {0, SetKind::kTrain}, {0, SetKind::kTrain}, {0, SetKind::kTrain},
      {0, SetKind::kDev},   {0, SetKind::kDev},   {1, SetKind::kTrain}, {1, SetKind::kTrain}};
  EXPECT_EQ(order, expected);
}

TEST_F(RunTest, AnExpiredLeaseHandsTheJobToAnotherWorkerFirst) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId dead = run.join("dead"), live = run.join("live");
  const Job lost = take(run, dead);
  clock_.advance(1001);
  const Job again = take(run, live);
  EXPECT_EQ(again.index, lost.index);
  EXPECT_EQ(again.attempt, 2u);
  EXPECT_NE(again.lease, lost.lease);
  EXPECT_EQ(run.counters().lease_expiries, 1u);
  EXPECT_EQ(run.counters().rehandouts, 1u);
}

TEST_F(RunTest, ARetriedAcquireWithTheSameRequestIdGetsTheSameJob) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId w = run.join("w");
  const Job first = run.acquire(w, 77)->job;
  const Job retry = run.acquire(w, 77)->job;  // the first reply was lost
  EXPECT_EQ(retry.lease, first.lease);
  EXPECT_EQ(retry.index, first.index);
  EXPECT_EQ(run.counters().handouts, 1u);
  EXPECT_NE(run.acquire(w, 78)->job.lease, first.lease);  // a new request: a new job
  EXPECT_NE(run.acquire(w)->job.lease, first.lease);      // no id: always a new job
}

TEST_F(RunTest, HeartbeatsKeepALeaseAlive) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId w = run.join("w"), other = run.join("other");
  const Job held = take(run, w);
  for (int i = 0; i < 5; ++i) {
    clock_.advance(800);
    auto leases = run.heartbeat(w);
    ASSERT_TRUE(leases);
    EXPECT_EQ(*leases, std::vector<LeaseId>{held.lease});
  }
  const Job next = take(run, other);
  EXPECT_NE(next.index, held.index);
  EXPECT_EQ(run.counters().lease_expiries, 0u);
}

TEST_F(RunTest, AHeartbeatListingItsLeasesLetsALeaseTheWorkerNeverHeardOfExpire) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId w = run.join("w");
  const Job phantom = take(run, w);  // its reply was lost: the worker does not know it
  const Job known = take(run, w);
  const std::vector<LeaseId> only = {known.lease};
  for (int i = 0; i < 3; ++i) {
    clock_.advance(600);
    ASSERT_TRUE(run.heartbeat(w, &only));
  }
  EXPECT_EQ(*run.heartbeat(w, &only), std::vector<LeaseId>{known.lease});
  EXPECT_EQ(run.counters().lease_expiries, 1u);
  EXPECT_EQ(take(run, w).index, phantom.index);  // handed out again
}

TEST_F(RunTest, ALateCompletionOfAnExpiredLeaseWinsAndSupersedesTheNewLease) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId slow = run.join("slow"), fresh = run.join("fresh");
  const Job first = take(run, slow);
  clock_.advance(1001);
  const Job second = take(run, fresh);
  ASSERT_EQ(second.index, first.index);
  finish_job(run, slow, first, 2.0);
  auto dup = run.complete(fresh, second.lease, loss_of(3.0));
  ASSERT_TRUE(dup);
  EXPECT_EQ(dup->outcome, CompletionOutcome::kSuperseded);
  EXPECT_EQ(run.epochs()[0].done, 1u);
  EXPECT_TRUE(run.heartbeat(fresh)->empty());
}

TEST_F(RunTest, ARepeatedCompletionIsAnsweredIdempotentlyAndNotCountedTwice) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId w = run.join("w");
  const Job job = take(run, w);
  finish_job(run, w, job, 1.0);
  auto again = run.complete(w, job.lease, loss_of(100.0));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->outcome, CompletionOutcome::kDuplicate);
  EXPECT_FALSE(again->counted());
  EXPECT_EQ(run.epochs()[0].done, 1u);
  EXPECT_DOUBLE_EQ(run.epochs()[0].plain_loss, 1.0);
}

// Issue 16, item 11: loss * samples overflowed to inf (1e300 * 2^53), and the epoch loss was
// NaN (null in JSON). The epoch aggregates are running means: never past their inputs' range.
TEST_F(RunTest, AnEpochLossOfHugeFiniteLossesIsTheirMeanNotInfinity) {
  RunConfig c = small_config();
  c.train_batches = 3;
  c.epochs = 1;
  c.validation_every = 0;
  c.dev_batches = 0;
  for (const bool compat : {false, true}) {
    c.seed_compat = compat;
    traincoord::Run run(c, clock_);
    const WorkerId w = run.join("w");
    const double big = std::numeric_limits<double>::max() / 2;  // the plain sum of 3 is inf too
    for (const double loss : {big, big, big}) {
      const Job j = take(run, w);
      Completion done = loss_of(loss, uint64_t{1} << 53);
      done.metrics.push_back({"accuracy", loss});
      ASSERT_TRUE(run.complete(w, j.lease, done));
    }
    const Epoch& e = run.epochs().at(0);
    ASSERT_TRUE(e.closed());
    EXPECT_DOUBLE_EQ(e.loss, big) << (compat ? "seed_compat" : "default");
    EXPECT_DOUBLE_EQ(e.metric("accuracy", true), big);
    EXPECT_DOUBLE_EQ(e.metric("accuracy", false), big);
    EXPECT_EQ(e.samples, 3 * (uint64_t{1} << 53));
  }
}

TEST_F(RunTest, HugeLossesOfOppositeSignsAverageWithoutOverflow) {
  RunConfig c = small_config();
  c.train_batches = 2;
  c.epochs = 1;
  c.validation_every = 0;
  c.dev_batches = 0;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  const double max = std::numeric_limits<double>::max();
  ASSERT_TRUE(run.complete(w, take(run, w).lease, loss_of(-max, 1)));
  ASSERT_TRUE(run.complete(w, take(run, w).lease, loss_of(max, 3)));  // max - (-max) is inf
  const Epoch& e = run.epochs().at(0);
  ASSERT_TRUE(e.closed());
  EXPECT_TRUE(std::isfinite(e.loss));
  EXPECT_DOUBLE_EQ(e.loss, max / 2);  // (-max * 1 + max * 3) / 4
  EXPECT_DOUBLE_EQ(e.plain_loss, 0.0);
}

TEST_F(RunTest, EpochSampleCountsSaturateInsteadOfWrapping) {
  RunConfig c = small_config();
  c.train_batches = 3;
  c.epochs = 1;
  c.validation_every = 0;
  c.dev_batches = 0;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  const uint64_t half = uint64_t{1} << 63;
  ASSERT_TRUE(run.complete(w, take(run, w).lease, loss_of(1.0, half)));
  ASSERT_TRUE(run.complete(w, take(run, w).lease, loss_of(3.0, half)));  // 2^64: would wrap to 0
  ASSERT_TRUE(run.complete(w, take(run, w).lease, loss_of(2.0, 5)));
  const Epoch& e = run.epochs().at(0);
  ASSERT_TRUE(e.closed());
  EXPECT_EQ(e.samples, std::numeric_limits<uint64_t>::max());
  EXPECT_NEAR(e.loss, 2.0, 1e-12);
}

TEST_F(RunTest, CompletingAnotherWorkersLeaseIsAConflict) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId owner = run.join("owner"), thief = run.join("thief");
  const Job job = take(run, owner);
  auto r = run.complete(thief, job.lease, loss_of(1.0));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kConflict);
  EXPECT_NE(r.error().message.find("owner"), std::string::npos);
  finish_job(run, owner, job);
  auto after = run.complete(thief, job.lease, loss_of(1.0));  // also once resolved
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().code, ErrorCode::kConflict);
}

TEST_F(RunTest, CompletingAnUnknownLeaseIsNotFound) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId w = run.join("w");
  auto r = run.complete(w, 999, loss_of(1.0));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(run.complete(42, 1, loss_of(1.0)).error().code, ErrorCode::kNotFound);
}

TEST_F(RunTest, AJobThatExpiresMaxAttemptsTimesFailsTheRun) {
  RunConfig c = small_config();
  c.max_attempts = 2;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  take(run, w);
  clock_.advance(1001);
  const Job second = take(run, w);
  EXPECT_EQ(second.attempt, 2u);
  clock_.advance(1001);
  auto a = run.acquire(w);
  EXPECT_EQ(a->status, AcquireStatus::kFinished);
  EXPECT_EQ(run.state(), RunState::kFailed);
  EXPECT_NE(run.state_reason().find("job 0 of train epoch 0 failed 2 times"), std::string::npos);
}

TEST_F(RunTest, SkipPolicyClosesTheEpochWithoutTheFailedJobAndSaysSo) {
  RunConfig c = small_config();
  c.max_attempts = 1;
  c.on_job_failure = JobFailurePolicy::kSkip;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  const Job bad = take(run, w);
  ASSERT_TRUE(run.fail(w, bad.lease, "CUDA out of memory"));
  for (int i = 0; i < 3; ++i) finish_job(run, w, take(run, w));
  const Epoch& e = run.epochs()[0];
  EXPECT_TRUE(e.closed());
  EXPECT_EQ(e.failed_jobs, std::vector<uint64_t>{0});
  EXPECT_EQ(run.state(), RunState::kRunning);
  EXPECT_EQ(run.events().back().kind, EventKind::kEpochOpened);
  bool reported = false;
  for (const Event& ev : run.events()) {
    reported |=
        ev.kind == EventKind::kJobFailed && ev.text.find("CUDA out of memory") != std::string::npos;
  }
  EXPECT_TRUE(reported);
}

TEST_F(RunTest, AWorkerThatLeavesHandsItsJobBackWithoutAFailedAttempt) {
  RunConfig c = small_config();
  c.max_attempts = 1;
  traincoord::Run run(c, clock_);
  const WorkerId quitter = run.join("quitter"), other = run.join("other");
  const Job job = take(run, quitter);
  ASSERT_TRUE(run.leave(quitter));
  const Job again = take(run, other);
  EXPECT_EQ(again.index, job.index);
  EXPECT_EQ(run.state(), RunState::kRunning);
  auto late = run.complete(quitter, job.lease, loss_of(1.0));
  EXPECT_EQ(late->outcome, CompletionOutcome::kGivenUp);
}

TEST_F(RunTest, ReleasedJobsGoBackFirstWithoutAFailedAttemptAndTheirLateCompletionIsNotCounted) {
  RunConfig c = small_config();
  c.max_attempts = 1;  // a single failed attempt would fail the run
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w"), other = run.join("other");
  const Job a = take(run, w), b = take(run, w);
  auto released = run.release(w, {b.lease, a.lease, a.lease});
  ASSERT_TRUE(released);
  EXPECT_EQ(*released, 2u);
  EXPECT_EQ(run.state(), RunState::kRunning);
  EXPECT_EQ(run.counters().failure_reports, 0u);
  // Handed back most recent first: a (released last) goes out before b.
  const Job again = take(run, other);
  EXPECT_EQ(again.index, a.index);
  EXPECT_EQ(take(run, other).index, b.index);
  EXPECT_EQ(run.complete(w, a.lease, loss_of(1.0))->outcome, CompletionOutcome::kGivenUp);
  EXPECT_EQ(run.epochs()[0].done, 0u);
}

TEST_F(RunTest, AReleaseNamingAnotherWorkersLeaseChangesNothing) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId w = run.join("w"), other = run.join("other");
  const Job mine = take(run, w), theirs = take(run, other);
  auto refused = run.release(w, {mine.lease, theirs.lease});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kConflict);
  EXPECT_FALSE(run.release(w, {999}));
  EXPECT_EQ(run.complete(w, mine.lease, loss_of(1.0))->outcome, CompletionOutcome::kAccepted);
}

TEST_F(RunTest, EpochLossIsTheSampleWeightedMeanAndNonFiniteLossesAreCountedApart) {
  RunConfig c = small_config();
  c.validation_every = 0;
  c.epochs = 1;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  const double losses[] = {1.0, 3.0, NAN, 5.0};
  const uint64_t samples[] = {1, 3, 7, 0};
  for (int i = 0; i < 4; ++i) {
    const Job j = take(run, w);
    ASSERT_TRUE(run.complete(w, j.lease, loss_of(losses[i], samples[i])));
  }
  const Epoch& e = run.epochs()[0];
  EXPECT_DOUBLE_EQ(e.loss, (1.0 * 1 + 3.0 * 3 + 5.0 * 0) / 4.0);
  EXPECT_EQ(e.nonfinite_jobs, 1u);
  EXPECT_EQ(run.counters().nonfinite_losses, 1u);
}

TEST_F(RunTest, SeedCompatEpochLossIsThePlainMean) {
  RunConfig c = small_config();
  c.validation_every = 0;
  c.epochs = 1;
  c.seed_compat = true;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  for (double loss : {1.0, 2.0, 3.0, 6.0}) {
    const Job j = take(run, w);
    ASSERT_TRUE(run.complete(w, j.lease, loss_of(loss, loss == 6.0 ? 100 : 1)));
  }
  EXPECT_DOUBLE_EQ(run.epochs()[0].loss, 3.0);
}

TEST_F(RunTest, EarlyStopDecidesOnTheDevEpochThatJustFinished) {
  RunConfig c = small_config();
  c.epochs = 10;
  c.early_stop.kind = EarlyStopKind::kPatience;
  c.early_stop.patience.patience = 1;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  const double dev_loss[] = {1.0, 0.5, 0.7};
  int dev_epochs = 0;
  while (true) {
    auto a = run.acquire(w);
    if (a->status != AcquireStatus::kJob) break;
    const double loss = a->job.set == SetKind::kDev ? dev_loss[a->job.epoch] : 2.0;
    ASSERT_TRUE(run.complete(w, a->job.lease, loss_of(loss)));
    if (a->job.set == SetKind::kDev && a->job.index == 1) ++dev_epochs;
  }
  EXPECT_EQ(run.state(), RunState::kEarlyStopped);
  EXPECT_EQ(dev_epochs, 3);  // no train job of epoch 3 was handed out
  EXPECT_EQ(run.early_stop().state().best_epoch, 1);
  EXPECT_EQ(run.early_stop().state().stopped_at_epoch, 2);
  EXPECT_NE(run.state_reason().find("best epoch 1"), std::string::npos);
}

TEST_F(RunTest, PatienceCanMonitorAReportedMetric) {
  RunConfig c = small_config();
  c.epochs = 10;
  c.early_stop.kind = EarlyStopKind::kPatience;
  c.early_stop.patience.patience = 1;
  c.early_stop.patience.monitor = "accuracy";
  c.early_stop.patience.mode = MonitorMode::kMax;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  const double accuracy[] = {0.5, 0.6, 0.55};
  while (true) {
    auto a = run.acquire(w);
    if (a->status != AcquireStatus::kJob) break;
    Completion done = loss_of(1.0);
    done.metrics.push_back({"accuracy", accuracy[a->job.epoch]});
    ASSERT_TRUE(run.complete(w, a->job.lease, done));
  }
  EXPECT_EQ(run.state(), RunState::kEarlyStopped);
  EXPECT_EQ(run.early_stop().state().best_epoch, 1);
}

TEST_F(RunTest, ResumedRunStartsInTheCheckpointsEpochAndSkipsTrainedJobs) {
  RunConfig c = small_config();
  c.start_step = 6;  // 4 steps per epoch: epoch 1, 2 jobs in
  c.epochs = 2;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  const Job first = take(run, w);
  EXPECT_EQ(first.epoch, 1);
  EXPECT_EQ(first.index, 2u);
  EXPECT_EQ(run.planned_jobs(), 2u + 2u);
}

TEST_F(RunTest, TargetAlreadyReachedFinishesAtOnce) {
  RunConfig c = small_config();
  c.start_step = 8;  // epoch 2
  c.epochs = 2;
  traincoord::Run run(c, clock_);
  EXPECT_EQ(run.state(), RunState::kCompleted);
  EXPECT_NE(run.state_reason().find("already reached"), std::string::npos);
  const WorkerId w = run.join("w");
  EXPECT_EQ(run.acquire(w)->status, AcquireStatus::kFinished);
}

TEST_F(RunTest, NextIndexCountsPerSetAndEpochAndNeverResetsUnderRunningJobs) {
  RunConfig c = small_config();
  c.overlap_epochs = true;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  EXPECT_EQ(run.next_index(SetKind::kTrain)->position, 0u);
  EXPECT_EQ(run.next_index(SetKind::kTrain)->position, 1u);
  EXPECT_EQ(run.next_index(SetKind::kDev).error().code, ErrorCode::kFailedPrecondition);
  for (int i = 0; i < 6; ++i) take(run, w);  // train 0 and dev 0 handed out, still running
  EXPECT_EQ(run.next_index(SetKind::kDev)->position, 0u);
  take(run, w);  // opens train epoch 1 while epoch 0's jobs still run
  auto idx = run.next_index(SetKind::kTrain);
  EXPECT_EQ(idx->epoch, 1);
  EXPECT_EQ(idx->position, 0u);
  EXPECT_EQ(run.epochs()[0].next_index, 2u);  // epoch 0's counter was not reset
}

TEST_F(RunTest, JobsCarryTheirBatchIndicesInTheEpochsOrder) {
  RunConfig c = small_config();
  c.order = BatchOrder::kShuffled;
  c.train_batches = 10;
  c.iters_per_worker = 3;
  c.validation_every = 0;
  c.epochs = 1;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  std::multiset<uint64_t> seen;
  for (int i = 0; i < 4; ++i) {
    const Job j = take(run, w);
    std::vector<uint64_t> batches;
    run.batches_of(j, &batches);
    EXPECT_EQ(batches.size(), i < 3 ? 3u : 1u);  // the last job is shorter
    seen.insert(batches.begin(), batches.end());
  }
  EXPECT_EQ(seen, (std::multiset<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST_F(RunTest, CancelEndsTheRun) {
  traincoord::Run run(small_config(), clock_);
  const WorkerId w = run.join("w");
  run.cancel("user asked");
  auto a = run.acquire(w);
  EXPECT_EQ(a->status, AcquireStatus::kFinished);
  EXPECT_EQ(a->state, RunState::kCancelled);
}

TEST_F(RunTest, ABillionBatchEpochNeedsMemoryOnlyForJobsInFlight) {
  RunConfig c = small_config();
  c.train_batches = 1'000'000'000;
  c.validation_every = 0;
  traincoord::Run run(c, clock_);
  const WorkerId w = run.join("w");
  for (int i = 0; i < 1000; ++i) take(run, w);
  EXPECT_EQ(run.epochs()[0].active.size(), 1000u);
  EXPECT_EQ(run.epochs()[0].open_jobs(), 1'000'000'000u - 1000u);
}

TEST(Engine, HoldsIndependentRunsAndRefusesDuplicateNames) {
  ManualClock clock;
  Engine engine(clock);
  RunConfig a = small_config();
  a.name = "a";
  RunConfig b = small_config();
  b.name = "b";
  b.train_batches = 8;
  ASSERT_TRUE(engine.create_run(a));
  ASSERT_TRUE(engine.create_run(b));
  auto dup = engine.create_run(a);
  ASSERT_FALSE(dup);
  EXPECT_EQ(dup.error().code, ErrorCode::kConflict);
  traincoord::Run* ra = *engine.find("a");
  traincoord::Run* rb = *engine.find("b");
  EXPECT_EQ(ra->plan().train_jobs_per_epoch, 4u);
  EXPECT_EQ(rb->plan().train_jobs_per_epoch, 8u);
  ASSERT_TRUE(engine.cancel_run("a", "sweep pruned"));
  EXPECT_EQ(ra->state(), RunState::kCancelled);
  EXPECT_EQ(rb->state(), RunState::kRunning);
  EXPECT_EQ(engine.find("zzz").error().code, ErrorCode::kNotFound);
  EXPECT_EQ(engine.runs().size(), 2u);
}

TEST(Engine, RefusesAnInvalidConfigNamingTheField) {
  ManualClock clock;
  Engine engine(clock);
  RunConfig c = small_config();
  c.gpus_per_worker = 0;
  auto r = engine.create_run(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "schedule.gpus_per_worker");
}

}  // namespace
}  // namespace traincoord

#include "core/run_codec.h"

namespace traincoord {
namespace {

TEST(RunCodec, ARestoredRunContinuesExactlyWhereItWas) {
  ManualClock clock;
  RunConfig c = small_config();
  c.early_stop.kind = EarlyStopKind::kPatience;
  traincoord::Run run(c, clock);
  const WorkerId a = run.join("a"), b = run.join("b");
  const Job held = *&run.acquire(a)->job;
  const Job done = run.acquire(b)->job;
  ASSERT_TRUE(run.complete(b, done.lease, loss_of(2.0)));
  clock.advance(1500);  // `held` expires
  const Job again = run.acquire(b)->job;

  auto restored = RunCodec::load(c, RunCodec::save(run), clock);
  ASSERT_TRUE(restored) << restored.error().message;
  traincoord::Run& r = **restored;
  EXPECT_EQ(RunCodec::save(r), RunCodec::save(run));
  // A late completion of the expired lease still wins; the duplicate is still known.
  EXPECT_EQ(r.complete(a, held.lease, loss_of(1.0))->outcome, CompletionOutcome::kAccepted);
  EXPECT_EQ(r.complete(b, again.lease, loss_of(1.0))->outcome, CompletionOutcome::kSuperseded);
  EXPECT_EQ(r.complete(b, done.lease, loss_of(1.0))->outcome, CompletionOutcome::kDuplicate);
  EXPECT_EQ(r.join("a"), a);
  EXPECT_EQ(r.counters().lease_expiries, 1u);
}

// The run of format2_fixture: a worker completed two train jobs (loss 1 over 1 sample and 2 over
// 3, accuracy 0.5 and 0.25) and holds a third.
void drive_format_fixture(traincoord::Run& run, ManualClock& clock) {
  const WorkerId w = run.join("w");
  const double losses[] = {1.0, 2.0};
  const uint64_t samples[] = {1, 3};
  const double accuracy[] = {0.5, 0.25};
  for (int i = 0; i < 2; ++i) {
    clock.advance(10);
    const Job j = run.acquire(w)->job;
    ASSERT_TRUE(run.complete(w, j.lease, {losses[i], samples[i], {{"accuracy", accuracy[i]}}}));
  }
  clock.advance(10);
  ASSERT_TRUE(run.acquire(w));
}

// That run as a traincoord of format 2 saved it (sums: loss 7 over 4 samples, 3 over 2 jobs).
const std::string& format2_fixture() {
  static const char kBytes[] =
      "\xb1\xa4\x8d\xa2\x05\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\xf8\x7f\x00\x00\x00\x00\x00\x01"
      "\x00"
      "\x00\x00\x04\x04\x00\x00\x02\x00\x01\x00\x00\x00\x00\x00\x00\x00\x1c\x40\x04\x00\x00\x00\x00"
      "\x00"
      "\x00\x08\x40\x02\x00\x01\x08\x61\x63\x63\x75\x72\x61\x63\x79\x00\x00\x00\x00\x00\x00\xf4\x3f"
      "\x04"
      "\x00\x00\x00\x00\x00\x00\xe8\x3f\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x01\x02\x01"
      "\x00"
      "\x03\x00\x01\x00\x00\x00\x01\x01\x00\x00\x01\x01\x77\x00\x3c\x01\x02\x01\x03\x00\x00\x03\x01"
      "\x03"
      "\x00\x00\x02\x01\x8c\x10\x00\x04\x00\x00\x05\x01\x00\x00\x02\x00\x00\x00\x00\x05\x03\x00\x00"
      "\x02"
      "\x00\x00\x00\x00\x00\x00\x02";
  static const std::string bytes(kBytes, sizeof kBytes - 1);
  return bytes;
}

TEST(RunCodec, ReadsAFormat2SnapshotTurningItsSumsIntoMeans) {
  ManualClock clock;
  auto old = RunCodec::load(small_config(), format2_fixture(), clock);
  ASSERT_TRUE(old) << old.error().message;
  const Epoch& e = (*old)->epochs().at(0);
  EXPECT_EQ(e.samples, 4u);
  EXPECT_DOUBLE_EQ(e.weighted_loss, 1.75);  // 7 / 4
  EXPECT_DOUBLE_EQ(e.plain_loss, 1.5);      // 3 / 2
  EXPECT_DOUBLE_EQ(e.metric("accuracy", true), 0.3125);
  EXPECT_DOUBLE_EQ(e.metric("accuracy", false), 0.375);

  // The same run driven by this build saves the same state, in the current format, but for
  // the samples and series of its completions (format 10), which a format 2 snapshot did not
  // keep.
  ManualClock now;
  traincoord::Run run(small_config(), now);
  ASSERT_NO_FATAL_FAILURE(drive_format_fixture(run, now));
  const std::string loaded = RunCodec::save(**old);
  const std::string driven = RunCodec::save(run);
  const size_t loaded_series = RunCodec::format10_bytes(**old).size();
  const size_t driven_series = RunCodec::format10_bytes(run).size();
  EXPECT_EQ(loaded_series, 3u);  // a worker's samples (0), no series, none dropped
  EXPECT_GT(driven_series, loaded_series);
  // (Then the mode, then format 11's re-plans: none, the same bytes.)
  const std::string replans = RunCodec::format11_bytes(run);
  EXPECT_EQ(RunCodec::format11_bytes(**old), replans);
  const size_t eleven = replans.size();
  EXPECT_EQ(loaded.substr(0, loaded.size() - eleven - 1 - loaded_series),
            driven.substr(0, driven.size() - eleven - 1 - driven_series));
  EXPECT_EQ(loaded[loaded.size() - eleven - 1], driven[driven.size() - eleven - 1]);  // the mode
  EXPECT_NE(driven, format2_fixture());
}

TEST(RunCodec, RefusesCorruptBytes) {
  ManualClock clock;
  traincoord::Run run(small_config(), clock);
  const std::string saved = RunCodec::save(run);
  EXPECT_FALSE(RunCodec::load(small_config(), saved.substr(0, saved.size() / 2), clock));
  EXPECT_FALSE(RunCodec::load(small_config(), "garbage", clock));
  EXPECT_FALSE(RunCodec::load(small_config(), saved + "x", clock));
}

TEST(RunCodec, RefusesAStateOutsideItsEnumNamingWhatIsWrong) {
  ManualClock clock;
  traincoord::Run run(small_config(), clock);
  std::string saved = RunCodec::save(run);
  // magic (5 bytes as a varint), format (1 byte), then the run's state.
  ASSERT_EQ(saved[6], 0);
  saved[6] = 9;
  auto loaded = RunCodec::load(small_config(), saved, clock);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().field, "snapshot");
  EXPECT_NE(loaded.error().message.find("unknown run state"), std::string::npos)
      << loaded.error().message;
}

// Paired with save(), which asserts what load() checks: whatever byte of a snapshot is damaged,
// load() either refuses it or returns a run that keeps every invariant (saving it again would
// stop the program otherwise).
TEST(RunCodec, ADamagedSnapshotIsAnErrorOrAConsistentRunNeverACrash) {
  ManualClock clock;
  RunConfig c = small_config();
  traincoord::Run run(c, clock);
  const WorkerId a = run.join("a"), b = run.join("b");
  ASSERT_TRUE(run.acquire(a));
  const Job done = run.acquire(b)->job;
  ASSERT_TRUE(run.complete(b, done.lease, loss_of(2.0)));
  clock.advance(1500);  // a's lease expires
  ASSERT_TRUE(run.acquire(b));
  const std::string saved = RunCodec::save(run);
  int refused = 0;
  for (size_t i = 0; i < saved.size(); ++i) {
    for (unsigned char flip : {0x01, 0x02, 0x10, 0x80, 0xff}) {
      std::string damaged = saved;
      damaged[i] = static_cast<char>(damaged[i] ^ flip);
      auto loaded = RunCodec::load(c, damaged, clock);
      if (!loaded) {
        refused += 1;
        EXPECT_EQ(loaded.error().field, "snapshot");
        continue;
      }
      (void)RunCodec::save(**loaded);  // asserts the invariants it loaded
    }
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace traincoord
