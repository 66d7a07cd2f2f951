// `traincoord simulate`: the real engine, in-process, with N simulated workers. A dry run of a
// plan: which jobs go where, when validation runs, the epoch losses, and early stopping.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/enum_names.h"
#include "core/error.h"
#include "core/run.h"
#include "core/run_config.h"

namespace traincoord {

// The loss each simulated job reports: from a table per set and epoch, else a constant.
struct LossTable {
  double constant = 1.0;
  std::map<std::pair<SetKind, int64_t>, double> by_epoch;
  double loss(SetKind set, int64_t epoch) const;
};

// Parses lines "SET EPOCH LOSS" (SET is train or dev; '#' starts a comment), e.g. "dev 3 0.82".
Result<LossTable> parse_loss_table(std::string_view text, std::string_view source);

// Which holding worker finishes next. Its names (--order, the trace) in the order of the values.
enum class CompletionOrder { kFifo, kLifo, kRandom };
inline constexpr std::array<std::string_view, 3> kCompletionOrderNames = {"fifo", "lifo", "random"};
std::string_view completion_order_name(CompletionOrder order);
// The order named `name`, or nullopt when it names none.
std::optional<CompletionOrder> parse_completion_order(std::string_view name);

struct SimulationOptions {
  int workers = 1;
  CompletionOrder order = CompletionOrder::kFifo;
  uint64_t seed = 0;  // for kRandom
  LossTable losses;
};

struct Handout {
  uint64_t step = 0;  // 1, 2, ... in hand-out order
  std::string worker;
  Job job;
  std::vector<uint64_t> batches;
};

struct SimulationResult {
  RunConfig config;
  Plan plan;
  uint64_t planned_jobs = 0;
  std::vector<Handout> handouts;
  std::vector<Event> events;
  std::vector<Epoch> epochs;  // as the run closed them
  RunState state = RunState::kRunning;
  std::string reason;
  EarlyStopState early_stop;
};

// Runs the engine to the end: each worker takes a job; the worker that `order` picks among
// those holding one finishes next and reports the table's loss (samples = batches in the job,
// times batch_size when known). Fails with kInvalidArgument for workers < 1.
Result<SimulationResult> simulate(const RunConfig& config, const SimulationOptions& options);

// The human-readable report.
void print_report(const SimulationResult& result, const SimulationOptions& options,
                  std::ostream& out);
// The machine-readable trace (docs/SIMULATE.md).
std::string trace_json(const SimulationResult& result, const SimulationOptions& options);

}  // namespace traincoord
