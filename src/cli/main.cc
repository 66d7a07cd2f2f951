// The traincoord binary: one subcommand per file in src/cli/.
#include <algorithm>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/suggest.h"
#include "sim/simulation.h"

namespace {

using namespace traincoord::cli;

constexpr const char* kExitCodes =
    "Exit status: 0 ok, 1 failed (coordinator unreachable, a worker failed), 2 usage (bad "
    "arguments or files), 3 no such run, 4 the run did not finish (launch), 130 interrupted. "
    "See docs/CLI.md.";

// The "\nExample:\n  ..." footer of a subcommand's --help.
std::string example(std::initializer_list<const char*> lines) {
  std::string text = "\nExample";
  text += lines.size() > 1 ? "s:\n" : ":\n";
  for (const char* line : lines) text += std::string("  ") + line + "\n";
  return text;
}

// What was wrong with a command line CLI11 refused, for a person: an unknown subcommand or
// option named, with the one it most likely misspells.
std::string usage_error(const CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands.push_back(sub->get_name());
  }
  const std::string first = argc > 1 ? argv[1] : "";
  if (!first.empty() && first[0] != '-' &&
      std::find(commands.begin(), commands.end(), first) == commands.end()) {
    std::string text = "unknown command '" + first + "'";
    if (auto near = closest_name(first, commands)) return text + "; did you mean " + *near + "?";
    text += "; the commands are:";
    for (const std::string& c : commands) text += " " + c;
    return text;
  }
  if (first.empty() || first[0] == '-') return std::string(e.what()) + " (see traincoord --help)";
  const CLI::App* sub = app.get_subcommand(first);
  std::vector<std::string> options;
  for (const CLI::Option* o : sub->get_options()) {
    for (const std::string& name : o->get_lnames()) options.push_back("--" + name);
  }
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (!arg.starts_with("--")) continue;
    const std::string name(arg.substr(0, arg.find('=')));
    if (std::find(options.begin(), options.end(), name) != options.end()) continue;
    std::string text = first + ": unknown option " + name;
    if (auto near = closest_name(name, options)) text += "; did you mean " + *near + "?";
    return text + " (see traincoord " + first + " --help)";
  }
  return first + ": " + e.what() + " (see traincoord " + first + " --help)";
}

// torchrun's flags on `launch` (docs/LAUNCH.md, "torchrun's flags and ours"): launch() maps
// them onto ours, or refuses them naming the flag to use.
void add_torchrun_flags(CLI::App* lch, LaunchArgs::Torchrun& t) {
  const std::string group =
      "torchrun's flags, mapped onto the ones above (its others are refused, naming ours)";
  lch->add_flag("--standalone", t.standalone, "as --config: a coordinator in this process")
      ->group(group);
  lch->add_option("--rdzv-endpoint", t.rdzv_endpoint, "HOST:PORT: as --url http://HOST:PORT")
      ->group(group);
  lch->add_option("--rdzv-backend", t.rdzv_backend,
                  "c10d (or traincoord): the coordinator is the rendezvous")
      ->group(group);
  lch->add_option("--rdzv-id", t.rdzv_id, "as --run")->group(group);
  lch->add_option("--rdzv-conf", t.rdzv_conf,
                  "join_timeout=S or timeout=S (--join-timeout), last_call_timeout=S (--settle), "
                  "read_timeout=S (--rdzv-timeout), separated by commas")
      ->group(group);
  lch->add_option("--local-addr", t.local_addr, "as --node-addr")->group(group);
  lch->add_flag("--no-python", t.no_python, "run the command as it is, even a *.py")->group(group);
  lch->add_flag("-m,--module", t.module, "the command is a Python module: python3 -u -m CMD")
      ->group(group);
  // Refused, naming the flag to use (hidden from --help; docs/LAUNCH.md lists them).
  for (const char* name :
       {"--node-rank", "--master-addr", "--master-port", "--monitor-interval", "--tee", "--log-dir",
        "--redirects", "--role", "--start-method", "--local-ranks-filter", "--logs-specs"}) {
    lch->add_option_function<std::string>(
           name, [&t, name](const std::string&) { t.refused.emplace_back(name); }, "")
        ->group("");
  }
  lch->add_flag_function(
         "--run-path", [&t](int64_t) { t.refused.emplace_back("--run-path"); }, "")
      ->group("");
}

