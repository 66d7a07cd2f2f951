// `traincoord launch`: a coordinator in-process on a free loopback port, and N worker processes
// pointed at it; what torchrun's standalone mode is for torch, for us.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

// A run id for this launch: the prefix of its groups' names (TRAINCOORD_GROUP) and
// TORCHELASTIC_RUN_ID, as torchrun's --rdzv-id.
std::string launch_id() {
  std::random_device random;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", random(), random());
  return id;
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
  d.Parse(status_json.c_str());
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

int launch(const LaunchArgs& args) {
  if (args.command.empty())
    return fail("give the worker command after --, e.g. -- python3 train.py");
  std::ifstream in(args.config, std::ios::binary);
  if (!in) return fail("cannot read run config " + args.config);
  std::ostringstream text;
  text << in.rdbuf();
  auto config = parse_run_config(text.str(), args.config);
  if (!config) return fail(config.error().message);
  const std::string run_name = config->name;

  ServerClock clock;
  Engine engine(clock);
  std::unique_ptr<Store> store;
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

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  ServerOptions options;
  std::optional<Auth> auth;
  std::string token_file;
  if (args.auth) {
    auto opened = Auth::open(args.data_dir.empty() ? "traincoord-tokens" : args.data_dir);
    if (!opened) return fail(opened.error().message);
    auth = std::move(*opened);
    if (auto t = auth->worker_token(run_name); !t) return fail(t.error().message);
    token_file = auth->worker_token_path(run_name);
    for (const std::string& notice : auth->take_notices()) {
      std::cerr << "traincoord launch: " << notice << "\n";
    }
    options.auth = &*auth;
  }
  // The default port of `serve` when it is free, so that `traincoord status` and `runs` find
  // this coordinator without --url; else any free loopback port.
  std::optional<HttpServer> server;
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
  const std::string url = "http://127.0.0.1:" + std::to_string(*port);
  const std::string id = launch_id();
  std::cerr << "traincoord launch: coordinator on " << url << ", run " << run_name << ", "
            << args.workers << " workers";
  if (*port != 8470) std::cerr << " (traincoord status --url " << url << " " << run_name << ")";
  std::cerr << "\n";

  struct Worker {
    pid_t pid = -1;
    int exit_code = -1;
  };
  std::vector<Worker> workers(static_cast<size_t>(args.workers));
  std::vector<std::thread> pumps;
  int restarts = 0;  // of the whole group
  uint16_t master_port = free_port();
  auto env_of = [&](int rank) {
    return std::vector<std::string>{
        "TRAINCOORD_URL=" + url,
        "TRAINCOORD_RUN=" + run_name,
        "TRAINCOORD_WORKER=rank" + std::to_string(rank),
        "TRAINCOORD_GROUP=" + id + "-" + std::to_string(restarts),
        "RANK=" + std::to_string(rank),
        "LOCAL_RANK=" + std::to_string(rank),
        "WORLD_SIZE=" + std::to_string(args.workers),
        "LOCAL_WORLD_SIZE=" + std::to_string(args.workers),
        "GROUP_RANK=0",
        "GROUP_WORLD_SIZE=1",
        "ROLE_RANK=" + std::to_string(rank),
        "ROLE_WORLD_SIZE=" + std::to_string(args.workers),
        "MASTER_ADDR=127.0.0.1",
        "MASTER_PORT=" + std::to_string(master_port),
        "TORCHELASTIC_RUN_ID=" + id,
        "TORCHELASTIC_RESTART_COUNT=" + std::to_string(restarts),
        "TORCHELASTIC_MAX_RESTARTS=" + std::to_string(args.max_restarts),
        "TRAINCOORD_TOKEN_FILE=" + token_file};
  };
  auto start_group = [&] {
    for (int r = 0; r < args.workers; ++r) {
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
      const std::string prefix = "[rank" + std::to_string(r) + "]: ";
      pumps.emplace_back(pump, out[0], prefix, stdout);
      pumps.emplace_back(pump, err[0], prefix, stderr);
    }
  };
  // Reaps a worker that exited; returns its rank, or -1.
  auto reap = [&](pid_t pid, int status) {
    for (size_t r = 0; r < workers.size(); ++r) {
      if (workers[r].pid != pid) continue;
      workers[r].pid = -1;
      workers[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return static_cast<int>(r);
    }
    return -1;
  };
  // Stops every worker still running: SIGTERM, then SIGKILL after the grace period.
  auto stop_group = [&] {
    for (Worker& w : workers) {
      if (w.pid > 0) kill(w.pid, SIGTERM);
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(args.grace_s * 1000));
    bool killed = false;
    for (;;) {
      int status = 0;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) reap(pid, status);
      bool any = false;
      for (const Worker& w : workers) any |= w.pid > 0;
      if (!any) return;
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
  start_group();

  bool interrupted = false;
  bool gave_up = false;     // a worker failed with no restart left
  size_t epochs_shown = 0;  // closed epochs announced (in opening order)
  auto last_print = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  const bool tty = isatty(STDERR_FILENO);
  auto running = [&] {
    int n = 0;
    for (const Worker& w : workers) n += w.pid > 0;
    return n;
  };
  // Prints a line for each epoch closed since the last call, then the progress line.
  auto report_progress = [&] {
    if (auto body = client::get(url, "/v1/runs/" + run_name, std::chrono::seconds(2),
                                auth ? auth->admin_token() : "")) {
      rapidjson::Document d;
      d.Parse(body->c_str());
      std::string lines;
      if (!d.HasParseError() && d.IsObject() && d.HasMember("epochs") && d["epochs"].IsArray()) {
        const auto& epochs = d["epochs"].GetArray();
        // A restore may take epochs back: announce them again when they close again.
        size_t closed = 0;
        while (closed < epochs.Size() && epochs[closed].IsObject() &&
               epochs[closed].HasMember("closed") && epochs[closed]["closed"].IsBool() &&
               epochs[closed]["closed"].GetBool()) {
          ++closed;
        }
        if (closed < epochs_shown) epochs_shown = closed;
        for (; epochs_shown < closed; ++epochs_shown) {
          lines += epoch_line(run_name, epochs[epochs_shown]) + "\n";
        }
      }
      const std::string line = progress_line(*body);
      std::lock_guard lock(output_mutex);
      if (tty) {
        std::cerr << "\r\x1b[K" << lines << line << std::flush;
      } else {
        std::cerr << lines << line << "\n";
      }
    }
  };
  while (running() > 0) {
    timespec wait{0, 200'000'000};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM) {
      interrupted = true;
      say(std::string("\ntraincoord launch: ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
          ", passing it to the workers\n");
      for (Worker& w : workers) {
        if (w.pid > 0) kill(w.pid, sig);
      }
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      const int r = reap(pid, status);
      if (r < 0 || workers[r].exit_code == 0 || interrupted || gave_up) continue;
      // A DDP process group does not take a restarted rank back: the whole group stops, and
      // starts again (as torchrun's agent does); its ranks restore their last checkpoint, and
      // the data its cut (docs/PYTHON.md, "Checkpoints").
      const int code = workers[r].exit_code;
      if (restarts >= args.max_restarts) {
        say("\ntraincoord launch: worker rank" + std::to_string(r) + " exited with " +
            std::to_string(code) + "; no restart left (--max-restarts " +
            std::to_string(args.max_restarts) + "): stopping the other workers\n");
        gave_up = true;
        stop_group();
        workers[r].exit_code = code;
        break;
      }
      say("\ntraincoord launch: worker rank" + std::to_string(r) + " exited with " +
          std::to_string(code) + "; restarting the group of " + std::to_string(args.workers) +
          " workers (" + std::to_string(restarts + 1) + " of " + std::to_string(args.max_restarts) +
          ")\n");
      stop_group();
      restarts += 1;
      master_port = free_port();
      for (Worker& w : workers) w.exit_code = -1;
      start_group();
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_print >= std::chrono::milliseconds(tty ? 500 : 5000)) {
      last_print = now;
      report_progress();
    }
  }
  report_progress();  // the epochs that closed since the last report
  if (tty) std::cerr << "\n";
  for (std::thread& t : pumps) t.join();  // (every worker exited: their pipes are closed)

  std::string state = "unknown", reason;
  if (auto body = client::get(url, "/v1/runs/" + run_name, std::chrono::seconds(2),
                              auth ? auth->admin_token() : "")) {
    rapidjson::Document d;
    d.Parse(body->c_str());
    state = d["state"].GetString();
    reason = d["reason"].GetString();
    std::cerr << "traincoord launch: run " << run_name << " " << state << ": " << reason;
    if (d["early_stop"]["best_epoch"].IsInt64() && reason.find("best epoch") == std::string::npos) {
      std::cerr << "; best epoch " << d["early_stop"]["best_epoch"].GetInt64();
    }
    std::cerr << "\n";
  }
  server->stop();
  int failed = 0;
  for (size_t r = 0; r < workers.size(); ++r) {
    if (workers[r].exit_code != 0) {
      ++failed;
      std::cerr << "traincoord launch: worker rank" << r << " exited with " << workers[r].exit_code
                << "\n";
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
