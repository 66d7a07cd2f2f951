// The store's WAL is checkpointed on the checkpointer's thread, stays bounded, and a reader in
// the way of a checkpoint never makes a commit fail.
#include "store/checkpointer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "core/clock.h"
#include "store/store.h"
#include "temp_dir.h"

namespace traincoord {
namespace {

using traincoord::testing::TempDir;

constexpr uintmax_t kPage = 4096;          // SQLite's default page size
const std::string kBody(400 * 1024, 'x');  // ~100 pages a commit

std::unique_ptr<Store> open_store(const std::string& dir) {
  StoreOptions o;
  o.dir = dir;
  o.durability = Durability::kOs;
  auto store = Store::open(o);
  EXPECT_TRUE(store) << store.error().message;
  return std::move(*store);
}

// Commits one large record.
void write_one(Store& store, const Engine& engine, TimeMs t) {
  store.add_record("run", t, RecordKind::kRequest, "/v1/runs/run/complete", kBody, 200);
  auto r = store.commit(engine);
  ASSERT_TRUE(r) << r.error().message;
}

// Waits (at most 60 s: sanitizer builds are slow) until the store has done more than `passes`.
bool wait_for_pass(const Store& store, uint64_t passes) {
  for (int i = 0; i < 6000 && store.checkpoints() <= passes; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return store.checkpoints() > passes;
}

uintmax_t wal_bytes(const std::string& dir) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(dir + "/" + Store::kFileName + "-wal", ec);
  return ec ? 0 : size;
}

TEST(Checkpointer, CopiesTheWalIntoTheDatabaseAndKeepsItBounded) {
  TempDir dir;
  ManualClock clock;
  Engine engine(clock);
  auto store = open_store(dir.path());
  ASSERT_TRUE(store);
  const uintmax_t db_before = std::filesystem::file_size(store->path());
  TimeMs t = 0;
  // Ten passes' worth of pages, a pass at a time.
  for (int round = 0; round < 10; ++round) {
    const uint64_t passes = store->checkpoints();
    for (int i = 0; i < 2000 && store->checkpoints() == passes; ++i) write_one(*store, engine, ++t);
    ASSERT_TRUE(wait_for_pass(*store, passes)) << "no checkpoint after round " << round;
  }
  // The pages are in the database file, and the WAL was started over instead of growing
  // (the writer never waited for a pass to end: a passive one never lets the WAL start over).
  EXPECT_GT(std::filesystem::file_size(store->path()),
            db_before + 8 * Checkpointer::kFrames * kPage);
  // (at most twice kRestartFrames and a pass: this writer writes flat out, faster than the
  // passes copy, and waits for them there)
  EXPECT_LT(wal_bytes(dir.path()),
            (2 * Checkpointer::kRestartFrames + 2 * Checkpointer::kFrames) * kPage);
  EXPECT_GE(store->checkpoint_restarts(), 1u);
  // Everything written is read back.
  store.reset();
  StoreOptions o;
  o.dir = dir.path();
  o.read_only = true;
  auto reader = Store::open(o);
  ASSERT_TRUE(reader);
  TimeMs records = 0;
  ASSERT_TRUE((*reader)->for_each_record([&](const Record& r) -> Result<void> {
    EXPECT_EQ(r.time, ++records);
    EXPECT_EQ(r.body.size(), kBody.size());
    EXPECT_EQ(r.outcome, 200);
    return {};
  }));
  EXPECT_EQ(records, t);
}

TEST(Checkpointer, AReaderInTheWayNeverFailsACommit) {
  TempDir dir;
  ManualClock clock;
  Engine engine(clock);
  auto store = open_store(dir.path());
  ASSERT_TRUE(store);
  // A user's sqlite3 shell in the middle of a read: no checkpoint can pass the pages it sees,
  // and the WAL cannot start over while it reads.
  auto shell = sqlite::Db::open(store->path(), /*read_only=*/true);
  ASSERT_TRUE(shell);
  ASSERT_TRUE(shell->exec("BEGIN; SELECT count(*) FROM log;"));
  TimeMs t = 0;
  const int commits = (Checkpointer::kRestartFrames + 2 * Checkpointer::kFrames) / 100;
  for (int i = 0; i < commits; ++i) write_one(*store, engine, ++t);  // (each must succeed)
  ASSERT_TRUE(shell->exec("COMMIT"));
  // With the reader gone, the checkpoints catch up and the WAL starts over: it is reused from
  // its start, not grown.
  const uintmax_t wal_most = wal_bytes(dir.path());
  EXPECT_GT(wal_most, Checkpointer::kRestartFrames * kPage);  // (the reader held it up)
  for (int i = 0; i < 2000 && store->checkpoint_restarts() == 0; ++i) {
    write_one(*store, engine, ++t);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(store->checkpoint_restarts(), 1u);
  EXPECT_LE(wal_bytes(dir.path()), wal_most + 2 * Checkpointer::kFrames * kPage);
}

}  // namespace
}  // namespace traincoord
