// One training run: its epochs of jobs, the leases that hand jobs to workers, the aggregation
// of losses and the early-stop decision, the groups that take the run over and their
// checkpoint cuts (kept by a CutLedger, core/cut_ledger.h). Pure and single-threaded: time comes
// from the injected clock, and nothing here touches a socket or a file.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/batch_order.h"
#include "core/clock.h"
#include "core/cost_model.h"
#include "core/cut_ledger.h"
#include "core/early_stop.h"
#include "core/error.h"
#include "core/plan.h"
#include "core/rendezvous.h"
#include "core/run_config.h"
#include "core/run_progress.h"
#include "core/run_series.h"
#include "core/step_plan.h"

namespace traincoord {

// A job as handed to a worker, under a lease.
struct Job {
  LeaseId lease = 0;
  uint32_t attempt = 0;  // 1 for the first hand-out of the job
  TimeMs deadline = 0;   // the lease runs out then unless a heartbeat extends it
  int64_t epoch = 0;
  SetKind set = SetKind::kTrain;
  uint64_t index = 0;          // the job's place in its epoch: 0 .. jobs_in_epoch - 1
  uint64_t jobs_in_epoch = 0;  // jobs of a whole epoch of the set
  BatchSpan positions;         // positions in the epoch's order; Run::order_of maps them to batches
  // Step mode (the epoch's `ranks` > 0): the job is rank `rank`'s batch of step `step` of
  // `steps` (of the epoch's layout), its samples listed (sample indices of the set), and the
  // factor its loss is scaled by so that the step's gradient is the mean over the step's
  // samples under DDP's averaging: n_rank · W / n_step. `positions` is then one batch.
  bool step_mode = false;
  uint32_t rank = 0;
  uint64_t step = 0;
  uint64_t steps = 0;
  double loss_scale = 1;
  std::vector<uint64_t> samples;
};

// A rank of a synchronous group, as it registers.
struct GroupRank {
  uint32_t rank = 0;
  uint32_t world_size = 1;
};

enum class AcquireStatus : uint8_t { kJob, kWait, kFinished };

struct Acquired {
  AcquireStatus status = AcquireStatus::kWait;
  Job job;                              // when kJob
  std::vector<Job> more;                // when kJob and more than one job was asked for
  TimeMs retry_after_ms = 0;            // when kWait: when it is worth asking again
  RunState state = RunState::kRunning;  // when kFinished: how the run ended
};

enum class CompletionOutcome : uint8_t {
  kAccepted,    // counted: the first valid completion of the job
  kDuplicate,   // this lease's completion was already counted; nothing changed
  kSuperseded,  // another lease of the same job completed first; not counted
  kGivenUp,     // the lease was given back (failure report, worker left); not counted
  kJobFailed,   // the job had been given up after max_attempts; not counted
  kStale,       // a lease too old to remember (beyond lease_history); not counted
};
// (A lease voided by a restore or by a new group taking over is remembered as kGivenUp.)
std::string_view completion_outcome_name(CompletionOutcome outcome);

struct Completed {
  CompletionOutcome outcome = CompletionOutcome::kAccepted;
  bool counted() const { return outcome == CompletionOutcome::kAccepted; }
  // When counted: the job it completed.
  int64_t epoch = 0;
  SetKind set = SetKind::kTrain;
  uint64_t job = 0;
};

struct NextJob {
  Completed completed;
  Acquired next;
};

struct WorkerInfo {
  std::string name;
  TimeMs joined_at = 0;
  TimeMs last_seen = 0;
  bool active = true;
  uint64_t jobs_done = 0;
  uint64_t samples_done = 0;       // the samples its counted completions reported
  std::vector<LeaseId> leases;     // live leases it holds
  uint64_t last_request = 0;       // the id of its last acquire that named one ...
  LeaseId last_request_lease = 0;  // ... and the (first) lease that acquire handed out (0: none)
  // The group it registered with, last (empty: none). Its requests are fenced by this group,
  // whatever group they name or omit (Run::admit).
  std::string group;
  // Its rank in that group and the group's world size, when it registered with them (a step-
  // mode run hands it only its rank's batches).
  std::optional<GroupRank> rank;
};

struct RunCounters {
  uint64_t handouts = 0;
  uint64_t rehandouts = 0;  // hand-outs of a job after an earlier attempt
  uint64_t lease_expiries = 0;
  uint64_t completions_accepted = 0;
  uint64_t completions_duplicate = 0;  // duplicate, superseded, given up, job failed, stale
  uint64_t completions_foreign = 0;    // another worker's lease: refused
  uint64_t completions_unknown = 0;    // a lease never issued: refused
  uint64_t failure_reports = 0;
  uint64_t jobs_failed = 0;
  uint64_t nonfinite_losses = 0;
  uint64_t cuts = 0;            // complete checkpoint cuts
  uint64_t restores = 0;        // restores of a cut (or fresh starts) by a new group
  uint64_t jobs_withdrawn = 0;  // completed jobs reopened by restores
  uint64_t leases_voided = 0;   // leases voided by restores and groups taking over
};

enum class EventKind : uint8_t {
  kEpochOpened,
  kEpochClosed,
  kLeaseExpired,
  kJobFailed,
  kWorkerJoined,
  kWorkerLeft,
  kEarlyStopped,
  kRunFinished,
  kCutTaken,
  kRestored,
  kGroupStarted,
  kConfigChanged,   // --apply-config-changes: fields changed, a completed run going on
  kModeChosen,      // schedule.mode = "auto": the first acquire chose jobs or steps
  kEpochReplanned,  // cost-balanced: the warm-up re-plan of an epoch's steps not begun
};
std::string_view event_kind_name(EventKind kind);

struct Event {
  uint64_t seq = 0;
  TimeMs time = 0;
  EventKind kind = EventKind::kEpochOpened;
  std::string text;
};

// A counted completion, kept for a while for loss curves within an epoch.
struct RecentCompletion {
  int64_t epoch = 0;
  SetKind set = SetKind::kTrain;
  uint64_t job = 0;
  double loss = 0;
  TimeMs time = 0;
  WorkerId worker = 0;  // who completed it (its position in Run::workers())
  // Its number among the run's counted completions (counters.completions_accepted when it was
  // counted): the `n` of its series points. A restore withdraws completions of the lineage it
  // abandons, so the numbers of those kept need not follow each other.
  uint64_t n = 0;
};

// Step mode: what one rank's train batches took, by the batch times it reported
// (Completion::seconds), since the group of the current world size began.
struct RankPace {
  uint64_t batches = 0;
  uint64_t samples = 0;  // the samples its completions reported
  double seconds = 0;
  // Samples per second of its own batch time; 0 before any time was reported.
  double samples_per_s() const { return seconds > 0 ? static_cast<double>(samples) / seconds : 0; }
};

// ---- groups and checkpoint cuts (core/cut_ledger.h: the cuts themselves) ----

struct Restored {
  bool restored = false;        // false: this group had restored the same target already
  std::optional<uint64_t> cut;  // nullopt: a fresh start from the ledger as it is
  uint64_t generation = 0;
  uint64_t withdrawn_jobs = 0;  // completed jobs reopened
  uint64_t leases_voided = 0;
};

enum class GroupState : uint8_t { kCurrent, kRestoreRequired };

struct IndexReply {
  int64_t epoch = 0;
  uint64_t position = 0;
  std::optional<uint64_t> batch;  // the batch at that position, while inside the set
};

class Run {
 public:
  // REQUIRES: validate(config) succeeded. `clock` outlives the run.
  Run(RunConfig config, const Clock& clock);
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  const RunConfig& config() const { return config_; }
  // How the run hands its epochs out: kJobs or kSteps; kAuto (schedule.mode = "auto" on a config
  // that allows steps) until its first acquire, which chooses steps when the asking worker is a
  // rank of a group (registered with its group, rank and world size) and jobs otherwise, once
  // and for good (a mode_chosen event says which and why; docs/SEMANTICS.md).
  ScheduleMode mode() const { return mode_; }
  const Plan& plan() const { return plan_; }
  RunState state() const { return state_; }
  const std::string& state_reason() const { return state_reason_; }
  bool finished() const { return state_ != RunState::kRunning; }