// A `launch` command line as torchrun takes it: the dash spelling of each flag for torchrun's
// older underscore one (--nproc_per_node, --max_restarts, --rdzv_endpoint...), and a `--`
// before the worker command when it is not there (`launch --nproc-per-node 2 train.py --lr 1`).
std::vector<std::string> torchrun_command_line(const CLI::App* lch, int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() < 2 || args[1] != "launch") return args;
  for (size_t i = 2; i < args.size() && args[i] != "--"; ++i) {
    std::string& arg = args[i];
    if (!arg.starts_with("-")) {  // the command
      args.insert(args.begin() + static_cast<std::ptrdiff_t>(i), "--");
      break;
    }
    if (!arg.starts_with("--")) continue;  // (-m, -h)
    const size_t end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
    const CLI::Option* option = lch->get_option_no_throw(arg.substr(0, end));
    if (option != nullptr && end == arg.size() && option->get_items_expected_min() > 0) ++i;
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"traincoord: a training coordinator for distributed machine learning"};
  app.require_subcommand(1);
  app.footer(kExitCodes);
  app.set_version_flag("--version", std::string("traincoord 0.1.0"));

  SimulateArgs sim_args;
  CLI::App* sim = app.add_subcommand(
      "simulate",
      "Dry-run a run config with simulated workers: the plan, every hand-out, the "
      "epoch losses and early stopping");
  sim->add_option("--config", sim_args.config, "the run config (TOML); required without --steps");
  sim->add_option("--workers", sim_args.workers, "simulated workers")->check(CLI::Range(1, 100000));
  sim->add_option("--losses", sim_args.losses,
                  "a file of 'SET EPOCH LOSS' lines: the loss each job of that epoch reports");
  sim->add_option("--loss", sim_args.loss,
                  "the loss of every epoch the --losses file does not list");
  sim->add_option("--order", sim_args.order, "which holding worker finishes next")
      ->check(CLI::IsMember(std::vector<std::string>(traincoord::kCompletionOrderNames.begin(),
                                                     traincoord::kCompletionOrderNames.end())));
  sim->add_option("--seed", sim_args.seed, "the seed of --order random");
  sim->add_flag("--json", sim_args.json, "print a machine-readable trace (docs/SIMULATE.md)");
  // Step mode (issue 32): a dry run of the step planner and the cost model (docs/SIMULATE.md).
  StepSimulateArgs& steps = sim_args.steps;
  sim->add_flag("--steps", steps.enabled,
                "dry-run step mode for a synchronous group: E, S, P and the fitted cost model");
  sim->add_option("--ranks", steps.ranks, "--steps: ranks in the group")
      ->check(CLI::Range(1, 4096));
  sim->add_option("--lengths", steps.lengths, "--steps: a file of sample lengths, one a line");
  sim->add_option("--synthetic-lengths", steps.synthetic,
                  "--steps: N log-normal utterance durations of 1-35 s instead of --lengths")
      ->check(CLI::Range(1, 10000000));
  sim->add_option("--batch-budget", steps.budget,
                  "--steps: the most padded cost of a batch at the fastest rank's speed");
  sim->add_option("--cost", steps.cost,
                  "--steps: the true cost A,B,C of a batch: A + B·n·L + C·n·L²");
  sim->add_option("--epochs", steps.epochs, "--steps: epochs to simulate")
      ->check(CLI::Range(1, 1000));
  sim->add_option("--slow-rank", steps.slow_rank,
                  "--steps: this rank runs --slowdown times slower");
  sim->add_option("--slowdown", steps.slowdown, "--steps: how much slower --slow-rank runs");
  sim->add_option("--noise", steps.noise, "--steps: relative noise of the reported batch times");
  sim->add_flag("--compare", steps.compare,
                "--steps: also DistributedSampler and unsynchronised bucketing, side by side");
  sim->footer(example({"traincoord simulate --config examples/runs/example.toml --workers 4",
                       "traincoord simulate --config run.toml --workers 8 --order random --seed 1 "
                       "--json",
                       "traincoord simulate --steps --ranks 8 --synthetic-lengths 20000 "
                       "--batch-budget 400 --compare"}));

  ServeArgs serve_args;
  CLI::App* srv = app.add_subcommand("serve", "Serve runs to workers over HTTP (docs/API.md)");
  srv->add_option("--config", serve_args.configs, "a run config (TOML); repeat for several runs");
  srv->add_option("--runs", serve_args.runs_dir, "a folder of run configs (*.toml)");
  srv->add_option("--listen", serve_args.listen, "HOST:PORT to listen on (port 0: any free one)")
      ->capture_default_str();
  srv->add_option("--io-threads", serve_args.io_threads, "threads for network I/O")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  srv->add_option("--data-dir", serve_args.data_dir,
                  "where the state lives (default: ./RUN.traincoord for one run, "
                  "./traincoord-data otherwise)");
  srv->add_flag("--in-memory", serve_args.in_memory, "keep no state on disk (lost on exit)");
  srv->add_option("--durability", serve_args.durability,
                  "fsync: survive power loss; os: survive a process crash (faster)")
      ->check(CLI::IsMember({"fsync", "os"}))
      ->capture_default_str();
  srv->add_flag("--apply-config-changes", serve_args.apply_config_changes,
                "apply changed lease and early-stop settings to a started run");
  srv->add_flag("--auth", serve_args.auth,
                "require tokens on loopback too (always required on other addresses)");
  srv->add_option("--token-dir", serve_args.token_dir,
                  "where admin.token and RUN.token live (default: the data dir)");
  srv->add_option("--tls-cert", serve_args.tls_cert,
                  "serve HTTPS with this PEM certificate (chain); needs --tls-key");
  srv->add_option("--tls-key", serve_args.tls_key, "the PEM private key of --tls-cert");
  srv->add_option("--tls-client-ca", serve_args.tls_client_ca,
                  "require client certificates signed by this PEM CA bundle");
  srv->add_flag("--allow-plain-http", serve_args.allow_plain_http,
                "serve plain HTTP on a non-loopback address (behind a TLS proxy, or a trusted "
                "network); without it such an address needs --tls-cert");
  CLI::Option* max_connections =
      srv->add_option("--max-connections", serve_args.max_connections,
                      "client connections held at once; more are closed (default: 20000, or "
                      "what the file descriptor limit holds)")
          ->check(CLI::Range(size_t{1}, size_t{1'000'000}));
  srv->add_option("--max-requests-per-connection", serve_args.max_requests_per_connection,
                  "requests on one connection before the server closes it")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000'000}))
      ->capture_default_str();
  srv->add_option("--max-runs", serve_args.max_runs, "runs one coordinator holds")
      ->check(CLI::Range(size_t{1}, size_t{1'000'000}))
      ->capture_default_str();
  srv->add_option("--max-workers-per-run", serve_args.max_workers_per_run, "workers of one run")
      ->check(CLI::Range(size_t{1}, size_t{10'000'000}))
      ->capture_default_str();
  srv->add_option("--read-timeout", serve_args.read_timeout_s,
                  "seconds a request may take to arrive once it has begun")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  srv->add_option("--idle-timeout", serve_args.idle_timeout_s,
                  "seconds a connection may wait between requests")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  srv->add_option("--snapshot-every", serve_args.snapshot_every,
                  "log records of a run between snapshots (bounds restart time)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100'000'000}))
      ->capture_default_str();
  srv->add_option("--min-free-disk", serve_args.min_free_disk_mib,
                  "MiB kept free on the data dir's disk: below it, no new work is taken (503) "
                  "until there is room, and a start is refused")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30))
      ->capture_default_str();
  srv->add_option("--journal", serve_args.journal,
                  "keep the state in etcd instead of a data dir, for high availability: "
                  "etcd://HOST:PORT[,HOST:PORT...][/PREFIX], or etcds://... over TLS "
                  "(docs/HA.md)");
  srv->add_option("--etcd-cacert", serve_args.etcd_cacert,
                  "with --journal etcds://: PEM CA bundle the etcd members' certificates are "
                  "verified against (default: the system's CAs)");
  srv->add_option("--etcd-cert", serve_args.etcd_cert,
                  "with --journal etcds://: PEM client certificate shown to etcd (its "
                  "--client-cert-auth)");
  srv->add_option("--etcd-key", serve_args.etcd_key,
                  "with --journal etcds://: the PEM private key of --etcd-cert");
  srv->add_option("--advertise-url", serve_args.advertise_url,
                  "with --journal etcd://: the URL clients reach this coordinator at (default: "
                  "the listen address)");
  srv->add_option("--lease-ttl", serve_args.lease_ttl_s,
                  "with --journal etcd://: seconds the leader's etcd lease lasts without a "
                  "keep-alive (a failover takes about this long)")
      ->check(CLI::Range(2, 600))
      ->capture_default_str();
  srv->footer(example({"traincoord serve --config examples/runs/example.toml",
                       "traincoord serve --runs runs/ --listen 0.0.0.0:8470 --tls-cert cert.pem "
                       "--tls-key key.pem"}));

  StatusArgs status_args;
  CLI::App* st = app.add_subcommand("status", "Show a run: epoch progress, losses, workers");
  st->add_option("run", status_args.run, "the run (default: the only one)");
  st->add_option("--url", status_args.url, "the coordinator")->capture_default_str();
  st->add_flag("--watch", status_args.watch, "redraw until the run ends (Ctrl-C to stop)");
  st->add_option("--interval", status_args.interval_s, "seconds between redraws")
      ->check(CLI::Range(0.1, 3600.0));
  st->add_flag("--json", status_args.json, "print the run's JSON status");
  st->footer(example({"traincoord status example --url http://127.0.0.1:8470 --watch"}));

  StatusArgs runs_args;
  CLI::App* rs = app.add_subcommand("runs", "List the runs of a coordinator");
  rs->add_option("--url", runs_args.url, "the coordinator")->capture_default_str();
  rs->add_flag("--json", runs_args.json, "print JSON");
  rs->footer(example({"traincoord runs --url http://127.0.0.1:8470"}));

  HistoryArgs history_args;
  CLI::App* hs = app.add_subcommand(
      "history", "Print a run's history: epoch losses and metrics, then its recent completions");
  hs->add_option("run", history_args.run, "the run")->required();
  hs->add_option("--url", history_args.url, "the coordinator")->capture_default_str();
  hs->add_option("--format", history_args.format,
                 "csv (a row per epoch and per job; a column per metric), jsonl (a JSON object "
                 "a line) or json")
      ->check(CLI::IsMember({"csv", "jsonl", "json"}))
      ->capture_default_str();
  hs->footer(example({"traincoord history example --url http://127.0.0.1:8470 > example.csv",
                      "traincoord history example --format jsonl | grep '\"kind\":\"epoch\"'"}));

  LaunchArgs launch_args;
  CLI::App* lch = app.add_subcommand(
      "launch",
      "Start N worker processes on this node, restarted as a whole group when one fails: with "
      "--config, a coordinator in this process; with --url --run, one agent per node meeting "
      "at a coordinator (docs/LAUNCH.md)");
  lch->add_option("--workers,--nproc-per-node", launch_args.workers,
                  "worker processes on this node")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  lch->add_option("--config", launch_args.config,
                  "the run config (TOML): a coordinator in this process");
  lch->add_option("--url", launch_args.url,
                  "the coordinator the agents of every node meet at (traincoord serve)");
  lch->add_option("--run", launch_args.run, "with --url: the run to train");
  lch->add_option("--nnodes", launch_args.nnodes,
                  "MIN[:MAX] nodes: the group forms with at least MIN, at most MAX")
      ->capture_default_str();
  lch->add_option("--node", launch_args.node,
                  "this node's name in the rendezvous (default: the host name; node0 alone)");
  lch->add_option("--node-addr", launch_args.node_addr,
                  "the address other nodes reach this one at (MASTER_ADDR when it is node rank 0)")
      ->capture_default_str();
  lch->add_option("--settle", launch_args.settle_s,
                  "seconds later nodes are awaited once MIN joined (MIN < MAX); the same on "
                  "every node")
      ->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  lch->add_option("--node-timeout", launch_args.node_timeout_s,
                  "seconds without a heartbeat after which a node's agent is lost; the same on "
                  "every node")
      ->check(CLI::Range(1.0, 600.0))
      ->capture_default_str();
  lch->add_option("--rdzv-timeout", launch_args.rdzv_timeout_s,
                  "seconds the agent waits for the rendezvous to take it (the coordinator "
                  "unreachable or restarting, its name still held, `restart` to every join) "
                  "before it gives up")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  lch->add_option("--max-restarts", launch_args.max_restarts,
                  "restarts of the whole group when a worker fails or a node is lost (as "
                  "torchrun's); each restart is a new group (TRAINCOORD_GROUP) whose ranks "
                  "restore their checkpoint's cut")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  lch->add_option("--grace", launch_args.grace_s,
                  "seconds between SIGTERM and SIGKILL when the group is stopped")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  lch->add_option("--listen", launch_args.listen,
                  "with --config: the coordinator's address when free (else any free loopback "
                  "port); the default is serve's, so that status and runs find it")
      ->capture_default_str();
  lch->add_flag("!--no-prefix", launch_args.prefix_output,
                "do not prefix each line of a worker's output with [rankN]:");
  lch->add_option("--join-timeout", launch_args.join_timeout_s,
                  "seconds the agent waits to be in a running round (nodes to join, the next "
                  "round to form) before it gives up, as torchrun's join_timeout")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  lch->add_option("--data-dir", launch_args.data_dir,
                  "with --config: where the run's state lives (default: ./RUN.traincoord, as "
                  "serve): launch again to resume");
  lch->add_flag("--in-memory", launch_args.in_memory,
                "with --config: keep no state on disk (a restart of launch starts afresh)");
  lch->add_flag("--apply-config-changes", launch_args.apply_config_changes,
                "with a data dir holding the run: apply a changed config where allowed (see "
                "serve)");
  lch->add_flag("--auth", launch_args.auth,
                "require tokens; workers get theirs through $TRAINCOORD_TOKEN_FILE");
  lch->add_option("command", launch_args.command,
                  "the worker command, after --; a *.py runs with python3 from PATH");
  add_torchrun_flags(lch, launch_args.torchrun);
  lch->allow_extras(false);
  lch->footer(
      example({"traincoord launch --workers 4 --config examples/digits/digits.toml -- "
               "/usr/bin/python3 examples/digits/train.py",
               "traincoord launch --url http://10.0.0.1:8470 --run digits --nnodes 1:2 "
               "--nproc-per-node 4 --node-addr 10.0.0.2 --max-restarts 3 -- python3 train.py"}));

  InspectArgs inspect_args;
  CLI::App* ins = app.add_subcommand("inspect", "Show the runs in a data dir, without a server");
  ins->add_option("--data-dir", inspect_args.data_dir, "the data dir")->required();
  ins->add_option("run", inspect_args.run, "one run (default: all)");
  ins->add_flag("--json", inspect_args.json, "print each run's JSON status");
  ins->footer(example({"traincoord inspect --data-dir example.traincoord"}));

  ApplyConfigArgs apply_args;
  CLI::App* ap = app.add_subcommand(
      "apply-config",
      "Apply a changed config file to its started run on a serving coordinator, without a "
      "restart (what it may change: docs/CLI.md)");
  ap->add_option("config", apply_args.config, "the run's config file (TOML)")->required();
  ap->add_option("--url", apply_args.url, "the coordinator")->capture_default_str();
  ap->add_flag("--dry-run", apply_args.dry_run, "say what would change, change nothing");
  ap->footer(
      example({"traincoord apply-config examples/runs/example.toml --url "
               "http://127.0.0.1:8470"}));

  std::vector<std::string> spelled = torchrun_command_line(lch, argc, argv);
  std::vector<char*> spelled_argv;
  for (std::string& arg : spelled) spelled_argv.push_back(arg.data());
  argc = static_cast<int>(spelled_argv.size());
  spelled_argv.push_back(nullptr);
  argv = spelled_argv.data();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << "traincoord: " << usage_error(app, argc, argv, e) << "\n";
    return exit_code::kUsage;
  }
  if (hs->parsed()) return history(history_args);
  if (ins->parsed()) return inspect(inspect_args);
  if (lch->parsed()) return launch(launch_args);
  if (sim->parsed()) return simulate(sim_args);
  if (srv->parsed()) {
    serve_args.max_connections_given = max_connections->count() > 0;
    return serve(serve_args);
  }
  if (st->parsed()) return status(status_args);
  if (rs->parsed()) return runs(runs_args);
  if (ap->parsed()) return apply_config(apply_args);
  return exit_code::kOk;
}
