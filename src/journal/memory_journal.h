// A journal in memory: what the server's simulation tests write to, crash, and restore from.
// It keeps what the SQLite store keeps for replay (configs, records with their outcomes, and
// snapshots that cover the records before them) plus each request's reply body, so that a
// restore checks the replies byte for byte; it keeps no query views (completions, epochs),
// only their counts. Not for production: nothing survives the process.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "journal/journal.h"

namespace traincoord {

class MemoryJournal final : public Journal {
 public:
  // A run's records are covered by a snapshot (and dropped) every `snapshot_every` of them.
  explicit MemoryJournal(uint64_t snapshot_every = 1000);
  ~MemoryJournal() override;

  std::string describe() const override { return "the in-memory journal"; }
  Result<std::vector<SavedRun>> saved_runs() override;
  Result<void> for_each_record(const std::function<Result<void>(const Record&)>& fn) override;
  Result<TimeMs> latest_time() override;

  void add_run(const std::string& name, std::string_view format, std::string_view text,
               TimeMs created) override;
  void add_record(std::string_view run, TimeMs time, RecordKind kind, std::string_view target,
                  std::string_view body, int outcome, std::string_view reply = {}) override;
  void add_completion(const CompletionRow& row) override;
  void add_config(const std::string& run, std::string_view format, std::string_view text) override;
  std::unique_ptr<JournalBatch> take(const Engine& engine, bool snapshots, TimeMs now) override;
  Result<void> write(const JournalBatch& batch) override;
  Result<void> replace_config(const Run& run, std::string_view format, std::string_view text,
                              TimeMs now) override;

  // Out of room (for tests): low_on_room() says so, and write() fails as a full disk does.
  void set_full(bool full) { full_ = full; }
  bool low_on_room() const override { return full_; }
  bool last_write_was_full() const override { return last_write_full_; }

  // The process died: what was added or taken but not written is gone. (A batch taken and not
  // yet written is the caller's; it must not be written after this.)
  void crash();

  // What is written (for tests).
  uint64_t records_written() const { return records_written_; }
  uint64_t completions_written() const { return completions_written_; }
  uint64_t snapshots_written() const { return snapshots_written_; }
  uint64_t writes() const { return writes_; }

 private:
  struct Saved {
    SavedRun run;
    std::vector<Record> records;  // after its snapshot, in order
  };
  class Batch;

  uint64_t snapshot_every_;
  bool full_ = false;
  bool last_write_full_ = false;
  // Written.
  std::map<std::string, Saved, std::less<>> saved_;
  std::vector<std::string> order_;  // run names, in the order created
  int64_t written_seq_ = 0;         // the last record written
  TimeMs snapshot_time_ = 0;        // the latest snapshot's time
  uint64_t records_written_ = 0, completions_written_ = 0, snapshots_written_ = 0, writes_ = 0;
  // Added, not yet taken.
  std::unique_ptr<Batch> pending_;
  // Taken (the coordinator's thread).
  int64_t next_seq_ = 1;
  std::map<std::string, uint64_t, std::less<>> since_snapshot_;
  std::map<std::string, int64_t, std::less<>> last_seq_;
};

}  // namespace traincoord
