#include "store/checkpointer.h"

#include <cstdio>

namespace traincoord {

Result<std::unique_ptr<Checkpointer>> Checkpointer::start(const std::string& path,
                                                          sqlite3* writer) {
  auto db = sqlite::Db::open(path, /*read_only=*/false, SQLITE_OPEN_NOFOLLOW);
  if (!db) return tl::unexpected(db.error());
  // A connection finds the WAL only when it first reads the database; until then its
  // checkpoints do nothing (and say the database is not in WAL mode).
  if (auto r = db->scalar("SELECT count(*) FROM sqlite_master"); !r) {
    return tl::unexpected(r.error());
  }
  std::unique_ptr<Checkpointer> c(new Checkpointer(std::move(*db)));
  c->writer_ = writer;
  // (replaces SQLite's automatic checkpoint, which is a WAL hook too)
  sqlite3_wal_hook(writer, &Checkpointer::on_commit, c.get());
  c->thread_ = std::thread([p = c.get()] { p->loop(); });
  return c;
}

Checkpointer::~Checkpointer() {
  sqlite3_wal_hook(writer_, nullptr, nullptr);  // (closing the writer still checkpoints)
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

int Checkpointer::on_commit(void* arg, sqlite3* writer, const char*, int frames) {
  auto* self = static_cast<Checkpointer*>(arg);
  if (frames < self->last_frames_) self->next_pass_at_ = kFrames;  // the WAL started over
  self->last_frames_ = frames;
  // Start the WAL over once it is long, when what the passes left to copy is short: a few
  // pages copied right after this commit. Should the passes fall far behind (a disk slower
  // than the writes), wait for the one under way first: the WAL stays bounded, and the
  // writer goes at the disk's pace.
  const bool far_behind = frames >= 2 * kRestartFrames;
  if (far_behind) {
    std::unique_lock lock(self->mu_);
    self->pass_done_.wait(lock, [&] { return !self->in_pass_ || self->stopping_; });
  }
  const int left = frames - self->copied_.load(std::memory_order_acquire);
  if (frames >= kRestartFrames && !self->in_pass_.load(std::memory_order_acquire) &&
      (left <= kFrames / 2 || far_behind)) {
    int wal = 0, copied = 0;
    // (PASSIVE: fails at once, SQLITE_BUSY, if a pass began meanwhile; tried at the next commit)
    const int rc =
        sqlite3_wal_checkpoint_v2(writer, nullptr, SQLITE_CHECKPOINT_PASSIVE, &wal, &copied);
    if (rc == SQLITE_OK && wal >= 0 && copied == wal) {
      self->restarts_.fetch_add(1, std::memory_order_relaxed);
      self->next_pass_at_ = kFrames;
      self->copied_.store(0, std::memory_order_release);
      return SQLITE_OK;
    }
    if (rc != SQLITE_OK && rc != SQLITE_BUSY) self->failed(writer, rc);
  }
  if (frames >= self->next_pass_at_) {
    self->next_pass_at_ = frames + kFrames;
    {
      std::lock_guard lock(self->mu_);
      self->due_ = true;
    }
    self->cv_.notify_one();
  }
  return SQLITE_OK;
}

void Checkpointer::loop() {
  while (true) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return due_ || stopping_; });
      if (stopping_) return;
      due_ = false;
      in_pass_.store(true, std::memory_order_release);
    }
    int wal = 0, copied = 0;
    const int rc =
        sqlite3_wal_checkpoint_v2(db_.raw(), nullptr, SQLITE_CHECKPOINT_PASSIVE, &wal, &copied);
    if (rc == SQLITE_OK && wal >= 0) {
      copied_.store(copied, std::memory_order_release);
      passes_.fetch_add(1, std::memory_order_relaxed);
    } else if (rc != SQLITE_BUSY) {
      failed(db_.raw(), rc);
    }
    {
      std::lock_guard lock(mu_);
      in_pass_.store(false, std::memory_order_release);
    }
    pass_done_.notify_all();
  }
}

void Checkpointer::failed(sqlite3* db, int rc) {
  // Not a loss: the WAL keeps every commit until a checkpoint copies it. Said once per 1,000
  // failures, and tried again at the next pass.
  if (failures_.fetch_add(1, std::memory_order_relaxed) % 1000 == 0) {
    std::fprintf(stderr, "traincoord: checkpoint of the store failed: %s (%s; retried)\n",
                 sqlite3_errmsg(db), sqlite3_errstr(rc));
  }
}

}  // namespace traincoord
