#include "core/step_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>

#include <xxhash.h>

#include "core/sample_order.h"

namespace traincoord {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser, as in sample_order.cc
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint64_t kBucketTag = 0x6275636b65747321ULL;  // "buckets!": independent of the orders
constexpr uint32_t kMaxRanks = uint32_t{1} << 20;

// The samples of `untrained` (all of them when `all`) in epoch `epoch`'s seeded order.
std::vector<uint64_t> epoch_order(const StepPlanConfig& config, uint64_t samples, int64_t epoch,
                                  std::span<const uint64_t> untrained, bool all) {
  std::vector<bool> wanted;
  if (!all) {
    wanted.assign(samples, false);
    for (uint64_t s : untrained) {
      TC_ASSERT(s < samples && !wanted[s]);
      wanted[s] = true;
    }
  }
  std::vector<uint64_t> order;
  order.reserve(all ? samples : untrained.size());
  if (samples == 0) return order;
  const SampleOrder permutation(samples, 1, config.seed, config.set, SampleShuffle::kEpoch);
  std::vector<uint64_t> positions(samples);
  std::iota(positions.begin(), positions.end(), uint64_t{0});
  permutation.at_each(epoch, positions, &order);  // (the epoch's keys derived once)
  if (!all) std::erase_if(order, [&](uint64_t s) { return !wanted[s]; });
  return order;
}

std::vector<double> normalised_speeds(const StepPlanConfig& config) {
  std::vector<double> speeds = config.speeds;
  if (speeds.empty()) speeds.assign(config.ranks, 1.0);
  const double fastest = *std::min_element(speeds.begin(), speeds.end());
  for (double& s : speeds) s /= fastest;
  return speeds;
}

// Evens the plan out at its end: while the last step has an empty batch, the first such rank
// takes the last sample of the largest batch (two or more samples) of the latest step that has
// one; when none has, the last step's samples join the step before (each to its smallest batch)
// and the last step is gone. Leaves empty batches only when the plan is one step.
void even_out_tail(std::vector<Step>* steps) {
  while (!steps->empty()) {
    Step& last = steps->back();
    auto empty = std::find_if(last.batches.begin(), last.batches.end(),
                              [](const RankBatch& b) { return b.samples.empty(); });
    if (empty == last.batches.end()) return;
    // The latest step with a batch of two or more, the last step itself first (a cost-balanced
    // last step may deal all it has to some ranks and none to another).
    RankBatch* donor = nullptr;
    for (size_t k = steps->size(); k-- > 0 && donor == nullptr;) {
      for (RankBatch& b : (*steps)[k].batches) {
        if (b.samples.size() >= 2 &&
            (donor == nullptr || b.samples.size() > donor->samples.size())) {
          donor = &b;
        }
      }
    }
    if (donor != nullptr) {
      empty->samples.push_back(donor->samples.back());
      donor->samples.pop_back();
      continue;
    }
    if (steps->size() == 1) return;  // fewer samples than ranks: empty batches stay
    Step& before = (*steps)[steps->size() - 2];
    for (const RankBatch& b : last.batches) {
      for (uint64_t s : b.samples) {
        auto smallest = std::min_element(before.batches.begin(), before.batches.end(),
                                         [](const RankBatch& x, const RankBatch& y) {
                                           return x.samples.size() < y.samples.size();
                                         });
        smallest->samples.push_back(s);
      }
    }
    steps->pop_back();
  }
}

// Sets every batch's loss scale, and in cost-balanced mode its longest length and prediction.
void finish(const StepPlanConfig& config, std::span<const double> lengths,
            const std::vector<double>& speeds, StepPlan* plan) {
  const double w = static_cast<double>(plan->ranks);
  for (Step& step : plan->steps) {
    const double n = static_cast<double>(step.samples());
    for (size_t r = 0; r < step.batches.size(); ++r) {
      RankBatch& b = step.batches[r];
      b.loss_scale = b.samples.empty() ? 0 : static_cast<double>(b.samples.size()) * w / n;
      if (!lengths.empty()) {
        b.longest = 0;
        for (uint64_t s : b.samples) b.longest = std::max(b.longest, lengths[s]);
      }
      if (config.batch_size == 0) b.predicted = speeds[r] * config.cost.padded(b.shape());
    }
  }
}

void plan_fixed(const StepPlanConfig& config, const std::vector<uint64_t>& order, StepPlan* plan) {
  const uint64_t w = config.ranks;
  const uint64_t b = config.batch_size;
  const uint64_t per_step = w * b;
  const uint64_t m = order.size();
  for (uint64_t first = 0; first < m; first += per_step) {
    const uint64_t count = std::min(per_step, m - first);
    Step step;
    step.batches.resize(w);
    uint64_t at = first;
    for (uint64_t r = 0; r < w; ++r) {
      // A full step: B each. The last, short step: split evenly, the first ranks one more.
      const uint64_t size = count == per_step ? b : count / w + (r < count % w ? 1 : 0);
      step.batches[r].samples.assign(order.begin() + static_cast<std::ptrdiff_t>(at),
                                     order.begin() + static_cast<std::ptrdiff_t>(at + size));
      at += size;
    }
    TC_ASSERT(at == first + count);
    plan->steps.push_back(std::move(step));
  }
}

// A sample of a step's pool, its length and bucket beside it: the sort compares in place instead
// of looking each length up, and a sample goes back to the bucket it came from without a search.
struct Pooled {
  double length;
  uint64_t sample;
  size_t bucket;
};

bool longer_first(const Pooled& x, const Pooled& y) {  // a total order: samples are distinct
  return x.length != y.length ? x.length > y.length : x.sample < y.sample;
}

// Sorts a pool longest first. The order is total, so any sort gives the same pool; this one uses
// what is sorted already. A pool is mostly what the step before did not take (it went back to
// its buckets' fronts in this order and comes back first; of 20,000 samples planned for 8 ranks,
// ~11 were pooled for each one taken), so its sorted runs of 32 or more are kept, the rest
// sorted alone, and the runs merged in: O(P + r log r + P·k) for r loose samples and k runs,
// instead of O(P log P). Planning 20,000 samples for 8 ranks spent half its time in std::sort
// of the pools (bench/core_bench.cc, BM_OpenCostBalancedEpoch; docs/PERFORMANCE.md).
void sort_pool(std::vector<Pooled>* pool, std::vector<Pooled>* loose, std::vector<Pooled>* merged) {
  constexpr size_t kRun = 32;
  std::vector<Pooled>& v = *pool;
  loose->clear();
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < v.size();) {
    size_t j = i + 1;
    while (j < v.size() && longer_first(v[j - 1], v[j])) ++j;
    if (j - i >= kRun) {
      runs.emplace_back(i, j);
    } else {
      loose->insert(loose->end(), v.begin() + static_cast<std::ptrdiff_t>(i),
                    v.begin() + static_cast<std::ptrdiff_t>(j));
    }
    i = j;
  }
  if (runs.size() == 1 && loose->empty()) return;
  std::sort(loose->begin(), loose->end(), longer_first);
  for (const auto& [begin, end] : runs) {
    merged->clear();
    std::merge(loose->begin(), loose->end(), v.begin() + static_cast<std::ptrdiff_t>(begin),
               v.begin() + static_cast<std::ptrdiff_t>(end), std::back_inserter(*merged),
               longer_first);
    std::swap(*loose, *merged);
  }
  v.swap(*loose);
}

