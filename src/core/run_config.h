// The configuration of one training run, as the core sees it (already parsed).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/cost_model.h"
#include "core/enum_names.h"
#include "core/error.h"

namespace traincoord {

// Each enum of the config with its names, as the config file and the API spell them, in the
// order of its values: the one table that naming, parsing and the config's list of choices
// read. `*_name` returns the name of a value; `parse_*` the value of a name, or nullopt when it
// names none.
enum class BatchOrder { kSequential, kShuffled };
inline constexpr std::array<std::string_view, 2> kBatchOrderNames = {"sequential", "shuffled"};
std::string_view batch_order_name(BatchOrder order);
std::optional<BatchOrder> parse_batch_order(std::string_view name);

// What becomes of a job that failed max_attempts times: the run fails, or the job is skipped.
enum class JobFailurePolicy { kFailRun, kSkip };
inline constexpr std::array<std::string_view, 2> kJobFailurePolicyNames = {"fail_run", "skip"};
std::string_view job_failure_policy_name(JobFailurePolicy policy);
std::optional<JobFailurePolicy> parse_job_failure_policy(std::string_view name);

// How a run hands its epochs out (config key schedule.mode): as jobs to whichever worker asks
// (independent workers; the original coordinator's semantics), or as steps to a synchronous
// group (DDP, FSDP): one batch per rank per step, every rank the same number of steps
// (core/step_plan.h; docs/SEMANTICS.md, "Step mode"). kAuto (the default): steps when the
// config allows them (check_steps) and the first worker to ask for work is a rank of a group,
// jobs otherwise (Run::mode; docs/SEMANTICS.md, "Which mode a run takes").
enum class ScheduleMode { kJobs, kSteps, kAuto };
inline constexpr std::array<std::string_view, 3> kScheduleModeNames = {"jobs", "steps", "auto"};
std::string_view schedule_mode_name(ScheduleMode mode);
std::optional<ScheduleMode> parse_schedule_mode(std::string_view name);

// The early-stop rule (config key early_stop.rule).
enum class EarlyStopKind { kNone, kWindow, kPatience };
inline constexpr std::array<std::string_view, 3> kEarlyStopKindNames = {"none", "window",
                                                                        "patience"};
std::string_view early_stop_kind_name(EarlyStopKind kind);
std::optional<EarlyStopKind> parse_early_stop_kind(std::string_view name);

// Whether the patience rule's monitored value improves downwards or upwards.
enum class MonitorMode { kMin, kMax };
inline constexpr std::array<std::string_view, 2> kMonitorModeNames = {"min", "max"};
std::string_view monitor_mode_name(MonitorMode mode);
std::optional<MonitorMode> parse_monitor_mode(std::string_view name);

// The original coordinator's rule: stop when the latest dev loss exceeds the maximum of the
// previous n-1, or when it is within mean_threshold of their mean while their std is below
// std_threshold.
struct WindowRuleConfig {
  int window = 4;  // n, the number of dev losses looked at; at least 2
  double mean_threshold = 0.5;
  double std_threshold = 0.5;
};

// The Keras / Lightning EarlyStopping rule.
struct PatienceRuleConfig {
  std::string monitor = "loss";  // "loss" or the name of a metric that dev completions report
  MonitorMode mode = MonitorMode::kMin;
  double min_delta = 0.0;  // at least 0
  int patience = 3;        // at least 1
  std::optional<double> baseline;
  std::optional<double> stopping_threshold;
  std::optional<double> divergence_threshold;
  bool check_finite = true;
};

struct EarlyStopConfig {
  EarlyStopKind kind = EarlyStopKind::kNone;
  WindowRuleConfig window;
  PatienceRuleConfig patience;
};

struct RunConfig {
  std::string name;

  // Sizes of the sets, in batches.
  uint64_t train_batches = 0;
  uint64_t dev_batches = 0;
  uint64_t batch_size = 0;  // optional (0: unknown); only used to report samples
  // The sizes in samples when the config gave them (0: not given): clients check theirs.
  uint64_t train_samples = 0;
  uint64_t dev_samples = 0;

  BatchOrder order = BatchOrder::kShuffled;
  uint64_t seed = 0;

