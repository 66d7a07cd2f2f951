// `traincoord launch`: a coordinator in-process on a free loopback port (or the one at --url), and
// N worker processes pointed at it; what torchrun's standalone mode is for torch, for us. What the
// node's agent decides is in launch_agent.h (a pure state machine); this file performs it: the
// rendezvous requests, the ranks' processes and output, the waits for a signal.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <pthread.h>
#include <rapidjson/document.h>

#include "cli/commands.h"
#include "cli/host.h"
#include "cli/launch_agent.h"
#include "cli/terminal_text.h"
#include "client/rendezvous.h"
#include "config/config_file.h"
#include "core/engine.h"
#include "json/json_writer.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "server/http_server.h"
#include "server/restore.h"
#include "server/server_clock.h"
#include "store/store.h"
#include "traincoord/client.h"

namespace traincoord::cli {

namespace {

int fail(const std::string& message) {
  std::cerr << "traincoord launch: " << message << "\n";
  return exit_code::kUsage;
}

uint16_t free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// The writes of the launcher and of the threads that copy the workers' output, one at a time,
// so that lines never interleave.
std::mutex output_mutex;

// Copies what a worker writes to `fd` to `out`, line by line, each line after `prefix`; returns
// at end of file (the worker and every process it started closed the pipe).
void pump(int fd, std::string prefix, FILE* out) {
  std::string pending;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<size_t>(n));
    size_t newline;
    std::string lines;
    while ((newline = pending.find('\n')) != std::string::npos) {
      lines += prefix;
      lines.append(pending, 0, newline + 1);
      pending.erase(0, newline + 1);
    }
    if (!lines.empty()) {
      std::lock_guard lock(output_mutex);
      std::fwrite(lines.data(), 1, lines.size(), out);
      std::fflush(out);
    }
  }
  if (!pending.empty()) {
    std::lock_guard lock(output_mutex);
    std::fprintf(out, "%s%s\n", prefix.c_str(), pending.c_str());
    std::fflush(out);
  }
  close(fd);
}

// Starts `command` with `env` added; with `outputs` (two pipes' write ends), its stdout and
// stderr go there.
pid_t spawn(const std::vector<std::string>& command, const std::vector<std::string>& env,
            const int* outputs = nullptr) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);  // the launcher blocked them; workers must not
  // A worker outlives no agent: were the agent killed, its workers would go on training for a
  // group that no longer exists (their requests refused, their GPUs held).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) _exit(137);  // (the agent died before prctl)
  if (outputs != nullptr) {
    dup2(outputs[0], STDOUT_FILENO);
    dup2(outputs[1], STDERR_FILENO);
  }
  for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "traincoord launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
  _exit(127);
}

// The line launch prints when an epoch closes: its losses and metrics.
std::string epoch_line(const std::string& run, const rapidjson::Value& e) {
  std::ostringstream out;
  out << "[" << run << "] "
      << (e.HasMember("set") && e["set"].IsString() ? e["set"].GetString() : "?") << " epoch "
      << (e.HasMember("epoch") && e["epoch"].IsInt64() ? e["epoch"].GetInt64() : -1)
      << " closed: loss ";
  if (e.HasMember("loss") && e["loss"].IsNumber()) {
    out << e["loss"].GetDouble();
  } else {
    out << "n/a";
  }
  if (e.HasMember("metrics") && e["metrics"].IsObject()) {
    for (auto it = e["metrics"].MemberBegin(); it != e["metrics"].MemberEnd(); ++it) {
      if (it->value.IsNumber()) out << ", " << it->name.GetString() << " " << it->value.GetDouble();
    }
  }
  if (e.HasMember("done") && e["done"].IsUint64()) out << " (" << e["done"].GetUint64() << " jobs)";
  return out.str();
}

