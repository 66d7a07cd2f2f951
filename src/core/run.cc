#include "core/run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>

#include "core/sample_order.h"

namespace traincoord {

std::string_view completion_outcome_name(CompletionOutcome outcome) {
  switch (outcome) {
    case CompletionOutcome::kAccepted:
      return "accepted";
    case CompletionOutcome::kDuplicate:
      return "duplicate";
    case CompletionOutcome::kSuperseded:
      return "superseded";
    case CompletionOutcome::kGivenUp:
      return "given_up";
    case CompletionOutcome::kJobFailed:
      return "job_failed";
    case CompletionOutcome::kStale:
      return "stale";
  }
  return "unknown";
}

std::string_view event_kind_name(EventKind kind) {
  switch (kind) {
    case EventKind::kEpochOpened:
      return "epoch_opened";
    case EventKind::kEpochClosed:
      return "epoch_closed";
    case EventKind::kLeaseExpired:
      return "lease_expired";
    case EventKind::kJobFailed:
      return "job_failed";
    case EventKind::kWorkerJoined:
      return "worker_joined";
    case EventKind::kWorkerLeft:
      return "worker_left";
    case EventKind::kEarlyStopped:
      return "early_stopped";
    case EventKind::kRunFinished:
      return "run_finished";
    case EventKind::kCutTaken:
      return "cut_taken";
    case EventKind::kRestored:
      return "restored";
    case EventKind::kGroupStarted:
      return "group_started";
    case EventKind::kConfigChanged:
      return "config_changed";
    case EventKind::kModeChosen:
      return "mode_chosen";
    case EventKind::kEpochReplanned:
      return "epoch_replanned";
  }
  return "unknown";
}

namespace {

std::string job_name(const Epoch& e, uint64_t position) {
  return "job " + std::to_string(position) + " of " + std::string(set_name(e.plan.set)) +
         " epoch " + std::to_string(e.plan.epoch);
}

}  // namespace

Run::Run(RunConfig config, const Clock& clock)
    : config_(std::move(config)),
      mode_(initial_mode(config_)),
      plan_(make_plan(config_)),
      clock_(clock),
      early_stop_(config_.early_stop),
      next_epoch_(plan_.start_epoch),
      cuts_(config_.keep_cuts, plan_.batches_per_job) {
  if (!plan_.trains) {
    if (plan_.target_epoch > plan_.start_epoch) {  // seed_compat: the checkpoint covers it all
      const int64_t epochs = plan_.target_epoch - plan_.start_epoch;
      finish(RunState::kCompleted,
             "nothing left to train: seed_compat plans " + std::to_string(epochs) + " epochs x " +
                 std::to_string(plan_.train_jobs_per_epoch) + " jobs - " +
                 std::to_string(plan_.jobs_trained) + " jobs the checkpoint (step " +
                 std::to_string(config_.start_step) + ") already trained = 0 train jobs up to " +
                 "target epoch " + std::to_string(plan_.target_epoch));
    } else {
      finish(RunState::kCompleted, "target epoch " + std::to_string(plan_.target_epoch) +
                                       " already reached (the checkpoint is at epoch " +
                                       std::to_string(plan_.start_epoch) + ")");
    }
    return;
  }
  open_next_epoch();
}

uint64_t Run::planned_jobs() const {
  return plan_.trains ? plan_.total_train_jobs + plan_.total_dev_jobs : 0;
}

void Run::emit(EventKind kind, std::string text) {
  events_.push_back(Event{++event_seq_, clock_.now(), kind, std::move(text)});
  if (events_.size() > kEventsKept) events_.pop_front();
}

void Run::finish(RunState state, std::string reason) {
  TC_ASSERT(state != RunState::kRunning);
  if (state_ != RunState::kRunning) return;  // a run ends once
  state_ = state;
  state_reason_ = std::move(reason);
  emit(EventKind::kRunFinished, std::string(run_state_name(state)) + ": " + state_reason_);
}

EpochOrder Run::order_of(int64_t epoch, SetKind set) const {
  const uint64_t batches = set == SetKind::kTrain ? config_.train_batches : config_.dev_batches;
  return EpochOrder(config_.order, batches, config_.seed, epoch, set);
}

void Run::batches_of(const Job& job, std::vector<uint64_t>* out) const {
  const EpochOrder order = order_of(job.epoch, job.set);
  for (uint64_t p = job.positions.first; p < job.positions.first + job.positions.count; ++p) {
    out->push_back(order.batch_at(p));
  }
}

// ---- the schedule of epochs ----

bool Run::open_next_epoch() {
  if (state_ != RunState::kRunning || next_epoch_ >= plan_.end_epoch) return false;
  EpochPlan p;
  if (!next_is_dev_) {
    p = train_epoch_plan(plan_, config_, next_epoch_);
    if (dev_epoch_plan(plan_, config_, next_epoch_)) {
      next_is_dev_ = true;
    } else {
      ++next_epoch_;
    }
  } else {
    p = *dev_epoch_plan(plan_, config_, next_epoch_);
    next_is_dev_ = false;
    ++next_epoch_;
  }
  Epoch e;
  e.plan = p;
  e.set_batches = p.set == SetKind::kTrain ? config_.train_batches : config_.dev_batches;
  e.opened_at = clock_.now();
  e.cursor = p.first_job;
  const uint32_t slot = static_cast<uint32_t>(epochs_.size());
  epochs_.push_back(std::move(e));
  running_.push_back(slot);
  latest_of_set_[static_cast<int>(p.set)] = slot;
  if (p.set == SetKind::kDev) dev_to_judge_.push_back(slot);
  if (mode_ == ScheduleMode::kSteps && group_ranks_ > 0) {
    lay_out(epochs_[slot], group_ranks_);
  }
  const Epoch& opened = epochs_[slot];
  emit(EventKind::kEpochOpened,
       std::string(set_name(p.set)) + " epoch " + std::to_string(p.epoch) + " opened with " +
           std::to_string(opened.plan.size()) + " jobs" +
           (opened.steps() ? " (" + std::to_string(opened.plan.size() / opened.ranks) +
                                 " steps of " + std::to_string(opened.ranks) + " ranks)"
                           : std::string()));
  return true;
}

void Run::close_epoch(uint32_t slot) {
  Epoch& e = epochs_[slot];
  TC_ASSERT(!e.closed());
  TC_ASSERT(e.resolved() == e.plan.size() && e.active.empty() && e.leased == 0);
  e.closed_at = clock_.now();
  if (e.finite_jobs == 0) {
    e.loss = std::nan("");
  } else if (!config_.seed_compat && e.samples > 0) {
    e.loss = e.weighted_loss;
  } else {
    e.loss = e.plain_loss;
  }
  running_.erase(std::find(running_.begin(), running_.end(), slot));
  // A closed epoch keeps its figures, not its tracking: hand back the hash table's buckets
  // (sized for the jobs in flight), or a week-long run would hold them for every epoch.
  std::unordered_map<uint64_t, Epoch::ActiveJob>().swap(e.active);
  e.requeue.release_memory();
  e.cost_plan.reset();  // (O(samples); rebuilt if asked for)
  e.fixed_steps.reset();
  char loss[64];
  std::snprintf(loss, sizeof loss, "%.6g", e.loss);
  emit(EventKind::kEpochClosed, std::string(set_name(e.plan.set)) + " epoch " +
                                    std::to_string(e.plan.epoch) + " closed: loss " + loss + ", " +
                                    std::to_string(e.done) + " jobs done, " +
                                    std::to_string(e.failed) + " failed, " +
                                    std::to_string(e.nonfinite_jobs) + " non-finite");
  judge_dev_epochs();
  advance();
}

// Early stopping sees dev epochs in the order they were opened, each as soon as it and all
// before it have closed: the decision always uses the epoch that just finished.
void Run::judge_dev_epochs() {
  while (!dev_to_judge_.empty() && epochs_[dev_to_judge_.front()].closed()) {
    const Epoch& e = epochs_[dev_to_judge_.front()];
    dev_to_judge_.pop_front();
    if (state_ != RunState::kRunning) continue;  // a late dev result never ends a run twice
    const std::string& monitor = early_stop_.monitor();
    const double value = monitor == "loss" ? e.loss : e.metric(monitor, !config_.seed_compat);
    if (early_stop_.observe(e.plan.epoch, value, e.nonfinite_jobs == 0) &&
        config_.early_stop.kind != EarlyStopKind::kNone) {
      std::string why =
          "after dev epoch " + std::to_string(e.plan.epoch) + ": " + early_stop_.state().reason;
      if (early_stop_.state().best_epoch) {
        why += "; best epoch " + std::to_string(*early_stop_.state().best_epoch);
      }
      emit(EventKind::kEarlyStopped, why);
      finish(RunState::kEarlyStopped, why);
    }
  }
}

// Barrier mode opens the next epoch once every running one has closed; overlap mode opens it
// when a worker finds nothing open (see take_open_job). The run completes when the schedule is
// exhausted and nothing runs.
void Run::advance() {
  if (state_ != RunState::kRunning) return;
  const bool overlap = config_.seed_compat || config_.overlap_epochs;
  if (running_.empty() && !overlap) open_next_epoch();
  if (running_.empty() && next_epoch_ >= plan_.end_epoch) {
    std::string why = "target epoch " + std::to_string(plan_.target_epoch) + " reached";
    if (plan_.end_epoch < plan_.target_epoch) {
      why += " (seed_compat: the " + std::to_string(plan_.total_train_jobs) +
             " train jobs left after the checkpoint ended with epoch " +
             std::to_string(plan_.end_epoch - 1) + ")";
    }
    finish(RunState::kCompleted, std::move(why));
  }
  if (running_.empty() && state_ == RunState::kRunning && overlap) {
    open_next_epoch();
  }
}

int64_t Run::opened_train_end() const {
  int64_t end = plan_.start_epoch;
  for (const Epoch& e : epochs_) {
    if (e.plan.set == SetKind::kTrain) end = std::max(end, e.plan.epoch + 1);
  }
  return end;
}

std::string Run::take_target() {
  // (From the epochs themselves, which load() has checked, rather than from next_epoch_.)
  const int64_t opened_end = opened_train_end();
  if (plan_.end_epoch < opened_end) {
    return "the run has opened train epoch " + std::to_string(opened_end - 1) +
           " already, so its target epoch can be " + std::to_string(opened_end) +
           " at the least (this config's is " + std::to_string(plan_.target_epoch) + ")";
  }
  if (state_ == RunState::kCompleted && next_epoch_ < plan_.end_epoch) {
    emit(EventKind::kConfigChanged, "running again to target epoch " +
                                        std::to_string(plan_.target_epoch) + " (it had " +
                                        state_reason_ + ")");
    state_ = RunState::kRunning;
    state_reason_.clear();
    advance();
  }
  return "";
}

// ---- workers ----

uint32_t Run::ranks_of_group(std::string_view group, std::string_view except) const {
  if (group.empty()) return 0;
  for (const WorkerInfo& w : workers_) {
    if (w.group == group && w.rank && w.name != except) return w.rank->world_size;
  }
  return 0;
}

Result<void> Run::check_rank(std::string_view name, std::string_view group,
                             const std::optional<GroupRank>& rank) const {
  if (rank) {
    if (rank->world_size == 0 || rank->world_size > (1u << 20)) {
      return invalid_argument("world_size", "world_size: must be between 1 and 2^20, got " +
                                                std::to_string(rank->world_size));
    }
    if (rank->rank >= rank->world_size) {
      return invalid_argument("rank", "rank: " + std::to_string(rank->rank) +
                                          " is not below world_size " +
                                          std::to_string(rank->world_size));
    }
  }
  if (mode_ == ScheduleMode::kJobs || !rank) return {};
  if (const uint32_t w = ranks_of_group(group, name); w != 0 && w != rank->world_size) {
    return conflict("rank " + std::to_string(rank->rank) + " of group " + std::string(group) +
                        " says the group has " + std::to_string(rank->world_size) +
                        " ranks, but its other ranks registered with " + std::to_string(w) +
                        ": every rank of a group gives the same world_size",
                    error_reason::kWorldSizeMismatch);
  }
  return {};
}

WorkerId Run::join(std::string_view name, std::string_view group, std::optional<GroupRank> rank) {
  if (rank && !group.empty() && group == group_ && group_ranks_ == 0) {
    group_ranks_ = rank->world_size;
  }
  auto it = worker_ids_.find(std::string(name));
  if (it != worker_ids_.end()) {
    WorkerInfo& w = workers_[it->second];
    w.last_seen = clock_.now();
    // Naming a group is a registration with it (a rank of another group, or of none, is
    // forgotten); naming none keeps the group it had, and its rank unless it gives one.
    if (!group.empty()) {
      w.group = std::string(group);
      w.rank = rank;
    } else if (rank) {
      w.rank = rank;
    }
    if (!w.active) {
      w.active = true;
      emit(EventKind::kWorkerJoined, "worker " + w.name + " rejoined");
    }
    return it->second;
  }
  const WorkerId id = static_cast<WorkerId>(workers_.size());
  WorkerInfo w;
  w.name = std::string(name);
  w.group = std::string(group);
  w.rank = rank;
  w.joined_at = w.last_seen = clock_.now();
  workers_.push_back(std::move(w));
  worker_ids_.emplace(std::string(name), id);
  emit(EventKind::kWorkerJoined, "worker " + std::string(name) + " joined");
  return id;
}

Result<WorkerInfo*> Run::worker_of(WorkerId worker) {
  if (worker >= workers_.size()) {
    return not_found("worker " + std::to_string(worker) + " has not joined run " + config_.name,
                     error_reason::kWorkerNotRegistered);
  }
  WorkerInfo* w = &workers_[worker];
  w->last_seen = clock_.now();
  return w;
}

Result<void> Run::leave(WorkerId worker) {
  expire_leases();
  auto w = worker_of(worker);
  if (!w) return tl::unexpected(w.error());
  const std::vector<LeaseId> held = (*w)->leases;
  for (LeaseId id : held) {
    auto it = leases_.find(id);
    TC_ASSERT(it != leases_.end() && it->second.live);
    Epoch& e = epochs_[it->second.epoch_slot];
    e.requeue.push_front(it->second.position);
    e.active.at(it->second.position).live = 0;
    resolve(it, CompletionOutcome::kGivenUp);
  }
  if ((*w)->active) {
    (*w)->active = false;
    emit(EventKind::kWorkerLeft,
         "worker " + (*w)->name + " left; " + std::to_string(held.size()) + " jobs handed back");
  }
  return {};
}

// ---- leases ----

void Run::remember(LeaseId lease, WorkerId worker, CompletionOutcome outcome) {
  const size_t slot = lease % config_.lease_history;
  if (slot >= history_.size()) {
    history_.resize(
        std::min<size_t>(config_.lease_history, std::max<size_t>(slot + 1, history_.size() * 2)));
  }
  history_[slot] = Resolved{lease, worker, outcome};
}

void Run::unlink_live(LeaseId id, Lease& lease) {
  TC_ASSERT(lease.live);
  live_order_.erase(lease.order);
  lease.live = false;
  std::vector<LeaseId>& held = workers_[lease.worker].leases;
  auto pos = std::find(held.begin(), held.end(), id);
  TC_ASSERT(pos != held.end());
  *pos = held.back();
  held.pop_back();
  epochs_[lease.epoch_slot].leased -= 1;
}

// Drops a lease from leases_ (live or expired), remembering its outcome.
void Run::resolve(std::unordered_map<LeaseId, Lease>::iterator it, CompletionOutcome outcome) {
  Lease& lease = it->second;
  if (lease.live) unlink_live(it->first, lease);
  remember(it->first, lease.worker, outcome);
  leases_.erase(it);
}

Job Run::hand_out(WorkerId worker, uint32_t slot, uint64_t position) {
  Epoch& e = epochs_[slot];
  Epoch::ActiveJob& job = e.active[position];
  TC_ASSERT(job.live == 0);
  const LeaseId id = ++last_lease_;
  const TimeMs deadline = clock_.now() + config_.lease_timeout_ms;
  live_order_.push_back(id);
  job.handouts += 1;
  leases_.emplace(id, Lease{worker, slot, position, job.handouts, deadline, true,
                            std::prev(live_order_.end())});
  job.live = id;
  e.leased += 1;
  workers_[worker].leases.push_back(id);
  counters_.handouts += 1;
  if (job.handouts > 1) counters_.rehandouts += 1;

  return job_of(id);
}

Job Run::job_of(LeaseId id) const {
  const Lease& l = leases_.at(id);
  const Epoch& e = epochs_[l.epoch_slot];
  Job out;
  out.lease = id;
  out.attempt = l.attempt;
  out.deadline = l.deadline;
  out.epoch = e.plan.epoch;
  out.set = e.plan.set;
  out.index = l.position;
  out.jobs_in_epoch = e.plan.end_job;
  if (e.steps() && config_.cost_balanced()) {
    const StepPlan& plan = cost_plan(e);
    const uint64_t slot = l.position - e.step_base;
    out.step_mode = true;
    out.rank = static_cast<uint32_t>(slot % e.ranks);
    out.step = slot / e.ranks;
    out.steps = plan.steps.size();
    const RankBatch& batch = plan.steps[out.step].batches[out.rank];
    out.loss_scale = batch.loss_scale;
    out.positions = BatchSpan{0, 1};
    out.samples = batch.samples;
    return out;
  }
  if (e.steps()) {
    const std::shared_ptr<const Epoch::FixedSteps> fixed = fixed_steps_of(e);
    const StepLayout& layout = fixed->layout;
    const uint64_t slot = l.position - e.step_base;
    out.step_mode = true;
    out.rank = static_cast<uint32_t>(slot % e.ranks);
    out.step = slot / e.ranks;
    out.steps = layout.steps();
    out.loss_scale = layout.loss_scale(out.step, out.rank);
    out.positions = BatchSpan{0, 1};
    std::vector<uint64_t> places;
    layout.batch(out.step, out.rank, &places);
    const SampleOrder order(
        set_samples(e.plan.set), 1, config_.seed, e.plan.set,
        config_.order == BatchOrder::kShuffled ? SampleShuffle::kEpoch : SampleShuffle::kNone);
    for (uint64_t& place : places) place = fixed->segment.position(place);
    out.samples.reserve(places.size());
    order.at_each(e.plan.epoch, places, &out.samples);
    return out;
  }
  out.positions = job_batches(e.set_batches, plan_.batches_per_job, l.position);
  if (auto trained = e.trained.find(l.position); trained != e.trained.end()) {
    TC_ASSERT(trained->second < out.positions.count);
    out.positions.first += trained->second;
    out.positions.count -= trained->second;
  }
  return out;
}

uint64_t Run::set_samples(SetKind set) const {
  return set == SetKind::kTrain ? config_.train_samples : config_.dev_samples;
}

// Built once per layout, not per hand-out: the tail of a layout is planned whole (O(W·B)), and
// a segment of many runs (a restore at another world size) indexes them (O(runs)). Measured with
// core_bench's BM_StepCycle (docs/PERFORMANCE.md, "Step mode: the coordinator's own cost").
std::shared_ptr<const Epoch::FixedSteps> Run::fixed_steps_of(const Epoch& e) const {
  TC_ASSERT(e.steps() && !config_.cost_balanced());
  if (!e.fixed_steps) {
    EpochSegment segment(e.segment);
    StepLayout layout(segment.places(), config_.batch_size, e.ranks);
    e.fixed_steps = std::make_shared<const Epoch::FixedSteps>(
        Epoch::FixedSteps{std::move(layout), std::move(segment)});
  }
  return e.fixed_steps;
}

const StepLayout& Run::layout_of(const Epoch& e) const { return fixed_steps_of(e)->layout; }

const std::vector<double>& Run::lengths_of(SetKind set) const {
  return set == SetKind::kTrain ? config_.train_lengths : config_.dev_lengths;
}

StepPlanConfig Run::step_config(const Epoch& e) const {
  StepPlanConfig c;
  c.ranks = e.ranks;
  c.seed = config_.seed;
  c.set = e.plan.set;
  c.batch_budget = config_.batch_budget;
  c.cost = e.plan_cost;
  c.speeds = e.plan_speeds;
  return c;
}

StepPlan Run::plan_layout(const Epoch& e, const StepPlanConfig& c) const {
  const uint64_t n = set_samples(e.plan.set);
  const std::vector<double>& lengths = lengths_of(e.plan.set);
  if (e.segment.size() == 1 && e.segment[0].first == 0 && e.segment[0].count == n) {
    return plan_epoch_steps(c, n, lengths, e.plan.epoch);
  }
  std::vector<uint64_t> untrained;
  for (const PositionRun& run : e.segment) {
    for (uint64_t i = run.first; i < run.first + run.count; ++i) untrained.push_back(i);
  }
  return plan_rest_of_epoch(c, n, lengths, e.plan.epoch, untrained);
}

StepPlan Run::replanned(const Epoch& e, StepPlan plan, uint64_t kept,
                        const StepPlanConfig& c) const {
  TC_ASSERT(kept < plan.steps.size());
  std::vector<uint64_t> rest;
  for (size_t k = kept; k < plan.steps.size(); ++k) {
    for (const RankBatch& b : plan.steps[k].batches) {
      rest.insert(rest.end(), b.samples.begin(), b.samples.end());
    }
  }
  StepPlan tail =
      plan_rest_of_epoch(c, set_samples(e.plan.set), lengths_of(e.plan.set), e.plan.epoch, rest);
  plan.steps.resize(kept);
  plan.steps.insert(plan.steps.end(), std::make_move_iterator(tail.steps.begin()),
                    std::make_move_iterator(tail.steps.end()));
  plan.buckets = tail.buckets;
  return plan;
}

const StepPlan& Run::cost_plan(const Epoch& e) const {
  TC_ASSERT(config_.cost_balanced() && e.steps());
  if (!e.cost_plan) {
    const StepPlanConfig c = step_config(e);
    if (e.replanned_after == 0) {
      e.cost_plan = std::make_shared<const StepPlan>(plan_layout(e, c));
    } else {
      // The layout as first planned (the declared cost, every rank alike), its steps from
      // replanned_after on planned anew with the cost and speeds frozen at the re-plan.
      StepPlanConfig first = c;
      first.cost = e.first_cost;
      first.speeds.clear();
      e.cost_plan = std::make_shared<const StepPlan>(
          replanned(e, plan_layout(e, first), e.replanned_after, c));
    }
  }
  return *e.cost_plan;
}

uint64_t Run::steps_of(const Epoch& e) const {
  return config_.cost_balanced() ? cost_plan(e).steps.size() : layout_of(e).steps();
}

void Run::step_batch(const Epoch& e, uint64_t step, uint32_t rank,
                     std::vector<uint64_t>* out) const {
  const std::vector<uint64_t>& samples = cost_plan(e).steps[step].batches[rank].samples;
  out->insert(out->end(), samples.begin(), samples.end());
}

// The planner's cost is the fitted model's shape in the budget's units: scaled so that a batch
// of the set's mean length, as many samples as the declared cost fits in the budget, costs the
// same under both. The budget thus keeps its meaning (a batch of average samples stays the
// size the user asked for) while the fitted model decides how long and short batches, and
// slower ranks, compare with it.
bool Run::fitted_cost(const Epoch& e, BatchCost* cost, std::vector<double>* speeds) const {
  if (!cost_model_ || cost_model_->ranks() != e.ranks || !cost_model_->fitted()) return false;
  const BatchCost fit = cost_model_->shared();
  if (!(fit.b + fit.c > 0)) return false;  // only a per-batch overhead: no budget bounds a batch
  const std::vector<double>& lengths = lengths_of(e.plan.set);
  if (lengths.empty()) return false;
  std::optional<double>& mean_of_set = mean_length_[static_cast<int>(e.plan.set)];
  if (!mean_of_set) {
    double sum = 0;
    for (double v : lengths) sum += v;
    mean_of_set = sum / static_cast<double>(lengths.size());
  }
  const double mean = *mean_of_set;
  const BatchCost& d = config_.cost;
  const double per_sample = d.b * mean + d.c * mean * mean;
  const double n = per_sample > 0 ? std::max(1.0, (config_.batch_budget - d.a) / per_sample) : 1;
  const double declared = d.a + n * per_sample;
  const double fitted = fit.a + n * (fit.b * mean + fit.c * mean * mean);
  const double k = declared / fitted;
  if (!std::isfinite(k) || k <= 0) return false;
  std::vector<double> v = cost_model_->speeds();
  for (double x : v) {
    if (!std::isfinite(x) || x <= 0) return false;
  }
  *cost = BatchCost{fit.a * k, fit.b * k, fit.c * k};
  *speeds = std::move(v);
  return true;
}

void Run::freeze_cost(Epoch& e) const {
  e.plan_cost = config_.cost;
  e.plan_speeds.clear();
  BatchCost cost;
  std::vector<double> speeds;
  if (fitted_cost(e, &cost, &speeds)) {
    e.plan_cost = cost;
    e.plan_speeds = std::move(speeds);
  }
}

bool Run::warming_up(const Job& job) const {
  if (!config_.cost_balanced() || !config_.warm_up_replan || !job.step_mode ||
      job.set != SetKind::kTrain) {
    return false;
  }
  for (auto it = epochs_.rbegin(); it != epochs_.rend(); ++it) {
    const Epoch& e = *it;
    if (e.plan.set != job.set || e.plan.epoch != job.epoch) continue;
    if (!e.steps() || e.closed() || !e.plan_speeds.empty() || e.cursor >= e.plan.end_job) {
      return false;
    }
    // Only while the re-plan can still come soon: a client told so fetches a step at a time.
    const bool timed = cost_model_ && cost_model_->ranks() == e.ranks;
    if (e.done > 0 && !timed) return false;  // its ranks report no `seconds`: no model comes
    if (timed && cost_model_->fitted_for_every_rank()) return false;  // fitted, yet refused
    const CostModelOptions o = cost_model_options();
    const uint64_t needed =
        std::max(o.min_reports_per_rank, (o.min_reports + e.ranks - 1) / e.ranks);
    const uint64_t begun = (e.cursor - e.step_base) / e.ranks;
    return begun < needed + kWarmingUpSteps;
  }
  return false;
}

CostModelOptions Run::cost_model_options() const {
  CostModelOptions o;
  if (config_.declared_shape_fit) {
    o.prior = config_.cost;
    o.judge_first_reports_at_speed_1 = true;
  }
  return o;
}

bool Run::warm_up_due(const Epoch& e) const {
  return config_.cost_balanced() && config_.warm_up_replan && e.steps() && !e.closed() &&
         e.plan_speeds.empty() && e.cursor < e.plan.end_job && cost_model_ &&
         cost_model_->ranks() == e.ranks && cost_model_->fitted_for_every_rank();
}

// The steps begun (before the cursor) keep their batches: a rank ahead of the others (prefetch)
// has handed out steps whose other batches are queued for their ranks, and every rank must
// still get the same steps. What no rank was handed is re-planned, as a restore re-plans the
// rest of an epoch, with the cost and speeds frozen now. Deterministic: it happens at a
// hand-out, a function of the run's state, which a replay of the journal (or a snapshot)
// reaches the same.
void Run::warm_up(Epoch& e) {
  TC_ASSERT(warm_up_due(e));
  BatchCost cost;
  std::vector<double> speeds;
  if (!fitted_cost(e, &cost, &speeds)) return;  // (due again at the next hand-out)
  const uint64_t kept = (e.cursor - e.step_base) / e.ranks;
  const StepPlan& before = cost_plan(e);
  const uint64_t steps_before = before.steps.size();
  TC_ASSERT(kept < steps_before);
  const std::string declared = e.plan_cost.describe();
  StepPlanConfig c = step_config(e);
  c.cost = cost;
  c.speeds = speeds;
  StepPlan after = replanned(e, before, kept, c);
  if (kept > 0) {
    e.first_cost = e.plan_cost;
    e.replanned_after = kept;
  }
  e.plan_cost = cost;
  e.plan_speeds = std::move(speeds);
  const uint64_t steps = after.steps.size();
  e.cost_plan = std::make_shared<const StepPlan>(std::move(after));
  e.plan.end_job = e.step_base + steps * e.ranks;
  size_t slowest = 0;
  for (size_t r = 1; r < e.plan_speeds.size(); ++r) {
    if (e.plan_speeds[r] > e.plan_speeds[slowest]) slowest = r;
  }
  char speed[32];
  std::snprintf(speed, sizeof speed, "%.3g", e.plan_speeds[slowest]);
  emit(EventKind::kEpochReplanned,
       std::string(set_name(e.plan.set)) + " epoch " + std::to_string(e.plan.epoch) +
           " re-planned after " + std::to_string(kept) + " of its " + std::to_string(steps_before) +
           " steps, with the fitted model (" + e.plan_cost.describe() + ", slowest rank " +
           std::to_string(slowest) + " at speed " + speed + "; was " + declared +
           "): " + std::to_string(steps) + " steps");
}

void Run::report_batch_time(const Epoch& e, uint64_t position, double seconds) {
  if (!config_.cost_balanced() || !e.steps() || !(seconds > 0) || !std::isfinite(seconds)) return;
  // Train batches only: an evaluation batch (no backward) takes a fraction of a train batch's
  // time, and one model fitted from both would fit neither.
  if (e.plan.set != SetKind::kTrain) return;
  if (position < e.step_base) return;  // (a job of an earlier layout)
  const uint64_t slot = position - e.step_base;
  const uint32_t rank = static_cast<uint32_t>(slot % e.ranks);
  const RankBatch& batch = cost_plan(e).steps[slot / e.ranks].batches[rank];
  if (!cost_model_ || cost_model_->ranks() != e.ranks) {
    cost_model_.emplace(e.ranks, cost_model_options());
  }
  (void)cost_model_->report(rank, batch.shape(), seconds);
}

void Run::note_pace(const Epoch& e, uint64_t position, const Completion& completion) {
  if (!e.steps() || e.plan.set != SetKind::kTrain || position < e.step_base) return;
  if (!(completion.seconds > 0) || !std::isfinite(completion.seconds)) return;
  if (pace_.size() != e.ranks) pace_.assign(e.ranks, RankPace{});
  RankPace& p = pace_[(position - e.step_base) % e.ranks];
  p.batches += 1;
  p.samples += completion.samples;
  p.seconds += completion.seconds;
}

void Run::lay_out(Epoch& e, uint32_t ranks) {
  TC_ASSERT(e.leased == 0 && ranks > 0);
  if (config_.cost_balanced()) {
    if (!e.steps()) {
      e.segment.clear();
      if (const uint64_t n = set_samples(e.plan.set); n > 0) e.segment.push_back({0, n});
    } else {
      // What the plan before left, as sample indices: the batches given back (every active
      // job is queued again: no lease lives) and the steps it never handed out.
      TC_ASSERT(e.active.size() == e.requeue.size());
      std::vector<uint64_t> samples;
      e.requeue.for_each([&](uint64_t job) {
        const uint64_t slot = job - e.step_base;
        step_batch(e, slot / e.ranks, static_cast<uint32_t>(slot % e.ranks), &samples);
      });
      const uint64_t steps = steps_of(e);
      for (uint64_t step = (e.cursor - e.step_base) / e.ranks; step < steps; ++step) {
        for (uint32_t r = 0; r < e.ranks; ++r) step_batch(e, step, r, &samples);
      }
      e.segment = EpochSegment::runs_of(std::move(samples));
      e.active.clear();
      e.requeue.clear();
      e.trained.clear();
    }
    e.ranks = ranks;
    e.replanned_after = 0;
    e.first_cost = BatchCost{0, 0, 0};
    freeze_cost(e);
    e.cost_plan.reset();
    e.step_base = e.plan.first_job + e.resolved();
    e.requeue.by_rank(e.step_base, ranks);
    e.cursor = e.step_base;
    e.plan.end_job = e.step_base + steps_of(e) * ranks;
    return;
  }
  if (!e.steps()) {
    e.segment.clear();
    if (const uint64_t n = set_samples(e.plan.set); n > 0) e.segment.push_back({0, n});
  } else {
    // What the layout before left: the batches given back (every active job is queued again:
    // no lease lives) and the steps it never handed out, as runs of the epoch's positions.
    TC_ASSERT(e.active.size() == e.requeue.size());
    // (The cached layout before, kept alive here: e.fixed_steps is dropped below.)
    const std::shared_ptr<const Epoch::FixedSteps> cached = fixed_steps_of(e);
    const StepLayout& before = cached->layout;
    const EpochSegment& segment = cached->segment;
    std::vector<uint64_t> places;
    e.requeue.for_each([&](uint64_t job) {
      const uint64_t slot = job - e.step_base;
      before.batch(slot / e.ranks, static_cast<uint32_t>(slot % e.ranks), &places);
    });
    const uint64_t step = (e.cursor - e.step_base) / e.ranks;
    const uint64_t rest = before.first_place_from(step, &places);
    std::vector<PositionRun> runs;
    segment.runs_of_places(rest, before.places(), &runs);
    std::vector<uint64_t> positions;
    positions.reserve(places.size());
    for (uint64_t place : places) positions.push_back(segment.position(place));
    for (const PositionRun& run : EpochSegment::runs_of(std::move(positions))) runs.push_back(run);
    e.segment = EpochSegment::merged(std::move(runs));
    e.active.clear();
    e.requeue.clear();
    e.trained.clear();
  }
  e.ranks = ranks;
  e.fixed_steps.reset();
  e.step_base = e.plan.first_job + e.resolved();
  e.requeue.by_rank(e.step_base, ranks);
  e.cursor = e.step_base;
  e.plan.end_job = e.step_base + layout_of(e).steps() * ranks;
}

// Step mode: the worker's rank takes its earliest batch given back, else its batch of the
// next step never handed out (the step's other batches then wait, queued, for their ranks).
bool Run::take_step_job(WorkerId worker, Job* out) {
  const WorkerInfo& w = workers_[worker];
  if (!w.rank || group_ranks_ == 0 || w.rank->world_size != group_ranks_) return false;
  const uint32_t rank = w.rank->rank;
  for (uint32_t slot : running_) {
    Epoch& e = epochs_[slot];
    if (e.ranks != group_ranks_) {
      if (e.leased > 0) continue;
      lay_out(e, group_ranks_);
    }
    if (warm_up_due(e)) warm_up(e);
    uint64_t position;
    if (const std::optional<uint64_t> mine = e.requeue.take_of_rank(rank)) {
      position = *mine;
    } else if (e.cursor < e.plan.end_job) {
      const uint64_t first = e.cursor;
      e.cursor += e.ranks;
      for (uint64_t p = first; p < e.cursor; ++p) {
        if (p == first + rank) continue;
        e.active[p];  // open, not handed out: queued for its rank
        e.requeue.push_back(p);
      }
      position = first + rank;
    } else {
      continue;
    }
    *out = hand_out(worker, slot, position);
    return true;
  }
  return false;
}

bool Run::take_open_job(WorkerId worker, Job* out) {
  if (mode_ == ScheduleMode::kSteps) return take_step_job(worker, out);
  const bool overlap = config_.seed_compat || config_.overlap_epochs;
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t slot : running_) {
      Epoch& e = epochs_[slot];
      uint64_t position;
      if (!e.requeue.empty()) {
        position = e.requeue.front();
        e.requeue.pop_front();
      } else if (e.cursor < e.plan.end_job) {
        position = e.cursor++;
      } else {
        continue;
      }
      *out = hand_out(worker, slot, position);
      return true;
    }
    // As the original did: with nothing open, overlap mode starts the next epoch at once.
    if (!overlap || !open_next_epoch()) break;
  }
  return false;
}

