// The real clock, for the server: monotonic milliseconds since the server started.
#pragma once

#include <chrono>

#include "core/clock.h"

namespace traincoord {

class SteadyClock final : public Clock {
 public:
  SteadyClock() : start_(std::chrono::steady_clock::now()) {}
  TimeMs now() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace traincoord