  int gpus_per_worker = 1;   // G
  int iters_per_worker = 1;  // I
  int replicas_to_agg = 1;   // R
  int64_t epochs = 1;        // E; negative: |E| more than the start epoch
  int validation_every = 1;  // V; 0: never validate
  uint64_t start_step = 0;   // S, the global step of a loaded checkpoint

  bool seed_compat = false;     // reproduce the original coordinator exactly
  bool overlap_epochs = false;  // start the next epoch while stragglers finish
  // Steps need the sizes in samples and the batch size, one batch per job (G = I = R = 1),
  // and the default semantics (no seed_compat, no overlap, no start_step: a step-mode run
  // resumes from its cuts).
  ScheduleMode mode = ScheduleMode::kAuto;
  // Cost-balanced step mode (schedule.batch_budget > 0, instead of data.batch_size): each
  // sample has a length (data.train_lengths / data.dev_lengths: one per sample of the set,
  // kept with the run's config, [lengths] in the stored text), and a batch's padded cost under
  // `cost` (schedule.cost_a/b/c; default a 0, b 1, c 0: the padded length n·L, max_tokens-style)
  // stays within `batch_budget` (core/step_plan.h). The cost model fitted from the batch times
  // the ranks report reshapes the batches of the epochs planned after it is fitted
  // (docs/SEMANTICS.md, "Cost-balanced step mode").
  double batch_budget = 0;
  BatchCost cost{0, 1, 0};
  std::vector<double> train_lengths;
  std::vector<double> dev_lengths;
  uint64_t train_lengths_xxh64 = 0;  // the checksum of each (the config layer computes them)
  uint64_t dev_lengths_xxh64 = 0;
  // Cost-balanced step mode: the rest of an epoch laid out with the declared cost is re-planned
  // once the cost model has every rank's speed (Run::warm_up). False for a run whose config was
  // stored by a build before that rule (stored formats "toml", "toml/2", "json", "json/2":
  // parse_stored_run_config): its journal replays as the build that wrote it answered. Not a
  // config key; a config stored since ("toml/3", "json/3", and "toml/4", "json/4") has it, a
  // change of config too.
  bool warm_up_replan = true;
  // Cost-balanced step mode: the cost model's fit keeps the declared cost's shape where the
  // reports cannot tell it apart, and judges a rank's first reports at speed 1
  // (CostModelOptions::prior, ::judge_first_reports_at_speed_1). False for a run whose config
  // was stored before that rule (formats "toml/3", "json/3" and older): its journal replays as
  // the build that wrote it answered. Not a config key, as warm_up_replan.
  bool declared_shape_fit = true;
  // A batch budget makes an auto run a step-mode run (cost-balanced batches are planned in steps).
  bool cost_balanced() const { return mode != ScheduleMode::kJobs && batch_budget > 0; }

  int64_t lease_timeout_ms = 60'000;
  int max_attempts = 3;
  JobFailurePolicy on_job_failure = JobFailurePolicy::kFailRun;

  EarlyStopConfig early_stop;

  // How many resolved leases are remembered to answer repeated completions with their
  // original outcome (and to catch another worker's lease). Older ones are answered as stale.
  uint32_t lease_history = 1u << 16;

  // Complete checkpoint cuts kept (config key cuts.keep): the oldest beyond them are dropped.
  uint32_t keep_cuts = 5;
};

// Returns the first problem with `config`, naming its field, or nothing when it is valid.
Result<void> validate(const RunConfig& config);

// What step mode needs of a config (data.batch_size or schedule.batch_budget, the sets' sizes
// in samples, one batch per job, none of seed_compat, overlap_epochs, start_step): the first
// thing missing, naming its field. validate() requires it of a config in step mode.
Result<void> check_steps(const RunConfig& config);

// The mode a new run of `config` starts in: kSteps or kJobs when the config says so (a batch
// budget is steps); for kAuto, kJobs when check_steps fails, else kAuto (the first acquire
// decides: Run::mode). REQUIRES: validate(config) succeeded.
ScheduleMode initial_mode(const RunConfig& config);

// A run's name: 1 to 128 of the ASCII letters, digits, '-', '_' and '.', not starting with '.'.
// The name is a path segment (/v1/runs/NAME) and part of a file name (its token file), so
// '.', '..', '/', and look-alikes that differ only by Unicode normalisation cannot be one.
// Returns an invalid_argument error naming `field` otherwise.
Result<void> validate_run_name(std::string_view name, const char* field = "name");

}  // namespace traincoord