void Run::choose_mode(const WorkerInfo& w) {
  TC_ASSERT(mode_ == ScheduleMode::kAuto);
  if (!w.group.empty() && w.rank) {
    mode_ = ScheduleMode::kSteps;
    emit(EventKind::kModeChosen,
         "run hands out steps (schedule.mode = \"auto\"): the first worker to ask for work, " +
             w.name + ", is rank " + std::to_string(w.rank->rank) + " of " +
             std::to_string(w.rank->world_size) + " of group " + w.group);
  } else {
    mode_ = ScheduleMode::kJobs;
    emit(EventKind::kModeChosen,
         "run hands out jobs (schedule.mode = \"auto\"): the first worker to ask for work, " +
             w.name + ", is not a rank of a group (" +
             (w.group.empty() ? "no group" : "group " + w.group + " without a rank") + ")");
  }
}

TimeMs Run::retry_hint() const {
  constexpr TimeMs kMaxHint = 1000;
  if (live_order_.empty()) return kMaxHint;
  const TimeMs soonest = leases_.at(live_order_.front()).deadline - clock_.now();
  return std::clamp<TimeMs>(soonest, 1, kMaxHint);
}

Result<Acquired> Run::acquire(WorkerId worker, uint64_t request, uint32_t max_jobs) {
  expire_leases();
  auto w = worker_of(worker);
  if (!w) return tl::unexpected(w.error());
  if (!(*w)->active) {
    (*w)->active = true;
    emit(EventKind::kWorkerJoined, "worker " + (*w)->name + " rejoined");
  }
  if (mode_ == ScheduleMode::kAuto) choose_mode(**w);
  if (mode_ == ScheduleMode::kSteps && ((*w)->group.empty() || !(*w)->rank)) {
    return failed_precondition(
        "run " + config_.name + " hands out steps (schedule.mode = \"" +
            std::string(schedule_mode_name(config_.mode)) +
            "\"): it is trained by a synchronous "
            "group, each rank registering with its group, rank and world_size; worker " +
            (*w)->name + " registered without " + ((*w)->group.empty() ? "a group" : "its rank") +
            " (Phases does this in an initialised process group or under traincoord launch; a "
            "worker of its own is a group of one: rank 0 of 1)",
        error_reason::kRankRequired);
  }
  max_jobs = std::max<uint32_t>(max_jobs, 1);
  Acquired out;
  if (request != 0 && request == (*w)->last_request && (*w)->last_request_lease != 0) {
    // A retry: the jobs the first try handed out, while their leases live. One call issues
    // consecutive lease ids, so they are last_request_lease and the max_jobs - 1 after it (a
    // retry comes before the worker's next acquire; a lease of another worker is skipped).
    const LeaseId first = (*w)->last_request_lease;
    for (LeaseId id = first; id < first + max_jobs && id <= last_lease_; ++id) {
      auto it = leases_.find(id);
      if (it == leases_.end() || !it->second.live || it->second.worker != worker) continue;
      if (out.status == AcquireStatus::kJob) {
        out.more.push_back(job_of(id));
      } else {
        out.status = AcquireStatus::kJob;
        out.job = job_of(id);
      }
    }
    if (out.status == AcquireStatus::kJob) return out;
  }
  if (request != 0) {
    (*w)->last_request = request;
    (*w)->last_request_lease = 0;
  }
  if (state_ != RunState::kRunning) {
    out.status = AcquireStatus::kFinished;
    out.state = state_;
    return out;
  }
  if (take_open_job(worker, &out.job)) {
    out.status = AcquireStatus::kJob;
    if (request != 0) workers_[worker].last_request_lease = out.job.lease;
    Job more;
    while (out.more.size() + 1 < max_jobs && state_ == RunState::kRunning &&
           take_open_job(worker, &more)) {
      out.more.push_back(more);
    }
    return out;
  }
  if (state_ != RunState::kRunning) {  // opening an epoch can find the schedule exhausted
    out.status = AcquireStatus::kFinished;
    out.state = state_;
    return out;
  }
  out.status = AcquireStatus::kWait;
  out.retry_after_ms = retry_hint();
  return out;
}

