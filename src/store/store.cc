#include "store/store.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/run_codec.h"

namespace traincoord {

namespace {

constexpr int64_t kApplicationId = 0x54435244;  // "TCRD", in the database header

const char* kSchema = R"(
CREATE TABLE runs (
  name TEXT PRIMARY KEY,
  config_format TEXT NOT NULL,       -- 'toml' or 'json'
  config TEXT NOT NULL,              -- the run config as the user gave it
  created_ms INTEGER NOT NULL,
  state TEXT NOT NULL DEFAULT 'running',
  reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE snapshots (             -- the whole state of a run, as of log record `seq`
  run TEXT PRIMARY KEY REFERENCES runs(name),
  seq INTEGER NOT NULL,
  time_ms INTEGER NOT NULL,
  state BLOB NOT NULL
);
CREATE TABLE log (                   -- every state-changing request since the snapshot:
  seq INTEGER PRIMARY KEY,           -- one row per run and commit; increasing, never reused
  run TEXT NOT NULL,
  time_ms INTEGER NOT NULL,          -- of its last record
  records BLOB NOT NULL              -- its records, in order (encode_record below)
);
CREATE TABLE completions (           -- every accepted completion: one per job and epoch
  run TEXT NOT NULL,
  lease INTEGER NOT NULL,
  worker TEXT NOT NULL,
  set_name TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  job INTEGER NOT NULL,
  loss REAL,                         -- NULL: a non-finite loss
  samples INTEGER NOT NULL,
  metrics TEXT,                      -- JSON object
  time_ms INTEGER NOT NULL,
  PRIMARY KEY (run, lease)
) WITHOUT ROWID;
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
// durability "os", its SQLite work was ~16 us a request (docs/PERFORMANCE.md).
// A record in a log row: kind (1 byte), time (8), target length (4) and bytes, body length (4)
// and bytes; integers little-endian as x86 and ARM store them.
void put_u32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void encode_record(std::string* out, const Record& r) {
  out->push_back(static_cast<char>(r.kind));
  out->append(reinterpret_cast<const char*>(&r.time), 8);
  put_u32(out, static_cast<uint32_t>(r.target.size()));
  out->append(r.target);
  put_u32(out, static_cast<uint32_t>(r.body.size()));
  out->append(r.body);
}

// Decodes the records of a log row; false if it is damaged.
bool decode_records(std::string_view in, Record* r, const std::function<void(const Record&)>& fn) {
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
    if (!take(&kind, 1) || !take(&r->time, 8) || !take_text(&r->target) || !take_text(&r->body)) {
      return false;
    }
    if (kind != static_cast<uint8_t>(RecordKind::kRequest) &&
        kind != static_cast<uint8_t>(RecordKind::kExpire)) {
      return false;
    }
    r->kind = static_cast<RecordKind>(kind);
    fn(*r);
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
    (void)db.exec("ROLLBACK");
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
    encode_record(&blob, rec);
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

tl::unexpected<Error> refuse(const std::string& path, const std::string& why) {
  return failed_precondition(path + ": " + why +
                             ". traincoord did not change it; point --data-dir elsewhere, or "
                             "move the file away to start afresh");
}

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const StoreOptions& options) {
  std::error_code ec;
  if (!options.read_only) std::filesystem::create_directories(options.dir, ec);
  if (ec) return failed_precondition("cannot create data dir " + options.dir + ": " + ec.message());
  const std::string path = options.dir + "/" + kFileName;
  const bool existed = std::filesystem::exists(path);
  if (options.read_only && !existed) {
    return not_found("no traincoord database at " + path);
  }
  auto db = sqlite::Db::open(path, options.read_only);
  if (!db) return tl::unexpected(db.error());

  // Read the header before anything writes: a file that is not ours is never touched.
  auto app_id = db->scalar("PRAGMA application_id");
  if (!app_id)
    return refuse(path, "not a SQLite database, or corrupt (" + app_id.error().message + ")");
  auto tables = db->scalar("SELECT count(*) FROM sqlite_master");
  if (!tables)
    return refuse(path, "not a SQLite database, or corrupt (" + tables.error().message + ")");
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
      if (auto r =
              db->exec(std::string("BEGIN;") + kSchema +
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
  } else if (fresh) {
    return refuse(path, "an empty database");
  }
  std::unique_ptr<Store> store(new Store(options, path, std::move(*db)));
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
    if (auto r = store->prepare_statements(); !r) return tl::unexpected(r.error());
  }
  return store;
}

Result<void> Store::prepare_statements() {
  struct {
    sqlite::Statement* statement;
    const char* sql;
  } all[] = {
      {&insert_run_, "INSERT INTO runs (name, config_format, config, created_ms) VALUES (?,?,?,?)"},
      {&insert_record_, "INSERT INTO log (seq, run, time_ms, records) VALUES (?,?,?,?)"},
      {&insert_completion_,
       "INSERT OR REPLACE INTO completions (run, lease, worker, set_name, epoch, job, loss, "
       "samples, metrics, time_ms) VALUES (?,?,?,?,?,?,?,?,?,?)"},
      {&upsert_epoch_,
       "INSERT OR REPLACE INTO epochs (run, set_name, epoch, jobs, done, failed, closed, loss, "
       "samples, nonfinite_jobs) VALUES (?,?,?,?,?,?,?,?,?,?)"},
      {&update_run_, "UPDATE runs SET state = ?, reason = ? WHERE name = ?"},
      {&upsert_snapshot_,
       "INSERT OR REPLACE INTO snapshots (run, seq, time_ms, state) VALUES (?,?,?,?)"},
      {&delete_log_, "DELETE FROM log WHERE run = ? AND seq <= ?"},
  };
  for (auto& s : all) {
    auto stmt = db_.prepare(s.sql);
    if (!stmt) return tl::unexpected(stmt.error());
    *s.statement = std::move(*stmt);
  }
  return {};
}

Result<std::vector<SavedRun>> Store::saved_runs() {
  auto stmt = db_.prepare(
      "SELECT r.name, r.config_format, r.config, r.created_ms, s.state, s.seq FROM runs r "
      "LEFT JOIN snapshots s ON s.run = r.name ORDER BY r.created_ms, r.name");
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
    if (!stmt->is_null(4)) {
      r.snapshot = stmt->blob(4);
      r.snapshot_seq = stmt->int64(5);
    }
    last_seq_[r.name] = r.snapshot_seq;
    runs.push_back(std::move(r));
  }
  return runs;
}

Result<void> Store::for_each_record(const std::function<void(const Record&)>& fn) {
  const char* sql =
      schema_ == 1
          ? "SELECT l.seq, l.run, l.time_ms, l.kind, l.target, l.body FROM log l "
            "LEFT JOIN snapshots s ON s.run = l.run WHERE l.seq > coalesce(s.seq, 0) ORDER BY l.seq"
          : "SELECT l.seq, l.run, l.records FROM log l "
            "LEFT JOIN snapshots s ON s.run = l.run WHERE l.seq > coalesce(s.seq, 0) ORDER BY "
            "l.seq";
  auto stmt = db_.prepare(sql);
  if (!stmt) return tl::unexpected(stmt.error());
  Record r;
  auto each = [&](const Record& rec) {
    records_since_snapshot_[rec.run] += 1;
    fn(rec);
  };
  while (true) {
    auto row = stmt->step();
    if (!row) return tl::unexpected(row.error());
    if (!*row) return {};
    r.seq = stmt->int64(0);
    r.run = stmt->text(1);
    last_seq_[r.run] = r.seq;
    if (schema_ == 1) {
      r.time = stmt->int64(2);
      r.kind = static_cast<RecordKind>(stmt->int64(3));
      r.target = stmt->text(4);
      r.body = stmt->text(5);
      each(r);
    } else if (!decode_records(stmt->blob(2), &r, each)) {
      return failed_precondition(path_ + ": log row " + std::to_string(r.seq) + " of run " + r.run +
                                 " is damaged");
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

void Store::add_record(std::string_view run, TimeMs time, RecordKind kind, std::string_view target,
                       std::string_view body) {
  Record r;
  r.run = std::string(run);
  r.time = time;
  r.kind = kind;
  r.target = std::string(target);
  r.body = std::string(body);
  touched_.insert(r.run);
  pending_records_.push_back(std::move(r));
}

void Store::add_completion(CompletionRow row) { pending_completions_.push_back(std::move(row)); }

Result<void> Store::write_run_state(const Run& run) {
  const std::string& name = run.config().name;
  // Epochs before `written` are closed and already in the table: write only from there, so a
  // commit costs O(open epochs), not O(epochs so far).
  size_t& written = closed_epochs_written_[name];
  const auto& epochs = run.epochs();
  for (size_t i = std::min(written, epochs.size()); i < epochs.size(); ++i) {
    const Epoch& e = epochs[i];
    auto& s = upsert_epoch_;
    s.bind(1, name).bind(2, set_name(e.plan.set)).bind(3, e.plan.epoch).bind(4, e.plan.size());
    s.bind(5, e.done).bind(6, e.failed).bind(7, e.closed() ? 1 : 0);
    if (e.closed() && std::isfinite(e.loss)) {
      s.bind(8, e.loss);
    } else {
      s.bind_null(8);
    }
    s.bind(9, e.samples).bind(10, e.nonfinite_jobs);
    if (auto r = s.run(); !r) return r;
  }
  while (written < epochs.size() && epochs[written].closed()) ++written;
  update_run_.bind(1, run_state_name(run.state())).bind(2, run.state_reason()).bind(3, name);
  return update_run_.run();
}

Result<void> Store::commit(const Engine& engine) {
  if (pending_runs_.empty() && pending_records_.empty() && pending_completions_.empty()) {
    return {};
  }
  if (auto r = db_.exec("BEGIN"); !r) return r;
  auto rollback = [&](Error e) -> Result<void> {
    (void)db_.exec("ROLLBACK");
    return tl::unexpected(std::move(e));
  };
  for (const PendingRun& p : pending_runs_) {
    insert_run_.bind(1, p.name).bind(2, p.format).bind(3, p.text).bind(4, p.created);
    if (auto r = insert_run_.run(); !r) return rollback(r.error());
  }
  // One row per run: its records of this commit, in order (runs replay independently).
  std::vector<bool> written(pending_records_.size(), false);
  int64_t seq = next_seq_;
  for (size_t i = 0; i < pending_records_.size(); ++i) {
    if (written[i]) continue;
    const std::string& run = pending_records_[i].run;
    blob_.clear();
    uint64_t n = 0;
    TimeMs last = 0;
    for (size_t k = i; k < pending_records_.size(); ++k) {
      if (written[k] || pending_records_[k].run != run) continue;
      encode_record(&blob_, pending_records_[k]);
      last = pending_records_[k].time;
      written[k] = true;
      n += 1;
    }
    insert_record_.bind(1, seq).bind(2, run).bind(3, last).bind_blob(4, blob_);
    if (auto r = insert_record_.run(); !r) return rollback(r.error());
    last_seq_[run] = seq++;
    records_since_snapshot_[run] += n;
  }
  for (const CompletionRow& c : pending_completions_) {
    auto& s = insert_completion_;
    s.bind(1, c.run).bind(2, c.lease).bind(3, c.worker).bind(4, c.set).bind(5, c.epoch);
    s.bind(6, c.job);
    if (std::isfinite(c.loss)) {
      s.bind(7, c.loss);
    } else {
      s.bind_null(7);
    }
    s.bind(8, c.samples).bind(9, c.metrics_json).bind(10, c.time);
    if (auto r = s.run(); !r) return rollback(r.error());
  }
  for (const std::string& name : touched_) {
    auto run = engine.find(name);
    if (!run) continue;
    if (auto r = write_run_state(**run); !r) return rollback(r.error());
  }
  if (auto r = db_.exec("COMMIT"); !r) return rollback(r.error());
  next_seq_ = seq;
  pending_runs_.clear();
  pending_records_.clear();
  pending_completions_.clear();
  touched_.clear();
  return {};
}

Result<void> Store::snapshot(const Run& run, TimeMs now) {
  const std::string& name = run.config().name;
  const int64_t seq = last_seq_[name];
  if (auto r = db_.exec("BEGIN"); !r) return r;
  upsert_snapshot_.bind(1, name).bind(2, seq).bind(3, now).bind_blob(4, RunCodec::save(run));
  auto r = upsert_snapshot_.run();
  if (r) {
    delete_log_.bind(1, name).bind(2, seq);
    r = delete_log_.run();
  }
  if (r) r = db_.exec("COMMIT");
  if (!r) {
    (void)db_.exec("ROLLBACK");
    return r;
  }
  records_since_snapshot_[name] = 0;
  return {};
}

Result<void> Store::snapshot_due(const Engine& engine, TimeMs now) {
  for (auto& [name, count] : records_since_snapshot_) {
    if (count < options_.snapshot_every) continue;
    auto run = engine.find(name);
    if (!run) continue;
    if (auto r = snapshot(**run, now); !r) return r;
  }
  return {};
}

Result<void> Store::replace_config(const Run& run, std::string_view format, std::string_view text,
                                   TimeMs now) {
  auto stmt = db_.prepare("UPDATE runs SET config_format = ?, config = ? WHERE name = ?");
  if (!stmt) return tl::unexpected(stmt.error());
  stmt->bind(1, format).bind(2, text).bind(3, run.config().name);
  if (auto r = stmt->run(); !r) return r;
  return snapshot(run, now);
}

}  // namespace traincoord