  // Whether a worker of that name has joined (now or before).
  bool has_worker(std::string_view name) const { return worker_ids_.count(std::string(name)) != 0; }
  // The id of the worker registered under `name`, if one is.
  std::optional<WorkerId> worker_id(std::string_view name) const {
    auto it = worker_ids_.find(std::string(name));
    if (it == worker_ids_.end()) return std::nullopt;
    return it->second;
  }
  // A worker joins (or rejoins) under a stable name; the same name gives the same id. `group`:
  // the group it registers with (empty: none), which from now on fences its requests (a later
  // registration under the same name replaces it). REQUIRES: join_group(group) succeeded.
  WorkerId join(std::string_view name, std::string_view group = {},
                std::optional<GroupRank> rank = std::nullopt);
  // Whether a worker of `group` may register as `rank` (changing nothing): a rank is below
  // the world size, which is at most 2^20 (invalid_argument), and in step mode every rank of
  // a group gives the same world size (conflict, world_size_mismatch). (A step-mode run lets
  // a worker register without a rank; its acquires are refused, rank_required.)
  // `name`: the worker that registers (its own earlier registration is not another rank).
  Result<void> check_rank(std::string_view name, std::string_view group,
                          const std::optional<GroupRank>& rank) const;
  // The world size of the current group in step mode (0: none registered a rank yet).
  uint32_t group_ranks() const { return group_ranks_; }
  // The worker leaves: its live leases are given back at once (not counted as failures).
  Result<void> leave(WorkerId worker);