Result<void> Run::check_completion(WorkerId worker, LeaseId lease) const {
  if (worker >= workers_.size()) {
    return not_found("worker " + std::to_string(worker) + " has not joined run " + config_.name,
                     error_reason::kWorkerNotRegistered);
  }
  const std::string& name = workers_[worker].name;
  auto it = leases_.find(lease);
  if (it != leases_.end()) {
    if (it->second.worker == worker) return {};
    return conflict("lease " + std::to_string(lease) + " belongs to worker " +
                        workers_[it->second.worker].name + ", not to " + name,
                    error_reason::kLeaseNotYours);
  }
  if (lease == 0 || lease > last_lease_) {
    return not_found("lease " + std::to_string(lease) + " was never issued by run " + config_.name,
                     error_reason::kLeaseUnknown);
  }
  const Resolved& r = history_.size() > lease % config_.lease_history
                          ? history_[lease % config_.lease_history]
                          : Resolved{};
  if (r.lease == lease && r.worker != worker) {
    return conflict("lease " + std::to_string(lease) + " belongs to worker " +
                        workers_[r.worker].name + ", not to " + name,
                    error_reason::kLeaseNotYours);
  }
  return {};
}

void Run::count_completion(Epoch& e, const Completion& c) {
  e.done += 1;
  e.fold_report(c);
  if (!std::isfinite(c.loss)) counters_.nonfinite_losses += 1;
}

