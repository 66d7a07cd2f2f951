#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "cli/commands.h"
#include "cli/host.h"
#include "config/config_diff.h"
#include "config/config_file.h"
#include "core/engine.h"
#include "core/run_codec.h"
#include "journal/etcd_balance.h"
#include "journal/etcd_options.h"
#include "journal/etcd_run_journal.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "server/http_server.h"
#include "server/leadership.h"
#include "server/restore.h"
#include "server/server_clock.h"
#include "store/store.h"

namespace traincoord::cli {

namespace {

int fail(const std::string& message) {
  std::cerr << "traincoord: " << message << "\n";
  return exit_code::kUsage;
}

}  // namespace

// High availability (docs/HA.md, "Leadership per run"): the runs' state in etcd, several
// coordinators, each run led by one of them (journal/etcd_run_journal.h). One server serves all
// the time: the runs this coordinator leads are in its engine; a request about a run it does
// not lead is answered 421 not_leader naming that run's leader. This thread keeps the one etcd
// lease alive, reads every run's leader and head every 200 ms, and campaigns for runs that have
// no leader while it leads fewer than its fair share; a run it wins is read from etcd and
// replayed apart (restore_engine, as a restart does; a changed config file applied there under
// --apply-config-changes), then handed to the engine thread, which adds it while serving the
// others. Above its fair share, it hands runs over one at a time (journal/etcd_balance.h). A
// refused write steps that run down alone (the commit thread); a lost lease steps them all down.
// SIGINT/SIGTERM: the writes accepted are finished, then the lease is revoked (the other
// coordinators take the runs over at once).
static int serve_ha(const ServeArgs& args, const std::vector<ConfigFile>& files,
                    ServerOptions options, sigset_t signals) {
  auto etcd_options = parse_etcd_url(args.journal);
  if (!etcd_options) return fail(etcd_options.error().message);
  if (!etcd_options->tls.enabled &&
      (!args.etcd_cacert.empty() || !args.etcd_cert.empty() || !args.etcd_key.empty())) {
    return fail(std::string(!args.etcd_cacert.empty() ? "--etcd-cacert"
                            : !args.etcd_cert.empty() ? "--etcd-cert"
                                                      : "--etcd-key") +
                " needs TLS to etcd: --journal etcds://... (etcd:// is plain HTTP)");
  }
  etcd_options->tls.ca_file = args.etcd_cacert;
  etcd_options->tls.cert_file = args.etcd_cert;
  etcd_options->tls.key_file = args.etcd_key;
  if (auto usable = etcd::check_tls_files(etcd_options->tls); !usable) {
    return fail(usable.error().message);
  }
  // Replay on takeover reads every record since the snapshot: keep it short by default.
  etcd_options->snapshot_every =
      args.snapshot_every == ServeArgs{}.snapshot_every ? 10'000 : args.snapshot_every;
  Leadership leadership(args.advertise_url);
  options.leadership = &leadership;
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::cout << "traincoord: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", stopping"
              << std::endl;
    leadership.request_stop();
  });
  struct JoinSignals {
    std::thread& t;
    ~JoinSignals() {
      pthread_kill(t.native_handle(), SIGTERM);  // (sigwait returns if still waiting)
      t.join();
    }
  } join_signals{signal_thread};

  const std::string scheme = options.tls.enabled() ? "https" : "http";
  const std::string host =
      options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host;
  EtcdRunJournal journal(*etcd_options);
  ServerClock clock;
  Engine engine(clock);
  clock.go_live(0);                  // (moved on to the latest time in etcd once read: see below)
  std::optional<HttpServer> server;  // (the etcd journal is the state: host.h's seam)
  auto port = start_server(server, engine, clock, &journal, options, {args.listen});
  if (!port) {
    std::cerr << "traincoord: " << port.error().message << "\n";
    return exit_code::kFailed;
  }
  // GET /v1/runs lists every run with its leader (docs/HA.md "Leadership per run").
  server->post([&leadership](Coordinator& c) { c.api().set_leadership(&leadership); });
  if (args.advertise_url.empty()) {
    leadership.set_advertised_url(scheme + "://" + host + ":" + std::to_string(*port));
  }
  const std::string url = leadership.advertised_url();
  journal.set_advertised_url(url);
  {
    std::string hosts;  // (the journal's url without its password)
    for (const auto& e : etcd_options->endpoints) hosts += (hosts.empty() ? "" : ",") + e;
    std::cout << "traincoord: state in " << (etcd_options->tls.enabled ? "etcds://" : "etcd://")
              << (etcd_options->user.empty() ? "" : etcd_options->user + "@") << hosts
              << etcd_options->prefix << " as " << url << "; listening on " << scheme << "://"
              << host << ":" << *port << std::endl;
  }
  EtcdRunElection election(*etcd_options, url, args.lease_ttl_s);
  const auto ttl = std::chrono::seconds(args.lease_ttl_s);
  int rc = 0;
  // Joins (a lease, this coordinator's member key); false when it must stop.
  auto join_etcd = [&]() -> bool {
    bool said = false;
    while (!leadership.stop_requested()) {
      auto joined = election.join();
      if (joined) {
        journal.set_lease(election.lease());
        return true;
      }
      if (joined.error().code == ErrorCode::kFailedPrecondition &&
          joined.error().message.find("per-process layout") != std::string::npos) {
        std::cerr << "traincoord: " << joined.error().message << "\n";
        rc = exit_code::kUsage;
        return false;
      }
      if (!said) std::cerr << "traincoord: " << joined.error().message << "\n";
      said = true;
      uint64_t ignored = 0;
      (void)leadership.wait(&ignored, std::chrono::milliseconds(200));
    }
    return false;
  };
  if (!join_etcd()) {
    server->stop();
    return rc;
  }
  auto renewed = std::chrono::steady_clock::now();
  bool first = true;
  bool cut_off = false;  // said that etcd cannot be read
  uint64_t seen_changes = 0;
  std::map<std::string, int64_t> leaders_said, said_leading;
  std::map<std::string, int64_t> led_since;  // the runs led here, since when (ms, steady clock)
  Rebalancer rebalancer(url, BalancePolicy::for_lease_ttl(args.lease_ttl_s));
  // Leader keys to delete (run, term): tried each turn until etcd answers, so that no run is
  // left with a key of this coordinator that no leadership here serves (no other coordinator
  // campaigns for it while the key lasts, and this one keeps its lease alive).
  std::vector<std::pair<std::string, int64_t>> to_resign;
  // Leaderships ended since (each, however soon after it began): the journal drops them (a
  // later leadership of the run begun here meanwhile is kept), their leader keys go (the next
  // leader need not wait out the lease), their parked acquires are answered not_leader.
  auto end_leaderships = [&] {
    for (const auto& ended : leadership.take_ended()) {
      const std::string& run = ended.first;
      journal.forget(run, ended.second);
      // (term 0, a run created here: its key's resign compares the lease alone, so not while
      // a later leadership of the run begun here holds it)
      if (ended.second != 0 || !leadership.view(run).leading) to_resign.push_back(ended);
      server->post([run, &leadership](Coordinator& c) {
        if (!leadership.view(run).leading) c.drop_parked(run);
      });
      std::cout << "traincoord: no longer leading run " << run << std::endl;
    }
    std::erase_if(to_resign, [&](const auto& r) { return election.resign(r.first, r.second); });
  };
  while (!leadership.stop_requested() && rc == 0) {
    // The lease: kept alive a third of its TTL at a time; lost (or not renewed within its TTL),
    // every leadership ends, and a new lease is taken to campaign anew.
    if (std::chrono::steady_clock::now() - renewed >= ttl / 3) {
      auto kept = election.keep_alive();
      if (kept && *kept) {
        renewed = std::chrono::steady_clock::now();
      } else if ((kept && !*kept) || std::chrono::steady_clock::now() - renewed >= ttl) {
        const std::string why = kept ? "the etcd lease of this coordinator expired"
                                     : "cannot keep the etcd lease alive: " + kept.error().message;
        // (the leaderships end before the journal drops their runs: a reply whose records the
        // journal dropped is never sent, see Leadership::step_down)
        for (const auto& ended : leadership.step_down_all(why)) {
          std::cerr << "traincoord: stepping down from run " << ended.first << ": " << why << "\n";
        }
        election.resign_all();  // (its leader keys go with it)
        end_leaderships();
        to_resign.clear();  // (a term-0 key's resign would compare the next lease alone)
        if (!join_etcd()) break;
        renewed = std::chrono::steady_clock::now();
      }
    }
    auto seen = election.observe();
    if (!seen) {
      if (!cut_off) std::cerr << "traincoord: " << seen.error().message << "\n";
      cut_off = true;
    } else {
      cut_off = false;
      std::vector<Leadership::Seen> views;
      TimeMs latest = 0;
      for (const RunInEtcd& r : seen->runs) {
        views.push_back({r.run,
                         r.leader.value_or(""),
                         r.term,
                         {r.head_seq, r.head_revision, r.replay_records}});
        latest = std::max(latest, r.head_time);
        if (r.leader && *r.leader != url && leaders_said[r.run] != r.term) {
          leaders_said[r.run] = r.term;
          std::cout << "traincoord: run " << r.run << " is led by " << *r.leader << " (term "
                    << r.term << ")" << std::endl;
        }
      }
      leadership.saw(views, seen->members);
      if (first) {
        first = false;
        // One time line for all coordinators: from the latest time written of any run.
        server->post([latest](Coordinator& c) {
          if (latest > c.clock().now()) c.clock().go_live(latest);
        });
        // The runs of the config files that exist nowhere yet: created here, led here.
        for (const ConfigFile& file : files) {
          bool exists = false;
          for (const RunInEtcd& r : seen->runs) exists = exists || r.run == file.config.name;
          if (exists) continue;
          server->post([&file, &leadership, &journal, &options](Coordinator& c) {
            if (c.engine().find(file.config.name)) return;
            auto run = c.engine().create_run(file.config);
            if (!run) {
              std::cerr << "traincoord: " << file.path << ": " << run.error().message << "\n";
              return;
            }
            if (options.auth) (void)options.auth->worker_token(file.config.name);
            journal.add_run(file.config.name, kStoredToml,
                            durable_config_text(file.text, file.config), c.clock().now());
            leadership.lead(file.config.name, 0);
          });
        }
      }
      // Runs whose leadership etcd no longer shows as this one's (the key expired or was
      // taken): step down.
      for (const std::string& run : leadership.led()) {
        const int64_t term = leadership.view(run).term;
        if (term == 0) continue;  // (created here: its term comes with its first write)
        const RunInEtcd* in_etcd = nullptr;
        for (const RunInEtcd& r : seen->runs) {
          if (r.run == run) in_etcd = &r;
        }
        if (!in_etcd) continue;  // (read before its creation was written)
        if (in_etcd->term == term && in_etcd->leader == url) continue;
        if (leadership.step_down(run, "its leader key in etcd is no longer this coordinator's",
                                 term))
          std::cerr << "traincoord: stepping down from run " << run
                    << ": its leader key in etcd is no longer this coordinator's\n";
        journal.forget(run, term);
      }
      // Campaigns: runs with no leader, while this coordinator leads fewer than its share.
      size_t mine = 0;
      for (const RunInEtcd& r : seen->runs) mine += r.leader == url ? 1 : 0;
      const size_t share = EtcdRunElection::share(*seen);
      for (const RunInEtcd& r : seen->runs) {
        if (mine >= share || leadership.stop_requested()) break;
        if (r.leader) continue;
        const auto won_at = std::chrono::steady_clock::now();
        auto won = election.campaign(r.run);
        if (!won || !*won) continue;
        mine += 1;
        const int64_t term = **won;
        auto copy = election.read(r.run);
        std::optional<std::string> refused;
        if (!copy) refused = copy.error().message;
        // Replayed apart, off the engine thread; only the result joins the engine.
        std::string bytes;
        std::optional<RunConfig> config;
        RestoreReport report;
        struct ConfigApplied {
          std::string fields, path, text;
        };
        std::optional<ConfigApplied> applied;
        if (!refused) {
          ServerClock scratch_clock;
          Engine scratch(scratch_clock);
          RunCopyJournal source(*copy, journal.describe() + " (run " + r.run + ")");
          Api replay(scratch, scratch_clock, ApiLimits::none());
          auto restored = restore_engine(source, scratch, replay, scratch_clock);
          if (!restored) {
            refused = restored.error().message;
          } else {
            report = *restored;
            const Run& run = **scratch.find(r.run);
            bytes = RunCodec::save(run);
            config = run.config();
            // Its config file (docs/HA.md "Changing a run's config"): the config in etcd is the
            // run's; a file that differs is applied only with --apply-config-changes and when a
            // started run may take it, by this takeover, journalled with the run's next write
            // (so every later leader serves it); otherwise the run goes on as etcd holds it.
            for (const ConfigFile& file : files) {
              if (file.config.name != r.run) continue;
              const ConfigChange check = check_config_change(file, run, args.apply_config_changes);
              if (check.changed.empty()) continue;
              if (!args.apply_config_changes) {
                std::cerr << "traincoord: run " << r.run << " (" << file.path
                          << "): its config in etcd differs from this file in "
                          << join(check.changed)
                          << " (changed by --apply-config-changes on another coordinator, or "
                             "this file is not the run's); serving run "
                          << r.run
                          << " with its config in etcd. Make the file the run's, or restart "
                             "with --apply-config-changes to apply it when this coordinator "
                             "next takes the run over\n";
                continue;
              }
              if (!check.refused.empty()) {
                std::cerr << "traincoord: " << check.refused << "; serving run " << r.run
                          << " with its config in etcd (unchanged)\n";
                continue;
              }
              auto updated = RunCodec::load(file.config, bytes, scratch_clock);
              if (!updated) {
                std::cerr << "traincoord: run " << r.run << " (" << file.path
                          << "): " << updated.error().message << "; serving run " << r.run
                          << " with its config in etcd (unchanged)\n";
                continue;
              }
              bytes = RunCodec::save(**updated);
              config = file.config;
              applied = ConfigApplied{join(check.changed), file.path,
                                      durable_config_text(file.text, file.config)};
            }
          }
        }
        if (rc != 0) {
          election.resign(r.run, term);
          break;
        }
        if (refused) {
          std::cerr << "traincoord: cannot take run " << r.run << " over: " << *refused << "\n";
          to_resign.emplace_back(r.run, term);  // (until etcd answers: end_leaderships)
          continue;
        }
        const int64_t lease = election.lease();
        server->post([&, name = r.run, term, lease, copy = std::move(*copy),
                      bytes = std::move(bytes), config = std::move(*config), report, won_at,
                      applied = std::move(applied)](Coordinator& c) mutable {
          auto run = RunCodec::load(std::move(config), bytes, c.clock());
          if (!run) {
            std::cerr << "traincoord: cannot take run " << name << " over: " << run.error().message
                      << "\n";
            leadership.abandon(name, term);  // (its leader key is resigned)
            return;
          }
          if (copy.head_time > c.clock().now()) c.clock().go_live(copy.head_time);
          if (applied) {
            (*run)->note_config_change("changed by --apply-config-changes: " + applied->fields);
          }
          if (options.auth) (void)options.auth->worker_token(name);
          c.engine().adopt(std::move(*run));
          journal.lead(name, term, lease, copy);
          if (applied) {
            // (written with a snapshot in the run's next txn, before any reply under it)
            journal.add_config(name, kStoredToml, applied->text);
            std::cout << "traincoord: applied the changed " << applied->fields << " to run " << name
                      << " (" << applied->path << ")" << std::endl;
          }
          leadership.lead(name, term);
          c.drop_parked(name);
          const double after =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - won_at).count();
          leadership.took_over(name, after);
          std::cout << "traincoord: took run " << name << " over (term " << term << "): replayed "
                    << report.records << " log records; serving " << after << " s after winning"
                    << std::endl;
        });
      }
      // Rebalancing (journal/etcd_balance.h, docs/HA.md "Rebalancing"): above its fair share
      // while another live coordinator leads two runs fewer, this coordinator hands one run
      // over: it steps down from it (its replies stop; below, its leader key is deleted), and
      // a coordinator below its share campaigns for it.
      const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count();
      const std::vector<std::string> leading = leadership.led();
      std::erase_if(led_since, [&](const auto& entry) {
        return std::find(leading.begin(), leading.end(), entry.first) == leading.end();
      });
      for (const std::string& run : leading) led_since.emplace(run, now_ms);
      if (auto run = rebalancer.decide(*seen, led_since, now_ms)) {
        size_t mine = 0;
        for (const RunInEtcd& r : seen->runs) mine += r.leader == url ? 1 : 0;
        const std::string why = "handed over to balance the runs (this coordinator led " +
                                std::to_string(mine) + " of " + std::to_string(seen->runs.size()) +
                                ", " + std::to_string(seen->members) +
                                " coordinators live: a fair share is " +
                                std::to_string(EtcdRunElection::share(*seen)) + ")";
        if (leadership.step_down(*run, why)) {
          std::cout << "traincoord: run " << *run << " " << why << std::endl;
        }
        rebalancer.handed(*run, now_ms);
      }
    }
    for (const std::string& run : leadership.led()) {
      const int64_t term = leadership.view(run).term;
      if (term == 0 || said_leading[run] == term) continue;
      said_leading[run] = term;
      std::cout << "traincoord: leading run " << run << " of " << journal.describe() << " (term "
                << term << ")" << std::endl;
    }
    (void)leadership.wait(&seen_changes, std::chrono::milliseconds(200));
    end_leaderships();
  }
  server->stop();         // (when stopping: writes what was accepted first)
  election.resign_all();  // the other coordinators need not wait out the TTL
  return rc;
}

