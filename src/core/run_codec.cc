#include "core/run_codec.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace traincoord {

namespace {

constexpr uint32_t kMagic = 0x54435231;  // "TCR1"
// 2: workers' last acquire request. 3: an epoch's loss and metric aggregates are running means,
// no longer sums (same layout; a format 2 snapshot is read and its sums turned into means).
// 4: checkpoint cuts: each epoch's partly trained jobs, the groups, the cuts (each with the
// saved progress, in the layout of the run's own), four counters. 5: the rendezvous of the
// launch agents. 6: the rendezvous keeps each node's secret hash, and the running round's layout
// (each member's processes, the master's address and port) as it formed (format 5 is read: its
// layout taken from the nodes present, and its nodes without a secret). 7: the group each worker
// registered with (which fences its requests; before 7 every worker reads as ungrouped). 8: step
// mode: each epoch's layout (ranks, step base, segment), each worker's rank and world size, the
// current group's world size (before 8 every epoch reads as a job-mode one). 9: cost-balanced
// step mode: each epoch's frozen cost and speeds (the run's, then each cut's), the run's cost
// model (before 9: every epoch as planned with the declared cost, no model). 10: the run's mode
// (schedule.mode = "auto" chooses it at the first acquire; before 10 a run is in the mode its
// config says, and "auto", which did not exist, reads as jobs: an older config without the key
// was a job-mode run). 11: each epoch's warm-up re-plan (the steps it kept and the cost they were
// planned with; the run's epochs, then each cut's), after the mode (before 11: none re-planned).
constexpr uint32_t kFormat = 11;
constexpr uint32_t kOldestFormat = 2;

// What a step-mode epoch's layout must be (empty: nothing wrong), checked before anything
// builds a layout of it (which asserts).
std::string step_layout_inconsistency(const Run& run, const Epoch& e) {
  const RunConfig& config = run.config();
  if (e.ranks == 0) {
    if (!e.plan_speeds.empty()) return " has speeds but no layout";
    if (e.replanned_after != 0) return " is re-planned but has no layout";
    return e.segment.empty() ? "" : " has a segment but no layout";
  }
  if (run.mode() == ScheduleMode::kJobs || (config.batch_size == 0 && !config.cost_balanced())) {
    return " is laid out in steps, but the run hands out jobs";
  }
  if (e.ranks > (1u << 20)) return " is laid out for more than 2^20 ranks";
  const uint64_t samples =
      e.plan.set == SetKind::kTrain ? config.train_samples : config.dev_samples;
  uint64_t end = 0;
  for (const PositionRun& run : e.segment) {
    if (run.count == 0 || run.first < end || run.first > samples ||
        run.count > samples - run.first || (end > 0 && run.first == end)) {
      return " has a segment whose runs are not ascending within its set";
    }
    end = run.first + run.count;
  }
  if (e.step_base < e.plan.first_job || e.step_base > e.cursor ||
      (e.cursor - e.step_base) % e.ranks != 0) {
    return " has its step base or cursor off its steps";
  }
  if (config.cost_balanced()) {
    // What the plan is built from must be a plan's config before it is built (it asserts).
    StepPlanConfig c;
    c.ranks = e.ranks;
    c.batch_budget = config.batch_budget;
    c.cost = e.plan_cost;
    c.speeds = e.plan_speeds;
    const std::vector<double>& lengths =
        e.plan.set == SetKind::kTrain ? config.train_lengths : config.dev_lengths;
    if (auto ok = check_step_config(c, lengths.size(), lengths); !ok) {
      return " has a frozen cost model no plan takes (" + ok.error().message + ")";
    }
    if (e.replanned_after > 0) {
      // The warm-up re-plan kept the steps begun, planned with the declared cost, and froze the
      // fitted model for the rest: a model (speeds), and a cursor at or past the steps kept.
      if (e.plan_speeds.empty()) return " is re-planned without a fitted model";
      if ((e.cursor - e.step_base) / e.ranks < e.replanned_after) {
        return " is re-planned after steps it has not begun";
      }
      StepPlanConfig first = c;
      first.cost = e.first_cost;
      first.speeds.clear();
      if (auto ok = check_step_config(first, lengths.size(), lengths); !ok) {
        return " has a cost before its re-plan no plan takes (" + ok.error().message + ")";
      }
      if (!e.closed() && run.plan_layout(e, first).steps.size() <= e.replanned_after) {
        return " is re-planned after more steps than it had";
      }
    }
    // (A closed epoch's plan is not rebuilt to be checked: it is never used again, and a
    // snapshot of a long run would otherwise plan every epoch it ever had.)
    if (!e.closed() && e.plan.end_job - e.step_base != run.cost_plan(e).steps.size() * e.ranks) {
      return " has another number of jobs than its cost-balanced steps";
    }
    return "";
  }
  if (!e.plan_speeds.empty()) return " has speeds, but its batches are of a fixed size";
  if (e.replanned_after != 0) return " is re-planned, but its batches are of a fixed size";
  const StepLayout layout(EpochSegment(e.segment).places(), config.batch_size, e.ranks);
  if (e.plan.end_job - e.step_base != layout.steps() * e.ranks) {
    return " has another number of jobs than its steps";
  }
  return "";
}

class Writer {
 public:
  void u64(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v) << 1 ^ static_cast<uint64_t>(v >> 63)); }
  void f64(double v) {
    char b[8];
    std::memcpy(b, &v, 8);
    out_.append(b, 8);
  }
  void str(std::string_view s) {
    u64(s.size());
    out_.append(s);
  }
  void boolean(bool b) { u64(b ? 1 : 0); }
  void append(std::string_view bytes) { out_.append(bytes); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool ok() const { return ok_; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= in_.size()) return fail();
      const auto byte = static_cast<uint8_t>(in_[pos_++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    return fail();
  }
  int64_t i64() {
    const uint64_t v = u64();
    return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
  }
  double f64() {
    if (in_.size() - pos_ < 8) return static_cast<double>(fail());
    double v;
    std::memcpy(&v, in_.data() + pos_, 8);
    pos_ += 8;
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    if (!ok_ || n > in_.size() - pos_) {
      fail();
      return {};
    }
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  bool boolean() { return u64() != 0; }
  // A count of items that each take at least one byte: larger than what is left is corrupt.
  uint64_t count() {
    const uint64_t n = u64();
    if (n > in_.size() - pos_) return fail();
    return n;
  }
  bool at_end() const { return pos_ == in_.size(); }

 private:
  uint64_t fail() {
    ok_ = false;
    pos_ = in_.size();
    return 0;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

void write_series(Writer& w, const RunSeries& all) {
  w.u64(all.all().size());
  for (const auto& [key, series] : all.all()) {
    w.u64(static_cast<uint64_t>(key.first));
    w.str(key.second);
    w.u64(series.stride());
    w.u64(series.count());
    w.u64(series.kept().size());
    auto point = [&](const SeriesPoint& p) {
      w.u64(p.n);
      w.i64(p.epoch);
      w.f64(p.value);
    };
    for (const SeriesPoint& p : series.kept()) point(p);
    w.boolean(series.latest().has_value());
    if (series.latest()) point(*series.latest());
  }
  w.u64(all.dropped_names());
}

void save_optional(Writer& w, const std::optional<int64_t>& v) {
  w.boolean(v.has_value());
  if (v) w.i64(*v);
}
std::optional<int64_t> load_optional(Reader& r) {
  if (!r.boolean()) return std::nullopt;
  return r.i64();
}

// The part of a run a cut saves, by reference: the run's own fields or a cut's RunProgress.
struct ProgressRef {
  RunState state;
  const std::string& reason;
  const EarlyStopState& early_stop;
  const std::vector<Epoch>& epochs;
  const std::vector<uint32_t>& running;
  const std::deque<uint32_t>& dev_to_judge;
  int64_t next_epoch;
  bool next_is_dev;
  const std::optional<uint32_t> (&latest_of_set)[2];
};

void encode_progress(Writer& w, const ProgressRef& p) {
  w.u64(static_cast<uint64_t>(p.state));
  w.str(p.reason);

  const EarlyStopState& es = p.early_stop;
  w.u64(es.observed.size());
  for (const auto& [epoch, value] : es.observed) {
    w.i64(epoch);
    w.f64(value);
  }
  w.f64(es.best_value);
  save_optional(w, es.best_epoch);
  w.i64(es.wait);
  w.boolean(es.stopped);
  save_optional(w, es.stopped_at_epoch);
  w.str(es.reason);

  w.u64(p.epochs.size());
  for (const Epoch& e : p.epochs) {
    w.i64(e.plan.epoch);
    w.u64(static_cast<uint64_t>(e.plan.set));
    w.u64(e.plan.first_job);
    w.u64(e.plan.end_job);
    w.u64(e.set_batches);
    w.i64(e.opened_at);
    save_optional(w, e.closed_at);
    w.u64(e.done);
    w.u64(e.failed);
    w.u64(e.leased);
    w.u64(e.failed_jobs.size());
    for (uint64_t f : e.failed_jobs) w.u64(f);
    w.f64(e.weighted_loss);
    w.u64(e.samples);
    w.f64(e.plain_loss);
    w.u64(e.finite_jobs);
    w.u64(e.nonfinite_jobs);
    w.u64(e.metrics.size());
    for (const Epoch::MetricSum& m : e.metrics) {
      w.str(m.name);
      w.f64(m.weighted);
      w.u64(m.samples);
      w.f64(m.plain);
      w.u64(m.count);
    }
    w.f64(e.loss);
    w.u64(e.next_index);
    w.u64(e.cursor);
    w.u64(e.requeue.size());
    e.requeue.for_each([&](uint64_t p) { w.u64(p); });
    // Hash maps iterate in no fixed order: sort, so that equal states save equal bytes.
    std::vector<uint64_t> positions;
    positions.reserve(e.active.size());
    for (const auto& entry : e.active) positions.push_back(entry.first);
    std::sort(positions.begin(), positions.end());
    w.u64(positions.size());
    for (uint64_t position : positions) {
      const Epoch::ActiveJob& job = e.active.at(position);
      w.u64(position);
      w.u64(job.handouts);
      w.u64(job.failures);
      w.u64(job.live);
      w.u64(job.expired.size());
      for (LeaseId l : job.expired) w.u64(l);
    }
    w.u64(e.trained.size());
    for (const auto& [position, batches] : e.trained) {
      w.u64(position);
      w.u64(batches);
    }
  }
  w.u64(p.running.size());
  for (uint32_t s : p.running) w.u64(s);
  w.u64(p.dev_to_judge.size());
  for (uint32_t s : p.dev_to_judge) w.u64(s);
  w.i64(p.next_epoch);
  w.boolean(p.next_is_dev);
  for (const auto& latest : p.latest_of_set) {
    w.boolean(latest.has_value());
    if (latest) w.u64(*latest);
  }
}

void encode_completion(Writer& w, const Completion& c) {
  w.f64(c.loss);
  w.u64(c.samples);
  w.u64(c.metrics.size());
  for (const Metric& m : c.metrics) {
    w.str(m.name);
    w.f64(m.value);
  }
}

// Reads what encode_progress wrote; returns what is wrong, or empty.
std::string decode_progress(Reader& r, uint64_t format, RunProgress* p) {
  // Format 2 kept sums where format 3 keeps means: the mean is the sum over its count.
  auto mean_of = [&](double value, uint64_t count) {
    if (format >= 3) return value;
    return count == 0 ? 0.0 : value / static_cast<double>(count);
  };
  const uint64_t state = r.u64();
  if (state > static_cast<uint64_t>(RunState::kFailed)) return "an unknown run state";
  p->state = static_cast<RunState>(state);
  p->state_reason = r.str();

  EarlyStopState es;
  for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
    const int64_t epoch = r.i64();
    es.observed.emplace_back(epoch, r.f64());
  }
  es.best_value = r.f64();
  es.best_epoch = load_optional(r);
  es.wait = static_cast<int>(r.i64());
  es.stopped = r.boolean();
  es.stopped_at_epoch = load_optional(r);
  es.reason = r.str();
  p->early_stop = std::move(es);

  for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
    Epoch e;
    e.plan.epoch = r.i64();
    const uint64_t set = r.u64();
    if (set > static_cast<uint64_t>(SetKind::kDev)) return "an unknown set";
    e.plan.set = static_cast<SetKind>(set);
    e.plan.first_job = r.u64();
    e.plan.end_job = r.u64();
    e.set_batches = r.u64();
    e.opened_at = r.i64();
    e.closed_at = load_optional(r);
    e.done = r.u64();
    e.failed = r.u64();
    e.leased = r.u64();
    for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) e.failed_jobs.push_back(r.u64());
    e.weighted_loss = r.f64();
    e.samples = r.u64();
    e.weighted_loss = mean_of(e.weighted_loss, e.samples);
    e.plain_loss = r.f64();
    e.finite_jobs = r.u64();
    e.plain_loss = mean_of(e.plain_loss, e.finite_jobs);
    e.nonfinite_jobs = r.u64();
    for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) {
      Epoch::MetricSum ms;
      ms.name = r.str();
      ms.weighted = r.f64();
      ms.samples = r.u64();
      ms.plain = r.f64();
      ms.count = r.u64();
      ms.weighted = mean_of(ms.weighted, ms.samples);
      ms.plain = mean_of(ms.plain, ms.count);
      e.metrics.push_back(std::move(ms));
    }
    e.loss = r.f64();
    e.next_index = r.u64();
    e.cursor = r.u64();
    for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) e.requeue.push_back(r.u64());
    for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) {
      const uint64_t position = r.u64();
      Epoch::ActiveJob job;
      job.handouts = static_cast<uint32_t>(r.u64());
      job.failures = static_cast<uint32_t>(r.u64());
      job.live = r.u64();
      for (uint64_t x = 0, y = r.count(); x < y && r.ok(); ++x) job.expired.push_back(r.u64());
      e.active.emplace(position, std::move(job));
    }
    if (format >= 4) {
      for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) {
        const uint64_t position = r.u64();
        e.trained[position] = r.u64();
      }
    }
    p->epochs.push_back(std::move(e));
  }
  const uint64_t epochs = p->epochs.size();
  auto slot = [&](uint64_t v) { return static_cast<uint32_t>(v < epochs ? v : 0); };
  bool slots_ok = true;
  for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
    const uint64_t v = r.u64();
    slots_ok &= v < epochs;
    p->running.push_back(slot(v));
  }
  for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
    const uint64_t v = r.u64();
    slots_ok &= v < epochs;
    p->dev_to_judge.push_back(slot(v));
  }
  p->next_epoch = r.i64();
  p->next_is_dev = r.boolean();
  for (auto& latest : p->latest_of_set) {
    latest.reset();
    if (r.boolean()) {
      const uint64_t v = r.u64();
      slots_ok &= v < epochs;
      latest = slot(v);
    }
  }
  if (!slots_ok) return "an epoch slot that does not exist";
  return {};
}