void plan_balanced(const StepPlanConfig& config, std::span<const double> lengths,
                   const std::vector<double>& speeds, const std::vector<uint64_t>& order,
                   int64_t epoch, StepPlan* plan) {
  const LengthBuckets buckets =
      fit_buckets(lengths, config.cost, config.batch_budget, config.buckets);
  plan->buckets = buckets.upper.size();
  // Each bucket's samples in the epoch's order, consumed from the front.
  std::vector<std::vector<uint64_t>> bucket(buckets.upper.size());
  for (uint64_t s : order) bucket[buckets.bucket_of(lengths[s])].push_back(s);
  std::vector<size_t> cursor(bucket.size(), 0);
  uint64_t left = order.size();
  auto remaining = [&](size_t i) { return bucket[i].size() - cursor[i]; };

  uint64_t state =
      mix64(mix64(config.seed ^ kBucketTag) ^
            mix64(static_cast<uint64_t>(epoch) * 2 + static_cast<uint64_t>(config.set)));
  const size_t w = config.ranks;
  std::vector<uint64_t> n(w);
  std::vector<double> longest(w);
  auto pick_bucket = [&]() {  // a bucket at random, weighted by the samples it has left
    state = mix64(state);
    uint64_t u = state % left;
    size_t i = 0;
    while (u >= remaining(i)) u -= remaining(i++);
    return i;
  };
  // The predicted time of rank r's batch with one more sample of length `length`.
  auto time_with = [&](size_t r, double length) {
    return speeds[r] * config.cost.padded({n[r] + 1, std::max(longest[r], length)});
  };
  // A step whose W ranks share bucket `first`. Its pool is the samples it may take: from `first`
  // on, then from the nearest buckets (shorter first), until the pool holds more than the step
  // could take were every sample as short as the pool's shortest. The pool is sorted longest
  // first and dealt two ways, and the step keeps the better (the most useful cost per unit of
  // the step's time, its slowest batch):
  // - in runs: rank 0 fills its batch up to the budget, then rank 1, and so on. Each batch is a
  //   run of near-equal lengths (its longest is its first) and pads far less than a random draw
  //   of the bucket would;
  // - each next sample to the rank whose batch would then take the least time (within the
  //   budget): better where a batch holds only a few samples, and at the end of the epoch.
  // Either way a sample that fits no batch ends the deal: those after it are no longer, and a
  // batch of padded cost costs its longest for every sample. What the step does not take goes
  // back to its bucket, first in line.
  std::vector<Pooled> pooled, loose, merged;
  std::vector<uint64_t> pool;
  auto shared_bucket_step = [&](size_t first, Step* step) {
    pool.clear();
    pooled.clear();
    double shortest = std::numeric_limits<double>::infinity();
    auto most = [&]() {  // the most samples of length >= shortest the step can take
      const double each = config.cost.padded({1, shortest}) - config.cost.a;
      if (!(each > 0)) return std::numeric_limits<uint64_t>::max();
      double fit = 0;
      for (size_t r = 0; r < w; ++r) {
        fit +=
            std::floor(std::max(0.0, config.batch_budget / speeds[r] - config.cost.a) / each) + 1;
      }
      return fit >= 1e18 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(fit);
    };
    uint64_t limit = most();
    for (size_t d = 0; left > 0 && d < 2 * bucket.size(); ++d) {
      // d = 0: first; then first − 1, first + 1, first − 2, ...
      const size_t step_of = (d + 1) / 2;
      size_t b = first;
      if (d % 2 == 1) {
        if (step_of > first) continue;
        b = first - step_of;
      } else if (d > 0) {
        b = first + step_of;
        if (b >= bucket.size()) continue;
      }
      // (most() depends on the shortest length alone: computed again only when it falls.)
      while (remaining(b) > 0 && pooled.size() <= limit) {
        const uint64_t s = bucket[b][cursor[b]++];
        --left;
        pooled.push_back({lengths[s], s, b});
        if (lengths[s] < shortest) {
          shortest = lengths[s];
          limit = most();
        }
      }
      if (pooled.size() > limit) break;
    }
    sort_pool(&pooled, &loose, &merged);
    for (const Pooled& p : pooled) pool.push_back(p.sample);
    auto deal = [&](bool runs, std::vector<RankBatch>* batches) {
      batches->assign(w, RankBatch{});
      std::fill(n.begin(), n.end(), 0);
      std::fill(longest.begin(), longest.end(), 0.0);
      size_t r = 0;
      size_t taken = 0;
      for (; taken < pool.size(); ++taken) {
        const uint64_t s = pool[taken];
        size_t to = w;
        if (runs) {
          while (r < w && n[r] > 0 && time_with(r, lengths[s]) > config.batch_budget) ++r;
          to = r;
        } else {
          double best = 0;
          for (size_t q = 0; q < w; ++q) {
            const double t = time_with(q, lengths[s]);
            if (n[q] > 0 && t > config.batch_budget) continue;
            if (to == w || t < best) {
              to = q;
              best = t;
            }
          }
        }
        if (to == w) break;
        (*batches)[to].samples.push_back(s);
        ++n[to];
        longest[to] = std::max(longest[to], lengths[s]);
      }
      double useful = 0, slowest = 0;
      for (size_t q = 0; q < w; ++q) {
        for (uint64_t s : (*batches)[q].samples) useful += config.cost.sample(lengths[s]);
        slowest = std::max(slowest, speeds[q] * config.cost.padded({n[q], longest[q]}));
      }
      return std::pair<size_t, double>{taken, slowest > 0 ? useful / slowest : 0};
    };
    std::vector<RankBatch> in_runs, least_time;
    const auto [runs_taken, runs_value] = deal(true, &in_runs);
    const auto [least_taken, least_value] = deal(false, &least_time);
    const bool runs = runs_value >= least_value;
    step->batches = runs ? std::move(in_runs) : std::move(least_time);
    const size_t taken = runs ? runs_taken : least_taken;
    for (size_t i = pool.size(); i-- > taken;) {  // back to their buckets, first in line
      const size_t b = pooled[i].bucket;
      TC_ASSERT(cursor[b] > 0);
      bucket[b][--cursor[b]] = pool[i];
      ++left;
    }
  };
  while (left > 0) {
    Step step;
    shared_bucket_step(pick_bucket(), &step);
    plan->steps.push_back(std::move(step));
  }
}

