// `traincoord launch`: a coordinator in-process on a free loopback port, and N worker processes
// pointed at it; what torchrun's standalone mode is for torch, for us.
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
#include <optional>
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

pid_t spawn(const std::vector<std::string>& command, const std::vector<std::string>& env) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);  // the launcher blocked them; workers must not
  for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "traincoord launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
  _exit(127);
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
  if (!engine.find(run_name)) {
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
  options.port = 0;
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
  HttpServer server(engine, clock, store.get(), options);
  auto port = server.start();
  if (!port) return fail(port.error().message);
  const std::string url = "http://127.0.0.1:" + std::to_string(*port);
  const uint16_t master_port = free_port();
  std::cerr << "traincoord launch: coordinator on " << url << ", run " << run_name << ", "
            << args.workers << " workers\n";

  struct Worker {
    pid_t pid = -1;
    int restarts = 0;
    int exit_code = -1;
  };
  std::vector<Worker> workers(static_cast<size_t>(args.workers));
  auto env_of = [&](int rank) {
    return std::vector<std::string>{"TRAINCOORD_URL=" + url,
                                    "TRAINCOORD_RUN=" + run_name,
                                    "TRAINCOORD_WORKER=rank" + std::to_string(rank),
                                    "RANK=" + std::to_string(rank),
                                    "LOCAL_RANK=" + std::to_string(rank),
                                    "WORLD_SIZE=" + std::to_string(args.workers),
                                    "LOCAL_WORLD_SIZE=" + std::to_string(args.workers),
                                    "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(master_port),
                                    "TRAINCOORD_TOKEN_FILE=" + token_file};
  };
  for (int r = 0; r < args.workers; ++r) workers[r].pid = spawn(args.command, env_of(r));

  int running = args.workers;
  bool interrupted = false;
  auto last_print = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  const bool tty = isatty(STDERR_FILENO);
  while (running > 0) {
    timespec wait{0, 200'000'000};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM) {
      interrupted = true;
      std::cerr << "\ntraincoord launch: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                << ", passing it to the workers\n";
      for (Worker& w : workers) {
        if (w.pid > 0) kill(w.pid, sig);
      }
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (size_t r = 0; r < workers.size(); ++r) {
        Worker& w = workers[r];
        if (w.pid != pid) continue;
        w.pid = -1;
        w.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (w.exit_code != 0 && !interrupted && w.restarts < args.max_restarts) {
          ++w.restarts;
          std::cerr << "\ntraincoord launch: worker rank" << r << " exited with " << w.exit_code
                    << "; restarting it (" << w.restarts << " of " << args.max_restarts << ")\n";
          w.pid = spawn(args.command, env_of(static_cast<int>(r)));
        } else {
          --running;
        }
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_print >= std::chrono::milliseconds(tty ? 500 : 5000)) {
      last_print = now;
      if (auto body = client::get(url, "/v1/runs/" + run_name, std::chrono::seconds(2),
                                  auth ? auth->admin_token() : "")) {
        const std::string line = progress_line(*body);
        if (tty) {
          std::cerr << "\r\x1b[K" << line << std::flush;
        } else {
          std::cerr << line << "\n";
        }
      }
    }
  }
  if (tty) std::cerr << "\n";

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
  server.stop();
  int failed = 0;
  for (size_t r = 0; r < workers.size(); ++r) {
    if (workers[r].exit_code != 0) {
      ++failed;
      std::cerr << "traincoord launch: worker rank" << r << " exited with " << workers[r].exit_code
                << "\n";
    }
  }
  if (interrupted) return exit_code::kInterrupted;
  if (failed > 0) return exit_code::kFailed;
  if (state == "completed" || state == "early_stopped") return exit_code::kOk;
  if (state == "running") {
    std::cerr << "traincoord launch: every worker exited, but the run is not finished\n";
  }
  return exit_code::kRunUnfinished;
}

}  // namespace traincoord::cli
