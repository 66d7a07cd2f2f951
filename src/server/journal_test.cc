// The durable store brings a run back exactly: drive the API as the server does (each request
// at one instant, logged, committed in batches), then restore into a fresh engine from the
// data dir and compare the whole saved state byte for byte.
#include "server/journal.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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
  Harness(const std::string& dir, uint64_t snapshot_every) {
    StoreOptions o;
    o.dir = dir;
    o.durability = Durability::kOs;
    o.snapshot_every = snapshot_every;
    store_ = std::move(*Store::open(o));
    observer_ = std::make_unique<StoreObserver>(*store_);
    api_.set_observer(observer_.get());
    clock_.replay_at(0);
  }

  HttpReply post(const std::string& target, const std::string& body) {
    const TimeMs t = clock_.hold();
    auto result = api_.handle({"POST", target, body, {}});
    clock_.release();
    const std::string_view run = Api::run_of(target);
    if (!run.empty() && engine_.find(std::string(run))) {
      store_->add_record(run, t, RecordKind::kRequest, target, body);
    }
    return std::holds_alternative<HttpReply>(result) ? std::get<HttpReply>(result) : HttpReply{};
  }

  void tick() {
    const TimeMs t = clock_.hold();
    for (const std::string& run : api_.expire_leases()) {
      store_->add_record(run, t, RecordKind::kExpire, "", "");
    }
    clock_.release();
  }

  void commit() {
    ASSERT_TRUE(store_->commit(engine_));
    ASSERT_TRUE(store_->snapshot_due(engine_, clock_.now()));
  }

  void advance(TimeMs dt) { clock_.replay_at(clock_.now() + dt); }
  Engine& engine() { return engine_; }

 private:
  ServerClock clock_;
  Engine engine_{clock_};
  Api api_{engine_, clock_};
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreObserver> observer_;
};

std::string saved_state(Engine& engine) { return RunCodec::save(**engine.find("j")); }

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
    ASSERT_TRUE((*store)->for_each_record([&](const Record& r) { records.push_back(r); }));
  }
  ASSERT_GT(records.size(), 100u);
  auto db = sqlite::Db::open(dir + "/traincoord.db", false);
  ASSERT_TRUE(db);
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

INSTANTIATE_TEST_SUITE_P(FromSchema, StoreUpgrade, ::testing::Values(1, 2));

TEST(Store, RefusesAFileThatIsNotADatabase) {
  TempDir dir;
  { std::ofstream(dir.path() + "/traincoord.db") << "this is not a database, it is a diary"; }
  StoreOptions o;
  o.dir = dir.path();
  auto store = Store::open(o);
  ASSERT_FALSE(store);
  EXPECT_NE(store.error().message.find("not a SQLite database, or corrupt"), std::string::npos)
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

}  // namespace
}  // namespace traincoord
