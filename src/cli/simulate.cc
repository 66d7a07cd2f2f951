#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "config/config_file.h"
#include "sim/simulation.h"
#include "sim/step_simulation.h"

namespace traincoord::cli {

namespace {

int fail(const Error& e) {
  std::cerr << "traincoord: " << e.message << "\n";
  return exit_code::kUsage;
}

Error usage(std::string field, std::string message) {
  return {ErrorCode::kInvalidArgument, std::move(message), std::move(field)};
}

// `simulate --steps`: the step planner and the cost model on a group of simulated ranks.
int simulate_steps(const SimulateArgs& args) {
  const StepSimulateArgs& a = args.steps;
  if (!args.config.empty()) {
    return fail(usage("config",
                      "simulate --steps plans from --lengths or --synthetic-lengths, "
                      "not from a run config: leave out --config"));
  }
  if (a.lengths.empty() == (a.synthetic == 0)) {
    return fail(usage("lengths",
                      "simulate --steps needs the sample lengths: give --lengths FILE "
                      "or --synthetic-lengths N (one of the two)"));
  }
  std::vector<double> lengths;
  if (!a.lengths.empty()) {
    std::ifstream in(a.lengths);
    if (!in) return fail(usage("lengths", "cannot read --lengths " + a.lengths));
    std::ostringstream text;
    text << in.rdbuf();
    auto parsed = parse_lengths(text.str(), a.lengths);
    if (!parsed) return fail(parsed.error());
    lengths = std::move(*parsed);
  } else {
    SyntheticLengths spec;
    spec.samples = a.synthetic;
    spec.seed = args.seed;
    lengths = synthetic_lengths(spec);
  }
  StepSimulationOptions o;
  o.ranks = static_cast<uint32_t>(a.ranks);
  o.batch_budget = a.budget;
  {
    std::istringstream fields(a.cost);
    char comma1 = 0, comma2 = 0;
    std::string extra;
    if (!(fields >> o.cost.a >> comma1 >> o.cost.b >> comma2 >> o.cost.c) || comma1 != ',' ||
        comma2 != ',' || (fields >> extra)) {
      return fail(
          usage("cost", "--cost " + a.cost +
                            ": expected A,B,C (three numbers, e.g. "
                            "0.5,1,0.05: a batch of n samples padded to L costs A + B·n·L + "
                            "C·n·L²)"));
    }
  }
  o.epochs = a.epochs;
  if (a.slow_rank >= 0) o.slow_rank = static_cast<uint32_t>(a.slow_rank);
  o.slowdown = a.slowdown;
  o.noise = a.noise;
  o.seed = args.seed;
  o.compare = a.compare;
  if (!(a.budget > 0)) {
    return fail(usage("batch-budget",
                      "simulate --steps needs --batch-budget X (X > 0): the most "
                      "padded cost of a batch, in the units of --cost"));
  }
  auto result = traincoord::simulate_steps(lengths, o);
  if (!result) return fail(result.error());
  print_step_report(*result, o, std::cout);
  return 0;
}

}  // namespace

int simulate(const SimulateArgs& args) {
  if (args.steps.enabled) return simulate_steps(args);
  const StepSimulateArgs& a = args.steps;
  if (a.synthetic > 0 || !a.lengths.empty() || a.budget > 0 || a.compare) {
    return fail(usage("steps",
                      "--lengths, --synthetic-lengths, --batch-budget and --compare "
                      "are options of a step-mode dry run: add --steps"));
  }
  if (args.config.empty()) {
    return fail(usage("config",
                      "simulate needs --config RUN.toml (or --steps for a dry run of "
                      "step mode)"));
  }
  auto config = load_run_config(args.config);
  if (!config) return fail(config.error());
  SimulationOptions options;
  options.workers = args.workers;
  options.seed = args.seed;
  // main.cc lets only the names of kCompletionOrderNames through.
  options.order = parse_completion_order(args.order).value_or(CompletionOrder::kFifo);
  options.losses.constant = args.loss;
  if (!args.losses.empty()) {
    std::ifstream in(args.losses);
    if (!in) return fail({ErrorCode::kInvalidArgument, "cannot read --losses " + args.losses, {}});
    std::ostringstream text;
    text << in.rdbuf();
    auto table = parse_loss_table(text.str(), args.losses);
    if (!table) return fail(table.error());
    table->constant = args.loss;
    options.losses = *table;
  }
  auto result = simulate(*config, options);
  if (!result) return fail(result.error());
  if (args.json) {
    std::cout << trace_json(*result, options);
  } else {
    print_report(*result, options, std::cout);
  }
  return 0;
}

}  // namespace traincoord::cli