Completion decode_completion(Reader& r) {
  Completion c;
  c.loss = r.f64();
  c.samples = r.u64();
  for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
    Metric m;
    m.name = r.str();
    m.value = r.f64();
    c.metrics.push_back(std::move(m));
  }
  return c;
}

}  // namespace

std::string RunCodec::save(const Run& run) { return save(run, true); }

std::string RunCodec::save(const Run& run, bool last_seen) {
  // What load() will check of these bytes must hold of the run they come from.
  if (const std::string broken = inconsistency(run); !broken.empty()) {
    assertion_failed(("run " + run.config_.name + " is inconsistent: " + broken).c_str(), __FILE__,
                     __LINE__);
  }
  std::string bytes = encode(run, last_seen);
#ifndef NDEBUG
  // What was written reads back to the same state.
  auto loaded = load(run.config_, bytes, run.clock_);
  TC_ASSERT(loaded);
  TC_ASSERT(encode(**loaded, last_seen) == bytes);
#endif
  return bytes;
}

std::string RunCodec::inconsistency(const Run& run) {
  if (static_cast<uint64_t>(run.state_) > static_cast<uint64_t>(RunState::kFailed)) {
    return "a run state outside the enum";
  }
  const size_t epochs = run.epochs_.size();
  std::vector<uint64_t> live_of_slot(epochs, 0);
  size_t live = 0;
  for (const auto& [id, l] : run.leases_) {
    const std::string lease = "lease " + std::to_string(id);
    if (id == 0 || id > run.last_lease_) return lease + " was never issued";
    if (l.epoch_slot >= epochs) return lease + " is of an epoch that does not exist";
    if (l.worker >= run.workers_.size()) return lease + " is of a worker that does not exist";
    const Epoch& e = run.epochs_[l.epoch_slot];
    auto job = e.active.find(l.position);
    if (job == e.active.end()) return lease + " is of a job that is not active";
    if (l.live) {
      live += 1;
      live_of_slot[l.epoch_slot] += 1;
      const std::vector<LeaseId>& held = run.workers_[l.worker].leases;
      if (job->second.live != id) return lease + " is live, but its job has another live lease";
      if (std::find(held.begin(), held.end(), id) == held.end()) {
        return lease + " is live, but its worker does not hold it";
      }
    } else {
      const std::vector<LeaseId>& expired = job->second.expired;
      if (std::find(expired.begin(), expired.end(), id) == expired.end()) {
        return lease + " expired, but its job does not list it";
      }
    }
  }
  if (run.live_order_.size() != live) return "the deadline order misses live leases";
  for (size_t slot = 0; slot < epochs; ++slot) {
    const Epoch& e = run.epochs_[slot];
    const std::string epoch = "epoch slot " + std::to_string(slot);
    if (e.plan.first_job > e.plan.end_job) return epoch + " ends before it begins";
    if (static_cast<uint64_t>(e.plan.set) > 1) return epoch + " is of a set outside the enum";
    if (e.leased != live_of_slot[slot]) return epoch + " counts its live leases wrong";
    auto in_plan = [&](uint64_t position) {
      return position >= e.plan.first_job && position < e.plan.end_job;
    };
    if (e.cursor < e.plan.first_job || e.cursor > e.plan.end_job) {
      return epoch + " has its cursor outside its jobs";
    }
    if (std::string broken = step_layout_inconsistency(run, e); !broken.empty()) {
      return epoch + broken;
    }
    for (uint64_t position : e.requeue.positions()) {
      if (!in_plan(position)) return epoch + " requeues a job outside its jobs";
    }
    for (const auto& [position, job] : e.active) {
      if (!in_plan(position)) return epoch + " has an active job outside its jobs";
      auto it = run.leases_.find(job.live);
      if (job.live != 0 && (it == run.leases_.end() || !it->second.live ||
                            it->second.epoch_slot != slot || it->second.position != position)) {
        return epoch + " has a job whose live lease is not live there";
      }
      for (LeaseId id : job.expired) {
        auto ex = run.leases_.find(id);
        if (ex == run.leases_.end() || ex->second.live || ex->second.epoch_slot != slot ||
            ex->second.position != position) {
          return epoch + " has a job whose expired lease is not expired there";
        }
      }
    }
  }
  for (size_t slot = 0; slot < epochs; ++slot) {
    const Epoch& e = run.epochs_[slot];
    for (const auto& [position, batches] : e.trained) {
      if (e.active.count(position) == 0) {
        return "epoch slot " + std::to_string(slot) +
               " has a partly trained job that is not active";
      }
      if (batches == 0 ||
          batches >= job_batches(e.set_batches, run.plan_.batches_per_job, position).count) {
        return "epoch slot " + std::to_string(slot) + " has a partly trained job trained whole";
      }
    }
  }
  if (!run.group_.empty() && run.generation_ == 0) return "a group at generation 0";
  if (std::string broken = run.cuts_.inconsistency(run.group_, epochs); !broken.empty()) {
    return broken;
  }
  for (uint32_t slot : run.running_) {
    if (slot >= epochs) return "a running epoch that does not exist";
  }
  for (uint32_t slot : run.dev_to_judge_) {
    if (slot >= epochs) return "a dev epoch to judge that does not exist";
  }
  for (const auto& latest : run.latest_of_set_) {
    if (latest && *latest >= epochs) return "a latest epoch that does not exist";
  }
  if (run.worker_ids_.size() != run.workers_.size()) return "two workers of the same name";
  size_t held = 0;
  for (const WorkerInfo& wi : run.workers_) held += wi.leases.size();
  if (held != live) return "the workers hold another number of leases than are live";
  for (size_t w = 0; w < run.workers_.size(); ++w) {
    const WorkerInfo& wi = run.workers_[w];
    auto id = run.worker_ids_.find(wi.name);
    if (id == run.worker_ids_.end() || id->second != w) return "worker names out of step";
    for (LeaseId l : wi.leases) {
      auto it = run.leases_.find(l);
      if (it == run.leases_.end() || !it->second.live || it->second.worker != w) {
        return "worker " + wi.name + " holds lease " + std::to_string(l) + ", not live of it";
      }
    }
  }
  for (const Run::Resolved& r : run.history_) {
    if (static_cast<uint64_t>(r.outcome) > static_cast<uint64_t>(CompletionOutcome::kStale)) {
      return "a remembered lease outcome outside the enum";
    }
  }
  return {};
}

