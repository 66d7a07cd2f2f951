#include "core/step_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/sample_order.h"

namespace traincoord {
namespace {

// Every rank has one batch in every step, every sample of `expected` is in exactly one batch,
// every batch has a sample (except the one step of an epoch with fewer samples than ranks), and
// the loss scales are n_rank · W / n_step.
void expect_promises(const StepPlan& plan, uint32_t ranks, std::vector<uint64_t> expected,
                     const std::string& where) {
  std::vector<uint64_t> seen;
  for (const Step& step : plan.steps) {
    ASSERT_EQ(step.batches.size(), ranks) << where;
    const double n = static_cast<double>(step.samples());
    for (const RankBatch& b : step.batches) {
      seen.insert(seen.end(), b.samples.begin(), b.samples.end());
      if (b.samples.empty()) {
        EXPECT_EQ(plan.steps.size(), 1u) << where;
        EXPECT_LT(expected.size(), ranks) << where;
        EXPECT_EQ(b.loss_scale, 0) << where;
      } else {
        EXPECT_DOUBLE_EQ(b.loss_scale, static_cast<double>(b.samples.size()) * ranks / n) << where;
      }
    }
  }
  std::sort(seen.begin(), seen.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(seen, expected) << where << ": not every sample exactly once";
  if (!expected.empty()) {
    EXPECT_GE(plan.steps.size(), 1u) << where;
  } else {
    EXPECT_TRUE(plan.steps.empty()) << where;
  }
}

std::vector<uint64_t> all_samples(uint64_t n) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::vector<double> random_lengths(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> d(std::log(6.0), 0.7);
  std::vector<double> v(n);
  for (double& l : v) l = std::clamp(d(rng), 1.0, 35.0);
  return v;
}

StepPlanConfig balanced(uint32_t ranks, double budget) {
  StepPlanConfig c;
  c.ranks = ranks;
  c.seed = 7;
  c.batch_budget = budget;
  c.cost = {0.5, 1, 0.05};
  return c;
}

bool same_plan(const StepPlan& x, const StepPlan& y) {
  if (x.steps.size() != y.steps.size()) return false;
  for (size_t k = 0; k < x.steps.size(); ++k) {
    for (size_t r = 0; r < x.steps[k].batches.size(); ++r) {
      if (x.steps[k].batches[r].samples != y.steps[k].batches[r].samples) return false;
    }
  }
  return true;
}

TEST(StepPlanFixed, EveryRankGetsTheSameStepsAndEverySampleOnceForEverySizeOfSet) {
  for (uint64_t n = 0; n <= 40; ++n) {
    for (uint32_t w = 1; w <= 6; ++w) {
      for (uint64_t b = 1; b <= 4; ++b) {
        StepPlanConfig c;
        c.ranks = w;
        c.batch_size = b;
        c.seed = n;
        const StepPlan plan = plan_epoch_steps(c, n, {}, 3);
        const std::string where =
            "n " + std::to_string(n) + " w " + std::to_string(w) + " b " + std::to_string(b);
        expect_promises(plan, w, all_samples(n), where);
        // As many steps as W·B-sample steps cover the set, less one when the last step's
        // samples had to join the one before (B = 1, fewer than W left); one when n < W.
        const uint64_t steps = (n + w * b - 1) / (w * b);
        if (n < w) {
          EXPECT_EQ(plan.steps.size(), n == 0 ? 0u : 1u) << where;
        } else if (b == 1 && n % w != 0) {
          EXPECT_EQ(plan.steps.size(), steps - 1) << where;
        } else {
          EXPECT_EQ(plan.steps.size(), steps) << where;
        }
        // Every batch but those of the last two steps holds exactly B samples.
        for (size_t k = 0; k + 2 < plan.steps.size(); ++k) {
          for (const RankBatch& rb : plan.steps[k].batches)
            EXPECT_EQ(rb.samples.size(), b) << where;
        }
      }
    }
  }
}

TEST(StepPlanFixed, StepsFollowTheEpochsSeededSampleOrder) {
  StepPlanConfig c;
  c.ranks = 4;
  c.batch_size = 3;
  c.seed = 11;
  const uint64_t n = 4 * 3 * 5;
  const StepPlan plan = plan_epoch_steps(c, n, {}, 2);
  const SampleOrder order(n, 1, 11, SetKind::kTrain, SampleShuffle::kEpoch);
  uint64_t p = 0;
  for (const Step& step : plan.steps) {
    for (const RankBatch& b : step.batches) {
      for (uint64_t s : b.samples) EXPECT_EQ(s, order.at(2, p++));
    }
  }
  EXPECT_EQ(p, n);
}

TEST(StepPlan, FewerSamplesThanRanksIsOneStepWithEmptyBatchesForTheRest) {
  for (bool fixed : {true, false}) {
    StepPlanConfig c = balanced(5, 100);
    if (fixed) c.batch_size = 4;
    const std::vector<double> lengths = {3, 1, 2};
    const StepPlan plan = plan_epoch_steps(c, 3, fixed ? std::span<const double>{} : lengths, 0);
    ASSERT_EQ(plan.steps.size(), 1u);
    const Step& step = plan.steps[0];
    for (uint32_t r = 0; r < 5; ++r) {
      EXPECT_EQ(step.batches[r].samples.size(), r < 3 ? 1u : 0u) << r;
      EXPECT_DOUBLE_EQ(step.batches[r].loss_scale, r < 3 ? 5.0 / 3.0 : 0.0) << r;
    }
    expect_promises(plan, 5, all_samples(3), fixed ? "fixed" : "balanced");
    EXPECT_TRUE(plan_epoch_steps(c, 0, {}, 0).steps.empty());
  }
}

// The step's gradient under DDP (the mean over ranks of each rank's loss-scaled mean) is the
// mean over the step's samples, as one process on them would compute it.
TEST(StepPlan, LossScalesMakeTheDdpAverageTheMeanOverTheStepsSamples) {
  const std::vector<double> lengths = random_lengths(997, 3);
  std::mt19937_64 rng(5);
  std::vector<double> gradient(lengths.size());
  for (double& g : gradient) g = std::uniform_real_distribution<double>(-3, 5)(rng);
  StepPlanConfig c = balanced(6, 300);
  c.speeds = {1, 1, 2, 1, 1.5, 1};  // unequal batch sizes within each step
  for (const StepPlan& plan : {plan_epoch_steps(c, lengths.size(), lengths, 1),
                               plan_epoch_steps(balanced(7, 300), 4, {{1, 2, 3, 4}}, 0)}) {
    ASSERT_FALSE(plan.steps.empty());
    for (const Step& step : plan.steps) {
      double ddp = 0, reference = 0;
      for (const RankBatch& b : step.batches) {
        double loss = 0;  // the rank's mean loss over its batch
        for (uint64_t s : b.samples) loss += gradient[s] / static_cast<double>(b.samples.size());
        ddp += b.loss_scale * loss / static_cast<double>(step.batches.size());  // DDP averages
        for (uint64_t s : b.samples) reference += gradient[s];
      }
      reference /= static_cast<double>(step.samples());
      EXPECT_NEAR(ddp, reference, 1e-12);
    }
  }
}

TEST(StepPlanBalanced, EqualStepsEverySampleOnceAndBatchesWithinTheBudget) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    std::mt19937_64 rng(seed);
    const uint64_t n = std::uniform_int_distribution<uint64_t>(0, 3000)(rng);
    const uint32_t w = std::uniform_int_distribution<uint32_t>(1, 12)(rng);
    const double budget = std::uniform_real_distribution<double>(50, 2000)(rng);
    const std::vector<double> lengths = random_lengths(n, seed);
    StepPlanConfig c = balanced(w, budget);
    c.seed = seed;
    if (seed % 3 == 0) {
      c.speeds.assign(w, 1.0);
      c.speeds[seed % w] = 2;
    }
    const StepPlan plan = plan_epoch_steps(c, n, lengths, static_cast<int64_t>(seed));
    const std::string where = "seed " + std::to_string(seed);
    expect_promises(plan, w, all_samples(n), where);
    for (const Step& step : plan.steps) {
      for (const RankBatch& b : step.batches) {
        // A batch over the budget is a sample too costly alone, or the end of a set too small
        // to give every rank a sample in every step otherwise.
        if (b.samples.size() > 1 && plan.steps.size() > 1) {
          EXPECT_LE(b.predicted, budget * (1 + 1e-12)) << where;
        }
      }
    }
  }
}

TEST(StepPlanBalanced, ASlowerRankGetsASmallerBatchOfEqualPredictedTime) {
  const std::vector<double> lengths = random_lengths(20000, 9);
  StepPlanConfig c = balanced(4, 400);
  c.speeds = {1, 2, 1, 1};
  const StepPlan plan = plan_epoch_steps(c, lengths.size(), lengths, 0);
  std::vector<double> samples(4), time(4);
  for (const Step& step : plan.steps) {
    for (size_t r = 0; r < 4; ++r) {
      samples[r] += static_cast<double>(step.batches[r].samples.size());
      time[r] += step.batches[r].predicted;
    }
  }
  EXPECT_LT(samples[1], 0.6 * samples[0]);
  EXPECT_GT(samples[1], 0.4 * samples[0]);
  EXPECT_NEAR(time[1] / time[0], 1.0, 0.05);
}

TEST(StepPlan, TheSameSeedAndEpochGiveTheSamePlanAndEachEpochIsReshuffled) {
  const std::vector<double> lengths = random_lengths(5000, 4);
  for (bool fixed : {true, false}) {
    StepPlanConfig c = balanced(8, 400);
    if (fixed) c.batch_size = 16;
    auto plan = [&](int64_t epoch) { return plan_epoch_steps(c, lengths.size(), lengths, epoch); };
    EXPECT_TRUE(same_plan(plan(3), plan(3)));
    EXPECT_FALSE(same_plan(plan(3), plan(4)));
    // Within a bucket too: the first batch of epoch 4 is not one of epoch 3's batches.
    const std::vector<uint64_t> first = plan(4).steps[0].batches[0].samples;
    for (const Step& step : plan(3).steps) {
      for (const RankBatch& b : step.batches) EXPECT_NE(b.samples, first);
    }
    StepPlanConfig other = c;
    other.seed = c.seed + 1;
    EXPECT_FALSE(same_plan(plan(3), plan_epoch_steps(other, lengths.size(), lengths, 3)));
  }
}

// A group of 8 trained some steps and was restored at another world size: the rest of the epoch
// is planned for W' ranks, each untrained sample once, the same whatever the order given.
TEST(StepPlan, TheRestOfAnEpochIsReplannedForAnotherWorldSize) {
  const std::vector<double> lengths = random_lengths(3000, 8);
  for (bool fixed : {true, false}) {
    StepPlanConfig c = balanced(8, 400);
    if (fixed) c.batch_size = 10;
    const StepPlan before = plan_epoch_steps(c, lengths.size(), lengths, 2);
    ASSERT_GT(before.steps.size(), 10u);
    std::vector<uint64_t> untrained;
    for (size_t k = 7; k < before.steps.size(); ++k) {
      for (const RankBatch& b : before.steps[k].batches) {
        untrained.insert(untrained.end(), b.samples.begin(), b.samples.end());
      }
    }
    for (uint32_t w : {1u, 3u, 8u, 13u}) {
      StepPlanConfig after = c;
      after.ranks = w;
      const StepPlan rest = plan_rest_of_epoch(after, lengths.size(), lengths, 2, untrained);
      expect_promises(rest, w, untrained, "W' " + std::to_string(w));
      std::vector<uint64_t> shuffled = untrained;
      std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(w));
      EXPECT_TRUE(same_plan(rest, plan_rest_of_epoch(after, lengths.size(), lengths, 2, shuffled)));
    }
    // The same world size and every sample untrained: the epoch's own plan.
    EXPECT_TRUE(same_plan(
        before, plan_rest_of_epoch(c, lengths.size(), lengths, 2, all_samples(lengths.size()))));
  }
}

