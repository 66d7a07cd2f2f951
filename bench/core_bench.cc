// Benchmarks of the core alone (no network, no disk). docs/PERFORMANCE.md quotes the figures.
//   build/core_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/run.h"
#include "core/run_codec.h"

namespace traincoord {
namespace {

RunConfig endless_config(uint64_t train_batches) {
  RunConfig c;
  c.name = "bench";
  c.train_batches = train_batches;
  c.order = BatchOrder::kShuffled;
  c.epochs = 1000;
  c.validation_every = 0;
  c.lease_timeout_ms = 60'000;
  return c;
}

// Resident memory of this process, in MiB (from /proc/self/status).
double resident_mib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kib = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::strtod(line + 6, nullptr);
  }
  std::fclose(f);
  return kib / 1024.0;
}

// A benchmark whose completions were not all counted measured something else: say so.
void check_all_counted(benchmark::State& state, const Run& run) {
  if (run.counters().completions_accepted != static_cast<uint64_t>(state.iterations())) {
    state.SkipWithError("not every completion was counted: the loop is wrong");
  }
}

void check_all_counted_n(benchmark::State& state, const Run& run, uint64_t n) {
  if (run.counters().completions_accepted != n) state.SkipWithError("completions not counted");
}

// `n` workers join `run`, each holding a job.
void join_workers(Run& run, int n, std::vector<WorkerId>* ids, std::vector<LeaseId>* leases) {
  for (int i = 0; i < n; ++i) {
    ids->push_back(run.join("w" + std::to_string(i)));
    leases->push_back(run.acquire(ids->back())->job.lease);
  }
}

