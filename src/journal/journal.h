// What the coordinator needs from durable storage, and nothing else: the seam between the
// coordinator (server/coordinator.h) and where its state is kept. The SQLite store on the data
// dir is one journal (store/store.h); an in-memory one (journal/memory_journal.h) serves the
// server's simulation tests.
//
// What a journal keeps, per run: its config; now and then a snapshot of its whole state
// (core/run_codec.h); every state-changing request since that snapshot, with its time and the
// outcome it was answered with; and, for people to query, the accepted completions and the
// epochs' aggregates. A restart (server/restore.h) loads each snapshot and replays the records
// through the same code at the recorded times: the core is deterministic, so the state comes
// back exactly, and each replayed request must be answered as it was.
//
// Writes are buffered (add_*), taken as one batch per wave of requests (take, on the
// coordinator's thread) and written in one go (write, on the commit pipeline's thread): a reply
// that depends on them goes out only once write() returned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"

namespace traincoord {

enum class RecordKind : int { kRequest = 1, kExpire = 2 };

// A record's outcome: the HTTP status its request was answered with, or one of these.
constexpr int kOutcomeParked = 0;    // an acquire parked (long poll); answered later
constexpr int kOutcomeUnknown = -1;  // written by store schema 3 or older, which kept no outcome

struct Record {
  int64_t seq = 0;  // where the journal keeps it (its log row); for messages
  std::string run;
  TimeMs time = 0;
  RecordKind kind = RecordKind::kRequest;
  int outcome = kOutcomeUnknown;  // kRequest: what it was answered (replay must answer the same)
  std::string target;             // kRequest: the POST's target
  std::string body;               // kRequest: its body
  // kRequest: the reply's body, where the journal keeps it (the in-memory one does; the SQLite
  // store keeps only the status); then replay must reproduce it byte for byte.
  std::optional<std::string> reply;
};

struct SavedRun {
  std::string name;
  std::string config_format;  // "toml/4" or "json/4" (older: config/config_file.h)
  std::string config_text;
  TimeMs created_ms = 0;
  std::optional<std::string> snapshot;
  int64_t snapshot_seq = 0;
};

// An accepted completion, for the journal's query views.
struct CompletionRow {
  std::string_view run;
  uint64_t lease = 0;
  std::string_view worker;
  std::string_view set;
  int64_t epoch = 0;
  uint64_t job = 0;
  double loss = 0;  // non-finite: kept as null
  uint64_t samples = 0;
  const std::vector<Metric>* metrics = nullptr;  // none: {}
  TimeMs time = 0;
};

// What one wave writes, as the journal took it; written in the order taken.
class JournalBatch {
 public:
  virtual ~JournalBatch() = default;
  virtual bool empty() const = 0;
  // Appends `later` (taken after this one, from the same journal).
  virtual void append(JournalBatch&& later) = 0;
};

class Journal {
 public:
  virtual ~Journal() = default;

  // What it is, for messages ("/data/traincoord.db").
  virtual std::string describe() const = 0;

  // -- Replay (before the coordinator starts) --
  // The saved runs, with their latest snapshot.
  virtual Result<std::vector<SavedRun>> saved_runs() = 0;
  // Calls `fn` for every record not covered by its run's snapshot, in the order written;
  // stops at the first error (a damaged or missing record, or one `fn` returns).
  virtual Result<void> for_each_record(const std::function<Result<void>(const Record&)>& fn) = 0;
  // The latest time recorded anywhere (0 for a new journal).
  virtual Result<TimeMs> latest_time() = 0;
  // What opening it found that the operator must hear of (lost commits), once.
  virtual std::vector<std::string> take_notices() { return {}; }

  // -- Recording (the coordinator's thread), buffered until take() --
  virtual void add_run(const std::string& name, std::string_view format, std::string_view text,
                       TimeMs created) = 0;
  // `reply`: the body the request was answered with (kept only by journals that check it).
  virtual void add_record(std::string_view run, TimeMs time, RecordKind kind,
                          std::string_view target, std::string_view body, int outcome,
                          std::string_view reply = {}) = 0;
  virtual void add_completion(const CompletionRow& row) = 0;
  // Replaces a run's config from here on (a live change: POST /v1/runs/{run}/config). take()
  // adds a snapshot of the run as it is then, written with the config in one write: no replay
  // reads a record of the old config under the new one, nor starts from a snapshot of the new
  // config under the old one.
  virtual void add_config(const std::string& run, std::string_view format,
                          std::string_view text) = 0;

  // Takes everything buffered, with the epochs and states of the runs it touched (read from
  // `engine`); with `snapshots`, also snapshots of runs whose log grew long. Cheap: no I/O.
  virtual std::unique_ptr<JournalBatch> take(const Engine& engine, bool snapshots, TimeMs now) = 0;
  // Writes a batch, all of it or nothing. Batches are written in the order taken, one at a
  // time, possibly on another thread than take(). An error means durability is broken (the
  // caller must stop rather than reply), unless last_write_was_full().
  [[nodiscard]] virtual Result<void> write(const JournalBatch& batch) = 0;
  // take() + write(): writes everything buffered now.
  [[nodiscard]] Result<void> commit(const Engine& engine) { return write(*take(engine, false, 0)); }
  // Replaces a run's config (after the user asked to apply a changed one), with a snapshot.
  [[nodiscard]] virtual Result<void> replace_config(const Run& run, std::string_view format,
                                                    std::string_view text, TimeMs now) = 0;

  // Whether a write() takes no sync and no network (a few microseconds): the commit pipeline
  // may then write a wave on the engine's own thread rather than hand it to its store thread.
  virtual bool writes_are_quick() const { return false; }

  // -- Room (the commit pipeline's thread) --
  // Whether it is short of room: then the coordinator takes no new work (503) until it is not.
  virtual bool low_on_room() const { return false; }
  // Whether the last write() failed for want of room: nothing of it was written, and the same
  // batch may be written again once there is room.
  virtual bool last_write_was_full() const { return false; }
  // The room it keeps in reserve, for messages (0: none).
  virtual uint64_t reserve_bytes() const { return 0; }

  // Leadership per run (journal/etcd_run_journal.h): the runs whose leadership a write ended,
  // with why and the term of that leadership, and the runs created here whose first write gave
  // them a term; taken once, by the commit thread. Other journals have no leadership: none.
  struct LostRun {
    std::string run;
    std::string why;
    int64_t term = 0;  // of the leadership that ended (0: created here, never written)
  };
  virtual std::vector<LostRun> take_lost_runs() { return {}; }
  virtual std::vector<std::pair<std::string, int64_t>> take_won_runs() { return {}; }

  // Its own series for GET /metrics, in the Prometheus text format (any thread).
  virtual void append_metrics(std::string& /*out*/) const {}
};

}  // namespace traincoord
