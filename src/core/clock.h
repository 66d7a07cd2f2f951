// Time for the core: injected, so that a simulation can run a week in a second.
#pragma once

#include <algorithm>
#include <cstdint>

namespace traincoord {

// Milliseconds on a monotonic time line. The core never reads a real clock.
using TimeMs = int64_t;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimeMs now() const = 0;
};

// The time a process ran, from readings of a clock that also runs while the process does not
// (a SIGSTOP, a stalled VM, a machine too loaded to schedule it). A reader that looks at least
// every `max_step` (the server's tick looks every 50 ms) sees the readings' time; a reading more
// than `max_step` after the one before moves on by `max_step` only, and the rest is skipped.
// So the coordinator's own pause is not counted against its leases: a worker could not have
// heartbeated while the coordinator was stopped, and each lease keeps the time it had left when
// the coordinator stopped, as across a restart (docs/DURABILITY.md). Pure; deterministic.
class RunningTime {
 public:
  // REQUIRES: max_step >= 1.
  explicit RunningTime(TimeMs max_step) : max_step_(max_step) {}

  // The running time at reading `raw`. The first reading starts it at `raw`; a reading below the
  // one before counts as no time (running time never goes back).
  TimeMs at(TimeMs raw) {
    if (!started_) {
      started_ = true;
      last_raw_ = now_ = raw;
      return now_;
    }
    const TimeMs gap = raw > last_raw_ ? raw - last_raw_ : 0;
    last_raw_ = std::max(last_raw_, raw);
    if (gap > max_step_) {
      skipped_ += gap - max_step_;
      pauses_ += 1;
      now_ += max_step_;
    } else {
      now_ += gap;
    }
    return now_;
  }
  TimeMs max_step() const { return max_step_; }
  TimeMs skipped() const { return skipped_; }  // time not counted, over every pause
  uint64_t pauses() const { return pauses_; }  // readings that found a gap over max_step

 private:
  TimeMs max_step_;
  bool started_ = false;
  TimeMs last_raw_ = 0;
  TimeMs now_ = 0;
  TimeMs skipped_ = 0;
  uint64_t pauses_ = 0;
};

// A clock that moves only when told to: for tests and simulations.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(TimeMs start = 0) : now_(start) {}
  TimeMs now() const override { return now_; }
  void advance(TimeMs delta) { now_ += delta; }
  void set(TimeMs t) { now_ = t; }

 private:
  TimeMs now_;
};

}  // namespace traincoord
