// Dates for the replies: the coordinator's clock (core/clock.h, server/server_clock.h) counts the
// time its process ran, not dates, so a date is read as the wall clock now less the running
// time since (docs/OBSERVABILITY.md, "The loss history").
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/clock.h"

namespace traincoord {

// The system's wall clock: milliseconds since the Unix epoch.
class UnixClock final : public Clock {
 public:
  TimeMs now() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

// The wall clock now: `wall`'s reading, or the system's when it is null.
inline TimeMs wall_now(const Clock* wall) { return wall ? wall->now() : UnixClock().now(); }

// `unix_ms` (milliseconds since the Unix epoch) as ISO 8601 in UTC, to the millisecond:
// "2026-12-07T00:15:55.123Z".
inline std::string iso8601_utc(int64_t unix_ms) {
  using namespace std::chrono;
  const sys_time<milliseconds> t{milliseconds(unix_ms)};
  const sys_days day = floor<days>(t);
  const year_month_day ymd(day);
  const hh_mm_ss<milliseconds> hms(t - day);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d.%03dZ",
                static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()), static_cast<int>(hms.hours().count()),
                static_cast<int>(hms.minutes().count()), static_cast<int>(hms.seconds().count()),
                static_cast<int>(hms.subseconds().count()));
  return buf;
}

}  // namespace traincoord
