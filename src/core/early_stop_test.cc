#include "core/early_stop.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace traincoord {
namespace {

EarlyStopConfig window_rule(int n, double mean_threshold = 0.5, double std_threshold = 0.5) {
  EarlyStopConfig c;
  c.kind = EarlyStopKind::kWindow;
  c.window = {n, mean_threshold, std_threshold};
  return c;
}

EarlyStopConfig patience_rule(int patience, double min_delta = 0) {
  EarlyStopConfig c;
  c.kind = EarlyStopKind::kPatience;
  c.patience.patience = patience;
  c.patience.min_delta = min_delta;
  return c;
}

// Feeds the losses as dev epochs 0, 1, ...; returns the epoch at which the rule stopped, or -1.
int64_t stop_epoch(EarlyStopRule& rule, const std::vector<double>& losses) {
  for (size_t e = 0; e < losses.size(); ++e) {
    if (rule.observe(static_cast<int64_t>(e), losses[e], std::isfinite(losses[e]))) {
      return static_cast<int64_t>(e);
    }
  }
  return -1;
}

TEST(EarlyStopWindow, StopsWhenLatestDevLossExceedsWindowMax) {
  EarlyStopRule rule(window_rule(4, 0.01, 0.01));
  EXPECT_EQ(stop_epoch(rule, {3.0, 2.9, 2.8, 3.5}), 3);
  EXPECT_NE(rule.state().reason.find("rose above"), std::string::npos);
}

TEST(EarlyStopWindow, DoesNotStopWhenLatestIsBelowTheWindowMax) {
  EarlyStopRule rule(window_rule(4, 0.01, 0.01));
  EXPECT_EQ(stop_epoch(rule, {5.0, 4.0, 3.0, 3.5}), -1);  // 3.5 < max(5, 4, 3)
}

TEST(EarlyStopWindow, StopsOnAPlateauOfMeanAndStd) {
  EarlyStopRule rule(window_rule(4, 0.5, 0.5));
  EXPECT_EQ(stop_epoch(rule, {2.0, 2.1, 2.0, 1.9}), 3);
  EXPECT_NE(rule.state().reason.find("plateaued"), std::string::npos);
}

TEST(EarlyStopWindow, PlateauComparisonsAreStrict) {
  // The previous three have mean 2.0 and std 0; the latest is exactly mean_threshold away.
  EarlyStopRule rule(window_rule(4, 0.5, 0.5));
  EXPECT_EQ(stop_epoch(rule, {2.0, 2.0, 2.0, 1.5}), -1);
}

TEST(EarlyStopWindow, UsesPopulationStd) {
  // Previous two: 1.0 and 2.0: population std 0.5 (sample std would be 0.707).
  EarlyStopRule at(window_rule(3, 10.0, 0.5));
  EXPECT_EQ(stop_epoch(at, {1.0, 2.0, 1.5}), -1);  // 0.5 < 0.5 is false
  EarlyStopRule above(window_rule(3, 10.0, 0.51));
  EXPECT_EQ(stop_epoch(above, {1.0, 2.0, 1.5}), 2);
}

// Issue 16, item 11 (aggregation): the window's sum of dev losses near 1.8e308 overflowed to
// inf, so a plateau of huge but finite losses never stopped; squares past 1e154 did the same to
// the std.
TEST(EarlyStopWindow, APlateauOfHugeFiniteLossesIsStillAPlateau) {
  const double big = 1.5e308;
  EarlyStopRule plateau(window_rule(4, 0.5, 0.5));
  EXPECT_EQ(stop_epoch(plateau, {big, big, big, big}), 3);
  EXPECT_NE(plateau.state().reason.find("plateaued"), std::string::npos);
  // Deviations of 1e200 (std 1e200, mean 2e200): no plateau, with or without overflow; but
  // a std threshold above it sees the std as it is.
  EarlyStopRule wide(window_rule(3, 1e300, 1.1e200));
  EXPECT_EQ(stop_epoch(wide, {1e200, 3e200, 2e200}), 2);
  EXPECT_NE(wide.state().reason.find("std 1e+200"), std::string::npos) << wide.state().reason;
}

TEST(EarlyStopWindow, WaitsForAFullWindow) {
  EarlyStopRule rule(window_rule(4));
  EXPECT_EQ(stop_epoch(rule, {1.0, 1.0, 1.0}), -1);
  EXPECT_TRUE(rule.observe(3, 1.0, true));
}

TEST(EarlyStopWindow, KeepsDecreasingLossesRunning) {
  EarlyStopRule rule(window_rule(4));
  EXPECT_EQ(stop_epoch(rule, {10.0, 8.0, 6.0, 4.0, 2.0}), -1);
  EXPECT_EQ(rule.state().best_epoch, 4);
}

TEST(EarlyStopWindow, StopsOnlyOnceAndIgnoresLaterResults) {
  EarlyStopRule rule(window_rule(2, 0.01, 0.01));
  EXPECT_EQ(stop_epoch(rule, {1.0, 2.0}), 1);
  const EarlyStopState before = rule.state();
  EXPECT_TRUE(rule.observe(2, 0.1, true));
  EXPECT_EQ(rule.state().observed.size(), before.observed.size());
  EXPECT_EQ(rule.state().stopped_at_epoch, 1);
}

TEST(EarlyStopPatience, StopsAfterPatienceEpochsWithoutImprovement) {
  EarlyStopRule rule(patience_rule(2));
  EXPECT_EQ(stop_epoch(rule, {1.0, 0.9, 0.95, 0.96}), 3);
  EXPECT_EQ(rule.state().best_epoch, 1);
  EXPECT_DOUBLE_EQ(rule.state().best_value, 0.9);
}

TEST(EarlyStopPatience, AnImprovementResetsTheWait) {
  EarlyStopRule rule(patience_rule(2));
  EXPECT_EQ(stop_epoch(rule, {1.0, 1.1, 0.8, 0.85, 0.7, 0.75}), -1);
  EXPECT_EQ(rule.state().wait, 1);
  EXPECT_EQ(rule.state().best_epoch, 4);
}

TEST(EarlyStopPatience, ImprovementMustExceedMinDelta) {
  EarlyStopRule rule(patience_rule(2, 0.01));
  EXPECT_EQ(stop_epoch(rule, {1.0, 0.995, 0.99}), 2);  // neither beats 1.0 by more than 0.01
  EXPECT_EQ(rule.state().best_epoch, 0);
}

TEST(EarlyStopPatience, MaxModeForAccuracy) {
  EarlyStopConfig c = patience_rule(1);
  c.patience.monitor = "accuracy";
  c.patience.mode = MonitorMode::kMax;
  EarlyStopRule rule(c);
  EXPECT_EQ(stop_epoch(rule, {0.5, 0.7, 0.69}), 2);
  EXPECT_EQ(rule.state().best_epoch, 1);
  EXPECT_EQ(rule.monitor(), "accuracy");
}

TEST(EarlyStopPatience, BaselineMustBeBeaten) {
  EarlyStopConfig c = patience_rule(2);
  c.patience.baseline = 0.5;
  EarlyStopRule rule(c);
  EXPECT_EQ(stop_epoch(rule, {0.6, 0.55}), 1);
  EXPECT_FALSE(rule.state().best_epoch.has_value());
}

TEST(EarlyStopPatience, StopsAtTheStoppingThreshold) {
  EarlyStopConfig c = patience_rule(5);
  c.patience.stopping_threshold = 0.1;
  EarlyStopRule rule(c);
  EXPECT_EQ(stop_epoch(rule, {0.5, 0.2, 0.05}), 2);
  EXPECT_EQ(rule.state().best_epoch, 2);
}

TEST(EarlyStopPatience, StopsWhenLossDivergesPastTheThreshold) {
  EarlyStopConfig c = patience_rule(5);
  c.patience.divergence_threshold = 10;
  EarlyStopRule rule(c);
  EXPECT_EQ(stop_epoch(rule, {5.0, 9.0, 11.0}), 2);
  EXPECT_NE(rule.state().reason.find("diverged"), std::string::npos);
}

TEST(EarlyStopPatience, StopsOnNonFiniteValuesWhenCheckingFiniteness) {
  EarlyStopRule rule(patience_rule(5));
  EXPECT_EQ(stop_epoch(rule, {1.0, NAN}), 1);
  EarlyStopRule any_job(patience_rule(5));
  EXPECT_TRUE(any_job.observe(0, 1.0, /*all_finite=*/false));
}

TEST(EarlyStopPatience, IgnoresNonFiniteValuesWithoutCheckFinite) {
  EarlyStopConfig c = patience_rule(5);
  c.patience.check_finite = false;
  EarlyStopRule rule(c);
  EXPECT_EQ(stop_epoch(rule, {1.0, INFINITY, 0.9}), -1);
  EXPECT_EQ(rule.state().best_epoch, 2);
}

}  // namespace
}  // namespace traincoord