  // Hands the worker a job, asks it to wait (nothing open now, e.g. at an epoch barrier), or
  // says the run is finished. Fails only for an unknown worker. `request` (0: none) makes a
  // retry idempotent: the same id again gives back the job the first try handed out, while
  // its lease lives, instead of a second job (the first reply may have been lost).
  // `max_jobs` > 1 hands out up to that many jobs at once (`job`, then `more`): a worker that
  // holds its next job while it trains one never waits for a round trip.
  Result<Acquired> acquire(WorkerId worker, uint64_t request = 0, uint32_t max_jobs = 1);
  // Whether complete(worker, lease, ...) would be refused (an unknown worker, a lease never
  // issued, another worker's lease), changing nothing: a list of completions is checked whole
  // before any of it is applied.
  Result<void> check_completion(WorkerId worker, LeaseId lease) const;
  // Reports a finished job. Fails for an unknown worker, a lease never issued (kNotFound), or
  // a lease of another worker (kConflict); a repeated or late completion is not an error.
  Result<Completed> complete(WorkerId worker, LeaseId lease, const Completion& completion);
  // complete + acquire in one call.
  Result<NextJob> next_job(WorkerId worker, LeaseId lease, const Completion& completion,
                           uint64_t request = 0);
  // Extends the worker's live leases; returns the leases it still holds. With `only`, just the
  // leases listed there are extended: a lease whose hand-out the worker never heard of (the
  // reply was lost) is then left to expire instead of being kept alive forever.
  Result<std::vector<LeaseId>> heartbeat(WorkerId worker,
                                         const std::vector<LeaseId>* only = nullptr);
  // The worker gives up a job it could not do; it counts as a failed attempt.
  Result<void> fail(WorkerId worker, LeaseId lease, std::string_view reason);
  // The worker hands jobs back untouched (a loop that stopped early, a prefetched job it will
  // not train): each goes back to the front of its epoch's open queue, not counted as a failed
  // attempt, and a later completion through the lease is answered `given_up`. All or nothing:
  // fails for an unknown worker, a lease never issued (kNotFound) or another worker's
  // (kConflict), changing nothing. A lease already resolved is skipped. Returns how many
  // jobs went back.
  Result<uint64_t> release(WorkerId worker, const std::vector<LeaseId>& leases);
  // The compatibility counter: the next position of the latest opened epoch of `set`.
  Result<IndexReply> next_index(SetKind set);
  // Ends the run; nothing more is handed out. No effect on a finished run.
  void cancel(std::string reason);
  // Returns every lease whose deadline has passed to the open queue (every call does this).
  void expire_leases();

