#include "sim/step_simulation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <sstream>

#include "core/sample_order.h"

namespace traincoord {

namespace {

// A seeded stream of numbers, the same on every machine (std:: distributions are not).
class Stream {
 public:
  explicit Stream(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;  // splitmix64
    uint64_t x = state_;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
  double normal() {  // Box–Muller
    const double u = uniform(), v = uniform();
    return std::sqrt(-2 * std::log(u)) * std::cos(2 * std::numbers::pi * v);
  }

 private:
  uint64_t state_;
};

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::vector<double> slowdowns_of(const StepSimulationOptions& o, bool slowed) {
  std::vector<double> s(o.ranks, 1.0);
  if (slowed && o.slow_rank) s[*o.slow_rank] = o.slowdown;
  return s;
}

StepPlanConfig planner_config(const StepSimulationOptions& o) {
  StepPlanConfig c;
  c.ranks = o.ranks;
  c.seed = o.seed;
  c.batch_budget = o.batch_budget;
  c.cost = o.cost;
  c.buckets = o.buckets;
  return c;
}

// The mean and the max relative error of `model` against the true times of the plan's batches.
struct FitError {
  double mean = 0;
  double max = 0;
};
FitError fit_error(const CostModel& model, const StepPlan& plan, const BatchCost& truth,
                   std::span<const double> slowdowns) {
  double worst = 0, sum = 0;
  uint64_t batches = 0;
  for (const Step& step : plan.steps) {
    for (uint32_t r = 0; r < step.batches.size(); ++r) {
      const RankBatch& b = step.batches[r];
      if (b.samples.empty()) continue;
      const double real = slowdowns[r] * truth.padded(b.shape());
      const double error = std::abs(model.predict(r, b.shape()) / real - 1);
      worst = std::max(worst, error);
      sum += error;
      ++batches;
    }
  }
  return {batches == 0 ? 0 : sum / static_cast<double>(batches), worst};
}

// The cost the planner uses: the fitted model, or the declared one while the fit says no
// sample costs anything (b = c = 0: only a per-batch overhead), which no budget can bound.
BatchCost planning_cost(const CostModel& model, const BatchCost& declared) {
  const BatchCost fit = model.shared();
  return fit.b + fit.c > 0 ? fit : declared;
}

struct StepModeRun {
  std::vector<StepEpochReport> epochs;
  FitError warmup_fit_error;
  uint64_t warmup_steps = 0;
  BatchCost warmup_fitted;
  std::vector<double> warmup_speeds;
  size_t buckets = 0;
};

// Step mode for `options.epochs` epochs: plan, "train" (report the noisy true times), fit.
StepModeRun run_step_mode(std::span<const double> lengths, const StepSimulationOptions& o,
                          std::span<const double> slowdowns) {
  StepModeRun run;
  const uint64_t n = lengths.size();
  CostModelOptions fit;  // a served run's rules (Run::cost_model_options): the declared shape
  fit.prior = o.cost;
  fit.judge_first_reports_at_speed_1 = true;
  CostModel model(o.ranks, fit);
  Stream noise(o.seed ^ 0x6e6f697365ULL);  // "noise"
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    StepPlanConfig config = planner_config(o);
    if (model.fitted()) {
      config.cost = planning_cost(model, o.cost);
      config.speeds = model.speeds();
    }
    StepPlan plan = plan_epoch_steps(config, n, lengths, epoch);
    // Planned blind (the declared cost): re-planned once the model has every rank's speed.
    bool warm_up = o.warmup_replan && !model.fitted();
    run.buckets = std::max(run.buckets, plan.buckets);
    StepPlan trained;  // the steps as trained: the epoch's figures
    trained.epoch = epoch;
    trained.ranks = o.ranks;
    std::vector<uint8_t> visits(n, 0);
    StepEpochReport report;
    report.epoch = epoch;
    for (size_t k = 0; k < plan.steps.size(); ++k) {
      const Step& step = plan.steps[k];
      for (uint32_t r = 0; r < o.ranks; ++r) {
        const RankBatch& b = step.batches[r];
        for (uint64_t s : b.samples) ++visits[s];
        if (b.samples.empty()) continue;
        double seconds = slowdowns[r] * o.cost.padded(b.shape()) * (1 + o.noise * noise.normal());
        if (noise.uniform() < 0.01) seconds *= 3;   // a pause: one report in 100 is an outlier
        (void)model.report(r, b.shape(), seconds);  // a non-positive noisy time is dropped
      }
      trained.steps.push_back(step);
      if (warm_up && k + 1 < plan.steps.size() && model.fitted_for_every_rank()) {
        // Re-plan the rest of the epoch with what the first steps taught.
        warm_up = false;
        std::vector<uint64_t> untrained;
        for (size_t j = k + 1; j < plan.steps.size(); ++j) {
          for (const RankBatch& rb : plan.steps[j].batches) {
            untrained.insert(untrained.end(), rb.samples.begin(), rb.samples.end());
          }
        }
        run.warmup_fit_error = fit_error(model, plan, o.cost, slowdowns);
        run.warmup_steps = k + 1;
        run.warmup_fitted = model.shared();
        run.warmup_speeds = model.speeds();
        StepPlanConfig fitted = planner_config(o);
        fitted.cost = planning_cost(model, o.cost);
        fitted.speeds = model.speeds();
        StepPlan rest = plan_rest_of_epoch(fitted, n, lengths, epoch, untrained);
        report.replanned_after = k + 1;
        plan.steps.resize(k + 1);
        plan.steps.insert(plan.steps.end(), rest.steps.begin(), rest.steps.end());
      }
    }
    report.exactly_once =
        std::all_of(visits.begin(), visits.end(), [](uint8_t v) { return v == 1; });
    report.figures = figures_of(trained, lengths, o.cost, slowdowns);
    report.fitted = model.shared();
    report.speeds = model.speeds();
    report.reports = model.reports();
    report.has_fit = model.fitted();
    if (model.fitted()) {
      const FitError error = fit_error(model, trained, o.cost, slowdowns);
      report.fit_error = error.mean;
      report.fit_error_max = error.max;
    }
    run.epochs.push_back(report);
  }
  return run;
}

// DistributedSampler: epoch 0's seeded order, fixed-size batches, rank r the r-th of each step.
StepPlan fixed_plan(std::span<const double> lengths, const StepSimulationOptions& o,
                    uint64_t batch_size) {
  StepPlanConfig c = planner_config(o);
  c.batch_size = batch_size;
  return plan_epoch_steps(c, lengths.size(), lengths, 0);
}

double mean_padded(const StepPlan& plan, const BatchCost& cost) {
  double sum = 0;
  uint64_t batches = 0;
  for (const Step& s : plan.steps) {
    for (const RankBatch& b : s.batches) {
      if (b.samples.empty()) continue;
      sum += cost.padded(b.shape());
      ++batches;
    }
  }
  return batches == 0 ? 0 : sum / static_cast<double>(batches);
}

// The batch size whose mean padded batch costs closest to the budget (it grows with the size).
uint64_t fixed_batch_size(std::span<const double> lengths, const StepSimulationOptions& o) {
  uint64_t low = 1, high = std::max<uint64_t>(1, lengths.size() / o.ranks);
  while (low < high) {  // the largest size whose mean is within the budget
    const uint64_t mid = low + (high - low + 1) / 2;
    if (mean_padded(fixed_plan(lengths, o, mid), o.cost) <= o.batch_budget) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  const double below = mean_padded(fixed_plan(lengths, o, low), o.cost);
  const double above = mean_padded(fixed_plan(lengths, o, low + 1), o.cost);
  return std::abs(above - o.batch_budget) < std::abs(below - o.batch_budget) ? low + 1 : low;
}

// Per-rank unsynchronised bucketing, as Lhotse's DynamicBucketingSampler by default: rank r
// buckets its own shard (the positions r, r + W, … of epoch 0's order, as DistributedSampler
// shards) and forms batches under a budget of padded duration (n·L: Lhotse's max_duration, a
// linear proxy, not the true cost), and step k is every rank's k-th batch; a rank whose batches
// ran out idles (as under join()). The duration budget is the one whose mean batch costs the
// cost budget (as for DistributedSampler's batch size).
StepPlan unsynchronised_plan(std::span<const double> lengths, const StepSimulationOptions& o,
                             double duration_budget) {
  const uint64_t n = lengths.size();
  const SampleOrder order(n, 1, o.seed, SetKind::kTrain, SampleShuffle::kEpoch);
  StepPlanConfig single = planner_config(o);
  single.ranks = 1;
  single.cost = {0, 1, 0};
  single.batch_budget = duration_budget;
  std::vector<StepPlan> shards;
  size_t steps = 0;
  for (uint32_t r = 0; r < o.ranks; ++r) {
    std::vector<uint64_t> shard;
    for (uint64_t p = r; p < n; p += o.ranks) shard.push_back(order.at(0, p));
    shards.push_back(plan_rest_of_epoch(single, n, lengths, 0, shard));
    steps = std::max(steps, shards.back().steps.size());
  }
  StepPlan plan;
  plan.ranks = o.ranks;
  plan.steps.resize(steps);
  for (size_t k = 0; k < steps; ++k) {
    plan.steps[k].batches.resize(o.ranks);
    for (uint32_t r = 0; r < o.ranks; ++r) {
      if (k < shards[r].steps.size()) plan.steps[k].batches[r] = shards[r].steps[k].batches[0];
    }
  }
  return plan;
}

// The duration budget whose unsynchronised batches cost the budget on average (bisection: the
// mean grows with the duration budget).
double duration_budget(std::span<const double> lengths, const StepSimulationOptions& o) {
  double low = 0, high = o.batch_budget;  // n·L <= n·(b·L + c·L²) / b for b = 1 ... any start
  while (mean_padded(unsynchronised_plan(lengths, o, high), o.cost) < o.batch_budget &&
         high < 1e12) {
    high *= 2;
  }
  for (int i = 0; i < 40; ++i) {
    const double mid = (low + high) / 2;
    if (mean_padded(unsynchronised_plan(lengths, o, mid), o.cost) < o.batch_budget) {
      low = mid;
    } else {
      high = mid;
    }
  }
  return low;
}

}  // namespace

std::vector<double> synthetic_lengths(const SyntheticLengths& spec) {
  Stream stream(spec.seed ^ 0x6c656e67746873ULL);  // "lengths"
  std::vector<double> lengths;
  lengths.reserve(spec.samples);
  const double mu = std::log(spec.median);
  while (lengths.size() < spec.samples) {
    const double l = std::exp(mu + spec.sigma * stream.normal());
    if (l >= spec.shortest && l <= spec.longest) lengths.push_back(l);
  }
  return lengths;
}

StepFigures figures_of(const StepPlan& plan, std::span<const double> lengths, const BatchCost& cost,
                       std::span<const double> slowdowns) {
  StepFigures f;
  f.steps = plan.steps.size();
  double straggling = 0;
  for (const Step& step : plan.steps) {
    double slowest = 0, sum = 0;
    for (size_t r = 0; r < step.batches.size(); ++r) {
      const RankBatch& b = step.batches[r];
      double longest = 0;
      for (uint64_t s : b.samples) {
        f.useful += cost.sample(lengths[s]);
        longest = std::max(longest, lengths[s]);
      }
      f.samples += b.samples.size();
      const BatchShape shape{b.samples.size(), longest};
      if (!b.samples.empty()) f.padded += cost.padded(shape) - cost.a;
      const double t = slowdowns[r] * cost.padded(shape);
      slowest = std::max(slowest, t);
      sum += t;
    }
    f.time += slowest;
    if (sum > 0) straggling += slowest / (sum / static_cast<double>(step.batches.size()));
  }
  if (f.steps > 0) f.straggling = straggling / static_cast<double>(f.steps);
  if (f.time > 0) f.efficiency = f.useful / (static_cast<double>(plan.ranks) * f.time);
  if (f.padded > 0) f.padding = 1 - f.useful / f.padded;
  return f;
}

Result<StepSimulationResult> simulate_steps(std::span<const double> lengths,
                                            const StepSimulationOptions& o) {
  if (o.epochs < 1 || o.epochs > 1000) {
    return invalid_argument("epochs", "--epochs must be 1 to 1000");
  }
  if (o.slow_rank && *o.slow_rank >= o.ranks) {
    return invalid_argument("slow-rank", "--slow-rank " + std::to_string(*o.slow_rank) +
                                             " is not a rank of " + std::to_string(o.ranks) +
                                             " (ranks count from 0)");
  }
  if (!std::isfinite(o.slowdown) || o.slowdown < 1) {
    return invalid_argument("slowdown", "--slowdown must be a finite number >= 1");
  }
  if (!std::isfinite(o.noise) || o.noise < 0 || o.noise > 0.5) {
    return invalid_argument("noise", "--noise must be 0 to 0.5");
  }
  if (auto ok = check_step_config(planner_config(o), lengths.size(), lengths); !ok) {
    Error e = ok.error();
    if (e.field == "batch_budget") e.message = "--batch-budget: " + e.message.substr(14);
    return tl::unexpected(e);
  }
  StepSimulationResult result;
  result.samples = lengths.size();
  std::vector<double> sorted(lengths.begin(), lengths.end());
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty()) {
    double sum = 0;
    for (double l : sorted) sum += l;
    result.mean_length = sum / static_cast<double>(sorted.size());
    result.median_length = sorted[sorted.size() / 2];
    result.p99_length = sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)];
    result.max_length = sorted.back();
  }
  const bool slowed = o.slow_rank.has_value();
  const std::vector<double> slowdowns = slowdowns_of(o, slowed);
  StepModeRun run = run_step_mode(lengths, o, slowdowns);
  result.epochs = run.epochs;
  result.buckets = run.buckets;
  result.warmup_fit_error = run.warmup_fit_error.mean;
  result.warmup_fit_error_max = run.warmup_fit_error.max;
  result.warmup_steps = run.warmup_steps;
  result.warmup_fitted = run.warmup_fitted;
  result.warmup_speeds = run.warmup_speeds;
  result.first_epoch_blind = figures_of(
      plan_epoch_steps(planner_config(o), lengths.size(), lengths, 0), lengths, o.cost, slowdowns);
  if (o.compare) {
    const std::vector<double> normal = slowdowns_of(o, false);
    result.fixed_batch_size = fixed_batch_size(lengths, o);
    const StepPlan ds = fixed_plan(lengths, o, result.fixed_batch_size);
    result.duration_budget = duration_budget(lengths, o);
    const StepPlan unsync = unsynchronised_plan(lengths, o, result.duration_budget);
    StrategyFigures a{"DistributedSampler", figures_of(ds, lengths, o.cost, normal), {}};
    StrategyFigures b{"unsynchronised buckets", figures_of(unsync, lengths, o.cost, normal), {}};
    // Step mode in its steady state: the last epoch, planned with the fitted model.
    const StepModeRun plain = slowed ? run_step_mode(lengths, o, normal) : run;
    StrategyFigures c{"step mode", plain.epochs.back().figures, {}};
    if (slowed) {
      a.slowed = figures_of(ds, lengths, o.cost, slowdowns);
      b.slowed = figures_of(unsync, lengths, o.cost, slowdowns);
      c.slowed = run.epochs.back().figures;
    }
    result.compare = {a, b, c};
  }
  return result;
}

