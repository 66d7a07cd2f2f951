#include "core/run_progress.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace traincoord {

std::string_view run_state_name(RunState state) {
  switch (state) {
    case RunState::kRunning:
      return "running";
    case RunState::kCompleted:
      return "completed";
    case RunState::kEarlyStopped:
      return "early_stopped";
    case RunState::kCancelled:
      return "cancelled";
    case RunState::kFailed:
      return "failed";
  }
  return "unknown";
}

void JobQueue::push_front(uint64_t position) {
  if (!keyed()) {
    deque_.push_front(position);
    return;
  }
  TC_ASSERT(!place_of_.contains(position));
  const int64_t place = line_.empty() ? 0 : --front_place_;
  if (line_.empty()) front_place_ = 0, back_place_ = 1;
  line_.emplace(place, position);
  place_of_.emplace(position, place);
  of_rank_.emplace(rank_of(position), position);
}

void JobQueue::push_back(uint64_t position) {
  if (!keyed()) {
    deque_.push_back(position);
    return;
  }
  TC_ASSERT(!place_of_.contains(position));
  if (line_.empty()) front_place_ = 0, back_place_ = 0;
  const int64_t place = back_place_++;
  line_.emplace(place, position);
  place_of_.emplace(position, place);
  of_rank_.emplace(rank_of(position), position);
}

uint64_t JobQueue::front() const {
  TC_ASSERT(!keyed() && !deque_.empty());
  return deque_.front();
}

void JobQueue::pop_front() {
  TC_ASSERT(!keyed() && !deque_.empty());
  deque_.pop_front();
}

void JobQueue::pop_back() {
  TC_ASSERT(!empty());
  if (!keyed()) {
    deque_.pop_back();
  } else {
    (void)erase(std::prev(line_.end())->second);
  }
}

void JobQueue::insert_front(const std::vector<uint64_t>& positions) {
  for (auto it = positions.rbegin(); it != positions.rend(); ++it) push_front(*it);
}

bool JobQueue::erase(uint64_t position) {
  if (!keyed()) {
    auto it = std::find(deque_.begin(), deque_.end(), position);
    if (it == deque_.end()) return false;
    deque_.erase(it);
    return true;
  }
  auto it = place_of_.find(position);
  if (it == place_of_.end()) return false;
  line_.erase(it->second);
  of_rank_.erase({rank_of(position), position});
  place_of_.erase(it);
  return true;
}

bool JobQueue::contains(uint64_t position) const {
  if (keyed()) return place_of_.contains(position);
  return std::find(deque_.begin(), deque_.end(), position) != deque_.end();
}

void JobQueue::clear() {
  deque_.clear();
  line_.clear();
  place_of_.clear();
  of_rank_.clear();
}

void JobQueue::release_memory() {
  JobQueue empty;
  empty.base_ = base_;
  empty.ranks_ = ranks_;
  *this = std::move(empty);
}

std::vector<uint64_t> JobQueue::positions() const {
  std::vector<uint64_t> out;
  out.reserve(size());
  for_each([&](uint64_t position) { out.push_back(position); });
  return out;
}

void JobQueue::by_rank(uint64_t base, uint32_t ranks) {
  const std::vector<uint64_t> queued = positions();
  clear();
  base_ = base;
  ranks_ = ranks;
  for (uint64_t position : queued) push_back(position);
}

std::optional<uint64_t> JobQueue::take_of_rank(uint32_t rank) {
  TC_ASSERT(keyed());
  auto it = of_rank_.lower_bound({rank, 0});
  if (it == of_rank_.end() || it->first != rank) return std::nullopt;
  const uint64_t position = it->second;
  (void)erase(position);
  return position;
}

StepCounts Epoch::step_counts() const {
  StepCounts c;
  if (!steps()) return c;
  c.planned = (plan.end_job - step_base) / ranks;
  // The steps begun are those below the cursor; one is done unless a batch of it is still in
  // play (active: leased, queued for its rank, or expired and unresolved).
  std::vector<uint64_t> open;
  open.reserve(active.size());
  for (const auto& [position, job] : active) {
    if (position >= step_base) open.push_back((position - step_base) / ranks);
  }
  std::sort(open.begin(), open.end());
  const uint64_t unfinished =
      static_cast<uint64_t>(std::unique(open.begin(), open.end()) - open.begin());
  c.done = (cursor - step_base) / ranks - unfinished;
  c.batches_in_flight = leased;
  c.batches_queued = requeue.size();
  return c;
}

double Epoch::metric(std::string_view name, bool sample_weighted) const {
  for (const MetricSum& m : metrics) {
    if (m.name != name) continue;
    if (sample_weighted && m.samples > 0) return m.weighted;
    if (m.count > 0) return m.plain;
  }
  return std::nan("");
}

namespace {

// Folds the finite `x` into the running mean `mean` of finite values with weight `fraction` (its
// share of the total weight so far, in (0, 1]). The result is a convex combination of the two,
// so it stays within the range of what was folded in: no overflow to inf, whatever the
// magnitudes (x - mean alone may overflow when both are huge and of opposite signs).
double fold(double mean, double x, double fraction) {
  const double step = x - mean;
  const double next =
      std::isfinite(step) ? mean + step * fraction : mean * (1 - fraction) + x * fraction;
  // The last rounding of a value at the edge of the range may not tip it over.
  return std::clamp(next, -std::numeric_limits<double>::max(), std::numeric_limits<double>::max());
}

// Adds `samples` to a count that saturates at 2^64 - 1; returns the weight share of `samples`.
double add_samples(uint64_t* total, uint64_t samples) {
  const double fraction =
      static_cast<double>(samples) / (static_cast<double>(*total) + static_cast<double>(samples));
  *total = samples > std::numeric_limits<uint64_t>::max() - *total
               ? std::numeric_limits<uint64_t>::max()
               : *total + samples;
  return fraction;
}

}  // namespace

void Epoch::fold_report(const Completion& c) {
  if (std::isfinite(c.loss)) {
    if (c.samples > 0)
      weighted_loss = fold(weighted_loss, c.loss, add_samples(&samples, c.samples));
    finite_jobs += 1;
    plain_loss = fold(plain_loss, c.loss, 1.0 / static_cast<double>(finite_jobs));
  } else {
    nonfinite_jobs += 1;
  }
  for (const Metric& m : c.metrics) {
    auto it = std::find_if(metrics.begin(), metrics.end(),
                           [&](const MetricSum& s) { return s.name == m.name; });
    if (it == metrics.end()) {
      metrics.push_back(MetricSum{m.name, 0, 0, 0, 0});
      it = std::prev(metrics.end());
    }
    if (!std::isfinite(m.value)) continue;
    if (c.samples > 0)
      it->weighted = fold(it->weighted, m.value, add_samples(&it->samples, c.samples));
    it->count += 1;
    it->plain = fold(it->plain, m.value, 1.0 / static_cast<double>(it->count));
  }
}

}  // namespace traincoord
