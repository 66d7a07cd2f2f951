// The durable store brings a run back exactly: drive the API as the server does (each request
// at one instant, logged, committed in batches), then restore into a fresh engine from the
// data dir and compare the whole saved state byte for byte.
#include "server/coordinator.h"
#include "server/restore.h"
#include "store/store.h"

#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "core/run_codec.h"
#include "temp_dir.h"

namespace traincoord {
namespace {

using traincoord::testing::TempDir;

constexpr const char* kConfig = R"({"name": "j", "data": {"train_batches": 23, "dev_batches": 5},
  "schedule": {"epochs": 4, "iters_per_worker": 2},
  "leases": {"timeout": 0.1, "max_attempts": 3, "on_job_failure": "skip"},
  "early_stop": {"rule": "patience", "patience": 3}})";

// The server's engine loop, minus the network.
class Harness {
 public:
  Harness(const std::string& dir, uint64_t snapshot_every, ApiLimits limits = {})
      : api_(engine_, clock_, limits) {
    StoreOptions o;
    o.dir = dir;
    o.durability = Durability::kOs;
    o.snapshot_every = snapshot_every;
    store_ = std::move(*Store::open(o));
    observer_ = std::make_unique<JournalObserver>(*store_);
    api_.set_observer(observer_.get());
    clock_.replay_at(0);
  }

  HttpReply get(const std::string& target) {
    auto result = api_.handle({"GET", target, "", {}});
    const auto* reply = std::get_if<HttpReply>(&result);
    return reply ? *reply : HttpReply{};
  }

  HttpReply post(const std::string& target, const std::string& body) {
    const TimeMs t = clock_.hold();
    auto result = api_.handle({"POST", target, body, {}});
    clock_.release();
    const std::string_view run = Api::run_of(target);
    const auto* reply = std::get_if<HttpReply>(&result);
    if (!run.empty() && engine_.find(std::string(run))) {
      // As the server does: only what changed state, with its outcome.
      if (api_.effect() == Effect::kChanged) {
        store_->add_record(run, t, RecordKind::kRequest, target, body,
                           reply ? reply->status : kOutcomeParked);
        logged_ += 1;
      } else if (api_.effect() == Effect::kExpiredOnly) {
        store_->add_record(run, t, RecordKind::kExpire, "", "", kOutcomeUnknown);
      }
    }
    return reply ? *reply : HttpReply{};
  }

  void tick() {
    const TimeMs t = clock_.hold();
    for (const std::string& run : api_.expire_leases()) {
      store_->add_record(run, t, RecordKind::kExpire, "", "", kOutcomeUnknown);
    }
    clock_.release();
  }

  void commit() {
    ASSERT_TRUE(store_->commit(engine_));
    ASSERT_TRUE(store_->snapshot_due(engine_, clock_.now()));
  }

  void advance(TimeMs dt) { clock_.replay_at(clock_.now() + dt); }
  Engine& engine() { return engine_; }
  Store& store() { return *store_; }
  uint64_t logged() const { return logged_; }

 private:
  uint64_t logged_ = 0;
  ServerClock clock_;
  Engine engine_{clock_};
  Api api_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<JournalObserver> observer_;
};

// The run's state as the journal rebuilds it (all but the workers' "last seen").
std::string saved_state(Engine& engine) { return RunCodec::save_journalled(**engine.find("j")); }

void drive(Harness& h, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  ASSERT_EQ(h.post("/v1/runs", kConfig).status, 201);
  h.commit();
  for (int w = 0; w < 4; ++w)
    h.post("/v1/runs/j/workers", R"({"name": "w)" + std::to_string(w) + "\"}");
  // The leases each worker holds; a worker sometimes takes and completes two at once.
  std::vector<std::vector<uint64_t>> held(4);
  auto leases_in = [](const std::string& body) {
    std::vector<uint64_t> leases;
    for (auto at = body.find("\"lease\":"); at != std::string::npos;
         at = body.find("\"lease\":", at + 8)) {
      leases.push_back(std::stoull(body.substr(at + 8)));
    }
    return leases;
  };
  for (int step = 0; step < 600; ++step) {
    const int w = pick(4);
    const std::string worker = std::to_string(w);
    auto& mine = held[static_cast<size_t>(w)];
    const int action = pick(20);
    if (action == 0) {  // the worker dies: its jobs will expire; it comes back as new
      mine.clear();
      continue;
    }
    if (mine.empty()) {
      const std::string jobs = pick(3) == 0 ? R"(, "jobs": 2)" : "";
      auto r = h.post("/v1/runs/j/acquire", R"({"worker": )" + worker + R"(, "request": )" +
                                                std::to_string(1 + step / 2) + jobs + "}");
      mine = leases_in(r.body);
    } else if (action < 14) {
      // (17 digits: a loss must come back from the database to the last bit)
      char loss[32];
      std::snprintf(loss, sizeof loss, "%.17g", 0.1 + pick(100) / 49.0);
      std::string body = R"({"worker": )" + worker;
      if (mine.size() == 1 && pick(2) == 0) {
        body += R"(, "lease": )" + std::to_string(mine[0]) + R"(, "loss": )" + loss +
                R"(, "samples": 3, "metrics": {"accuracy": 0.5}, "next": true})";
      } else {
        body += R"(, "completions": [)";
        for (size_t i = 0; i < mine.size(); ++i) {
          body += (i ? "," : "") + std::string(R"({"lease": )") + std::to_string(mine[i]) +
                  R"(, "loss": )" + loss + R"(, "samples": 3})";
        }
        body += R"(], "next": true, "jobs": )" + std::to_string(1 + pick(2)) + "}";
      }
      auto r = h.post("/v1/runs/j/complete", body);
      mine = leases_in(r.body);  // the next jobs'
    } else if (action == 14) {
      h.post("/v1/runs/j/fail",
             R"({"worker": )" + worker + R"(, "lease": )" + std::to_string(mine.back()) + "}");
      mine.pop_back();
    } else if (action == 15) {
      h.post("/v1/runs/j/heartbeat", R"({"worker": )" + worker + "}");
    }
    if (pick(4) == 0) {
      h.advance(pick(60));
      h.tick();
    }
    if (pick(5) == 0) h.commit();
  }
  h.commit();
}

