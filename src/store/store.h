// The durable store: one SQLite database (WAL) per coordinator, in its data dir.
//
// What it keeps, per run: the config; a snapshot of the run's whole state (RunCodec); the log of
// every state-changing request since that snapshot, with its time; and, for people to query,
// every accepted completion and every epoch's aggregates. Restart = load each snapshot, then
// replay the log through the same code at the recorded times (server/journal.h): the core is
// deterministic, so the state comes back exactly. Snapshots are taken every `snapshot_every`
// records of a run, which bounds restart time however long the run.
//
// Writes are buffered and written by commit() in one transaction (group commit); a reply that
// depends on them is sent only after commit() returns.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "journal/journal.h"
#include "json/json_writer.h"
#include "store/checkpointer.h"
#include "store/data_dir.h"
#include "store/sqlite.h"

namespace traincoord {

enum class Durability {
  kFsync,  // every commit is fsynced: survives a process crash and a power loss
  kOs,     // commits are left to the OS: survives a process crash, not a power loss
};

struct StoreOptions {
  std::string dir;
  Durability durability = Durability::kFsync;
  bool read_only = false;             // for `traincoord inspect`: nothing is written
  uint64_t snapshot_every = 100'000;  // log records of a run between two snapshots
  // Below this much free space on the data dir's disk, the server takes no new work (503) and
  // open() refuses to start: what was accepted always has room to be written.
  uint64_t min_free_bytes = 64ull << 20;
};

// What one commit writes. Taken from the store's buffers and the engine on the coordinator's
// thread (Store::take), written there or on another (Store::write; the server's store thread,
// while the engine goes on), one batch at a time, in the order taken.
struct StoreBatch final : JournalBatch {
  struct NewRun {
    std::string name, format, text;
    TimeMs created;
  };
  struct LogRow {  // a run's records of this commit, encoded
    int64_t seq;
    std::string run;
    TimeMs time;
    std::string records;
    uint64_t sum;  // the run's checksum chain, through this row (row_sum in store.cc)
  };
  struct EpochRow {
    std::string run, set;
    int64_t epoch;
    uint64_t jobs, done, failed;
    bool closed;
    double loss;  // NaN: none (open, or no finite loss)
    uint64_t samples, nonfinite_jobs;
  };
  struct RunRow {
    std::string name, state, reason;
  };
  struct CompletionBatch {  // a run's accepted completions of this commit
    std::string run;
    std::string
        rows;  // a JSON array of [lease, worker, set, epoch, job, loss, samples, metrics, time]
  };
  struct SnapshotRow {
    std::string run;
    int64_t seq;  // the last log row it covers
    TimeMs time;
    std::string state;
    uint64_t chain;  // the run's checksum chain at `seq` (the next row goes on from it)
  };
  std::vector<NewRun> runs;
  std::vector<LogRow> log;
  std::vector<CompletionBatch> completions;
  std::vector<EpochRow> epochs;
  std::vector<RunRow> run_states;
  std::vector<SnapshotRow> snapshots;
  std::vector<NewRun> configs;  // a run's config replaced (`created` unused), with a snapshot
  // The epochs table is derived from the runs' state: all of it again at the first commit after
  // a start (`derive_epochs`: its rows are deleted first, whatever was edited in them), and a
  // run's again after a restore changed its epochs (`epoch_resets`: that run's rows deleted).
  bool derive_epochs = false;
  std::vector<std::string> epoch_resets;

  bool empty() const override {
    return runs.empty() && log.empty() && completions.empty() && snapshots.empty() &&
           configs.empty() && !derive_epochs && epoch_resets.empty();
  }
  // Appends `later` (written after this one).
  void append(StoreBatch&& later);
  void append(JournalBatch&& later) override { append(static_cast<StoreBatch&&>(later)); }
};

class Store final : public Journal {
 public:
  static constexpr int kSchemaVersion = 5;
  static constexpr const char* kFileName = "traincoord.db";
  // Holds the pid of the one process that writes the data dir (which holds a flock on the dir
  // itself, and on this file for older versions).
  static constexpr const char* kLockFileName = "traincoord.lock";
  // The number of the last log row committed, written after each commit (no fsync): a
  // database that holds less at the next start lost commits (a deleted -wal file, a disk that
  // dropped writes), and the start says so.
  static constexpr const char* kHeadFileName = "traincoord.head";

  // Opens DIR/traincoord.db, creating DIR and the database on first use. Refuses, without
  // touching it, a file that is corrupt, not a traincoord database, or written by a newer
  // version; the message says which and what to do. Read-write, it also refuses a data dir
  // another process holds (the lock file), a read-only one, and one on a disk with less than
  // min_free_bytes free.
  static Result<std::unique_ptr<Store>> open(const StoreOptions& options);
  ~Store();

  // What open() found that the operator must hear of (lost commits), once.
  std::vector<std::string> take_notices() override { return std::move(notices_); }
  std::string describe() const override { return path_; }
  // Free bytes on the data dir's disk (no more than the journal's files may still grow under
  // the process's file size limit, RLIMIT_FSIZE), and whether that is below min_free_bytes.
  uint64_t free_bytes() const;
  bool writes_are_quick() const override { return options_.durability == Durability::kOs; }
  bool low_on_room() const override { return free_bytes() < options_.min_free_bytes; }
  uint64_t reserve_bytes() const override { return options_.min_free_bytes; }
  // Whether the last write() failed for want of space (SQLITE_FULL): nothing of it was
  // written, and the same batch may be written again once there is room.
  bool last_write_was_full() const override { return last_write_full_; }
  // The checkpointer's series (passes, WAL restarts, failures).
  void append_metrics(std::string& out) const override;

