// The leases a worker knows it holds, each with when it was last renewed (handed out, or listed
// in a heartbeat that went out), and when a heartbeat is due: an interval after the oldest
// renewal, not every interval whatever the worker did. A worker on jobs shorter than the
// interval gets each lease fresh with its job and completes it before a heartbeat is due, so it
// sends none: its heartbeats no longer grow the coordinator's work with the number of workers
// (issue 22, docs/PERFORMANCE.md "Many workers"). Pure: the caller gives the time. Not
// thread-safe (the worker's heartbeat mutex guards it).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace traincoord::client {

template <class Clock = std::chrono::steady_clock>
class HeldLeases {
 public:
  using TimePoint = typename Clock::time_point;

  // A lease handed out, its reply come at `now`: due for a heartbeat an interval later. (The
  // coordinator set its deadline, now + timeout in its time, when it answered: before `now`, by
  // as long as the reply took to come. The interval is a third of the timeout, so the heartbeat
  // still comes in time unless a reply took two thirds of the timeout, as with the fixed timer
  // before: that one, too, came up to an interval after a lease was taken.)
  void hold(uint64_t lease, TimePoint now) { held_.emplace_back(lease, now); }
  void drop(uint64_t lease) {
    std::erase_if(held_, [lease](const auto& h) { return h.first == lease; });
  }
  void clear() { held_.clear(); }
  bool empty() const { return held_.empty(); }

  // When the next heartbeat is due: `interval` after the oldest renewal; none while no lease is
  // held (a worker without a lease has nothing for a heartbeat to keep).
  std::optional<TimePoint> due(typename Clock::duration interval) const {
    if (held_.empty()) return std::nullopt;
    TimePoint oldest = held_.front().second;
    for (const auto& h : held_) oldest = std::min(oldest, h.second);
    return oldest + interval;
  }
  // A heartbeat goes out at `now`: every held lease is listed and renewed; returns the list.
  std::vector<uint64_t> renew_all(TimePoint now) {
    std::vector<uint64_t> leases;
    leases.reserve(held_.size());
    for (auto& h : held_) {
      leases.push_back(h.first);
      h.second = now;
    }
    return leases;
  }

 private:
  std::vector<std::pair<uint64_t, TimePoint>> held_;
};

}  // namespace traincoord::client
