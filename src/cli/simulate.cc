#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "config/config_file.h"
#include "sim/simulation.h"

namespace traincoord::cli {

namespace {

int fail(const Error& e) {
  std::cerr << "traincoord: " << e.message << "\n";
  return exit_code::kUsage;
}

}  // namespace

int simulate(const SimulateArgs& args) {
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