// A fresh engine, restored from the store in a data dir as `traincoord serve` does on start.
struct Restored {
  ServerClock clock;
  Engine engine{clock};
  Api api{engine, clock};
  RestoreReport report;
};

void restore(const std::string& dir, bool read_only, Restored* into) {
  StoreOptions o;
  o.dir = dir;
  o.read_only = read_only;
  auto store = Store::open(o);
  ASSERT_TRUE(store) << store.error().message;
  auto report = restore_engine(**store, into->engine, into->api, into->clock);
  ASSERT_TRUE(report) << report.error().message;
  into->report = *report;
}

class Journal : public ::testing::TestWithParam<uint64_t> {};

TEST_P(Journal, RestoreRebuildsTheRunExactly) {
  for (uint64_t snapshot_every : {uint64_t{1'000'000}, uint64_t{7}}) {
    SCOPED_TRACE("snapshot_every " + std::to_string(snapshot_every));
    TempDir dir;
    std::string before;
    {
      Harness h(dir.path(), snapshot_every);
      drive(h, GetParam());
      before = saved_state(h.engine());
    }
    Restored r;
    ASSERT_NO_FATAL_FAILURE(restore(dir.path(), /*read_only=*/true, &r));
    EXPECT_EQ(r.report.runs, 1u);
    if (snapshot_every == 7) {
      EXPECT_EQ(r.report.snapshots, 1u);
      // The log rows snapshots covered were deleted along the way (a few per commit).
      auto db = sqlite::Db::open(dir.path() + "/traincoord.db", true);
      EXPECT_LE(std::stoi(*db->scalar("SELECT count(*) FROM log l JOIN snapshots s "
                                      "ON s.run = l.run WHERE l.seq <= s.seq")),
                16);
    }
    const traincoord::Run& run = **r.engine.find("j");
    EXPECT_GT(run.counters().completions_accepted, 20u);
    EXPECT_GT(run.counters().lease_expiries, 0u);
    EXPECT_EQ(saved_state(r.engine), before);
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, Journal, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8));

// kConfig with schedule.epochs = `epochs`.
std::string config_with_epochs(int epochs) {
  std::string config = kConfig;
  const std::string four = "\"epochs\": 4";
  config.replace(config.find(four), four.size(), "\"epochs\": " + std::to_string(epochs));
  return config;
}

// A started run's config changed through the API (POST /v1/runs/{run}/config, issue 34): the
// run raised to more epochs after it trained (and finished) comes back from the data dir under
// its new config, exactly as it was, whether a snapshot came after the change or not: the new
// config is written with a snapshot of the run under it, so no record of the old config is
// replayed under the new one.
TEST(JournalKeeps, AConfigChangedThroughTheApiComesBackAfterARestart) {
  for (uint64_t snapshot_every : {uint64_t{1'000'000}, uint64_t{7}}) {
    SCOPED_TRACE("snapshot_every " + std::to_string(snapshot_every));
    TempDir dir;
    std::string before;
    {
      Harness h(dir.path(), snapshot_every);
      drive(h, 3);
      const HttpReply dry = h.post("/v1/runs/j/config",
                                   R"({"dry_run": true, "config": )" + config_with_epochs(6) + "}");
      ASSERT_EQ(dry.status, 200) << dry.body;
      EXPECT_NE(dry.body.find(R"("changed":["schedule.epochs"],"applied":false)"),
                std::string::npos)
          << dry.body;
      EXPECT_EQ((*h.engine().find("j"))->config().epochs, 4);
      const HttpReply changed =
          h.post("/v1/runs/j/config", R"({"config": )" + config_with_epochs(6) + "}");
      ASSERT_EQ(changed.status, 200) << changed.body;
      EXPECT_NE(changed.body.find(R"("changed":["schedule.epochs"],"applied":true)"),
                std::string::npos)
          << changed.body;
      const auto& events = (*h.engine().find("j"))->events();
      EXPECT_TRUE(std::any_of(events.begin(), events.end(), [](const Event& e) {
        return e.kind == EventKind::kConfigChanged &&
               e.text == "changed through the API: schedule.epochs";
      }));
      // Trained on under the new config by a worker of its own, a wave at a time.
      const uint64_t done = (*h.engine().find("j"))->counters().completions_accepted;
      h.post("/v1/runs/j/workers", R"({"name": "after"})");
      const std::string after = std::to_string((*h.engine().find("j"))->workers().size() - 1);
      for (int i = 1; i <= 40; ++i) {
        const HttpReply got =
            h.post("/v1/runs/j/acquire",
                   R"({"worker": )" + after + R"(, "request": )" + std::to_string(1000 + i) + "}");
        const size_t at = got.body.find("\"lease\":");
        if (at == std::string::npos) continue;
        h.post("/v1/runs/j/complete", R"({"worker": )" + after + R"(, "lease": )" +
                                          std::to_string(std::stoull(got.body.substr(at + 8))) +
                                          R"(, "loss": 0.5, "samples": 3})");
        if (i % 9 == 0) h.commit();
      }
      h.commit();
      const traincoord::Run& run = **h.engine().find("j");
      EXPECT_GT(run.counters().completions_accepted, done) << "nothing trained after the change";
      EXPECT_EQ(run.plan().target_epoch, 6);
      before = saved_state(h.engine());
    }
    Restored r;
    ASSERT_NO_FATAL_FAILURE(restore(dir.path(), /*read_only=*/true, &r));
    const traincoord::Run& run = **r.engine.find("j");
    EXPECT_EQ(run.config().epochs, 6);
    EXPECT_EQ(saved_state(r.engine), before);
  }
}

