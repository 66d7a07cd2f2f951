#include "cli/host.h"

#include <algorithm>
#include <cassert>
#include <csignal>
#include <iostream>

#include <sys/resource.h>

#include "config/config_diff.h"
#include "config/config_file.h"
#include "core/run_codec.h"

namespace traincoord::cli {

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

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

tl::expected<StateChoice, std::string> choose_state(const std::string& journal, bool in_memory,
                                                    const std::string& data_dir,
                                                    const std::vector<std::string>& run_names) {
  if (!journal.empty()) {
    if (in_memory || !data_dir.empty()) {
      return tl::unexpected(std::string(in_memory ? "--in-memory" : "--data-dir") +
                            " and --journal exclude each other (the state is in etcd)");
    }
    return StateChoice{StateChoice::Kind::kEtcd, journal};
  }
  if (in_memory) return StateChoice{StateChoice::Kind::kMemory, ""};
  return StateChoice{StateChoice::Kind::kDataDir, !data_dir.empty() ? data_dir
                                                  : run_names.size() == 1
                                                      ? run_names[0] + ".traincoord"
                                                      : "traincoord-data"};
}

tl::expected<RestoreReport, std::string> open_data_dir(const StoreOptions& options, Engine& engine,
                                                       ServerClock& clock,
                                                       std::unique_ptr<Store>* store) {
  auto opened = Store::open(options);
  if (!opened) return tl::unexpected(opened.error().message);
  *store = std::move(*opened);
  for (const std::string& notice : (*store)->take_notices()) {
    std::cerr << "traincoord: " << notice << "\n";
  }
  Api replay(engine, clock, ApiLimits::none());  // what was accepted, whatever the limits now
  auto report = restore_engine(**store, engine, replay, clock);
  if (!report) return tl::unexpected((*store)->path() + ": " + report.error().message);
  return *report;
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

ConfigChange check_config_change(const ConfigFile& file, const Run& run, bool apply) {
  return traincoord::check_config_change(file.config, run,
                                         "run " + file.config.name + " (" + file.path + ")", apply);
}

// A config file for a run the store already holds: the same config resumes it; a changed one
// is refused, or applied when asked and allowed.
int reconcile(const ConfigFile& file, Run& run, Engine& engine, Store* store, ServerClock& clock,
              bool apply) {
  auto fail = [](const std::string& message) {
    std::cerr << "traincoord: " << message << "\n";
    return exit_code::kUsage;
  };
  const ConfigChange check = check_config_change(file, run, apply);
  const std::vector<std::string>& changed = check.changed;
  if (changed.empty()) return 0;
  const std::string where = "run " + file.config.name + " (" + file.path + ")";
  if (!check.refused.empty()) return fail(check.refused);
  auto updated = apply_config_change(run, file.config,
                                     "changed by --apply-config-changes: " + join(changed), clock);
  if (!updated) return fail(where + ": " + updated.error().message);
  engine.adopt(std::move(*updated));
  if (store) {
    // (as add_runs stores it: with lengths read from files inline, so that no later start
    // needs the files)
    if (auto r = store->replace_config(**engine.find(file.config.name), kStoredToml,
                                       durable_config_text(file.text, file.config), clock.now());
        !r) {
      return fail(r.error().message);
    }
  }
  std::cout << "traincoord: applied the changed " << join(changed) << " to " << where << "\n";
  return 0;
}

int add_runs(const std::vector<ConfigFile>& files, Engine& engine, Store* store, ServerClock& clock,
             bool apply, const std::function<int(const std::string&)>& fail) {
  for (const ConfigFile& file : files) {
    if (auto existing = engine.find(file.config.name)) {
      if (const int rc = reconcile(file, **existing, engine, store, clock, apply); rc != 0) {
        return rc;
      }
      continue;
    }
    auto run = engine.create_run(file.config);
    if (!run) return fail(file.path + ": " + run.error().message);
    // (The text kept has the lengths of a cost-balanced run appended: config_file.h.)
    if (store) {
      store->add_run(file.config.name, kStoredToml, durable_config_text(file.text, file.config),
                     clock.now());
    }
  }
  if (store) {
    if (auto r = store->commit(engine); !r) return fail(r.error().message);
  }
  return 0;
}

size_t prepare_limits(size_t max_connections, bool given) {
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) != 0) return max_connections;
  if (nofile.rlim_cur < nofile.rlim_max) {
    rlimit raised = nofile;
    raised.rlim_cur = nofile.rlim_max;
    bool raised_ok = setrlimit(RLIMIT_NOFILE, &raised) == 0;
    if (!raised_ok && nofile.rlim_max == RLIM_INFINITY) {
      raised.rlim_cur = rlim_t{1} << 20;  // (an unlimited hard limit: Linux's default nr_open)
      raised_ok = setrlimit(RLIMIT_NOFILE, &raised) == 0;
    }
    if (raised_ok) nofile = raised;
  }
  // The journal, the tokens, the event loops and the listening socket take a few of them.
  constexpr rlim_t kOwnDescriptors = 64;
  if (nofile.rlim_cur == RLIM_INFINITY || max_connections + kOwnDescriptors <= nofile.rlim_cur) {
    return max_connections;
  }
  const size_t room =
      nofile.rlim_cur > 2 * kOwnDescriptors ? nofile.rlim_cur - kOwnDescriptors : kOwnDescriptors;
  if (!given) return room;
  std::cerr << "traincoord: --max-connections " << max_connections
            << " exceeds what the file descriptor limit allows (" << nofile.rlim_cur
            << ", ulimit -n; the hard limit is " << nofile.rlim_max << "): past about " << room
            << " open connections, new ones wait until some close; raise the hard limit "
               "(ulimit -Hn, systemd's LimitNOFILE=) or lower --max-connections\n";
  return max_connections;
}

Result<uint16_t> start_server(std::optional<HttpServer>& server, Engine& engine, ServerClock& clock,
                              Journal* journal, ServerOptions options,
                              const std::vector<std::string>& listens) {
  Result<uint16_t> port =
      tl::unexpected(Error{ErrorCode::kInvalidArgument, "no address to listen on", "", {}});
  for (const std::string& listen : listens) {
    const bool parsed = split_listen(listen, &options.host, &options.port);
    assert(parsed && "start_server: a listen address that split_listen refuses");
    (void)parsed;
    server.emplace(engine, clock, journal, options);
    port = server->start();
    if (port) return port;
    server.reset();
  }
  return port;
}

}  // namespace traincoord::cli
