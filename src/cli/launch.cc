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
  if (p["eta_s"].IsNumber()) out << ", ETA " << static_cast<long>(p["eta_s"].GetDouble()) << " s";
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

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "node";
  return name;
}

}  // namespace

int launch(const LaunchArgs& args) {
  if (args.command.empty())
    return fail("give the worker command after --, e.g. -- python3 train.py");
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
  std::string url = args.url, run_name = args.run, token_file, token;
  if (!remote) {
    std::ifstream in(args.config, std::ios::binary);
    if (!in) return fail("cannot read run config " + args.config);
    std::ostringstream text;
    text << in.rdbuf();
    auto config = parse_run_config(text.str(), args.config);
    if (!config) return fail(config.error().message);
    run_name = config->name;
    if (!args.data_dir.empty()) {
      StoreOptions so;
      so.dir = args.data_dir;
      auto opened = Store::open(so);
      if (!opened) return fail(opened.error().message);
      store = std::move(*opened);
      for (const std::string& notice : store->take_notices()) {
        std::cerr << "traincoord: " << notice << "\n";
      }
      Api replay(engine, clock, ApiLimits::none());  // what was accepted, whatever the limits now
      auto report = restore_engine(*store, engine, replay, clock);
      if (!report) return fail(report.error().message);
    } else {
      clock.go_live(0);
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
      auto opened = Auth::open(args.data_dir.empty() ? "traincoord-tokens" : args.data_dir);
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
  auto request = [&](const std::string& action, const std::string& body) {
    return client::post(url, rdzv + action, body, std::chrono::seconds(10), token);
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
        workers[r].pid = spawn(args.command, env_of(r));
        continue;
      }
      int out[2], err[2];
      if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        workers[r].pid = spawn(args.command, env_of(r));  // (no pipes: unprefixed output)
        continue;
      }
      const int ends[2] = {out[1], err[1]};
      workers[r].pid = spawn(args.command, env_of(r), ends);
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
  auto last_poll = std::chrono::steady_clock::now();
  const bool tty = isatty(STDERR_FILENO);
  // Prints a line for each epoch closed since the last call, then the progress line.
  auto report_progress = [&] {
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
    const std::string line = progress_line(*body);
    std::lock_guard lock(output_mutex);
    if (tty) {
      std::cerr << "\r\x1b[K" << lines << line << std::flush;
    } else {
      std::cerr << lines << line << "\n";
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
  std::optional<std::chrono::steady_clock::time_point> trouble_since;
  long backoff_ms = 0;
  auto in_trouble = [&](const std::string& waited_for) {  // true: give up
    const auto now = std::chrono::steady_clock::now();
    if (!trouble_since) trouble_since = now;
    if (now - *trouble_since >= std::chrono::seconds(args.rdzv_timeout_s)) {
      gave_up = true;
      gave_up_why = "gave up after --rdzv-timeout " + std::to_string(args.rdzv_timeout_s) +
                    " s waiting for " + waited_for;
      return true;
    }
    backoff_ms = backoff_ms == 0 ? 100 : std::min<long>(backoff_ms * 2, 2000);
    wait_a_little(backoff_ms);
    return false;
  };

  // Join, wait for the round to form, run the ranks; on a failure, stop them and join again.
  tl::expected<Standing, client::ClientError> standing = join();
  for (;;) {
    if (interrupted) break;
    if (!standing) {
      const client::ClientError& e = standing.error();
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
    backoff_ms = 0;
    if (standing->state != "running") {
      if (standing->run_state != "running" && !standing->run_state.empty()) {
        // The run ended while this node waited for a group: nothing left to train.
        (void)request("leave", node_body());
        break;
      }
      wait_a_little(std::min<long>(poll_ms, 200));  // (a round forming: answer it soon)
      standing = standing_of(request("poll", node_body()));
      continue;
    }
    at = *standing;
    say("traincoord launch: node " + node + " is node rank " + std::to_string(at.node_rank) +
        " of " + std::to_string(at.nnodes) + " (round " + std::to_string(at.round) +
        ", world size " + std::to_string(at.world_size) + ", master " + at.master_addr + ":" +
        std::to_string(at.master_port) + ")\n");
    start_group();
    std::optional<std::string> failure;  // why this node's group stops
    bool round_ended = false;
    while (running() > 0 && !failure && !round_ended && !interrupted) {
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
      if (now - last_print >= std::chrono::milliseconds(tty ? 500 : 5000)) {
        last_print = now;
        report_progress();
      }
    }
    if (interrupted) {
      stop_group();  // (SIGTERM again, then SIGKILL after the grace period)
      (void)request("leave", node_body());
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
  report_progress();  // the epochs that closed since the last report
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
      std::cerr << "traincoord launch: run " << run_name << " " << state << ": " << reason;
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