  // ---- groups and checkpoint cuts ----
  // The group a registering worker belongs to (empty: ungrouped, never fenced). A new group
  // takes the run over when the run has no complete cut: generation + 1, and the leases of the
  // group before it are voided. With a complete cut, it must restore first (kRestoreRequired).
  // Fails (stale_generation) for a group that was current before.
  Result<GroupState> join_group(std::string_view group);
  // Whether a request of `group` is served: empty or the current group. Fails with
  // stale_generation (an earlier group), restore_required (a new group while cuts exist) or
  // worker_not_registered (a new group that has not registered).
  Result<void> admit(std::string_view group) const;
  // Whether a request of `worker` that names `group` (empty: names none) is served. A worker
  // that registered with a group is judged by that group, whatever the request names: one of
  // a replaced group is refused stale_generation even when it names no group or the current
  // one, and a request naming another group than its worker's is refused group_mismatch
  // (stale_generation when the group it names was replaced). A worker that registered without
  // a group is judged by the group the request names (as admit(group)). REQUIRES: `worker`
  // has joined.
  Result<void> admit(WorkerId worker, std::string_view group) const;
  // Rank `rank` of the current group (of `world_size` ranks) gives its share of the group's
  // `seq`-th cut: the jobs it holds partly trained. Complete once every rank gave its share:
  // the run as of then is saved. Repeating a share changes nothing.
  Result<CutShareReply> cut(WorkerId worker, std::string_view group, uint64_t seq, uint32_t rank,
                            uint32_t world_size, const std::vector<CutPart>& parts);
  // `group` takes the run over from the cut `cut` (nullopt: from the ledger as it is).
  Result<Restored> restore(std::string_view group, std::optional<uint64_t> cut);
  const std::deque<Cut>& cuts() const { return cuts_.cuts(); }
  const Cut* find_cut(uint64_t id) const { return cuts_.find(id); }
  const Cut* latest_cut() const { return cuts_.latest(); }  // the latest complete cut
  const std::string& group() const { return group_; }
  uint64_t generation() const { return generation_; }
  // The rendezvous of the run's `launch` agents (core/rendezvous.h).
  Rendezvous& rendezvous() { return rendezvous_; }
  const Rendezvous& rendezvous() const { return rendezvous_; }

  // The order of an epoch: maps a job's positions to batch indices.
  EpochOrder order_of(int64_t epoch, SetKind set) const;
  // Appends the batch indices of `job` to `out`.
  void batches_of(const Job& job, std::vector<uint64_t>* out) const;

  const std::vector<Epoch>& epochs() const { return epochs_; }
  // Cost-balanced step mode: whether `job`'s train epoch still waits for its warm-up re-plan
  // (laid out with the declared cost, not re-planned yet, steps left to re-plan). What it waits
  // for is the ranks' reports: the API says so with the job (`warming_up`), and a client then
  // sends each report at once and holds only a step or two ahead, so that fewer steps are
  // begun, and kept, as planned blind.
  // Bounded: false once its ranks completed jobs without reporting times, once the model has
  // every rank's speed and the re-plan still did not come (a fit no budget bounds), and after
  // kWarmingUpSteps steps beyond the ones the model needs.
  bool warming_up(const Job& job) const;
  static constexpr uint64_t kWarmingUpSteps = 16;
  // Cost-balanced step mode: the cost model fitted from the batch times the ranks reported
  // (Completion::seconds), for the world size of the latest reports (a report at another world
  // size starts a new model); null before any report. The next epoch laid out is planned with
  // it once fitted (its cost and speeds frozen into the epoch).
  const CostModel* cost_model() const { return cost_model_ ? &*cost_model_ : nullptr; }
  // Step mode: each rank's pace (RankPace), one per rank of the world size of the latest
  // report; empty before any. Not saved in snapshots: a restart (or a replay from a snapshot)
  // starts it afresh, as recent_completions().
  const std::vector<RankPace>& rank_pace() const { return pace_; }
  // The steps of a cost-balanced step-mode epoch. REQUIRES: e is one of epochs() (or of a
  // cut's), laid out (e.steps()), and the run is cost-balanced.
  const StepPlan& cost_plan(const Epoch& e) const;
  // The plan of a laid-out epoch's segment under `c`, as one plan (no warm-up re-plan): what
  // cost_plan builds on. REQUIRES: check_step_config(c) passed.
  StepPlan plan_layout(const Epoch& e, const StepPlanConfig& c) const;
  const std::vector<WorkerInfo>& workers() const { return workers_; }
  const EarlyStopRule& early_stop() const { return early_stop_; }
  const RunCounters& counters() const { return counters_; }
  // The jobs the whole run will hand out if it is not stopped early.
  uint64_t planned_jobs() const;
  // Recent events, oldest first, at most kEventsKept; seq grows by one per event.
  const std::deque<Event>& events() const { return events_; }
  // One past the latest train epoch opened (the start epoch when none is): the least target
  // epoch a changed schedule.epochs may give this run.
  int64_t opened_train_end() const;
  // Says, as a config_changed event, what --apply-config-changes changed in this run.
  void note_config_change(std::string what) { emit(EventKind::kConfigChanged, std::move(what)); }
  // Takes what `before` shows but does not save (its recent events and completions): for a run
  // loaded from before's saved state under a changed config while it is served, so that the
  // change does not look like a restart. Nothing it decides reads them.
  void keep_views_of(const Run& before) {
    events_ = before.events_;
    recent_ = before.recent_;
  }
  // How many events were ever emitted (they are numbered from 1): a call that moves it did
  // something (a lease expired, an epoch opened, a worker joined, ...).
  uint64_t event_seq() const { return event_seq_; }
  static constexpr size_t kEventsKept = 1024;
  // The latest counted completions, oldest first, at most kRecentKept (not saved in
  // snapshots: a restart starts the list afresh).
  const std::deque<RecentCompletion>& recent_completions() const { return recent_; }
  // Every counted completion's loss and metrics, per set, for the whole run, downsampled
  // (core/run_series.h); snapshots keep them.
  const RunSeries& series() const { return series_; }
  static constexpr size_t kRecentKept = 4096;