TEST(StepPlan, ABadConfigIsRefusedNamingTheField) {
  const std::vector<double> lengths = {1, 2, 3};
  auto refused = [&](StepPlanConfig c, std::span<const double> l, const std::string& field) {
    auto r = check_step_config(c, 3, l);
    ASSERT_FALSE(r.has_value()) << field;
    EXPECT_EQ(r.error().field, field) << r.error().message;
    EXPECT_NE(r.error().message.find(field), std::string::npos) << r.error().message;
  };
  StepPlanConfig ok = balanced(2, 10);
  EXPECT_TRUE(check_step_config(ok, 3, lengths).has_value());
  StepPlanConfig c = ok;
  c.ranks = 0;
  refused(c, lengths, "ranks");
  refused(ok, {}, "lengths");
  const std::vector<double> negative = {1, -2, 3};
  refused(ok, negative, "lengths");
  c = ok;
  c.batch_budget = 0;
  refused(c, lengths, "batch_budget");
  c = ok;
  c.cost = {0, 0, 0};
  refused(c, lengths, "cost");
  c = ok;
  c.speeds = {1};
  refused(c, lengths, "speeds");
  c.speeds = {1, NAN};
  refused(c, lengths, "speeds");
  c = ok;
  c.batch_size = 2;  // fixed mode needs no lengths
  EXPECT_TRUE(check_step_config(c, 3, {}).has_value());
}

