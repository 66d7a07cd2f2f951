// The subcommands of the traincoord binary, each in its own file.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace traincoord::client {
struct ClientError;
}

namespace traincoord::cli {

// The exit status of every subcommand, one table (docs/CLI.md).
namespace exit_code {
inline constexpr int kOk = 0;
// A failure while working: the coordinator cannot be reached or refused a request, the server
// could not start, a worker of `launch` failed.
inline constexpr int kFailed = 1;
// The command line is wrong (CLI11's parse errors, an unknown subcommand or option, a missing
// RUN), or a file it names is (a run config, a data dir that cannot be used).
inline constexpr int kUsage = 2;
// No run of that name (status, history, inspect).
inline constexpr int kRunNotFound = 3;
// launch: the run did not finish (every worker exited while it ran, or it was cancelled or
// failed).
inline constexpr int kRunUnfinished = 4;
// Stopped by SIGINT (Ctrl-C) or SIGTERM.
inline constexpr int kInterrupted = 130;
}  // namespace exit_code

// Says on stderr what a request to the coordinator at `url` met, and returns the exit status
// for it: kRunNotFound for run_not_found, else kFailed.
int report_client_error(const client::ClientError& e, const std::string& url);

// `simulate --steps`: a dry run of step mode (src/sim/step_simulation.h).
struct StepSimulateArgs {
  bool enabled = false;
  int ranks = 8;
  std::string lengths;     // a file of lengths, or
  uint64_t synthetic = 0;  // this many synthetic ones
  double budget = 0;
  std::string cost = "0.5,1,0.05";
  int epochs = 2;
  int slow_rank = -1;
  double slowdown = 2;
  double noise = 0.05;
  bool compare = false;
};

struct SimulateArgs {
  StepSimulateArgs steps;
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
  bool auth = false;                // tokens even on loopback (always on for other addresses)
  size_t max_connections = 20'000;  // without --max-connections: at most what `ulimit -n` holds
  bool max_connections_given = false;
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
  // High availability (docs/HA.md): etcd://HOST:PORT[,HOST:PORT...][/PREFIX]; empty: the data dir.
  std::string journal;
  std::string advertise_url;  // empty: http(s)://LISTEN_HOST:PORT
  int lease_ttl_s = 3;        // the leader's etcd lease: a failover takes about this long
  // With --journal etcds://: the CA of the etcd members, and a client certificate and its key
  // (etcdctl's --cacert, --cert, --key).
  std::string etcd_cacert, etcd_cert, etcd_key;
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
// One line of `status` for a coordinator at `url` from its GET /v1/coordinator reply (HA: its
// role, the leader and term, the journal's head and lag, its takeovers).
std::string coordinator_line(const std::string& url, const std::string& json);
int runs(const StatusArgs& args);

// `apply-config`: a changed config file applied to its started run by the coordinator at `url`.
struct ApplyConfigArgs {
  std::string config;
  std::string url = "http://127.0.0.1:8470";
  bool dry_run = false;
};
int apply_config(const ApplyConfigArgs& args);
// Renders the JSON of GET /v1/runs/RUN for a terminal. With `wall_now_ms` (milliseconds since
// the Unix epoch: the wall-clock time the reply's `*_ago_ms` count back from), times are shown
// as local dates rather than "s ago": for a run read from a data dir, with no server running.
void print_run_status(const std::string& status_json, std::ostream& out,
                      std::optional<int64_t> wall_now_ms = std::nullopt);

struct LaunchArgs {
  int workers = 1;     // processes on this node (--nproc-per-node)
  std::string config;  // a coordinator in this process (one node) ...
  std::string url;     // ... or the coordinator at this url (several nodes), with:
  std::string run;
  std::string nnodes = "1";             // MIN[:MAX] nodes
  std::string node;                     // this node's name (default: the host name; node0)
  std::string node_addr = "127.0.0.1";  // where other nodes reach this one (MASTER_ADDR)
  double settle_s = 5;                  // with MIN < MAX: later joins awaited after MIN joined
  double node_timeout_s = 15;           // an agent not heard of for this long is lost
  int rdzv_timeout_s = 120;             // the coordinator unreachable this long: give up
  int max_restarts = 0;                 // restarts of the whole group of workers
  double grace_s = 10;                  // SIGTERM to SIGKILL when the group is stopped
  double join_timeout_s = 600;          // not in a running round this long: give up (torchrun's)
  std::string data_dir;                 // empty: RUN.traincoord (as serve), unless in_memory
  bool in_memory = false;               // with --config: keep no state on disk
  bool auth = false;                    // tokens (kept in the data dir, or ./traincoord-tokens)
  bool apply_config_changes = false;
  std::string listen = "127.0.0.1:8470";  // taken when free, else a free loopback port
  bool prefix_output = true;              // "[rankN]: " before each line of a worker's output
  std::vector<std::string> command;
  // torchrun's flags (docs/LAUNCH.md, "torchrun's flags and ours"): mapped onto ours by
  // launch(), or refused with the flag to use.
  struct Torchrun {
    bool standalone = false;
    std::string rdzv_endpoint, rdzv_backend, rdzv_id, rdzv_conf, local_addr;
    bool no_python = false;            // run the command as it is, even a *.py
    bool module = false;               // -m: the command is a Python module
    std::vector<std::string> refused;  // the flags given that launch has no use for
  } torchrun;
};
// Exit status (exit_code): kOk when the run completed or stopped early and every worker exited
// 0; kFailed when a worker failed (after its restarts); kUsage for bad arguments;
// kRunUnfinished when the run did not finish; kInterrupted when interrupted.
int launch(const LaunchArgs& args);

struct InspectArgs {
  std::string data_dir;
  std::string run;
  bool json = false;
};
int inspect(const InspectArgs& args);

struct HistoryArgs {
  std::string url = "http://127.0.0.1:8470";
  std::string run;
  std::string format = "csv";  // csv, jsonl or json (GET /v1/runs/RUN/history?format=...)
};
// Prints a run's history (epoch losses and metrics, the recent completions) to stdout.
int history(const HistoryArgs& args);

}  // namespace traincoord::cli
