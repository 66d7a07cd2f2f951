#include "store/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/run_codec.h"
#include "store/data_dir.h"

namespace traincoord {

namespace {

constexpr int64_t kApplicationId = 0x54435244;  // "TCRD", in the database header

// Every accepted completion, one row per job and epoch (loss NULL: a non-finite loss; metrics:
// a JSON object), as schema 2 kept them in a table.
const char* kCompletionsView =
    "CREATE VIEW completions AS SELECT b.run AS run, json_extract(c.value, '$[0]') AS lease, "
    "json_extract(c.value, '$[1]') AS worker, json_extract(c.value, '$[2]') AS set_name, "
    "json_extract(c.value, '$[3]') AS epoch, json_extract(c.value, '$[4]') AS job, "
    "json_extract(c.value, '$[5]') AS loss, json_extract(c.value, '$[6]') AS samples, "
    "json_extract(c.value, '$[7]') AS metrics, json_extract(c.value, '$[8]') AS time_ms "
    "FROM completion_batches b, json_each(b.rows) c;";

// The completions the run's lineage counts (schema 5): of each job, its latest completion. A
// restore of a cut withdraws the completions made after the cut; the jobs are trained again,
// and their new completions replace the withdrawn ones here (`completions` keeps them all).
const char* kCountedCompletionsView =
    "CREATE VIEW counted_completions AS SELECT run, lease, worker, set_name, epoch, job, loss, "
    "samples, metrics, time_ms FROM (SELECT *, row_number() OVER (PARTITION BY run, set_name, "
    "epoch, job ORDER BY lease DESC) AS nth FROM completions) WHERE nth = 1;";

// Checksums (schema 4; schema 5 fills those schema 3 left NULL, and reads a NULL as damage):
// completion_batches.sum (schema 5), a chain over all its rows in id order (batch_sum; its
// `rows` are JSON: [[lease, worker, set, epoch, job, loss, samples, metrics, time_ms], ...]);
// runs.sum, of the config
// (config_sum); snapshots.chain, the run's checksum chain at `seq`, and snapshots.sum, of the
// state (snapshot_sum); log.sum, the run's chain through that row (row_sum). (Comments stay
// off those columns' lines: ALTER TABLE ... DROP COLUMN trips on them.)
const char* kSchema = R"(
CREATE TABLE runs (
  name TEXT PRIMARY KEY,
  config_format TEXT NOT NULL,       -- 'toml' or 'json'
  config TEXT NOT NULL,              -- the run config as the user gave it
  created_ms INTEGER NOT NULL,
  state TEXT NOT NULL DEFAULT 'running',
  reason TEXT NOT NULL DEFAULT '',
  sum INTEGER
);
CREATE TABLE snapshots (             -- the whole state of a run, as of log record `seq`
  run TEXT PRIMARY KEY REFERENCES runs(name),
  seq INTEGER NOT NULL,
  time_ms INTEGER NOT NULL,
  state BLOB NOT NULL,
  chain INTEGER,
  sum INTEGER
);
CREATE TABLE log (                   -- every state-changing request since the snapshot:
  seq INTEGER PRIMARY KEY,           -- one row per run and commit; increasing, never reused
  run TEXT NOT NULL,
  time_ms INTEGER NOT NULL,          -- of its last record
  records BLOB NOT NULL,             -- its records, in order (encode_record below)
  sum INTEGER
);
CREATE TABLE completion_batches (    -- the accepted completions of a run, a commit's per row:
  id INTEGER PRIMARY KEY,            -- (read them through the view `completions` below)
  run TEXT NOT NULL,
  rows TEXT NOT NULL,
  sum INTEGER
);
CREATE TABLE epochs (
  run TEXT NOT NULL,
  set_name TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  jobs INTEGER NOT NULL,
  done INTEGER NOT NULL,
  failed INTEGER NOT NULL,
  closed INTEGER NOT NULL,
  loss REAL,
  samples INTEGER NOT NULL,
  nonfinite_jobs INTEGER NOT NULL,
  PRIMARY KEY (run, set_name, epoch)
);
CREATE VIEW losses AS
  SELECT run, epoch,
         MAX(CASE WHEN set_name = 'train' THEN loss END) AS train_loss,
         MAX(CASE WHEN set_name = 'dev' THEN loss END) AS dev_loss
  FROM epochs WHERE closed GROUP BY run, epoch;
)";

// Schema 2 keeps a commit's records of a run in one log row, and completions without a rowid
// (one B-tree instead of a table and its primary-key index). Schema 1 had a row per record
// (AUTOINCREMENT, an index by run) and a rowid table: measured with bench/loadgen, 64 workers,
// durability "os", its SQLite work was ~16 us a request (docs/PERFORMANCE.md). Schema 3 keeps
// a commit's completions of a run in one row too (JSON, read through the view `completions`):
// a row per completion was the store thread's largest cost left, ~2.5 of its ~7.5 us a job.
// Schema 4 keeps what each request was answered (replay must answer the same, or the restart
// stops) and a checksum chain per run: each log row's sum covers the row and the sum before it
// (the snapshot's `chain` where the log starts), so a changed, lost or reordered row is found.
// A record in a log row: kind (1 byte), time (8), [schema 4: outcome (2)], target length (4)
// and bytes, body length (4) and bytes; integers little-endian as x86 and ARM store them.
void put_u32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void encode_record(std::string* out, RecordKind kind, TimeMs time, std::string_view target,
                   std::string_view body, int outcome, bool with_outcome = true) {
  out->push_back(static_cast<char>(kind));
  out->append(reinterpret_cast<const char*>(&time), 8);
  if (with_outcome) {
    const uint16_t o = outcome < 0 ? 0xFFFF : static_cast<uint16_t>(outcome);
    out->append(reinterpret_cast<const char*>(&o), 2);
  }
  put_u32(out, static_cast<uint32_t>(target.size()));
  out->append(target);
  put_u32(out, static_cast<uint32_t>(body.size()));
  out->append(body);
}

// XXH3 (Debian's libxxhash): a fast 64-bit hash, to find damage (not an attacker who can write
// the database: they could write the sums too).
uint64_t row_sum(uint64_t before, int64_t seq, std::string_view run, TimeMs time,
                 std::string_view records) {
  const int64_t head[2] = {seq, time};
  uint64_t h = XXH3_64bits_withSeed(head, sizeof head, before);
  h = XXH3_64bits_withSeed(run.data(), run.size(), h);
  return XXH3_64bits_withSeed(records.data(), records.size(), h);
}
uint64_t snapshot_sum(uint64_t chain, int64_t seq, std::string_view state) {
  return XXH3_64bits_withSeed(state.data(), state.size(), chain ^ static_cast<uint64_t>(seq));
}
uint64_t config_sum(std::string_view name, std::string_view format, std::string_view text) {
  uint64_t h = XXH3_64bits_withSeed(name.data(), name.size(), 0);
  h = XXH3_64bits_withSeed(format.data(), format.size(), h);
  return XXH3_64bits_withSeed(text.data(), text.size(), h);
}
uint64_t batch_sum(uint64_t before, int64_t id, std::string_view run, std::string_view rows) {
  uint64_t h = XXH3_64bits_withSeed(&id, sizeof id, before);
  h = XXH3_64bits_withSeed(run.data(), run.size(), h);
  return XXH3_64bits_withSeed(rows.data(), rows.size(), h);
}
// SQLite keeps signed 64-bit integers.
int64_t as_int(uint64_t v) { return static_cast<int64_t>(v); }

// Decodes the records of a log row; false if it is damaged.
bool decode_records(std::string_view in, bool with_outcome, Record* r, Result<void>* stopped,
                    const std::function<Result<void>(const Record&)>& fn) {
  auto take = [&](void* to, size_t n) {
    if (in.size() < n) return false;
    std::memcpy(to, in.data(), n);
    in.remove_prefix(n);
    return true;
  };
  auto take_text = [&](std::string* to) {
    uint32_t n = 0;
    if (!take(&n, 4) || in.size() < n) return false;
    to->assign(in.data(), n);
    in.remove_prefix(n);
    return true;
  };
  while (!in.empty()) {
    uint8_t kind = 0;
    uint16_t outcome = 0xFFFF;
    if (!take(&kind, 1) || !take(&r->time, 8) || (with_outcome && !take(&outcome, 2)) ||
        !take_text(&r->target) || !take_text(&r->body)) {
      return false;
    }
    if (kind != static_cast<uint8_t>(RecordKind::kRequest) &&
        kind != static_cast<uint8_t>(RecordKind::kExpire)) {
      return false;
    }
    r->kind = static_cast<RecordKind>(kind);
    r->outcome = outcome == 0xFFFF ? kOutcomeUnknown : outcome;
    if (auto done = fn(*r); !done) {
      *stopped = std::move(done);
      return true;
    }
  }
  return true;
}

// Schema 1 -> 2, in one transaction: each old log row becomes a row of one record (same seq),
// completions are copied into the table without rowid.
Result<void> migrate_from_1(sqlite::Db& db) {
  if (auto r = db.exec("BEGIN; CREATE TABLE log2 (seq INTEGER PRIMARY KEY, run TEXT NOT NULL, "
                       "time_ms INTEGER NOT NULL, records BLOB NOT NULL)");
      !r) {
    return r;
  }
  auto fail = [&](Error e) -> Result<void> {
    (void)db.exec("ROLLBACK");  // dropped: the error returned is the one to report
    return tl::unexpected(std::move(e));
  };
  auto read = db.prepare("SELECT seq, run, time_ms, kind, target, body FROM log ORDER BY seq");
  auto write = db.prepare("INSERT INTO log2 (seq, run, time_ms, records) VALUES (?,?,?,?)");
  if (!read) return fail(read.error());
  if (!write) return fail(write.error());
  while (true) {
    auto row = read->step();
    if (!row) return fail(row.error());
    if (!*row) break;
    Record rec;
    rec.time = read->int64(2);
    rec.kind = static_cast<RecordKind>(read->int64(3));
    rec.target = read->text(4);
    rec.body = read->text(5);
    std::string blob;
    encode_record(&blob, rec.kind, rec.time, rec.target, rec.body, kOutcomeUnknown,
                  /*with_outcome=*/false);
    write->bind(1, read->int64(0)).bind(2, read->text(1)).bind(3, rec.time).bind_blob(4, blob);
    if (auto r = write->run(); !r) return fail(r.error());
  }
  if (auto r = db.exec(
          "DROP TABLE log; ALTER TABLE log2 RENAME TO log;"
          "CREATE TABLE completions2 (run TEXT NOT NULL, lease INTEGER NOT NULL, worker TEXT NOT "
          "NULL, set_name TEXT NOT NULL, epoch INTEGER NOT NULL, job INTEGER NOT NULL, loss REAL, "
          "samples INTEGER NOT NULL, metrics TEXT, time_ms INTEGER NOT NULL, "
          "PRIMARY KEY (run, lease)) WITHOUT ROWID;"
          "INSERT INTO completions2 SELECT run, lease, worker, set_name, epoch, job, loss, "
          "samples, metrics, time_ms FROM completions;"
          "DROP TABLE completions; ALTER TABLE completions2 RENAME TO completions;"
          "PRAGMA user_version=2; COMMIT");
      !r) {
    return fail(r.error());
  }
  return {};
}

// Schema 2 -> 3, in one transaction: the completions table becomes rows of up to 4,096
// completions each, behind a view of the same name and columns.
Result<void> migrate_from_2(sqlite::Db& db) {
  if (auto r = db.exec(
          std::string("BEGIN;"
                      "CREATE TABLE completion_batches (id INTEGER PRIMARY KEY, run TEXT NOT NULL, "
                      "rows TEXT NOT NULL);"
                      // (by hand, not json_array: that writes a loss with 15 digits only)
                      "INSERT INTO completion_batches (run, rows) SELECT run, '[' || "
                      "group_concat('[' || lease || ',' || json_quote(worker) || ',' || "
                      "json_quote(set_name) || ',' || epoch || ',' || job || ',' || "
                      "coalesce(printf('%!.17g', loss), 'null') || ',' || samples || ',' || "
                      "coalesce(metrics, '{}') || ',' || time_ms || ']', ',') || ']' FROM "
                      "(SELECT * FROM completions ORDER BY run, lease) GROUP BY run, lease / 4096;"
                      "DROP TABLE completions;") +
          kCompletionsView + "PRAGMA user_version=3; COMMIT");
      !r) {
    (void)db.exec("ROLLBACK");  // dropped: the error returned is the one to report
    return r;
  }
  return {};
}

// Schema 3 -> 4: checksums (NULL for what schema 3 wrote: read as it is, unchecked).
Result<void> migrate_from_3(sqlite::Db& db) {
  if (auto r = db.exec("BEGIN; ALTER TABLE runs ADD COLUMN sum INTEGER;"
                       "ALTER TABLE snapshots ADD COLUMN chain INTEGER;"
                       "ALTER TABLE snapshots ADD COLUMN sum INTEGER;"
                       "ALTER TABLE log ADD COLUMN sum INTEGER; PRAGMA user_version=4; COMMIT");
      !r) {
    (void)db.exec("ROLLBACK");  // dropped: the error returned is the one to report
    return r;
  }
  return {};
}

// Schema 4 -> 5, in one transaction: every checksum filled in where schema 3 left it NULL
// (schema 5 reads a NULL where a checksum belongs as damage: one rule for every table), the
// log rows schema 3 wrote re-encoded as schema 4 writes them (with outcomes, unknown), each
// run's chain made whole again from its snapshot, and a chain over completion_batches. Rows
// that carry a checksum are checked first, as a start would: a migration blesses no damage.
Result<void> migrate_from_4(sqlite::Db& db) {
  if (auto r = db.exec(std::string("BEGIN; ALTER TABLE completion_batches ADD COLUMN sum "
                                   "INTEGER;") +
                       kCountedCompletionsView);
      !r) {
    (void)db.exec("ROLLBACK");  // dropped: the error returned is the one to report
    return r;
  }
  auto fail = [&](Error e) -> Result<void> {
    (void)db.exec("ROLLBACK");  // dropped: the error returned is the one to report
    return tl::unexpected(std::move(e));
  };
  auto each = [&](const std::string& sql,
                  const std::function<Result<void>(sqlite::Statement&)>& fn) -> Result<void> {
    auto stmt = db.prepare(sql);
    if (!stmt) return tl::unexpected(stmt.error());
    while (true) {
      auto row = stmt->step();
      if (!row) return tl::unexpected(row.error());
      if (!*row) return {};
      if (auto r = fn(*stmt); !r) {
        stmt->reset();
        return r;
      }
    }
  };
  auto update = [&](const std::string& sql) { return db.prepare(sql); };
  auto set_run = update("UPDATE runs SET sum = ? WHERE name = ?");
  auto set_snapshot = update("UPDATE snapshots SET chain = ?, sum = ? WHERE run = ?");
  auto set_row = update("UPDATE log SET records = ?, sum = ? WHERE seq = ?");
  auto set_batch = update("UPDATE completion_batches SET sum = ? WHERE id = ?");
  for (auto* s : {&set_run, &set_snapshot, &set_row, &set_batch}) {
    if (!*s) return fail(s->error());
  }
  auto r = each("SELECT name, config_format, config FROM runs WHERE sum IS NULL",
                [&](sqlite::Statement& row) {
                  return set_run->bind(1, as_int(config_sum(row.text(0), row.text(1), row.text(2))))
                      .bind(2, row.text(0))
                      .run();
                });
  if (!r) return fail(r.error());
  r = each("SELECT run, seq, state, coalesce(chain, 0) FROM snapshots WHERE sum IS NULL",
           [&](sqlite::Statement& row) {
             const int64_t chain = row.int64(3);
             const uint64_t sum =
                 snapshot_sum(static_cast<uint64_t>(chain), row.int64(1), row.blob(2));
             return set_snapshot->bind(1, chain).bind(2, as_int(sum)).bind(3, row.text(0)).run();
           });
  if (!r) return fail(r.error());
  struct Chain {
    uint64_t old_before = 0, new_before = 0;
    bool rewriting = false;
  };
  std::map<std::string, Chain> chains;
  r = each("SELECT run, chain FROM snapshots", [&](sqlite::Statement& row) {
    chains[row.text(0)] = {static_cast<uint64_t>(row.int64(1)), static_cast<uint64_t>(row.int64(1)),
                           false};
    return Result<void>{};
  });
  if (!r) return fail(r.error());
  r = each(
      "SELECT l.seq, l.run, l.time_ms, l.records, l.sum FROM log l LEFT JOIN snapshots s ON "
      "s.run = l.run WHERE l.seq > coalesce(s.seq, 0) ORDER BY l.seq",
      [&](sqlite::Statement& row) -> Result<void> {
        const int64_t seq = row.int64(0);
        const std::string run = row.text(1);
        const TimeMs time = row.int64(2);
        std::string records = row.blob(3);
        Chain& c = chains[run];
        if (row.is_null(4)) {  // schema 3's encoding
          std::string encoded;
          Record rec;
          Result<void> stopped;
          if (!decode_records(records, false, &rec, &stopped, [&](const Record& x) {
                encode_record(&encoded, x.kind, x.time, x.target, x.body, kOutcomeUnknown);
                return Result<void>{};
              })) {
            return failed_precondition("log row " + std::to_string(seq) + " of run " + run +
                                       " is malformed");
          }
          records = std::move(encoded);
          c.old_before = 0;
          c.rewriting = true;
        } else {
          if (as_int(row_sum(c.old_before, seq, run, time, records)) != row.int64(4)) {
            return failed_precondition("log row " + std::to_string(seq) + " of run " + run +
                                       " fails its checksum");
          }
          c.old_before = static_cast<uint64_t>(row.int64(4));
          if (!c.rewriting) {
            c.new_before = c.old_before;
            return {};
          }
        }
        c.new_before = row_sum(c.new_before, seq, run, time, records);
        return set_row->bind_blob(1, records).bind(2, as_int(c.new_before)).bind(3, seq).run();
      });
  if (!r) return fail(r.error());
  uint64_t before = 0;
  r = each("SELECT id, run, rows FROM completion_batches ORDER BY id", [&](sqlite::Statement& row) {
    before = batch_sum(before, row.int64(0), row.text(1), row.text(2));
    return set_batch->bind(1, as_int(before)).bind(2, row.int64(0)).run();
  });
  if (!r) return fail(r.error());
  if (auto done = db.exec("PRAGMA user_version=5; COMMIT"); !done) return fail(done.error());
  return {};
}

uint64_t free_bytes_at(const std::string& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return UINT64_MAX;  // unknown: not low
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

tl::unexpected<Error> refuse(const std::string& path, const std::string& why) {
  return failed_precondition(path + ": " + why +
                             ". traincoord did not change it; point --data-dir elsewhere, or "
                             "move the file away to start afresh");
}

// Why SQLite could not read the database at `path` (SQLite's extended result code `rc`, its
// message `why`): only a file that is not a database, or a damaged one, is called so; a file
// traincoord may not read, a disk it may not write, a lock held are said as they are, and the
// database is not to be moved away for them.
tl::unexpected<Error> refuse_unreadable(const DataDir& dir, int rc, const std::string& why,
                                        bool read_only) {
  const std::string name = dir.path_of(Store::kFileName);
  // First what the file system says (SQLite often says only "unable to open database file").
  const int fd = ::openat(dir.fd(), Store::kFileName, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return failed_precondition(
        "cannot read " + name + " (" + std::strerror(err) + ")" +
        (err == EACCES || err == EPERM
             ? ": run traincoord as the user that owns it, or give this user read access; the "
               "database is not known to be damaged, do not move it away"
             : std::string()));
  }
  char header[16] = {};
  const ssize_t n = ::pread(fd, header, sizeof header, 0);
  ::close(fd);
  if (n > 0 && (n < 16 || std::memcmp(header, "SQLite format 3", 16) != 0)) {
    return refuse(name, "not a SQLite database (" + why + ")");
  }
  const int primary = rc & 0xFF;
  struct statvfs fs {};
  const bool ro_fs = ::fstatvfs(dir.fd(), &fs) == 0 && (fs.f_flag & ST_RDONLY) != 0;
  const bool dir_writable = ::faccessat(dir.fd(), ".", W_OK, AT_EACCESS) == 0;
  if (primary == SQLITE_CANTOPEN || primary == SQLITE_READONLY || primary == SQLITE_PERM ||
      primary == SQLITE_AUTH || (read_only && (ro_fs || !dir_writable))) {
    if (ro_fs || !dir_writable) {
      return failed_precondition(
          "cannot read " + name + " (" + why + "): it is in WAL mode, and SQLite needs its " +
          Store::kFileName + "-shm file to read the commits still in " + Store::kFileName +
          "-wal, but " + dir.path() +
          (ro_fs ? " is on a read-only file system" : " is not writable by this user") +
          ". The database is not known to be damaged, do not move it away: copy the data dir "
          "somewhere writable (cp -a " +
          dir.path() +
          " COPY) and run traincoord inspect --data-dir COPY, or remount it read-write");
    }
    return failed_precondition("cannot open " + name + " (" + why +
                               "): check that this user may read and write it and its -wal and "
                               "-shm files; the database is not known to be damaged");
  }
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) {
    return failed_precondition(name + " is locked by another process (" + why +
                               "): try again once it is done; the database is not damaged");
  }
  if (primary == SQLITE_IOERR) {
    return failed_precondition("an I/O error reading " + name + " (" + why +
                               "): check the disk (dmesg); traincoord did not change the file");
  }
  if (primary == SQLITE_NOTADB) return refuse(name, "not a SQLite database (" + why + ")");
  return refuse(name, "a damaged SQLite database (" + why + ")");
}

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const StoreOptions& options) {
  std::error_code ec;
  if (!options.read_only) {
    // Made 0700: the data dir holds the runs' state and is the default token dir
    // (docs/SECURITY.md). Its missing parents are made as usual; an existing dir is kept as is.
    std::filesystem::path dir = std::filesystem::path(options.dir).lexically_normal();
    if (!dir.has_filename()) dir = dir.parent_path();
    if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ec);
    if (!ec && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      ec = std::error_code(errno, std::generic_category());
    }
  }
  if (ec) return failed_precondition("cannot create data dir " + options.dir + ": " + ec.message());
  // The data dir is opened once, and every file in it is opened relative to that descriptor,
  // without following links (data_dir.h): a link planted in it is refused, never written
  // through. The links on the way to the dir are the operator's choice and are followed (once,
  // here: SQLite is given the resolved path, with SQLITE_OPEN_NOFOLLOW for its last part).
  auto dir = DataDir::open(options.dir, options.read_only);
  if (!dir) return tl::unexpected(dir.error());
  // One writer per data dir: a second server (or launch) on it is refused here, before it
  // reads anything (two writers would interleave their logs). The lock is held on the data
  // dir itself (flock on its descriptor): unlike a file in it, the dir cannot be unlinked or
  // swapped under a running server. It goes with the process, also when it is killed.
  int lock_fd = -1;
  if (!options.read_only) {
    if (auto r = dir->lock(kLockFileName); !r) return tl::unexpected(r.error());
    // traincoord.lock keeps the holder's pid, for the message above; older versions locked it
    // alone, so it is locked too (a server of an older version on the same dir is refused).
    // Opening it for writing also finds a read-only disk.
    int err = 0;
    auto lock_file = dir->open_file(kLockFileName, O_RDWR | O_CREAT, 0600, true, &err);
    if (!lock_file) {
      if (err == EROFS || err == EACCES || err == EPERM) {
        return failed_precondition("cannot write in data dir " + options.dir + " (" +
                                   std::strerror(err) +
                                   "): traincoord needs to write there; for a read-only look "
                                   "at its runs, use `traincoord inspect`");
      }
      return tl::unexpected(lock_file.error());
    }
    lock_fd = *lock_file;
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(lock_fd);
      return failed_precondition("data dir " + options.dir +
                                 " is in use by an older traincoord process (it holds " +
                                 kLockFileName +
                                 "): stop it first, or give this one another "
                                 "--data-dir");
    }
    const uint64_t free = free_bytes_at(options.dir);
    const std::string pid = std::to_string(::getpid()) + "\n";
    const bool written =
        ::ftruncate(lock_fd, 0) == 0 &&
        ::pwrite(lock_fd, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size());
    if (!written || free < options.min_free_bytes) {
      const int err = errno;
      ::close(lock_fd);
      return failed_precondition(
          "the disk holding data dir " + options.dir + " is full or nearly (" +
          (written ? mib(free) + " free" : std::string(std::strerror(err))) +
          "; traincoord keeps " + mib(options.min_free_bytes) +
          " free so that what it accepted can always be written): free some space, or set "
          "--min-free-disk lower");
    }
  }
  struct LockGuard {  // released on every refusal below; the store takes it at the end
    int fd;
    ~LockGuard() {
      if (fd >= 0) ::close(fd);
    }
  } lock{lock_fd};
  // SQLite opens its own files by name: the database with SQLITE_OPEN_NOFOLLOW, its -wal,
  // -shm and -journal as they are. Each of them that exists must be a regular file (of the
  // user's, read-write) with one link, checked here before SQLite opens any.
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    if (auto r = dir->check_existing(std::string(kFileName) + suffix, !options.read_only); !r) {
      return tl::unexpected(r.error());
    }
  }
  const std::string path = dir->resolved() + "/" + kFileName;
  const bool existed = dir->exists(kFileName);
  if (options.read_only && !existed) {
    return not_found("no traincoord database at " + options.dir + "/" + kFileName);
  }
  int open_rc = SQLITE_OK;
  auto db = sqlite::Db::open(path, options.read_only, SQLITE_OPEN_NOFOLLOW, &open_rc);
  if (!db) return refuse_unreadable(*dir, open_rc, db.error().message, options.read_only);

  // Read the header before anything writes: a file that is not ours is never touched.
  auto app_id = db->scalar("PRAGMA application_id");
  if (!app_id && options.read_only && open_rc == SQLITE_OK) {
    // A read-only look may find it on a read-only disk, where SQLite cannot make the -shm file
    // a WAL database is read with: without a -wal file (a server that stopped cleanly leaves
    // none) the database file is all there is, and is read as immutable.
    const int rc = sqlite3_extended_errcode(db->raw());
    if (!dir->exists(std::string(kFileName) + "-wal")) {
      auto immutable = sqlite::Db::open("file:" + path + "?immutable=1", true,
                                        SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_URI);
      if (immutable) {
        auto id = immutable->scalar("PRAGMA application_id");
        if (id) {
          db = std::move(immutable);
          app_id = std::move(id);
        }
      }
    }
    if (!app_id) return refuse_unreadable(*dir, rc, app_id.error().message, true);
  }
  if (!app_id) {
    return refuse_unreadable(*dir, sqlite3_extended_errcode(db->raw()), app_id.error().message,
                             options.read_only);
  }
  auto tables = db->scalar("SELECT count(*) FROM sqlite_master");
  if (!tables) {
    return refuse_unreadable(*dir, sqlite3_extended_errcode(db->raw()), tables.error().message,
                             options.read_only);
  }
  const bool fresh = std::stoll(*tables) == 0 && std::stoll(*app_id) == 0;
  int schema = kSchemaVersion;
  if (!fresh) {
    if (std::stoll(*app_id) != kApplicationId) {
      return refuse(path, "a SQLite database that traincoord did not write");
    }
    auto version = db->scalar("PRAGMA user_version");
    if (!version) return refuse(path, "unreadable: " + version.error().message);
    if (std::stoi(*version) > kSchemaVersion) {
      return refuse(path, "written by a newer traincoord (schema " + *version +
                              "; this one reads up to " + std::to_string(kSchemaVersion) +
                              "): upgrade traincoord");
    }
    schema = std::stoi(*version);
    // No PRAGMA quick_check here: it reads the whole file (3 s for 10 million completions),
    // and restart time must stay bounded. A damaged header is caught above; damaged pages
    // make the reads below (snapshots, log) fail, and the restart is refused with SQLite's
    // message.
  }
  if (!options.read_only) {
    const char* sync = options.durability == Durability::kFsync ? "FULL" : "NORMAL";
    if (auto r = db->exec(std::string("PRAGMA journal_mode=WAL; PRAGMA synchronous=") + sync); !r) {
      return tl::unexpected(r.error());
    }
    if (fresh) {
      if (auto r = db->exec(
              std::string("BEGIN;") + kSchema + kCompletionsView + kCountedCompletionsView +
              "PRAGMA application_id=" + std::to_string(kApplicationId) +
              "; PRAGMA user_version=" + std::to_string(kSchemaVersion) + "; COMMIT;");
          !r) {
        return tl::unexpected(r.error());
      }
    }
    if (schema == 1) {
      if (auto r = migrate_from_1(*db); !r) {
        return refuse(path, "cannot be upgraded from schema 1 (" + r.error().message + ")");
      }
      schema = 2;
    }
    if (schema == 2) {
      if (auto r = migrate_from_2(*db); !r) {
        return refuse(path, "cannot be upgraded from schema 2 (" + r.error().message + ")");
      }
      schema = 3;
    }
    if (schema == 3) {
      if (auto r = migrate_from_3(*db); !r) {
        return refuse(path, "cannot be upgraded from schema 3 (" + r.error().message + ")");
      }
      schema = 4;
    }
    if (schema == 4) {
      if (auto r = migrate_from_4(*db); !r) {
        return refuse(path, "cannot be upgraded from schema 4 (" + r.error().message + ")");
      }
      schema = 5;
    }
  } else if (fresh) {
    return refuse(path, "an empty database");
  }
  std::unique_ptr<Store> store(
      new Store(options, options.dir + "/" + kFileName, std::move(*db), std::move(*dir)));
  store->schema_ = schema;  // read-only, an older schema is read as it is
  if (!options.read_only) {
    // Log rows are numbered here, above every number used before (also by rows a snapshot
    // dropped, whose numbers its seq covers; schema 1 kept them in sqlite_sequence).
    auto old_sequence =
        store->db_.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'");
    if (!old_sequence) return tl::unexpected(old_sequence.error());
    auto max_seq = store->db_.scalar(
        std::string("SELECT max(coalesce((SELECT max(seq) FROM log), 0), "
                    "coalesce((SELECT max(seq) FROM snapshots), 0)") +
        (*old_sequence == "0"
             ? ")"
             : ", coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'log'), 0))"));
    if (!max_seq) return tl::unexpected(max_seq.error());
    store->next_seq_ = (max_seq->empty() ? 0 : std::stoll(*max_seq)) + 1;
    store->lock_fd_ = std::exchange(lock.fd, -1);
    if (auto r = store->check_head(); !r) return tl::unexpected(r.error());
    if (auto r = store->load_chains(); !r) return tl::unexpected(r.error());
    auto last_batch =
        store->db_.prepare("SELECT id, sum FROM completion_batches ORDER BY id DESC LIMIT 1");
    if (!last_batch) return tl::unexpected(last_batch.error());
    auto found = last_batch->step();
    if (!found) return tl::unexpected(found.error());
    if (*found) {
      store->next_batch_id_ = last_batch->int64(0) + 1;
      store->batch_chain_ = static_cast<uint64_t>(last_batch->int64(1));
      last_batch->reset();
    }
    if (auto r = store->find_untrimmed(); !r) return tl::unexpected(r.error());
    if (auto r = store->prepare_statements(); !r) return tl::unexpected(r.error());
    auto checkpointer = Checkpointer::start(path, store->db_.raw());
    // SQLite has made its -wal and -shm files by now: they are checked as the others were.
    for (const char* suffix : {"-wal", "-shm"}) {
      if (auto r = store->dir_.check_existing(std::string(kFileName) + suffix); !r) {
        return tl::unexpected(r.error());
      }
    }
    if (!checkpointer) return tl::unexpected(checkpointer.error());
    store->checkpointer_ = std::move(*checkpointer);
  }
  return store;
}

