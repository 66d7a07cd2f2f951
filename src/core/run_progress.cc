#include "core/run_progress.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace traincoord {

std::string_view run_state_name(RunState state) {
  switch (state) {
    case RunState::kRunning:
      return "running";
    case RunState::kCompleted:
      return "completed";
    case RunState::kEarlyStopped:
      return "early_stopped";
    case RunState::kCancelled:
      return "cancelled";
    case RunState::kFailed:
      return "failed";
  }
  return "unknown";
}

double Epoch::metric(std::string_view name, bool sample_weighted) const {
  for (const MetricSum& m : metrics) {
    if (m.name != name) continue;
    if (sample_weighted && m.samples > 0) return m.weighted;
    if (m.count > 0) return m.plain;
  }
  return std::nan("");
}

namespace {

// Folds the finite `x` into the running mean `mean` of finite values with weight `fraction` (its
// share of the total weight so far, in (0, 1]). The result is a convex combination of the two,
// so it stays within the range of what was folded in: no overflow to inf, whatever the
// magnitudes (x - mean alone may overflow when both are huge and of opposite signs).
double fold(double mean, double x, double fraction) {
  const double step = x - mean;
  const double next =
      std::isfinite(step) ? mean + step * fraction : mean * (1 - fraction) + x * fraction;
  // The last rounding of a value at the edge of the range may not tip it over.
  return std::clamp(next, -std::numeric_limits<double>::max(), std::numeric_limits<double>::max());
}

// Adds `samples` to a count that saturates at 2^64 - 1; returns the weight share of `samples`.
double add_samples(uint64_t* total, uint64_t samples) {
  const double fraction =
      static_cast<double>(samples) / (static_cast<double>(*total) + static_cast<double>(samples));
  *total = samples > std::numeric_limits<uint64_t>::max() - *total
               ? std::numeric_limits<uint64_t>::max()
               : *total + samples;
  return fraction;
}

}  // namespace

void Epoch::fold_report(const Completion& c) {
  if (std::isfinite(c.loss)) {
    if (c.samples > 0)
      weighted_loss = fold(weighted_loss, c.loss, add_samples(&samples, c.samples));
    finite_jobs += 1;
    plain_loss = fold(plain_loss, c.loss, 1.0 / static_cast<double>(finite_jobs));
  } else {
    nonfinite_jobs += 1;
  }
  for (const Metric& m : c.metrics) {
    auto it = std::find_if(metrics.begin(), metrics.end(),
                           [&](const MetricSum& s) { return s.name == m.name; });
    if (it == metrics.end()) {
      metrics.push_back(MetricSum{m.name, 0, 0, 0, 0});
      it = std::prev(metrics.end());
    }
    if (!std::isfinite(m.value)) continue;
    if (c.samples > 0)
      it->weighted = fold(it->weighted, m.value, add_samples(&it->samples, c.samples));
    it->count += 1;
    it->plain = fold(it->plain, m.value, 1.0 / static_cast<double>(it->count));
  }
}

}  // namespace traincoord
