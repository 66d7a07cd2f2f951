// The host of a coordinator, as `serve` and `launch --config` set it up: the listen address, the
// state (in memory, a data dir's SQLite store, or etcd), the runs of the config files, the HTTP
// server with its limits. Both commands build their host from these pieces, in this order:
//   choose_state -> open_data_dir (a data dir) -> add_runs -> start_server.
// The state's journal is the seam: HttpServer writes to a Journal*, a Store for a data dir, an
// EtcdRunJournal for --journal etcd:// (serve_ha), nothing in memory. A second journal backend
// is one more StateChoice::Kind, opened beside open_data_dir.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "cli/commands.h"
#include "config/config_change.h"
#include "core/engine.h"
#include "core/run_config.h"
#include "server/http_server.h"
#include "server/restore.h"
#include "server/server_clock.h"
#include "store/store.h"

namespace traincoord::cli {

// A run config file as read: its path, text and parsed config.
struct ConfigFile {
  std::string path;
  std::string text;
  RunConfig config;
};
// The items, ", " between them.
std::string join(const std::vector<std::string>& items);
// A config file for a run the store already holds (serve, launch): the same config resumes it;
// a changed one is refused naming the fields, or applied when `apply` and the fields allow it.
// Returns 0, or the exit status after saying why on stderr.
int reconcile(const ConfigFile& file, Run& run, Engine& engine, Store* store, ServerClock& clock,
              bool apply);

// HOST:PORT, or [V6]:PORT, into `host` (brackets removed) and `port`. Returns false when it is
// not one (no colon, no host, a port that is not 0..65535).
bool split_listen(const std::string& listen, std::string* host, uint16_t* port);

// Whether a listen host is a loopback address (localhost, ::1, 127.x): served without TLS and,
// unless asked, without tokens.
bool is_loopback(const std::string& host);

// Where a coordinator keeps its runs' state.
struct StateChoice {
  enum class Kind { kMemory, kDataDir, kEtcd };
  Kind kind = Kind::kMemory;
  std::string where;  // the data dir, or the etcd url; empty in memory
};

// The flags of the state: `journal` (--journal etcd://..., empty for none), `in_memory`,
// `data_dir` (empty: ./RUN.traincoord for one run, ./traincoord-data otherwise), the names of the
// config files' runs. Returns the choice, or the message naming the flags that exclude each
// other ("--in-memory and --journal exclude each other ...").
tl::expected<StateChoice, std::string> choose_state(const std::string& journal, bool in_memory,
                                                    const std::string& data_dir,
                                                    const std::vector<std::string>& run_names);

// Opens the store of `options.dir` (its notices said on stderr) and restores its runs into
// `engine` (what was accepted, whatever the limits now). Returns the restore's report, or a
// message naming the data dir.
tl::expected<RestoreReport, std::string> open_data_dir(const StoreOptions& options, Engine& engine,
                                                       ServerClock& clock,
                                                       std::unique_ptr<Store>* store);

// A config file for a run that exists (`run`, as its journal holds it), under
// --apply-config-changes when `apply` (config/config_change.h says what is allowed). The SQLite
// journal's start (add_runs) and a takeover in etcd (serve_ha) share it.
ConfigChange check_config_change(const ConfigFile& file, const Run& run, bool apply);

// The runs of `files` in `engine`: a run it holds already is reconciled with its file
// (reconcile, `apply` = --apply-config-changes), a new one created (and added to `store` when
// not null); then the store commits. `fail` says a failure and returns its exit status.
// Returns 0, or the exit status of the first failure.
int add_runs(const std::vector<ConfigFile>& files, Engine& engine, Store* store, ServerClock& clock,
             bool apply, const std::function<int(const std::string&)>& fail);

// The process's limits, for a server: a write past the file size limit (RLIMIT_FSIZE) fails
// with EFBIG, which the journal takes as a full disk (503 disk_full, said on stderr), instead
// of killing the process with SIGXFSZ and no word; the soft limit on descriptors (one per
// connection) is raised to the hard one, and said when --max-connections exceeds it.
// Returns the connections to hold at once: --max-connections when `given` (with a warning when
// the descriptor limit cannot hold them), else the default, lowered quietly to what the limit
// holds.
size_t prepare_limits(size_t max_connections, bool given);

// Starts `server` on the first of `listens` (HOST:PORT each) that it can listen on, with
// `options` otherwise, writing to `journal` (null: in memory). Returns the port, or the error
// of the last try (`server` then empty). REQUIRES: each listen passes split_listen.
Result<uint16_t> start_server(std::optional<HttpServer>& server, Engine& engine, ServerClock& clock,
                              Journal* journal, ServerOptions options,
                              const std::vector<std::string>& listens);

}  // namespace traincoord::cli