 private:
  friend class RunCodec;  // run_codec.cc: saves and restores the whole state

  struct Lease {
    WorkerId worker;
    uint32_t epoch_slot;  // index into epochs_
    uint64_t position;
    uint32_t attempt;
    TimeMs deadline;
    bool live;
    std::list<LeaseId>::iterator order;  // in live_order_ while live
  };
  struct Resolved {  // what became of a lease that no longer lives in leases_
    LeaseId lease = 0;
    WorkerId worker = 0;
    CompletionOutcome outcome = CompletionOutcome::kStale;
  };

  Result<WorkerInfo*> worker_of(WorkerId worker);
  bool take_open_job(WorkerId worker, Job* out);
  bool take_step_job(WorkerId worker, Job* out);
  // Lays the epoch out in steps for `ranks` ranks: all of it, or what an earlier layout left
  // (its jobs given back, and its steps never handed out). REQUIRES: no live lease in it.
  void lay_out(Epoch& e, uint32_t ranks);
  // Fixed-batch step mode: the epoch's layout and segment, cached in it (Epoch::fixed_steps).
  std::shared_ptr<const Epoch::FixedSteps> fixed_steps_of(const Epoch& e) const;
  const StepLayout& layout_of(const Epoch& e) const;
  // The number of steps of a laid-out epoch, either kind of step mode.
  uint64_t steps_of(const Epoch& e) const;
  // Appends the sample indices of rank `rank`'s batch of step `step` of a laid-out epoch.
  void step_batch(const Epoch& e, uint64_t step, uint32_t rank, std::vector<uint64_t>* out) const;
  // Cost-balanced: freezes the cost and speeds the epoch is (re)planned with, from the cost
  // model now; and the planner's config of an epoch.
  void freeze_cost(Epoch& e) const;
  // The fitted model's cost (in the budget's units) and speeds for an epoch laid out for
  // e.ranks ranks; false when the model does not apply (none, another world size, not fitted,
  // a fit no budget bounds): then the declared cost and every rank alike.
  bool fitted_cost(const Epoch& e, BatchCost* cost, std::vector<double>* speeds) const;
  StepPlanConfig step_config(const Epoch& e) const;
  // The cost model's options under this run's rules (RunConfig::declared_shape_fit).
  CostModelOptions cost_model_options() const;
  // `plan` with its steps from `kept` on planned anew under `c` (plan_rest_of_epoch of their
  // samples). REQUIRES: kept < plan.steps.size().
  StepPlan replanned(const Epoch& e, StepPlan plan, uint64_t kept, const StepPlanConfig& c) const;
  // The warm-up re-plan (Epoch::replanned_after): due when a laid-out cost-balanced epoch was
  // planned with the declared cost, has steps never begun, and the cost model is fitted for its
  // ranks with every rank's speed; warm_up re-plans those steps.
  bool warm_up_due(const Epoch& e) const;
  void warm_up(Epoch& e);
  const std::vector<double>& lengths_of(SetKind set) const;
  void report_batch_time(const Epoch& e, uint64_t position, double seconds);
  void note_pace(const Epoch& e, uint64_t position, const Completion& completion);
  uint64_t set_samples(SetKind set) const;
  uint32_t ranks_of_group(std::string_view group, std::string_view except = {}) const;
  Job hand_out(WorkerId worker, uint32_t epoch_slot, uint64_t position);
  Job job_of(LeaseId id) const;
  bool open_next_epoch();
  void close_epoch(uint32_t epoch_slot);
  void judge_dev_epochs();
  void advance();
  void finish(RunState state, std::string reason);
  void unlink_live(LeaseId id, Lease& lease);
  void resolve(std::unordered_map<LeaseId, Lease>::iterator it, CompletionOutcome outcome);
  void count_completion(Epoch& epoch, const Completion& completion);
  void count_failure(uint32_t epoch_slot, uint64_t position, const std::string& why);
  void remember(LeaseId lease, WorkerId worker, CompletionOutcome outcome);
  void emit(EventKind kind, std::string text);
  // After a load with a changed schedule.epochs (--apply-config-changes): the epochs opened stay
  // as they were, and a run that had completed its schedule goes on with the epochs a higher
  // target adds. Returns what is wrong (an epoch opened past the target: --apply-config-changes
  // refuses such a config before, so here it is damage), or "".
  std::string take_target();
  TimeMs retry_hint() const;
  uint64_t void_leases();
  // The run's progress (core/run_progress.h), leases and all; and taking one on.
  RunProgress progress() const;
  // schedule.mode = "auto": the first acquire, by worker `w`, chooses the mode (mode()).
  void choose_mode(const WorkerInfo& w);
  void take_progress(RunProgress progress);
  void take_over(std::string_view group, std::string target, uint64_t voided);
  bool is_past_group(std::string_view group) const;
  uint64_t jobs_done() const;

