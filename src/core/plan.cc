#include "core/plan.h"

#include <algorithm>

namespace traincoord {

std::string_view set_name(SetKind set) { return set == SetKind::kTrain ? "train" : "dev"; }

uint64_t jobs_for(uint64_t batches, uint64_t batches_per_job, bool seed_compat) {
  TC_ASSERT(batches_per_job >= 1);
  if (seed_compat) return std::max<uint64_t>(1, batches / batches_per_job);
  return std::max<uint64_t>(1, (batches + batches_per_job - 1) / batches_per_job);
}

bool validates_after(int validation_every, int64_t epoch) {
  return validation_every > 0 && (validation_every == 1 || epoch > 0) &&
         epoch % validation_every == 0;
}

Plan make_plan(const RunConfig& c) {
  Plan p;
  const uint64_t g = static_cast<uint64_t>(c.gpus_per_worker);
  p.batches_per_job = g * static_cast<uint64_t>(std::max(1, c.iters_per_worker));
  p.batches_per_step = g * static_cast<uint64_t>(std::max(1, c.replicas_to_agg));
  p.steps_per_epoch = std::max<uint64_t>(1, c.train_batches / p.batches_per_step);
  p.start_epoch = static_cast<int64_t>(c.start_step / p.steps_per_epoch);
  p.jobs_trained = (c.start_step % p.steps_per_epoch) * p.batches_per_step / p.batches_per_job;
  p.train_jobs_per_epoch = jobs_for(c.train_batches, p.batches_per_job, c.seed_compat);
  p.dev_jobs_per_epoch =
      c.dev_batches == 0 ? 0 : jobs_for(c.dev_batches, p.batches_per_job, c.seed_compat);
  p.target_epoch = c.epochs < 0 ? p.start_epoch - c.epochs : c.epochs;
  p.trains = p.target_epoch > p.start_epoch;
  if (p.trains) {
    const uint64_t epochs = static_cast<uint64_t>(p.target_epoch - p.start_epoch);
    p.total_train_jobs = epochs * p.train_jobs_per_epoch - p.jobs_trained;
  }
  // The formulas guarantee that a checkpoint never covers a whole epoch.
  TC_ASSERT(p.jobs_trained < p.train_jobs_per_epoch || !p.trains);
  return p;
}

EpochPlan train_epoch_plan(const Plan& p, const RunConfig& c, int64_t epoch) {
  TC_ASSERT(epoch >= p.start_epoch && epoch < p.target_epoch);
  EpochPlan e{epoch, SetKind::kTrain, 0, p.train_jobs_per_epoch};
  if (c.seed_compat) {
    // The original counted the jobs left over all epochs and cut the last epoch short.
    const uint64_t before = static_cast<uint64_t>(epoch - p.start_epoch) * p.train_jobs_per_epoch;
    e.end_job = std::min(p.train_jobs_per_epoch, p.total_train_jobs - before);
  } else if (epoch == p.start_epoch) {
    e.first_job = p.jobs_trained;
  }
  return e;
}

std::optional<EpochPlan> dev_epoch_plan(const Plan& p, const RunConfig& c, int64_t epoch) {
  if (p.dev_jobs_per_epoch == 0 || !validates_after(c.validation_every, epoch)) return std::nullopt;
  return EpochPlan{epoch, SetKind::kDev, 0, p.dev_jobs_per_epoch};
}

BatchSpan job_batches(uint64_t set_batches, uint64_t batches_per_job, uint64_t job) {
  const uint64_t first = job * batches_per_job;
  if (first >= set_batches) return {set_batches, 0};
  return {first, std::min(batches_per_job, set_batches - first)};
}

}  // namespace traincoord