// Rewrites a database into an older schema, as older traincoords wrote it. Schema 2: the
// completions in a table (without rowid) instead of rows of a commit's completions behind a
// view. Schema 1, besides: a log row per record (AUTOINCREMENT, an index by run), and the
// completions in a rowid table.
void rewrite_as_schema(const std::string& dir, int version) {
  std::vector<Record> records;
  {
    StoreOptions o;
    o.dir = dir;
    o.read_only = true;
    auto store = Store::open(o);
    ASSERT_TRUE(store) << store.error().message;
    ASSERT_TRUE((*store)->for_each_record([&](const Record& r) -> Result<void> {
      records.push_back(r);
      return {};
    }));
  }
  ASSERT_GT(records.size(), 100u);
  auto db = sqlite::Db::open(dir + "/traincoord.db", false);
  ASSERT_TRUE(db);
  // Schema 4: no view counted_completions, no checksum on completion_batches.
  ASSERT_TRUE(
      db->exec("DROP VIEW counted_completions; ALTER TABLE completion_batches DROP "
               "COLUMN sum"));
  if (version == 4) {
    ASSERT_TRUE(db->exec("PRAGMA user_version = 4"));
    return;
  }
  // Schema 3: no checksums, and records without their outcome (as encode_record wrote them:
  // kind, time, target, body).
  {
    auto dropped = db->exec(
        "ALTER TABLE runs DROP COLUMN sum; ALTER TABLE snapshots DROP COLUMN chain; "
        "ALTER TABLE snapshots DROP COLUMN sum; DROP TABLE log; CREATE TABLE log (seq INTEGER "
        "PRIMARY KEY, run TEXT NOT NULL, time_ms INTEGER NOT NULL, records BLOB NOT NULL)");
    ASSERT_TRUE(dropped) << dropped.error().message;
  }
  {
    auto insert = db->prepare("INSERT INTO log (seq, run, time_ms, records) VALUES (?,?,?,?)");
    ASSERT_TRUE(insert);
    for (const Record& r : records) {
      std::string blob;
      blob.push_back(static_cast<char>(r.kind));
      blob.append(reinterpret_cast<const char*>(&r.time), 8);
      for (const std::string* text : {&r.target, &r.body}) {
        const auto n = static_cast<uint32_t>(text->size());
        blob.append(reinterpret_cast<const char*>(&n), 4);
        blob += *text;
      }
      insert->bind(1, static_cast<int64_t>(&r - records.data()) + 1);  // (a row per record)
      insert->bind(2, r.run).bind(3, r.time).bind_blob(4, blob);
      ASSERT_TRUE(insert->run());
    }
  }
  if (version == 3) {
    ASSERT_TRUE(db->exec("PRAGMA user_version = 3"));
    return;
  }
  ASSERT_TRUE(
      db->exec(std::string("BEGIN; CREATE TABLE c (run TEXT NOT NULL, lease INTEGER NOT NULL, "
                           "worker TEXT NOT NULL, set_name TEXT NOT NULL, epoch INTEGER NOT NULL, "
                           "job INTEGER NOT NULL, loss REAL, samples INTEGER NOT NULL, metrics "
                           "TEXT, time_ms INTEGER NOT NULL, PRIMARY KEY (run, lease))") +
               (version == 2 ? " WITHOUT ROWID" : "") +
               "; INSERT INTO c SELECT * FROM completions; DROP VIEW completions; "
               "DROP TABLE completion_batches; ALTER TABLE c RENAME TO completions;"));
  if (version == 1) {
    ASSERT_TRUE(
        db->exec("DROP TABLE log; CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                 "run TEXT NOT NULL, time_ms INTEGER NOT NULL, kind INTEGER NOT NULL, target TEXT, "
                 "body TEXT); CREATE INDEX log_by_run ON log(run, seq);"));
    auto insert =
        db->prepare("INSERT INTO log (run, time_ms, kind, target, body) VALUES (?,?,?,?,?)");
    ASSERT_TRUE(insert);
    for (const Record& r : records) {
      insert->bind(1, r.run).bind(2, r.time).bind(3, static_cast<int>(r.kind));
      insert->bind(4, r.target).bind(5, r.body);
      ASSERT_TRUE(insert->run());
    }
  }
  ASSERT_TRUE(db->exec("PRAGMA user_version = " + std::to_string(version) + "; COMMIT"));
}

// Opens the store in `dir` and restores it: the run must be `before`, byte for byte.
void expect_restores(const std::string& dir, bool read_only, const std::string& before) {
  Restored r;
  ASSERT_NO_FATAL_FAILURE(restore(dir, read_only, &r));
  EXPECT_EQ(saved_state(r.engine), before);
}

// Every completion in the database, as text, in lease order.
std::string all_completions(const std::string& dir) {
  auto db = sqlite::Db::open(dir + "/traincoord.db", true);
  auto rows = db->scalar(
      "SELECT group_concat(run || ' ' || lease || ' ' || worker || ' ' || set_name || ' ' || "
      "epoch || ' ' || job || ' ' || coalesce(printf('%!.17g', loss), 'NULL') || ' ' || samples "
      "|| ' ' || metrics "
      "|| ' ' || time_ms, char(10)) FROM (SELECT * FROM completions ORDER BY run, lease)");
  return rows.value();
}

class StoreUpgrade : public ::testing::TestWithParam<int> {};

TEST_P(StoreUpgrade, RestoresTheSameRunAndKeepsEveryCompletion) {
  TempDir dir;
  std::string before;
  uint64_t completions = 0;
  {
    Harness h(dir.path(), 1'000'000);
    drive(h, 3);
    before = saved_state(h.engine());
    completions = (**h.engine().find("j")).counters().completions_accepted;
  }
  const std::string rows = all_completions(dir.path());
  ASSERT_EQ(std::count(rows.begin(), rows.end(), '\n') + 1, static_cast<long>(completions));
  ASSERT_NE(rows.find("{\"accuracy\""), std::string::npos);  // metrics are kept too
  rewrite_as_schema(dir.path(), GetParam());
  expect_restores(dir.path(), /*read_only=*/true, before);   // the old schema, read as it is
  expect_restores(dir.path(), /*read_only=*/false, before);  // upgraded to the current one
  auto db = sqlite::Db::open(dir.path() + "/traincoord.db", true);
  EXPECT_EQ(db->scalar("PRAGMA user_version").value(), std::to_string(Store::kSchemaVersion));
  EXPECT_EQ(all_completions(dir.path()), rows);
  EXPECT_EQ(db->scalar("SELECT count(*) FROM sqlite_master WHERE name = 'log_by_run'").value(),
            "0");
}