Result<Completed> Run::complete(WorkerId worker, LeaseId lease, const Completion& completion) {
  expire_leases();
  auto w = worker_of(worker);
  if (!w) return tl::unexpected(w.error());
  auto it = leases_.find(lease);
  if (it == leases_.end()) {
    if (lease == 0 || lease > last_lease_) {
      counters_.completions_unknown += 1;
      return not_found(
          "lease " + std::to_string(lease) + " was never issued by run " + config_.name,
          error_reason::kLeaseUnknown);
    }
    const Resolved& r = history_.size() > lease % config_.lease_history
                            ? history_[lease % config_.lease_history]
                            : Resolved{};
    if (r.lease != lease) {
      counters_.completions_duplicate += 1;
      return Completed{CompletionOutcome::kStale};
    }
    if (r.worker != worker) {
      counters_.completions_foreign += 1;
      return conflict("lease " + std::to_string(lease) + " belongs to worker " +
                          workers_[r.worker].name + ", not to " + (*w)->name,
                      error_reason::kLeaseNotYours);
    }
    counters_.completions_duplicate += 1;
    return Completed{r.outcome == CompletionOutcome::kAccepted ? CompletionOutcome::kDuplicate
                                                               : r.outcome};
  }
  Lease& l = it->second;
  if (l.worker != worker) {
    counters_.completions_foreign += 1;
    return conflict("lease " + std::to_string(lease) + " belongs to worker " +
                        workers_[l.worker].name + ", not to " + (*w)->name,
                    error_reason::kLeaseNotYours);
  }
  // The first valid completion of a job wins, also a late one from an expired lease: the
  // work is done, and any other lease of the job is superseded.
  const uint32_t slot = l.epoch_slot;
  const uint64_t position = l.position;
  Epoch& e = epochs_[slot];
  auto job = e.active.find(position);
  TC_ASSERT(job != e.active.end());
  if (!l.live) {
    auto& expired = job->second.expired;
    expired.erase(std::find(expired.begin(), expired.end(), lease));
  }
  resolve(it, CompletionOutcome::kAccepted);
  if (job->second.live != 0 && job->second.live != lease) {
    resolve(leases_.find(job->second.live), CompletionOutcome::kSuperseded);
  } else if (job->second.live == 0) {
    (void)e.requeue.erase(position);
  }
  for (LeaseId other : job->second.expired) {
    resolve(leases_.find(other), CompletionOutcome::kSuperseded);
  }
  e.active.erase(job);
  e.trained.erase(position);
  report_batch_time(e, position, completion.seconds);
  note_pace(e, position, completion);
  count_completion(e, completion);
  (*w)->jobs_done += 1;
  (*w)->samples_done += completion.samples;
  counters_.completions_accepted += 1;
  series_.add(e.plan.set, e.plan.epoch, counters_.completions_accepted, completion);
  const Completed accepted{CompletionOutcome::kAccepted, e.plan.epoch, e.plan.set, position};
  recent_.push_back({e.plan.epoch, e.plan.set, position, completion.loss, clock_.now(), worker,
                     counters_.completions_accepted});
  if (recent_.size() > kRecentKept) recent_.pop_front();
  if (e.resolved() == e.plan.size()) close_epoch(slot);
  return accepted;
}

