// How an epoch becomes steps (issue 32): a synchronous group of W ranks (DDP, FSDP) takes one
// batch per rank per step, and every step is an all-reduce over all of them. This file plans
// one epoch of a set, or the rest of one, into steps. Pure and deterministic: the same inputs
// always give the same plan, on every machine.
//
// The promises, for every plan (step_plan_test.cc checks each):
// - a step is one batch for each of the W ranks: every rank gets the same number of steps;
// - every sample of the epoch (or of the rest given) is in exactly one batch: none is repeated
//   or dropped to even the counts out (as DistributedSampler pads by repeating);
// - every batch holds at least one sample, except when the epoch has fewer samples than ranks
//   (N < W): then it is one step, in which ranks 0 … N−1 get one sample each and ranks N … W−1
//   an empty batch with loss scale 0 (they still join the step's all-reduce, with a zero
//   gradient, so no rank waits on a collective that never comes). An epoch of no sample is no
//   step;
// - each batch carries its loss scale n_rank · W / n_step: with DDP averaging the W gradients,
//   the step's gradient is then the mean over the step's samples, whatever the batch sizes.
//
// Two ways to form batches:
// - fixed batch size B (today's semantics): the epoch's order is SampleOrder's seeded order
//   (the same as a job's batches in the job model); step k takes the next W·B samples, rank r
//   the r-th run of B of them. The last step splits what is left evenly (sizes differ by at
//   most one); when fewer than W are left, the ranks short of a sample take one each from the
//   step before (whose batches keep at least one), so that step and the last have fewer than B
//   in some batches. With B = 1 and fewer than W left, the last samples join the step before
//   (two in some of its batches).
// - cost-balanced: each sample has a length, and a batch's padded cost (BatchCost: a + b·n·L +
//   c·n·L², n samples padded to the longest, L) times its rank's speed factor must stay within
//   the batch budget (the budget is the batch time at the fastest rank's speed). Samples are
//   bucketed by length (fit_buckets: boundaries fitted to the lengths, a bucket's longest sample
//   costing at most 1 + 2·max_padding times its shortest, but each bucket holding at least
//   min_batches batches' worth), shuffled within their bucket every epoch (SampleOrder's seeded
//   order of the epoch), and each step picks a bucket at random, weighted by the samples it has
//   left (seeded by the seed and the epoch: shuffled across buckets too). The step's pool is
//   the next samples of that bucket (then of the nearest buckets, shorter first, when it runs
//   dry), as many as the step could take; sorted longest first, they are dealt to the W ranks
//   either in runs (rank 0 fills its batch to the budget, then rank 1, ...: each batch a run of
//   near-equal lengths, which pads little) or each to the rank whose batch would then take the
//   least time (better for batches of a few long samples, and for the epoch's last step),
//   whichever gives the step more useful cost per unit of its time. So the W batches of a step
//   take near-equal predicted time, and a rank twice as slow gets about half the samples. What
//   the step does not take stays first in its bucket. A sample that costs more than its rank's
//   budget alone is a batch of its own. When the last step cannot give every rank a sample, the
//   ranks short of one take one each from the latest step with a batch of two or more (the
//   last step itself first: it may have dealt all it had to some ranks); when no
//   step has one, the last step's samples join the step before it, over budget.
//
// Memory and time: a plan holds every sample index of the epoch (O(samples)); a cost-balanced
// plan deals each sample in O(W). Planning 20,000 samples for 8 ranks takes a few milliseconds.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/cost_model.h"
#include "core/error.h"
#include "core/plan.h"

