// What a run has trained: its epochs of jobs with their aggregates, the schedule of the epochs
// still to open, early stopping and the run's state. This is the part of a run that a
// checkpoint cut saves and a restore puts back (core/cut_ledger.h); Run (core/run.h) holds it
// together with the leases, the workers and the groups.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/early_stop.h"
#include "core/plan.h"
#include "core/step_plan.h"

namespace traincoord {

using WorkerId = uint32_t;
using LeaseId = uint64_t;  // issued 1, 2, 3, ... per run; 0 is never a lease

enum class RunState : uint8_t { kRunning, kCompleted, kEarlyStopped, kCancelled, kFailed };
std::string_view run_state_name(RunState state);

struct Metric {
  std::string name;
  double value = 0;
};

// What a worker reports for a finished job.
struct Completion {
  double loss = 0;       // may be non-finite: then counted and reported, never averaged in
  uint64_t samples = 0;  // the weight of the loss in the epoch's mean
  std::vector<Metric> metrics;
  // The batch's time in seconds (0: not reported). Cost-balanced step mode fits its cost model
  // from these (core/cost_model.h); other runs ignore it.
  double seconds = 0;
};

// The jobs of an epoch handed back (or, in step mode, open for their rank), in line: a deque
// whose order is part of the run's state (snapshots save it as it is). Job mode hands out from
// the front. Step mode (keyed by rank: by_rank(base, W)) hands rank r the earliest position
// queued for it (rank = (position − base) mod W), which a scan of the line found in O(n) divisions
// per acquire; keyed, each entry also sits in an ordered index by (rank, position), and in a map
// from its place in line, so that taking rank r's earliest, and removing any position, cost
// O(log n) while the line keeps its order (and the snapshot its bytes).
class JobQueue {
 public:
  bool empty() const { return size() == 0; }
  size_t size() const { return keyed() ? line_.size() : deque_.size(); }
  void push_front(uint64_t position);
  void push_back(uint64_t position);
  // Job mode (not keyed) only: the first in line. REQUIRES: !empty().
  uint64_t front() const;
  void pop_front();
  void pop_back();
  // Puts `positions` first in line, in their order.
  void insert_front(const std::vector<uint64_t>& positions);
  // Removes `position` if queued; returns whether it was.
  bool erase(uint64_t position);
  bool contains(uint64_t position) const;
  void clear();
  // Hands back the memory too (a closed epoch keeps no tracking).
  void release_memory();
  // The positions in line, first to last.
  std::vector<uint64_t> positions() const;
  template <typename F>
  void for_each(F&& f) const {
    if (keyed()) {
      for (const auto& [place, position] : line_) f(position);
    } else {
      for (uint64_t position : deque_) f(position);
    }
  }
  // Step mode: from now on keyed by rank for a layout of `ranks` ranks from job `base` (the
  // entries queued are keyed anew); ranks 0: back to a plain line.
  void by_rank(uint64_t base, uint32_t ranks);
  bool keyed() const { return ranks_ > 0; }
  // Keyed: removes and returns the earliest position queued for `rank` (nullopt: none).
  std::optional<uint64_t> take_of_rank(uint32_t rank);

 private:
  uint32_t rank_of(uint64_t position) const {
    return static_cast<uint32_t>((position - base_) % ranks_);
  }
  std::deque<uint64_t> deque_;  // not keyed
  // Keyed: the line (place -> position: places fall toward the front, grow toward the back),
  // each position's place, and the index by rank.
  std::map<int64_t, uint64_t> line_;
  std::unordered_map<uint64_t, int64_t> place_of_;
  std::set<std::pair<uint32_t, uint64_t>> of_rank_;
  int64_t front_place_ = 0, back_place_ = 0;  // the next place at each end
  uint64_t base_ = 0;
  uint32_t ranks_ = 0;
};

// A step-mode epoch's steps as they stand (Epoch::step_counts).
struct StepCounts {
  uint64_t planned = 0;            // steps of its layout (since step_base)
  uint64_t done = 0;               // steps whose every batch is resolved (done or failed)
  uint64_t batches_in_flight = 0;  // batches under a live lease
  uint64_t batches_queued = 0;     // batches open for their rank: given back, or of a step begun
};

// One epoch of one set, as opened by the run.
struct Epoch {
  EpochPlan plan;
  uint64_t set_batches = 0;
  TimeMs opened_at = 0;
  std::optional<TimeMs> closed_at;

  uint64_t done = 0;    // jobs completed
  uint64_t failed = 0;  // jobs given up after max_attempts (skip policy)
  uint64_t leased = 0;  // jobs under a live lease now
  std::vector<uint64_t> failed_jobs;

  // Aggregates of the counted completions, kept as running means rather than sums: a mean of
  // finite values never leaves their range, where a sum of loss * samples overflows to inf
  // (a loss of 1e300 over 2^53 samples). Sample counts saturate at 2^64 - 1, never wrap.
  double weighted_loss = 0;  // sample-weighted mean of the finite losses (over `samples`)
  uint64_t samples = 0;      // sum of samples over finite losses
  double plain_loss = 0;     // plain mean of the finite losses (over `finite_jobs`)
  uint64_t finite_jobs = 0;
  uint64_t nonfinite_jobs = 0;
  struct MetricSum {  // the running means of one named metric, as those of the loss
    std::string name;
    double weighted = 0;  // sample-weighted mean of its finite values
    uint64_t samples = 0;
    double plain = 0;  // plain mean of its finite values (over `count`)
    uint64_t count = 0;
  };
  std::vector<MetricSum> metrics;
  double loss = 0;  // the epoch loss; set when it closes (NaN when no job loss was finite)