Result<NextJob> Run::next_job(WorkerId worker, LeaseId lease, const Completion& completion,
                              uint64_t request) {
  auto done = complete(worker, lease, completion);
  if (!done) return tl::unexpected(done.error());
  auto next = acquire(worker, request);
  if (!next) return tl::unexpected(next.error());
  return NextJob{*done, *next};
}

Result<std::vector<LeaseId>> Run::heartbeat(WorkerId worker, const std::vector<LeaseId>* only) {
  expire_leases();
  auto w = worker_of(worker);
  if (!w) return tl::unexpected(w.error());
  const TimeMs deadline = clock_.now() + config_.lease_timeout_ms;
  for (LeaseId id : (*w)->leases) {
    if (only && std::find(only->begin(), only->end(), id) == only->end()) continue;
    Lease& l = leases_.at(id);
    l.deadline = deadline;
    // Every run has one timeout, so the newest deadline is the latest: the list stays sorted.
    live_order_.splice(live_order_.end(), live_order_, l.order);
  }
  return (*w)->leases;
}

void Run::count_failure(uint32_t slot, uint64_t position, const std::string& why) {
  Epoch& e = epochs_[slot];
  Epoch::ActiveJob& job = e.active.at(position);
  job.failures += 1;
  if (job.failures < static_cast<uint32_t>(config_.max_attempts)) {
    e.requeue.push_front(position);
    return;
  }
  // Given up: its expired leases can no longer complete it.
  for (LeaseId other : job.expired) resolve(leases_.find(other), CompletionOutcome::kJobFailed);
  e.active.erase(position);
  e.trained.erase(position);
  e.failed += 1;
  e.failed_jobs.push_back(position);
  counters_.jobs_failed += 1;
  const std::string what = job_name(e, position) + " failed " +
                           std::to_string(config_.max_attempts) + " times (last: " + why + ")";
  emit(EventKind::kJobFailed, what);
  if (config_.on_job_failure == JobFailurePolicy::kFailRun) {
    finish(RunState::kFailed, what);
  } else if (e.resolved() == e.plan.size()) {
    close_epoch(slot);
  }
}

