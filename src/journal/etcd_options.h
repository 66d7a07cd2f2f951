// Where the journal in etcd is (docs/HA.md): the endpoints, prefix, credentials and the sizes
// of its writes, as `serve --journal etcd://...` gives them (etcd_run_journal.h writes there).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "journal/etcd_client.h"

namespace traincoord {

struct EtcdJournalOptions {
  std::vector<std::string> endpoints;  // "host:port"
  std::string prefix = "/traincoord";
  std::chrono::milliseconds timeout{2000};  // per request, per member
  uint64_t snapshot_every = 10'000;         // records of a run between two snapshots
  size_t chunk_bytes = 1 << 20;             // of a snapshot, per key (base64 adds a third)
  size_t txn_bytes = 1 << 20;               // a write's txns are split past this (or 100 ops)
  uint64_t compact_every = 1000;            // writes between two compactions of etcd's history
  std::string user, password;               // etcd's authentication (none: empty user)
  etcd::TlsFiles tls{};                     // HTTPS to the members (etcds://)
};

// Where an etcd:// journal is: parses "etcd://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...][/PREFIX]"
// (a USER without a PASSWORD: the password is $TRAINCOORD_ETCD_PASSWORD); "etcds://..." is the
// same over TLS (tls.enabled; the files are the caller's to set).
// Returns an error naming the field ("journal") when it is not that.
Result<EtcdJournalOptions> parse_etcd_url(std::string_view url);

}  // namespace traincoord
