#include "core/batch_order.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace traincoord {
namespace {

std::vector<uint64_t> whole_epoch(const EpochOrder& order) {
  std::vector<uint64_t> out;
  for (uint64_t p = 0; p < order.batches(); ++p) out.push_back(order.batch_at(p));
  return out;
}

TEST(EpochOrder, SequentialVisitsBatchesInOrder) {
  EpochOrder order(BatchOrder::kSequential, 10, 1, 0, SetKind::kTrain);
  for (uint64_t p = 0; p < 10; ++p) EXPECT_EQ(order.batch_at(p), p);
}

TEST(EpochOrder, ShuffledIsAPermutationForEverySize) {
  for (uint64_t n : {1u, 2u, 3u, 5u, 7u, 16u, 17u, 100u, 1000u, 4097u}) {
    EpochOrder order(BatchOrder::kShuffled, n, 42, 3, SetKind::kTrain);
    const auto batches = whole_epoch(order);
    std::set<uint64_t> seen(batches.begin(), batches.end());
    EXPECT_EQ(seen.size(), n) << "n = " << n;
    EXPECT_EQ(*seen.rbegin(), n - 1) << "n = " << n;
  }
}

TEST(EpochOrder, SameSeedAndEpochGiveTheSameOrder) {
  EpochOrder a(BatchOrder::kShuffled, 500, 9, 2, SetKind::kDev);
  EpochOrder b(BatchOrder::kShuffled, 500, 9, 2, SetKind::kDev);
  EXPECT_EQ(whole_epoch(a), whole_epoch(b));
}

TEST(EpochOrder, EpochsSetsAndSeedsGiveDifferentOrders) {
  const auto base = whole_epoch(EpochOrder(BatchOrder::kShuffled, 500, 9, 2, SetKind::kTrain));
  EXPECT_NE(base, whole_epoch(EpochOrder(BatchOrder::kShuffled, 500, 9, 3, SetKind::kTrain)));
  EXPECT_NE(base, whole_epoch(EpochOrder(BatchOrder::kShuffled, 500, 9, 2, SetKind::kDev)));
  EXPECT_NE(base, whole_epoch(EpochOrder(BatchOrder::kShuffled, 500, 10, 2, SetKind::kTrain)));
}

TEST(EpochOrder, ShuffledActuallyShuffles) {
  const auto batches = whole_epoch(EpochOrder(BatchOrder::kShuffled, 1000, 1, 0, SetKind::kTrain));
  int in_place = 0;
  for (uint64_t p = 0; p < batches.size(); ++p) in_place += batches[p] == p;
  EXPECT_LT(in_place, 20);  // a random permutation fixes about one point
}

TEST(EpochOrder, HandlesABillionBatchesWithoutStoringThem) {
  const uint64_t n = 1'000'000'000;
  EpochOrder order(BatchOrder::kShuffled, n, 5, 0, SetKind::kTrain);
  std::set<uint64_t> seen;
  for (uint64_t p = 0; p < 10000; ++p) {
    const uint64_t b = order.batch_at(p * 99991 % n);
    EXPECT_LT(b, n);
    seen.insert(b);
  }
  EXPECT_EQ(seen.size(), 10000u);
}

}  // namespace
}  // namespace traincoord
