// Brings the state a journal keeps back into an engine, at the start of `serve`, `launch` and
// `inspect`.
#pragma once

#include <string>
#include <string_view>

#include "core/engine.h"
#include "journal/journal.h"
#include "server/api.h"
#include "server/server_clock.h"

namespace traincoord {

struct RestoreReport {
  size_t runs = 0;
  size_t snapshots = 0;
  uint64_t records = 0;   // log records replayed
  TimeMs resumed_at = 0;  // the clock goes on from here
  double seconds = 0;     // how long the restore took
};

// Brings back every run the journal holds into `engine`: its snapshot (or a fresh run from its
// config), then its records replayed through `api` at the recorded times, each of which must be
// answered as it was (its status; its body too where the journal kept it), or the restore
// stops and says which. Leaves `clock` live from the latest recorded time.
// REQUIRES: `api` has no observer while this runs (and no limits: ApiLimits::none()).
Result<RestoreReport> restore_engine(Journal& journal, Engine& engine, Api& api,
                                     ServerClock& clock);

}  // namespace traincoord