INSTANTIATE_TEST_SUITE_P(FromSchema, StoreUpgrade, ::testing::Values(1, 2, 3, 4));

// Issue 31, item 3: a schema 4 database whose runs schema 3 began (NULL checksums, log rows
// without outcomes, then rows with them) is upgraded to schema 5 with every checksum filled in
// and the chains whole: it restores the same run, and then a NULL is damage.
TEST(StoreUpgrade, FromSchema3Through4FillsEveryChecksum) {
  TempDir dir;
  std::string before;
  {
    Harness h(dir.path(), 1'000'000);
    drive(h, 6);
    before = saved_state(h.engine());
  }
  rewrite_as_schema(dir.path(), 3);
  {
    // Schema 3 -> 4 (as a server of schema 4 did), then more rows with checksums.
    auto db = sqlite::Db::open(dir.path() + "/traincoord.db", false);
    ASSERT_TRUE(
        db->exec("ALTER TABLE runs ADD COLUMN sum INTEGER; ALTER TABLE snapshots ADD "
                 "COLUMN chain INTEGER; ALTER TABLE snapshots ADD COLUMN sum INTEGER; "
                 "ALTER TABLE log ADD COLUMN sum INTEGER; PRAGMA user_version = 4"));
  }
  expect_restores(dir.path(), /*read_only=*/true, before);
  expect_restores(dir.path(), /*read_only=*/false, before);  // upgraded to 5
  auto db = sqlite::Db::open(dir.path() + "/traincoord.db", true);
  EXPECT_EQ(db->scalar("PRAGMA user_version").value(), "5");
  EXPECT_EQ(db->scalar("SELECT count(*) FROM log WHERE sum IS NULL").value(), "0");
  EXPECT_EQ(db->scalar("SELECT count(*) FROM runs WHERE sum IS NULL").value(), "0");
  EXPECT_EQ(db->scalar("SELECT count(*) FROM completion_batches WHERE sum IS NULL").value(), "0");
  expect_restores(dir.path(), /*read_only=*/true, before);  // as schema 5, strictly
}

TEST(Store, RefusesAFileThatIsNotADatabase) {
  TempDir dir;
  { std::ofstream(dir.path() + "/traincoord.db") << "this is not a database, it is a diary"; }
  StoreOptions o;
  o.dir = dir.path();
  auto store = Store::open(o);
  ASSERT_FALSE(store);
  EXPECT_NE(store.error().message.find("not a SQLite database"), std::string::npos)
      << store.error().message;
  std::ifstream in(dir.path() + "/traincoord.db");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "this is not a database, it is a diary");  // untouched
}

TEST(Store, RefusesAForeignDatabase) {
  TempDir dir;
  {
    auto db = sqlite::Db::open(dir.path() + "/traincoord.db", false);
    ASSERT_TRUE(db->exec("CREATE TABLE photos (id INTEGER)"));
  }
  StoreOptions o;
  o.dir = dir.path();
  auto store = Store::open(o);
  ASSERT_FALSE(store);
  EXPECT_NE(store.error().message.find("did not write"), std::string::npos);
}

TEST(Store, RefusesADatabaseOfANewerVersion) {
  TempDir dir;
  {
    StoreOptions o;
    o.dir = dir.path();
    ASSERT_TRUE(Store::open(o));
    auto db = sqlite::Db::open(dir.path() + "/traincoord.db", false);
    ASSERT_TRUE(db->exec("PRAGMA user_version = 99"));
  }
  StoreOptions o;
  o.dir = dir.path();
  auto store = Store::open(o);
  ASSERT_FALSE(store);
  EXPECT_NE(store.error().message.find("newer traincoord"), std::string::npos);
}

// ---- What the journal keeps, and how a restart checks it (issue 16, items 1-5) ----

std::string open_error(const StoreOptions& o) {
  auto store = Store::open(o);
  return store ? std::string() : store.error().message;
}

std::string restore_error(const std::string& dir) {
  StoreOptions o;
  o.dir = dir;
  o.read_only = true;
  auto store = Store::open(o);
  if (!store) return store.error().message;
  ServerClock clock;
  Engine engine(clock);
  Api api(engine, clock, ApiLimits::none());
  auto report = restore_engine(**store, engine, api, clock);
  return report ? std::string() : report.error().message;
}

int64_t log_rows(const std::string& dir) {
  auto db = sqlite::Db::open(dir + "/traincoord.db", true);
  return std::stoll(db->scalar("SELECT count(*) FROM log").value());
}

// Item 1: refused requests are not logged, so a restart (with any limits) cannot replay them
// as accepted; and an acquire that found nothing writes nothing.
TEST(JournalKeeps, OnlyWhatChangedState) {
  TempDir dir;
  {
    ApiLimits limits;
    limits.max_workers_per_run = 1;
    Harness h(dir.path(), 1'000'000, limits);
    ASSERT_EQ(h.post("/v1/runs", kConfig).status, 201);
    ASSERT_EQ(h.post("/v1/runs/j/workers", R"({"name": "w0"})").status, 200);
    EXPECT_EQ(h.post("/v1/runs/j/workers", R"({"name": "intruder"})").status, 409);
    EXPECT_EQ(h.post("/v1/runs/j/acquire", R"({"worker": 1, "jobs": 4})").status, 404);
    const std::string big(1 << 20, 'x');
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(h.post("/v1/runs/j/complete", R"({"worker": 7, "pad": ")" + big + "\"}").status,
                404);
    }
    h.commit();
    EXPECT_EQ(h.logged(), 1u);  // the registration of w0, nothing else
    EXPECT_EQ(log_rows(dir.path()), 1);
    EXPECT_LT(std::filesystem::file_size(dir.path() + "/traincoord.db") +
                  std::filesystem::file_size(dir.path() + "/traincoord.db-wal"),
              uint64_t{1} << 20);
    // Two jobs out, an acquire that finds nothing (same request id) changes nothing.
    ASSERT_EQ(h.post("/v1/runs/j/acquire", R"({"worker": 0, "request": 1, "jobs": 40})").status,
              200);
    const uint64_t before = h.logged();
    for (int i = 0; i < 10; ++i) h.post("/v1/runs/j/acquire", R"({"worker": 0, "request": 2})");
    EXPECT_EQ(h.logged(), before + 1);  // the first (a new request id), not the other nine
    h.commit();
  }
  ServerClock clock;
  Engine engine(clock);
  Api api(engine, clock, ApiLimits::none());
  StoreOptions o;
  o.dir = dir.path();
  auto store = Store::open(o);
  ASSERT_TRUE(store) << store.error().message;
  ASSERT_TRUE(restore_engine(**store, engine, api, clock));
  const traincoord::Run& run = **engine.find("j");
  ASSERT_EQ(run.workers().size(), 1u);
  EXPECT_EQ(run.workers()[0].name, "w0");
}

