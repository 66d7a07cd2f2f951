// Leadership per run (issue 20, docs/HA.md "Leadership per run"): the journal in etcd where each
// run has a leader of its own, so that several coordinators share the runs of a sweep and a
// failover moves only the runs of the coordinator that was lost.
//
// Design
// ------
// Keys under PREFIX (RUN escaped as one key segment: '%' and '/' as %25 and %2F):
//   PREFIX/layout              "runs 1": this prefix holds the per-run layout
//   PREFIX/member/URL          a live coordinator (its advertised URL, escaped), under its lease
//   PREFIX/leader/RUN          the URL of RUN's leader, under that coordinator's lease; its
//                              create_revision is RUN's term
//   PREFIX/head/RUN            "TERM SEQ TIME": RUN's last write (TERM 0 for the write that
//                              created the run); every run that exists has one
//   PREFIX/config/RUN          "FORMAT\nCREATED_MS\nTEXT"
//   PREFIX/snap/RUN            "SEQ TIME GEN CHUNKS BYTES Z": RUN's latest snapshot
//   PREFIX/chunk/RUN/GEN/I     its bytes, deflated (as a log key's value), in chunks (BYTES
//                              in all); without the " Z" (as written before), not deflated
//   PREFIX/log/RUN/LASTSEQ     records of RUN (one wave's, or part of one), deflated
// Record numbers count per run (RUN's head SEQ). The leader and head keys sit under prefixes
// of their own (not under PREFIX/runs/RUN/) so that one etcd txn of three prefix ranges reads
// every run's leader, head and snapshot (observe(), every 200 ms on each coordinator) without
// reading a log or a chunk.
//
// Fencing, per run: every write of RUN is an etcd txn conditioned on PREFIX/leader/RUN still
// having this leadership's create_revision and lease, and on PREFIX/head/RUN being the one this
// journal wrote last. A refused txn ends the leadership of RUN alone: the journal forgets RUN,
// write() says which runs it lost (take_lost()), and the other runs of the same batch are
// written (each run's txns are its own).
//
// One etcd lease per coordinator (EtcdRunElection): its member key and all its leader keys are
// under it, so one keep-alive holds them all, and a coordinator that dies (or is cut off past
// the TTL) loses all its runs at once, and no other's.
//
// Who takes which run (EtcdRunElection::share): a run with no leader is campaigned for by each
// coordinator that leads fewer than its fair share, ceil(runs / live members); the first txn
// wins. A run created on a coordinator (a config file at start, or POST /v1/runs) is led by it:
// the txn that writes its config also creates its leader key, and is refused if the run exists
// (another coordinator created it first). A leader above its fair share hands runs over one at a
// time to a coordinator that joined later (journal/etcd_balance.h: it resigns the run, which the
// newcomer's campaign takes); otherwise runs move only when their leader is lost or resigns.
//
// Migration: a prefix written by the per-process layout of earlier versions (a PREFIX/head or
// PREFIX/leader key) is refused with an error saying so; serve those runs with a version of
// that layout, or start them under a new prefix.
//
// Threads: EtcdRunJournal is written by the commit thread (write) and fed by the engine thread
// (add_*, take); lead()/forget() may come from any thread (its table of led runs has a lock).
// EtcdRunElection is one thread's (the one that observes, campaigns and keeps the lease alive).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "journal/etcd_client.h"
#include "journal/etcd_options.h"
#include "journal/journal.h"

namespace traincoord {

// What is in etcd of one run, as one read of the keys of all runs found it.
struct RunInEtcd {
  std::string run;
  std::optional<std::string> leader;  // its leader's URL (nothing: no one leads it)
  int64_t term = 0;                   // its leader key's create_revision (0: no leader)
  int64_t head_seq = 0;               // its last record number
  int64_t head_revision = 0;          // the etcd revision of that write
  TimeMs head_time = 0;               // the latest time written of it
  int64_t replay_records = 0;         // records a takeover would replay (since its snapshot)
};

struct RunsObservation {
  std::vector<RunInEtcd> runs;           // by name
  size_t members = 0;                    // live coordinators (member keys), this one included
  std::vector<std::string> member_urls;  // their advertised URLs
};

// A run as etcd holds it, read by the coordinator that just won it (to replay it).
struct RunCopy {
  SavedRun saved;
  std::vector<Record> records;  // not covered by its snapshot, in order
  int64_t head_seq = 0;
  int64_t head_revision = 0;
  TimeMs head_time = 0;
};

// A Journal that only reads one RunCopy (restore_engine's source when a run is taken over).
class RunCopyJournal final : public Journal {
 public:
  explicit RunCopyJournal(const RunCopy& copy, std::string where)
      : copy_(copy), where_(std::move(where)) {}
  std::string describe() const override { return where_; }
  Result<std::vector<SavedRun>> saved_runs() override { return std::vector<SavedRun>{copy_.saved}; }
  Result<void> for_each_record(const std::function<Result<void>(const Record&)>& fn) override;
  Result<TimeMs> latest_time() override { return copy_.head_time; }
  // Writing is not what it is for: these assert.
  void add_run(const std::string&, std::string_view, std::string_view, TimeMs) override;
  void add_record(std::string_view, TimeMs, RecordKind, std::string_view, std::string_view, int,
                  std::string_view = {}) override;
  void add_completion(const CompletionRow&) override {}
  void add_config(const std::string&, std::string_view, std::string_view) override;
  std::unique_ptr<JournalBatch> take(const Engine&, bool, TimeMs) override;
  Result<void> write(const JournalBatch&) override;
  Result<void> replace_config(const Run&, std::string_view, std::string_view, TimeMs) override;

