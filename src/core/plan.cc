#include "core/plan.h"

#include <algorithm>
#include <string>

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

namespace {

// Dev epochs after the train epochs [start, end): those e with validates_after(v, e).
uint64_t dev_epochs_between(int validation_every, int64_t start, int64_t end) {
  if (validation_every <= 0 || end <= start) return 0;
  if (validation_every == 1) return static_cast<uint64_t>(end - start);
  const int64_t v = validation_every;
  const int64_t first = std::max<int64_t>(start, 1);  // V > 1 never validates after epoch 0
  if (first >= end) return 0;
  return static_cast<uint64_t>((end - 1) / v - (first - 1) / v);
}

}  // namespace

Result<Plan> plan_of(const RunConfig& c) {
  Plan p;
  const uint64_t g = static_cast<uint64_t>(c.gpus_per_worker);
  // G <= 2^16 and I, R <= 2^20 (validate): no product here can overflow.
  p.batches_per_job = g * static_cast<uint64_t>(std::max(1, c.iters_per_worker));
  p.batches_per_step = g * static_cast<uint64_t>(std::max(1, c.replicas_to_agg));
  p.steps_per_epoch = std::max<uint64_t>(1, c.train_batches / p.batches_per_step);
  // start_step <= 2^63 - 1 (validate), so the start epoch is a valid epoch number.
  p.start_epoch = static_cast<int64_t>(c.start_step / p.steps_per_epoch);
  // (S % steps) * batches_per_step <= train_batches - batches_per_step: never past the set.
  p.jobs_trained = (c.start_step % p.steps_per_epoch) * p.batches_per_step / p.batches_per_job;
  p.train_jobs_per_epoch = jobs_for(c.train_batches, p.batches_per_job, c.seed_compat);
  p.dev_jobs_per_epoch =
      c.dev_batches == 0 ? 0 : jobs_for(c.dev_batches, p.batches_per_job, c.seed_compat);
  if (c.epochs < 0) {
    // |E| <= 10^6 (validate); the start epoch may be anything up to 2^63 - 1.
    if (__builtin_add_overflow(p.start_epoch, -c.epochs, &p.target_epoch)) {
      return invalid_argument(
          "schedule.start_step",
          "schedule.start_step: " + std::to_string(c.start_step) + " puts the start epoch at " +
              std::to_string(p.start_epoch) + ", and " + std::to_string(-c.epochs) +
              " more epochs would pass the last epoch number (2^63 - 1); resume from a smaller "
              "step or give schedule.epochs as a target (>= 0)");
    }
  } else {
    p.target_epoch = c.epochs;
  }
  p.end_epoch = p.start_epoch;
  if (p.target_epoch > p.start_epoch) {
    // At most 10^6 epochs (validate) of at most 2^50 jobs: the product may pass 2^64.
    const uint64_t epochs = static_cast<uint64_t>(p.target_epoch - p.start_epoch);
    uint64_t jobs = 0;
    if (__builtin_mul_overflow(epochs, p.train_jobs_per_epoch, &jobs) || jobs > kMaxPlannedJobs) {
      return invalid_argument("schedule.epochs",
                              "schedule.epochs: " + std::to_string(epochs) + " epochs of " +
                                  std::to_string(p.train_jobs_per_epoch) +
                                  " train jobs (data.train_batches / batches per job) plan more "
                                  "than 2^53 jobs; train fewer epochs or use larger jobs");
    }
    // Default mode: jobs_trained < jobs per epoch (the ceil covers the whole set). seed_compat:
    // jobs_trained <= jobs per epoch (the floor may drop the batches the checkpoint is in).
    p.total_train_jobs = jobs - p.jobs_trained;
    // The original opened train epochs while jobs were left, each min(left, jobs per epoch).
    p.end_epoch =
        p.start_epoch + static_cast<int64_t>((p.total_train_jobs + p.train_jobs_per_epoch - 1) /
                                             p.train_jobs_per_epoch);
  }
  p.trains = p.total_train_jobs > 0;
  p.dev_epochs = p.dev_jobs_per_epoch == 0
                     ? 0
                     : dev_epochs_between(c.validation_every, p.start_epoch, p.end_epoch);
  // At most 10^6 dev epochs of at most 2^50 jobs.
  if (__builtin_mul_overflow(p.dev_epochs, p.dev_jobs_per_epoch, &p.total_dev_jobs) ||
      p.total_dev_jobs > kMaxPlannedJobs - p.total_train_jobs) {
    return invalid_argument("schedule.validation_every",
                            "schedule.validation_every: " + std::to_string(p.dev_epochs) +
                                " dev epochs of " + std::to_string(p.dev_jobs_per_epoch) +
                                " jobs (data.dev_batches / batches per job), with the " +
                                std::to_string(p.total_train_jobs) +
                                " train jobs, plan more than 2^53 jobs; validate less often, "
                                "train fewer epochs or use larger jobs");
  }
  return p;
}

Plan make_plan(const RunConfig& c) {
  auto planned = plan_of(c);
  TC_ASSERT(planned.has_value());
  const Plan& p = *planned;
  TC_ASSERT(p.jobs_trained < p.train_jobs_per_epoch ||
            (c.seed_compat && p.jobs_trained == p.train_jobs_per_epoch));
  TC_ASSERT(p.end_epoch >= p.start_epoch && p.end_epoch <= std::max(p.start_epoch, p.target_epoch));
  TC_ASSERT(p.trains == (p.end_epoch > p.start_epoch));
  TC_ASSERT(p.total_train_jobs + p.total_dev_jobs <= kMaxPlannedJobs);
  return p;
}

EpochPlan train_epoch_plan(const Plan& p, const RunConfig& c, int64_t epoch) {
  TC_ASSERT(epoch >= p.start_epoch && epoch < p.end_epoch);
  EpochPlan e{epoch, SetKind::kTrain, 0, p.train_jobs_per_epoch};
  if (c.seed_compat) {
    // The original counted the jobs left over all epochs and cut the last epoch short.
    const uint64_t before = static_cast<uint64_t>(epoch - p.start_epoch) * p.train_jobs_per_epoch;
    TC_ASSERT(before < p.total_train_jobs);
    e.end_job = std::min(p.train_jobs_per_epoch, p.total_train_jobs - before);
  } else if (epoch == p.start_epoch) {
    e.first_job = p.jobs_trained;
  }
  TC_ASSERT(e.first_job < e.end_job);
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
