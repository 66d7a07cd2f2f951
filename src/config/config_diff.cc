#include "config/config_diff.h"

#include <cmath>

namespace traincoord {

namespace {

bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }
bool same(const std::optional<double>& a, const std::optional<double>& b) {
  return a.has_value() == b.has_value() && (!a || same(*a, *b));
}
template <typename T>
bool same(const T& a, const T& b) {
  return a == b;
}

}  // namespace

std::vector<std::string> config_differences(const RunConfig& a, const RunConfig& b) {
  std::vector<std::string> out;
  auto check = [&](const char* field, const auto& x, const auto& y) {
    if (!same(x, y)) out.emplace_back(field);
  };
  check("data.train_batches", a.train_batches, b.train_batches);
  check("data.dev_batches", a.dev_batches, b.dev_batches);
  check("data.batch_size", a.batch_size, b.batch_size);
  check("data.train_samples", a.train_samples, b.train_samples);
  check("data.dev_samples", a.dev_samples, b.dev_samples);
  check("data.order", a.order, b.order);
  check("data.seed", a.seed, b.seed);
  check("schedule.gpus_per_worker", a.gpus_per_worker, b.gpus_per_worker);
  check("schedule.iters_per_worker", a.iters_per_worker, b.iters_per_worker);
  check("schedule.replicas_to_agg", a.replicas_to_agg, b.replicas_to_agg);
  check("schedule.epochs", a.epochs, b.epochs);
  check("schedule.validation_every", a.validation_every, b.validation_every);
  check("schedule.start_step", a.start_step, b.start_step);
  check("schedule.seed_compat", a.seed_compat, b.seed_compat);
  check("schedule.overlap_epochs", a.overlap_epochs, b.overlap_epochs);
  check("leases.timeout", a.lease_timeout_ms, b.lease_timeout_ms);
  check("leases.max_attempts", a.max_attempts, b.max_attempts);
  check("leases.on_job_failure", a.on_job_failure, b.on_job_failure);
  check("leases.history", a.lease_history, b.lease_history);
  const EarlyStopConfig &x = a.early_stop, &y = b.early_stop;
  check("early_stop.rule", x.kind, y.kind);
  check("early_stop.window", x.window.window, y.window.window);
  check("early_stop.mean_threshold", x.window.mean_threshold, y.window.mean_threshold);
  check("early_stop.std_threshold", x.window.std_threshold, y.window.std_threshold);
  check("early_stop.monitor", x.patience.monitor, y.patience.monitor);
  check("early_stop.mode", x.patience.mode, y.patience.mode);
  check("early_stop.min_delta", x.patience.min_delta, y.patience.min_delta);
  check("early_stop.patience", x.patience.patience, y.patience.patience);
  check("early_stop.baseline", x.patience.baseline, y.patience.baseline);
  check("early_stop.stopping_threshold", x.patience.stopping_threshold,
        y.patience.stopping_threshold);
  check("early_stop.divergence_threshold", x.patience.divergence_threshold,
        y.patience.divergence_threshold);
  check("early_stop.check_finite", x.patience.check_finite, y.patience.check_finite);
  return out;
}

bool changeable_in_a_started_run(const std::string& field) {
  return field.rfind("early_stop.", 0) == 0 || field == "leases.timeout" ||
         field == "leases.max_attempts" || field == "leases.on_job_failure";
}

}  // namespace traincoord