  uint64_t next_index = 0;  // the compatibility next_index counter of this epoch

  bool closed() const { return closed_at.has_value(); }
  uint64_t open_jobs() const { return (plan.end_job - cursor) + requeue.size(); }
  uint64_t resolved() const { return done + failed; }
  // The mean of a named metric over the epoch's counted completions (NaN when none).
  double metric(std::string_view name, bool sample_weighted) const;
  // Folds a report (of a whole job, or of the part of one a cut saved) into the aggregates: a
  // finite loss into the means and finite_jobs, a non-finite one into nonfinite_jobs only; each
  // metric likewise. Counts no job as done.
  void fold_report(const Completion& completion);

  // Tracking of the jobs still in play; O(jobs in flight), never O(epoch size). A job at a
  // position below `cursor` that is not in `active` has been resolved (done or failed).
  struct ActiveJob {
    uint32_t handouts = 0;         // how often the job was handed out
    uint32_t failures = 0;         // attempts that expired or were reported failed
    LeaseId live = 0;              // its live lease, or 0
    std::vector<LeaseId> expired;  // expired leases whose late completion may still win
  };
  uint64_t cursor = 0;  // next position never handed out
  JobQueue requeue;     // positions handed back, re-handed from the front (step mode: by rank)
  std::unordered_map<uint64_t, ActiveJob> active;
  // Jobs partly trained before a restore: position -> batches of the job already in the model
  // (and in the aggregates above). A hand-out of such a job covers only the batches after them.
  // Only active jobs have an entry.
  std::map<uint64_t, uint64_t> trained;

  // Step mode (schedule.mode = "steps"): the epoch's jobs are the batches of its steps, one
  // per rank per step (core/step_plan.h, StepLayout). `ranks` = 0: not laid out yet (the
  // group's world size is not known), or a job-mode epoch. The jobs [step_base, end_job) are
  // the layout's batches, job step_base + k·W + r being rank r's batch of step k; the jobs
  // before step_base were resolved under an earlier layout (a restore at another world size
  // lays out what was left). `segment`: the positions of the epoch's sample order the layout
  // covers (empty: all of them).
  uint32_t ranks = 0;
  uint64_t step_base = 0;
  std::vector<PositionRun> segment;
  bool steps() const { return ranks > 0; }
  // The counts of its layout's steps; all 0 when not laid out. O(jobs in flight).
  StepCounts step_counts() const;
  // Cost-balanced step mode (RunConfig::cost_balanced): `segment` holds sample indices (the
  // samples the layout covers) rather than positions, and the steps are plan_epoch_steps's (or
  // plan_rest_of_epoch's, for a segment short of the whole set) with the cost and speeds below,
  // frozen when the epoch was laid out: the run's fitted cost model then (rescaled to the
  // budget's units), or the declared cost and every rank alike. The plan is a pure function of
  // them, the segment and the config; `cost_plan` caches it (never saved; rebuilt on demand).
  BatchCost plan_cost{0, 0, 0};
  std::vector<double> plan_speeds;  // one per rank, or empty: every rank alike
  // The warm-up re-plan (docs/SEMANTICS.md, "Cost-balanced step mode"): a layout planned with
  // the declared cost (plan_speeds empty) is re-planned once, at the first hand-out after the
  // cost model is fitted for its ranks with every rank's speed (Run::take_step_job). The steps
  // begun then (those before `cursor`: their batches in flight or queued stay with their ranks)
  // stay as planned, with `first_cost` and every rank alike; the samples of the steps never
  // begun are planned anew (plan_rest_of_epoch) with the cost and speeds frozen then, which
  // plan_cost and plan_speeds hold from then on. `replanned_after`: the steps kept (0: not
  // re-planned, or re-planned before any step was begun: plan_cost plans the whole layout).
  // A new layout (a restore at another world size) clears it.
  uint64_t replanned_after = 0;
  BatchCost first_cost{0, 0, 0};
  mutable std::shared_ptr<const StepPlan> cost_plan;
  // Fixed-batch step mode: the layout of `segment` for `ranks` ranks and the segment's index, a
  // pure function of them and the run's batch size. Cached (never saved; Run::fixed_steps_of
  // builds it) and dropped wherever they change (Run::lay_out) or the epoch closes.
  struct FixedSteps {
    StepLayout layout;
    EpochSegment segment;
  };
  mutable std::shared_ptr<const FixedSteps> fixed_steps;
};

// The part of a run's state a cut saves and a restore puts back: what was trained (epochs and
// their aggregates), the schedule, early stopping and the run's state. Leases are not part of
// it: at a cut, every job in flight is open again (its partly trained batches excepted).
struct RunProgress {
  RunState state = RunState::kRunning;
  std::string state_reason;
  EarlyStopState early_stop;
  std::vector<Epoch> epochs;
  std::vector<uint32_t> running;
  std::deque<uint32_t> dev_to_judge;
  int64_t next_epoch = 0;
  bool next_is_dev = false;
  std::optional<uint32_t> latest_of_set[2];
};

}  // namespace traincoord