// One job cycle: a worker completes its job and acquires the next in one call (next_job), as
// a busy worker does. `workers` jobs are in flight throughout.
void BM_NextJobCycle(benchmark::State& state) {
  ManualClock clock;
  const int workers = static_cast<int>(state.range(0));
  Run run(endless_config(1'000'000'000), clock);
  std::vector<WorkerId> ids;
  std::vector<LeaseId> leases;
  join_workers(run, workers, &ids, &leases);
  Completion done;
  done.loss = 0.5;
  done.samples = 32;
  size_t i = 0;
  for (auto _ : state) {
    auto next = run.next_job(ids[i], leases[i], done);
    // Not DoNotOptimize(leases[i]): Google Benchmark 1.7's "+m,r" constraint on an lvalue lets
    // g++ 12 drop the store (every later completion then repeats the first lease).
    leases[i] = next->next.job.lease;
    if (++i == ids.size()) i = 0;
  }
  check_all_counted(state, run);
  state.SetItemsProcessed(state.iterations());
  state.counters["cycles_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_NextJobCycle)->Arg(1)->Arg(64)->Arg(1000);

// The same cycle with the batch indices of each new job written out, as the server does.
void BM_NextJobCycleWithBatches(benchmark::State& state) {
  ManualClock clock;
  RunConfig c = endless_config(1'000'000'000);
  c.iters_per_worker = 8;
  Run run(c, clock);
  std::vector<WorkerId> ids;
  std::vector<LeaseId> leases;
  join_workers(run, 64, &ids, &leases);
  Completion done;
  done.loss = 0.5;
  done.samples = 256;
  std::vector<uint64_t> batches;
  size_t i = 0;
  for (auto _ : state) {
    auto next = run.next_job(ids[i], leases[i], done);
    leases[i] = next->next.job.lease;
    batches.clear();
    run.batches_of(next->next.job, &batches);
    benchmark::DoNotOptimize(batches.data());
    if (++i == ids.size()) i = 0;
  }
  check_all_counted(state, run);
  state.counters["cycles_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_NextJobCycleWithBatches);

// Memory with an epoch of 10^9 batches and 1,000 jobs in flight, after 2 million cycles.
void BM_MemoryBillionBatchEpoch(benchmark::State& state) {
  const double before = resident_mib();
  for (auto _ : state) {
    ManualClock clock;
    Run run(endless_config(1'000'000'000), clock);
    std::vector<WorkerId> ids;
    std::vector<LeaseId> leases;
    for (int i = 0; i < 1000; ++i) {
      ids.push_back(run.join("w" + std::to_string(i)));
      leases.push_back(run.acquire(ids.back())->job.lease);
    }
    Completion done;
    done.loss = 0.5;
    done.samples = 32;
    for (int n = 0; n < 2'000'000; ++n) {
      const size_t i = static_cast<size_t>(n) % ids.size();
      leases[i] = run.next_job(ids[i], leases[i], done)->next.job.lease;
    }
    check_all_counted_n(state, run, 2'000'000);
    state.counters["rss_MiB"] = resident_mib();
    state.counters["rss_growth_MiB"] = resident_mib() - before;
    state.counters["jobs_in_flight"] = static_cast<double>(run.epochs()[0].leased);
  }
}
BENCHMARK(BM_MemoryBillionBatchEpoch)->Iterations(1)->Unit(benchmark::kMillisecond);

// ---- series (issue 34; docs/PERFORMANCE.md, "Series: what keeping them costs") ----

// The job cycle of BM_NextJobCycle at 64 workers, each completion reporting `metrics` named
// metrics besides its loss (0: the loss only): what the run's series cost a completion.
void BM_NextJobCycleWithMetrics(benchmark::State& state) {
  ManualClock clock;
  Run run(endless_config(1'000'000'000), clock);
  std::vector<WorkerId> ids;
  std::vector<LeaseId> leases;
  join_workers(run, 64, &ids, &leases);
  Completion done;
  done.loss = 0.5;
  done.samples = 32;
  for (int64_t m = 0; m < state.range(0); ++m)
    done.metrics.push_back({"m" + std::to_string(m), 0.1});
  size_t i = 0;
  for (auto _ : state) {
    auto next = run.next_job(ids[i], leases[i], done);
    leases[i] = next->next.job.lease;
    if (++i == ids.size()) i = 0;
  }
  check_all_counted(state, run);
  state.counters["cycles_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_NextJobCycleWithMetrics)->Arg(0)->Arg(2);

// A million completions, each with its loss and 2 metrics (lr, accuracy): the series' memory
// and snapshot bytes stay bounded by the downsampling (1,024 points a series), whatever the
// run's length.
void BM_SeriesOfAMillionCompletions(benchmark::State& state) {
  for (auto _ : state) {
    ManualClock clock;
    Run run(endless_config(1'000'000'000), clock);
    const WorkerId w = run.join("w");
    LeaseId lease = run.acquire(w)->job.lease;
    Completion done;
    done.samples = 32;
    done.metrics = {{"lr", 0.1}, {"accuracy", 0.5}};
    size_t points = 0;
    for (int n = 1; n <= 1'000'000; ++n) {
      done.loss = 1.0 / n;
      done.metrics[0].value = 0.1 / n;
      lease = run.next_job(w, lease, done)->next.job.lease;
    }
    check_all_counted_n(state, run, 1'000'000);
    for (const auto& [key, series] : run.series().all()) points += series.points().size();
    state.counters["series"] = static_cast<double>(run.series().all().size());
    state.counters["points"] = static_cast<double>(points);
    // (format 10's bytes: the series, and one worker's samples done, a few bytes)
    state.counters["series_bytes"] = static_cast<double>(RunCodec::format10_bytes(run).size());
    state.counters["snapshot_bytes"] = static_cast<double>(RunCodec::save(run).size());
  }
}
BENCHMARK(BM_SeriesOfAMillionCompletions)->Iterations(1)->Unit(benchmark::kMillisecond);

// ---- step mode (issue 32; docs/PERFORMANCE.md, "Step mode: the coordinator's own cost") ----

// Log-normal lengths of 1 to 35 (utterance durations in seconds), as bench/step_balance.py.
std::vector<double> lognormal_lengths(uint64_t n) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> d(std::log(6.0), 0.6);
  std::vector<double> v;
  for (uint64_t i = 0; i < n; ++i)
    v.push_back(std::round(std::clamp(d(rng), 1.0, 35.0) * 100) / 100);
  return v;
}

// A step-mode run of `samples` train samples: fixed batches of 32 (budget 0), or cost-balanced
// under a budget of 8 average samples' padded cost (quadratic).
RunConfig step_config(uint64_t samples, bool cost_balanced) {
  RunConfig c;
  c.name = "steps";
  c.mode = ScheduleMode::kSteps;
  c.train_samples = c.train_batches = samples;
  c.epochs = 1000;
  c.validation_every = 0;
  c.lease_timeout_ms = 60'000;
  c.seed = 3;
  if (cost_balanced) {
    c.train_lengths = lognormal_lengths(samples);
    c.cost = BatchCost{0, 0, 1};
    c.batch_budget = 8 * 6.0 * 6.0 * 1.5;
  } else {
    c.batch_size = 32;
  }
  return c;
}

std::vector<WorkerId> step_group(Run& run, uint32_t w) {
  std::vector<WorkerId> ids;
  for (uint32_t r = 0; r < w; ++r) {
    (void)run.join_group("g");
    ids.push_back(run.join("rank" + std::to_string(r), "g", GroupRank{r, w}));
  }
  return ids;
}

// One step-mode cycle: a rank completes its oldest batch and acquires one more, each of W ranks
// in turn holding `depth` batches (its prefetch), as a group of W ranks under DDP does. Epochs of
// 20,000 samples open and close throughout (their opening included, a share per cycle).
void BM_StepCycle(benchmark::State& state) {
  ManualClock clock;
  const uint32_t w = static_cast<uint32_t>(state.range(0));
  const uint32_t depth = static_cast<uint32_t>(state.range(1));
  const bool balanced = state.range(2) != 0;
  Run run(step_config(20'000, balanced), clock);
  const std::vector<WorkerId> ids = step_group(run, w);
  std::vector<std::deque<LeaseId>> held(w);
  for (uint32_t d = 0; d < depth; ++d) {
    for (uint32_t r = 0; r < w; ++r) held[r].push_back(run.acquire(ids[r])->job.lease);
  }
  Completion done;
  done.loss = 0.5;
  done.samples = 32;
  uint32_t r = 0;
  uint64_t completed = 0;
  for (auto _ : state) {
    // At an epoch's end a rank may find nothing to take until the epoch closes: it then holds
    // fewer batches for a while, and a cycle may be an acquire alone.
    if (!held[r].empty()) {
      (void)run.complete(ids[r], held[r].front(), done);
      held[r].pop_front();
      ++completed;
    }
    while (held[r].size() < depth) {
      auto next = run.acquire(ids[r]);
      if (next->status != AcquireStatus::kJob) break;
      held[r].push_back(next->job.lease);
    }
    if (++r == w) r = 0;
  }
  check_all_counted_n(state, run, completed);
  state.counters["completions_per_s"] =
      benchmark::Counter(static_cast<double>(completed), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_StepCycle)
    ->ArgNames({"W", "depth", "balanced"})
    ->Args({8, 1, 0})
    ->Args({8, 4, 0})
    ->Args({8, 4, 1})
    ->Args({64, 4, 0})
    ->Args({64, 4, 1});

// The acquire that opens (lays out and plans) a cost-balanced epoch of 20,000 samples for 8 ranks.
void BM_OpenCostBalancedEpoch(benchmark::State& state) {
  const RunConfig config = step_config(20'000, true);
  ManualClock clock;
  std::optional<Run> run;
  for (auto _ : state) {
    state.PauseTiming();
    run.reset();
    run.emplace(config, clock);
    const std::vector<WorkerId> ids = step_group(*run, 8);
    state.ResumeTiming();
    auto first = run->acquire(ids[0]);
    benchmark::DoNotOptimize(first->job.lease);
  }
}
BENCHMARK(BM_OpenCostBalancedEpoch)->Unit(benchmark::kMillisecond);

// Loading a snapshot of a cost-balanced run with an open 20,000-sample epoch for 8 ranks, part
// trained (what a restart and a standby's takeover do).
void BM_LoadCostBalancedSnapshot(benchmark::State& state) {
  const RunConfig config = step_config(20'000, true);
  ManualClock clock;
  Run run(config, clock);
  const std::vector<WorkerId> ids = step_group(run, 8);
  Completion done;
  done.loss = 0.5;
  done.samples = 32;
  for (int step = 0; step < 50; ++step) {
    for (WorkerId id : ids) (void)run.complete(id, run.acquire(id)->job.lease, done);
  }
  const std::string bytes = RunCodec::save(run);
  for (auto _ : state) {
    auto loaded = RunCodec::load(config, bytes, clock);
    if (!loaded) state.SkipWithError("the snapshot did not load");
    benchmark::DoNotOptimize(loaded->get());
  }
}
BENCHMARK(BM_LoadCostBalancedSnapshot)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace traincoord

BENCHMARK_MAIN();
