#include "core/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/run.h"

namespace traincoord {
namespace {

RunConfig base_config() {
  RunConfig c;
  c.name = "plan";
  c.train_batches = 102;
  c.dev_batches = 10;
  c.gpus_per_worker = 2;
  c.iters_per_worker = 2;
  c.replicas_to_agg = 3;
  c.epochs = 5;
  return c;
}

TEST(Plan, DerivesJobAndStepSizesFromGpusItersAndReplicas) {
  const Plan p = make_plan(base_config());
  EXPECT_EQ(p.batches_per_job, 4u);   // G * max(1, I)
  EXPECT_EQ(p.batches_per_step, 6u);  // G * max(1, R)
  EXPECT_EQ(p.steps_per_epoch, 17u);  // 102 // 6
}

TEST(Plan, ZeroItersAndReplicasCountAsOne) {
  RunConfig c = base_config();
  c.iters_per_worker = 0;
  c.replicas_to_agg = 0;
  const Plan p = make_plan(c);
  EXPECT_EQ(p.batches_per_job, 2u);
  EXPECT_EQ(p.batches_per_step, 2u);
}

TEST(Plan, StepsPerEpochIsAtLeastOne) {
  RunConfig c = base_config();
  c.train_batches = 3;  // fewer than a step
  EXPECT_EQ(make_plan(c).steps_per_epoch, 1u);
}

TEST(Plan, ResumesAtNonzeroStepInTheRightEpochAndJob) {
  RunConfig c = base_config();
  c.start_step = 40;  // 40 // 17 = epoch 2; 40 % 17 = 6 steps in: 6 * 6 // 4 = 9 jobs
  const Plan p = make_plan(c);
  EXPECT_EQ(p.start_epoch, 2);
  EXPECT_EQ(p.jobs_trained, 9u);
  EXPECT_EQ(p.target_epoch, 5);
  EXPECT_TRUE(p.trains);
}

TEST(Plan, DefaultModeKeepsLeftoverBatchesInAShorterLastJob) {
  const Plan p = make_plan(base_config());
  EXPECT_EQ(p.train_jobs_per_epoch, 26u);  // ceil(102 / 4)
  EXPECT_EQ(p.dev_jobs_per_epoch, 3u);     // ceil(10 / 4)
  const BatchSpan last = job_batches(102, 4, 25);
  EXPECT_EQ(last.first, 100u);
  EXPECT_EQ(last.count, 2u);
}

TEST(Plan, SeedCompatDropsLeftoverBatchesLikeTheOriginal) {
  RunConfig c = base_config();
  c.seed_compat = true;
  const Plan p = make_plan(c);
  EXPECT_EQ(p.train_jobs_per_epoch, 25u);  // 102 // 4
  EXPECT_EQ(p.dev_jobs_per_epoch, 2u);     // 10 // 4
}

TEST(Plan, AtLeastOneJobEvenForATinySet) {
  EXPECT_EQ(jobs_for(3, 4, /*seed_compat=*/true), 1u);
  EXPECT_EQ(jobs_for(3, 4, /*seed_compat=*/false), 1u);
  const BatchSpan only = job_batches(3, 4, 0);
  EXPECT_EQ(only.first, 0u);
  EXPECT_EQ(only.count, 3u);
}

TEST(Plan, NegativeEpochsMeanMoreEpochsThanTheStartEpoch) {
  RunConfig c = base_config();
  c.start_step = 40;  // epoch 2
  c.epochs = -3;
  const Plan p = make_plan(c);
  EXPECT_EQ(p.target_epoch, 5);
  EXPECT_TRUE(p.trains);
}

TEST(Plan, NothingIsTrainedWhenTheTargetIsAlreadyReached) {
  RunConfig c = base_config();
  c.start_step = 40;  // epoch 2
  c.epochs = 2;
  const Plan p = make_plan(c);
  EXPECT_FALSE(p.trains);
  EXPECT_EQ(p.total_train_jobs, 0u);
  c.epochs = 1;  // below the start epoch
  EXPECT_FALSE(make_plan(c).trains);
}

TEST(Plan, ValidationEveryEpochIncludesEpochZero) {
  EXPECT_TRUE(validates_after(1, 0));
  EXPECT_TRUE(validates_after(1, 1));
  EXPECT_TRUE(validates_after(1, 7));
}

TEST(Plan, ValidationEveryTwoEpochsSkipsEpochZero) {
  EXPECT_FALSE(validates_after(2, 0));
  EXPECT_FALSE(validates_after(2, 1));
  EXPECT_TRUE(validates_after(2, 2));
  EXPECT_FALSE(validates_after(2, 3));
  EXPECT_TRUE(validates_after(2, 4));
}

TEST(Plan, ValidationZeroNeverValidates) {
  for (int e = 0; e < 5; ++e) EXPECT_FALSE(validates_after(0, e));
}

TEST(Plan, DefaultModeSkipsTheJobsTheCheckpointTrainedInTheStartEpoch) {
  RunConfig c = base_config();
  c.start_step = 40;
  const Plan p = make_plan(c);
  const EpochPlan first = train_epoch_plan(p, c, 2);
  EXPECT_EQ(first.first_job, 9u);
  EXPECT_EQ(first.end_job, 26u);
  const EpochPlan next = train_epoch_plan(p, c, 3);
  EXPECT_EQ(next.first_job, 0u);
  EXPECT_EQ(next.end_job, 26u);
  EXPECT_EQ(p.total_train_jobs, 3u * 26 - 9);
}

TEST(Plan, SeedCompatShortensTheLastEpochByTheResumedRemainder) {
  RunConfig c = base_config();
  c.seed_compat = true;
  c.start_step = 40;
  const Plan p = make_plan(c);
  EXPECT_EQ(p.total_train_jobs, 3u * 25 - 9);
  EXPECT_EQ(train_epoch_plan(p, c, 2).size(), 25u);
  EXPECT_EQ(train_epoch_plan(p, c, 3).size(), 25u);
  const EpochPlan last = train_epoch_plan(p, c, 4);
  EXPECT_EQ(last.first_job, 0u);
  EXPECT_EQ(last.end_job, 16u);
}

TEST(Plan, DevEpochFollowsTrainEpochByTheValidationRule) {
  RunConfig c = base_config();
  c.validation_every = 2;
  const Plan p = make_plan(c);
  EXPECT_FALSE(dev_epoch_plan(p, c, 0).has_value());
  ASSERT_TRUE(dev_epoch_plan(p, c, 2).has_value());
  EXPECT_EQ(dev_epoch_plan(p, c, 2)->size(), 3u);
  c.dev_batches = 0;
  c.validation_every = 0;
  EXPECT_FALSE(dev_epoch_plan(make_plan(c), c, 2).has_value());
}

// Issue 16, item 10: this config passed validation and aborted the process at make_plan (the
// checkpoint's jobs were a whole seed_compat epoch). The original trains what is left.
RunConfig resumed_past_a_whole_epoch() {
  RunConfig c;
  c.name = "resume";
  c.train_batches = 3;
  c.iters_per_worker = 2;  // 2 batches per job: floor(3 / 2) = 1 job per epoch
  c.replicas_to_agg = 1;   // 1 batch per step: 3 steps per epoch
  c.start_step = 2;        // epoch 0, 2 steps in: 2 * 1 // 2 = 1 job trained, the whole epoch
  c.epochs = 2;
  c.validation_every = 0;
  c.seed_compat = true;
  return c;
}

// Drives `run` with one worker that completes each job before it asks again; returns the train
// and dev jobs it was handed.
uint64_t run_to_the_end(traincoord::Run& run) {
  const WorkerId w = run.join("w");
  uint64_t jobs = 0;
  for (uint64_t i = 0; i < 100'000; ++i) {
    auto got = run.acquire(w);
    EXPECT_TRUE(got);
    if (!got || got->status != AcquireStatus::kJob) break;
    EXPECT_TRUE(run.complete(w, got->job.lease, Completion{1.0, 1, {}}));
    jobs += 1;
  }
  return jobs;
}

TEST(Plan, SeedCompatResumeWhoseCheckpointCoversAWholeEpochTrainsWhatIsLeft) {
  const RunConfig c = resumed_past_a_whole_epoch();
  ASSERT_TRUE(validate(c));
  const Plan p = make_plan(c);
  EXPECT_EQ(p.start_epoch, 0);
  EXPECT_EQ(p.jobs_trained, 1u);
  EXPECT_EQ(p.train_jobs_per_epoch, 1u);
  EXPECT_EQ(p.target_epoch, 2);
  EXPECT_EQ(p.total_train_jobs, 1u);  // (2 - 0) * 1 - 1, as the original counted
  EXPECT_EQ(p.end_epoch, 1);          // ... and so it opened epoch 0 only
  EXPECT_EQ(train_epoch_plan(p, c, 0).size(), 1u);

  ManualClock clock;
  traincoord::Run run(c, clock);
  EXPECT_EQ(run.planned_jobs(), 1u);
  EXPECT_EQ(run_to_the_end(run), 1u);
  EXPECT_EQ(run.state(), RunState::kCompleted);
  ASSERT_EQ(run.epochs().size(), 1u);
  EXPECT_EQ(run.epochs()[0].plan.epoch, 0);
  EXPECT_NE(run.state_reason().find("ended with epoch 0"), std::string::npos) << run.state_reason();
}

TEST(Plan, SeedCompatResumeThatLeavesNoJobCompletesAtOnceAndSaysWhy) {
  RunConfig c = resumed_past_a_whole_epoch();
  c.epochs = 1;  // (1 - 0) * 1 - 1 = 0 jobs left
  ASSERT_TRUE(validate(c));
  const Plan p = make_plan(c);
  EXPECT_FALSE(p.trains);
  EXPECT_EQ(p.total_train_jobs, 0u);
  ManualClock clock;
  traincoord::Run run(c, clock);
  EXPECT_EQ(run.state(), RunState::kCompleted);
  EXPECT_EQ(run.planned_jobs(), 0u);
  EXPECT_TRUE(run.epochs().empty());
  EXPECT_NE(run.state_reason().find("nothing left to train"), std::string::npos)
      << run.state_reason();
}

// The class behind item 10: every config that validates plans, and a run of it opens exactly
// the epochs the rules say (docs/SEMANTICS.md), each with at least one job; in seed_compat
// those of the original coordinator, whose algorithm is restated here independently.
TEST(Plan, EveryAcceptedConfigOfASmallGridRunsExactlyTheEpochsOfTheRules) {
  using Opened = std::tuple<int64_t, SetKind, uint64_t, uint64_t>;  // epoch, set, first, end
  int runs = 0;
  for (uint64_t train = 1; train <= 8; ++train)
    for (int g = 1; g <= 2; ++g)
      for (int iters = 1; iters <= 3; ++iters)
        for (int replicas = 1; replicas <= 3; ++replicas)
          for (const bool compat : {false, true})
            for (const int every : {0, 2}) {
              const uint64_t bpj = static_cast<uint64_t>(g * iters);
              const uint64_t bps = static_cast<uint64_t>(g * replicas);
              const uint64_t steps = std::max<uint64_t>(1, train / bps);
              for (uint64_t step = 0; step <= 2 * steps + 1; ++step)
                for (const int64_t epochs : {-2, -1, 0, 1, 3}) {
                  RunConfig c;
                  c.name = "grid";
                  c.train_batches = train;
                  c.dev_batches = every > 0 ? 3 : 0;
                  c.gpus_per_worker = g;
                  c.iters_per_worker = iters;
                  c.replicas_to_agg = replicas;
                  c.start_step = step;
                  c.epochs = epochs;
                  c.validation_every = every;
                  c.seed_compat = compat;
                  const std::string what =
                      "train " + std::to_string(train) + " G " + std::to_string(g) + " I " +
                      std::to_string(iters) + " R " + std::to_string(replicas) + " S " +
                      std::to_string(step) + " E " + std::to_string(epochs) + " V " +
                      std::to_string(every) + (compat ? " seed_compat" : "");
                  ASSERT_TRUE(validate(c)) << what;

                  // The rules, restated.
                  const int64_t start = static_cast<int64_t>(step / steps);
                  const uint64_t trained = (step % steps) * bps / bpj;
                  const uint64_t per_epoch =
                      compat ? std::max<uint64_t>(1, train / bpj) : (train + bpj - 1) / bpj;
                  const int64_t target = epochs < 0 ? start - epochs : epochs;
                  std::vector<Opened> expected;
                  auto validates = [&](int64_t e) {
                    return every > 0 && (every == 1 || e > 0) && e % every == 0;
                  };
                  if (compat) {  // the original: min(left, per epoch) while jobs are left
                    uint64_t left =
                        target > start ? static_cast<uint64_t>(target - start) * per_epoch - trained
                                       : 0;
                    for (int64_t e = start; left > 0; ++e) {
                      const uint64_t n = std::min(left, per_epoch);
                      expected.emplace_back(e, SetKind::kTrain, 0, n);
                      if (validates(e)) {
                        expected.emplace_back(e, SetKind::kDev, 0, jobs_for(3, bpj, true));
                      }
                      left -= n;
                    }
                  } else {
                    for (int64_t e = start; e < target; ++e) {
                      expected.emplace_back(e, SetKind::kTrain, e == start ? trained : 0,
                                            per_epoch);
                      if (validates(e)) {
                        expected.emplace_back(e, SetKind::kDev, 0, jobs_for(3, bpj, false));
                      }
                    }
                  }

                  ManualClock clock;
                  traincoord::Run run(c, clock);
                  const uint64_t handed = run_to_the_end(run);
                  ++runs;
                  EXPECT_EQ(run.state(), RunState::kCompleted) << what;
                  std::vector<Opened> opened;
                  uint64_t planned = 0;
                  for (const Epoch& e : run.epochs()) {
                    opened.emplace_back(e.plan.epoch, e.plan.set, e.plan.first_job, e.plan.end_job);
                    EXPECT_GE(e.plan.size(), 1u) << what;
                    planned += e.plan.size();
                  }
                  EXPECT_EQ(opened, expected) << what;
                  EXPECT_EQ(handed, planned) << what;
                  EXPECT_EQ(run.planned_jobs(), planned) << what;
                  if (::testing::Test::HasFailure()) return;
                }
            }
  EXPECT_GT(runs, 10'000);
}

// Issue 16, item 11: 2^50 batches for 10^6 epochs was accepted, and the job count wrapped.
TEST(RunConfigValidation, RefusesAPlanOfMoreThan2To53JobsNamingTheField) {
  RunConfig c;
  c.name = "huge";
  c.train_batches = uint64_t{1} << 50;
  c.validation_every = 0;
  c.epochs = 1'000'000;
  auto r = validate(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "schedule.epochs");
  EXPECT_NE(r.error().message.find("2^53"), std::string::npos) << r.error().message;

  c.epochs = 8;  // 2^53 jobs: the most a run may plan, counted exactly
  ASSERT_TRUE(validate(c)) << validate(c).error().message;
  ManualClock clock;
  traincoord::Run run(c, clock);
  EXPECT_EQ(run.planned_jobs(), kMaxPlannedJobs);

  c.dev_batches = 1;  // and one dev job after each epoch is one too many
  c.validation_every = 1;
  r = validate(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "schedule.validation_every");
}

TEST(RunConfigValidation, RefusesAStartStepWhoseEpochsPassTheLastEpochNumber) {
  RunConfig c;
  c.name = "late";
  c.train_batches = 1;
  c.validation_every = 0;
  c.start_step = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  c.epochs = 0;  // a target already reached is fine
  ASSERT_TRUE(validate(c));
  c.epochs = -3;  // start epoch 2^63 - 1, plus 3: past the last epoch number
  auto r = validate(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "schedule.start_step");
  c.start_step += 1;  // 2^63: not an epoch number at all
  c.epochs = 0;
  r = validate(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "schedule.start_step");
}

TEST(RunConfigValidation, RefusesCountsPastTheirDocumentedBounds) {
  struct Case {
    const char* field;
    void (*spoil)(RunConfig&);
  };
  for (const Case& k : {
           Case{"data.train_batches", [](RunConfig& c) { c.train_batches = (1ull << 50) + 1; }},
           Case{"data.dev_batches", [](RunConfig& c) { c.dev_batches = (1ull << 50) + 1; }},
           Case{"schedule.gpus_per_worker", [](RunConfig& c) { c.gpus_per_worker = 65537; }},
           Case{"schedule.iters_per_worker", [](RunConfig& c) { c.iters_per_worker = 1 << 21; }},
           Case{"schedule.replicas_to_agg", [](RunConfig& c) { c.replicas_to_agg = 1 << 21; }},
           Case{"leases.timeout", [](RunConfig& c) { c.lease_timeout_ms = 604'800'001; }},
           Case{"leases.history", [](RunConfig& c) { c.lease_history = (1u << 26) + 1; }},
       }) {
    RunConfig c = base_config();
    k.spoil(c);
    auto r = validate(c);
    ASSERT_FALSE(r) << k.field;
    EXPECT_EQ(r.error().field, k.field);
  }
}

TEST(RunConfigValidation, NamesTheFieldThatIsWrong) {
  RunConfig c = base_config();
  c.train_batches = 0;
  auto r = validate(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "data.train_batches");

  c = base_config();
  c.early_stop.kind = EarlyStopKind::kWindow;
  c.early_stop.window.window = 1;
  r = validate(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "early_stop.window");
  EXPECT_NE(r.error().message.find("at least 2"), std::string::npos);

  c = base_config();
  c.dev_batches = 0;
  r = validate(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "data.dev_batches");
}

}  // namespace
}  // namespace traincoord
