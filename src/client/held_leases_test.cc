// When the C++ client sends a heartbeat (client/held_leases.h): only when a held lease has gone
// the interval without being renewed. Deterministic: the times are given.
#include "client/held_leases.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace traincoord::client {
namespace {

using std::chrono::milliseconds;
using TimePoint = std::chrono::steady_clock::time_point;

constexpr milliseconds kInterval{2000};
const TimePoint t0{};

TEST(HeldLeases, NothingHeldNoHeartbeat) {
  HeldLeases<> held;
  EXPECT_FALSE(held.due(kInterval));
  held.hold(7, t0);
  held.drop(7);
  EXPECT_FALSE(held.due(kInterval));
}

// A worker on jobs shorter than the interval: each job's lease comes fresh with it and is
// dropped when completed, so no heartbeat is ever due while it works.
TEST(HeldLeases, AJobShorterThanTheIntervalIsNeverDueForAHeartbeat) {
  HeldLeases<> held;
  TimePoint now = t0;
  for (uint64_t lease = 1; lease <= 100; ++lease) {
    held.hold(lease, now);      // the acquire's (or complete-and-next's) reply
    now += milliseconds(1500);  // trains
    ASSERT_GT(*held.due(kInterval), now) << "lease " << lease;
    held.drop(lease);  // completed with the request for the next one
  }
}

// A lease held longer than the interval is due an interval after its hand-out, then an interval
// after each heartbeat; a heartbeat lists and renews every held lease.
TEST(HeldLeases, ALongJobIsDueEveryIntervalFromItsLastRenewal) {
  HeldLeases<> held;
  held.hold(1, t0);
  held.hold(2, t0 + milliseconds(500));
  EXPECT_EQ(*held.due(kInterval), t0 + kInterval);  // the oldest decides
  const TimePoint beat = t0 + kInterval;
  EXPECT_EQ(held.renew_all(beat), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(*held.due(kInterval), beat + kInterval);
  held.drop(1);
  held.hold(3, beat + milliseconds(100));
  EXPECT_EQ(*held.due(kInterval), beat + kInterval);  // 2 was renewed first
  held.clear();
  EXPECT_FALSE(held.due(kInterval));
}

}  // namespace
}  // namespace traincoord::client