StepPlan plan(const StepPlanConfig& config, uint64_t samples, std::span<const double> lengths,
              int64_t epoch, std::span<const uint64_t> untrained, bool all) {
  TC_ASSERT(check_step_config(config, samples, lengths).has_value());
  StepPlan result;
  result.epoch = epoch;
  result.ranks = config.ranks;
  const std::vector<uint64_t> order = epoch_order(config, samples, epoch, untrained, all);
  const std::vector<double> speeds = normalised_speeds(config);
  if (config.batch_size > 0) {
    plan_fixed(config, order, &result);
  } else {
    plan_balanced(config, lengths, speeds, order, epoch, &result);
  }
  even_out_tail(&result.steps);
  finish(config, lengths, speeds, &result);
  // The promises of step_plan.h.
  TC_ASSERT(result.samples() == order.size());
  for (const Step& step : result.steps) {
    TC_ASSERT(step.batches.size() == config.ranks);
    for (const RankBatch& b : step.batches) {
      TC_ASSERT(!b.samples.empty() || (result.steps.size() == 1 && order.size() < config.ranks));
    }
  }
  return result;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

size_t LengthBuckets::bucket_of(double length) const {
  TC_ASSERT(!upper.empty());
  const auto it = std::lower_bound(upper.begin(), upper.end(), length);
  return it == upper.end() ? upper.size() - 1 : static_cast<size_t>(it - upper.begin());
}

LengthBuckets fit_buckets(std::span<const double> lengths, const BatchCost& cost, double budget,
                          const BucketOptions& options) {
  LengthBuckets buckets;
  if (lengths.empty()) {
    buckets.upper.push_back(0);
    return buckets;
  }
  std::vector<double> sorted(lengths.begin(), lengths.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  double ratio = 1 + 2 * std::max(0.0, options.max_padding);
  for (int attempt = 0;; ++attempt) {
    buckets.upper.clear();
    size_t start = 0;
    while (start < n) {
      const double low = cost.sample(sorted[start]);
      size_t end = start + 1;
      while (end < n) {
        const double here = cost.sample(sorted[end]);
        // One batch at this length holds about budget / cost samples.
        const double per_batch = here > 0 ? std::max(1.0, std::floor(budget / here)) : 1.0;
        const bool too_few = static_cast<double>(end - start) < options.min_batches * per_batch;
        const bool same = sorted[end] == sorted[end - 1];
        if (!same && !too_few && here > ratio * low) break;
        ++end;
      }
      buckets.upper.push_back(sorted[end - 1]);
      start = end;
    }
    if (buckets.upper.size() <= std::max<size_t>(1, options.max_buckets) || attempt >= 64) break;
    ratio = 1 + (ratio - 1) * 1.25;
  }
  return buckets;
}

uint64_t Step::samples() const {
  uint64_t n = 0;
  for (const RankBatch& b : batches) n += b.samples.size();
  return n;
}

uint64_t StepPlan::samples() const {
  uint64_t n = 0;
  for (const Step& s : steps) n += s.samples();
  return n;
}

Result<void> check_step_config(const StepPlanConfig& c, uint64_t samples,
                               std::span<const double> lengths) {
  if (c.ranks < 1 || c.ranks > kMaxRanks) {
    return invalid_argument(
        "ranks", "ranks: " + std::to_string(c.ranks) + " ranks; a group has 1 to 2^20 ranks");
  }
  if (!c.speeds.empty()) {
    if (c.speeds.size() != c.ranks) {
      return invalid_argument("speeds", "speeds: " + std::to_string(c.speeds.size()) +
                                            " speed factors for " + std::to_string(c.ranks) +
                                            " ranks; give one per rank, or none");
    }
    for (size_t r = 0; r < c.speeds.size(); ++r) {
      if (!std::isfinite(c.speeds[r]) || c.speeds[r] <= 0) {
        return invalid_argument("speeds", "speeds: rank " + std::to_string(r) + "'s factor " +
                                              number(c.speeds[r]) +
                                              " is not a finite number above 0");
      }
    }
  }
  if (!lengths.empty() && lengths.size() != samples) {
    return invalid_argument("lengths", "lengths: " + std::to_string(lengths.size()) +
                                           " lengths for a set of " + std::to_string(samples) +
                                           " samples; give one per sample");
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (!std::isfinite(lengths[i]) || lengths[i] < 0) {
      return invalid_argument("lengths", "lengths: sample " + std::to_string(i) + "'s length " +
                                             number(lengths[i]) + " is not a finite number >= 0");
    }
  }
  if (c.batch_size > 0) return {};
  if (lengths.size() != samples) {
    return invalid_argument("lengths",
                            "lengths: cost-balanced batches (no batch_size) need one "
                            "length per sample; give the lengths, or a batch_size");
  }
  if (!std::isfinite(c.batch_budget) || c.batch_budget <= 0) {
    return invalid_argument("batch_budget", "batch_budget: " + number(c.batch_budget) +
                                                " is not a finite number above 0");
  }
  for (double v : {c.cost.a, c.cost.b, c.cost.c}) {
    if (!std::isfinite(v) || v < 0) {
      return invalid_argument("cost", "cost: " + c.cost.describe() +
                                          ": every coefficient must be a finite number >= 0");
    }
  }
  if (c.cost.b + c.cost.c <= 0) {
    return invalid_argument("cost", "cost: " + c.cost.describe() +
                                        ": b or c must be above 0 (else every sample costs "
                                        "nothing and no budget bounds a batch)");
  }
  return {};
}

Result<std::vector<double>> parse_lengths(std::string_view text, std::string_view source) {
  std::vector<double> lengths;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string word, extra;
    if (!(fields >> word)) continue;
    char* end = nullptr;
    const double v = std::strtod(word.c_str(), &end);
    if (*end != '\0' || !std::isfinite(v) || v < 0 || (fields >> extra)) {
      return invalid_argument("lengths", std::string(source) + ":" + std::to_string(number) +
                                             ": expected one length (a number >= 0), got '" + line +
                                             "'");
    }
    lengths.push_back(v);
  }
  if (lengths.empty()) {
    return invalid_argument("lengths", std::string(source) + ": no lengths in the file");
  }
  return lengths;
}

std::string lengths_text(std::span<const double> lengths) {
  std::string text;
  char buf[40];
  for (double v : lengths) {
    const int n = std::snprintf(buf, sizeof buf, "%.17g\n", v);
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

uint64_t lengths_checksum(std::span<const double> lengths) {
  const std::string text = lengths_text(lengths);
  return XXH3_64bits(text.data(), text.size());
}

StepPlan plan_epoch_steps(const StepPlanConfig& config, uint64_t samples,
                          std::span<const double> lengths, int64_t epoch) {
  return plan(config, samples, lengths, epoch, {}, true);
}

StepPlan plan_rest_of_epoch(const StepPlanConfig& config, uint64_t samples,
                            std::span<const double> lengths, int64_t epoch,
                            std::span<const uint64_t> untrained) {
  return plan(config, samples, lengths, epoch, untrained, false);
}

PlanFigures predicted_figures(const StepPlan& plan, const BatchCost& cost,
                              std::span<const double> lengths) {
  PlanFigures out;
  double ratios = 0, useful = 0, padded = 0;
  uint64_t timed = 0;
  for (const Step& step : plan.steps) {
    double slowest = 0, sum = 0;
    for (const RankBatch& b : step.batches) {
      slowest = std::max(slowest, b.predicted);
      sum += b.predicted;
      if (b.samples.empty()) continue;
      padded += cost.padded(b.shape()) - cost.a;
      for (uint64_t s : b.samples) useful += cost.sample(lengths[s]);
    }
    if (sum > 0) {
      ratios += slowest * static_cast<double>(step.batches.size()) / sum;
      ++timed;
    }
  }
  if (timed > 0) out.straggling = ratios / static_cast<double>(timed);
  if (padded > 0) out.padding = std::max(0.0, 1 - useful / padded);
  return out;
}

StepLayout::StepLayout(uint64_t m, uint64_t b, uint32_t w) : m_(m), b_(b), w_(w) {
  TC_ASSERT(b >= 1 && w >= 1);
  const uint64_t per_step = uint64_t{w} * b;
  const uint64_t raw = (m + per_step - 1) / per_step;  // steps before the tail is evened out
  if (raw == 0) return;
  // The tail: the last two raw steps (or the one there is). Evening out takes from the step
  // before the last only (with B >= 2 it always has a donor; with B == 1 the last step joins
  // it), so a layout of those two alone is the whole plan's end.
  regular_ = raw >= 2 ? raw - 2 : 0;
  std::vector<uint64_t> places;
  for (uint64_t p = regular_ * per_step; p < m; ++p) places.push_back(p);
  StepPlanConfig config;
  config.ranks = w;
  config.batch_size = b;
  StepPlan tail;
  plan_fixed(config, places, &tail);
  even_out_tail(&tail.steps);
  tail_ = std::move(tail.steps);
  steps_ = regular_ + tail_.size();
}

void StepLayout::batch(uint64_t step, uint32_t rank, std::vector<uint64_t>* out) const {
  TC_ASSERT(step < steps_ && rank < w_);
  if (step < regular_) {
    const uint64_t first = (step * w_ + rank) * b_;
    for (uint64_t p = first; p < first + b_; ++p) out->push_back(p);
    return;
  }
  const RankBatch& batch = tail_[step - regular_].batches[rank];
  out->insert(out->end(), batch.samples.begin(), batch.samples.end());
}

uint64_t StepLayout::step_samples(uint64_t step) const {
  TC_ASSERT(step < steps_);
  return step < regular_ ? uint64_t{w_} * b_ : tail_[step - regular_].samples();
}

double StepLayout::loss_scale(uint64_t step, uint32_t rank) const {
  const uint64_t n = step < regular_ ? b_ : tail_[step - regular_].batches[rank].samples.size();
  return n == 0 ? 0.0
                : static_cast<double>(n) * static_cast<double>(w_) /
                      static_cast<double>(step_samples(step));
}

uint64_t StepLayout::first_place_from(uint64_t step, std::vector<uint64_t>* listed) const {
  if (step <= regular_) return std::min(m_, step * w_ * b_);
  for (; step < steps_; ++step) {
    for (const RankBatch& batch : tail_[step - regular_].batches) {
      listed->insert(listed->end(), batch.samples.begin(), batch.samples.end());
    }
  }
  return m_;
}

EpochSegment::EpochSegment(std::vector<PositionRun> runs) : runs_(std::move(runs)) {
  starts_.reserve(runs_.size());
  for (size_t i = 0; i < runs_.size(); ++i) {
    TC_ASSERT(runs_[i].count > 0);
    TC_ASSERT(i == 0 || runs_[i - 1].first + runs_[i - 1].count < runs_[i].first);
    starts_.push_back(places_);
    places_ += runs_[i].count;
  }
}

uint64_t EpochSegment::position(uint64_t place) const {
  TC_ASSERT(place < places_);
  const size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), place) -
                                       starts_.begin()) -
                   1;
  return runs_[i].first + (place - starts_[i]);
}

