// `traincoord launch`: a coordinator in-process on a free loopback port, and N worker processes
// pointed at it; what torchrun's standalone mode is for torch, for us.
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
#include "cli/terminal_text.h"
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

// What the agent knows of its node's place in the rendezvous (a join or poll reply).
struct Standing {
  std::string state;  // "waiting", "running", "restart"
  uint64_t round = 0;
  uint32_t node_rank = 0, nnodes = 0, world_size = 0, rank_offset = 0;
  std::string master_addr;
  uint16_t master_port = 0;
  std::string group;
  std::string why;
  std::string run_state;
};

tl::expected<Standing, client::ClientError> standing_of(
    const tl::expected<std::string, client::ClientError>& reply) {
  if (!reply) return tl::unexpected(reply.error());
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(reply->c_str());  // any depth, no recursion
  auto text = [&](const char* key) {
    return d.HasMember(key) && d[key].IsString() ? std::string(d[key].GetString()) : std::string();
  };
  auto number = [&](const char* key) {
    return d.HasMember(key) && d[key].IsUint64() ? d[key].GetUint64() : uint64_t{0};
  };
  if (d.HasParseError() || !d.IsObject() || text("state").empty()) {
    return tl::unexpected(client::ClientError{200, "bad_reply",
                                              "a rendezvous reply without its "
                                              "state: " +
                                                  *reply,
                                              ""});
  }
  Standing s;
  s.state = text("state");
  s.round = number("round");
  s.node_rank = static_cast<uint32_t>(number("node_rank"));
  s.nnodes = static_cast<uint32_t>(number("nnodes"));
  s.world_size = static_cast<uint32_t>(number("world_size"));
  s.rank_offset = static_cast<uint32_t>(number("rank_offset"));
  s.master_addr = text("master_addr");
  s.master_port = static_cast<uint16_t>(number("master_port"));
  s.group = text("group");
  s.why = text("why");
  s.run_state = text("run_state");
  return s;
}

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

// ---- never silent (docs/LAUNCH.md, "Waiting") ----

using SteadyTime = std::chrono::steady_clock::time_point;

// The pace of the lines that say what the agent waits for: due at once, then once every
// `every` until reset.
class Pace {
 public:
  explicit Pace(std::chrono::milliseconds every) : every_(every) {}
  bool due(SteadyTime now) {
    if (said_ && now - last_ < every_) return false;
    said_ = true;
    last_ = now;
    return true;
  }
  void reset() { said_ = false; }

 private:
  std::chrono::milliseconds every_;
  SteadyTime last_{};
  bool said_ = false;
};

long seconds_between(SteadyTime from, SteadyTime to) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::seconds>(to - from).count());
}

// "600", "2.5": seconds as a line says them.
std::string number_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

