// A run's series (docs/OBSERVABILITY.md, "Series"): the loss of every counted completion and
// each metric it reported (e.g. lr, accuracy), per set, for the whole run, in a bounded and
// representative sample — the curve a user looks at first, kept after its epoch closed, across
// restarts (snapshots keep it) and however long the run.
//
// Downsampling: a series keeps every stride-th of its values (the 1st, the (stride+1)-th, ...);
// when it holds kCapacity points it drops every other one and doubles its stride, so it spans
// the whole run evenly with kCapacity / 2 to kCapacity points, and it always shows its latest
// value too. Deterministic (no random reservoir, unlike TensorBoard's): a replay keeps the same
// points. Memory is bounded by kCapacity points per series and kMaxNames series per set.
//
// Points are numbered by the completion that reported them: `n` is its place among the run's
// counted completions (counters.completions_accepted when it was counted), so points of every
// series line up, and a reader asks for what came after the last `n` it has. A restore of a cut
// keeps the points of the lineage it abandons (the series are the reports as they came; the
// epochs' aggregates are the restored lineage's). Pure: no clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/plan.h"
#include "core/run_progress.h"

namespace traincoord {

struct SeriesPoint {
  uint64_t n = 0;     // the completion's number in the run (1, 2, ...)
  int64_t epoch = 0;  // the epoch of its set it belongs to
  double value = 0;
  bool operator==(const SeriesPoint&) const = default;
};

class Series {
 public:
  static constexpr size_t kCapacity = 1024;

  // Adds the value of completion `n` (n above every n added before). Non-finite values are
  // not kept (they are counted in the epoch's nonfinite_jobs).
  void add(uint64_t n, int64_t epoch, double value);
  // The kept points, oldest first, then the latest value when the stride did not keep it.
  std::vector<SeriesPoint> points() const;
  // The kept points after completion `after` (not the latest value: latest_unkept()).
  std::vector<SeriesPoint> kept_after(uint64_t after) const;
  // The latest value when the stride did not keep it (a poll shows it until the next one).
  std::optional<SeriesPoint> latest_unkept() const;
  uint64_t stride() const { return stride_; }
  uint64_t count() const { return count_; }  // finite values added

  // For RunCodec: the state as it is, and back.
  const std::vector<SeriesPoint>& kept() const { return kept_; }
  const std::optional<SeriesPoint>& latest() const { return latest_; }
  // REQUIRES: the parts of a series saved by kept()/latest()/stride()/count() (checked by the
  // codec with consistent()).
  static Series restored(std::vector<SeriesPoint> kept, std::optional<SeriesPoint> latest,
                         uint64_t stride, uint64_t count);
  // Whether these parts make a series add() could have built (empty: yes; else what is wrong).
  static std::string consistent(const std::vector<SeriesPoint>& kept,
                                const std::optional<SeriesPoint>& latest, uint64_t stride,
                                uint64_t count);

 private:
  std::vector<SeriesPoint> kept_;  // values 1, 1 + stride, 1 + 2·stride, ... of this series
  std::optional<SeriesPoint> latest_;
  uint64_t stride_ = 1;
  uint64_t count_ = 0;
};

// The series of a run: per set, "loss" and one per metric name reported (at most kMaxNames per
// set; a name beyond them is not kept, and counted in dropped_names()).
class RunSeries {
 public:
  RunSeries() = default;
  RunSeries(const RunSeries&) = delete;  // (loss_ points into series_)
  RunSeries& operator=(const RunSeries&) = delete;
  RunSeries(RunSeries&&) = default;
  RunSeries& operator=(RunSeries&&) = default;

  static constexpr size_t kMaxNames = 64;
  using Key = std::pair<SetKind, std::string>;

  // Completion number `n` of an epoch `epoch` of set `set` was counted.
  void add(SetKind set, int64_t epoch, uint64_t n, const Completion& c);
  const std::map<Key, Series>& all() const { return series_; }
  uint64_t dropped_names() const { return dropped_names_; }

  // For RunCodec: series as saved (empty: fine; else what is wrong with them).
  static std::string consistent(const std::map<Key, Series>& series);
  static RunSeries restored(std::map<Key, Series> series, uint64_t dropped_names);

 private:
  Series* find_or_add(SetKind set, const std::string& name);

  std::map<Key, Series> series_;
  // The "loss" series of each set, found once (a map's nodes stay put, also when it moves;
  // a lookup per completion was 8% of the core's job cycle).
  Series* loss_[2] = {nullptr, nullptr};
  size_t names_[2] = {0, 0};  // series per set
  uint64_t dropped_names_ = 0;
};

}  // namespace traincoord