namespace {

// The run configs of --config and --runs, read and parsed (--runs: its *.toml, by name).
// Returns them, or the exit status after saying which file failed.
tl::expected<std::vector<ConfigFile>, int> read_config_files(const ServeArgs& args) {
  std::vector<std::string> paths = args.configs;
  if (!args.runs_dir.empty()) {
    std::error_code ec;
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(args.runs_dir, ec)) {
      if (entry.path().extension() == ".toml") found.push_back(entry.path().string());
    }
    if (ec)
      return tl::unexpected(fail("cannot read --runs " + args.runs_dir + ": " + ec.message()));
    std::sort(found.begin(), found.end());
    paths.insert(paths.end(), found.begin(), found.end());
  }
  std::vector<ConfigFile> files;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return tl::unexpected(fail("cannot read run config " + path));
    std::ostringstream text;
    text << in.rdbuf();
    auto config = parse_run_config(text.str(), path);
    if (!config) return tl::unexpected(fail(config.error().message));
    files.push_back({path, text.str(), std::move(*config)});
  }
  return files;
}

// The server's options from the flags: where it listens, its limits, TLS. Returns them, or the
// exit status after saying which flag is wrong (plain HTTP off loopback included).
tl::expected<ServerOptions, int> server_options(const ServeArgs& args, size_t max_connections) {
  ServerOptions options;
  if (!split_listen(args.listen, &options.host, &options.port)) {
    return tl::unexpected(
        fail("--listen must be HOST:PORT, e.g. 127.0.0.1:8470 (got " + args.listen + ")"));
  }
  options.io_threads = args.io_threads;
  options.max_connections = max_connections;
  options.max_requests_per_connection = args.max_requests_per_connection;
  options.read_timeout_s = args.read_timeout_s;
  options.idle_timeout_s = args.idle_timeout_s;
  options.limits.max_runs = args.max_runs;
  options.limits.max_workers_per_run = args.max_workers_per_run;
  options.tls = TlsOptions{args.tls_cert, args.tls_key, args.tls_client_ca};
  if (options.tls.enabled() && args.tls_key.empty()) {
    return tl::unexpected(fail("--tls-cert needs --tls-key (the certificate's private key)"));
  }
  if (!options.tls.enabled() && (!args.tls_key.empty() || !args.tls_client_ca.empty())) {
    return tl::unexpected(
        fail(std::string(!args.tls_key.empty() ? "--tls-key" : "--tls-client-ca") +
             " needs --tls-cert (the server's certificate)"));
  }
  // Tokens and losses would cross the network in the clear: off loopback, TLS unless told.
  if (!is_loopback(options.host) && !options.tls.enabled() && !args.allow_plain_http) {
    return tl::unexpected(
        fail("--listen " + args.listen +
             " is not a loopback address: serve HTTPS with --tls-cert and --tls-key "
             "(docs/SECURITY.md), or pass --allow-plain-http behind a TLS proxy or on a "
             "trusted network"));
  }
  return options;
}