Result<void> Run::fail(WorkerId worker, LeaseId lease, std::string_view reason) {
  expire_leases();
  auto w = worker_of(worker);
  if (!w) return tl::unexpected(w.error());
  auto it = leases_.find(lease);
  if (it == leases_.end()) {
    if (lease == 0 || lease > last_lease_) {
      return not_found(
          "lease " + std::to_string(lease) + " was never issued by run " + config_.name,
          error_reason::kLeaseUnknown);
    }
    return {};  // already resolved: nothing left to give up
  }
  if (it->second.worker != worker) {
    return conflict("lease " + std::to_string(lease) + " belongs to worker " +
                        workers_[it->second.worker].name + ", not to " + (*w)->name,
                    error_reason::kLeaseNotYours);
  }
  const uint32_t slot = it->second.epoch_slot;
  const uint64_t position = it->second.position;
  Epoch::ActiveJob& job = epochs_[slot].active.at(position);
  if (!it->second.live) {
    job.expired.erase(std::find(job.expired.begin(), job.expired.end(), lease));
    resolve(it, CompletionOutcome::kGivenUp);
    return {};  // its expiry already counted as the failed attempt
  }
  job.live = 0;
  resolve(it, CompletionOutcome::kGivenUp);
  counters_.failure_reports += 1;
  count_failure(slot, position, "worker " + (*w)->name + " reported: " + std::string(reason));
  return {};
}