  RunConfig config_;
  ScheduleMode mode_;  // mode(): the config's, or kAuto until the first acquire chooses
  Plan plan_;
  const Clock& clock_;
  RunState state_ = RunState::kRunning;
  std::string state_reason_;
  EarlyStopRule early_stop_;

  std::vector<Epoch> epochs_;          // every epoch opened, in opening order
  std::vector<uint32_t> running_;      // slots of the epochs not closed yet, in opening order
  std::deque<uint32_t> dev_to_judge_;  // dev epochs whose result early stopping has not seen
  int64_t next_epoch_ = 0;             // the schedule: the next epoch to open ...
  bool next_is_dev_ = false;           // ... and whether it is its dev part
  std::optional<uint32_t> latest_of_set_[2];

  std::vector<WorkerInfo> workers_;
  std::unordered_map<std::string, WorkerId> worker_ids_;

  LeaseId last_lease_ = 0;
  std::unordered_map<LeaseId, Lease> leases_;  // live and expired-unresolved leases
  std::list<LeaseId> live_order_;  // live leases, soonest deadline first (one timeout per run)
  std::vector<Resolved> history_;  // a ring, slot lease % lease_history

  RunCounters counters_;
  std::deque<Event> events_;
  uint64_t event_seq_ = 0;
  std::deque<RecentCompletion> recent_;
  RunSeries series_;

  std::string group_;                    // the current group ("": none yet)
  uint64_t generation_ = 0;              // + 1 for every group that took the run over
  std::deque<std::string> past_groups_;  // earlier groups, oldest first, at most kPastGroupsKept
  std::string restored_;                 // what group_ restored: "cut N", "fresh", or ""
  uint32_t group_ranks_ = 0;             // step mode: the world size of group_ (0: unknown)
  CutLedger cuts_;                       // complete cuts, and the pending ones of group_
  std::optional<CostModel> cost_model_;  // cost-balanced step mode (cost_model())
  // The mean length of each set (cost-balanced; a function of the config, computed once).
  mutable std::optional<double> mean_length_[2];
  std::vector<RankPace> pace_;  // step mode (rank_pace())
  Rendezvous rendezvous_;

 public:
  static constexpr size_t kPastGroupsKept = 1024;
  static constexpr size_t kPendingCutsKept = CutLedger::kPendingKept;
};

}  // namespace traincoord