 private:
  const RunCopy& copy_;
  std::string where_;
};

// The lease of one coordinator and its campaigns for runs. Not thread-safe.
class EtcdRunElection {
 public:
  EtcdRunElection(const EtcdJournalOptions& options, std::string advertised_url, int64_t ttl_s);
  ~EtcdRunElection();

  // Grants the lease (when there is none) and puts this coordinator's member key under it.
  // Fails when the prefix holds the per-process layout (failed_precondition, saying so).
  Result<void> join();
  // Every run's leader, head and snapshot, and the live members: one etcd txn.
  Result<RunsObservation> observe();
  // How many runs this coordinator may lead of `seen`: ceil(runs / members) (at least 1).
  static size_t share(const RunsObservation& seen);
  // Tries once to lead `run`, which must exist (its head key): creates PREFIX/leader/RUN under
  // the lease unless someone leads it. Returns the term when won (also when it finds its key
  // under this lease already: a try whose answer was lost); nothing when another leads it (or
  // the run does not exist).
  Result<std::optional<int64_t>> campaign(const std::string& run);
  // Reads all of `run` (config, snapshot, records since it, head), for a takeover.
  // REQUIRES: this coordinator leads it (nothing else writes it meanwhile).
  Result<RunCopy> read(const std::string& run);
  // Keeps the lease alive: false when it is gone (expired or revoked): every leadership of this
  // coordinator is over (join() again to campaign anew).
  Result<bool> keep_alive();
  // Ends the leadership of `run` at once (deletes its leader key if it is still this lease's,
  // and with `term` > 0, of that term). Returns false when etcd did not answer (try again).
  bool resign(const std::string& run, int64_t term = 0);
  // Ends every leadership at once: revokes the lease (etcd deletes its keys with it); when etcd
  // cannot be reached, the next join() revokes it first.
  void resign_all();

  int64_t lease() const { return lease_; }
  const std::string& advertised_url() const { return url_; }

 private:
  std::string key(std::string_view kind, std::string_view run = {}) const;

  EtcdJournalOptions options_;
  std::string url_;
  int64_t ttl_s_;
  std::unique_ptr<etcd::Client> client_;
  int64_t lease_ = 0;
  int64_t stale_lease_ = 0;  // given up, not yet revoked
};

class EtcdRunJournal final : public Journal {
 public:
  explicit EtcdRunJournal(EtcdJournalOptions options);
  ~EtcdRunJournal() override;

  // -- The runs this journal writes (any thread) --
  // Writes `run` from now on under the leadership `term` (held under `lease`), going on from
  // the head read when it was taken over (`copy`). Returns this leadership's generation: a
  // number of this process that grows with every lead(), which take() stamps on what it takes
  // of the run, so that what was taken under an older leadership of it is never written under
  // a newer one.
  uint64_t lead(const std::string& run, int64_t term, int64_t lease, const RunCopy& copy);
  // Stops writing `run` (its leadership ended): what is taken of it from now on, or was taken
  // before, is not written. With `term`, only while it is led under that term (a later
  // leadership of the run begun here meanwhile is kept).
  void forget(const std::string& run, std::optional<int64_t> term = std::nullopt);
  // The generation of `run`'s leadership (0: not led by this journal), and its term (0: a run
  // created here whose first write has not been made yet).
  std::pair<uint64_t, int64_t> leadership_of(std::string_view run) const;
  // The runs this journal writes.
  std::vector<std::string> runs() const;
  // The lease of new runs (add_run): the election's.
  void set_lease(int64_t lease) { lease_for_new_.store(lease); }
  // The advertised URL written in the leader keys of runs created here.
  void set_advertised_url(std::string url);