namespace traincoord {

// Length buckets: bucket i holds the lengths in (upper[i-1], upper[i]]; the first starts at 0.
struct LengthBuckets {
  std::vector<double> upper;  // ascending; the last is the longest length of the set
  size_t bucket_of(double length) const;
};

struct BucketOptions {
  // The padding to aim at: a bucket's longest sample costs at most 1 + 2·max_padding times its
  // shortest (a batch of samples spread evenly over the bucket then pads about max_padding).
  double max_padding = 0.01;
  // The most buckets; when the lengths need more, max_padding is relaxed until they fit.
  size_t max_buckets = 128;
  // A bucket holds at least this many batches' worth of samples (so that a step rarely has to
  // mix buckets), except the last.
  double min_batches = 8;
};

// Boundaries fitted to `lengths` under `cost` (a bucket's width in cost, not in length: with a
// quadratic cost, long samples need narrower buckets). `budget` sizes min_batches.
LengthBuckets fit_buckets(std::span<const double> lengths, const BatchCost& cost, double budget,
                          const BucketOptions& options);

struct StepPlanConfig {
  uint32_t ranks = 1;  // W
  uint64_t seed = 0;   // data.seed: the same seed gives the same plan
  SetKind set = SetKind::kTrain;
  // > 0: fixed batch size mode. 0: cost-balanced mode (lengths, batch_budget and cost needed).
  uint64_t batch_size = 0;
  double batch_budget = 0;  // the most padded cost of a batch at speed 1
  BatchCost cost;
  // Each rank's time factor (2: twice as slow as a rank of 1; divided by the smallest, so the
  // fastest is 1 and the budget is its batch time); empty: every rank alike.
  std::vector<double> speeds;
  BucketOptions buckets;
};

// One rank's batch of one step.
struct RankBatch {
  std::vector<uint64_t> samples;  // sample indices of the set
  double loss_scale = 0;          // n_rank · W / n_step; 0 for an empty batch
  double longest = 0;             // the longest length (cost-balanced mode; 0 otherwise)
  double predicted = 0;           // speed × padded cost (cost-balanced mode; 0 otherwise)
  BatchShape shape() const { return {samples.size(), longest}; }
  bool operator==(const RankBatch&) const = default;
};

struct Step {
  std::vector<RankBatch> batches;  // one per rank
  uint64_t samples() const;
  bool operator==(const Step&) const = default;
};

struct StepPlan {
  int64_t epoch = 0;
  uint32_t ranks = 0;
  std::vector<Step> steps;
  size_t buckets = 0;  // cost-balanced mode: the buckets the lengths were fitted to
  uint64_t samples() const;
  bool operator==(const StepPlan&) const = default;
};

// Checks a config against the set: ranks >= 1 and at most 2^20; fixed mode needs nothing more;
// cost-balanced mode needs one finite length >= 0 per sample, a finite budget > 0, a cost with
// finite coefficients >= 0 and b + c > 0, one finite speed > 0 per rank (or none). Returns
// kInvalidArgument naming the field (ranks, batch_size, batch_budget, cost, speeds, lengths).
Result<void> check_step_config(const StepPlanConfig& config, uint64_t samples,
                               std::span<const double> lengths);

// Parses one length per line (a finite number >= 0; '#' starts a comment), naming the line of
// the first bad one (field "lengths"). `source` names the text in messages (a file path).
Result<std::vector<double>> parse_lengths(std::string_view text, std::string_view source);

// The lengths as text, one per line, each printed exactly ("%.17g": parse_lengths reads back
// the same doubles); and the XXH3 64-bit hash of that text: the checksum a run keeps with its
// lengths (the same on every machine).
std::string lengths_text(std::span<const double> lengths);
uint64_t lengths_checksum(std::span<const double> lengths);

// The steps of epoch `epoch` of a set of `samples` samples (`lengths[i]` the length of sample i;
// empty in fixed mode). REQUIRES: check_step_config passed.
StepPlan plan_epoch_steps(const StepPlanConfig& config, uint64_t samples,
                          std::span<const double> lengths, int64_t epoch);

// The rest of epoch `epoch`: the steps for `config.ranks` ranks (W', which may differ from the
// W the epoch began with: a restore at another world size) of the samples in `untrained` only
// (each once, any order). The order stays the epoch's: in fixed mode the untrained samples in
// the epoch's order; in cost-balanced mode the epoch's shuffle restricted to them. The same
// untrained set gives the same plan. REQUIRES: check_step_config passed; untrained holds
// distinct samples < samples.
StepPlan plan_rest_of_epoch(const StepPlanConfig& config, uint64_t samples,
                            std::span<const double> lengths, int64_t epoch,
                            std::span<const uint64_t> untrained);

// What a cost-balanced plan predicts (the figures of docs/PERFORMANCE.md, before any step is
// timed): `straggling` S, the mean over its steps of the slowest batch's predicted time (speed ×
// padded cost) ÷ the mean of the step's W batches' (1: every rank's batch takes as long; steps
// of no predicted time are left out); `padding` P, 1 − the samples' own cost (BatchCost::sample)
// ÷ the padded work computed (a batch's padded cost less its overhead a). With no step, S = 1
// and P = 0. O(samples + steps · W).
struct PlanFigures {
  double straggling = 1;
  double padding = 0;
};
PlanFigures predicted_figures(const StepPlan& plan, const BatchCost& cost,
                              std::span<const double> lengths);

// ---- the steps a run hands out (fixed batch size; core/run.h, step mode) ----

// A run in step mode never holds a plan: an epoch's steps are a pure function of how many
// samples are left to lay out (m), the batch size (B) and the group's ranks (W), computed per
// batch handed out. The m samples are *places* 0 … m−1 (the epoch's seeded order, or the rest
// of it after a restore at another world size: EpochSegment maps places to positions of that
// order). The layout is plan_fixed's, tail evened out as plan_epoch_steps does:
// step k < steps() − 2 holds places [(k·W + r)·B, +B) for rank r; only the last two steps are
// computed whole (O(W·B)), so a hand-out costs O(B) but near the epoch's end.
class StepLayout {
 public:
  // REQUIRES: b >= 1, w >= 1.
  StepLayout(uint64_t m, uint64_t b, uint32_t w);
  uint64_t places() const { return m_; }
  uint32_t ranks() const { return w_; }
  uint64_t steps() const { return steps_; }
  // Appends the places of rank `rank`'s batch of step `step`. REQUIRES: step < steps().
  void batch(uint64_t step, uint32_t rank, std::vector<uint64_t>* out) const;
  // The samples of step `step`, all ranks together.
  uint64_t step_samples(uint64_t step) const;
  // n_rank · W / n_step of that batch (0 for an empty one).
  double loss_scale(uint64_t step, uint32_t rank) const;
  // The places of the steps from `step` on: returns p such that they are [p, places()) and
  // the places appended to `listed` (those of steps in the evened-out tail, when `step` is
  // one of them; then p = places()).
  uint64_t first_place_from(uint64_t step, std::vector<uint64_t>* listed) const;