Result<uint64_t> Run::release(WorkerId worker, const std::vector<LeaseId>& leases) {
  expire_leases();
  auto w = worker_of(worker);
  if (!w) return tl::unexpected(w.error());
  for (LeaseId lease : leases) {  // checked whole before anything changes
    if (auto r = check_completion(worker, lease); !r) return tl::unexpected(r.error());
  }
  uint64_t released = 0;
  for (LeaseId lease : leases) {
    auto it = leases_.find(lease);
    if (it == leases_.end()) continue;  // already resolved (or listed twice)
    Epoch& e = epochs_[it->second.epoch_slot];
    Epoch::ActiveJob& job = e.active.at(it->second.position);
    if (it->second.live) {
      e.requeue.push_front(it->second.position);
      job.live = 0;  // not a failed attempt (as when a worker leaves)
      released += 1;
    } else {  // expired: the job is back in the queue already; its late completion won't count
      job.expired.erase(std::find(job.expired.begin(), job.expired.end(), lease));
    }
    resolve(it, CompletionOutcome::kGivenUp);
  }
  return released;
}

void Run::expire_leases() {
  const TimeMs now = clock_.now();
  while (!live_order_.empty()) {
    const LeaseId id = live_order_.front();
    Lease& l = leases_.at(id);
    if (l.deadline > now) break;
    unlink_live(id, l);
    counters_.lease_expiries += 1;
    Epoch& e = epochs_[l.epoch_slot];
    Epoch::ActiveJob& job = e.active.at(l.position);
    job.live = 0;
    job.expired.push_back(id);
    const std::string what = "lease " + std::to_string(id) + " of " + job_name(e, l.position) +
                             " held by worker " + workers_[l.worker].name + " expired";
    emit(EventKind::kLeaseExpired, what);
    count_failure(l.epoch_slot, l.position, what);
  }
}

Result<IndexReply> Run::next_index(SetKind set) {
  expire_leases();
  const auto& slot = latest_of_set_[static_cast<int>(set)];
  if (!slot) {
    return failed_precondition(
        "no " + std::string(set_name(set)) + " epoch has started yet in run " + config_.name,
        error_reason::kEpochNotStarted);
  }
  Epoch& e = epochs_[*slot];
  IndexReply r{e.plan.epoch, e.next_index++, std::nullopt};
  if (r.position < e.set_batches) r.batch = order_of(e.plan.epoch, set).batch_at(r.position);
  return r;
}

void Run::cancel(std::string reason) { finish(RunState::kCancelled, std::move(reason)); }

// ---- groups and checkpoint cuts ----

bool Run::is_past_group(std::string_view group) const {
  return std::find(past_groups_.begin(), past_groups_.end(), group) != past_groups_.end();
}

uint64_t Run::jobs_done() const {
  uint64_t done = 0;
  for (const Epoch& e : epochs_) done += e.done;
  return done;
}

namespace {

tl::unexpected<Error> stale_group(const std::string& run, std::string_view group,
                                  const std::string& current, uint64_t generation) {
  return failed_precondition("group " + std::string(group) + " of run " + run +
                                 " was replaced: the run is now at generation " +
                                 std::to_string(generation) +
                                 (current.empty() ? std::string() : " (group " + current + ")") +
                                 "; nothing this process sends is counted any more: stop it",
                             error_reason::kStaleGeneration);
}

}  // namespace

Result<void> Run::admit(std::string_view group) const {
  if (group.empty() || group == group_) return {};
  if (is_past_group(group)) return stale_group(config_.name, group, group_, generation_);
  if (const Cut* latest = latest_cut()) {
    return failed_precondition(
        "group " + std::string(group) + " is new to run " + config_.name +
            ", which has checkpoint cuts (the latest: cut " + std::to_string(latest->id) +
            "): restore the cut your checkpoint holds (Phases.load_state_dict, or POST "
            "/v1/runs/" +
            config_.name +
            "/restore {\"group\": ..., \"cut\": N}) or go on from "
            "the ledger as it is ({\"fresh\": true}) before asking for jobs",
        error_reason::kRestoreRequired);
  }
  return not_found("group " + std::string(group) + " has not registered with run " + config_.name +
                       ": register its workers (with their group) first",
                   error_reason::kWorkerNotRegistered);
}

Result<void> Run::admit(WorkerId worker, std::string_view group) const {
  TC_ASSERT(worker < workers_.size());
  const std::string& registered = workers_[worker].group;
  if (registered.empty()) return admit(group);
  // The registration decides, not the request: a process of a replaced group is fenced off
  // however it words its requests (naming no group, or the group that replaced its own).
  if (auto ok = admit(registered); !ok) return ok;
  if (!group.empty() && group != registered) {
    // (A process of a replaced group whose name a rank of the new group registered since.)
    if (is_past_group(group)) return stale_group(config_.name, group, group_, generation_);
    return conflict("worker " + workers_[worker].name + " registered with group " + registered +
                        " of run " + config_.name + ", but this request names group " +
                        std::string(group) +
                        ": a worker's requests name the group it registered with (or none); "
                        "register it again with its group",
                    error_reason::kGroupMismatch);
  }
  return {};
}

Result<GroupState> Run::join_group(std::string_view group) {
  if (group.empty() || group == group_) return GroupState::kCurrent;
  if (is_past_group(group)) return stale_group(config_.name, group, group_, generation_);
  if (latest_cut() != nullptr) return GroupState::kRestoreRequired;
  // The group before (if any) restarted: every lease is void (an ungrouped worker's too: a run
  // that mixes grouped and ungrouped workers is fenced as one group). The first group voids
  // nothing.
  take_over(group, "", group_.empty() ? 0 : void_leases());
  return GroupState::kCurrent;
}

// Every lease out is void: its job goes back to the open queue (not a failed attempt), and a
// late completion through it is answered given_up. In lease order, so that a replay voids the
// same way.
uint64_t Run::void_leases() {
  std::vector<LeaseId> ids;
  ids.reserve(leases_.size());
  for (const auto& entry : leases_) ids.push_back(entry.first);
  std::sort(ids.begin(), ids.end());
  uint64_t voided = 0;
  for (auto id = ids.rbegin(); id != ids.rend(); ++id) {  // the oldest ends at the queue's front
    auto it = leases_.find(*id);
    Epoch& e = epochs_[it->second.epoch_slot];
    Epoch::ActiveJob& job = e.active.at(it->second.position);
    if (it->second.live) {
      e.requeue.push_front(it->second.position);
      job.live = 0;
      voided += 1;
    } else {
      job.expired.erase(std::find(job.expired.begin(), job.expired.end(), *id));
    }
    resolve(it, CompletionOutcome::kGivenUp);
  }
  for (WorkerInfo& w : workers_) w.last_request_lease = 0;
  counters_.leases_voided += voided;
  return voided;
}

// `group` becomes the current group; the group before it is fenced off.
void Run::take_over(std::string_view group, std::string target, uint64_t voided) {
  if (!group_.empty()) {
    past_groups_.push_back(group_);
    if (past_groups_.size() > kPastGroupsKept) past_groups_.pop_front();
  }
  const std::string before = group_;
  group_ = std::string(group);
  generation_ += 1;
  restored_ = std::move(target);
  group_ranks_ = ranks_of_group(group_);  // (0 until a rank of it registers)
  cuts_.drop_pending();
  emit(EventKind::kGroupStarted,
       "group " + group_ + " took over at generation " + std::to_string(generation_) +
           (before.empty()
                ? std::string()
                : " from group " + before + "; " + std::to_string(voided) + " leases voided"));
}

