#include "core/run_config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>

#include "core/plan.h"
#include "core/step_plan.h"
#include "core/user_text.h"

namespace traincoord {

namespace {

Result<void> require(bool ok, const char* field, std::string message) {
  if (ok) return {};
  return invalid_argument(field, std::string(field) + ": " + message);
}

}  // namespace

std::string_view batch_order_name(BatchOrder order) { return enum_name(kBatchOrderNames, order); }
std::optional<BatchOrder> parse_batch_order(std::string_view name) {
  return parse_enum<BatchOrder>(kBatchOrderNames, name);
}

std::string_view job_failure_policy_name(JobFailurePolicy policy) {
  return enum_name(kJobFailurePolicyNames, policy);
}
std::optional<JobFailurePolicy> parse_job_failure_policy(std::string_view name) {
  return parse_enum<JobFailurePolicy>(kJobFailurePolicyNames, name);
}

std::string_view schedule_mode_name(ScheduleMode mode) {
  return enum_name(kScheduleModeNames, mode);
}
std::optional<ScheduleMode> parse_schedule_mode(std::string_view name) {
  return parse_enum<ScheduleMode>(kScheduleModeNames, name);
}

std::string_view early_stop_kind_name(EarlyStopKind kind) {
  return enum_name(kEarlyStopKindNames, kind);
}
std::optional<EarlyStopKind> parse_early_stop_kind(std::string_view name) {
  return parse_enum<EarlyStopKind>(kEarlyStopKindNames, name);
}

std::string_view monitor_mode_name(MonitorMode mode) { return enum_name(kMonitorModeNames, mode); }
std::optional<MonitorMode> parse_monitor_mode(std::string_view name) {
  return parse_enum<MonitorMode>(kMonitorModeNames, name);
}

Result<void> validate_run_name(std::string_view name, const char* field) {
  if (auto r = require(!name.empty(), field, "a run needs a name"); !r) return r;
  if (auto r = require(name.size() <= 128, field, "at most 128 characters"); !r) return r;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
    if (!ok) {
      return invalid_argument(
          field, std::string(field) + ": use ASCII letters, digits, '-', '_' and '.' only");
    }
  }
  return require(name.front() != '.', field, "must not start with '.'");
}

Result<void> check_steps(const RunConfig& c) {
  if (c.cost_balanced()) {
    if (auto r = require(c.batch_size == 0, "data.batch_size",
                         "give data.batch_size (fixed batches) or schedule.batch_budget "
                         "(cost-balanced batches), not both");
        !r)
      return r;
    for (auto [samples, batches, lengths, field] :
         {std::tuple{c.train_samples, c.train_batches, &c.train_lengths, "data.train_lengths"},
          std::tuple{c.dev_samples, c.dev_batches, &c.dev_lengths, "data.dev_lengths"}}) {
      if (samples == 0 && batches == 0 && lengths->empty()) continue;
      if (auto r = require(samples >= 1 && batches == samples, field,
                           "cost-balanced step mode needs the set's size in samples");
          !r)
        return r;
      if (auto r =
              require(lengths->size() == samples, field,
                      std::to_string(lengths->size()) + " lengths for " + std::to_string(samples) +
                          " samples: give one length per sample of the set");
          !r)
        return r;
      StepPlanConfig step;
      step.batch_budget = c.batch_budget;
      step.cost = c.cost;
      if (auto r = check_step_config(step, samples, *lengths); !r) {
        Error e = r.error();
        if (e.field == "lengths") {
          e.field = field;
        } else {
          e.field = e.field == "cost" ? "schedule.cost_b" : "schedule." + e.field;
        }
        const size_t colon = e.message.find(": ");
        e.message =
            e.field + ": " + (colon == std::string::npos ? e.message : e.message.substr(colon + 2));
        return tl::unexpected(e);
      }
    }
  } else {
    if (auto r = require(c.batch_size >= 1, "data.batch_size",
                         "schedule.mode = \"steps\" hands out one batch per rank per step: give "
                         "the batch size (samples per batch), or schedule.batch_budget for "
                         "cost-balanced batches");
        !r)
      return r;
  }
  {
    const char* why = "schedule.mode = \"steps\" hands out one batch per rank per step";
    for (auto [samples, batches, field] :
         {std::tuple{c.train_samples, c.train_batches, "data.train_samples"},
          std::tuple{c.dev_samples, c.dev_batches, "data.dev_samples"}}) {
      if (batches == 0 && samples == 0) continue;
      if (auto r =
              require(samples >= 1, field, std::string(why) + ": give the set's size in samples");
          !r)
        return r;
      if (c.cost_balanced()) continue;  // (checked above)
      if (auto r = require((samples + c.batch_size - 1) / c.batch_size == batches, field,
                           std::to_string(samples) + " samples in batches of " +
                               std::to_string(c.batch_size) + " make " +
                               std::to_string((samples + c.batch_size - 1) / c.batch_size) +
                               " batches, not " + std::to_string(batches));
          !r)
        return r;
    }
    if (auto r = require(
            c.gpus_per_worker == 1 && c.iters_per_worker <= 1 && c.replicas_to_agg <= 1,
            "schedule.gpus_per_worker",
            std::string(why) + ": gpus_per_worker, iters_per_worker and replicas_to_agg must be 1");
        !r)
      return r;
    if (auto r = require(!c.seed_compat, "schedule.seed_compat",
                         std::string(why) + ", which the original coordinator did not");
        !r)
      return r;
    if (auto r = require(!c.overlap_epochs, "schedule.overlap_epochs",
                         std::string(why) + ": every rank moves to the next epoch together");
        !r)
      return r;
    if (auto r = require(c.start_step == 0, "schedule.start_step",
                         std::string(why) + ": resume it from a checkpoint cut instead");
        !r)
      return r;
  }

  return {};
}