std::string RunCodec::encode(const Run& run, bool last_seen) {
  Writer w;
  w.u64(kMagic);
  w.u64(kFormat);
  encode_progress(w, ProgressRef{run.state_, run.state_reason_, run.early_stop_.state(),
                                 run.epochs_, run.running_, run.dev_to_judge_, run.next_epoch_,
                                 run.next_is_dev_, run.latest_of_set_});

  w.u64(run.workers_.size());
  for (const WorkerInfo& wi : run.workers_) {
    w.str(wi.name);
    w.i64(wi.joined_at);
    w.i64(last_seen ? wi.last_seen : 0);
    w.boolean(wi.active);
    w.u64(wi.jobs_done);
    w.u64(wi.leases.size());
    for (LeaseId l : wi.leases) w.u64(l);
    w.u64(wi.last_request);
    w.u64(wi.last_request_lease);
  }

  w.u64(run.last_lease_);
  // Live leases in deadline order first, then the expired ones.
  auto save_lease = [&](LeaseId id) {
    const Run::Lease& l = run.leases_.at(id);
    w.u64(id);
    w.u64(l.worker);
    w.u64(l.epoch_slot);
    w.u64(l.position);
    w.u64(l.attempt);
    w.i64(l.deadline);
  };
  w.u64(run.live_order_.size());
  for (LeaseId id : run.live_order_) save_lease(id);
  std::vector<LeaseId> expired;
  for (const auto& [id, l] : run.leases_) {
    if (!l.live) expired.push_back(id);
  }
  std::sort(expired.begin(), expired.end());
  w.u64(expired.size());
  for (LeaseId id : expired) save_lease(id);
  w.u64(run.history_.size());
  for (const Run::Resolved& r : run.history_) {
    w.u64(r.lease);
    w.u64(r.worker);
    w.u64(static_cast<uint64_t>(r.outcome));
  }

  const RunCounters& c = run.counters_;
  for (uint64_t v : {c.handouts, c.rehandouts, c.lease_expiries, c.completions_accepted,
                     c.completions_duplicate, c.completions_foreign, c.completions_unknown,
                     c.failure_reports, c.jobs_failed, c.nonfinite_losses}) {
    w.u64(v);
  }
  w.u64(run.event_seq_);

  for (uint64_t v : {c.cuts, c.restores, c.jobs_withdrawn, c.leases_voided}) w.u64(v);
  w.str(run.group_);
  w.u64(run.generation_);
  w.u64(run.past_groups_.size());
  for (const std::string& g : run.past_groups_) w.str(g);
  w.str(run.restored_);
  w.u64(run.cuts_.last_id_);
  w.u64(run.cuts_.cuts_.size());
  for (const Cut& cut : run.cuts_.cuts_) {
    w.u64(cut.id);
    w.str(cut.group);
    w.u64(cut.seq);
    w.u64(cut.generation);
    w.u64(cut.world_size);
    w.u64(cut.ranks.size());
    for (uint32_t rank : cut.ranks) w.u64(rank);
    w.i64(cut.created_at);
    save_optional(w, cut.completed_at);
    w.u64(cut.shares.size());
    for (const Cut::Share& share : cut.shares) {
      w.u64(share.epoch_slot);
      w.u64(share.position);
      w.u64(share.batches);
      encode_completion(w, share.completion);
    }
    if (cut.complete()) {
      const RunProgress& p = cut.saved;
      encode_progress(w, ProgressRef{p.state, p.state_reason, p.early_stop, p.epochs, p.running,
                                     p.dev_to_judge, p.next_epoch, p.next_is_dev, p.latest_of_set});
      w.u64(cut.jobs_done);
      w.u64(cut.partial_jobs);
      w.u64(cut.partial_batches);
    }
  }
  const Rendezvous& rdzv = run.rendezvous_;
  TC_ASSERT(rdzv.inconsistency().empty());  // (what load checks)
  w.u64(rdzv.nodes_.size());
  for (const Rendezvous::Node& n : rdzv.nodes_) {
    w.str(n.name);
    w.str(n.addr);
    w.u64(n.nproc);
    w.u64(n.master_port);
    w.u64(n.round);
    w.i64(n.last_seen);
    w.boolean(n.has_secret);
    w.u64(n.secret.low);
    w.u64(n.secret.high);
  }
  w.u64(rdzv.round_);
  w.boolean(rdzv.formed_);
  w.u64(rdzv.members_.size());
  for (const Rendezvous::Member& m : rdzv.members_) {
    w.str(m.name);
    w.u64(m.nproc);
  }
  w.str(rdzv.master_addr_);
  w.u64(rdzv.master_port_);
  w.i64(rdzv.last_join_);
  w.u64(rdzv.min_nodes_);
  w.u64(rdzv.max_nodes_);
  w.i64(rdzv.settle_ms_);
  w.i64(rdzv.node_timeout_ms_);
  w.str(rdzv.last_end_);
  // (6) Each worker's group, in the workers' order.
  for (const WorkerInfo& wi : run.workers_) w.str(wi.group);
  // (8) Each worker's rank and world size (0: none), the current group's world size.
  for (const WorkerInfo& wi : run.workers_) {
    w.u64(wi.rank ? wi.rank->world_size : 0);
    w.u64(wi.rank ? wi.rank->rank : 0);
  }
  w.u64(run.group_ranks_);
  // (8) The step layout of each epoch: the run's, then those of each cut's saved progress.
  auto save_layouts = [&](const std::vector<Epoch>& epochs) {
    for (const Epoch& e : epochs) {
      w.u64(e.ranks);
      w.u64(e.step_base);
      w.u64(e.segment.size());
      for (const PositionRun& run : e.segment) {
        w.u64(run.first);
        w.u64(run.count);
      }
    }
  };
  save_layouts(run.epochs_);
  for (const Cut& cut : run.cuts_.cuts_) save_layouts(cut.saved.epochs);
  // (9) The cost and speeds each epoch's plan was frozen with, as layouts above.
  auto save_frozen = [&](const std::vector<Epoch>& epochs) {
    for (const Epoch& e : epochs) {
      w.f64(e.plan_cost.a);
      w.f64(e.plan_cost.b);
      w.f64(e.plan_cost.c);
      w.u64(e.plan_speeds.size());
      for (double v : e.plan_speeds) w.f64(v);
    }
  };
  save_frozen(run.epochs_);
  for (const Cut& cut : run.cuts_.cuts_) save_frozen(cut.saved.epochs);
  // (9) The cost model: its sums, exactly (the next fit depends on every bit of them).
  const CostModel* model = run.cost_model_ ? &*run.cost_model_ : nullptr;
  w.u64(model ? model->ranks() : 0);
  if (model) {
    for (const CostModel::RankSums& rs : model->ranks_) {
      for (const auto& row : rs.xx) {
        for (double v : row) w.f64(v);
      }
      for (double v : rs.xy) w.f64(v);
      w.u64(rs.count);
    }
    w.u64(model->reports_);
    for (double v : model->reference_theta_) w.f64(v);
    for (double v : model->reference_speed_) w.f64(v);
  }
  // (10) Each worker's samples done, the run's series (core/run_series.h), then its mode
  // (schedule.mode = "auto": the one its first acquire chose, or still auto).
  for (const WorkerInfo& wi : run.workers_) w.u64(wi.samples_done);
  write_series(w, run.series_);
  w.u64(static_cast<uint64_t>(run.mode_));
  // (11) Each epoch's warm-up re-plan: the run's, then each cut's.
  w.append(format11_bytes(run));
  return w.take();
}