  const std::string& path() const { return path_; }
  // Checkpoints of the WAL done so far (on the checkpointer's thread; for tests).
  uint64_t checkpoints() const { return checkpointer_ ? checkpointer_->passes() : 0; }
  uint64_t checkpoint_restarts() const { return checkpointer_ ? checkpointer_->restarts() : 0; }
  uint64_t checkpoint_failures() const { return checkpointer_ ? checkpointer_->failures() : 0; }
  Durability durability() const { return options_.durability; }

  // The saved runs, with their latest snapshot (checking the checksums of configs and
  // snapshots).
  Result<std::vector<SavedRun>> saved_runs() override;
  // Checks each log row's checksum chain before its records reach `fn`.
  Result<void> for_each_record(const std::function<Result<void>(const Record&)>& fn) override;
  Result<TimeMs> latest_time() override;
  // Checks the checksum chain over all rows of completion_batches (what the view `completions`
  // shows; the runs' state does not depend on it, so a start does not read it all): the number
  // of rows, or an error naming the first row found changed, removed or damaged. Schema 5.
  Result<uint64_t> check_completions();

  void add_run(const std::string& name, std::string_view format, std::string_view text,
               TimeMs created) override;
  // (`reply` is not kept: a log row keeps only the outcome's status.)
  void add_record(std::string_view run, TimeMs time, RecordKind kind, std::string_view target,
                  std::string_view body, int outcome, std::string_view reply = {}) override;
  void add_completion(const CompletionRow& row) override;
  void add_config(const std::string& run, std::string_view format, std::string_view text) override;
  bool has_pending() const {
    return !pending_runs_.empty() || !pending_log_.empty() || !pending_configs_.empty();
  }

  // Snapshots are taken of every run with at least snapshot_every records since its last one.
  std::unique_ptr<JournalBatch> take(const Engine& engine, bool snapshots, TimeMs now) override;
  StoreBatch take_batch(const Engine& engine, bool snapshots = false, TimeMs now = 0);
  // In one transaction.
  Result<void> write(const JournalBatch& batch) override {
    return write_batch(static_cast<const StoreBatch&>(batch));
  }
  Result<void> write_batch(const StoreBatch& batch);
  // Snapshots every run with at least snapshot_every records since its last snapshot, now.
  Result<void> snapshot_due(const Engine& engine, TimeMs now);
  // Snapshots `run` now and drops the log the snapshot covers.
  Result<void> snapshot(const Run& run, TimeMs now);
  Result<void> replace_config(const Run& run, std::string_view format, std::string_view text,
                              TimeMs now) override;

 private:
  Store(StoreOptions options, std::string path, sqlite::Db db, DataDir dir)
      : options_(std::move(options)),
        path_(std::move(path)),
        dir_(std::move(dir)),
        db_(std::move(db)) {}
  Result<void> load_chains();
  Result<void> check_head();
  void write_head(int64_t seq);
  Result<void> prepare_statements();
  void take_run_state(const Run& run, StoreBatch* batch);
  void take_snapshot(const Run& run, TimeMs now, StoreBatch* batch);
  void covered(const std::string& run, int64_t seq);  // a snapshot covers run's rows <= seq
  Result<void> find_untrimmed();

  StoreOptions options_;
  std::string path_;
  DataDir dir_;  // the data dir, open (and locked, read-write) while the store is
  sqlite::Db db_;
  sqlite::Statement insert_run_, insert_record_, insert_completion_, upsert_epoch_, update_run_,
      upsert_snapshot_, delete_log_, delete_epochs_, delete_run_epochs_, begin_, commit_;
  std::unique_ptr<Checkpointer> checkpointer_;  // read-write only; (goes before db_ closes)

  // Engine thread (take() and the buffers): what is not yet taken, and the bookkeeping of
  // what was; db_ and the statements belong to write().
  std::vector<StoreBatch::NewRun> pending_runs_;
  std::vector<StoreBatch::NewRun> pending_configs_;
  struct PendingLog {  // a run's records since the last take(), encoded as its log row holds them
    std::string run;
    std::string records;
    TimeMs time = 0;  // of the last
    uint64_t count = 0;
  };
  std::vector<PendingLog> pending_log_;  // in the order of each run's first record
  std::vector<StoreBatch::CompletionBatch> pending_completions_;  // "[row,row" per run
  JsonWriter row_writer_;  // reused: a completion's row is written without a malloc
  std::set<std::string, std::less<>> touched_;
  std::map<std::string, uint64_t> records_since_snapshot_;
  std::map<std::string, int64_t> last_seq_;
  std::map<std::string, uint64_t, std::less<>> chain_;  // per run: the checksum chain so far
  std::map<std::string, uint64_t> snapshot_chain_;      // saved_runs(): where replay starts
  std::vector<std::string> notices_;
  int lock_fd_ = -1;  // the lock file, held while open (read-write)
  int head_fd_ = -1;
  int64_t head_written_ = 0;
  bool last_write_full_ = false;
  std::map<std::string, size_t> closed_epochs_written_;  // per run: a prefix of closed epochs
  std::map<std::string, uint64_t> restores_seen_;        // per run: its restores when last taken
  bool derive_epochs_ = true;    // the next take() writes the whole epochs table again
  int schema_ = kSchemaVersion;  // of the file (older only when opened read-only)
  int64_t next_seq_ = 1;         // the next log row's number
  int64_t next_batch_id_ = 1;    // write()'s: the next completion_batches row, and the chain
  uint64_t batch_chain_ = 0;     // over the rows so far
  // write()'s: log rows a snapshot covers, to delete (a few per commit), and per run the rows
  // no snapshot covers yet.
  std::deque<int64_t> trim_;
  std::map<std::string, std::deque<int64_t>> untrimmed_;
};

}  // namespace traincoord