std::string progress_line(const std::string& status_json) {
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(status_json.c_str());  // any depth, no recursion
  if (d.HasParseError() || !d.IsObject()) return "";
  std::ostringstream out;
  const auto& p = d["progress"];
  out << "[" << d["run"].GetString() << "] ";
  if (d["current"].IsObject()) {
    const auto& c = d["current"];
    const uint64_t done = c["done"].GetUint64() + c["failed"].GetUint64();
    const uint64_t jobs = c["jobs"].GetUint64();
    out << c["set"].GetString() << " epoch " << c["epoch"].GetInt64() << " "
        << progress_bar(done, jobs, 20) << " " << done << "/" << jobs;
  } else {
    out << d["state"].GetString();
  }
  out << "  run " << p["jobs_done"].GetUint64() << "/" << p["jobs_planned"].GetUint64() << " jobs";
  // An ETA once a tenth of the run is done: before, it extrapolates the first jobs (and the
  // start of the workers) to the whole run.
  const uint64_t planned = p["jobs_planned"].GetUint64();
  if (p["eta_s"].IsNumber() && planned > 0 && p["jobs_done"].GetUint64() * 10 >= planned) {
    out << ", ETA " << static_cast<long>(p["eta_s"].GetDouble()) << " s";
  }
  return out.str();
}

}  // namespace

namespace {

// --nnodes MIN[:MAX]
bool parse_nnodes(const std::string& text, uint32_t* min, uint32_t* max) {
  const size_t colon = text.find(':');
  try {
    size_t used = 0;
    const int lo = std::stoi(text.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? text.size() : colon)) return false;
    int hi = lo;
    if (colon != std::string::npos) {
      const std::string rest = text.substr(colon + 1);
      hi = std::stoi(rest, &used);
      if (used != rest.size()) return false;
    }
    if (lo < 1 || hi < lo || hi > 1024) return false;
    *min = static_cast<uint32_t>(lo);
    *max = static_cast<uint32_t>(hi);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The secret this agent joins with: every later request for its node presents it, so no other
// agent (nor anyone else holding the run's token) can speak for the node (docs/SECURITY.md).
std::string draw_secret() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      std::random_device device;  // (no getrandom: the C++ library's source of randomness)
      for (; got < sizeof bytes; ++got) bytes[got] = static_cast<unsigned char>(device());
    }
  }
  static const char kHex[] = "0123456789abcdef";
  std::string secret;
  for (const unsigned char b : bytes) {
    secret.push_back(kHex[b >> 4]);
    secret.push_back(kHex[b & 15]);
  }
  return secret;
}

// ---- torchrun's habits (docs/LAUNCH.md, "torchrun's flags and ours") ----

// What a refused torchrun flag is, here: the flag (or way) to use instead.
std::string instead_of(const std::string& flag) {
  if (flag == "--node-rank") {
    return "node ranks follow the order in which the agents join; name each node with --node";
  }
  if (flag == "--master-addr" || flag == "--master-port") {
    return "the rendezvous gives MASTER_ADDR and MASTER_PORT (node rank 0's --node-addr and a "
           "free port of it); point every agent at the coordinator with --url";
  }
  if (flag == "--monitor-interval") {
    return "an agent polls every --node-timeout / 5 s; give --node-timeout";
  }
  if (flag == "--tee" || flag == "--log-dir" || flag == "--redirects" ||
      flag == "--local-ranks-filter" || flag == "--logs-specs") {
    return "every line of a rank comes out on launch's own output, prefixed [rankN]: "
           "(--no-prefix to turn it off); redirect it with the shell";
  }
  return "launch has no such setting (docs/LAUNCH.md lists torchrun's flags and ours)";
}

// An error of the command line, said as it is.
tl::unexpected<std::string> refuse(std::string message) {
  return tl::unexpected(std::move(message));
}

// The seconds of a --rdzv-conf value, or an error naming the key.
tl::expected<double, std::string> conf_seconds(const std::string& key, const std::string& value) {
  try {
    size_t used = 0;
    const double s = std::stod(value, &used);
    if (used == value.size() && s >= 0) return s;
  } catch (const std::exception&) {
  }
  return refuse("--rdzv-conf " + key + "=" + value + ": give a number of seconds");
}

// --rdzv-conf KEY=VALUE,...: the keys that mean one of our settings.
tl::expected<void, std::string> apply_rdzv_conf(const std::string& conf, LaunchArgs& args) {
  std::istringstream items(conf);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (eq == std::string::npos) return refuse("--rdzv-conf " + item + ": give KEY=VALUE");
    auto seconds = conf_seconds(key, item.substr(eq + 1));
    if (!seconds) return refuse(seconds.error());
    if (key == "join_timeout" || key == "timeout") {
      args.join_timeout_s = *seconds;
    } else if (key == "last_call_timeout") {
      args.settle_s = *seconds;
    } else if (key == "read_timeout") {
      args.rdzv_timeout_s = static_cast<int>(*seconds);
    } else {
      return refuse("--rdzv-conf " + key +
                    ": launch has no such setting (join_timeout, timeout, "
                    "last_call_timeout and read_timeout are mapped; see --node-timeout "
                    "for the heartbeat)");
    }
  }
  return {};
}