void print_step_report(const StepSimulationResult& r, const StepSimulationOptions& o,
                       std::ostream& out) {
  out << "step mode: " << r.samples << " samples (length mean " << fixed(r.mean_length, 2)
      << ", median " << fixed(r.median_length, 2) << ", p99 " << fixed(r.p99_length, 2) << ", max "
      << fixed(r.max_length, 2) << "), " << o.ranks << " ranks\n";
  out << "batch budget " << o.batch_budget << ", true cost " << o.cost.describe()
      << " (a + b·n·L + c·n·L²), " << r.buckets << " length buckets";
  if (o.slow_rank) out << ", rank " << *o.slow_rank << " slowed " << o.slowdown << "x";
  out << "\n";
  if (r.warmup_steps > 0) {
    out << "epoch 0 re-planned (warm-up) after " << r.warmup_steps << " steps ("
        << fixed(100 * static_cast<double>(r.warmup_steps) /
                     static_cast<double>(r.epochs[0].figures.steps),
                 1)
        << "% of them), once the model had every rank's speed:\n  " << r.warmup_fitted.describe()
        << " (";
    for (size_t i = 0; i < r.warmup_speeds.size(); ++i) {
      out << (i ? " " : "") << fixed(r.warmup_speeds[i], 2);
    }
    out << "), error on epoch 0's batches: mean " << fixed(100 * r.warmup_fit_error, 1) << "%, max "
        << fixed(100 * r.warmup_fit_error_max, 1) << "%\n";
  }
  out << "\nepoch steps     E      S      P   time  exactly-once  fitted model (speed per rank)\n";
  for (const StepEpochReport& e : r.epochs) {
    const StepFigures& f = e.figures;
    char line[160];
    std::snprintf(line, sizeof line, "%5lld %5llu %6.3f %6.3f %5.1f%% %6.0f  %-12s  ",
                  static_cast<long long>(e.epoch), static_cast<unsigned long long>(f.steps),
                  f.efficiency, f.straggling, 100 * f.padding, f.time,
                  e.exactly_once ? "yes" : "NO");
    out << line;
    if (!e.has_fit) {
      out << "not fitted (" << e.reports << " reports)\n";
      continue;
    }
    out << e.fitted.describe() << " (";
    for (size_t i = 0; i < e.speeds.size(); ++i) out << (i ? " " : "") << fixed(e.speeds[i], 2);
    out << "), error mean " << fixed(100 * e.fit_error, 1) << "% max "
        << fixed(100 * e.fit_error_max, 1) << "%\n";
  }
  if (!r.epochs.empty()) {
    const StepFigures& with = r.epochs[0].figures;
    const StepFigures& blind = r.first_epoch_blind;
    char line[200];
    std::snprintf(line, sizeof line,
                  "%5s %5llu %6.3f %6.3f %5.1f%% %6.0f  (epoch 0 planned blind throughout, "
                  "no warm-up re-plan: %.2fx the time)\n",
                  "0", static_cast<unsigned long long>(blind.steps), blind.efficiency,
                  blind.straggling, 100 * blind.padding, blind.time,
                  with.time > 0 ? blind.time / with.time : 0.0);
    out << line;
  }
  if (r.compare.empty()) return;
  out << "\ncompared (DistributedSampler: batches of " << r.fixed_batch_size
      << "; unsynchronised buckets: padded duration up to " << fixed(r.duration_budget, 1)
      << "; each costs the budget on average):\n";
  out << "strategy                    E      S      P   time  vs DS";
  if (o.slow_rank) out << "  slowed: E      S   time  vs normal";
  out << "\n";
  const double ds = r.compare.front().normal.time;
  for (const StrategyFigures& s : r.compare) {
    char line[200];
    std::snprintf(line, sizeof line, "%-24s %6.3f %6.3f %5.1f%% %6.0f  %5.2f", s.name.c_str(),
                  s.normal.efficiency, s.normal.straggling, 100 * s.normal.padding, s.normal.time,
                  s.normal.time / ds);
    out << line;
    if (s.slowed) {
      std::snprintf(line, sizeof line, "        %6.3f %6.3f %6.0f  %5.2f", s.slowed->efficiency,
                    s.slowed->straggling, s.slowed->time, s.slowed->time / s.normal.time);
      out << line;
    }
    out << "\n";
  }
}

}  // namespace traincoord
