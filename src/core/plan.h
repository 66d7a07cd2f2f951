// The planning formulas: how a run's sets split into epochs of jobs. Pure functions.
// docs/SEMANTICS.md states the same rules for users; keep the two in step.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/run_config.h"

namespace traincoord {

enum class SetKind : uint8_t { kTrain = 0, kDev = 1 };
std::string_view set_name(SetKind set);

struct Plan {
  uint64_t batches_per_job = 0;   // G * max(1, I)
  uint64_t batches_per_step = 0;  // G * max(1, R)
  uint64_t steps_per_epoch = 0;   // max(1, train_batches // batches_per_step)
  int64_t start_epoch = 0;        // S // steps_per_epoch
  uint64_t jobs_trained = 0;      // jobs of the start epoch a checkpoint already covers
  uint64_t train_jobs_per_epoch = 0;
  uint64_t dev_jobs_per_epoch = 0;  // 0 when there is no dev set
  int64_t target_epoch = 0;         // the configured target (E, or start_epoch + |E|)
  // Training opens the train epochs [start_epoch, end_epoch). end_epoch == target_epoch, except
  // in seed_compat when the checkpoint's jobs use up the last epoch: the original counted the
  // jobs left over all epochs and opened no epoch once none was left.
  int64_t end_epoch = 0;
  bool trains = false;            // total_train_jobs > 0 (so end_epoch > start_epoch)
  uint64_t total_train_jobs = 0;  // over all epochs still to train
  uint64_t dev_epochs = 0;        // dev epochs that follow the train epochs still to train
  uint64_t total_dev_jobs = 0;    // dev_epochs * dev_jobs_per_epoch
};

// The most jobs a run may plan (train and dev together): every count the coordinator reports
// then stays exact in a double (JSON readers, the dashboard, Prometheus).
inline constexpr uint64_t kMaxPlannedJobs = uint64_t{1} << 53;

// The plan of `config`, or kInvalidArgument naming the field when its numbers cannot be planned
// (an epoch number past 2^63 - 1, more than kMaxPlannedJobs jobs). validate() calls it last.
// REQUIRES: the field-by-field checks of validate() passed (sizes, G, I, R within their bounds).
Result<Plan> plan_of(const RunConfig& config);

// REQUIRES: validate(config) succeeded. Never fails; asserts the plan's invariants.
Plan make_plan(const RunConfig& config);

// Jobs that cover `batches` at `batches_per_job` each. seed_compat: max(1, floor) (the last,
// partial job's batches are dropped); otherwise ceil (the last job may be shorter).
uint64_t jobs_for(uint64_t batches, uint64_t batches_per_job, bool seed_compat);

// Whether a dev epoch follows train epoch `epoch`: V > 0 and (V == 1 or e > 0) and e % V == 0.
bool validates_after(int validation_every, int64_t epoch);

// The jobs [first_job, end_job) of one epoch of one set that a run hands out.
struct EpochPlan {
  int64_t epoch = 0;
  SetKind set = SetKind::kTrain;
  uint64_t first_job = 0;
  uint64_t end_job = 0;
  uint64_t size() const { return end_job - first_job; }
};

// The train epoch `epoch` of the run; at least one job. REQUIRES: start_epoch <= epoch <
// end_epoch. Default mode: the start epoch skips the jobs a checkpoint already trained.
// seed_compat: every epoch is whole except the last, which the resumed remainder shortens.
EpochPlan train_epoch_plan(const Plan& plan, const RunConfig& config, int64_t epoch);

// The dev epoch that follows train epoch `epoch`, if validation is due then.
std::optional<EpochPlan> dev_epoch_plan(const Plan& plan, const RunConfig& config, int64_t epoch);

// The batch positions [first, first + count) in the epoch's order that job `job` covers.
struct BatchSpan {
  uint64_t first = 0;
  uint64_t count = 0;
};
BatchSpan job_batches(uint64_t set_batches, uint64_t batches_per_job, uint64_t job);

}  // namespace traincoord