// The arguments with torchrun's flags mapped onto ours; an error names a flag refused and the
// one to use.
tl::expected<LaunchArgs, std::string> with_torchrun_flags(LaunchArgs args) {
  const LaunchArgs::Torchrun& t = args.torchrun;
  if (!t.refused.empty()) return refuse(t.refused.front() + ": " + instead_of(t.refused.front()));
  if (t.standalone && !args.url.empty()) {
    return refuse(
        "--standalone and --url exclude each other: --standalone (as --config) is "
        "a coordinator in this process");
  }
  if (t.standalone && args.config.empty()) {
    return refuse(
        "--standalone: give --config RUN.toml, the run to train: launch's "
        "standalone mode is a coordinator in this process");
  }
  if (!t.rdzv_backend.empty() && t.rdzv_backend != "c10d" && t.rdzv_backend != "traincoord") {
    return refuse("--rdzv-backend " + t.rdzv_backend +
                  ": the agents meet at the coordinator (--url, or --rdzv-endpoint "
                  "HOST:PORT of a traincoord serve); give c10d or leave it out");
  }
  if (!t.rdzv_endpoint.empty()) {
    const std::string url = t.rdzv_endpoint.find("://") == std::string::npos
                                ? "http://" + t.rdzv_endpoint
                                : t.rdzv_endpoint;
    if (!args.url.empty() && args.url != url) {
      return refuse("--rdzv-endpoint " + t.rdzv_endpoint + " and --url " + args.url +
                    " differ: give one of them");
    }
    args.url = url;
  }
  if (!t.rdzv_id.empty()) {
    if (!args.run.empty() && args.run != t.rdzv_id) {
      return refuse("--rdzv-id " + t.rdzv_id + " and --run " + args.run +
                    " differ: give one of them");
    }
    args.run = t.rdzv_id;
  }
  if (!t.local_addr.empty()) args.node_addr = t.local_addr;
  if (!t.rdzv_conf.empty()) {
    if (auto applied = apply_rdzv_conf(t.rdzv_conf, args); !applied) {
      return refuse(applied.error());
    }
  }
  if (t.no_python && t.module) return refuse("--no-python and --module exclude each other");
  return args;
}

// The path of `name` in a directory of $PATH, or "" when none holds it.
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// The command each rank runs: a *.py (or -m MODULE) with python3 from PATH, unbuffered, as
// torchrun runs it with its own interpreter (`python -u`); anything else as it is.
tl::expected<std::vector<std::string>, std::string> worker_command(const LaunchArgs& args) {
  const std::string& first = args.command.front();
  const bool script = first.size() > 3 && first.ends_with(".py");
  if (args.torchrun.no_python || (!script && !args.torchrun.module)) return args.command;
  const std::string python = on_path("python3");
  if (python.empty()) {
    return refuse("cannot run " + first +
                  ": a *.py command runs with python3 from PATH, and no directory of "
                  "PATH holds one; give the interpreter: -- /usr/bin/python3 " +
                  first);
  }
  std::vector<std::string> command{python, "-u"};
  if (args.torchrun.module) command.push_back("-m");
  command.insert(command.end(), args.command.begin(), args.command.end());
  return command;
}

// "waiting for nodes: 1 of 2 (n0)": who the rendezvous holds (GET .../nodes), or why this node
// waits for the next round.
std::string waiting_line(const std::string& url, const std::string& run, const std::string& node,
                         const std::string& token) {
  auto body = client::get(url, "/v1/runs/" + run + "/nodes", std::chrono::seconds(2), token);
  rapidjson::Document d;
  if (body) d.Parse<rapidjson::kParseIterativeFlag>(body->c_str());  // any depth, no recursion
  if (!body || d.HasParseError() || !d.IsObject() || !d.HasMember("nodes") ||
      !d["nodes"].IsArray()) {
    return "waiting for the round to form";
  }
  auto names_of = [](const rapidjson::Value& list, bool objects) {
    std::string names;
    for (const auto& n : list.GetArray()) {
      const rapidjson::Value& name = objects && n.IsObject() && n.HasMember("name") ? n["name"] : n;
      if (name.IsString()) names += (names.empty() ? "" : ", ") + std::string(name.GetString());
    }
    return names;
  };
  auto number = [&](const char* key) {
    return d.HasMember(key) && d[key].IsUint64() ? d[key].GetUint64() : uint64_t{0};
  };
  if (d.HasMember("formed") && d["formed"].IsBool() && d["formed"].GetBool() &&
      d.HasMember("members") && d["members"].IsArray()) {
    return "waiting for the next round: round " + std::to_string(number("round")) + " runs with " +
           names_of(d["members"], false) + "; node " + node + " joins when it re-forms";
  }
  const uint64_t min = number("min_nodes"), max = number("max_nodes");
  return "waiting for nodes: " + std::to_string(d["nodes"].Size()) + " of " + std::to_string(min) +
         (max > min ? ":" + std::to_string(max) : "") + " (" + names_of(d["nodes"], true) + ")";
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "node";
  return name;
}

