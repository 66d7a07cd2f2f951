// The run's state as the JSON replies show it: its status (GET /v1/runs/{run}), its summary (a
// row of GET /v1/runs), its epochs, its checkpoint cuts and its rendezvous. Pure: each renders
// from the run's state at `now` (the engine's clock) and changes nothing. docs/API.md documents
// the fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "core/clock.h"
#include "core/run.h"
#include "json/json_writer.h"

namespace traincoord {

// The status lists the latest `epochs` epochs (GET /v1/runs/{run}?epochs=N), and early
// stopping's latest kObservedShown observations: a status a dashboard polls every second stays a
// few kB however long the run (a run of 20,000 epochs listed them all: 5 MB). The others are
// paged by GET .../epochs and GET .../history.
constexpr uint64_t kEpochsShown = 100;
constexpr uint64_t kMaxEpochsShown = 1000;
constexpr size_t kObservedShown = 100;
// The ranks a step-mode status lists one by one (the run's `steps.ranks`).
constexpr size_t kRanksShown = 64;

// The run's jobs by state, and its pace since its first epoch opened.
struct Progress {
  uint64_t planned = 0, done = 0, failed = 0, running = 0, open = 0;
  double rate_per_s = 0;
  std::optional<double> eta_s;  // while the run trains and has a pace
};

Progress progress_of(const Run& run, TimeMs now);

// A step-mode run's steps, as an object (the status's "steps"): per set, the steps of its latest
// epoch laid out (planned, done, batches in flight and queued, what its plan was made with and
// predicts), and each rank's pace (the first kRanksShown ranks).
void write_steps(JsonWriter& j, const Run& run);
// The run's config, as an object.
void write_config(JsonWriter& j, const RunConfig& c);
// How long epoch `e` was open, from opening to closing on the coordinator's clock, in seconds;
// none while it is open. The epochs' `duration_s` (here and in the history).
std::optional<double> epoch_duration_s(const Epoch& e);
// One epoch, as an object (the status's "current" and "epochs", GET .../epochs). Its dates
// ("opened_at", "closed_at": ISO 8601 UTC) are `wall_now_ms`, the wall clock at `now` (ms since
// the Unix epoch), less the time since (server/wall_time.h).
void write_epoch(JsonWriter& j, const Epoch& e, TimeMs now, int64_t wall_now_ms);
// One checkpoint cut, as an object.
void write_cut(JsonWriter& j, const Cut& c, TimeMs now);
// The run's status, listing its latest `epochs_shown` epochs.
void write_status(JsonWriter& j, const Run& run, TimeMs now, uint64_t epochs_shown,
                  int64_t wall_now_ms);
// The run in a few fields (a row of GET /v1/runs, the reply to a create or a cancel).
void write_run_summary(JsonWriter& j, const Run& run, TimeMs now);
// The epochs at positions `range.first` .. `range.second` (GET .../epochs).
// REQUIRES: range.first <= range.second <= run.epochs().size().
void write_epochs_page(JsonWriter& j, const Run& run, std::pair<size_t, size_t> range, TimeMs now,
                       int64_t wall_now_ms);
// The run's rendezvous: its round, its members and nodes (never a node's secret).
void write_rendezvous(JsonWriter& j, const Rendezvous& rdzv, TimeMs now);

}  // namespace traincoord
