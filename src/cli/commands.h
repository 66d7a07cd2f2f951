// The subcommands of the traincoord binary, each in its own file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace traincoord::cli {

struct SimulateArgs {
  std::string config;
  int workers = 1;
  std::string losses;
  double loss = 1.0;
  std::string order = "fifo";
  uint64_t seed = 0;
  bool json = false;
};
int simulate(const SimulateArgs& args);

struct ServeArgs {
  std::vector<std::string> configs;
  std::string runs_dir;
  std::string listen = "127.0.0.1:8470";
  int io_threads = 1;
};
int serve(const ServeArgs& args);

struct StatusArgs {
  std::string url = "http://127.0.0.1:8470";
  std::string run;  // empty: the only run, or a list
  bool watch = false;
  double interval_s = 1.0;
  bool json = false;
};
int status(const StatusArgs& args);
int runs(const StatusArgs& args);

}  // namespace traincoord::cli