// Item 1: replay answers every record as it was answered when it came, or the restart stops.
TEST(JournalKeeps, ARecordThatReplaysDifferentlyStopsTheRestart) {
  TempDir dir;
  {
    Harness h(dir.path(), 1'000'000);
    ASSERT_EQ(h.post("/v1/runs", kConfig).status, 201);
    ASSERT_EQ(h.post("/v1/runs/j/workers", R"({"name": "w0"})").status, 200);
    // A record as a bug (or another version) would have written it: said accepted, but the
    // worker does not exist.
    h.store().add_record("j", 5, RecordKind::kRequest, "/v1/runs/j/acquire", R"({"worker": 3})",
                         200);
    h.commit();
  }
  const std::string error = restore_error(dir.path());
  EXPECT_NE(error.find("does not replay as it was"), std::string::npos) << error;
  EXPECT_NE(error.find("answered HTTP 200 when it came, but HTTP 404 now"), std::string::npos)
      << error;
  EXPECT_NE(error.find("/v1/runs/j/acquire"), std::string::npos) << error;
}

// Changes one byte of a blob column (the first `find` in it, or its middle byte) in the row
// `where` selects.
void damage_blob(const std::string& dir, const std::string& table, const std::string& column,
                 const std::string& where, const std::string& find, char to) {
  auto db = sqlite::Db::open(dir + "/traincoord.db", false);
  ASSERT_TRUE(db);
  auto read = db->prepare("SELECT rowid, " + column + " FROM " + table + " WHERE " + where);
  ASSERT_TRUE(read);
  int64_t rowid = 0;
  std::string blob;
  while (true) {
    auto row = read->step();
    ASSERT_TRUE(row);
    ASSERT_TRUE(*row) << "no row of " << table << " to damage";
    blob = read->blob(1);
    if (find.empty() || blob.find(find) != std::string::npos) {
      rowid = read->int64(0);
      read->reset();
      break;
    }
  }
  const size_t at = find.empty() ? blob.size() / 2 : blob.find(find) + find.size() - 1;
  ASSERT_NE(blob[at], to);
  blob[at] = to;
  auto write = db->prepare("UPDATE " + table + " SET " + column + " = ? WHERE rowid = ?");
  ASSERT_TRUE(write);
  write->bind_blob(1, blob).bind(2, rowid);
  ASSERT_TRUE(write->run());
}

// Item 2: a changed byte anywhere in what the restart reads is found, and named.
TEST(JournalKeeps, AChecksumOnEveryRowSnapshotAndConfig) {
  const std::vector<std::pair<const char*, std::function<void(const std::string&)>>> damages = {
      {"a loss in a log row",
       [](const std::string& d) {
         // (`"loss": 1.5` becomes `"loss":91.5`)
         damage_blob(d, "log", "records", "1", "\"loss\": ", '9');
       }},
      {"a byte of a snapshot",
       [](const std::string& d) { damage_blob(d, "snapshots", "state", "1", "", '\x7f'); }},
      {"a missing log row",
       [](const std::string& d) {
         auto db = sqlite::Db::open(d + "/traincoord.db", false);
         ASSERT_TRUE(db->exec("DELETE FROM log WHERE seq = (SELECT min(seq) + 5 FROM log)"));
       }},
      {"a time in a log row",
       [](const std::string& d) {
         auto db = sqlite::Db::open(d + "/traincoord.db", false);
         ASSERT_TRUE(
             db->exec("UPDATE log SET time_ms = time_ms + 1 WHERE seq = (SELECT max(seq) "
                      "FROM log)"));
       }},
      {"the config", [](const std::string& d) {
         auto db = sqlite::Db::open(d + "/traincoord.db", false);
         ASSERT_TRUE(
             db->exec("UPDATE runs SET config = replace(config, '\"epochs\": 4', "
                      "'\"epochs\": 5')"));
       }}};
  for (const auto& [what, damage] : damages) {
    SCOPED_TRACE(what);
    TempDir dir;
    {
      // A snapshot (of the first 30 records) where the snapshot is damaged; elsewhere none:
      // the log is read from its start (rows a snapshot covers are never read again).
      Harness h(dir.path(),
                std::string(what).find("snapshot") != std::string::npos ? 30 : 1'000'000);
      drive(h, 5);
    }
    ASSERT_EQ(restore_error(dir.path()), "");
    ASSERT_NO_FATAL_FAILURE(damage(dir.path()));
    const std::string error = restore_error(dir.path());
    EXPECT_NE(error.find("fails its checksum"), std::string::npos) << error;
    EXPECT_NE(error.find("run j"), std::string::npos) << error;
  }
}

// Item 3: one writer per data dir; a reader (inspect) may look at one in use.
TEST(JournalKeeps, OneWriterPerDataDir) {
  TempDir dir;
  StoreOptions o;
  o.dir = dir.path();
  auto first = Store::open(o);
  ASSERT_TRUE(first) << first.error().message;
  const std::string error = open_error(o);
  EXPECT_NE(error.find("is in use by another traincoord process (pid " +
                       std::to_string(::getpid()) + ")"),
            std::string::npos)
      << error;
  o.read_only = true;
  EXPECT_EQ(open_error(o), "");
  o.read_only = false;
  first->reset();  // closed: free again
  EXPECT_EQ(open_error(o), "");
}

