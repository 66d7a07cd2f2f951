// The journal in etcd (docs/HA.md): what the SQLite store keeps for replay (configs, snapshots,
// the records since them), kept in an etcd cluster under a prefix, so that a standby
// coordinator on another host can take the runs over when the leader is gone.
//
// Keys under PREFIX (run names escaped: '%' and '/' as %25 and %2F):
//   PREFIX/leader                the leader's advertised URL, under its etcd lease; its
//                                create_revision is the leadership's term (etcd_leadership.h)
//   PREFIX/head                  "TERM SEQ TIME": the last write (its writer's term, the last
//                                record number, the latest time written)
//   PREFIX/config/RUN            "FORMAT\nCREATED_MS\nTEXT"
//   PREFIX/snap/RUN              "SEQ TIME GEN CHUNKS BYTES": the run's latest snapshot
//   PREFIX/chunk/RUN/GEN/I       its bytes, in chunks of at most chunk_bytes (etcd takes
//                                requests of at most 1.5 MiB by default)
//   PREFIX/log/RUN/LASTSEQ       records of the run (one wave's, or part of one), encoded,
//                                deflated
//
// Fencing: every write is an etcd txn conditioned on PREFIX/leader still being this
// leadership's (same create_revision and lease) and on PREFIX/head being the one this journal
// wrote last. When etcd refuses it, another coordinator has taken over (or this one's lease
// expired): write() fails with code not_leader and nothing of the batch is written; the
// coordinator must step down without replying.
//
// Bounded storage: a snapshot deletes the records and chunks it covers (in its txn), and every
// `compact_every` writes the journal compacts etcd's history up to its last write.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "journal/etcd_client.h"
#include "journal/journal.h"

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

class EtcdJournal final : public Journal {
 public:
  // The journal of the leadership `term` (the create_revision of PREFIX/leader, held under
  // `lease`). Reads PREFIX/head: the writes go on from there.
  static Result<std::unique_ptr<EtcdJournal>> open(EtcdJournalOptions options, int64_t term,
                                                   int64_t lease);
  ~EtcdJournal() override;

  std::string describe() const override;
  Result<std::vector<SavedRun>> saved_runs() override;
  Result<void> for_each_record(const std::function<Result<void>(const Record&)>& fn) override;
  Result<TimeMs> latest_time() override;

  void add_run(const std::string& name, std::string_view format, std::string_view text,
               TimeMs created) override;
  void add_record(std::string_view run, TimeMs time, RecordKind kind, std::string_view target,
                  std::string_view body, int outcome, std::string_view reply = {}) override;
  void add_completion(const CompletionRow& row) override;
  std::unique_ptr<JournalBatch> take(const Engine& engine, bool snapshots, TimeMs now) override;
  // Fails with reason not_leader (error_reason::kNotLeader) when the leadership is no longer
  // this journal's; with another error when etcd could not be reached (then the batch may or
  // may not have been written: either way this leadership must end).
  Result<void> write(const JournalBatch& batch) override;
  Result<void> replace_config(const Run& run, std::string_view format, std::string_view text,
                              TimeMs now) override;
  void append_metrics(std::string& out) const override;

  // What was written (for tests and metrics).
  uint64_t writes() const { return writes_.load(); }
  uint64_t txns() const { return txns_.load(); }
  uint64_t compactions() const { return compactions_.load(); }
  // Where the journal's head is as this journal last wrote it (or read it at open), and the
  // records a successor would replay at most (a run's records since its last snapshot, the
  // most of any run). Any thread.
  int64_t head_seq() const { return published_seq_.load(); }
  int64_t head_revision() const { return published_revision_.load(); }
  int64_t replay_records() const { return replay_records_.load(); }

 private:
  class Batch;
  struct RunLog;
  EtcdJournal(EtcdJournalOptions options, int64_t term, int64_t lease);
  Result<void> load_head();
  Result<void> write_snapshot_chunks(const std::string& run, const std::string& state, int64_t gen);
  // One fenced txn; `seq`/`time`: what PREFIX/head says after it.
  Result<void> fenced_txn(std::vector<etcd::Operation> ops, int64_t seq, TimeMs time);
  std::string key(std::string_view kind, std::string_view run = {}) const;

  EtcdJournalOptions options_;
  int64_t term_, lease_;
  // The commit thread's (write, and open/replay before it starts).
  std::unique_ptr<etcd::Client> client_;
  int64_t head_revision_ = 0;  // mod_revision of PREFIX/head as this journal last wrote it
  int64_t written_seq_ = 0;
  TimeMs written_time_ = 0;
  int64_t next_gen_ = 0;
  uint64_t since_compaction_ = 0;
  std::atomic<uint64_t> writes_{0}, txns_{0}, compactions_{0}, refused_{0};
  std::atomic<int64_t> published_seq_{0}, published_revision_{0}, replay_records_{0};
  // Added, not yet taken (the coordinator's thread).
  std::unique_ptr<Batch> pending_;
  int64_t next_seq_ = 1;
  std::map<std::string, uint64_t, std::less<>> since_snapshot_;
  std::map<std::string, int64_t, std::less<>> last_seq_;
};

}  // namespace traincoord
