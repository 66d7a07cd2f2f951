// Checkpoints the store's WAL on a thread (and a SQLite connection) of its own, instead of in
// the commit that happens to fill it.
//
// SQLite's automatic checkpoint runs inside the COMMIT that takes the WAL past 1,000 pages: it
// copies them into the database and syncs both files, and every reply waiting for that commit
// waits for it too. Measured with bench/loadgen (64 workers, durability "os", 2 jobs per
// request): p99 8.6-9.7 ms with it, 3.2-4.3 ms with no checkpoint at all (docs/PERFORMANCE.md).
// Here the writer only reports the WAL's size after each commit (SQLite's WAL hook) and this
// thread copies the pages meanwhile, with PASSIVE checkpoints: they never hold the writer up.
//
// The WAL starts over from its beginning only at a write that finds it wholly copied, which a
// writer that keeps writing while the passes run never does. So once the WAL is past
// kRestartFrames pages, the writer itself copies the few pages written since the last pass,
// right after a commit (a PASSIVE checkpoint of its own connection, as SQLite's automatic one
// is): its next write starts the WAL over, and the WAL stays bounded under any load. A reader
// in the middle of a read (a user's sqlite3 shell, say) keeps the WAL from starting over, as
// it always did; no checkpoint ever waits for it.
#pragma once

#include <sqlite3.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"
#include "store/sqlite.h"

namespace traincoord {

class Checkpointer {
 public:
  static constexpr int kFrames = 1000;                // a pass once this many pages are new
  static constexpr int kRestartFrames = 4 * kFrames;  // then the WAL starts over (16 MiB)

  // Takes over checkpointing of `writer` (the connection that writes `path`), with a
  // connection of its own to the same file.
  static Result<std::unique_ptr<Checkpointer>> start(const std::string& path, sqlite3* writer);
  // Stops the thread (after the pass under way, if any).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Passes done on the checkpointer's thread, times the writer started the WAL over, and
  // checkpoints that failed (for metrics and tests).
  uint64_t passes() const { return passes_.load(std::memory_order_relaxed); }
  uint64_t restarts() const { return restarts_.load(std::memory_order_relaxed); }
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  explicit Checkpointer(sqlite::Db db) : db_(std::move(db)) {}
  static int on_commit(void* self, sqlite3* writer, const char*, int frames);  // writer's thread
  void loop();
  void failed(sqlite3* db, int rc);

  sqlite::Db db_;  // this thread's only
  sqlite3* writer_ = nullptr;
  // The writer's only (the WAL hook; the thread that writes, one at a time: the server's store
  // thread or its engine): the WAL's size after its last commit, and the size at which a
  // commit asks for the next pass.
  int last_frames_ = 0;
  int next_pass_at_ = kFrames;
  std::atomic<int> copied_{0};        // pages of the WAL the last pass left copied
  std::atomic<bool> in_pass_{false};  // set under mu_
  std::atomic<uint64_t> passes_{0}, restarts_{0}, failures_{0};
  std::mutex mu_;
  std::condition_variable cv_;         // a pass is due
  std::condition_variable pass_done_;  // (for a writer far ahead)
  bool due_ = false;                   // guarded by mu_, as stopping_
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace traincoord