ScheduleMode initial_mode(const RunConfig& c) {
  if (c.mode == ScheduleMode::kSteps || c.cost_balanced()) return ScheduleMode::kSteps;
  if (c.mode == ScheduleMode::kJobs || !check_steps(c)) return ScheduleMode::kJobs;
  return ScheduleMode::kAuto;
}

Result<void> validate(const RunConfig& c) {
  if (auto r = validate_run_name(c.name); !r) return r;
  if (auto r = require(c.train_batches >= 1, "data.train_batches",
                       "the training set must hold at least one batch");
      !r)
    return r;
  // The bounds below are those of docs/CONFIG.md. Within them no count of planning overflows
  // (see plan_of), and a batch index stays far below 2^64.
  constexpr uint64_t kMaxBatches = uint64_t{1} << 50;
  if (auto r = require(c.train_batches <= kMaxBatches, "data.train_batches",
                       "at most 2^50 batches (" + std::to_string(kMaxBatches) + ")");
      !r)
    return r;
  if (auto r = require(c.dev_batches <= kMaxBatches, "data.dev_batches",
                       "at most 2^50 batches (" + std::to_string(kMaxBatches) + ")");
      !r)
    return r;
  if (auto r = require(c.gpus_per_worker >= 1 && c.gpus_per_worker <= (1 << 16),
                       "schedule.gpus_per_worker", "must be between 1 and 65536");
      !r)
    return r;
  if (auto r = require(c.iters_per_worker >= 0 && c.iters_per_worker <= (1 << 20),
                       "schedule.iters_per_worker", "must be between 0 and 2^20 (0 counts as 1)");
      !r)
    return r;
  if (auto r = require(c.replicas_to_agg >= 0 && c.replicas_to_agg <= (1 << 20),
                       "schedule.replicas_to_agg", "must be between 0 and 2^20 (0 counts as 1)");
      !r)
    return r;
  if (auto r = require(c.start_step <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                       "schedule.start_step", "must be at most 2^63 - 1");
      !r)
    return r;
  if (auto r = require(c.validation_every >= 0, "schedule.validation_every",
                       "must not be negative (0 turns validation off)");
      !r)
    return r;
  if (auto r = require(c.validation_every == 0 || c.dev_batches >= 1, "data.dev_batches",
                       "validation_every > 0 needs a dev set of at least one batch");
      !r)
    return r;
  if (auto r = require(c.lease_timeout_ms >= 1 && c.lease_timeout_ms <= 604'800'000,
                       "leases.timeout", "must be between 0.001 and 604800 seconds");
      !r)
    return r;
  if (auto r = require(c.max_attempts >= 1, "leases.max_attempts", "must be at least 1"); !r)
    return r;
  if (auto r = require(c.lease_history >= 1 && c.lease_history <= (1u << 26), "leases.history",
                       "must be between 1 and 2^26");
      !r)
    return r;
  if (auto r = require(c.keep_cuts >= 1 && c.keep_cuts <= 1000, "cuts.keep",
                       "must be between 1 and 1000");
      !r)
    return r;
  if (auto r = require(c.epochs >= -1'000'000 && c.epochs <= 1'000'000, "schedule.epochs",
                       "must be between -1000000 and 1000000");
      !r)
    return r;

  if (auto r =
          require(c.batch_budget == 0 || c.mode != ScheduleMode::kJobs, "schedule.batch_budget",
                  "cost-balanced batches are planned in steps: set schedule.mode = \"steps\"");
      !r)
    return r;
  if (auto r = require((c.train_lengths.empty() && c.dev_lengths.empty()) || c.cost_balanced(),
                       "data.train_lengths",
                       "lengths are used by cost-balanced step mode only: set "
                       "schedule.batch_budget (and schedule.mode = \"steps\")");
      !r)
    return r;
  if (c.mode == ScheduleMode::kSteps || c.cost_balanced()) {
    if (auto r = check_steps(c); !r) return r;
  }

  const EarlyStopConfig& es = c.early_stop;
  if (es.kind != EarlyStopKind::kNone) {
    if (auto r = require(c.validation_every > 0, "early_stop.rule",
                         "early stopping needs validation (set validation_every > 0)");
        !r)
      return r;
  }
  if (es.kind == EarlyStopKind::kWindow) {
    if (auto r = require(es.window.window >= 2, "early_stop.window",
                         "must be at least 2: the rule compares the latest dev loss with the "
                         "window - 1 before it");
        !r)
      return r;
    if (auto r = require(std::isfinite(es.window.mean_threshold) && es.window.mean_threshold >= 0,
                         "early_stop.mean_threshold", "must be a finite number >= 0");
        !r)
      return r;
    if (auto r = require(std::isfinite(es.window.std_threshold) && es.window.std_threshold >= 0,
                         "early_stop.std_threshold", "must be a finite number >= 0");
        !r)
      return r;
  }
  // Shown back (status, /metrics): text, whatever the rule.
  if (!es.patience.monitor.empty()) {
    if (auto r = validate_text("early_stop.monitor", es.patience.monitor, 64); !r) return r;
  }
  if (es.kind == EarlyStopKind::kPatience) {
    const PatienceRuleConfig& p = es.patience;
    if (auto r = require(!p.monitor.empty(), "early_stop.monitor", "must name 'loss' or a metric");
        !r)
      return r;
    if (auto r = require(p.patience >= 1, "early_stop.patience", "must be at least 1"); !r)
      return r;
    if (auto r = require(std::isfinite(p.min_delta) && p.min_delta >= 0, "early_stop.min_delta",
                         "must be a finite number >= 0");
        !r)
      return r;
    auto finite_if_set = [](const std::optional<double>& v) { return !v || std::isfinite(*v); };
    if (auto r = require(finite_if_set(p.baseline), "early_stop.baseline", "must be finite"); !r)
      return r;
    if (auto r = require(finite_if_set(p.stopping_threshold), "early_stop.stopping_threshold",
                         "must be finite");
        !r)
      return r;
    if (auto r = require(finite_if_set(p.divergence_threshold), "early_stop.divergence_threshold",
                         "must be finite");
        !r)
      return r;
  }
  // Last: what the fields plan together (an epoch number or a job count too large to count).
  if (auto plan = plan_of(c); !plan) return tl::unexpected(plan.error());
  return {};
}

}  // namespace traincoord
