#include "core/cost_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace traincoord {
namespace {

const BatchCost kTruth{2.0, 0.8, 0.04};

// Batches of varied shapes, as a planner under a budget of ~400 forms them.
std::vector<BatchShape> shapes(uint64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<BatchShape> v;
  for (uint64_t i = 0; i < count; ++i) {
    const double longest = std::uniform_real_distribution<double>(1, 35)(rng);
    const uint64_t n =
        std::max<uint64_t>(1, static_cast<uint64_t>(400 / kTruth.padded({1, longest})));
    v.push_back({n, longest});
  }
  return v;
}

double relative(double got, double want) { return std::abs(got / want - 1); }

TEST(CostModel, RecoversTheModelAndEachRanksSpeedFromExactTimes) {
  CostModel model(3);
  const std::vector<double> speed = {1.0, 2.0, 1.25};
  // Shapes spread widely enough to tell a, b and c apart.
  std::mt19937_64 rng(1);
  for (int i = 0; i < 300; ++i) {
    const uint32_t r = static_cast<uint32_t>(i % 3);
    const BatchShape s{std::uniform_int_distribution<uint64_t>(1, 64)(rng),
                       std::uniform_real_distribution<double>(1, 35)(rng)};
    EXPECT_TRUE(model.report(r, s, speed[r] * kTruth.padded(s)));
  }
  ASSERT_TRUE(model.fitted());
  const BatchCost fit = model.shared();
  EXPECT_LT(relative(fit.a, kTruth.a), 1e-6) << fit.describe();
  EXPECT_LT(relative(fit.b, kTruth.b), 1e-6) << fit.describe();
  EXPECT_LT(relative(fit.c, kTruth.c), 1e-6) << fit.describe();
  for (uint32_t r = 0; r < 3; ++r) EXPECT_LT(relative(model.speed(r), speed[r]), 1e-6) << r;
  EXPECT_LT(relative(model.predict(1, {10, 20}), 2.0 * kTruth.padded({10, 20})), 1e-6);
}

TEST(CostModel, NoisyTimesWithOutliersStillPredictWithinAFewPercent) {
  CostModel model(8);
  std::mt19937_64 rng(2);
  std::normal_distribution<double> noise(0, 0.05);
  const std::vector<BatchShape> batches = shapes(400, 3);
  for (size_t i = 0; i < batches.size(); ++i) {
    const uint32_t r = static_cast<uint32_t>(i % 8);
    const double slow = r == 5 ? 2.0 : 1.0;
    double t = slow * kTruth.padded(batches[i]) * (1 + noise(rng));
    if (i % 25 == 7) t *= 4;  // a pause inside the batch
    (void)model.report(r, batches[i], t);
  }
  for (const BatchShape& s : shapes(200, 4)) {
    EXPECT_LT(relative(model.predict(0, s), kTruth.padded(s)), 0.05);
    EXPECT_LT(relative(model.predict(5, s), 2.0 * kTruth.padded(s)), 0.05);
  }
  EXPECT_NEAR(model.speed(5), 2.0, 0.05);
}

// A step that paused (a checkpoint written, a collection): 3 reports in 100 take 10 times as
// long; and 3 in 100 are read far too short (a timer read before the work was done). Least
// squares alone would follow them; their weight is cut by how far off they are.
TEST(CostModel, RareLongPausesDoNotDragTheModel) {
  CostModel model(4);
  std::mt19937_64 rng(8);
  std::normal_distribution<double> noise(0, 0.03);
  const std::vector<BatchShape> batches = shapes(1000, 9);
  for (size_t i = 0; i < batches.size(); ++i) {
    double t = kTruth.padded(batches[i]) * (1 + noise(rng));
    if (i % 100 < 3) t *= 10;
    if (i % 100 >= 50 && i % 100 < 53) t /= 10;
    (void)model.report(static_cast<uint32_t>(i % 4), batches[i], t);
  }
  for (const BatchShape& s : shapes(200, 10)) {
    EXPECT_LT(relative(model.predict(2, s), kTruth.padded(s)), 0.03);
  }
}

TEST(CostModel, CoefficientsAreNeverNegative) {
  // Times linear in the padded tokens only, with noise: an unconstrained fit would give a small
  // negative a or c half of the time.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CostModel model(2);
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> noise(0, 0.03);
    for (const BatchShape& s : shapes(50, seed)) {
      (void)model.report(static_cast<uint32_t>(seed % 2), s,
                         static_cast<double>(s.samples) * s.longest * (1 + noise(rng)));
    }
    const BatchCost fit = model.shared();
    EXPECT_GE(fit.a, 0) << seed;
    EXPECT_GE(fit.b, 0) << seed;
    EXPECT_GE(fit.c, 0) << seed;
    EXPECT_NEAR(fit.b, 1.0, 0.1) << fit.describe();
  }
}

TEST(CostModel, TheSameReportsGiveTheSameModelHoweverOftenItWasAskedFor) {
  CostModel asked(4), quiet(4);
  std::mt19937_64 rng(6);
  std::normal_distribution<double> noise(0, 0.2);
  for (const BatchShape& s : shapes(300, 7)) {
    const uint32_t r = static_cast<uint32_t>(rng() % 4);
    const double t = kTruth.padded(s) * std::exp(noise(rng));
    (void)asked.report(r, s, t);
    (void)quiet.report(r, s, t);
    (void)asked.shared();  // a planner asking after every report
  }
  EXPECT_EQ(asked.shared().a, quiet.shared().a);
  EXPECT_EQ(asked.shared().b, quiet.shared().b);
  EXPECT_EQ(asked.shared().c, quiet.shared().c);
  EXPECT_EQ(asked.speeds(), quiet.speeds());
}

