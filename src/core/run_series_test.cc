// A run's series (core/run_series.h): every counted completion's loss and metrics, per set,
// downsampled evenly over the whole run within a bounded size, its latest value always shown,
// numbered by completion so a reader fetches only what is new; kept by snapshots.
#include "core/run_series.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/run.h"
#include "core/run_codec.h"

namespace traincoord {
namespace {

TEST(Series, KeepsEveryValueUntilFullThenHalvesEvenlyAndShowsTheLatest) {
  Series s;
  for (uint64_t n = 1; n <= Series::kCapacity; ++n) s.add(n, 0, static_cast<double>(n));
  ASSERT_EQ(s.stride(), 1u);
  ASSERT_EQ(s.points().size(), Series::kCapacity);
  // Ten times as many values: the stride doubles as needed, the points stay evenly spaced,
  // from the first value on, and never more than the capacity (+ the latest).
  const uint64_t total = 10 * Series::kCapacity + 7;
  for (uint64_t n = Series::kCapacity + 1; n <= total; ++n) s.add(n, 0, static_cast<double>(n));
  EXPECT_EQ(s.count(), total);
  EXPECT_EQ(s.stride(), 16u);  // 10,247 values at most 1,024 kept: every 16th
  const std::vector<SeriesPoint> points = s.points();
  ASSERT_GE(points.size(), Series::kCapacity / 2);
  ASSERT_LE(points.size(), Series::kCapacity + 1);
  EXPECT_EQ(points.front().n, 1u);
  for (size_t i = 1; i + 1 < points.size(); ++i) {
    ASSERT_EQ(points[i].n - points[i - 1].n, s.stride()) << i;
    ASSERT_EQ(points[i].value, static_cast<double>(points[i].n));
  }
  EXPECT_EQ(points.back().n, total);  // the latest value, though the stride skips it
  ASSERT_TRUE(s.latest_unkept().has_value());
  EXPECT_EQ(s.latest_unkept()->n, total);
  EXPECT_EQ(s.kept_after(total - 20).size(), 1u);  // 10,241 (= 1 + 640·16) only
  EXPECT_EQ(Series::consistent(s.kept(), s.latest(), s.stride(), s.count()), "");
}

TEST(Series, APollGetsOnlyWhatCameAfterItsLastPointAndNonFiniteValuesAreNotKept) {
  Series s;
  for (uint64_t n = 1; n <= 10; ++n) s.add(n, static_cast<int64_t>(n / 4), 0.5 * n);
  s.add(11, 2, std::numeric_limits<double>::quiet_NaN());
  s.add(12, 2, std::numeric_limits<double>::infinity());
  EXPECT_EQ(s.count(), 10u);
  const std::vector<SeriesPoint> after = s.kept_after(7);
  ASSERT_EQ(after.size(), 3u);
  EXPECT_EQ(after[0], (SeriesPoint{8, 2, 4.0}));
  EXPECT_EQ(after[2], (SeriesPoint{10, 2, 5.0}));
  EXPECT_TRUE(s.kept_after(10).empty());
  EXPECT_EQ(s.latest_unkept(), std::nullopt);  // (stride 1: the latest is kept)
}

TEST(Series, PartsThatNoSeriesCouldHaveAreNamed) {
  Series s;
  for (uint64_t n = 1; n <= 5; ++n) s.add(n, 0, 1.0);
  EXPECT_EQ(Series::consistent(s.kept(), s.latest(), 3, s.count()),
            "a stride that is not a power of 2");
  EXPECT_EQ(Series::consistent(s.kept(), s.latest(), 2, s.count()),
            "points that disagree with the count");
  std::vector<SeriesPoint> swapped = s.kept();
  std::swap(swapped[0], swapped[1]);
  EXPECT_EQ(Series::consistent(swapped, s.latest(), 1, 5), "points out of order");
  EXPECT_EQ(Series::consistent(s.kept(), std::nullopt, 1, 5), "no latest value");
}

TEST(RunSeries, TheLossAndEachMetricPerSetAndNamesBeyondTheLimitAreCountedNotKept) {
  RunSeries r;
  r.add(SetKind::kTrain, 0, 1, Completion{0.9, 32, {{"lr", 0.1}, {"accuracy", 0.5}}, 0});
  r.add(SetKind::kDev, 0, 2, Completion{0.8, 16, {{"accuracy", 0.6}}, 0});
  ASSERT_EQ(r.all().size(), 5u);  // train loss, lr, accuracy; dev loss, accuracy
  EXPECT_EQ(r.all().at({SetKind::kTrain, "lr"}).points()[0], (SeriesPoint{1, 0, 0.1}));
  EXPECT_EQ(r.all().at({SetKind::kDev, "accuracy"}).points()[0], (SeriesPoint{2, 0, 0.6}));
  EXPECT_EQ(r.all().at({SetKind::kDev, "loss"}).points()[0], (SeriesPoint{2, 0, 0.8}));
  for (size_t i = 0; i < RunSeries::kMaxNames + 5; ++i) {
    r.add(SetKind::kTrain, 0, 3 + i, Completion{1, 1, {{"m" + std::to_string(i), 1.0}}, 0});
  }
  size_t train = 0;
  for (const auto& [key, s] : r.all()) train += key.first == SetKind::kTrain;
  EXPECT_EQ(train, RunSeries::kMaxNames);
  EXPECT_EQ(r.dropped_names(), 8u);  // loss, lr, accuracy and m0 … m60 are the 64 kept
}

// 3 epochs of 4 jobs; a worker reports its loss and learning rate per job.
RunConfig series_config() {
  RunConfig c;
  c.name = "series";
  c.train_batches = 4;
  c.dev_batches = 2;
  c.epochs = 3;
  c.validation_every = 1;
  return c;
}

TEST(RunSeries, ARunKeepsEveryCompletionsLossAfterItsEpochClosedAndASnapshotKeepsThem) {
  ManualClock clock;
  traincoord::Run run(series_config(), clock);
  const WorkerId w = run.join("w");
  uint64_t done = 0;
  for (int i = 0; i < 100 && !run.finished(); ++i) {
    auto a = run.acquire(w);
    ASSERT_TRUE(a && a->status == AcquireStatus::kJob);
    ++done;
    const bool train = a->job.set == SetKind::kTrain;
    std::vector<Metric> metrics;
    if (train) metrics.push_back({"lr", 0.1 / static_cast<double>(done)});
    ASSERT_TRUE(
        run.complete(w, a->job.lease, Completion{1.0 / static_cast<double>(done), 1, metrics, 0}));
  }
  ASSERT_EQ(run.state(), RunState::kCompleted);
  ASSERT_EQ(done, 18u);  // 3 × (4 + 2)
  const auto& all = run.series().all();
  const std::vector<SeriesPoint> train = all.at({SetKind::kTrain, "loss"}).points();
  const std::vector<SeriesPoint> dev = all.at({SetKind::kDev, "loss"}).points();
  const std::vector<SeriesPoint> lr = all.at({SetKind::kTrain, "lr"}).points();
  ASSERT_EQ(train.size(), 12u);
  ASSERT_EQ(dev.size(), 6u);
  ASSERT_EQ(lr.size(), 12u);
  for (size_t i = 0; i < train.size(); ++i) {
    EXPECT_EQ(train[i].epoch, static_cast<int64_t>(i / 4));
    EXPECT_DOUBLE_EQ(train[i].value, 1.0 / static_cast<double>(train[i].n));
    EXPECT_EQ(lr[i].n, train[i].n);  // the series of one report line up
  }
  EXPECT_EQ(dev.back().n, 18u);
  const std::string bytes = RunCodec::save(run);
  auto back = RunCodec::load(series_config(), bytes, clock);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ((*back)->series().all().at({SetKind::kTrain, "lr"}).points(), lr);
  EXPECT_EQ(RunCodec::save(**back), bytes);
}

}  // namespace
}  // namespace traincoord