void EpochSegment::runs_of_places(uint64_t first, uint64_t end,
                                  std::vector<PositionRun>* out) const {
  TC_ASSERT(first <= end && end <= places_);
  if (first == end) return;
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), first) -
                                 starts_.begin()) -
             1;
  for (uint64_t place = first; place < end; ++i) {
    const uint64_t skip = place - starts_[i];
    const uint64_t count = std::min(runs_[i].count - skip, end - place);
    out->push_back({runs_[i].first + skip, count});
    place += count;
  }
}

std::vector<PositionRun> EpochSegment::merged(std::vector<PositionRun> runs) {
  std::sort(runs.begin(), runs.end(),
            [](const PositionRun& a, const PositionRun& b) { return a.first < b.first; });
  std::vector<PositionRun> out;
  for (const PositionRun& run : runs) {
    if (run.count == 0) continue;
    if (!out.empty()) TC_ASSERT(out.back().first + out.back().count <= run.first);
    if (!out.empty() && out.back().first + out.back().count == run.first) {
      out.back().count += run.count;
    } else {
      out.push_back(run);
    }
  }
  return out;
}

std::vector<PositionRun> EpochSegment::runs_of(std::vector<uint64_t> positions) {
  std::sort(positions.begin(), positions.end());
  std::vector<PositionRun> runs;
  for (uint64_t p : positions) {
    TC_ASSERT(runs.empty() || runs.back().first + runs.back().count <= p);
    if (!runs.empty() && runs.back().first + runs.back().count == p) {
      runs.back().count += 1;
    } else {
      runs.push_back({p, 1});
    }
  }
  return runs;
}

}  // namespace traincoord