TEST(StepPlanBuckets, BoundariesFollowTheLengthsAndStayWithinTheBucketLimit) {
  const std::vector<double> lengths = random_lengths(20000, 2);
  BucketOptions o;
  const LengthBuckets b = fit_buckets(lengths, {0.5, 1, 0.05}, 400, o);
  EXPECT_GE(b.upper.size(), 20u);
  EXPECT_LE(b.upper.size(), o.max_buckets);
  EXPECT_TRUE(std::is_sorted(b.upper.begin(), b.upper.end()));
  EXPECT_EQ(b.upper.back(), *std::max_element(lengths.begin(), lengths.end()));
  o.max_buckets = 10;
  EXPECT_LE(fit_buckets(lengths, {0.5, 1, 0.05}, 400, o).upper.size(), 10u);
}

// The plans are never stored: a run restarted by a newer coordinator plans its open epochs again
// and must get the same batches, or the jobs in flight would name other samples. These hashes
// were computed by the planner before its speed-up (session 38: the pool sorted with its lengths,
// the step's limit computed once per shortest length); a change of the planner's output must
// change them knowingly (and version what it breaks).
uint64_t plan_hash(const StepPlan& plan) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the plan's shape and samples
  auto mix = [&](uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= (x >> (8 * i)) & 0xff;
      h *= 1099511628211ULL;
    }
  };
  mix(plan.steps.size());
  mix(plan.buckets);
  for (const Step& s : plan.steps) {
    for (const RankBatch& b : s.batches) {
      mix(b.samples.size());
      for (uint64_t x : b.samples) mix(x);
    }
  }
  return h;
}

