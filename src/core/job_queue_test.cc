// JobQueue (core/run_progress.h): the jobs of an epoch in line. Keyed by rank (step mode), it
// hands each rank its earliest position and removes any position in O(log n), and keeps the line's
// order, which snapshots save.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "core/run_progress.h"

namespace traincoord {
namespace {

TEST(JobQueue, KeyedByRankItHandsEachRankItsEarliestPositionAndKeepsTheLine) {
  JobQueue q;
  q.by_rank(100, 4);  // rank of p: (p - 100) % 4
  q.push_back(109);   // rank 1
  q.push_back(105);   // rank 1
  q.push_front(102);  // rank 2
  q.push_back(104);   // rank 0
  q.insert_front({113, 112});
  EXPECT_EQ(q.positions(), (std::vector<uint64_t>{113, 112, 102, 109, 105, 104}));
  EXPECT_EQ(q.take_of_rank(1), 105u);  // the earliest of rank 1, wherever it is in line
  EXPECT_EQ(q.take_of_rank(3), std::nullopt);
  EXPECT_TRUE(q.erase(113));
  EXPECT_FALSE(q.erase(113));
  EXPECT_TRUE(q.contains(109));
  EXPECT_EQ(q.positions(), (std::vector<uint64_t>{112, 102, 109, 104}));
  EXPECT_EQ(q.take_of_rank(0), 104u);
  EXPECT_EQ(q.take_of_rank(0), 112u);
  EXPECT_EQ(q.size(), 2u);
  // Keyed anew for another layout, in the same order.
  q.by_rank(101, 2);
  EXPECT_EQ(q.positions(), (std::vector<uint64_t>{102, 109}));
  EXPECT_EQ(q.take_of_rank(1), 102u);
  EXPECT_EQ(q.take_of_rank(0), 109u);
  EXPECT_TRUE(q.empty());
}

TEST(JobQueue, KeyedItAnswersAsAScanOfTheLineWould) {
  std::mt19937_64 rng(11);
  JobQueue keyed;
  keyed.by_rank(7, 5);
  std::vector<uint64_t> line;  // the reference: a plain line, scanned
  for (int i = 0; i < 2000; ++i) {
    const uint64_t p = 7 + rng() % 60;
    const int op = static_cast<int>(rng() % 4);
    const bool queued = std::find(line.begin(), line.end(), p) != line.end();
    if (op == 0 && !queued) {
      keyed.push_back(p);
      line.push_back(p);
    } else if (op == 1 && !queued) {
      keyed.push_front(p);
      line.insert(line.begin(), p);
    } else if (op == 2) {
      EXPECT_EQ(keyed.erase(p), queued);
      if (queued) line.erase(std::find(line.begin(), line.end(), p));
    } else {
      const uint32_t rank = static_cast<uint32_t>(rng() % 5);
      std::optional<uint64_t> earliest;
      for (uint64_t q : line) {
        if ((q - 7) % 5 == rank && (!earliest || q < *earliest)) earliest = q;
      }
      EXPECT_EQ(keyed.take_of_rank(rank), earliest);
      if (earliest) line.erase(std::find(line.begin(), line.end(), *earliest));
    }
    ASSERT_EQ(keyed.positions(), line) << "after operation " << i;
  }
}

}  // namespace
}  // namespace traincoord