// SIGINT and SIGTERM, blocked: taken by one thread alone (sigwait), so blocked before any other
// thread starts.
sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// --journal etcd://: the tokens (one token dir for every coordinator), then serve_ha.
int serve_etcd(const ServeArgs& args, const std::vector<ConfigFile>& files, ServerOptions options) {
  std::optional<Auth> auth;
  if (args.auth || !is_loopback(options.host)) {
    const std::string dir = !args.token_dir.empty() ? args.token_dir : "traincoord-tokens";
    auto opened = Auth::open(dir);
    if (!opened) return fail(opened.error().message);
    auth = std::move(*opened);
    options.auth = &*auth;
    std::cout << "traincoord: tokens required: admin token in " << auth->admin_token_path()
              << " (every coordinator of the runs needs the same token dir)\n";
  }
  return serve_ha(args, files, options, block_stop_signals());
}

// The state of a single coordinator: the data dir's store (restored into `engine`; said on
// stdout), or memory. Returns the exit status of a failure.
std::optional<int> open_serve_state(const ServeArgs& args, const StateChoice& choice,
                                    Engine& engine, ServerClock& clock,
                                    std::unique_ptr<Store>* store) {
  if (choice.kind == StateChoice::Kind::kMemory) {
    clock.go_live(0);
    return std::nullopt;
  }
  StoreOptions so;
  so.dir = choice.where;
  so.durability = args.durability == "os" ? Durability::kOs : Durability::kFsync;
  so.snapshot_every = args.snapshot_every;
  so.min_free_bytes = args.min_free_disk_mib << 20;
  auto report = open_data_dir(so, engine, clock, store);
  if (!report) return fail(report.error());
  std::cout << "traincoord: state in " << (*store)->path() << " (durability "
            << (so.durability == Durability::kFsync ? "fsync" : "os") << ")";
  if (report->runs > 0) {
    std::cout << "; restored " << report->runs << " runs, replayed " << report->records
              << " log records in " << report->seconds << " s";
  }
  std::cout << "\n";
  return std::nullopt;
}