TEST(StepPlanGolden, TheSameInputsGiveTheSamePlansAsBeforeTheSpeedUp) {
  std::mt19937_64 rng(2024);
  std::vector<double> len;
  for (int i = 0; i < 20000; ++i) {
    const double u = static_cast<double>(rng() % 10000) / 10000.0;
    len.push_back(std::round(100 * (1 + 34 * u * u * u)) / 100);
  }
  StepPlanConfig c;
  c.ranks = 8;
  c.seed = 9;
  c.batch_budget = 400;
  c.cost = BatchCost{0.5, 1, 0.05};
  c.speeds = {1, 1, 1, 1, 1, 1, 1, 2};
  EXPECT_EQ(plan_hash(plan_epoch_steps(c, len.size(), len, 0)), 0x36eb22e4606d4721ULL);
  EXPECT_EQ(plan_hash(plan_epoch_steps(c, len.size(), len, 3)), 0x9ecb71bbc1346e3cULL);
  std::vector<uint64_t> rest;
  for (uint64_t i = 0; i < len.size(); i += 3) rest.push_back(i);
  c.ranks = 5;
  c.speeds.clear();
  EXPECT_EQ(plan_hash(plan_rest_of_epoch(c, len.size(), len, 1, rest)), 0x996932410b73ec5dULL);
}

}  // namespace
}  // namespace traincoord
