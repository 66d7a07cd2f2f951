// `traincoord simulate --steps`: a dry run of step mode (issue 32) for a synchronous group. The
// step planner (core/step_plan.h) plans each epoch, simulated ranks "train" each batch in the
// time the true cost model says, report it, and the cost model (core/cost_model.h) is fitted
// from those reports. Prints the figures of docs/PERFORMANCE.md ("Step mode figures"): E, S, P.
// Everything is simulated and seeded: the same options give the same figures on every run.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/cost_model.h"
#include "core/error.h"
#include "core/step_plan.h"

namespace traincoord {

// Synthetic utterance durations: ln(L) ~ Normal(ln(median), sigma²), drawn again while outside
// [shortest, longest] (a truncated log-normal). The defaults are speech-like: median 6 s, mean
// ~7.5 s, a long tail up to 35 s.
struct SyntheticLengths {
  uint64_t samples = 20'000;
  double median = 6;
  double sigma = 0.7;
  double shortest = 1;
  double longest = 35;
  uint64_t seed = 1;
};
std::vector<double> synthetic_lengths(const SyntheticLengths& spec);

struct StepSimulationOptions {
  uint32_t ranks = 8;
  double batch_budget = 0;            // padded cost per batch at speed 1 (the true cost's units)
  BatchCost cost{0.5, 1, 0.05};       // the true cost of a batch at speed 1, also the declared one
  std::optional<uint32_t> slow_rank;  // this rank's batches take `slowdown` times as long
  double slowdown = 2;
  int epochs = 2;
  uint64_t seed = 1;    // data.seed of the plan, and the seed of the reporting noise
  double noise = 0.05;  // the relative noise (a normal's sigma) of the times ranks report
  // The first epoch is planned with the declared cost and every rank at speed 1; as a served
  // run does (docs/SEMANTICS.md, "the warm-up re-plan"), once the model is fitted with every
  // rank's speed, the steps after the one that fitted it are re-planned with it. false: never
  // (the first epoch planned blind throughout).
  bool warmup_replan = true;
  BucketOptions buckets;
  bool compare = false;  // also run DistributedSampler and unsynchronised bucketing
};

// The figures of a plan, with every rank's batch taking the true time (speed × padded cost; no
// noise, no all-reduce, so E_net = E here). docs/PERFORMANCE.md defines them.
struct StepFigures {
  uint64_t steps = 0;
  uint64_t samples = 0;
  double useful = 0;      // Σ over samples of their own cost at speed 1 (b·len + c·len²)
  double padded = 0;      // Σ over batches of their padded cost without the per-batch a
  double time = 0;        // Σ over steps of the slowest rank's time: the epoch's time
  double efficiency = 0;  // E = useful / (W · time)
  double straggling = 0;  // S = mean over steps of (slowest / mean rank time)
  double padding = 0;     // P = 1 − useful / padded
};
StepFigures figures_of(const StepPlan& plan, std::span<const double> lengths, const BatchCost& cost,
                       std::span<const double> slowdowns);

struct StepEpochReport {
  int64_t epoch = 0;
  StepFigures figures;
  uint64_t replanned_after = 0;  // steps after which the rest was re-planned (0: not)
  BatchCost fitted;              // the model at the end of the epoch
  std::vector<double> speeds;
  uint64_t reports = 0;
  bool has_fit = false;  // enough reports to fit the model
  // The model's relative error on this epoch's batches (true time, no noise): mean and max.
  double fit_error = 0;
  double fit_error_max = 0;
  bool exactly_once = false;  // every sample of the set trained once in the epoch
};

struct StrategyFigures {
  std::string name;
  StepFigures normal;
  std::optional<StepFigures> slowed;  // with slow_rank slowed (when one is given)
};

struct StepSimulationResult {
  uint64_t samples = 0;
  double mean_length = 0, median_length = 0, p99_length = 0, max_length = 0;
  size_t buckets = 0;
  std::vector<StepEpochReport> epochs;
  // The model's error on epoch 0's batches when the rest of epoch 0 was re-planned (the
  // warm-up re-plan; warmup_steps 0: not re-planned).
  double warmup_fit_error = 0;
  double warmup_fit_error_max = 0;
  uint64_t warmup_steps = 0;
  BatchCost warmup_fitted;  // the model then
  std::vector<double> warmup_speeds;
  // Epoch 0 as planned blind throughout (the declared cost, every rank alike: no warm-up
  // re-plan), with the same ranks' speeds.
  StepFigures first_epoch_blind;
  uint64_t fixed_batch_size = 0;  // DistributedSampler's batch size (compare)
  double duration_budget = 0;     // unsynchronised bucketing's budget of n·L (compare)
  std::vector<StrategyFigures> compare;
};

// Fails with kInvalidArgument naming the option for what no plan can take.
Result<StepSimulationResult> simulate_steps(std::span<const double> lengths,
                                            const StepSimulationOptions& options);

void print_step_report(const StepSimulationResult& result, const StepSimulationOptions& options,
                       std::ostream& out);

}  // namespace traincoord
