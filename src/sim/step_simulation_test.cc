// The step planner and the cost model in the simulated group of issue 32: 20,000 speech-like
// samples (sim/step_simulation.h: log-normal durations, median 6 s, 1-35 s), 8 ranks, a batch
// costing a + b·n·L + c·n·L² (quadratic in its padded length). Simulated costs, not timings:
// every figure is deterministic, so its thresholds are asserted.
#include "sim/step_simulation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

namespace traincoord {
namespace {

StepSimulationOptions options() {
  StepSimulationOptions o;
  o.ranks = 8;
  o.batch_budget = 400;
  o.epochs = 2;
  o.seed = 1;
  o.compare = true;
  return o;
}

const StrategyFigures& strategy(const StepSimulationResult& r, const std::string& name) {
  auto it = std::find_if(r.compare.begin(), r.compare.end(),
                         [&](const StrategyFigures& s) { return s.name == name; });
  EXPECT_NE(it, r.compare.end()) << name;
  return *it;
}

TEST(StepSimulation, StepModeBeatsDistributedSamplerAndUnsynchronisedBucketsOnASkewedSet) {
  const std::vector<double> lengths = synthetic_lengths({});
  ASSERT_EQ(lengths.size(), 20000u);
  StepSimulationOptions o = options();
  o.slow_rank = 7;
  o.slowdown = 2;
  auto r = simulate_steps(lengths, o);
  ASSERT_TRUE(r) << r.error().message;
  for (const StepEpochReport& e : r->epochs) {
    EXPECT_TRUE(e.exactly_once) << "epoch " << e.epoch;
    EXPECT_EQ(e.figures.samples, lengths.size()) << "epoch " << e.epoch;
  }
  const StrategyFigures& ds = strategy(*r, "DistributedSampler");
  const StrategyFigures& unsync = strategy(*r, "unsynchronised buckets");
  const StrategyFigures& steps = strategy(*r, "step mode");
  // The targets of issue 32 (E_net = E here: no all-reduce is simulated).
  EXPECT_GE(steps.normal.efficiency, 0.95);
  EXPECT_LE(steps.normal.straggling, 1.03);
  EXPECT_LE(steps.normal.padding, 0.02);
  EXPECT_LE(steps.normal.time, 0.2 * ds.normal.time);
  EXPECT_LE(steps.normal.time, 0.9 * unsync.normal.time);
  // One rank at half speed: the limit is 8 / 7.5 = 1.067 of the normal epoch.
  ASSERT_TRUE(steps.slowed && ds.slowed && unsync.slowed);
  EXPECT_LE(steps.slowed->time, 1.10 * steps.normal.time);
  EXPECT_GE(ds.slowed->time, 1.15 * ds.normal.time);
  EXPECT_GE(unsync.slowed->time, 1.4 * unsync.normal.time);
  // The cost model after 5% of the first epoch: within 10% of the true batch times on average,
  // and the slowed rank found.
  EXPECT_LE(r->warmup_steps,
            static_cast<uint64_t>(0.05 * static_cast<double>(r->epochs[0].figures.steps)) + 1);
  EXPECT_LE(r->warmup_fit_error, 0.10);
  EXPECT_LE(r->warmup_fit_error_max, 0.15);
  // The first epoch, its first 5% planned blind, the rest with the model fitted then.
  EXPECT_GE(r->epochs[0].figures.efficiency, 0.85);
  EXPECT_NEAR(r->warmup_speeds[7], 2.0, 0.2);
  EXPECT_LE(r->epochs.back().fit_error_max, 0.05);
  // Without the warm-up re-plan, the slow rank would have straggled the whole first epoch.
  EXPECT_GT(r->warmup_steps, 0u);
  EXPECT_GE(r->first_epoch_blind.straggling, r->epochs[0].figures.straggling + 0.5);
  EXPECT_GE(r->first_epoch_blind.time, 1.5 * r->epochs[0].figures.time);
  EXPECT_EQ(r->first_epoch_blind.samples, lengths.size());
}

// The warm-up re-plan comes once the model has every rank's speed (3 reports each: 3 steps);
// without it, epoch 0 is the blind plan throughout, as the report's blind row says.
TEST(StepSimulation, TheWarmUpRePlanComesOnceEveryRankHasASpeed) {
  const std::vector<double> lengths = synthetic_lengths({.samples = 3000});
  StepSimulationOptions o = options();
  o.compare = false;
  o.batch_budget = 300;
  o.slow_rank = 2;
  auto with = simulate_steps(lengths, o);
  ASSERT_TRUE(with) << with.error().message;
  EXPECT_EQ(with->warmup_steps, 3u);
  EXPECT_NEAR(with->warmup_speeds[2], 2.0, 0.2);
  EXPECT_TRUE(with->epochs[0].exactly_once);
  o.warmup_replan = false;
  auto without = simulate_steps(lengths, o);
  ASSERT_TRUE(without) << without.error().message;
  EXPECT_EQ(without->warmup_steps, 0u);
  EXPECT_TRUE(without->epochs[0].exactly_once);
  EXPECT_EQ(without->epochs[0].figures.time, without->first_epoch_blind.time);
  EXPECT_EQ(without->epochs[0].figures.straggling, without->first_epoch_blind.straggling);
  EXPECT_LT(with->epochs[0].figures.time, 0.8 * without->epochs[0].figures.time);
  EXPECT_LT(with->epochs[0].figures.straggling, without->epochs[0].figures.straggling);
}

TEST(StepSimulation, TheSameOptionsGiveTheSameReport) {
  const std::vector<double> lengths = synthetic_lengths({.samples = 3000});
  StepSimulationOptions o = options();
  o.batch_budget = 300;
  auto report = [&] {
    auto r = simulate_steps(lengths, o);
    EXPECT_TRUE(r);
    std::ostringstream out;
    print_step_report(*r, o, out);
    return out.str();
  };
  const std::string first = report();
  EXPECT_EQ(first, report());
  EXPECT_NE(first.find("exactly-once"), std::string::npos) << first;
}

TEST(StepSimulation, FiguresOfAHandMadePlan) {
  // Two ranks, one step: rank 0 pads 1 to 2, rank 1 has one sample of 1; cost c·n·L² with c = 1.
  StepPlan plan;
  plan.ranks = 2;
  plan.steps.resize(1);
  plan.steps[0].batches.resize(2);
  plan.steps[0].batches[0].samples = {0, 1};
  plan.steps[0].batches[1].samples = {2};
  const std::vector<double> lengths = {1, 2, 1};
  const std::vector<double> slowdowns = {1, 1};
  const StepFigures f = figures_of(plan, lengths, {0, 0, 1}, slowdowns);
  EXPECT_DOUBLE_EQ(f.useful, 1 + 4 + 1);
  EXPECT_DOUBLE_EQ(f.padded, 2 * 4 + 1);
  EXPECT_DOUBLE_EQ(f.time, 8);
  EXPECT_DOUBLE_EQ(f.efficiency, 6.0 / (2 * 8));
  EXPECT_DOUBLE_EQ(f.straggling, 8 / 4.5);
  EXPECT_DOUBLE_EQ(f.padding, 1 - 6.0 / 9);
}

TEST(StepSimulation, BadLengthsAndOptionsAreRefusedNamingWhat) {
  auto bad = parse_lengths("1.5\n# a comment\n2 3\n", "lengths.txt");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("lengths.txt:3"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(parse_lengths("-1\n", "x"));
  EXPECT_FALSE(parse_lengths("# nothing\n", "x"));
  auto good = parse_lengths("1.5\n 2 # two\n\n3e1\n", "x");
  ASSERT_TRUE(good);
  EXPECT_EQ(*good, (std::vector<double>{1.5, 2, 30}));
  const std::vector<double> lengths = {1, 2, 3};
  StepSimulationOptions o = options();
  o.slow_rank = 8;
  EXPECT_EQ(simulate_steps(lengths, o).error().field, "slow-rank");
  o = options();
  o.batch_budget = 0;
  EXPECT_EQ(simulate_steps(lengths, o).error().field, "batch_budget");
}

}  // namespace
}  // namespace traincoord
