#include "core/sample_order.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidjson/document.h>

namespace traincoord {
namespace {

std::vector<uint64_t> whole_epoch(const SampleOrder& order, int64_t epoch) {
  std::vector<uint64_t> out;
  for (uint64_t b = 0; b < order.batches(); ++b) order.batch(epoch, b, &out);
  return out;
}

TEST(SampleOrder, EveryEpochHoldsEverySampleExactlyOnce) {
  for (uint64_t n : {1u, 2u, 3u, 5u, 17u, 64u, 65u, 1437u, 10'000u}) {
    const SampleOrder order(n, 32, 9, SetKind::kTrain, SampleShuffle::kEpoch);
    for (int64_t epoch : {0, 1, 2}) {
      std::vector<uint64_t> all = whole_epoch(order, epoch);
      std::sort(all.begin(), all.end());
      std::vector<uint64_t> expected(n);
      std::iota(expected.begin(), expected.end(), 0);
      EXPECT_EQ(all, expected) << n << " samples, epoch " << epoch;
    }
  }
}

TEST(SampleOrder, EpochShuffleChangesBatchMembershipFixedKeepsItNoneKeepsTheDataOrder) {
  const SampleOrder epochs(1000, 10, 1, SetKind::kTrain, SampleShuffle::kEpoch);
  const SampleOrder fixed(1000, 10, 1, SetKind::kTrain, SampleShuffle::kFixed);
  const SampleOrder none(1000, 10, 1, SetKind::kTrain, SampleShuffle::kNone);
  EXPECT_NE(whole_epoch(epochs, 0), whole_epoch(epochs, 1));
  EXPECT_EQ(whole_epoch(fixed, 0), whole_epoch(fixed, 5));
  std::vector<uint64_t> batch;
  none.batch(3, 7, &batch);
  EXPECT_EQ(batch, (std::vector<uint64_t>{70, 71, 72, 73, 74, 75, 76, 77, 78, 79}));
  const SampleOrder dev(1000, 10, 1, SetKind::kDev, SampleShuffle::kEpoch);
  EXPECT_NE(whole_epoch(epochs, 0), whole_epoch(dev, 0));
}

TEST(SampleOrder, TheLastBatchIsShortAndNeverEmpty) {
  const SampleOrder order(10, 4, 0, SetKind::kTrain, SampleShuffle::kEpoch);
  ASSERT_EQ(order.batches(), 3u);
  std::vector<uint64_t> last;
  order.batch(0, 2, &last);
  EXPECT_EQ(last.size(), 2u);
}

// The Python client (python/traincoord/order.py) must agree to the last sample: both read
// the same vectors.
TEST(SampleOrder, MatchesTheSharedVectorsThePythonClientChecksToo) {
  std::ifstream in(TRAINCOORD_SOURCE_DIR "/tests/vectors/sample_order.json");
  ASSERT_TRUE(in) << "tests/vectors/sample_order.json is missing";
  std::stringstream text;
  text << in.rdbuf();
  rapidjson::Document doc;
  doc.Parse(text.str().c_str());
  ASSERT_FALSE(doc.HasParseError());
  size_t checked = 0;
  for (const auto& c : doc["cases"].GetArray()) {
    const std::string shuffle = c["shuffle"].GetString();
    const SampleShuffle kind = shuffle == "epoch"   ? SampleShuffle::kEpoch
                               : shuffle == "fixed" ? SampleShuffle::kFixed
                                                    : SampleShuffle::kNone;
    const SetKind set =
        std::string(c["set"].GetString()) == "train" ? SetKind::kTrain : SetKind::kDev;
    const SampleOrder order(c["samples"].GetUint64(), c["batch_size"].GetUint64(),
                            c["seed"].GetUint64(), set, kind);
    std::vector<uint64_t> got;
    order.batch(c["epoch"].GetInt64(), c["batch"].GetUint64(), &got);
    const auto& expected = c["expected"].GetArray();
    got.resize(std::min<size_t>(got.size(), expected.Size()));
    std::vector<uint64_t> want;
    for (const auto& v : expected) want.push_back(v.GetUint64());
    EXPECT_EQ(got, want) << "case " << checked;
    ++checked;
  }
  EXPECT_GT(checked, 300u);
}

}  // namespace
}  // namespace traincoord