// Item 4: a start on a disk with less than the reserve free is refused.
TEST(JournalKeeps, NoStartWithoutRoomOnTheDisk) {
  TempDir dir;
  StoreOptions o;
  o.dir = dir.path();
  o.min_free_bytes = uint64_t{1} << 62;
  const std::string error = open_error(o);
  EXPECT_NE(error.find("is full or nearly"), std::string::npos) << error;
  EXPECT_NE(error.find("--min-free-disk"), std::string::npos) << error;
}

// Item 5: commits lost after they were made (a deleted -wal file) are reported at the start.
TEST(JournalKeeps, LostCommitsAreReportedAtTheStart) {
  TempDir dir;
  {
    Harness h(dir.path(), 1'000'000);
    drive(h, 2);
  }
  StoreOptions o;
  o.dir = dir.path();
  {
    auto store = Store::open(o);
    ASSERT_TRUE(store);
    EXPECT_TRUE((*store)->take_notices().empty());
  }
  {
    auto db = sqlite::Db::open(dir.path() + "/traincoord.db", false);
    ASSERT_TRUE(db->exec("DELETE FROM log WHERE seq > (SELECT max(seq) - 3 FROM log)"));
  }
  auto store = Store::open(o);
  ASSERT_TRUE(store);
  const auto notices = (*store)->take_notices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("lost commits"), std::string::npos) << notices[0];
  EXPECT_NE(notices[0].find("3 commits are lost"), std::string::npos) << notices[0];
  store->reset();
  auto again = Store::open(o);  // said once: the head now is what the database holds
  ASSERT_TRUE(again);
  EXPECT_TRUE((*again)->take_notices().empty());
}

// ---- Issue 31: the data dir's files, the single writer, integrity, restores ----

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Item 1: a link planted in the data dir for any file the store opens is refused, naming it,
// and what it points to is not touched.
TEST(DataDirFiles, ALinkPlantedForAnyFileIsRefusedAndItsTargetUntouched) {
  for (const char* name : {"traincoord.head", "traincoord.lock", "traincoord.db",
                           "traincoord.db-wal", "traincoord.db-shm", "traincoord.db-journal"}) {
    SCOPED_TRACE(name);
    TempDir dir;
    const std::string data = dir.path() + "/data";
    {
      Harness h(data, 1'000'000);  // a data dir in use before
      ASSERT_EQ(h.post("/v1/runs", kConfig).status, 201);
      h.commit();
    }
    const std::string target = dir.path() + "/outside";
    std::ofstream(target) << "known content";
    std::filesystem::remove(data + "/" + name);
    std::filesystem::create_symlink(target, data + "/" + name);
    StoreOptions o;
    o.dir = data;
    const std::string error = open_error(o);
    EXPECT_NE(error.find(data + "/" + name), std::string::npos) << error;
    EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
    EXPECT_EQ(file_text(target), "known content");
    // A dangling link is not followed to make a file either.
    std::filesystem::remove(target);
    EXPECT_NE(open_error(o), "");
    EXPECT_FALSE(std::filesystem::exists(target));
  }
}

// Item 1: a data dir other users may write to is refused, saying the mode and the chmod.
TEST(DataDirFiles, ADataDirOthersMayWriteIsRefused) {
  for (mode_t mode : {0777, 01777, 0770}) {
    TempDir dir;
    const std::string data = dir.path() + "/data";
    ASSERT_EQ(::mkdir(data.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(data.c_str(), mode), 0);
    StoreOptions o;
    o.dir = data;
    const std::string error = open_error(o);
    EXPECT_NE(error.find("chmod 700 " + data), std::string::npos) << error;
    EXPECT_NE(error.find(mode_text(mode)), std::string::npos) << error;
  }
}

// Item 1: a hard link (another name of a file elsewhere) is refused too.
TEST(DataDirFiles, AHardLinkedHeadIsRefused) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  {
    StoreOptions o;
    o.dir = data;
    ASSERT_TRUE(Store::open(o));
  }
  ASSERT_EQ(::link((data + "/traincoord.head").c_str(), (dir.path() + "/other").c_str()), 0);
  StoreOptions o;
  o.dir = data;
  const std::string error = open_error(o);
  EXPECT_NE(error.find("hard links"), std::string::npos) << error;
}

// Item 2: the lock is the data dir's own: a deleted lock file does not let a second writer in.
TEST(DataDirFiles, DeletingTheLockFileLetsNoSecondWriterIn) {
  TempDir dir;
  StoreOptions o;
  o.dir = dir.path();
  auto first = Store::open(o);
  ASSERT_TRUE(first) << first.error().message;
  ASSERT_TRUE(std::filesystem::remove(dir.path() + "/traincoord.lock"));
  const std::string error = open_error(o);
  EXPECT_NE(error.find("is in use by another traincoord process"), std::string::npos) << error;
  first->reset();
  EXPECT_EQ(open_error(o), "");
}

// Item 3: a NULL where a checksum belongs is damage, as a wrong checksum is: in a config, a
// snapshot, a log row.
TEST(JournalKeeps, ANullChecksumIsDamageWhereverItIs) {
  const std::vector<std::pair<const char*, const char*>> damages = {
      {"the config", "UPDATE runs SET sum = NULL"},
      {"a snapshot", "UPDATE snapshots SET sum = NULL"},
      {"a log row", "UPDATE log SET sum = NULL WHERE seq = (SELECT max(seq) FROM log)"}};
  for (const auto& [what, sql] : damages) {
    SCOPED_TRACE(what);
    TempDir dir;
    {
      Harness h(dir.path(), std::string(what) == "a snapshot" ? 30 : 1'000'000);
      drive(h, 5);
    }
    ASSERT_EQ(restore_error(dir.path()), "");
    {
      auto db = sqlite::Db::open(dir.path() + "/traincoord.db", false);
      ASSERT_TRUE(db->exec(sql));
    }
    const std::string error = restore_error(dir.path());
    EXPECT_NE(error.find("has no checksum"), std::string::npos) << error;
    EXPECT_NE(error.find("run j"), std::string::npos) << error;
  }
}

