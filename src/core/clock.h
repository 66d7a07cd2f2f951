// Time for the core: injected, so that a simulation can run a week in a second.
#pragma once

#include <cstdint>

namespace traincoord {

// Milliseconds on a monotonic time line. The core never reads a real clock.
using TimeMs = int64_t;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimeMs now() const = 0;
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