// ---- the world around the agent: its coordinator, its ranks, its output ----

// The coordinator this node's agent speaks to: one in this process (`launch --config`), or the
// one at --url.
struct Host {
  ServerClock clock;
  Engine engine{clock};
  std::unique_ptr<Store> store;
  std::optional<Auth> auth;
  std::optional<HttpServer> server;
  std::string url, run_name, token_file, token, data_dir;
};

std::optional<int> serve_run(const LaunchArgs& args, const sigset_t& signals, Host& h);

// The state of `launch --config`: the data dir (./RUN.traincoord by default, as `serve` with
// one run), restored into `h`, so that a launch of the same config after a crash or a Ctrl-C
// resumes the run and its checkpoints' cuts; or memory (--in-memory). Returns the exit status
// of a failure.
std::optional<int> open_launch_state(const LaunchArgs& args, Host& h) {
  if (args.in_memory && !args.data_dir.empty()) {
    return fail("--in-memory and --data-dir exclude each other");
  }
  auto choice = choose_state("", args.in_memory, args.data_dir, {h.run_name});
  if (!choice) return fail(choice.error());
  if (choice->kind == StateChoice::Kind::kMemory) {
    h.clock.go_live(0);
    std::cerr << "traincoord launch: state in memory (--in-memory): the run starts afresh, and "
                 "a checkpoint of an earlier launch cannot be restored here (its cut is not "
                 "kept)\n";
    return std::nullopt;
  }
  h.data_dir = choice->where;
  StoreOptions so;
  so.dir = h.data_dir;
  auto report = open_data_dir(so, h.engine, h.clock, &h.store);
  if (!report) return fail(report.error());
  std::cerr << "traincoord launch: state in " << h.data_dir
            << (report->runs > 0 ? " (the run resumes from it" : " (launch again to resume")
            << "; --in-memory keeps none)\n";
  return std::nullopt;
}

// The run of `--config` in `host`: restored from its data dir (or created), then served
// (serve_run). Returns the exit status of a failure.
std::optional<int> host_coordinator(const LaunchArgs& args, const sigset_t& signals, Host& h) {
  std::ifstream in(args.config, std::ios::binary);
  if (!in) return fail("cannot read run config " + args.config);
  std::ostringstream text;
  text << in.rdbuf();
  auto config = parse_run_config(text.str(), args.config);
  if (!config) return fail(config.error().message);
  h.run_name = config->name;
  std::string listen_host;
  uint16_t listen_port = 0;
  if (!split_listen(args.listen, &listen_host, &listen_port)) {
    return fail("--listen must be HOST:PORT, e.g. 127.0.0.1:8470 (got " + args.listen + ")");
  }
  if (auto code = open_launch_state(args, h)) return *code;
  // A data dir that holds the run already: the same config resumes it, a changed one is
  // refused (or applied when asked and allowed), as `serve` does.
  const bool resumed = h.engine.find(h.run_name).has_value();
  const ConfigFile file{args.config, text.str(), *config};
  if (const int code =
          add_runs({file}, h.engine, h.store.get(), h.clock, args.apply_config_changes, fail);
      code != 0) {
    return code;
  }
  const Run& run = **h.engine.find(h.run_name);
  if (resumed && run.finished()) {
    std::cerr << "traincoord launch: run " << h.run_name << " already ended ("
              << run_state_name(run.state()) << ", state in " << h.data_dir
              << "): nothing left to train; to train it again, remove " << h.data_dir
              << " or give --in-memory\n";
  }
  return serve_run(args, signals, h);
}

