// Benchmarks of the core alone (no network, no disk). docs/PERFORMANCE.md quotes the figures.
//   build/core_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/run.h"

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

// One job cycle: a worker completes its job and acquires the next in one call (next_job), as
// a busy worker does. `workers` jobs are in flight throughout.
void BM_NextJobCycle(benchmark::State& state) {
  ManualClock clock;
  const int workers = static_cast<int>(state.range(0));
  Run run(endless_config(1'000'000'000), clock);
  std::vector<WorkerId> ids;
  std::vector<LeaseId> leases;
  for (int i = 0; i < workers; ++i) {
    ids.push_back(run.join("w" + std::to_string(i)));
    leases.push_back(run.acquire(ids.back())->job.lease);
  }
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
  for (int i = 0; i < 64; ++i) {
    ids.push_back(run.join("w" + std::to_string(i)));
    leases.push_back(run.acquire(ids.back())->job.lease);
  }
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

}  // namespace
}  // namespace traincoord

BENCHMARK_MAIN();