// Tokens: always off loopback; on loopback when asked (--auth); kept in --token-dir, else the
// data dir, else ./traincoord-tokens. Returns the exit status of a failure.
std::optional<int> open_tokens(const ServeArgs& args, const Engine& engine, const Store* store,
                               std::optional<Auth>& auth, ServerOptions& options) {
  if (!args.auth && is_loopback(options.host)) return std::nullopt;
  const std::string dir = !args.token_dir.empty() ? args.token_dir
                          : store ? std::filesystem::path(store->path()).parent_path().string()
                                  : std::string("traincoord-tokens");
  auto opened = Auth::open(dir);
  if (!opened) return fail(opened.error().message);
  auth = std::move(*opened);
  for (const Run* run : engine.runs()) {
    if (auto t = auth->worker_token(run->config().name); !t) return fail(t.error().message);
  }
  options.auth = &*auth;
  std::cout << "traincoord: tokens required: admin token in " << auth->admin_token_path()
            << ", each run's worker token in " << dir << "/runs/RUN.token (mode 0600)\n";
  for (const std::string& notice : auth->take_notices()) {
    std::cout << "traincoord: " << notice << "\n";
  }
  return std::nullopt;
}

// Says the runs served; before start(): from then on only the server's engine thread touches
// the engine.
void say_runs(const Engine& engine) {
  for (const Run* run : engine.runs()) {
    std::cout << "traincoord: serving run " << run->config().name << " ("
              << run_state_name(run->state()) << ", " << run->plan().train_jobs_per_epoch
              << " train jobs per epoch, epochs " << run->plan().start_epoch << ".."
              << run->plan().target_epoch << ")\n";
  }
  if (engine.runs().empty()) {
    std::cout << "traincoord: no runs yet; create one with POST /v1/runs (docs/API.md)\n";
  }
}

