// The server's clock: replays recorded times while a restart replays the log, then runs on
// from the last of them, so that time never goes back across restarts and a lease that was out
// keeps the time it had left, counted from the restart. Live, it counts only the time the
// process ran (core/clock.h, RunningTime): after the process was stopped or stalled, a lease
// likewise keeps the time it had left, and its worker can heartbeat before it expires. Read by
// one thread (the engine's). Its source is the steady clock, or one given (a manual clock, in
// the server's simulation tests).
#pragma once

#include <chrono>

#include "core/clock.h"

namespace traincoord {

class ServerClock final : public Clock {
 public:
  // `source` (null: the steady clock) must outlive the clock.
  explicit ServerClock(const Clock* source = nullptr) : source_(source), start_ms_(source_now()) {}

  TimeMs now() const override {
    if (replaying_ || held_) return replay_time_;
    const TimeMs running = running_now();
    return frozen_ ? frozen_at_ : running - frozen_for_;
  }
  // Stops time for the runs (leases, long-poll deadlines) while the server cannot take the
  // calls that would keep them alive (its disk is full: every worker's report is refused), and
  // goes on from where it stopped: no lease expires for the time its worker could not report.
  void freeze() {
    if (frozen_) return;
    frozen_at_ = now();
    frozen_ = true;
  }
  void thaw() {
    if (!frozen_) return;
    frozen_ = false;
    frozen_for_ = running_now() - frozen_at_;
  }
  bool frozen() const { return frozen_; }
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
    start_ms_ = source_now();
    running_ = RunningTime(kMaxStepMs);
    frozen_ = false;
    frozen_for_ = 0;
  }

 private:
  TimeMs source_now() const {
    if (source_) return source_->now();
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  TimeMs running_now() const { return running_.at(base_ + (source_now() - start_ms_)); }

  bool replaying_ = false;
  bool frozen_ = false;
  TimeMs frozen_at_ = 0;   // now() when frozen
  TimeMs frozen_for_ = 0;  // running time spent frozen, in all (not counted)
  bool held_ = false;
  TimeMs replay_time_ = 0;
  TimeMs base_ = 0;
  const Clock* source_;
  TimeMs start_ms_;  // source_now() when it went live
  mutable RunningTime running_{kMaxStepMs};
};

}  // namespace traincoord
