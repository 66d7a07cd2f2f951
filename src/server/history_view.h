// A run's loss history (GET /v1/runs/{run}/history; docs/API.md): a row per epoch (its loss and
// metric means once closed), then a row per recent completion, as JSON, JSON lines or CSV; and
// its series (GET /v1/runs/{run}/series): every completion's loss and metrics, downsampled.
// Pure: renders from the run's state at `now` (the engine's clock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "core/clock.h"
#include "core/run.h"
#include "json/json_writer.h"

namespace traincoord {

// Which history: the epochs at positions `epochs.first` .. `epochs.second`, and the recent
// completions numbered after `jobs_after` (a completion's number is its place among the run's
// counted completions: counters.completions_accepted is the newest one's); `wall_now_ms`, the
// wall clock (ms since the Unix epoch) at `now`, dates its rows (server/wall_time.h).
// REQUIRES: epochs.first <= epochs.second <= run.epochs().size().
struct HistoryPage {
  std::pair<size_t, size_t> epochs;
  uint64_t jobs_after = 0;
  int64_t wall_now_ms = 0;
};

// The history as one JSON object: {"run", "generation", "epochs_total", "epochs_from",
// "epochs": [...], "jobs_total", "jobs": [...]}; an epoch carries its `samples` and
// `duration_s` (status_view.h's epoch_duration_s: null while open).
void write_history(JsonWriter& j, const Run& run, const HistoryPage& page, TimeMs now);
// The history as JSON lines: one object a line, each with "kind": "epoch" or "job".
std::string history_jsonl(const Run& run, const HistoryPage& page, TimeMs now);
// The history as CSV (RFC 4180): a header, then a row per epoch, then a row per recent
// completion; the `kind` column says which. One `metric.NAME` column per metric any epoch holds.
// A job row names its worker; a row's `time` (ISO 8601, UTC) and `time_ms` (since the Unix
// epoch) say when its completion was counted, or when its epoch closed (empty while open); an
// epoch row's `samples` and `duration_s` (empty while open) give its throughput.
std::string history_csv(const Run& run, const HistoryPage& page, TimeMs now);

// The run's series (GET /v1/runs/{run}/series; core/run_series.h, docs/API.md): per set, the
// loss and each metric of the counted completions, downsampled over the whole run, as
// {"run", "completions", "after", "dropped_names", "series": [{"set", "name", "stride",
// "count", "points": [[n, epoch, value], ...], "latest": [n, epoch, value] or null}]}: the kept
// points of completions numbered after `after` (a poller asks after the last n it has; a series
// whose stride changed since is asked again from 0), and the latest value when the stride did
// not keep it.
void write_series(JsonWriter& j, const Run& run, uint64_t after);
// The same as CSV (RFC 4180): set,name,n,epoch,value, a row per point (the latest one too).
std::string series_csv(const Run& run, uint64_t after);

}  // namespace traincoord