// Serves until SIGINT or SIGTERM: the server started, its address said. Returns the exit
// status.
int serve_until_stopped(Engine& engine, ServerClock& clock, Store* store,
                        const ServerOptions& options, const std::string& listen) {
  const sigset_t signals = block_stop_signals();
  std::optional<HttpServer> server;
  auto port = start_server(server, engine, clock, store, options, {listen});
  if (!port) {
    std::cerr << "traincoord: " << port.error().message << "\n";
    return exit_code::kFailed;
  }
  const std::string host =
      options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host;
  if (options.tls.enabled()) {
    std::cout << "traincoord: TLS with " << options.tls.cert_file
              << (options.tls.client_ca_file.empty() ? std::string()
                                                     : "; client certificates signed by " +
                                                           options.tls.client_ca_file + " required")
              << "\n";
  }
  std::cout << "traincoord: listening on " << (options.tls.enabled() ? "https" : "http") << "://"
            << host << ":" << *port << std::endl;
  int sig = 0;
  sigwait(&signals, &sig);
  std::cout << "traincoord: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", stopping\n";
  std::cout.flush();
  server->stop();
  return 0;
}

}  // namespace

int serve(const ServeArgs& args) {
  const size_t max_connections = prepare_limits(args.max_connections, args.max_connections_given);
  auto files = read_config_files(args);
  if (!files) return files.error();
  auto options = server_options(args, max_connections);
  if (!options) return options.error();
  std::vector<std::string> names;
  for (const ConfigFile& file : *files) names.push_back(file.config.name);
  auto choice = choose_state(args.journal, args.in_memory, args.data_dir, names);
  if (!choice) return fail(choice.error());
  if (choice->kind == StateChoice::Kind::kEtcd) return serve_etcd(args, *files, *options);
  if (!args.advertise_url.empty()) return fail("--advertise-url needs --journal etcd://...");
  if (!args.etcd_cacert.empty() || !args.etcd_cert.empty() || !args.etcd_key.empty()) {
    return fail(std::string(!args.etcd_cacert.empty() ? "--etcd-cacert"
                            : !args.etcd_cert.empty() ? "--etcd-cert"
                                                      : "--etcd-key") +
                " needs --journal etcds://...");
  }
  ServerClock clock;
  Engine engine(clock);
  std::unique_ptr<Store> store;
  if (auto code = open_serve_state(args, *choice, engine, clock, &store)) return *code;
  if (const int rc = add_runs(*files, engine, store.get(), clock, args.apply_config_changes, fail);
      rc != 0) {
    return rc;
  }
  std::optional<Auth> auth;
  if (auto code = open_tokens(args, engine, store.get(), auth, *options)) return *code;
  say_runs(engine);
  return serve_until_stopped(engine, clock, store.get(), *options, args.listen);
}

}  // namespace traincoord::cli
