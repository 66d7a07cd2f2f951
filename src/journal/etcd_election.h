// Who leads the runs of an etcd journal (docs/HA.md): the coordinator whose advertised URL is
// in PREFIX/leader, a key held under that coordinator's etcd lease. The key's create_revision
// is the leadership's term: it grows with every new leadership, and the journal's writes are
// conditioned on it (etcd_journal.h). When the leader stops keeping its lease alive (killed,
// paused, cut off from etcd), etcd deletes the key after the lease's TTL, and a standby's
// campaign() creates it anew.
//
// Not thread-safe: one thread campaigns, observes and keeps the lease alive.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "journal/etcd_client.h"
#include "journal/etcd_journal.h"

namespace traincoord {

struct LeaderInfo {
  std::string url;
  int64_t term = 0;
};

// Where the journal in etcd stands, as a standby reads it (docs/HA.md "Watching it").
struct JournalHead {
  int64_t seq = 0;       // the last record number written (PREFIX/head; 0: none yet)
  int64_t revision = 0;  // the etcd revision of that write (0: none yet)
  // Records a takeover would replay at most: the head's seq less the oldest run snapshot's
  // (0 for a run that has none yet).
  int64_t replay_records = 0;
};

struct Observation {
  std::optional<LeaderInfo> leader;  // nothing: no one leads; an election is due
  JournalHead head;
};

class EtcdElection {
 public:
  EtcdElection(const EtcdJournalOptions& options, std::string advertised_url, int64_t ttl_s);
  ~EtcdElection();

  // Who leads now, and where the journal's head is: one etcd txn (four small reads).
  Result<Observation> observe();
  // Tries once to lead: grants a lease (kept for the next try when this one loses) and creates
  // PREFIX/leader under it unless the key exists. Returns the term when won; nothing when
  // another coordinator leads.
  Result<std::optional<int64_t>> campaign();
  // Keeps the lease alive: false when it is gone (expired or revoked): the leadership is over.
  Result<bool> keep_alive();
  // Ends the leadership at once: revokes the lease (etcd deletes PREFIX/leader with it).
  void resign();

  int64_t lease() const { return lease_; }
  int64_t ttl_s() const { return ttl_s_; }
  const std::string& advertised_url() const { return url_; }

 private:
  std::string prefix_, leader_key_;
  std::string url_;
  int64_t ttl_s_;
  std::unique_ptr<etcd::Client> client_;
  int64_t lease_ = 0;
};

}  // namespace traincoord