// Serves the run of `h` (with --auth, its tokens): on the default port when free, else on a free
// loopback port. Returns the exit status of a failure.
std::optional<int> serve_run(const LaunchArgs& args, const sigset_t& signals, Host& h) {
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ServerOptions options;
  if (args.auth) {
    auto opened = Auth::open(h.data_dir.empty() ? "traincoord-tokens" : h.data_dir);
    if (!opened) return fail(opened.error().message);
    h.auth = std::move(*opened);
    if (auto t = h.auth->worker_token(h.run_name); !t) return fail(t.error().message);
    h.token_file = h.auth->worker_token_path(h.run_name);
    h.token = h.auth->admin_token();
    for (const std::string& notice : h.auth->take_notices()) {
      std::cerr << "traincoord launch: " << notice << "\n";
    }
    options.auth = &*h.auth;
  }
  // The default port of `serve` when it is free, so that `traincoord status` and `runs` find
  // this coordinator without --url; else any free loopback port.
  auto port = start_server(h.server, h.engine, h.clock, h.store.get(), options,
                           {args.listen, "127.0.0.1:0"});
  if (!port) return fail(port.error().message);
  h.url = "http://127.0.0.1:" + std::to_string(*port);
  std::cerr << "traincoord launch: coordinator on " << h.url << ", run " << h.run_name << ", "
            << args.workers << " workers";
  if (*port != 8470) std::cerr << " (traincoord status --url " << h.url << " " << h.run_name << ")";
  std::cerr << "\n";
  return std::nullopt;
}

void say(const std::string& line) {
  std::lock_guard lock(output_mutex);
  std::cerr << line << std::flush;
}

// The ranks of this node: started with their environment (and their output prefixed), reaped,
// signalled, stopped with a grace period.
class RankSupervisor {
 public:
  RankSupervisor(std::vector<std::string> command, bool prefix, int workers)
      : command_(std::move(command)), prefix_(prefix), pids_(static_cast<size_t>(workers), -1) {}

