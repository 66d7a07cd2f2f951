#include <csignal>
#include <filesystem>
#include <iostream>

#include <pthread.h>

#include "cli/commands.h"
#include "config/config_file.h"
#include "core/engine.h"
#include "server/http_server.h"
#include "server/steady_clock.h"

namespace traincoord::cli {

namespace {

bool split_listen(const std::string& listen, std::string* host, uint16_t* port) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) return false;
  *host = listen.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  try {
    const int p = std::stoi(listen.substr(colon + 1));
    if (p < 0 || p > 65535) return false;
    *port = static_cast<uint16_t>(p);
  } catch (...) {
    return false;
  }
  return !host->empty();
}

}  // namespace

int serve(const ServeArgs& args) {
  std::vector<std::string> paths = args.configs;
  if (!args.runs_dir.empty()) {
    std::error_code ec;
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(args.runs_dir, ec)) {
      if (entry.path().extension() == ".toml") found.push_back(entry.path().string());
    }
    if (ec) {
      std::cerr << "traincoord: cannot read --runs " << args.runs_dir << ": " << ec.message()
                << "\n";
      return 2;
    }
    std::sort(found.begin(), found.end());
    paths.insert(paths.end(), found.begin(), found.end());
  }

  SteadyClock clock;
  Engine engine(clock);
  for (const std::string& path : paths) {
    auto config = load_run_config(path);
    if (!config) {
      std::cerr << "traincoord: " << config.error().message << "\n";
      return 2;
    }
    auto run = engine.create_run(std::move(*config));
    if (!run) {
      std::cerr << "traincoord: " << path << ": " << run.error().message << "\n";
      return 2;
    }
  }

  ServerOptions options;
  if (!split_listen(args.listen, &options.host, &options.port)) {
    std::cerr << "traincoord: --listen must be HOST:PORT, e.g. 127.0.0.1:8470 (got " << args.listen
              << ")\n";
    return 2;
  }
  options.io_threads = args.io_threads;

  // SIGINT and SIGTERM are taken by this thread alone (sigwait), so block them before any
  // other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Said before start(): from then on only the server's engine thread touches the engine.
  for (const Run* run : engine.runs()) {
    std::cout << "traincoord: serving run " << run->config().name << " ("
              << run->plan().train_jobs_per_epoch << " train jobs per epoch, epochs "
              << run->plan().start_epoch << ".." << run->plan().target_epoch << ")\n";
  }
  if (engine.runs().empty()) {
    std::cout << "traincoord: no runs yet; create one with POST /v1/runs (docs/API.md)\n";
  }

  HttpServer server(engine, clock, options);
  auto port = server.start();
  if (!port) {
    std::cerr << "traincoord: " << port.error().message << "\n";
    return 1;
  }
  const std::string host =
      options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host;
  std::cout << "traincoord: listening on http://" << host << ":" << *port << std::endl;

  int sig = 0;
  sigwait(&signals, &sig);
  std::cout << "traincoord: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", stopping\n";
  std::cout.flush();
  server.stop();
  return 0;
}

}  // namespace traincoord::cli
