// Early stopping: decides after each dev epoch whether training should stop.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/run_config.h"

namespace traincoord {

// The part of a run's state that early stopping owns; it survives a restart with the run.
struct EarlyStopState {
  std::vector<std::pair<int64_t, double>> observed;  // (epoch, monitored value), oldest first
  double best_value = std::numeric_limits<double>::quiet_NaN();
  std::optional<int64_t> best_epoch;  // the epoch whose checkpoint a worker should keep
  int wait = 0;                       // patience: dev epochs since the last improvement
  bool stopped = false;
  std::optional<int64_t> stopped_at_epoch;
  std::string reason;  // why it stopped, in words
};

class EarlyStopRule {
 public:
  // REQUIRES: validate() accepted the run config holding `config`.
  explicit EarlyStopRule(EarlyStopConfig config);

  // Feeds the result of the dev epoch after train epoch `epoch`: `value` is the monitored
  // value (the dev loss, or the metric the patience rule monitors; NaN when not reported), and
  // `all_finite` is false when some job of the epoch reported a non-finite loss.
  // Returns true when training should stop now. After a stop it returns true again without
  // changing anything, so a late dev result can never end a run twice.
  bool observe(int64_t epoch, double value, bool all_finite);

  const EarlyStopState& state() const { return state_; }
  // Restores the state saved with a run. REQUIRES: it came from a rule of the same kind.
  void restore(EarlyStopState state) { state_ = std::move(state); }
  const EarlyStopConfig& config() const { return config_; }
  // The name of the value the rule looks at ("loss" or a metric name).
  const std::string& monitor() const;

 private:
  bool observe_window(int64_t epoch, double value);
  bool observe_patience(int64_t epoch, double value, bool all_finite);
  void track_best(int64_t epoch, double value, bool larger_is_better);
  bool stop(int64_t epoch, std::string reason);

  EarlyStopConfig config_;
  EarlyStopState state_;
};

}  // namespace traincoord