// A group's first steps, as a cost-balanced plan forms them: every batch near the budget under
// the declared cost (its shape the true one's, in other units), so every batch takes about the
// same time, and a per-batch constant fits those times as well as the true shape. Measured on a
// real 8-rank group (docs/PERFORMANCE.md): after 32 such reports a fit without a prior put
// 8.5–33 ms into a for a true 0.05 ms; here, without the prior, 18–39 ms, and the epoch's
// batches mispredicted by 13–17% on average (the small ones at its end many times over).
// With the declared shape as a prior the fit keeps it where the reports cannot tell.
std::vector<BatchShape> budget_batches(std::mt19937_64& rng, uint32_t ranks, int steps) {
  std::lognormal_distribution<double> length(std::log(6.0), 0.7);
  std::uniform_real_distribution<double> jitter(0.97, 1.03);
  std::vector<BatchShape> v;
  for (int k = 0; k < steps; ++k) {
    const double bucket = std::clamp(length(rng), 1.0, 35.0);  // a step's batches share a bucket
    for (uint32_t r = 0; r < ranks; ++r) {
      const double longest = std::min(35.0, bucket * jitter(rng));
      const uint64_t n = std::max<uint64_t>(
          1, static_cast<uint64_t>((400 - 0.5) / (longest + 0.05 * longest * longest)));
      v.push_back({n, longest});
    }
  }
  return v;
}

// After 4 steps of 8 ranks (32 reports; rank 7 twice as slow; one report in the 32 paused 3×,
// the pause landing among a rank's first reports): within 10% of the true times of the epoch's
// batches (target of issue 32; 2.5% on average over these seeds), the slow rank's speed within
// 6% (15% when the pause is one of its own 4), and the paused rank not taken for a slow one
// (before: 1.8).
TEST(CostModel, BatchesUnderOneBudgetKeepTheDeclaredShapeWhereTheyCannotTellItApart) {
  const BatchCost declared{0.5, 1, 0.05};        // budget units
  const BatchCost truth{0.5e-4, 1e-4, 0.05e-4};  // seconds: 0.1 ms a unit
  CostModelOptions options;
  options.prior = declared;
  options.judge_first_reports_at_speed_1 = true;
  auto slowdown = [](uint32_t rank) { return rank == 7 ? 2.0 : 1.0; };
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> noise(0, 0.03);
    CostModel model(8, options);
    const std::vector<BatchShape> first = budget_batches(rng, 8, 4);
    const uint64_t paused = seed % 31;
    for (size_t i = 0; i < first.size(); ++i) {
      const uint32_t rank = static_cast<uint32_t>(i % 8);
      double t = slowdown(rank) * truth.padded(first[i]) * (1 + noise(rng));
      if (i == paused) t *= 3;
      (void)model.report(rank, first[i], t);
    }
    // The epoch's batches: near the budget, and its last few small ones.
    std::vector<BatchShape> epoch = budget_batches(rng, 8, 60);
    for (uint64_t n = 1; n <= 8; ++n) epoch.push_back({n, 4.0 + static_cast<double>(n)});
    double sum = 0;
    for (uint32_t i = 0; i < epoch.size(); ++i) {
      const uint32_t rank = i % 8;
      sum += relative(model.predict(rank, epoch[i]), slowdown(rank) * truth.padded(epoch[i]));
    }
    EXPECT_LT(sum / static_cast<double>(epoch.size()), 0.10)
        << "seed " << seed << ": " << model.shared().describe();
    if (paused % 8 == 7) {
      EXPECT_NEAR(model.speed(7), 2.0, 0.35) << seed;  // (2.29–2.30: one of its 4 reports ×3)
    } else {
      EXPECT_NEAR(model.speed(7), 2.0, 0.12) << seed;
      EXPECT_LT(model.speed(static_cast<uint32_t>(paused % 8)), 1.25) << seed;
    }
  }
}

// The prior is a shape, not a verdict: a wrong declared cost (linear, where the truth is
// quadratic) gives way once the reports' shapes differ enough to say otherwise.
TEST(CostModel, AWrongDeclaredShapeGivesWayToReportsThatTellItApart) {
  CostModelOptions options;
  options.prior = {0, 1, 0};
  CostModel model(3, options);
  std::mt19937_64 rng(4);
  std::normal_distribution<double> noise(0, 0.02);
  for (int i = 0; i < 300; ++i) {
    const BatchShape s{std::uniform_int_distribution<uint64_t>(1, 64)(rng),
                       std::uniform_real_distribution<double>(1, 35)(rng)};
    (void)model.report(static_cast<uint32_t>(i % 3), s, kTruth.padded(s) * (1 + noise(rng)));
  }
  for (const BatchShape& s : shapes(200, 5)) {
    EXPECT_LT(relative(model.predict(0, s), kTruth.padded(s)), 0.03) << model.shared().describe();
  }
  EXPECT_NEAR(model.shared().c, kTruth.c, 0.1 * kTruth.c) << model.shared().describe();
}

TEST(CostModel, IgnoresEmptyBatchesAndTimesThatAreNotPositive) {
  CostModel model(1);
  EXPECT_FALSE(model.report(0, {0, 5}, 1.0));
  EXPECT_FALSE(model.report(0, {3, 5}, 0.0));
  EXPECT_FALSE(model.report(0, {3, 5}, -1.0));
  EXPECT_FALSE(model.report(0, {3, 5}, NAN));
  EXPECT_FALSE(model.report(0, {3, NAN}, 1.0));
  EXPECT_EQ(model.reports(), 0u);
  EXPECT_FALSE(model.fitted());
  EXPECT_EQ(model.predict(0, {3, 5}), 0);
  EXPECT_EQ(model.speed(0), 1.0);
}

}  // namespace
}  // namespace traincoord
