// Puts the server's state changes into the durable store: the log of requests, created runs,
// and accepted completions; and brings them back on restart.
#pragma once

#include <string>
#include <string_view>

#include "core/engine.h"
#include "server/api.h"
#include "server/server_clock.h"
#include "store/store.h"

namespace traincoord {

// Feeds the store what the API reports (created runs, accepted completions).
class StoreObserver final : public ApiObserver {
 public:
  explicit StoreObserver(Store& store) : store_(store) {}
  void run_created(const Run& run, std::string_view config_json, TimeMs now) override;
  void completion_accepted(const Run& run, WorkerId worker, LeaseId lease,
                           const Completed& completed, const Completion& completion,
                           TimeMs now) override;

 private:
  Store& store_;
};

struct RestoreReport {
  size_t runs = 0;
  size_t snapshots = 0;
  uint64_t records = 0;   // log records replayed
  TimeMs resumed_at = 0;  // the clock goes on from here
  double seconds = 0;     // how long the restore took
};

// Brings back every run the store holds into `engine`: its snapshot (or a fresh run from its
// config), then the log replayed through `api` at the recorded times. Leaves `clock` live from
// the latest recorded time. REQUIRES: `api` has no observer while this runs.
Result<RestoreReport> restore_engine(Store& store, Engine& engine, Api& api, ServerClock& clock);

}  // namespace traincoord
