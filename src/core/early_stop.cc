#include "core/early_stop.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace traincoord {

namespace {

std::string format(const char* fmt, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c, d);
  return buf;
}

}  // namespace

EarlyStopRule::EarlyStopRule(EarlyStopConfig config) : config_(std::move(config)) {
  if (config_.kind == EarlyStopKind::kPatience && config_.patience.baseline) {
    state_.best_value = *config_.patience.baseline;
  }
}

const std::string& EarlyStopRule::monitor() const {
  static const std::string kLoss = "loss";
  return config_.kind == EarlyStopKind::kPatience ? config_.patience.monitor : kLoss;
}

bool EarlyStopRule::stop(int64_t epoch, std::string reason) {
  state_.stopped = true;
  state_.stopped_at_epoch = epoch;
  state_.reason = std::move(reason);
  return true;
}

void EarlyStopRule::track_best(int64_t epoch, double value, bool larger_is_better) {
  if (!std::isfinite(value)) return;
  const bool better = !state_.best_epoch || std::isnan(state_.best_value) ||
                      (larger_is_better ? value > state_.best_value : value < state_.best_value);
  if (better) {
    state_.best_value = value;
    state_.best_epoch = epoch;
  }
}

bool EarlyStopRule::observe(int64_t epoch, double value, bool all_finite) {
  if (state_.stopped) return true;
  state_.observed.emplace_back(epoch, value);
  switch (config_.kind) {
    case EarlyStopKind::kNone:
      track_best(epoch, value, /*larger_is_better=*/false);
      return false;
    case EarlyStopKind::kWindow:
      return observe_window(epoch, value);
    case EarlyStopKind::kPatience:
      return observe_patience(epoch, value, all_finite);
  }
  return false;
}

bool EarlyStopRule::observe_window(int64_t epoch, double latest) {
  track_best(epoch, latest, /*larger_is_better=*/false);
  const size_t n = static_cast<size_t>(config_.window.window);
  const auto& obs = state_.observed;
  if (obs.size() < n) return false;
  // L[-n:-1]: the n-1 dev losses before the latest.
  double max = -INFINITY, sum = 0;
  bool finite = true;
  for (size_t i = obs.size() - n; i + 1 < obs.size(); ++i) {
    max = std::max(max, obs[i].second);
    sum += obs[i].second;
    finite = finite && std::isfinite(obs[i].second);
  }
  const double count = static_cast<double>(n - 1);
  double mean = sum / count;
  if (finite && !std::isfinite(sum)) {
    // Finite losses whose sum overflows (near 1.8e308): their mean, as a running mean.
    mean = 0;
    double k = 0;
    for (size_t i = obs.size() - n; i + 1 < obs.size(); ++i) {
      k += 1;
      mean += obs[i].second / k - mean / k;
    }
  }
  double squares = 0;
  for (size_t i = obs.size() - n; i + 1 < obs.size(); ++i) {
    squares += (obs[i].second - mean) * (obs[i].second - mean);
  }
  double std_dev = std::sqrt(squares / count);  // population std, as numpy's default
  if (finite && !std::isfinite(squares)) {
    // Deviations past 1e154 square to inf: scale them by the largest first.
    double scale = 0;
    for (size_t i = obs.size() - n; i + 1 < obs.size(); ++i) {
      scale = std::max(scale, std::fabs(obs[i].second / 2 - mean / 2));
    }
    double scaled = 0;
    for (size_t i = obs.size() - n; i + 1 < obs.size(); ++i) {
      const double d = (obs[i].second / 2 - mean / 2) / scale;
      scaled += d * d;
    }
    std_dev = 2 * scale * std::sqrt(scaled / count);  // may be inf: a std past 1.8e308
  }
  if (latest > max) {
    return stop(epoch, format("dev loss %.6g rose above the maximum %.6g of the %.0f before it",
                              latest, max, count));
  }
  if (std::fabs(latest - mean) < config_.window.mean_threshold &&
      std_dev < config_.window.std_threshold) {
    return stop(epoch, format("dev loss %.6g plateaued: within %.6g of the mean %.6g, std %.6g",
                              latest, config_.window.mean_threshold, mean, std_dev));
  }
  return false;
}

bool EarlyStopRule::observe_patience(int64_t epoch, double current, bool all_finite) {
  const PatienceRuleConfig& p = config_.patience;
  const bool max_mode = p.mode == MonitorMode::kMax;
  auto better = [max_mode](double a, double b) { return max_mode ? a > b : a < b; };
  const std::string& name = p.monitor;

  if (p.check_finite && (!std::isfinite(current) || !all_finite)) {
    return stop(epoch, std::isfinite(current)
                           ? "a dev job reported a non-finite loss (check_finite)"
                           : "dev " + name + " is not finite or was not reported (check_finite)");
  }
  if (!std::isfinite(current)) return false;  // nothing to compare without check_finite
  if (p.stopping_threshold && better(current, *p.stopping_threshold)) {
    track_best(epoch, current, max_mode);
    state_.wait = 0;
    return stop(epoch, "dev " + name +
                           format(" %.6g reached the stopping threshold %.6g", current,
                                  *p.stopping_threshold));
  }
  if (p.divergence_threshold && better(-current, -*p.divergence_threshold)) {
    return stop(epoch, "dev " + name +
                           format(" %.6g diverged past %.6g", current, *p.divergence_threshold));
  }
  // An improvement must beat the best (or the baseline) by more than min_delta.
  const double shifted = max_mode ? current - p.min_delta : current + p.min_delta;
  if (std::isnan(state_.best_value) || better(shifted, state_.best_value)) {
    state_.best_value = current;
    state_.best_epoch = epoch;
    state_.wait = 0;
    return false;
  }
  state_.wait += 1;
  if (state_.wait >= p.patience) {
    return stop(epoch, "dev " + name +
                           format(" did not improve by more than %.6g for %.0f dev epochs "
                                  "(best %.6g)",
                                  p.min_delta, state_.wait, state_.best_value));
  }
  return false;
}

}  // namespace traincoord