// Item 3: a head file that cannot be read refuses the start, saying why and what to do (it is
// what finds a lost tail of the log: here one byte of it and the last log row are gone).
TEST(JournalKeeps, AnUnreadableHeadRefusesTheStartSayingWhatToDo) {
  TempDir dir;
  {
    Harness h(dir.path(), 1'000'000);
    drive(h, 2);
  }
  {
    auto db = sqlite::Db::open(dir.path() + "/traincoord.db", false);
    ASSERT_TRUE(db->exec("DELETE FROM log WHERE seq = (SELECT max(seq) FROM log)"));
    std::fstream head(dir.path() + "/traincoord.head",
                      std::ios::in | std::ios::out | std::ios::binary);
    head.seekp(20);
    head.put('\x55');
  }
  StoreOptions o;
  o.dir = dir.path();
  const std::string error = open_error(o);
  EXPECT_NE(error.find("traincoord.head is damaged"), std::string::npos) << error;
  EXPECT_NE(error.find("rm " + dir.path() + "/traincoord.head"), std::string::npos) << error;
  // Removed, the start goes on, and says loudly that it could not check.
  ASSERT_TRUE(std::filesystem::remove(dir.path() + "/traincoord.head"));
  auto store = Store::open(o);
  ASSERT_TRUE(store) << store.error().message;
  const auto notices = (*store)->take_notices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("WARNING"), std::string::npos) << notices[0];
  EXPECT_NE(notices[0].find("cannot be checked"), std::string::npos) << notices[0];
}

// The epochs table, as SQL reads it.
std::string epochs_table(const std::string& dir) {
  auto db = sqlite::Db::open(dir + "/traincoord.db", true);
  auto rows = db->prepare(
      "SELECT run, set_name, epoch, jobs, done, failed, closed, printf('%.17g', loss), samples, "
      "nonfinite_jobs FROM epochs ORDER BY run, set_name, epoch");
  std::string out;
  while (rows && *rows->step()) {
    for (int c = 0; c < 10; ++c) out += rows->text(c) + (c < 9 ? "," : "\n");
  }
  return out;
}

// A start as the server's: the store opened, the engine restored, the first commit made.
void start_and_commit(const std::string& dir) {
  StoreOptions o;
  o.dir = dir;
  auto store = Store::open(o);
  ASSERT_TRUE(store) << store.error().message;
  ServerClock clock;
  Engine engine(clock);
  Api api(engine, clock, ApiLimits::none());
  auto report = restore_engine(**store, engine, api, clock);
  ASSERT_TRUE(report) << report.error().message;
  ASSERT_TRUE((*store)->commit(engine));
}

// Item 3: the epochs table is derived from the runs' state at each start: rows edited, added
// or deleted by hand do not last.
TEST(JournalKeeps, TheEpochsTableIsWrittenAgainFromTheStateAtTheStart) {
  TempDir dir;
  {
    Harness h(dir.path(), 1'000'000);
    drive(h, 3);
  }
  const std::string before = epochs_table(dir.path());
  ASSERT_NE(before.find(",1,"), std::string::npos) << before;  // a closed epoch
  {
    auto db = sqlite::Db::open(dir.path() + "/traincoord.db", false);
    ASSERT_TRUE(db->exec("UPDATE epochs SET loss = 42 WHERE closed"));
    ASSERT_TRUE(db->exec("DELETE FROM epochs WHERE rowid = (SELECT max(rowid) FROM epochs)"));
    ASSERT_TRUE(db->exec("INSERT INTO epochs VALUES ('ghost', 'train', 9, 1, 1, 0, 1, 7, 1, 0)"));
  }
  ASSERT_NE(epochs_table(dir.path()), before);
  ASSERT_NO_FATAL_FAILURE(start_and_commit(dir.path()));
  EXPECT_EQ(epochs_table(dir.path()), before);
}

// Item 3: the completions table (not part of the state a start checks) is covered by a
// checksum chain, which inspect checks: a row edited or removed by hand is found.
TEST(JournalKeeps, AnEditedCompletionRowIsFoundByItsChecksum) {
  for (const char* edit : {"UPDATE completion_batches SET rows = replace(rows, ',3,', ',4,') "
                           "WHERE id = (SELECT min(id) FROM completion_batches)",
                           "DELETE FROM completion_batches WHERE id = 2"}) {
    SCOPED_TRACE(edit);
    TempDir dir;
    {
      Harness h(dir.path(), 1'000'000);
      drive(h, 4);
    }
    StoreOptions o;
    o.dir = dir.path();
    o.read_only = true;
    {
      auto store = Store::open(o);
      ASSERT_TRUE(store);
      auto rows = (*store)->check_completions();
      ASSERT_TRUE(rows) << rows.error().message;
      EXPECT_GT(*rows, 2u);
    }
    {
      auto db = sqlite::Db::open(dir.path() + "/traincoord.db", false);
      ASSERT_TRUE(db->exec(edit));
    }
    auto store = Store::open(o);
    ASSERT_TRUE(store);
    auto rows = (*store)->check_completions();
    ASSERT_FALSE(rows);
    EXPECT_NE(rows.error().message.find("fails its checksum"), std::string::npos)
        << rows.error().message;
  }
}

// Item 9: a completed run restored from a cut and trained again shows, in SQL and in its
// history, the lineage it now has: the epoch's new loss, and only the completions it counts.
// A rank of `group` (worker `worker`) trains `jobs` jobs of run j, each reporting `loss`.
void train_in_group(Harness& h, const std::string& worker, const std::string& group,
                    const char* loss, int jobs = 4) {
  auto lease_of = [](const std::string& body) {
    const auto at = body.find("\"lease\":");
    return at == std::string::npos ? std::string("0")
                                   : std::to_string(std::stoull(body.substr(at + 8)));
  };
  for (int job = 0; job < jobs; ++job) {
    const HttpReply a =
        h.post("/v1/runs/j/acquire", R"({"worker": )" + worker + R"(, "group": ")" + group + "\"}");
    ASSERT_EQ(a.status, 200) << a.body;
    const HttpReply c =
        h.post("/v1/runs/j/complete", R"({"worker": )" + worker + R"(, "group": ")" + group +
                                          R"(", "lease": )" + lease_of(a.body) + R"(, "loss": )" +
                                          loss + R"(, "samples": 1})");
    ASSERT_EQ(c.status, 200) << c.body;
    ASSERT_NE(c.body.find("\"counted\":true"), std::string::npos) << c.body;
  }
}

