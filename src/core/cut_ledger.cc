#include "core/cut_ledger.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <utility>

namespace traincoord {

const Cut* CutLedger::find(uint64_t id) const {
  for (const Cut& c : cuts_) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

const Cut* CutLedger::latest() const {
  for (auto it = cuts_.rbegin(); it != cuts_.rend(); ++it) {
    if (it->complete()) return &*it;
  }
  return nullptr;
}

Cut* CutLedger::find_share(std::string_view group, uint64_t seq) {
  auto it = std::find_if(cuts_.begin(), cuts_.end(),
                         [&](const Cut& c) { return c.group == group && c.seq == seq; });
  return it == cuts_.end() ? nullptr : &*it;
}

const Cut* CutLedger::find_share(std::string_view group, uint64_t seq) const {
  return const_cast<CutLedger*>(this)->find_share(group, seq);
}

// ---- shares ----

Result<std::optional<CutShareReply>> CutLedger::check_share(std::string_view group, uint64_t seq,
                                                            uint32_t rank,
                                                            uint32_t world_size) const {
  const Cut* existing = find_share(group, seq);
  if (existing == nullptr) return std::nullopt;
  if (existing->world_size != world_size) {
    return conflict("cut " + std::to_string(existing->id) + " (the group's cut " +
                        std::to_string(seq) + ") has world_size " +
                        std::to_string(existing->world_size) + ", this share says " +
                        std::to_string(world_size),
                    error_reason::kCutMismatch);
  }
  if (std::binary_search(existing->ranks.begin(), existing->ranks.end(), rank)) {
    return reply_of(*existing);  // a repeated share
  }
  return std::nullopt;
}

Result<void> CutLedger::check_part(std::string_view group, uint64_t seq, LeaseId lease,
                                   uint32_t epoch_slot, uint64_t position) const {
  const Cut* existing = find_share(group, seq);
  if (existing == nullptr) return {};
  for (const Cut::Share& other : existing->shares) {
    if (other.epoch_slot == epoch_slot && other.position == position) {
      return conflict("job " + std::to_string(other.position) + " of lease " +
                          std::to_string(lease) + " is in another rank's share of cut " +
                          std::to_string(existing->id) +
                          " already (its lease there expired): take a new cut",
                      error_reason::kLeaseNotHeld);
    }
  }
  return {};
}

Cut& CutLedger::add_share(std::string_view group, uint64_t seq, uint64_t generation, uint32_t rank,
                          uint32_t world_size, std::vector<Cut::Share> shares, TimeMs now) {
  Cut* cut = find_share(group, seq);
  if (cut == nullptr) {
    size_t pending = 0;
    for (const Cut& c : cuts_) pending += !c.complete();
    if (pending >= kPendingKept) {  // shares that never completed: drop the oldest
      cuts_.erase(
          std::find_if(cuts_.begin(), cuts_.end(), [](const Cut& c) { return !c.complete(); }));
    }
    Cut c;
    c.id = ++last_id_;
    c.group = std::string(group);
    c.seq = seq;
    c.generation = generation;
    c.world_size = world_size;
    c.created_at = now;
    cuts_.push_back(std::move(c));
    cut = &cuts_.back();
  }
  TC_ASSERT(!cut->complete() && cut->world_size == world_size);
  TC_ASSERT(!std::binary_search(cut->ranks.begin(), cut->ranks.end(), rank));
  cut->ranks.insert(std::upper_bound(cut->ranks.begin(), cut->ranks.end(), rank), rank);
  cut->shares.insert(cut->shares.end(), std::make_move_iterator(shares.begin()),
                     std::make_move_iterator(shares.end()));
  return *cut;
}

uint64_t CutLedger::complete(Cut& cut, RunProgress progress, TimeMs now) {
  TC_ASSERT(!cut.complete() && cut.ranks.size() == cut.world_size);
  // No lease survives into the saved state: every job in flight is open again (in position
  // order, ahead of the jobs already handed back), as after a restore.
  for (Epoch& e : progress.epochs) {
    if (e.closed()) continue;
    std::vector<uint64_t> in_flight;
    for (auto& [position, job] : e.active) {
      if (job.live != 0) in_flight.push_back(position);
      job.live = 0;
      job.expired.clear();
    }
    std::sort(in_flight.begin(), in_flight.end());
    e.requeue.insert_front(in_flight);
    e.leased = 0;
  }
  cut.saved = std::move(progress);
  uint64_t nonfinite = 0;
  for (const Cut::Share& share : cut.shares) {
    Epoch& e = cut.saved.epochs[share.epoch_slot];
    // A job completed meanwhile through another lease (the share's lease had expired) is done
    // whole: nothing of it stays open.
    if (e.closed() || e.active.count(share.position) == 0) continue;
    e.trained[share.position] += share.batches;
    e.fold_report(share.completion);
    nonfinite += !std::isfinite(share.completion.loss);
    cut.partial_jobs += 1;
    cut.partial_batches += share.batches;
  }
  cut.shares.clear();
  cut.shares.shrink_to_fit();
  for (const Epoch& e : cut.saved.epochs) cut.jobs_done += e.done;
  cut.completed_at = now;
  // The promise, made here: checked of every snapshot that holds the cut, and again of the run
  // a restore of it leaves.
  if (const std::string broken = broken_promise(cut); !broken.empty()) {
    assertion_failed(("cut " + std::to_string(cut.id) + " breaks its promise: " + broken).c_str(),
                     __FILE__, __LINE__);
  }
  return nonfinite;
}

void CutLedger::keep_latest() {
  size_t complete = 0;
  for (const Cut& c : cuts_) complete += c.complete();
  while (complete > keep_complete_) {
    auto oldest =
        std::find_if(cuts_.begin(), cuts_.end(), [](const Cut& c) { return c.complete(); });
    cuts_.erase(oldest);
    complete -= 1;
  }
}

void CutLedger::drop_pending() {
  std::erase_if(cuts_, [](const Cut& c) { return !c.complete(); });
}

Result<void> CutLedger::check_restorable(uint64_t id, std::string_view run) const {
  const Cut* cut = find(id);
  if (cut == nullptr) {
    std::string kept;
    for (const Cut& c : cuts_) {
      if (c.complete()) kept += (kept.empty() ? "" : ", ") + std::to_string(c.id);
    }
    return not_found(
        "run " + std::string(run) + " has no cut " + std::to_string(id) +
            (kept.empty() ? std::string(" (it has none)") : " (it keeps cuts " + kept + ")"),
        error_reason::kCutNotFound);
  }
  if (!cut->complete()) {
    return failed_precondition(
        "cut " + std::to_string(id) + " is not complete: " + std::to_string(cut->ranks.size()) +
            " of its " + std::to_string(cut->world_size) + " ranks gave their share",
        error_reason::kCutIncomplete);
  }
  return {};
}

const Cut& CutLedger::restore(uint64_t id) {
  std::erase_if(cuts_, [&](const Cut& c) { return c.id > id; });
  const Cut* cut = find(id);
  TC_ASSERT(cut != nullptr && cut->complete());
  return *cut;
}

// ---- the promise ----

namespace {

// Equal, or both NaN (an epoch loss with no finite job, a metric never reported).
bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

uint64_t trained_batches(const Epoch& e) {
  uint64_t sum = 0;
  for (const auto& [position, batches] : e.trained) sum += batches;
  return sum;
}

}  // namespace

std::string CutLedger::broken_promise(const Cut& cut) const {
  if (!cut.complete()) return "it is not complete";
  return broken_promise(cut, cut.saved);
}

std::string CutLedger::broken_promise(const Cut& cut, const RunProgress& p) const {
  const size_t epochs = p.epochs.size();
  uint64_t done = 0, trained_jobs = 0, trained = 0;
  size_t open = 0, closed_dev = 0;
  for (size_t slot = 0; slot < epochs; ++slot) {
    const Epoch& e = p.epochs[slot];
    const std::string epoch = "epoch slot " + std::to_string(slot);
    done += e.done;
    trained_jobs += e.trained.size();
    trained += trained_batches(e);
    if (e.leased != 0) return epoch + " counts live leases";
    if (e.plan.first_job > e.plan.end_job || e.cursor < e.plan.first_job ||
        e.cursor > e.plan.end_job) {
      return epoch + " has its cursor outside its jobs";
    }
    if (e.resolved() + e.active.size() != e.cursor - e.plan.first_job) {
      return epoch + " counts " + std::to_string(e.done) + " jobs done, " +
             std::to_string(e.failed) + " failed and " + std::to_string(e.active.size()) +
             " active, but " + std::to_string(e.cursor - e.plan.first_job) + " were handed out";
    }
    if (e.finite_jobs + e.nonfinite_jobs < e.done + e.trained.size()) {
      return epoch + "'s aggregates count fewer reports than its done and partly trained jobs";
    }
    if (e.closed()) {
      closed_dev += e.plan.set == SetKind::kDev;
      if (!e.active.empty() || !e.requeue.empty() || e.resolved() != e.plan.size()) {
        return epoch + " is closed with jobs open";
      }
      continue;
    }
    open += 1;
    if (e.requeue.size() != e.active.size()) return epoch + " has active jobs not queued again";
    for (uint64_t position : e.requeue.positions()) {
      if (e.active.count(position) == 0) return epoch + " queues a job that is not active";
    }
    for (const auto& [position, job] : e.active) {
      if (job.live != 0 || !job.expired.empty()) return epoch + " has a job under a lease";
    }
    for (const auto& [position, batches] : e.trained) {
      if (e.active.count(position) == 0) return epoch + " has a partly trained job not active";
      if (batches == 0 || batches >= job_batches(e.set_batches, batches_per_job_, position).count) {
        return epoch + " has a partly trained job trained whole (or not at all)";
      }
    }
  }
  if (done != cut.jobs_done) {
    return "it counts " + std::to_string(cut.jobs_done) + " jobs done, its epochs " +
           std::to_string(done);
  }
  if (cut.partial_jobs > cut.partial_batches || cut.partial_jobs > trained_jobs ||
      cut.partial_batches > trained) {
    return "it counts " + std::to_string(cut.partial_jobs) + " partly trained jobs of " +
           std::to_string(cut.partial_batches) + " batches, its epochs hold " +
           std::to_string(trained_jobs) + " of " + std::to_string(trained);
  }
  if (p.running.size() != open) return "its running epochs are not its open ones";
  for (uint32_t slot : p.running) {
    if (slot >= epochs || p.epochs[slot].closed()) return "a running epoch that is not open";
  }
  for (uint32_t slot : p.dev_to_judge) {
    if (slot >= epochs || p.epochs[slot].plan.set != SetKind::kDev) {
      return "a dev epoch to judge that is not a dev epoch";
    }
  }
  for (const auto& latest : p.latest_of_set) {
    if (latest && *latest >= epochs) return "a latest epoch that does not exist";
  }
  if (p.state == RunState::kEarlyStopped && !p.early_stop.stopped) {
    return "the run stopped early, but early stopping did not stop";
  }
  if (p.early_stop.observed.size() > closed_dev) {
    return "early stopping observed more dev epochs than closed";
  }
  return {};
}

void CutLedger::assert_restored(const Cut& cut, const RunProgress& restored) const {
  auto fail = [&](const std::string& what) {
    assertion_failed(("the restore of cut " + std::to_string(cut.id) +
                      " does not leave the run as the cut saved it: " + what)
                         .c_str(),
                     __FILE__, __LINE__);
  };
  TC_ASSERT(cut.complete());
  // The promise holds of the run as restored: jobs done as the cut counted them, no lease, ...
  if (const std::string broken = broken_promise(cut, restored); !broken.empty()) fail(broken);
  // ... and it is what the cut saved.
  const RunProgress& saved = cut.saved;
  if (restored.state != saved.state) fail("its state");
  if (restored.epochs.size() != saved.epochs.size()) fail("its epochs");
  for (size_t slot = 0; slot < saved.epochs.size(); ++slot) {
    const Epoch& a = restored.epochs[slot];
    const Epoch& b = saved.epochs[slot];
    const std::string epoch = "epoch slot " + std::to_string(slot);
    if (a.plan.epoch != b.plan.epoch || a.plan.set != b.plan.set || a.closed() != b.closed()) {
      fail(epoch + ": another epoch");
    }
    if (a.done != b.done || a.failed != b.failed || a.failed_jobs != b.failed_jobs) {
      fail(epoch + ": its counted jobs");
    }
    if (a.trained.size() != b.trained.size() || trained_batches(a) != trained_batches(b)) {
      fail(epoch + ": its partly trained batches");
    }
    // Step mode: the layout and what its plan was made with (the cost and speeds frozen, the
    // warm-up re-plan's steps kept and their cost): the same plan, bit for bit.
    bool same_segment = a.segment.size() == b.segment.size();
    for (size_t i = 0; same_segment && i < a.segment.size(); ++i) {
      same_segment =
          a.segment[i].first == b.segment[i].first && a.segment[i].count == b.segment[i].count;
    }
    if (a.ranks != b.ranks || a.step_base != b.step_base || !same_segment) {
      fail(epoch + ": its step layout");
    }
    auto same_cost = [](const BatchCost& x, const BatchCost& y) {
      return x.a == y.a && x.b == y.b && x.c == y.c;
    };
    if (!same_cost(a.plan_cost, b.plan_cost) || a.plan_speeds != b.plan_speeds ||
        a.replanned_after != b.replanned_after || !same_cost(a.first_cost, b.first_cost)) {
      fail(epoch + ": what its steps were planned with");
    }
    if (!same(a.weighted_loss, b.weighted_loss) || a.samples != b.samples ||
        !same(a.plain_loss, b.plain_loss) || a.finite_jobs != b.finite_jobs ||
        a.nonfinite_jobs != b.nonfinite_jobs || !same(a.loss, b.loss) ||
        a.metrics.size() != b.metrics.size()) {
      fail(epoch + ": its loss aggregates");
    }
    for (size_t m = 0; m < a.metrics.size(); ++m) {
      const Epoch::MetricSum& x = a.metrics[m];
      const Epoch::MetricSum& y = b.metrics[m];
      if (x.name != y.name || !same(x.weighted, y.weighted) || x.samples != y.samples ||
          !same(x.plain, y.plain) || x.count != y.count) {
        fail(epoch + ": its metric " + y.name);
      }
    }
  }
  if (restored.running != saved.running || restored.dev_to_judge != saved.dev_to_judge ||
      restored.next_epoch != saved.next_epoch || restored.next_is_dev != saved.next_is_dev) {
    fail("its schedule");
  }
  const EarlyStopState& x = restored.early_stop;
  const EarlyStopState& y = saved.early_stop;
  bool observed = x.observed.size() == y.observed.size();
  for (size_t i = 0; observed && i < x.observed.size(); ++i) {
    observed = x.observed[i].first == y.observed[i].first &&
               same(x.observed[i].second, y.observed[i].second);
  }
  if (!observed || !same(x.best_value, y.best_value) || x.best_epoch != y.best_epoch ||
      x.wait != y.wait || x.stopped != y.stopped || x.stopped_at_epoch != y.stopped_at_epoch) {
    fail("its early stopping");
  }
}

std::string CutLedger::inconsistency(std::string_view group, size_t epochs) const {
  uint64_t last_id = 0;
  for (const Cut& cut : cuts_) {
    const std::string what = "cut " + std::to_string(cut.id);
    if (cut.id <= last_id || cut.id > last_id_) return what + " out of order";
    last_id = cut.id;
    if (cut.world_size == 0 || cut.ranks.size() > cut.world_size)
      return what + " has too many ranks";
    for (size_t i = 0; i < cut.ranks.size(); ++i) {
      if (cut.ranks[i] >= cut.world_size || (i > 0 && cut.ranks[i] <= cut.ranks[i - 1])) {
        return what + " has ranks out of order";
      }
    }
    if (cut.complete() != (cut.ranks.size() == cut.world_size)) {
      return what + " is complete or not against its ranks";
    }
    if (cut.complete() && !cut.shares.empty()) return what + " is complete with shares pending";
    if (!cut.complete() && cut.group != group) return what + " is pending for another group";
    for (const Cut::Share& share : cut.shares) {
      if (share.epoch_slot >= epochs) return what + " has a share of an epoch that does not exist";
    }
    for (uint32_t slot : cut.saved.running) {
      if (slot >= cut.saved.epochs.size()) return what + " has a running epoch that does not exist";
    }
    if (cut.complete()) {
      if (const std::string broken = broken_promise(cut); !broken.empty()) {
        return what + " breaks its promise: " + broken;
      }
    }
  }
  return {};
}

}  // namespace traincoord