RunProgress Run::progress() const {
  RunProgress p;
  p.state = state_;
  p.state_reason = state_reason_;
  p.early_stop = early_stop_.state();
  p.epochs = epochs_;
  p.running = running_;
  p.dev_to_judge = dev_to_judge_;
  p.next_epoch = next_epoch_;
  p.next_is_dev = next_is_dev_;
  p.latest_of_set[0] = latest_of_set_[0];
  p.latest_of_set[1] = latest_of_set_[1];
  return p;
}

void Run::take_progress(RunProgress p) {
  state_ = p.state;
  state_reason_ = std::move(p.state_reason);
  early_stop_.restore(std::move(p.early_stop));
  epochs_ = std::move(p.epochs);
  running_ = std::move(p.running);
  dev_to_judge_ = std::move(p.dev_to_judge);
  next_epoch_ = p.next_epoch;
  next_is_dev_ = p.next_is_dev;
  latest_of_set_[0] = p.latest_of_set[0];
  latest_of_set_[1] = p.latest_of_set[1];
}

Result<CutShareReply> Run::cut(WorkerId worker, std::string_view group, uint64_t seq, uint32_t rank,
                               uint32_t world_size, const std::vector<CutPart>& parts) {
  expire_leases();
  auto w = worker_of(worker);
  if (!w) return tl::unexpected(w.error());
  if (group.empty()) return invalid_argument("group", "a cut is taken by a group: name it");
  if (auto ok = admit(worker, group); !ok) return tl::unexpected(ok.error());
  if (seq == 0) return invalid_argument("seq", "must be at least 1");
  if (world_size == 0 || world_size > (1u << 20)) {
    return invalid_argument("world_size", "must be between 1 and 2^20");
  }
  if (rank >= world_size) {
    return invalid_argument("rank", "rank " + std::to_string(rank) + " is not below world_size " +
                                        std::to_string(world_size));
  }
  auto repeated = cuts_.check_share(group, seq, rank, world_size);
  if (!repeated) return tl::unexpected(repeated.error());
  if (*repeated) return **repeated;
  // The parts, checked whole before anything changes.
  std::vector<Cut::Share> shares;
  for (size_t i = 0; i < parts.size(); ++i) {
    const CutPart& part = parts[i];
    if (auto ok = check_completion(worker, part.lease); !ok) return tl::unexpected(ok.error());
    auto it = leases_.find(part.lease);
    if (it == leases_.end() || !it->second.live) {
      return conflict("lease " + std::to_string(part.lease) + " is not held by worker " +
                          (*w)->name + " any more (it expired, was given back or completed): " +
                          "its batches cannot be part of the cut",
                      error_reason::kLeaseNotHeld);
    }
    for (size_t k = 0; k < i; ++k) {
      if (parts[k].lease == part.lease) {
        return invalid_argument("parts",
                                "lease " + std::to_string(part.lease) + " is listed twice");
      }
    }
    const Job job = job_of(part.lease);
    if (part.batches == 0 || part.batches >= job.positions.count) {
      return invalid_argument(
          "parts", "lease " + std::to_string(part.lease) + ": batches must be between 1 and " +
                       std::to_string(job.positions.count) +
                       " - 1 (a job trained whole is completed, not part of a cut); got " +
                       std::to_string(part.batches));
    }
    const Lease& l = it->second;
    if (auto free = cuts_.check_part(group, seq, part.lease, l.epoch_slot, l.position); !free) {
      return tl::unexpected(free.error());
    }
    shares.push_back(Cut::Share{l.epoch_slot, l.position, part.batches, part.completion});
  }
  Cut& cut =
      cuts_.add_share(group, seq, generation_, rank, world_size, std::move(shares), clock_.now());
  CutShareReply reply = CutLedger::reply_of(cut);
  if (cut.ranks.size() < cut.world_size) return reply;
  counters_.nonfinite_losses += cuts_.complete(cut, progress(), clock_.now());
  counters_.cuts += 1;
  emit(EventKind::kCutTaken, "cut " + std::to_string(cut.id) + " of group " + cut.group + " (" +
                                 std::to_string(cut.world_size) +
                                 " ranks): " + std::to_string(cut.jobs_done) + " jobs done, " +
                                 std::to_string(cut.partial_jobs) + " partly trained");
  cuts_.keep_latest();  // (`cut` may dangle from here on)
  reply.complete = true;
  return reply;
}

Result<Restored> Run::restore(std::string_view group, std::optional<uint64_t> cut_id) {
  if (group.empty()) return invalid_argument("group", "a restore names the group that goes on");
  if (is_past_group(group)) return stale_group(config_.name, group, group_, generation_);
  const std::string target = cut_id ? "cut " + std::to_string(*cut_id) : std::string("fresh");
  if (group == group_) {
    if (restored_ == target) {  // another rank of the group, or a retry
      return Restored{false, cut_id, generation_, 0, 0};
    }
    // A checkpoint of a cut this ledger never had (a coordinator kept in memory and started
    // again): what is wrong is the cut, not the group (issue 33).
    if (restored_.empty() && cut_id && cuts_.find(*cut_id) == nullptr) {
      auto missing = cuts_.check_restorable(*cut_id, config_.name);
      TC_ASSERT(!missing);
      return not_found(missing.error().message +
                           ": the checkpoint was taken against another ledger (a coordinator "
                           "that kept the run in memory and started again, or another data "
                           "dir). Restore it where its cut is kept, or train afresh "
                           "(start_fresh) from this run's state",
                       error_reason::kCutNotFound);
    }
    return conflict("group " + std::string(group) + " is already the current group of run " +
                        config_.name + " (" +
                        (restored_.empty() ? std::string("it took the run over without a restore")
                                           : "it restored " + restored_) +
                        "): a restore is made by a new group, before it asks for jobs",
                    error_reason::kRestoreConflict);
  }
  if (state_ == RunState::kCancelled) {
    return failed_precondition("run " + config_.name + " was cancelled: " + state_reason_,
                               error_reason::kRunCancelled);
  }
  if (cut_id) {
    if (auto ok = cuts_.check_restorable(*cut_id, config_.name); !ok) {
      return tl::unexpected(ok.error());
    }
  }
  const uint64_t done_before = jobs_done();
  const uint64_t voided_before = counters_.leases_voided;
  take_over(group, target, void_leases());  // (drops the pending cuts)
  uint64_t withdrawn = 0;
  if (cut_id) {
    const Cut& cut = cuts_.restore(*cut_id);
    withdrawn = done_before > cut.jobs_done ? done_before - cut.jobs_done : 0;
    take_progress(cut.saved);
    // What the cut promised, checked of the run as restored (no lease is left: void_leases).
    TC_ASSERT(leases_.empty() && live_order_.empty());
    cuts_.assert_restored(cut, progress());
    // The history of recent completions keeps only those the run, as restored, still counts:
    // a completion of the lineage abandoned is withdrawn, and its job will be trained again.
    std::erase_if(recent_, [&](const RecentCompletion& c) {
      auto e = std::find_if(epochs_.begin(), epochs_.end(), [&](const Epoch& x) {
        return x.plan.set == c.set && x.plan.epoch == c.epoch;
      });
      if (e == epochs_.end()) return true;
      const bool resolved =
          c.job < e->cursor && !e->active.contains(c.job) && !e->requeue.contains(c.job);
      const bool failed =
          std::find(e->failed_jobs.begin(), e->failed_jobs.end(), c.job) != e->failed_jobs.end();
      return !resolved || failed;
    });
  }
  counters_.restores += 1;
  counters_.jobs_withdrawn += withdrawn;
  const uint64_t voided = counters_.leases_voided - voided_before;
  emit(
      EventKind::kRestored,
      "group " + std::string(group) + " restored " +
          (cut_id ? "cut " + std::to_string(*cut_id) : std::string("the ledger as it is (fresh)")) +
          ": generation " + std::to_string(generation_) + ", " + std::to_string(withdrawn) +
          " completed jobs reopened, " + std::to_string(voided) + " leases voided; run " +
          std::string(run_state_name(state_)));
  return Restored{true, cut_id, generation_, withdrawn, voided};
}

}  // namespace traincoord
