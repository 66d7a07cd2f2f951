// Tests of the load generator's own parts: its histogram and the checks that keep a wrong
// server from scoring.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "answer_checker.h"
#include "latency_histogram.h"

namespace traincoord::bench {
namespace {

TEST(LatencyHistogram, QuantilesAreWithinOnePercentOfTheExactOnes) {
  LatencyHistogram h;
  std::mt19937_64 random(7);
  std::vector<uint64_t> values;
  for (int i = 0; i < 200000; ++i) {
    const uint64_t v = 1000 + random() % 1'000'000 + (i % 100 == 0 ? random() % 500'000'000 : 0);
    values.push_back(v);
    h.record(v);
  }
  std::sort(values.begin(), values.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const auto exact = static_cast<double>(values[static_cast<size_t>(q * (values.size() - 1))]);
    EXPECT_NEAR(static_cast<double>(h.quantile(q)) / exact, 1.0, 0.01) << q;
  }
  EXPECT_EQ(h.quantile(1.0), values.back());
  EXPECT_EQ(h.max(), values.back());
  EXPECT_EQ(h.count(), values.size());
}

TEST(LatencyHistogram, SmallValuesAreExactAndHugeOnesAreKept) {
  LatencyHistogram h;
  for (uint64_t v = 0; v < 128; ++v) h.record(v);
  EXPECT_EQ(h.quantile(0.5), 63u);
  h.record(uint64_t{1} << 60);
  EXPECT_EQ(h.max(), uint64_t{1} << 60);
  LatencyHistogram merged;
  merged.merge(h);
  EXPECT_EQ(merged.count(), 129u);
}

TEST(AnswerChecker, AJobHandedTwiceWhileHeldIsAViolation) {
  AnswerChecker c(10);
  c.handed(0, 3, 100);
  c.handed(0, 3, 101);
  ASSERT_EQ(c.violations.size(), 1u);
  EXPECT_NE(c.violations[0].find("while lease 100 held it"), std::string::npos);
  c.released(0, 3);
  c.handed(0, 3, 102);  // released first: fine
  EXPECT_EQ(c.violations.size(), 1u);
}

TEST(AnswerChecker, ABatchCountedTwiceOrAClosedEpochWithAHoleIsAViolation) {
  AnswerChecker c(4);
  for (uint64_t b : {0, 1, 2, 3}) c.counted(0, b);  // epoch 0 whole
  for (uint64_t b : {0, 1, 3}) c.counted(1, b);     // epoch 1 misses batch 2
  c.counted(2, 0);                                  // epoch 2: the newest, may be open
  EXPECT_TRUE(c.violations.empty());
  EXPECT_EQ(c.check_closed_epochs(), 2u);
  ASSERT_EQ(c.violations.size(), 1u);
  EXPECT_NE(c.violations[0].find("batch 2 of closed epoch 1 counted 0 times"), std::string::npos);
  c.counted(2, 0);
  EXPECT_EQ(c.violations.size(), 2u);
  EXPECT_EQ(c.total_counted(), 9u);
}

}  // namespace
}  // namespace traincoord::bench