std::string RunCodec::format11_bytes(const Run& run) {
  Writer w;
  auto save_replans = [&](const std::vector<Epoch>& epochs) {
    for (const Epoch& e : epochs) {
      w.u64(e.replanned_after);
      if (e.replanned_after > 0) {
        w.f64(e.first_cost.a);
        w.f64(e.first_cost.b);
        w.f64(e.first_cost.c);
      }
    }
  };
  save_replans(run.epochs_);
  for (const Cut& cut : run.cuts_.cuts_) save_replans(cut.saved.epochs);
  return w.take();
}

std::string RunCodec::format10_bytes(const Run& run) {
  Writer w;
  for (const WorkerInfo& wi : run.workers_) w.u64(wi.samples_done);
  write_series(w, run.series_);
  return w.take();
}

Result<std::unique_ptr<Run>> RunCodec::load(RunConfig config, std::string_view bytes,
                                            const Clock& clock) {
  auto corrupt = [&](const std::string& what) {
    return invalid_argument(
        "snapshot", "the saved state of run " + config.name + " is unreadable (" + what + ")");
  };
  Reader r(bytes);
  if (r.u64() != kMagic) return corrupt("not a run snapshot");
  const uint64_t format = r.u64();
  if (format < kOldestFormat || format > kFormat) {
    return corrupt("format " + std::to_string(format) + ", this build reads " +
                   std::to_string(kOldestFormat) + " to " + std::to_string(kFormat));
  }
  auto run = std::make_unique<Run>(std::move(config), clock);
  run->events_.clear();
  if (format < 10 && run->mode_ == ScheduleMode::kAuto) run->mode_ = ScheduleMode::kJobs;
  RunProgress progress;
  if (std::string broken = decode_progress(r, format, &progress); !broken.empty()) {
    return corrupt(broken);
  }
  bool slots_ok = true;
  run->take_progress(std::move(progress));
  const uint64_t epochs = run->epochs_.size();
  auto slot = [&](uint64_t v) { return static_cast<uint32_t>(v < epochs ? v : 0); };

  run->workers_.clear();
  run->worker_ids_.clear();
  for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
    WorkerInfo wi;
    wi.name = r.str();
    wi.joined_at = r.i64();
    wi.last_seen = r.i64();
    wi.active = r.boolean();
    wi.jobs_done = r.u64();
    for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) wi.leases.push_back(r.u64());
    wi.last_request = r.u64();
    wi.last_request_lease = r.u64();
    run->worker_ids_.emplace(wi.name, static_cast<WorkerId>(run->workers_.size()));
    run->workers_.push_back(std::move(wi));
  }

  run->last_lease_ = r.u64();
  run->leases_.clear();
  run->live_order_.clear();
  for (int live = 1; live >= 0; --live) {
    for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
      const LeaseId id = r.u64();
      Run::Lease l{};
      l.worker = static_cast<WorkerId>(r.u64());
      const uint64_t s = r.u64();
      slots_ok &= s < epochs && l.worker < run->workers_.size();
      l.epoch_slot = slot(s);
      l.position = r.u64();
      l.attempt = static_cast<uint32_t>(r.u64());
      l.deadline = r.i64();
      l.live = live == 1;
      if (l.live) {
        run->live_order_.push_back(id);
        l.order = std::prev(run->live_order_.end());
      }
      if (!run->leases_.emplace(id, l).second) {
        return corrupt("lease " + std::to_string(id) + " twice");
      }
    }
  }
  run->history_.clear();
  for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
    Run::Resolved res;
    res.lease = r.u64();
    res.worker = static_cast<WorkerId>(r.u64());
    const uint64_t outcome = r.u64();
    if (outcome > static_cast<uint64_t>(CompletionOutcome::kStale)) {
      return corrupt("an unknown lease outcome");
    }
    res.outcome = static_cast<CompletionOutcome>(outcome);
    run->history_.push_back(res);
  }
  RunCounters& c = run->counters_;
  for (uint64_t* v : {&c.handouts, &c.rehandouts, &c.lease_expiries, &c.completions_accepted,
                      &c.completions_duplicate, &c.completions_foreign, &c.completions_unknown,
                      &c.failure_reports, &c.jobs_failed, &c.nonfinite_losses}) {
    *v = r.u64();
  }
  run->event_seq_ = r.u64();
  if (format >= 4) {
    for (uint64_t* v : {&c.cuts, &c.restores, &c.jobs_withdrawn, &c.leases_voided}) *v = r.u64();
    run->group_ = r.str();
    run->generation_ = r.u64();
    for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) run->past_groups_.push_back(r.str());
    run->restored_ = r.str();
    run->cuts_.last_id_ = r.u64();
    for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
      Cut cut;
      cut.id = r.u64();
      cut.group = r.str();
      cut.seq = r.u64();
      cut.generation = r.u64();
      cut.world_size = static_cast<uint32_t>(r.u64());
      for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) {
        cut.ranks.push_back(static_cast<uint32_t>(r.u64()));
      }
      cut.created_at = r.i64();
      cut.completed_at = load_optional(r);
      for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) {
        Cut::Share share;
        share.epoch_slot = static_cast<uint32_t>(r.u64());
        share.position = r.u64();
        share.batches = r.u64();
        share.completion = decode_completion(r);
        cut.shares.push_back(std::move(share));
      }
      if (cut.complete() && r.ok()) {
        if (std::string broken = decode_progress(r, format, &cut.saved); !broken.empty()) {
          return corrupt("cut " + std::to_string(cut.id) + ": " + broken);
        }
        cut.jobs_done = r.u64();
        cut.partial_jobs = r.u64();
        cut.partial_batches = r.u64();
      }
      run->cuts_.cuts_.push_back(std::move(cut));
    }
  }
  if (format >= 5) {
    Rendezvous& rdzv = run->rendezvous_;
    for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
      Rendezvous::Node node;
      node.name = r.str();
      node.addr = r.str();
      node.nproc = static_cast<uint32_t>(r.u64());
      node.master_port = static_cast<uint16_t>(r.u64());
      node.round = r.u64();
      node.last_seen = r.i64();
      if (format >= 6) {
        node.has_secret = r.boolean();
        node.secret.low = r.u64();
        node.secret.high = r.u64();
      }
      rdzv.nodes_.push_back(std::move(node));
    }
    rdzv.round_ = r.u64();
    rdzv.formed_ = r.boolean();
    for (uint64_t i = 0, n = r.count(); i < n && r.ok(); ++i) {
      Rendezvous::Member m;
      m.name = r.str();
      if (format >= 6) m.nproc = static_cast<uint32_t>(r.u64());
      rdzv.members_.push_back(std::move(m));
    }
    if (format >= 6) {
      rdzv.master_addr_ = r.str();
      rdzv.master_port_ = static_cast<uint16_t>(r.u64());
    } else {
      // Format 5 kept no layout: the one the nodes present give (a member that left counts 0,
      // as format 5's own reading did).
      for (Rendezvous::Member& m : rdzv.members_) {
        if (const Rendezvous::Node* node = rdzv.find(m.name)) m.nproc = node->nproc;
      }
      if (!rdzv.members_.empty()) {
        if (const Rendezvous::Node* first = rdzv.find(rdzv.members_.front().name)) {
          rdzv.master_addr_ = first->addr;
          rdzv.master_port_ = first->master_port;
        }
      }
    }
    rdzv.last_join_ = r.i64();
    rdzv.min_nodes_ = static_cast<uint32_t>(r.u64());
    rdzv.max_nodes_ = static_cast<uint32_t>(r.u64());
    rdzv.settle_ms_ = r.i64();
    rdzv.node_timeout_ms_ = r.i64();
    rdzv.last_end_ = r.str();
    if (const std::string broken = rdzv.inconsistency(); r.ok() && !broken.empty()) {
      return corrupt("inconsistent: " + broken);
    }
  }
  if (format >= 7) {
    // Before 7 no worker's group was kept: each reads as ungrouped, judged by the group its
    // requests name, as it then was.
    for (WorkerInfo& wi : run->workers_) wi.group = r.str();
  }
  if (format >= 8) {
    for (WorkerInfo& wi : run->workers_) {
      const uint64_t world_size = r.u64();
      const uint64_t rank = r.u64();
      if (world_size > 0) {
        wi.rank = GroupRank{static_cast<uint32_t>(rank), static_cast<uint32_t>(world_size)};
      }
    }
    run->group_ranks_ = static_cast<uint32_t>(r.u64());
    auto load_layouts = [&](std::vector<Epoch>& epochs) {
      for (Epoch& e : epochs) {
        e.ranks = static_cast<uint32_t>(r.u64());
        e.step_base = r.u64();
        for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) {
          PositionRun run;
          run.first = r.u64();
          run.count = r.u64();
          e.segment.push_back(run);
        }
      }
    };
    load_layouts(run->epochs_);
    for (Cut& cut : run->cuts_.cuts_) load_layouts(cut.saved.epochs);
    // A laid-out epoch's queue is keyed by rank (in the order saved: the line is kept).
    // (A job queued twice is damage, said so here: a keyed queue holds each position once.)
    auto key_queues = [&](std::vector<Epoch>& epochs) {
      for (Epoch& e : epochs) {
        if (e.ranks == 0 || e.ranks > (1u << 20)) continue;
        std::vector<uint64_t> queued = e.requeue.positions();
        std::sort(queued.begin(), queued.end());
        if (std::adjacent_find(queued.begin(), queued.end()) != queued.end()) return false;
        e.requeue.by_rank(e.step_base, e.ranks);
      }
      return true;
    };
    bool queues_ok = key_queues(run->epochs_);
    for (Cut& cut : run->cuts_.cuts_) queues_ok = queues_ok && key_queues(cut.saved.epochs);
    if (!queues_ok) return corrupt("inconsistent: a step-mode epoch queues a job twice");
  }
  if (format >= 9) {
    auto load_frozen = [&](std::vector<Epoch>& epochs) {
      for (Epoch& e : epochs) {
        e.plan_cost.a = r.f64();
        e.plan_cost.b = r.f64();
        e.plan_cost.c = r.f64();
        for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) e.plan_speeds.push_back(r.f64());
      }
    };
    load_frozen(run->epochs_);
    for (Cut& cut : run->cuts_.cuts_) load_frozen(cut.saved.epochs);
    const uint64_t ranks = r.u64();
    if (ranks > (1u << 20)) return corrupt("a cost model of more than 2^20 ranks");
    if (ranks > 0 && r.ok()) {
      CostModel& model =
          run->cost_model_.emplace(static_cast<uint32_t>(ranks), run->cost_model_options());
      for (CostModel::RankSums& rs : model.ranks_) {
        for (auto& row : rs.xx) {
          for (double& v : row) v = r.f64();
        }
        for (double& v : rs.xy) v = r.f64();
        rs.count = r.u64();
      }
      model.reports_ = r.u64();
      for (double& v : model.reference_theta_) v = r.f64();
      for (double& v : model.reference_speed_) v = r.f64();
      uint64_t counted = 0;
      for (const CostModel::RankSums& rs : model.ranks_) counted += rs.count;
      if (r.ok() && counted != model.reports_) {
        return corrupt("inconsistent: the cost model's reports disagree with its ranks' counts");
      }
    }
  } else if (run->config_.cost_balanced()) {
    for (Epoch& e : run->epochs_) e.plan_cost = run->config_.cost;
    for (Cut& cut : run->cuts_.cuts_) {
      for (Epoch& e : cut.saved.epochs) e.plan_cost = run->config_.cost;
    }
  }
  if (format >= 10) {
    for (WorkerInfo& wi : run->workers_) wi.samples_done = r.u64();
    std::map<RunSeries::Key, Series> all;
    for (uint64_t k = 0, m = r.count(); k < m && r.ok(); ++k) {
      const uint64_t set = r.u64();
      std::string name = r.str();
      const uint64_t stride = r.u64();
      const uint64_t count = r.u64();
      const uint64_t kept = r.count();
      if (kept > Series::kCapacity) return corrupt("a series of more points than it keeps");
      auto point = [&] {
        SeriesPoint p;
        p.n = r.u64();
        p.epoch = r.i64();
        p.value = r.f64();
        return p;
      };
      std::vector<SeriesPoint> points;
      for (uint64_t i = 0; i < kept && r.ok(); ++i) points.push_back(point());
      std::optional<SeriesPoint> latest;
      if (r.u64() != 0) latest = point();
      if (!r.ok()) break;
      if (set > 1) return corrupt("a series of set " + std::to_string(set));
      if (std::string wrong = Series::consistent(points, latest, stride, count); !wrong.empty()) {
        return corrupt("series " + name + ": " + wrong);
      }
      const RunSeries::Key key{static_cast<SetKind>(set), std::move(name)};
      if (!all.emplace(key, Series::restored(std::move(points), latest, stride, count)).second) {
        return corrupt("series " + key.second + " twice");
      }
    }
    if (std::string wrong = RunSeries::consistent(all); !wrong.empty()) return corrupt(wrong);
    const uint64_t dropped = r.u64();
    run->series_ = RunSeries::restored(std::move(all), dropped);
    const uint64_t mode = r.u64();
    const ScheduleMode initial = initial_mode(run->config_);
    if (mode >= kScheduleModeNames.size() ||
        (static_cast<ScheduleMode>(mode) != initial && initial != ScheduleMode::kAuto)) {
      return corrupt("inconsistent: mode " + std::to_string(mode) + " for a run whose config (" +
                     "schedule.mode = \"" + std::string(schedule_mode_name(run->config_.mode)) +
                     "\") starts it in " + std::string(schedule_mode_name(initial)));
    }
    run->mode_ = static_cast<ScheduleMode>(mode);
    // (The layouts were read before the mode: checked again against it.)
    for (const Epoch& e : run->epochs_) {
      if (e.ranks > 0 && run->mode_ != ScheduleMode::kSteps) {
        return corrupt("inconsistent: an epoch is laid out in steps, but the run hands out " +
                       std::string(schedule_mode_name(run->mode_)));
      }
    }
  }
  if (format >= 11) {
    auto load_replans = [&](std::vector<Epoch>& epochs) {
      for (Epoch& e : epochs) {
        e.replanned_after = r.u64();
        if (e.replanned_after > 0) {
          e.first_cost.a = r.f64();
          e.first_cost.b = r.f64();
          e.first_cost.c = r.f64();
        }
      }
    };
    load_replans(run->epochs_);
    for (Cut& cut : run->cuts_.cuts_) load_replans(cut.saved.epochs);
  }
  if (format >= 8 && r.ok()) {
    for (Cut& cut : run->cuts_.cuts_) {
      for (const Epoch& e : cut.saved.epochs) {
        if (std::string broken = step_layout_inconsistency(*run, e); !broken.empty()) {
          return corrupt("inconsistent: an epoch of cut " + std::to_string(cut.id) + broken);
        }
      }
    }
  }
  if (!r.ok() || !slots_ok) return corrupt("truncated or inconsistent");
  if (!r.at_end()) return corrupt("trailing bytes");
  // What save() asserted of the run it saved.
  if (const std::string broken = inconsistency(*run); !broken.empty()) {
    return corrupt("inconsistent: " + broken);
  }
  if (std::string wrong = run->take_target(); !wrong.empty()) {
    return corrupt("inconsistent with schedule.epochs: " + wrong);
  }
  return run;
}

}  // namespace traincoord
