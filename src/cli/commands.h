// The subcommands of the traincoord binary, each in its own file.
#pragma once

#include <cstdint>
#include <ostream>
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
  std::string data_dir;  // empty: ./RUN.traincoord for one run, ./traincoord-data otherwise
  bool in_memory = false;
  std::string durability = "fsync";
  bool apply_config_changes = false;
  uint64_t snapshot_every = 100'000;
  uint64_t min_free_disk_mib = 64;  // below this, no new work (503); a start is refused
  bool auth = false;  // tokens even on loopback (always on for other addresses)
  size_t max_connections = 20'000;
  uint64_t max_requests_per_connection = 1'000'000;
  size_t max_runs = 1000;
  size_t max_workers_per_run = 100'000;
  int read_timeout_s = 30;
  int idle_timeout_s = 600;
  std::string token_dir;          // empty: the data dir, or ./traincoord-tokens in memory
  std::string tls_cert;           // PEM certificate (chain): serve HTTPS
  std::string tls_key;            // its PEM private key
  std::string tls_client_ca;      // PEM CA bundle: clients must show a certificate it signed
  bool allow_plain_http = false;  // plain HTTP on a non-loopback address
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
// Renders the JSON of GET /v1/runs/RUN for a terminal.
void print_run_status(const std::string& status_json, std::ostream& out);

struct LaunchArgs {
  int workers = 1;
  std::string config;
  int max_restarts = 0;
  std::string data_dir;  // empty: in memory
  bool auth = false;     // tokens (kept in the data dir, or ./traincoord-tokens)
  std::vector<std::string> command;
};
// Exit status: 0 when the run completed or stopped early and every worker exited 0; 1 when a
// worker failed (after its restarts); 2 for bad arguments; 3 when the workers exited before
// the run finished; 130 when interrupted.
int launch(const LaunchArgs& args);

struct InspectArgs {
  std::string data_dir;
  std::string run;
  bool json = false;
};
int inspect(const InspectArgs& args);

}  // namespace traincoord::cli