TEST(JournalKeeps, ARestoredRunShowsTheLineageItNowHasInSqlAndHistory) {
  TempDir dir;
  auto train = [&](Harness& h, const std::string& worker, const std::string& group,
                   const char* loss) { train_in_group(h, worker, group, loss); };
  {
    Harness h(dir.path(), 1'000'000);
    ASSERT_EQ(h.post("/v1/runs", R"({"name": "j", "data": {"train_batches": 4},
                                     "schedule": {"epochs": 1}})")
                  .status,
              201);
    ASSERT_EQ(h.post("/v1/runs/j/workers", R"({"name": "a", "group": "g1"})").status, 200);
    ASSERT_EQ(h.post("/v1/runs/j/cuts", R"({"worker": 0, "group": "g1", "seq": 1})").status, 200);
    ASSERT_NO_FATAL_FAILURE(train(h, "0", "g1", "1"));
    h.commit();
    ASSERT_NE(epochs_table(dir.path()).find(",1,1,4,"), std::string::npos)
        << epochs_table(dir.path());
    ASSERT_EQ(h.post("/v1/runs/j/workers", R"({"name": "b", "group": "g2"})").status, 200);
    const HttpReply r = h.post("/v1/runs/j/restore", R"({"group": "g2", "cut": 1})");
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_NO_FATAL_FAILURE(train(h, "1", "g2", "3"));
    h.commit();
    const std::string history = h.get("/v1/runs/j/history").body;
    size_t jobs = 0;
    for (auto at = history.find("\"job\":"); at != std::string::npos;
         at = history.find("\"job\":", at + 1)) {
      jobs += 1;
    }
    EXPECT_EQ(jobs, 4u) << history;
    EXPECT_EQ(history.find("\"loss\":1,"), std::string::npos) << history;
  }
  auto losses = [&] {
    auto db = sqlite::Db::open(dir.path() + "/traincoord.db", true);
    return db->scalar("SELECT group_concat(train_loss) FROM losses WHERE run = 'j'").value();
  };
  EXPECT_EQ(losses(), "3.0");
  ASSERT_NO_FATAL_FAILURE(start_and_commit(dir.path()));  // and after a restart
  EXPECT_EQ(losses(), "3.0");
  // `completions` keeps every accepted completion; `counted_completions` those counted now.
  auto db = sqlite::Db::open(dir.path() + "/traincoord.db", true);
  EXPECT_EQ(db->scalar("SELECT count(*) FROM completions").value(), "8");
  EXPECT_EQ(db->scalar("SELECT count(*) || ' ' || sum(loss) FROM counted_completions").value(),
            "4 12.0");
}

// A completion's number (`n`) is its place among the run's counted completions, the same in the
// history's job rows and in the series, also after a restore withdrew completions in between:
// 2 jobs, a cut, 2 jobs (withdrawn by the restore), 2 jobs again: the history lists 1, 2, 5, 6.
TEST(JournalKeeps, AHistoryJobAndItsSeriesPointHaveOneNumberAfterARestore) {
  TempDir dir;
  Harness h(dir.path(), 1'000'000);
  ASSERT_EQ(h.post("/v1/runs", R"({"name": "j", "data": {"train_batches": 8},
                                   "schedule": {"epochs": 1}})")
                .status,
            201);
  ASSERT_EQ(h.post("/v1/runs/j/workers", R"({"name": "a", "group": "g1"})").status, 200);
  ASSERT_NO_FATAL_FAILURE(train_in_group(h, "0", "g1", "1", 2));
  ASSERT_EQ(h.post("/v1/runs/j/cuts", R"({"worker": 0, "group": "g1", "seq": 1})").status, 200);
  ASSERT_NO_FATAL_FAILURE(train_in_group(h, "0", "g1", "2", 2));
  ASSERT_EQ(h.post("/v1/runs/j/workers", R"({"name": "b", "group": "g2"})").status, 200);
  ASSERT_EQ(h.post("/v1/runs/j/restore", R"({"group": "g2", "cut": 1})").status, 200);
  ASSERT_NO_FATAL_FAILURE(train_in_group(h, "1", "g2", "3", 2));
  rapidjson::Document history, series;
  history.Parse(h.get("/v1/runs/j/history").body.c_str());
  series.Parse(h.get("/v1/runs/j/series").body.c_str());
  std::map<uint64_t, double> points;  // the train loss series' points, by n
  for (const auto& s : series["series"].GetArray()) {
    if (std::string(s["set"].GetString()) != "train" ||
        std::string(s["name"].GetString()) != "loss")
      continue;
    for (const auto& p : s["points"].GetArray()) points[p[0].GetUint64()] = p[2].GetDouble();
  }
  EXPECT_EQ(points.size(), 6u);  // (the series keeps the lineage abandoned)
  std::vector<uint64_t> numbers;
  for (const auto& job : history["jobs"].GetArray()) {
    const uint64_t n = job["n"].GetUint64();
    numbers.push_back(n);
    ASSERT_TRUE(points.contains(n)) << n;
    EXPECT_EQ(points[n], job["loss"].GetDouble()) << n;
  }
  EXPECT_EQ(numbers, (std::vector<uint64_t>{1, 2, 5, 6}));
  rapidjson::Document newer;
  newer.Parse(h.get("/v1/runs/j/history?jobs_after=2").body.c_str());
  ASSERT_EQ(newer["jobs"].Size(), 2u);
  EXPECT_EQ(newer["jobs"][0]["n"].GetUint64(), 5u);
}

}  // namespace
}  // namespace traincoord