Store::~Store() {
  checkpointer_.reset();  // (before the database closes)
  if (head_fd_ >= 0) ::close(head_fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // (last: the data dir is free once all is closed)
}

namespace {

// What the database or its WAL may still grow by under the process's file size limit
// (RLIMIT_FSIZE, ulimit -f); UINT64_MAX without one.
uint64_t room_under_file_size_limit(const std::string& db_path) {
  rlimit fsize{};
  if (getrlimit(RLIMIT_FSIZE, &fsize) != 0 || fsize.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  uint64_t largest = 0;
  for (const std::string& file : {db_path, db_path + "-wal"}) {
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0) {
      largest = std::max(largest, static_cast<uint64_t>(st.st_size));
    }
  }
  const uint64_t limit = static_cast<uint64_t>(fsize.rlim_cur);
  return limit > largest ? limit - largest : 0;
}

}  // namespace

uint64_t Store::free_bytes() const {
  // A file grows no further than the file size limit: that is room too.
  return std::min(free_bytes_at(options_.dir), room_under_file_size_limit(path_));
}

// The head file: "traincoord head " and the last committed log row's number, with a checksum
// of both (24 bytes). Written in place after each commit, not synced: after a power loss it
// may lag (then it finds less), never lead what was committed with durability "fsync".
namespace {
constexpr char kHeadMagic[16] = {'t', 'r', 'a', 'i', 'n', 'c', 'o', 'o',
                                 'r', 'd', ' ', 'h', 'e', 'a', 'd', '1'};
}  // namespace

void Store::write_head(int64_t seq) {
  if (head_fd_ < 0 || seq <= head_written_) return;
  char buf[32];
  std::memcpy(buf, kHeadMagic, 16);
  std::memcpy(buf + 16, &seq, 8);
  const uint64_t sum = XXH3_64bits(buf, 24);
  std::memcpy(buf + 24, &sum, 8);
  if (::pwrite(head_fd_, buf, sizeof buf, 0) == static_cast<ssize_t>(sizeof buf)) {
    head_written_ = seq;
  }
}

Result<void> Store::check_head() {
  const std::string head_path = options_.dir + "/" + kHeadFileName;
  const bool had_head = dir_.exists(kHeadFileName);
  auto head = dir_.open_file(kHeadFileName, O_RDWR | O_CREAT);
  if (!head) return tl::unexpected(head.error());
  head_fd_ = *head;
  char buf[32];
  const ssize_t n = ::pread(head_fd_, buf, sizeof buf, 0);
  const int64_t held = next_seq_ - 1;  // the last log row the database holds (or covers)
  // A head that cannot be read makes the check of lost commits impossible: the start is
  // refused, saying so (the head exists to find a lost tail of the log, which nothing else
  // finds). An operator who accepts that removes the file; the next start writes a new one.
  auto unreadable = [&](const std::string& why) {
    return failed_precondition(
        head_path + " " + why + ", so traincoord cannot check whether " + path_ +
        " lost commits (rows at the end of its log, which nothing else finds). Nothing was "
        "changed. If the disk is healthy and you accept that risk, remove it (rm " +
        head_path + ") and start again; else restore the data dir from a backup");
  };
  if (n == static_cast<ssize_t>(sizeof buf) && std::memcmp(buf, kHeadMagic, 16) == 0) {
    int64_t seq = 0;
    uint64_t sum = 0;
    std::memcpy(&seq, buf + 16, 8);
    std::memcpy(&sum, buf + 24, 8);
    if (sum != XXH3_64bits(buf, 24)) {
      return unreadable("is damaged (its checksum does not match)");
    } else if (seq > held) {
      notices_.push_back(
          "WARNING: " + path_ + " lost commits: it holds log rows up to " + std::to_string(held) +
          ", but rows up to " + std::to_string(seq) + " were committed (" + head_path +
          "). Requests answered in those " + std::to_string(seq - held) +
          " commits are lost (was the -wal file deleted, or did the disk drop writes?). The runs "
          "go on from what was kept: work done in the lost commits is handed out again");
    }
  } else if (n < 0) {
    return unreadable(std::string("cannot be read (") + std::strerror(errno) + ")");
  } else if (n != 0) {
    return unreadable("is not a head file (" + std::to_string(n) + " bytes, not the " +
                      std::to_string(sizeof buf) + " of a head record)");
  } else if (held > 0) {
    notices_.push_back(
        "WARNING: " + head_path + (had_head ? " was empty" : " was missing") + " while " + path_ +
        " holds log rows up to " + std::to_string(held) +
        ": whether commits were lost at the end of the log cannot be checked this once (a "
        "version before schema 4 wrote no head; else it was removed, or lost with the disk's "
        "cache)");
  }
  head_written_ = -1;  // (written even when the database holds no row: the head may lead it)
  write_head(held);
  if (options_.durability == Durability::kFsync) (void)::fsync(head_fd_);  // (once a start)
  return {};
}

// The checksum chain of each run, where the next log row goes on from: its latest row's sum,
// or its snapshot's chain when no row is newer.
Result<void> Store::load_chains() {
  auto stmt = db_.prepare(
      "SELECT r.name, coalesce((SELECT l.sum FROM log l WHERE l.run = r.name AND l.seq > "
      "coalesce(s.seq, 0) ORDER BY l.seq DESC LIMIT 1), s.chain, 0) FROM runs r LEFT JOIN "
      "snapshots s ON s.run = r.name");
  if (!stmt) return tl::unexpected(stmt.error());
  while (true) {
    auto row = stmt->step();
    if (!row) return tl::unexpected(row.error());
    if (!*row) return {};
    chain_[stmt->text(0)] = static_cast<uint64_t>(stmt->int64(1));
  }
}

Result<void> Store::prepare_statements() {
  struct {
    sqlite::Statement* statement;
    const char* sql;
  } all[] = {
      {&insert_run_,
       "INSERT INTO runs (name, config_format, config, created_ms, sum) VALUES (?,?,?,?,?)"},
      {&insert_record_, "INSERT INTO log (seq, run, time_ms, records, sum) VALUES (?,?,?,?,?)"},
      {&insert_completion_, "INSERT INTO completion_batches (id, run, rows, sum) VALUES (?,?,?,?)"},
      {&upsert_epoch_,
       "INSERT OR REPLACE INTO epochs (run, set_name, epoch, jobs, done, failed, closed, loss, "
       "samples, nonfinite_jobs) VALUES (?,?,?,?,?,?,?,?,?,?)"},
      {&update_run_, "UPDATE runs SET state = ?, reason = ? WHERE name = ?"},
      {&upsert_snapshot_,
       "INSERT OR REPLACE INTO snapshots (run, seq, time_ms, state, chain, sum) VALUES "
       "(?,?,?,?,?,?)"},
      {&delete_log_, "DELETE FROM log WHERE seq = ?"},
      {&delete_epochs_, "DELETE FROM epochs"},
      {&delete_run_epochs_, "DELETE FROM epochs WHERE run = ?"},
      // IMMEDIATE: the write lock at once, waiting (busy timeout) while a checkpoint holds it.
      {&begin_, "BEGIN IMMEDIATE"},
      {&commit_, "COMMIT"},
  };
  for (auto& s : all) {
    auto stmt = db_.prepare(s.sql);
    if (!stmt) return tl::unexpected(stmt.error());
    *s.statement = std::move(*stmt);
  }
  return {};
}

Result<std::vector<SavedRun>> Store::saved_runs() {
  const bool sums = schema_ >= 4;
  auto stmt = db_.prepare(
      std::string("SELECT r.name, r.config_format, r.config, r.created_ms, s.state, s.seq, ") +
      (sums ? "r.sum, s.chain, s.sum" : "NULL, NULL, NULL") +
      " FROM runs r LEFT JOIN snapshots s ON s.run = r.name ORDER BY r.created_ms, r.name");
  if (!stmt) return tl::unexpected(stmt.error());
  std::vector<SavedRun> runs;
  while (true) {
    auto row = stmt->step();
    if (!row) return tl::unexpected(row.error());
    if (!*row) break;
    SavedRun r;
    r.name = stmt->text(0);
    r.config_format = stmt->text(1);
    r.config_text = stmt->text(2);
    r.created_ms = stmt->int64(3);
    // Schema 5: a NULL where a checksum belongs is damage, as a wrong one is (schema 4 read
    // what schema 3 left NULL unchecked; the upgrade to 5 filled those in).
    const bool strict = schema_ >= 5;
    if ((strict && stmt->is_null(6)) ||
        (!stmt->is_null(6) &&
         stmt->int64(6) != as_int(config_sum(r.name, r.config_format, r.config_text)))) {
      return failed_precondition(path_ + ": the config of run " + r.name +
                                 (stmt->is_null(6) ? " has no checksum" : " fails its checksum") +
                                 ": the database was changed or damaged. "
                                 "traincoord refuses to guess; restore the data dir from a "
                                 "backup, or move it away to start afresh");
    }
    uint64_t chain = 0;
    if (!stmt->is_null(4)) {
      r.snapshot = stmt->blob(4);
      r.snapshot_seq = stmt->int64(5);
      if (!stmt->is_null(8) || strict) {
        chain = static_cast<uint64_t>(stmt->int64(7));
        if (stmt->is_null(8) || stmt->is_null(7) ||
            stmt->int64(8) != as_int(snapshot_sum(chain, r.snapshot_seq, *r.snapshot))) {
          return failed_precondition(
              path_ + ": the snapshot of run " + r.name + " (as of log row " +
              std::to_string(r.snapshot_seq) + ") " +
              (stmt->is_null(8) || stmt->is_null(7) ? "has no checksum" : "fails its checksum") +
              ": the database was changed or damaged. "
              "traincoord refuses to guess; restore the data dir from a "
              "backup, or move it away to start afresh");
        }
      }
    }
    snapshot_chain_[r.name] = chain;
    last_seq_[r.name] = r.snapshot_seq;
    runs.push_back(std::move(r));
  }
  return runs;
}

Result<void> Store::for_each_record(const std::function<Result<void>(const Record&)>& fn) {
  const char* sql =
      schema_ == 1
          ? "SELECT l.seq, l.run, l.time_ms, l.kind, l.target, l.body FROM log l "
            "LEFT JOIN snapshots s ON s.run = l.run WHERE l.seq > coalesce(s.seq, 0) ORDER BY l.seq"
      : schema_ < 4
          ? "SELECT l.seq, l.run, l.records, NULL, l.time_ms FROM log l "
            "LEFT JOIN snapshots s ON s.run = l.run WHERE l.seq > coalesce(s.seq, 0) ORDER BY "
            "l.seq"
          : "SELECT l.seq, l.run, l.records, l.sum, l.time_ms FROM log l "
            "LEFT JOIN snapshots s ON s.run = l.run WHERE l.seq > coalesce(s.seq, 0) ORDER BY "
            "l.seq";
  auto stmt = db_.prepare(sql);
  if (!stmt) return tl::unexpected(stmt.error());
  Record r;
  auto each = [&](const Record& rec) {
    records_since_snapshot_[rec.run] += 1;
    return fn(rec);
  };
  // Each run's chain, from its snapshot: a row whose sum does not follow from the one before
  // was changed, or a row before it is missing (or a snapshot is older than its log).
  std::map<std::string, uint64_t, std::less<>> chain(snapshot_chain_.begin(),
                                                     snapshot_chain_.end());
  auto damaged = [&](const std::string& what) {
    return failed_precondition(path_ + ": log row " + std::to_string(r.seq) + " of run " + r.run +
                               " " + what +
                               ": the database was changed or damaged, or lost a row. "
                               "traincoord refuses to rebuild state from it; restore the data "
                               "dir from a backup, or move it away to start afresh");
  };
  while (true) {
    auto row = stmt->step();
    if (!row) return tl::unexpected(row.error());
    if (!*row) return {};
    r.seq = stmt->int64(0);
    r.run = stmt->text(1);
    last_seq_[r.run] = r.seq;
    Result<void> stopped;
    if (schema_ == 1) {
      r.time = stmt->int64(2);
      r.kind = static_cast<RecordKind>(stmt->int64(3));
      r.outcome = kOutcomeUnknown;
      r.target = stmt->text(4);
      r.body = stmt->text(5);
      stopped = each(r);
    } else {
      const std::string records = stmt->blob(2);
      const bool checked = !stmt->is_null(3);
      if (!checked && schema_ >= 5) return damaged("has no checksum");
      if (checked) {
        uint64_t& before = chain[r.run];
        const uint64_t sum = row_sum(before, r.seq, r.run, stmt->int64(4), records);
        if (as_int(sum) != stmt->int64(3)) return damaged("fails its checksum");
        before = sum;
      } else {
        chain[r.run] = 0;  // schema 3's rows carry no sum; the next schema 4 row starts at 0
      }
      if (!decode_records(records, checked, &r, &stopped, each)) return damaged("is malformed");
    }
    if (!stopped) return stopped;
  }
}

Result<uint64_t> Store::check_completions() {
  if (schema_ < 5) return 0;
  auto stmt = db_.prepare("SELECT id, run, rows, sum FROM completion_batches ORDER BY id");
  if (!stmt) return tl::unexpected(stmt.error());
  uint64_t before = 0, rows = 0;
  while (true) {
    auto row = stmt->step();
    if (!row) return tl::unexpected(row.error());
    if (!*row) return rows;
    const int64_t id = stmt->int64(0);
    const std::string run = stmt->text(1);
    before = batch_sum(before, id, run, stmt->text(2));
    rows += 1;
    const bool no_sum = stmt->is_null(3);
    if (no_sum || as_int(before) != stmt->int64(3)) {
      stmt->reset();
      return failed_precondition(
          path_ + ": row " + std::to_string(id) + " of completion_batches (run " + run + ") " +
          (no_sum ? "has no checksum" : "fails its checksum") +
          ": it, or a row before it, was changed, removed or damaged. The runs' state does not "
          "depend on it (a start restores them without it), but the completions it shows may "
          "be wrong: restore the data dir from a backup to have them exact");
    }
  }
}

Result<TimeMs> Store::latest_time() {
  auto t = db_.scalar(
      "SELECT max(coalesce((SELECT max(time_ms) FROM log), 0), "
      "coalesce((SELECT max(time_ms) FROM snapshots), 0), "
      "coalesce((SELECT max(created_ms) FROM runs), 0))");
  if (!t) return tl::unexpected(t.error());
  return t->empty() ? 0 : std::stoll(*t);
}

void Store::add_run(const std::string& name, std::string_view format, std::string_view text,
                    TimeMs created) {
  pending_runs_.push_back({name, std::string(format), std::string(text), created});
  touched_.insert(name);
}

void Store::add_config(const std::string& run, std::string_view format, std::string_view text) {
  pending_configs_.push_back({run, std::string(format), std::string(text), 0});
  touched_.insert(run);
}

// Encoded straight into the run's row of the next commit: a record costs one append, not a
// copy of its target and body kept until take().
void Store::add_record(std::string_view run, TimeMs time, RecordKind kind, std::string_view target,
                       std::string_view body, int outcome, std::string_view /*reply*/) {
  auto log = std::find_if(pending_log_.begin(), pending_log_.end(),
                          [&](const PendingLog& l) { return l.run == run; });
  if (log == pending_log_.end()) {
    log = pending_log_.insert(pending_log_.end(), PendingLog{std::string(run), {}, 0, 0});
    if (!touched_.contains(run)) touched_.emplace(run);
  }
  encode_record(&log->records, kind, time, target, body, outcome);
  log->time = time;
  log->count += 1;
}

void Store::add_completion(const CompletionRow& c) {
  auto batch = std::find_if(pending_completions_.begin(), pending_completions_.end(),
                            [&](const StoreBatch::CompletionBatch& b) { return b.run == c.run; });
  if (batch == pending_completions_.end()) {
    batch = pending_completions_.insert(pending_completions_.end(), {std::string(c.run), "["});
  } else {
    batch->rows.push_back(',');
  }
  JsonWriter& w = row_writer_;
  w.clear();
  w.begin_array().value(c.lease).value(c.worker).value(c.set).value(c.epoch).value(c.job);
  w.value(c.loss).value(c.samples).begin_object();  // (a non-finite loss: null)
  if (c.metrics) {
    for (const Metric& m : *c.metrics) w.field(m.name, m.value);
  }
  w.end_object().value(c.time).end_array();
  batch->rows += w.str();
}

void StoreBatch::append(StoreBatch&& later) {
  auto move_all = [](auto& to, auto& from) {
    to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  };
  // Epoch rows that a later reset replaces are dropped here: write() deletes before it upserts.
  if (later.derive_epochs) epochs.clear();
  for (const std::string& run : later.epoch_resets) {
    std::erase_if(epochs, [&](const EpochRow& e) { return e.run == run; });
  }
  move_all(runs, later.runs);
  move_all(log, later.log);
  move_all(completions, later.completions);
  move_all(epochs, later.epochs);
  move_all(run_states, later.run_states);
  move_all(snapshots, later.snapshots);
  move_all(configs, later.configs);
  derive_epochs = derive_epochs || later.derive_epochs;
  move_all(epoch_resets, later.epoch_resets);
}

void Store::take_run_state(const Run& run, StoreBatch* batch) {
  const std::string& name = run.config().name;
  // Epochs before `written` are closed and already taken: take only from there, so a commit
  // costs O(open epochs), not O(epochs so far).
  size_t& written = closed_epochs_written_[name];
  const auto& epochs = run.epochs();
  for (size_t i = std::min(written, epochs.size()); i < epochs.size(); ++i) {
    const Epoch& e = epochs[i];
    batch->epochs.push_back({name, std::string(set_name(e.plan.set)), e.plan.epoch, e.plan.size(),
                             e.done, e.failed, e.closed(),
                             e.closed() && std::isfinite(e.loss) ? e.loss : std::nan(""), e.samples,
                             e.nonfinite_jobs});
  }
  while (written < epochs.size() && epochs[written].closed()) ++written;
  batch->run_states.push_back({name, std::string(run_state_name(run.state())), run.state_reason()});
}

void Store::take_snapshot(const Run& run, TimeMs now, StoreBatch* batch) {
  const std::string& name = run.config().name;
  const auto chain = chain_.find(name);
  batch->snapshots.push_back(
      {name, last_seq_[name], now, RunCodec::save(run), chain == chain_.end() ? 0 : chain->second});
  records_since_snapshot_[name] = 0;
}

std::unique_ptr<JournalBatch> Store::take(const Engine& engine, bool snapshots, TimeMs now) {
  return std::make_unique<StoreBatch>(take_batch(engine, snapshots, now));
}

StoreBatch Store::take_batch(const Engine& engine, bool snapshots, TimeMs now) {
  StoreBatch batch;
  batch.runs = std::move(pending_runs_);
  pending_runs_.clear();
  // One log row per run: its records of this commit, in order (runs replay independently).
  for (PendingLog& log : pending_log_) {
    StoreBatch::LogRow row{next_seq_++, std::move(log.run), log.time, std::move(log.records), 0};
    uint64_t& chain = chain_[row.run];
    row.sum = chain = row_sum(chain, row.seq, row.run, row.time, row.records);
    last_seq_[row.run] = row.seq;
    records_since_snapshot_[row.run] += log.count;
    batch.log.push_back(std::move(row));
  }
  pending_log_.clear();
  // A replaced config goes with a snapshot of the run under it, which covers its log so far.
  batch.configs = std::move(pending_configs_);
  pending_configs_.clear();
  for (const StoreBatch::NewRun& config : batch.configs) {
    if (auto run = engine.find(config.name)) take_snapshot(**run, now, &batch);
  }
  for (StoreBatch::CompletionBatch& c : pending_completions_) c.rows.push_back(']');
  batch.completions = std::move(pending_completions_);
  pending_completions_.clear();
  if (derive_epochs_) {
    // A start: the table is written again from the state restored (which the checksums
    // cover), so a row edited by hand, or left by a lineage a restore abandoned, does not last.
    derive_epochs_ = false;
    batch.derive_epochs = true;
    closed_epochs_written_.clear();
    for (const Run* run : engine.runs()) {
      touched_.insert(run->config().name);
      restores_seen_[run->config().name] = run->counters().restores;
    }
  }
  for (const std::string& name : touched_) {
    auto run = engine.find(name);
    if (!run) continue;
    // A restore put back the epochs of a cut: the rows written since (losses of the lineage
    // abandoned) are replaced by the run's epochs as they are now.
    const uint64_t restores = (*run)->counters().restores;
    auto [seen, first] = restores_seen_.try_emplace(name, restores);
    if (!first && seen->second != restores) {
      seen->second = restores;
      batch.epoch_resets.push_back(name);
      closed_epochs_written_[name] = 0;
    }
    take_run_state(**run, &batch);
  }
  touched_.clear();
  if (snapshots) {
    for (auto& [name, count] : records_since_snapshot_) {
      if (count < options_.snapshot_every) continue;
      if (auto run = engine.find(name)) take_snapshot(**run, now, &batch);
    }
  }
  return batch;
}

Result<void> Store::write_batch(const StoreBatch& batch) {
  last_write_full_ = false;
  if (batch.empty()) return {};
  auto rollback = [&](Error e) -> Result<void> {
    // SQLITE_FULL: a write found no space (ENOSPC); nothing of the batch is kept, and it may
    // be written again later. So with EFBIG: the file reached the process's size limit
    // (RLIMIT_FSIZE, ulimit -f; SIGXFSZ is ignored by serve), which SQLite reports as an I/O
    // error. Anything else (an fsync error above all) is not retried.
    const int code = sqlite3_errcode(db_.raw());
    // (SQLite may report another errno than the write's EFBIG: a file at the limit says it.)
    const bool too_big =
        (code & 0xff) == SQLITE_IOERR && (sqlite3_system_errno(db_.raw()) == EFBIG ||
                                          room_under_file_size_limit(path_) < (1u << 20));
    last_write_full_ = code == SQLITE_FULL || too_big;
    if (too_big) {
      e.message +=
          " (a file of the journal reached the size limit of this process, "
          "RLIMIT_FSIZE: ulimit -f; raise it)";
    }
    (void)db_.exec("ROLLBACK");  // dropped: the error returned is the one to report
    return tl::unexpected(std::move(e));
  };
  if (auto r = begin_.run(); !r) return rollback(r.error());
  for (const StoreBatch::NewRun& p : batch.runs) {
    insert_run_.bind(1, p.name).bind(2, p.format).bind(3, p.text).bind(4, p.created);
    insert_run_.bind(5, as_int(config_sum(p.name, p.format, p.text)));
    if (auto r = insert_run_.run(); !r) return rollback(r.error());
  }
  // (bind_ref: the batch outlives each statement's run)
  for (const StoreBatch::LogRow& row : batch.log) {
    insert_record_.bind(1, row.seq).bind_ref(2, row.run).bind(3, row.time);
    insert_record_.bind_blob_ref(4, row.records).bind(5, as_int(row.sum));
    if (auto r = insert_record_.run(); !r) return rollback(r.error());
  }
  // (the chain goes on only once the commit is made: a batch refused for want of room is
  // written again with the same numbers)
  int64_t batch_id = next_batch_id_;
  uint64_t batch_chain = batch_chain_;
  for (const StoreBatch::CompletionBatch& c : batch.completions) {
    batch_chain = batch_sum(batch_chain, batch_id, c.run, c.rows);
    insert_completion_.bind(1, batch_id++).bind_ref(2, c.run).bind_ref(3, c.rows);
    insert_completion_.bind(4, as_int(batch_chain));
    if (auto r = insert_completion_.run(); !r) return rollback(r.error());
  }
  if (batch.derive_epochs) {
    if (auto r = delete_epochs_.run(); !r) return rollback(r.error());
  }
  for (const std::string& run : batch.epoch_resets) {
    delete_run_epochs_.bind(1, run);
    if (auto r = delete_run_epochs_.run(); !r) return rollback(r.error());
  }
  for (const StoreBatch::EpochRow& e : batch.epochs) {
    auto& s = upsert_epoch_;
    s.bind(1, e.run).bind(2, e.set).bind(3, e.epoch).bind(4, e.jobs);
    s.bind(5, e.done).bind(6, e.failed).bind(7, e.closed ? 1 : 0);
    if (std::isfinite(e.loss)) {
      s.bind(8, e.loss);
    } else {
      s.bind_null(8);
    }
    s.bind(9, e.samples).bind(10, e.nonfinite_jobs);
    if (auto r = s.run(); !r) return rollback(r.error());
  }
  for (const StoreBatch::RunRow& run : batch.run_states) {
    update_run_.bind(1, run.state).bind(2, run.reason).bind(3, run.name);
    if (auto r = update_run_.run(); !r) return rollback(r.error());
  }
  for (const StoreBatch::NewRun& c : batch.configs) {
    auto stmt =
        db_.prepare("UPDATE runs SET config_format = ?, config = ?, sum = ? WHERE name = ?");
    if (!stmt) return rollback(stmt.error());
    stmt->bind(1, c.format).bind(2, c.text);
    stmt->bind(3, as_int(config_sum(c.name, c.format, c.text))).bind(4, c.name);
    if (auto r = stmt->run(); !r) return rollback(r.error());
  }
  for (const StoreBatch::SnapshotRow& snap : batch.snapshots) {
    upsert_snapshot_.bind(1, snap.run).bind(2, snap.seq).bind(3, snap.time);
    upsert_snapshot_.bind_blob(4, snap.state).bind(5, as_int(snap.chain));
    upsert_snapshot_.bind(6, as_int(snapshot_sum(snap.chain, snap.seq, snap.state)));
    if (auto r = upsert_snapshot_.run(); !r) return rollback(r.error());
  }
  // The log rows a snapshot covers are never read again (a restart replays only those after
  // it), so they are deleted a few per commit rather than all with the snapshot: deleting a
  // snapshot's worth (~5,000 rows, 11 MB of pages written again) in its transaction held every
  // reply behind it for 120-190 ms (bench/loadgen, durability "os"; 17-27 ms now).
  // Twice as many as the batch adds, so the log shrinks back well before the next snapshot.
  const size_t trim = 2 * batch.log.size() + 2;
  std::vector<int64_t> trimmed;
  for (size_t i = 0; i < trim && i < trim_.size(); ++i) {
    delete_log_.bind(1, trim_[i]);
    if (auto r = delete_log_.run(); !r) return rollback(r.error());
    trimmed.push_back(trim_[i]);
  }
  if (auto r = commit_.run(); !r) return rollback(r.error());
  next_batch_id_ = batch_id;
  batch_chain_ = batch_chain;
  if (!batch.log.empty()) write_head(batch.log.back().seq);
  trim_.erase(trim_.begin(), trim_.begin() + static_cast<std::ptrdiff_t>(trimmed.size()));
  for (const StoreBatch::LogRow& row : batch.log) untrimmed_[row.run].push_back(row.seq);
  for (const StoreBatch::SnapshotRow& snap : batch.snapshots) covered(snap.run, snap.seq);
  return {};
}

void Store::append_metrics(std::string& out) const {
  out +=
      "# HELP traincoord_store_checkpoints_total Passes copying the WAL into the database, on "
      "the checkpointer's thread.\n"
      "# TYPE traincoord_store_checkpoints_total counter\n"
      "traincoord_store_checkpoints_total " +
      std::to_string(checkpoints()) +
      "\n# HELP traincoord_store_wal_restarts_total Times the WAL was started over from its "
      "beginning (it stays bounded).\n"
      "# TYPE traincoord_store_wal_restarts_total counter\n"
      "traincoord_store_wal_restarts_total " +
      std::to_string(checkpoint_restarts()) +
      "\n# HELP traincoord_store_checkpoint_failures_total Checkpoints that failed (nothing is "
      "lost: the WAL keeps every commit until one succeeds).\n"
      "# TYPE traincoord_store_checkpoint_failures_total counter\n"
      "traincoord_store_checkpoint_failures_total " +
      std::to_string(checkpoint_failures()) + "\n";
}

void Store::covered(const std::string& run, int64_t seq) {
  auto& rows = untrimmed_[run];
  while (!rows.empty() && rows.front() <= seq) {
    trim_.push_back(rows.front());
    rows.pop_front();
  }
}

Result<void> Store::find_untrimmed() {
  auto stmt = db_.prepare(
      "SELECT l.seq, l.run, coalesce(s.seq, 0) FROM log l LEFT JOIN snapshots s ON s.run = l.run "
      "ORDER BY l.seq");
  if (!stmt) return tl::unexpected(stmt.error());
  while (true) {
    auto row = stmt->step();
    if (!row) return tl::unexpected(row.error());
    if (!*row) return {};
    const int64_t seq = stmt->int64(0);
    if (seq <= stmt->int64(2)) {
      trim_.push_back(seq);
    } else {
      untrimmed_[stmt->text(1)].push_back(seq);
    }
  }
}

Result<void> Store::snapshot(const Run& run, TimeMs now) {
  StoreBatch batch;
  take_snapshot(run, now, &batch);
  return write_batch(batch);
}

Result<void> Store::snapshot_due(const Engine& engine, TimeMs now) {
  StoreBatch batch;
  for (auto& [name, count] : records_since_snapshot_) {
    if (count < options_.snapshot_every) continue;
    if (auto run = engine.find(name)) take_snapshot(**run, now, &batch);
  }
  return write_batch(batch);
}

Result<void> Store::replace_config(const Run& run, std::string_view format, std::string_view text,
                                   TimeMs now) {
  // The config and the snapshot in one transaction (write_batch writes a batch's configs before
  // its snapshots): a crash between two writes would leave the new config over the old
  // snapshot and the records logged under the old config.
  StoreBatch batch;
  batch.configs.push_back({run.config().name, std::string(format), std::string(text), 0});
  take_snapshot(run, now, &batch);
  return write_batch(batch);
}

}  // namespace traincoord
