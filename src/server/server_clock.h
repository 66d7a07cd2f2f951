// The server's clock: replays recorded times while a restart replays the log, then runs on
// from the last of them, so that time never goes back across restarts and a lease that was out
// keeps the time it had left, counted from the restart. Live, it counts only the time the
// process ran (core/clock.h, RunningTime): after the process was stopped or stalled, a lease
// likewise keeps the time it had left, and its worker can heartbeat before it expires. Read by
// one thread (the engine's).
#pragma once

#include <chrono>

#include "core/clock.h"

namespace traincoord {

class ServerClock final : public Clock {
 public:
  TimeMs now() const override {
    if (replaying_ || held_) return replay_time_;
    return running_.at(base_ + std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - start_)
                                   .count());
  }
  // The engine reads the clock at least every tick (50 ms) while it runs: a longer gap between
  // two readings means the process did not run, and counts as this much only.
  static constexpr TimeMs kMaxStepMs = 250;
  // Time skipped so far because the process did not run, and how many such pauses.
  TimeMs skipped_ms() const { return running_.skipped(); }
  uint64_t pauses() const { return running_.pauses(); }
  // Holds the time still while one request is handled, so that everything it does happens at
  // one instant, the instant its log record carries; returns that instant.
  TimeMs hold() {
    const TimeMs t = now();
    held_ = true;
    replay_time_ = t;
    return t;
  }
  void release() { held_ = false; }

  // While replaying: the time of the record being replayed.
  void replay_at(TimeMs t) {
    replaying_ = true;
    replay_time_ = t;
  }
  // Live from now on, starting at `base` (the latest recorded time).
  void go_live(TimeMs base) {
    replaying_ = false;
    base_ = base;
    start_ = std::chrono::steady_clock::now();
    running_ = RunningTime(kMaxStepMs);
  }

 private:
  bool replaying_ = false;
  bool held_ = false;
  TimeMs replay_time_ = 0;
  TimeMs base_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  mutable RunningTime running_{kMaxStepMs};
};

}  // namespace traincoord