 private:
  uint64_t m_, b_;
  uint32_t w_;
  uint64_t steps_ = 0;
  uint64_t regular_ = 0;    // steps [0, regular_) are full and untouched by the tail
  std::vector<Step> tail_;  // the steps from regular_ on, places and all
};

// Which positions of an epoch's order a layout's places stand for: ascending, disjoint,
// non-adjacent runs (the whole epoch: one run).
struct PositionRun {
  uint64_t first = 0;
  uint64_t count = 0;
};
class EpochSegment {
 public:
  EpochSegment() = default;
  explicit EpochSegment(std::vector<PositionRun> runs);
  const std::vector<PositionRun>& runs() const { return runs_; }
  uint64_t places() const { return places_; }
  // The position of place `place`. REQUIRES: place < places().
  uint64_t position(uint64_t place) const;
  // Appends the positions of places [first, end) as runs. REQUIRES: first <= end <= places().
  void runs_of_places(uint64_t first, uint64_t end, std::vector<PositionRun>* out) const;
  // Positions (any order, each once) as ascending, merged runs.
  static std::vector<PositionRun> runs_of(std::vector<uint64_t> positions);
  // Disjoint runs in any order, sorted and merged where they touch.
  static std::vector<PositionRun> merged(std::vector<PositionRun> runs);

 private:
  std::vector<PositionRun> runs_;
  std::vector<uint64_t> starts_;  // the place of each run's first position
  uint64_t places_ = 0;
};

}  // namespace traincoord