  // The runs whose leadership a write ended (refused: another leads it, or this lease is gone;
  // or etcd could not say whether it took it), with why and its term; taken once (the commit
  // thread). Only a leadership still led here when its write failed: one forgotten meanwhile
  // (forget: ended already) or replaced by a later one (lead) is not reported.
  std::vector<LostRun> take_lost();
  std::vector<LostRun> take_lost_runs() override { return take_lost(); }
  // The runs created here whose first write succeeded, with their term; taken once.
  std::vector<std::pair<std::string, int64_t>> take_won();
  std::vector<std::pair<std::string, int64_t>> take_won_runs() override { return take_won(); }

  // -- Journal --
  std::string describe() const override;
  // The runs led (their state is read at lead(), not here): none.
  Result<std::vector<SavedRun>> saved_runs() override { return std::vector<SavedRun>{}; }
  Result<void> for_each_record(const std::function<Result<void>(const Record&)>&) override {
    return {};
  }
  Result<TimeMs> latest_time() override { return 0; }
  // A run created here: its first write creates it in etcd with this coordinator as its leader,
  // or is refused when it exists (then it is lost: take_lost()).
  void add_run(const std::string& name, std::string_view format, std::string_view text,
               TimeMs created) override;
  void add_record(std::string_view run, TimeMs time, RecordKind kind, std::string_view target,
                  std::string_view body, int outcome, std::string_view reply = {}) override;
  void add_completion(const CompletionRow& row) override;
  // A changed config of a run led here (--apply-config-changes, applied when this coordinator
  // took the run over, or POST /v1/runs/{run}/config): the next take() writes it with a
  // snapshot of the run as the engine holds it then, in the run's next fenced txn, so that every
  // later leader reads the run under it. The engine thread's, as add_record.
  void add_config(const std::string& run, std::string_view format, std::string_view text) override;
  std::unique_ptr<JournalBatch> take(const Engine& engine, bool snapshots, TimeMs now) override;
  // Writes each run of the batch still led under the generation it was taken under, in its own
  // fenced txns. Returns an error (reason not_leader) when some run's write was refused or
  // failed: take_lost() says which; the others were written.
  Result<void> write(const JournalBatch& batch) override;
  Result<void> replace_config(const Run& run, std::string_view format, std::string_view text,
                              TimeMs now) override;
  void append_metrics(std::string& out) const override;

  uint64_t writes() const { return writes_.load(); }
  uint64_t txns() const { return txns_.load(); }
  uint64_t compactions() const { return compactions_.load(); }

 private:
  class Batch;
  struct Lead;
  // One fenced txn of `run`; `seq`/`time`: what its head says after it.
  Result<void> fenced_txn(Lead& lead, const std::string& run, std::vector<etcd::Operation> ops,
                          int64_t seq, TimeMs time);
  Result<void> create(Lead& lead, const std::string& run, const SavedRun& config);
  Result<void> write_chunks(Lead& lead, const std::string& run, const std::string& state,
                            int64_t gen);
  std::string key(std::string_view kind, std::string_view run = {}) const;
  // The lead of `run` when this journal leads it (null: not led here, any more).
  std::shared_ptr<Lead> lead_of(std::string_view run) const;

  EtcdJournalOptions options_;
  std::unique_ptr<etcd::Client> client_;  // the commit thread's
  std::atomic<int64_t> lease_for_new_{0};
  mutable std::mutex mu_;  // guards the fields below
  // (shared: forget() may drop a run's lead while the commit thread writes it)
  std::map<std::string, std::shared_ptr<Lead>, std::less<>> led_;
  uint64_t next_generation_ = 1;
  std::string url_;
  std::vector<LostRun> lost_;
  std::vector<std::pair<std::string, int64_t>> won_;
  // The engine thread's.
  std::unique_ptr<Batch> pending_;
  // The commit thread's.
  int64_t last_revision_ = 0;
  uint64_t since_compaction_ = 0;
  std::atomic<uint64_t> writes_{0}, txns_{0}, compactions_{0}, refused_{0};
  // Bytes put in etcd (as stored: deflated): records (log keys) and snapshots (chunks), and
  // the snapshots written.
  std::atomic<uint64_t> record_bytes_{0}, snapshot_bytes_{0}, snapshots_{0};
};

}  // namespace traincoord
