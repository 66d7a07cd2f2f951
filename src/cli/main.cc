// The traincoord binary: one command per subcommand.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "config/config_file.h"
#include "sim/simulation.h"

namespace {

int fail(const traincoord::Error& e) {
  std::cerr << "traincoord: " << e.message << "\n";
  return 2;
}

int run_simulate(const std::string& config_path, int workers, const std::string& losses_path,
                 double loss, const std::string& order, uint64_t seed, bool json) {
  using namespace traincoord;
  auto config = load_run_config(config_path);
  if (!config) return fail(config.error());
  SimulationOptions options;
  options.workers = workers;
  options.seed = seed;
  options.order = order == "lifo"     ? CompletionOrder::kLifo
                  : order == "random" ? CompletionOrder::kRandom
                                      : CompletionOrder::kFifo;
  options.losses.constant = loss;
  if (!losses_path.empty()) {
    std::ifstream in(losses_path);
    if (!in) return fail({ErrorCode::kInvalidArgument, "cannot read --losses " + losses_path, {}});
    std::ostringstream text;
    text << in.rdbuf();
    auto table = parse_loss_table(text.str(), losses_path);
    if (!table) return fail(table.error());
    table->constant = loss;
    options.losses = *table;
  }
  auto result = simulate(*config, options);
  if (!result) return fail(result.error());
  if (json) {
    std::cout << trace_json(*result, options);
  } else {
    print_report(*result, options, std::cout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"traincoord: a training coordinator for distributed machine learning"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("traincoord 0.1.0"));

  CLI::App* sim = app.add_subcommand(
      "simulate",
      "Dry-run a run config with simulated workers: the plan, every hand-out, the "
      "epoch losses and early stopping");
  std::string config_path, losses_path, order = "fifo";
  int workers = 1;
  double loss = 1.0;
  uint64_t seed = 0;
  bool json = false;
  sim->add_option("--config", config_path, "the run config (TOML)")->required();
  sim->add_option("--workers", workers, "simulated workers")->check(CLI::Range(1, 100000));
  sim->add_option("--losses", losses_path,
                  "a file of 'SET EPOCH LOSS' lines: the loss each job of that epoch reports");
  sim->add_option("--loss", loss, "the loss of every epoch the --losses file does not list");
  sim->add_option("--order", order, "which holding worker finishes next")
      ->check(CLI::IsMember({"fifo", "lifo", "random"}));
  sim->add_option("--seed", seed, "the seed of --order random");
  sim->add_flag("--json", json, "print a machine-readable trace (docs/SIMULATE.md)");

  CLI11_PARSE(app, argc, argv);
  if (sim->parsed())
    return run_simulate(config_path, workers, losses_path, loss, order, seed, json);
  return 0;
}