  void start(const std::vector<std::vector<std::string>>& envs, uint32_t rank_offset) {
    for (size_t r = 0; r < pids_.size(); ++r) {
      int out[2], err[2];
      if (!prefix_ || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        pids_[r] = spawn(command_, envs[r]);  // (no pipes: unprefixed output)
      } else {
        const int ends[2] = {out[1], err[1]};
        pids_[r] = spawn(command_, envs[r], ends);
        close(out[1]);
        close(err[1]);
        const std::string prefix = "[rank" + std::to_string(rank_offset + r) + "]: ";
        pumps_.emplace_back(pump, out[0], prefix, stdout);
        pumps_.emplace_back(pump, err[0], prefix, stderr);
      }
      if (pids_[r] < 0) unstarted_.push_back(RankExit{static_cast<int>(r), -1});
    }
  }
  // The ranks that exited since the last call (and those that never started).
  std::vector<RankExit> reap() {
    std::vector<RankExit> exits = std::move(unstarted_);
    unstarted_.clear();
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (size_t r = 0; r < pids_.size(); ++r) {
        if (pids_[r] != pid) continue;
        pids_[r] = -1;
        exits.push_back(RankExit{static_cast<int>(r),
                                 WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)});
      }
    }
    return exits;
  }
  void signal(int sig) {
    for (const pid_t pid : pids_) {
      if (pid > 0) kill(pid, sig);
    }
  }
  bool any_running() const {
    return std::any_of(pids_.begin(), pids_.end(), [](pid_t p) { return p > 0; });
  }
  // Stops every rank still running: SIGTERM, then SIGKILL after `grace_s`; returns their exits.
  std::vector<RankExit> stop(double grace_s) {
    signal(SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
    bool killed = false;
    std::vector<RankExit> exits = reap();
    while (any_running()) {
      if (!killed && std::chrono::steady_clock::now() >= deadline) {
        signal(SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (const RankExit& e : reap()) exits.push_back(e);
    }
    return exits;
  }
  void join_pumps() {
    for (std::thread& t : pumps_) t.join();  // (every rank exited: their pipes are closed)
  }

 private:
  std::vector<std::string> command_;
  bool prefix_;
  std::vector<pid_t> pids_;
  std::vector<RankExit> unstarted_;
  std::vector<std::thread> pumps_;
};

// The agent's view of the run for the user: a line for each epoch closed since the last report,
// and the progress line (on a terminal redrawn; else when it changed, every 5 s at most).
class ProgressReport {
 public:
  ProgressReport(const Host& h, bool tty) : h_(h), tty_(tty) {}

  void report(bool final) {
    auto body = client::get(h_.url, "/v1/runs/" + h_.run_name, std::chrono::seconds(2), h_.token);
    if (!body) return;
    rapidjson::Document d;
    d.Parse<rapidjson::kParseIterativeFlag>(body->c_str());  // any depth, no recursion
    std::string lines;
    if (!d.HasParseError() && d.IsObject() && d.HasMember("epochs") && d["epochs"].IsArray()) {
      lines = epoch_lines(d);
    }
    std::string line = progress_line(*body);
    const auto now = std::chrono::steady_clock::now();
    if (!tty_ &&
        (line == last_progress_ || (!final && now - last_progress_at_ < std::chrono::seconds(5)))) {
      line.clear();
    }
    if (!line.empty()) {
      last_progress_ = line;
      last_progress_at_ = now;
    }
    std::lock_guard lock(output_mutex);
    if (tty_) {
      std::cerr << "\r\x1b[K" << lines << (line.empty() ? last_progress_ : line) << std::flush;
    } else {
      std::cerr << lines << (line.empty() ? "" : line + "\n");
    }
  }

 private:
  // The lines of the epochs closed since the last report.
  std::string epoch_lines(const rapidjson::Document& d) {
    const auto& epochs = d["epochs"].GetArray();
    // The status lists the latest epochs, from position epochs_from (docs/API.md).
    const size_t from = d.HasMember("epochs_from") && d["epochs_from"].IsUint64()
                            ? static_cast<size_t>(d["epochs_from"].GetUint64())
                            : 0;
    // A restore may take epochs back: announce them again when they close again.
    size_t closed = 0;
    while (closed < epochs.Size() && epochs[closed].IsObject() &&
           epochs[closed].HasMember("closed") && epochs[closed]["closed"].IsBool() &&
           epochs[closed]["closed"].GetBool()) {
      ++closed;
    }
    closed += from;
    std::string lines;
    if (closed < shown_) shown_ = closed;
    if (shown_ < from) {  // (more closed since the last report than the status lists)
      lines += "[" + h_.run_name + "] " + std::to_string(from - shown_) + " epochs closed\n";
      shown_ = from;
    }
    for (; shown_ < closed; ++shown_)
      lines += epoch_line(h_.run_name, epochs[shown_ - from]) + "\n";
    return lines;
  }

  const Host& h_;
  bool tty_;
  size_t shown_ = 0;           // closed epochs announced (in opening order)
  std::string last_progress_;  // the progress line printed last, and when
  std::chrono::steady_clock::time_point last_progress_at_ =
      std::chrono::steady_clock::now() - std::chrono::seconds(10);
};

AgentMs steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Performs the actions of the agent of this node (launch_agent.h) until it finishes: the
// requests to the rendezvous, the waits (for a signal, reaping the ranks), the ranks.
class AgentDriver {
 public:
  AgentDriver(const LaunchArgs& args, const AgentSettings& settings, const Host& h,
              const sigset_t& signals, uint32_t min_nodes, uint32_t max_nodes,
              std::vector<std::string> command)
      : args_(args),
        settings_(settings),
        h_(h),
        signals_(signals),
        min_nodes_(min_nodes),
        max_nodes_(max_nodes),
        ranks_(std::move(command), args.prefix_output, args.workers),
        progress_(h, settings.tty) {}

  AgentOutcome run() {
    LaunchAgent agent(settings_, steady_ms());
    std::vector<AgentAction> todo = agent.start(steady_ms());
    for (;;) {
      std::optional<AgentEvent> event;
      for (const AgentAction& action : todo) {
        if (const auto* f = std::get_if<Finish>(&action)) return f->outcome;
        event = std::visit([this](const auto& a) { return perform(a); }, action);
      }
      todo = agent.on(*event, steady_ms());
    }
  }
  ProgressReport& progress() { return progress_; }
  RankSupervisor& ranks() { return ranks_; }

 private:
  using Next = std::optional<AgentEvent>;

  // One rendezvous call through the client (client/rendezvous.h), its typed answer fed back.
  Next perform(const Request& r) {
    const std::chrono::milliseconds timeout(r.timeout_ms);
    switch (r.call) {
      case RdzvCall::kJoin:
        return Replied{r.call, rendezvous_.join(node_join(), timeout)};
      case RdzvCall::kPoll:
        return Replied{r.call, rendezvous_.poll(settings_.node, secret_, timeout)};
      case RdzvCall::kFail:
        return Replied{r.call, rendezvous_.fail(settings_.node, secret_, r.round, r.why, timeout)};
      case RdzvCall::kLeave:
        if (auto left = rendezvous_.leave(settings_.node, secret_, timeout); !left) {
          return Replied{r.call, tl::unexpected(left.error())};
        }
        return Replied{r.call, Standing{}};
    }
    return std::nullopt;  // (unreachable: every call is handled above)
  }
  Next perform(const Describe&) {
    return Described{waiting_line(h_.url, h_.run_name, settings_.node, h_.token)};
  }
  // Waits up to `w.ms` for SIGINT or SIGTERM, or a rank's exit (SIGCHLD); then reaps the ranks
  // that exited.
  Next perform(const Wait& w) {
    timespec wait{static_cast<time_t>(w.ms / 1000), static_cast<long>((w.ms % 1000) * 1'000'000)};
    const int sig = sigtimedwait(&signals_, nullptr, &wait);
    return Waited{sig == SIGINT || sig == SIGTERM ? sig : 0, ranks_.reap()};
  }
  Next perform(const StartRanks& s) {
    std::vector<std::vector<std::string>> envs;
    for (int r = 0; r < args_.workers; ++r) {
      envs.push_back(rank_env(settings_, s.at, r, s.restart_count, h_.token_file));
    }
    ranks_.start(envs, s.at.rank_offset);
    return std::nullopt;
  }
  Next perform(const SignalRanks& s) {
    ranks_.signal(s.signal);
    return std::nullopt;
  }
  Next perform(const StopRanks&) { return RanksStopped{ranks_.stop(args_.grace_s)}; }
  Next perform(const Say& s) {
    say(s.text);
    return std::nullopt;
  }
  Next perform(const ReportProgress&) {
    progress_.report(false);
    return std::nullopt;
  }
  Next perform(const Finish&) { return std::nullopt; }

  // This node's settings, with a free port for MASTER_PORT drawn anew at every join.
  NodeJoin node_join() const {
    NodeJoin join;
    join.node = settings_.node;
    join.secret = secret_;
    join.addr = args_.node_addr;
    join.nproc = static_cast<uint32_t>(args_.workers);
    join.master_port = free_port();
    join.min_nodes = min_nodes_;
    join.max_nodes = max_nodes_;
    join.settle_ms = static_cast<TimeMs>(args_.settle_s * 1000);
    join.node_timeout_ms = static_cast<TimeMs>(args_.node_timeout_s * 1000);
    return join;
  }

  const LaunchArgs& args_;
  const AgentSettings& settings_;
  const Host& h_;
  const sigset_t& signals_;
  uint32_t min_nodes_, max_nodes_;
  const std::string secret_ = draw_secret();
  const client::Rendezvous rendezvous_{h_.url, h_.run_name, h_.token};
  RankSupervisor ranks_;
  ProgressReport progress_;
};

// What the agent ended with, said; the run's state at the end; the exit status.
int conclude(const AgentOutcome& outcome, AgentDriver& driver, Host& h, bool tty) {
  driver.progress().report(true);  // the epochs that closed since the last report
  if (tty) std::cerr << "\n";
  driver.ranks().join_pumps();
  if (outcome.gave_up_why) std::cerr << "traincoord launch: " << *outcome.gave_up_why << "\n";
  std::string state = "unknown";
  if (auto body = client::get(h.url, "/v1/runs/" + h.run_name, std::chrono::seconds(2), h.token)) {
    rapidjson::Document d;
    d.Parse<rapidjson::kParseIterativeFlag>(body->c_str());  // any depth, no recursion
    if (!d.HasParseError() && d.IsObject() && d.HasMember("state") && d["state"].IsString()) {
      state = d["state"].GetString();
      const std::string reason =
          d.HasMember("reason") && d["reason"].IsString() ? d["reason"].GetString() : "";
      std::cerr << "traincoord launch: run " << h.run_name << " " << state
                << (reason.empty() ? "" : ": " + reason);
      if (d.HasMember("early_stop") && d["early_stop"].IsObject() &&
          d["early_stop"].HasMember("best_epoch") && d["early_stop"]["best_epoch"].IsInt64() &&
          reason.find("best epoch") == std::string::npos) {
        std::cerr << "; best epoch " << d["early_stop"]["best_epoch"].GetInt64();
      }
      std::cerr << "\n";
    }
  }
  if (h.server) h.server->stop();
  for (const RankExit& e : outcome.failed_ranks) {
    std::cerr << "traincoord launch: worker rank" << e.local_rank << " exited with " << e.exit_code
              << "\n";
  }
  for (const RankExit& e : outcome.stopped_ranks) {
    std::cerr << "traincoord launch: worker rank" << e.local_rank
              << " stopped with its group (exit " << e.exit_code << ")\n";
  }
  const int code = launch_exit_code(outcome, state);
  if (code == exit_code::kRunUnfinished && state == "running") {
    std::cerr << "traincoord launch: every worker exited, but the run is not finished\n";
  }
  return code;
}

// The settings of the command line that the coordinator bounds (core/rendezvous.h), said before
// anything starts; nothing when they hold.
std::optional<std::string> refused_settings(const LaunchArgs& args, uint32_t max_nodes) {
  const bool remote = !args.url.empty();
  if (!remote && max_nodes > 1) {
    return "--nnodes " + args.nnodes +
           " needs --url: the agents of several nodes meet at a coordinator they all reach "
           "(traincoord serve)";
  }
  if (remote && args.run.empty()) return "--url needs --run: the run to train";
  if (!(args.node_timeout_s >= 1 && args.node_timeout_s <= 600)) {
    return "--node-timeout must be between 1 and 600 seconds, got " +
           std::to_string(args.node_timeout_s);
  }
  if (!(args.settle_s >= 0 && args.settle_s <= 600)) {
    return "--settle must be between 0 and 600 seconds, got " + std::to_string(args.settle_s);
  }
  if (args.rdzv_timeout_s < 1) {
    return "--rdzv-timeout must be at least 1 second, got " + std::to_string(args.rdzv_timeout_s);
  }
  if (!remote && args.config.empty()) {
    return "give --config RUN.toml (a coordinator in this process), or --url and --run (a "
           "coordinator running elsewhere)";
  }
  return std::nullopt;
}

}  // namespace

int launch(const LaunchArgs& given) {
  if (given.command.empty()) return fail("give the worker command, e.g. -- python3 train.py");
  auto mapped = with_torchrun_flags(given);
  if (!mapped) return fail(mapped.error());
  const LaunchArgs& args = *mapped;
  auto command = worker_command(args);
  if (!command) return fail(command.error());
  if (command->size() != args.command.size()) {
    std::cerr << "traincoord launch: " << args.command.front() << " runs with " << (*command)[0]
              << " -u (python3 from PATH, as torchrun runs a script with its Python; --no-python "
                 "runs the command as it is)\n";
  }
  uint32_t min_nodes = 1, max_nodes = 1;
  if (!parse_nnodes(args.nnodes, &min_nodes, &max_nodes)) {
    return fail("--nnodes must be MIN or MIN:MAX with 1 <= MIN <= MAX <= 1024, got " + args.nnodes);
  }
  if (auto refused = refused_settings(args, max_nodes)) return fail(*refused);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);  // a rank's exit ends the agent's wait at once (not at its end)
  Host host;                     // a coordinator in this process (one node), or the one at --url
  const bool remote = !args.url.empty();
  if (!remote) {
    if (auto code = host_coordinator(args, signals, host)) return *code;
  } else {
    host.url = args.url;
    host.run_name = args.run;
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    host.token = client::token_from_environment();
    if (const char* file = std::getenv("TRAINCOORD_TOKEN_FILE")) host.token_file = file;
  }

  AgentSettings settings;
  settings.url = host.url;
  settings.run = host.run_name;
  settings.node = !args.node.empty() ? args.node : remote ? host_name() : "node0";
  settings.workers = args.workers;
  settings.max_restarts = args.max_restarts;
  settings.rdzv_timeout_s = args.rdzv_timeout_s;
  settings.join_timeout_s = args.join_timeout_s;
  settings.node_timeout_s = args.node_timeout_s;
  settings.tty = isatty(STDERR_FILENO);
  AgentDriver driver(args, settings, host, signals, min_nodes, max_nodes, std::move(*command));
  const AgentOutcome outcome = driver.run();
  return conclude(outcome, driver, host, settings.tty);
}

}  // namespace traincoord::cli