// How long an agent tries to reach a coordinator that never answered it: a wrong --url fails
// fast, as the Python client's first contact does.
constexpr std::chrono::milliseconds kFirstContact{9'500};  // (10 s in all)

// Why the agent gives up on a coordinator that never answered it, or nothing while it may still
// answer: no answer by the first contact's deadline (kFirstContact, or --rdzv-timeout when
// shorter: `out_of_time`), or an answer that is not a traincoord coordinator's.
std::optional<std::string> first_contact_failure(const client::ClientError& e,
                                                 const std::string& url, bool out_of_time,
                                                 long tried_s) {
  if (e.code == client::codes::kBadReply || e.code.starts_with("http_")) {
    return "the server at " + url + " does not answer as a traincoord coordinator (" + e.message +
           "); check --url";
  }
  if (e.code != client::codes::kUnreachable || !out_of_time) return std::nullopt;
  return "cannot reach a coordinator at " + url + " (tried for " + std::to_string(tried_s) +
         " s: " + e.message +
         "); check --url, and that a coordinator serves it there (traincoord serve --config "
         "RUN.toml --listen 0.0.0.0:8470)";
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

// The state of `launch --config` in `dir` (./RUN.traincoord by default, as `serve` with one
// run), restored into `engine`: a launch of the same config after a crash or a Ctrl-C resumes
// the run, and its checkpoints' cuts. Fails with a message naming the data dir.
tl::expected<std::unique_ptr<Store>, std::string> open_state(const std::string& dir, Engine& engine,
                                                             ServerClock& clock) {
  StoreOptions so;
  so.dir = dir;
  auto opened = Store::open(so);
  if (!opened) return tl::unexpected(opened.error().message);
  std::unique_ptr<Store> store = std::move(*opened);
  for (const std::string& notice : store->take_notices()) {
    std::cerr << "traincoord: " << notice << "\n";
  }
  Api replay(engine, clock, ApiLimits::none());  // what was accepted, whatever the limits now
  auto report = restore_engine(*store, engine, replay, clock);
  if (!report) return tl::unexpected(store->path() + ": " + report.error().message);
  std::cerr << "traincoord launch: state in " << dir
            << (report->runs > 0 ? " (the run resumes from it" : " (launch again to resume")
            << "; --in-memory keeps none)\n";
  return store;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "node";
  return name;
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
  const bool remote = !args.url.empty();
  if (!remote && max_nodes > 1) {
    return fail("--nnodes " + args.nnodes +
                " needs --url: the agents of several nodes meet at a "
                "coordinator they all reach (traincoord serve)");
  }
  if (remote && args.run.empty()) return fail("--url needs --run: the run to train");
  // (the coordinator's bounds, core/rendezvous.h: said here before anything starts)
  if (!(args.node_timeout_s >= 1 && args.node_timeout_s <= 600)) {
    return fail("--node-timeout must be between 1 and 600 seconds, got " +
                std::to_string(args.node_timeout_s));
  }
  if (!(args.settle_s >= 0 && args.settle_s <= 600)) {
    return fail("--settle must be between 0 and 600 seconds, got " + std::to_string(args.settle_s));
  }
  if (args.rdzv_timeout_s < 1) {
    return fail("--rdzv-timeout must be at least 1 second, got " +
                std::to_string(args.rdzv_timeout_s));
  }
  if (!remote && args.config.empty()) {
    return fail(
        "give --config RUN.toml (a coordinator in this process), or --url and --run (a "
        "coordinator running elsewhere)");
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);

  // A coordinator in this process (one node), or the one at --url.
  ServerClock clock;
  Engine engine(clock);
  std::unique_ptr<Store> store;
  std::optional<Auth> auth;
  std::optional<HttpServer> server;
  std::string url = args.url, run_name = args.run, token_file, token, data_dir;
  if (!remote) {
    std::ifstream in(args.config, std::ios::binary);
    if (!in) return fail("cannot read run config " + args.config);
    std::ostringstream text;
    text << in.rdbuf();
    auto config = parse_run_config(text.str(), args.config);
    if (!config) return fail(config.error().message);
    run_name = config->name;
    if (args.in_memory && !args.data_dir.empty()) {
      return fail("--in-memory and --data-dir exclude each other");
    }
    if (!args.in_memory) {
      data_dir = !args.data_dir.empty() ? args.data_dir : run_name + ".traincoord";
      auto opened = open_state(data_dir, engine, clock);
      if (!opened) return fail(opened.error());
      store = std::move(*opened);
    } else {
      clock.go_live(0);
      std::cerr << "traincoord launch: state in memory (--in-memory): the run starts afresh, and "
                   "a checkpoint of an earlier launch cannot be restored here (its cut is not "
                   "kept)\n";
    }
    if (auto existing = engine.find(run_name)) {
      // A data dir that holds the run already: the same config resumes it, a changed one is
      // refused (or applied when asked and allowed), as `serve` does.
      const ConfigFile file{args.config, text.str(), *config};
      if (const int code =
              reconcile(file, **existing, engine, store.get(), clock, args.apply_config_changes);
          code != 0) {
        return code;
      }
      if ((*existing)->finished()) {
        std::cerr << "traincoord launch: run " << run_name << " already ended ("
                  << run_state_name((*existing)->state()) << ", state in " << data_dir
                  << "): nothing left to train; to train it again, remove " << data_dir
                  << " or give --in-memory\n";
      }
    } else {
      auto run = engine.create_run(*config);
      if (!run) return fail(run.error().message);
      if (store) {
        store->add_run(run_name, "toml", text.str(), clock.now());
        if (auto r = store->commit(engine); !r) return fail(r.error().message);
      }
    }
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    ServerOptions options;
    if (args.auth) {
      auto opened = Auth::open(data_dir.empty() ? "traincoord-tokens" : data_dir);
      if (!opened) return fail(opened.error().message);
      auth = std::move(*opened);
      if (auto t = auth->worker_token(run_name); !t) return fail(t.error().message);
      token_file = auth->worker_token_path(run_name);
      token = auth->admin_token();
      for (const std::string& notice : auth->take_notices()) {
        std::cerr << "traincoord launch: " << notice << "\n";
      }
      options.auth = &*auth;
    }
    // The default port of `serve` when it is free, so that `traincoord status` and `runs` find
    // this coordinator without --url; else any free loopback port.
    Result<uint16_t> port = tl::unexpected(Error{ErrorCode::kInvalidArgument, "", "", {}});
    for (const std::string& listen : {args.listen, std::string("127.0.0.1:0")}) {
      const size_t colon = listen.rfind(':');
      options.host = listen.substr(0, colon);
      options.port = static_cast<uint16_t>(std::stoi(listen.substr(colon + 1)));
      server.emplace(engine, clock, store.get(), options);
      port = server->start();
      if (port) break;
      server.reset();
    }
    if (!port) return fail(port.error().message);
    url = "http://127.0.0.1:" + std::to_string(*port);
    std::cerr << "traincoord launch: coordinator on " << url << ", run " << run_name << ", "
              << args.workers << " workers";
    if (*port != 8470) std::cerr << " (traincoord status --url " << url << " " << run_name << ")";
    std::cerr << "\n";
  } else {
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    token = client::token_from_environment();
    if (const char* file = std::getenv("TRAINCOORD_TOKEN_FILE")) token_file = file;
  }

  // ---- the agent of this node ----
  const std::string node = !args.node.empty() ? args.node : remote ? host_name() : "node0";
  const std::string rdzv = "/v1/runs/" + run_name + "/nodes/";
  const std::string secret = draw_secret();
  const SteadyTime started = std::chrono::steady_clock::now();
  const SteadyTime first_contact_by =
      started +
      std::min<std::chrono::milliseconds>(kFirstContact, std::chrono::seconds(args.rdzv_timeout_s));
  bool reached = false;  // whether a coordinator answered this agent once
  // The time left for the first contact (before a first answer: a wrong --url is said by then).
  auto first_contact_left = [&] {
    return std::max<std::chrono::milliseconds>(
        std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                          first_contact_by - std::chrono::steady_clock::now()));
  };
  auto request = [&](const std::string& action, const std::string& body) {
    const auto timeout = reached ? std::chrono::milliseconds(10'000)
                                 : std::clamp<std::chrono::milliseconds>(
                                       first_contact_left(), std::chrono::milliseconds(100),
                                       std::chrono::milliseconds(3'000));
    auto reply = client::post(url, rdzv + action, body, timeout, token);
    if (reply || (reply.error().http_status != 0 && !reply.error().code.starts_with("http_"))) {
      reached = true;
    }
    return reply;
  };
  auto join = [&] {
    JsonWriter j;
    j.begin_object();
    j.field("node", node).field("secret", secret).field("addr", args.node_addr);
    j.field("nproc", static_cast<uint64_t>(args.workers));
    j.field("master_port", static_cast<uint64_t>(free_port()));
    j.field("min_nodes", static_cast<uint64_t>(min_nodes));
    j.field("max_nodes", static_cast<uint64_t>(max_nodes));
    j.field("settle_ms", static_cast<uint64_t>(args.settle_s * 1000));
    j.field("node_timeout_ms", static_cast<uint64_t>(args.node_timeout_s * 1000));
    j.end_object();
    return standing_of(request("join", j.str()));
  };
  auto node_body = [&](std::optional<uint64_t> round = std::nullopt, std::string why = "") {
    JsonWriter j;
    j.begin_object().field("node", node).field("secret", secret);
    if (round) j.field("round", *round).field("why", why);
    j.end_object();
    return j.str();
  };

  struct Worker {
    pid_t pid = -1;
    int exit_code = -1;
  };
  std::vector<Worker> workers(static_cast<size_t>(args.workers));
  std::vector<std::thread> pumps;
  int restarts = 0;  // this agent's group restarts (TORCHELASTIC_RESTART_COUNT)
  Standing at;       // the round the ranks run in
  auto env_of = [&](int local) {
    const int rank = static_cast<int>(at.rank_offset) + local;
    return std::vector<std::string>{
        "TRAINCOORD_URL=" + url,
        "TRAINCOORD_RUN=" + run_name,
        "TRAINCOORD_WORKER=rank" + std::to_string(rank),
        "TRAINCOORD_GROUP=" + at.group,
        "RANK=" + std::to_string(rank),
        "LOCAL_RANK=" + std::to_string(local),
        "WORLD_SIZE=" + std::to_string(at.world_size),
        "LOCAL_WORLD_SIZE=" + std::to_string(args.workers),
        "GROUP_RANK=" + std::to_string(at.node_rank),
        "GROUP_WORLD_SIZE=" + std::to_string(at.nnodes),
        "ROLE_RANK=" + std::to_string(rank),
        "ROLE_WORLD_SIZE=" + std::to_string(at.world_size),
        "ROLE_NAME=default",
        "MASTER_ADDR=" + at.master_addr,
        "MASTER_PORT=" + std::to_string(at.master_port),
        "TORCHELASTIC_RUN_ID=" + run_name,
        "TORCHELASTIC_RESTART_COUNT=" + std::to_string(restarts),
        "TORCHELASTIC_MAX_RESTARTS=" + std::to_string(args.max_restarts),
        "TRAINCOORD_TOKEN_FILE=" + token_file};
  };
  auto start_group = [&] {
    for (int r = 0; r < args.workers; ++r) {
      workers[r].exit_code = -1;
      if (!args.prefix_output) {
        workers[r].pid = spawn(*command, env_of(r));
        continue;
      }
      int out[2], err[2];
      if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        workers[r].pid = spawn(*command, env_of(r));  // (no pipes: unprefixed output)
        continue;
      }
      const int ends[2] = {out[1], err[1]};
      workers[r].pid = spawn(*command, env_of(r), ends);
      close(out[1]);
      close(err[1]);
      const std::string prefix = "[rank" + std::to_string(at.rank_offset + r) + "]: ";
      pumps.emplace_back(pump, out[0], prefix, stdout);
      pumps.emplace_back(pump, err[0], prefix, stderr);
    }
  };
  // Reaps a worker that exited; returns its local rank, or -1.
  auto reap = [&](pid_t pid, int status) {
    for (size_t r = 0; r < workers.size(); ++r) {
      if (workers[r].pid != pid) continue;
      workers[r].pid = -1;
      workers[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return static_cast<int>(r);
    }
    return -1;
  };
  auto running = [&] {
    int n = 0;
    for (const Worker& w : workers) n += w.pid > 0;
    return n;
  };
  // Stops every worker still running: SIGTERM, then SIGKILL after the grace period.
  auto stop_group = [&] {
    for (Worker& w : workers) {
      if (w.pid > 0) kill(w.pid, SIGTERM);
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(args.grace_s * 1000));
    bool killed = false;
    while (running() > 0) {
      int status = 0;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) reap(pid, status);
      if (running() == 0) break;
      if (!killed && std::chrono::steady_clock::now() >= deadline) {
        for (Worker& w : workers) {
          if (w.pid > 0) kill(w.pid, SIGKILL);
        }
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  auto say = [&](const std::string& line) {
    std::lock_guard lock(output_mutex);
    std::cerr << line << std::flush;
  };

  bool interrupted = false;
  bool gave_up = false;  // no restart left, or the coordinator is gone
  std::string gave_up_why;
  size_t epochs_shown = 0;  // closed epochs announced (in opening order)
  auto last_print = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  std::string last_progress;  // the progress line printed last, and when
  auto last_progress_at = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  auto last_poll = std::chrono::steady_clock::now();
  const bool tty = isatty(STDERR_FILENO);
  // Prints a line for each epoch closed since the last call, then the progress line.
  auto report_progress = [&](bool final) {
    auto body = client::get(url, "/v1/runs/" + run_name, std::chrono::seconds(2), token);
    if (!body) return;
    rapidjson::Document d;
    d.Parse<rapidjson::kParseIterativeFlag>(body->c_str());  // any depth, no recursion
    std::string lines;
    if (!d.HasParseError() && d.IsObject() && d.HasMember("epochs") && d["epochs"].IsArray()) {
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
      if (closed < epochs_shown) epochs_shown = closed;
      if (epochs_shown < from) {  // (more closed since the last report than the status lists)
        lines += "[" + run_name + "] " + std::to_string(from - epochs_shown) + " epochs closed\n";
        epochs_shown = from;
      }
      for (; epochs_shown < closed; ++epochs_shown) {
        lines += epoch_line(run_name, epochs[epochs_shown - from]) + "\n";
      }
    }
    std::string line = progress_line(*body);
    // Off a terminal, the progress line when it changed, every 5 s at most (the epoch lines at
    // once).
    if (!tty &&
        (line == last_progress || (!final && std::chrono::steady_clock::now() - last_progress_at <
                                                 std::chrono::seconds(5)))) {
      line.clear();
    }
    if (!line.empty()) {
      last_progress = line;
      last_progress_at = std::chrono::steady_clock::now();
    }
    std::lock_guard lock(output_mutex);
    if (tty) {
      std::cerr << "\r\x1b[K" << lines << (line.empty() ? last_progress : line) << std::flush;
    } else {
      std::cerr << lines << (line.empty() ? "" : line + "\n");
    }
  };
  // Waits, a little at a time, for SIGINT or SIGTERM; passes them on to the workers.
  auto wait_a_little = [&](long ms) {
    timespec wait{ms / 1000, (ms % 1000) * 1'000'000};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM) {
      interrupted = true;
      say(std::string("\ntraincoord launch: ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
          ", passing it to the workers\n");
      for (Worker& w : workers) {
        if (w.pid > 0) kill(w.pid, sig);
      }
    }
  };
  const long poll_ms =
      std::clamp<long>(static_cast<long>(args.node_timeout_s * 1000 / 5), 100, 2000);

  // Trouble on the way to a round: the coordinator unreachable (restarting, a network blip), a
  // refusal that may pass (this node's name still held by its lost agent; the rendezvous full),
  // or `restart` answered to a join. Each retry waits longer (100 ms doubling to 2 s: a few
  // requests a second at most, whatever the coordinator answers); after --rdzv-timeout seconds
  // of it the agent gives up, saying what it waited for.
  // The same clock runs while the ranks train and the coordinator does not answer their agent's
  // heartbeat: --rdzv-timeout holds at every stage. A line says what the agent waits for, every
  // 10 s at most.
  std::optional<SteadyTime> trouble_since;
  Pace trouble_said(std::chrono::seconds(10));
  long backoff_ms = 0;
  auto in_trouble = [&](const std::string& waited_for) {  // true: give up
    const auto now = std::chrono::steady_clock::now();
    if (!trouble_since) trouble_since = now;
    const long waited = seconds_between(*trouble_since, now);
    if (waited >= args.rdzv_timeout_s) {
      gave_up = true;
      gave_up_why = "gave up after --rdzv-timeout " + std::to_string(args.rdzv_timeout_s) +
                    " s waiting for " + waited_for;
      return true;
    }
    if (waited >= 2 && trouble_said.due(now)) {
      say("traincoord launch: waiting for " + waited_for + " (" + std::to_string(waited) +
          " s so far; giving up after --rdzv-timeout " + std::to_string(args.rdzv_timeout_s) +
          " s)\n");
    }
    backoff_ms = backoff_ms == 0 ? 100 : std::min<long>(backoff_ms * 2, 2000);
    wait_a_little(
        reached ? backoff_ms
                : std::min<long>(backoff_ms, static_cast<long>(first_contact_left().count())));
    return false;
  };

  std::optional<SteadyTime> waiting_since;  // not in a running round since
  Pace waiting_said(std::chrono::seconds(5));
  // The heartbeat of a running round unanswered: the ranks go on until --rdzv-timeout, then
  // stop. Returns true: give up.
  auto heartbeat_unanswered = [&](const client::ClientError& e, SteadyTime now) {
    if (!trouble_since) trouble_since = now;
    const long waited = seconds_between(*trouble_since, now);
    if (waited >= args.rdzv_timeout_s) {
      gave_up = true;
      gave_up_why = "gave up after --rdzv-timeout " + std::to_string(args.rdzv_timeout_s) +
                    " s: the coordinator at " + url + " did not answer node " + node +
                    "'s heartbeat (" + e.message + "); its ranks were stopped";
      return true;
    }
    if (trouble_said.due(now)) {
      say("traincoord launch: the coordinator at " + url + " does not answer (" + e.message +
          "); the ranks go on; " + std::to_string(waited) + " s so far, giving up after " +
          "--rdzv-timeout " + std::to_string(args.rdzv_timeout_s) + " s\n");
    }
    return false;
  };

  // Join, wait for the round to form, run the ranks; on a failure, stop them and join again.
  tl::expected<Standing, client::ClientError> standing = join();
  for (;;) {
    if (interrupted) break;
    if (!standing) {
      const client::ClientError& e = standing.error();
      if (!reached) {
        const auto now = std::chrono::steady_clock::now();
        if (auto why = first_contact_failure(e, url, now >= first_contact_by,
                                             seconds_between(started, now))) {
          gave_up = true;
          gave_up_why = *why;
          break;
        }
      }
      // (not_leader: several coordinators, and none leads the run yet: an election)
      const bool transient =
          e.code == client::codes::kUnreachable || e.code == client::codes::kNotLeader ||
          e.http_status == 503 || e.code == "not_found" ||
          e.code == client::codes::kNodeSecretMismatch || e.code == client::codes::kRendezvousFull;
      if (!transient) {
        gave_up = true;
        gave_up_why = "the rendezvous at " + url + " refused node " + node + ": " + e.message;
        break;
      }
      if (in_trouble("the rendezvous at " + url + " to take node " + node + ": " + e.message)) {
        break;
      }
      standing = join();
      continue;
    }
    if (standing->state == "restart") {
      // (once after a round ended before this node polled; every time: a coordinator astray)
      const std::string why = standing->why.empty() ? "" : " (" + standing->why + ")";
      if (in_trouble("a round: the coordinator at " + url +
                     " answered `restart` to every join of node " + node + why)) {
        break;
      }
      standing = join();
      continue;
    }
    trouble_since.reset();
    trouble_said.reset();
    backoff_ms = 0;
    if (standing->state != "running") {
      if (standing->run_state != "running" && !standing->run_state.empty()) {
        // The run ended while this node waited for a group: nothing left to train.
        (void)request("leave", node_body());
        break;
      }
      // Not in a running round: a line every 5 s says for whom it waits; --join-timeout ends it.
      const auto now = std::chrono::steady_clock::now();
      if (!waiting_since) waiting_since = now;
      if (seconds_between(*waiting_since, now) >= args.join_timeout_s) {
        gave_up = true;
        gave_up_why = "gave up after --join-timeout " + number_text(args.join_timeout_s) + " s " +
                      waiting_line(url, run_name, node, token) +
                      "; start the other nodes' agents (the same --url, --run and --nnodes), or "
                      "lower --nnodes";
        (void)request("leave", node_body());
        break;
      }
      if (waiting_said.due(now)) {
        say("traincoord launch: " + waiting_line(url, run_name, node, token) + "\n");
      }
      wait_a_little(std::min<long>(poll_ms, 200));  // (a round forming: answer it soon)
      standing = standing_of(request("poll", node_body()));
      continue;
    }
    at = *standing;
    waiting_since.reset();
    waiting_said.reset();
    say("traincoord launch: node " + node + " is node rank " + std::to_string(at.node_rank) +
        " of " + std::to_string(at.nnodes) + " (round " + std::to_string(at.round) +
        ", world size " + std::to_string(at.world_size) + ", master " + at.master_addr + ":" +
        std::to_string(at.master_port) + ")\n");
    start_group();
    std::optional<std::string> failure;  // why this node's group stops
    bool round_ended = false, coordinator_gone = false;
    while (running() > 0 && !failure && !round_ended && !coordinator_gone && !interrupted) {
      wait_a_little(200);
      int status = 0;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        const int r = reap(pid, status);
        if (r >= 0 && workers[r].exit_code != 0 && !interrupted && !failure) {
          failure = "worker rank" + std::to_string(at.rank_offset + r) + " exited with " +
                    std::to_string(workers[r].exit_code);
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (!failure && now - last_poll >= std::chrono::milliseconds(poll_ms)) {
        last_poll = now;
        auto polled = standing_of(request("poll", node_body()));
        if (polled || polled.error().http_status != 0) {
          trouble_since.reset();
          trouble_said.reset();
        } else {
          coordinator_gone = heartbeat_unanswered(polled.error(), now);
        }
        if (polled && polled->state != "running") {
          round_ended = true;
          standing = polled;
          say("\ntraincoord launch: the group stops: " +
              (polled->why.empty() ? std::string("the round ended") : polled->why) + "\n");
        } else if (!polled && (polled.error().code == "not_found" ||
                               polled.error().code == client::codes::kNodeSecretMismatch)) {
          round_ended = true;  // this node was taken for lost (its name taken since): join again
          standing = polled;
        }
      }
      if (now - last_print >= std::chrono::milliseconds(tty ? 500 : 1000)) {
        last_print = now;
        report_progress(false);
      }
    }
    if (interrupted) {
      stop_group();  // (SIGTERM again, then SIGKILL after the grace period)
      (void)request("leave", node_body());
      break;
    }
    if (coordinator_gone) {
      stop_group();
      break;
    }
    if (!failure && !round_ended) {  // every rank of this node exited 0
      (void)request("leave", node_body());
      break;
    }
    // A DDP process group does not take a restarted rank back: the whole group stops, on every
    // node, and starts again with the nodes still there (as torchrun's agents do); its ranks
    // restore their last checkpoint, and the data its cut (docs/LAUNCH.md).
    if (failure) {
      say("\ntraincoord launch: " + *failure + "\n");
      standing = standing_of(request("fail", node_body(at.round, *failure)));
    }
    stop_group();
    if (restarts >= args.max_restarts) {
      gave_up = true;
      gave_up_why = (failure ? *failure : std::string("the group stopped")) +
                    "; no restart left (--max-restarts " + std::to_string(args.max_restarts) + ")";
      (void)request("leave", node_body());
      break;
    }
    restarts += 1;
    say("traincoord launch: restarting the group (" + std::to_string(restarts) + " of " +
        std::to_string(args.max_restarts) + ")\n");
    standing = join();
  }
  report_progress(true);  // the epochs that closed since the last report
  if (tty) std::cerr << "\n";
  for (std::thread& t : pumps) t.join();  // (every worker exited: their pipes are closed)
  if (gave_up) std::cerr << "traincoord launch: " << gave_up_why << "\n";

  std::string state = "unknown", reason;
  if (auto body = client::get(url, "/v1/runs/" + run_name, std::chrono::seconds(2), token)) {
    rapidjson::Document d;
    d.Parse<rapidjson::kParseIterativeFlag>(body->c_str());  // any depth, no recursion
    if (!d.HasParseError() && d.IsObject() && d.HasMember("state") && d["state"].IsString()) {
      state = d["state"].GetString();
      reason = d.HasMember("reason") && d["reason"].IsString() ? d["reason"].GetString() : "";
      std::cerr << "traincoord launch: run " << run_name << " " << state
                << (reason.empty() ? "" : ": " + reason);
      if (d.HasMember("early_stop") && d["early_stop"].IsObject() &&
          d["early_stop"].HasMember("best_epoch") && d["early_stop"]["best_epoch"].IsInt64() &&
          reason.find("best epoch") == std::string::npos) {
        std::cerr << "; best epoch " << d["early_stop"]["best_epoch"].GetInt64();
      }
      std::cerr << "\n";
    }
  }
  if (server) server->stop();
  int failed = 0;
  for (size_t r = 0; r < workers.size(); ++r) {
    if (workers[r].exit_code > 0) {  // (-1: never started, the run ended before a group formed)
      ++failed;
      std::cerr << "traincoord launch: worker rank" << at.rank_offset + r << " exited with "
                << workers[r].exit_code << "\n";
    }
  }
  if (interrupted) return exit_code::kInterrupted;
  if (failed > 0 || gave_up) return exit_code::kFailed;
  if (state == "completed" || state == "early_stopped") return exit_code::kOk;
  if (state == "running") {
    std::cerr << "traincoord launch: every worker exited, but the run is not finished\n";
  }
  return exit_code::kRunUnfinished;
}

}  // namespace traincoord::cli
