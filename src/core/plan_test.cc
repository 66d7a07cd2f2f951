#include "core/plan.h"

#include <gtest/gtest.h>

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
