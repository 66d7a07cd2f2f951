// The server's clock: replays recorded times while a restart replays the log, then runs on
// from the last of them, so that time never goes back across restarts and a lease that was out
// keeps the time it had left, counted from the restart.
#pragma once

#include <chrono>

#include "core/clock.h"

namespace traincoord {

class ServerClock final : public Clock {
 public:
  TimeMs now() const override {
    if (replaying_ || held_) return replay_time_;
    return base_ + std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::steady_clock::now() - start_)
                       .count();
  }
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
  }

 private:
  bool replaying_ = false;
  bool held_ = false;
  TimeMs replay_time_ = 0;
  TimeMs base_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace traincoord
