// The server's own rules, by deterministic simulation (as the core's are in
// core/simulation_property_test.cc): the Coordinator with an in-memory journal and a manual
// clock, workers that register, acquire (some with long polls), complete, fail and die, and
// the server's faults — a crash between taking a wave's writes and writing them, replies lost
// after their commit, long polls that time out, retries with the same request id, restarts in
// the middle of a long poll, a disk that fills up and is freed. Each schedule comes from a seed:
//   TRAINCOORD_SERVER_SIM_SEED=1234 build/traincoord_tests --gtest_filter='CoordinatorSimulation.*'
// replays one; TRAINCOORD_SERVER_SIM_SEEDS=2000 runs more (200 by default).
//
// Checked, at every restart and at the end:
// - nothing accepted is lost and nothing unaccepted is kept: the restored run is, byte for
//   byte, the run as of the last wave whose writes were durable (RunCodec::save_journalled);
// - replay reproduces every journalled reply, status and body (restore_engine checks it);
// - no job of an epoch is acknowledged "accepted" to a worker twice, and every completion the
//   run counts was written to the journal;
// - no reply leaves before its wave is written;
// - the run finishes: every epoch closes with each job done or failed.
#include "server/coordinator.h"

#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "config/config_file.h"
#include "core/cost_test_config.h"
#include "core/run_codec.h"
#include "journal/memory_journal.h"
#include "seeds.h"
#include "server/restore.h"

namespace traincoord {
namespace {

constexpr TimeMs kLeaseMs = 1000;

std::string config_json(std::mt19937_64& rng) {
  const int train = 6 + static_cast<int>(rng() % 10);
  const int dev = 2 + static_cast<int>(rng() % 4);
  const int per_job = 1 + static_cast<int>(rng() % 3);
  return R"({"name": "s", "data": {"train_batches": )" + std::to_string(train) +
         R"(, "dev_batches": )" + std::to_string(dev) + R"(}, "schedule": {"epochs": 3, )" +
         R"("iters_per_worker": )" + std::to_string(per_job) +
         R"(}, "leases": {"timeout": 1.0, "max_attempts": 1000, "on_job_failure": "skip"}, )" +
         R"("early_stop": {"rule": "none"}})";
}

// One life of the coordinator process: its clock, engine and coordinator, restored from the
// journal as `traincoord serve` does.
struct Process {
  Process(const Clock& wall, MemoryJournal& journal, bool first) : clock(&wall), engine(clock) {
    if (first) {
      clock.go_live(wall.now());
    } else {
      Api replay(engine, clock, ApiLimits::none());
      auto report = restore_engine(journal, engine, replay, clock);
      restored = report.has_value();
      if (!report) restore_error = report.error().message;
    }
    coordinator = std::make_unique<Coordinator>(engine, clock, &journal, CoordinatorOptions{});
  }
  std::string state() {
    auto run = engine.find("s");
    return run ? RunCodec::save_journalled(**run) : std::string();
  }

  ServerClock clock;
  Engine engine;
  std::unique_ptr<Coordinator> coordinator;
  bool restored = true;
  std::string restore_error;
};

using JobKey = std::tuple<std::string, int64_t, uint64_t>;  // set, epoch, job index

struct Worker {
  std::string name;
  std::optional<uint64_t> id;
  std::vector<uint64_t> leases;
  std::map<uint64_t, JobKey> jobs;       // of each lease it was handed
  std::vector<uint64_t> sent;            // the leases the request in flight reports
  std::optional<HttpRequest> in_flight;  // sent, no reply yet
  TimeMs sent_at = 0;
  uint64_t sends = 0;  // a reply to an earlier send of the request than the last is ignored
  uint64_t next_request = 1;
  TimeMs dead_until = 0;
};

// What the schedules did, in all: so that a reader sees the faults were there.
struct Stats {
  uint64_t replies = 0, accepted = 0, lost_replies = 0, restarts = 0, waves_lost = 0,
           parked_at_crash = 0, disk_full = 0, refused_full = 0;
  size_t parked_max = 0;
};
Stats stats;

class Simulation {
 public:
  explicit Simulation(uint64_t seed) : rng_(seed), journal_(1 + rng_() % 40) {
    for (int i = 0; i < 2 + static_cast<int>(rng_() % 4); ++i) {
      workers_.emplace_back();
      workers_.back().name = "w" + std::to_string(i);
    }
    process_ = std::make_unique<Process>(wall_, journal_, true);
  }

  void run() {
    send_admin(HttpRequest{"POST", "/v1/runs", config_json(rng_), {}});
    for (int step = 0; step < 20'000 && !finished(); ++step) {
      for (size_t w = 0; w < workers_.size(); ++w) {
        if (pick(3) == 0) act(w);
      }
      step_coordinator();
      // The commit pipeline: writes some of the waves waiting (in order), then sends their
      // replies; now and then a reply is lost on its way.
      while (!pipeline_.empty() && pick(3) != 0 && write_one()) {
      }
      if (pick(400) == 0) crash();
      if (pick(1500) == 0) {  // the disk fills up ...
        journal_.set_full(true);
        stats.disk_full += 1;
      }
      if (journal_.low_on_room() && pick(100) == 0) journal_.set_full(false);  // ... is freed
      if (::testing::Test::HasFatalFailure()) return;
      wall_.advance(pick(4) == 0 ? 0 : 1 + pick(40));
    }
    journal_.set_full(false);
    while (!pipeline_.empty()) ASSERT_TRUE(write_one());
    ASSERT_TRUE(finished()) << "the run did not finish";
    check_done();
  }

 private:
  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

  bool finished() {
    auto run = process_->engine.find("s");
    return run && (*run)->state() != RunState::kRunning;
  }

  void send_admin(HttpRequest request) {
    calls_.push_back(Call{std::move(request), ReplyTo{[](HttpReply) {}, {}}});
  }

  void send(size_t w, std::string target, std::string body, std::vector<uint64_t> sent = {}) {
    Worker& worker = workers_[w];
    worker.sent = std::move(sent);
    worker.in_flight = HttpRequest{"POST", "/v1/runs/s/" + target, std::move(body), {}};
    worker.sent_at = wall_.now();
    resend(w);
  }

  void resend(size_t w) {
    Worker& worker = workers_[w];
    worker.sent_at = wall_.now();
    const uint64_t life = lives_, send = ++worker.sends;
    auto respond = [this, w, life, send](HttpReply reply) {
      on_reply(w, life, send, std::move(reply));
    };
    calls_.push_back(Call{*worker.in_flight, ReplyTo{respond, {}}});
  }

  // What a worker does now: at most one request in flight; a reply that does not come within
  // two seconds (lost, or the coordinator crashed) is asked again, the same request.
  void act(size_t w) {
    Worker& worker = workers_[w];
    if (wall_.now() < worker.dead_until) return;
    if (worker.in_flight) {
      if (wall_.now() - worker.sent_at > 2000) resend(w);
      return;
    }
    if (!worker.id) {
      send(w, "workers", R"({"name": ")" + worker.name + R"(", "group": "g"})");
      return;
    }
    const std::string me = R"({"group": "g", "worker": )" + std::to_string(*worker.id);
    if (pick(60) == 0) {  // dies; its leases expire; it comes back later under its name
      worker.leases.clear();
      worker.id.reset();
      worker.dead_until = wall_.now() + 500 + pick(3000);
      return;
    }
    const std::string wait =
        pick(2) == 0 ? R"(, "wait_ms": )" + std::to_string(50 + pick(1500)) : std::string();
    const std::string jobs = pick(3) == 0 ? R"(, "jobs": 2)" : std::string();
    const std::string request = R"(, "request": )" + std::to_string(worker.next_request++);
    if (pick(40) == 0) {  // a checkpoint cut of a group of one (journalled, replayed)
      send(w, "cuts", me + R"(, "seq": )" + std::to_string(++cut_seq_) + R"(, "world_size": 1})");
    } else if (worker.leases.empty()) {
      send(w, "acquire", me + wait + jobs + request + "}");
    } else if (pick(15) == 0) {
      send(w, "fail", me + R"(, "lease": )" + std::to_string(worker.leases.back()) + "}");
      worker.leases.pop_back();
    } else if (pick(10) == 0) {
      send(w, "heartbeat", me + "}");
    } else {
      std::string body = me + R"(, "completions": [)";
      for (size_t i = 0; i < worker.leases.size(); ++i) {
        body += (i ? "," : "") + std::string(R"({"lease": )") + std::to_string(worker.leases[i]) +
                R"(, "loss": )" + std::to_string(0.5 + pick(100) / 100.0) + R"(, "samples": 4})";
      }
      send(w, "complete", body + R"(], "next": true)" + wait + jobs + request + "}",
           std::move(worker.leases));
      worker.leases.clear();
    }
  }

  void on_reply(size_t w, uint64_t life, uint64_t send, HttpReply reply) {
    ASSERT_TRUE(delivering_) << "a reply left before its wave was written";
    ASSERT_EQ(life, lives_);  // (a process that crashed sends nothing)
    Worker& worker = workers_[w];
    if (send != worker.sends || !worker.in_flight) return;  // (answered already)
    const std::string target = worker.in_flight->target;
    worker.in_flight.reset();
    rapidjson::Document d;
    d.Parse(reply.body.c_str());
    ASSERT_FALSE(d.HasParseError()) << reply.body;
    stats.replies += 1;
    if (reply.status == 503) {  // the journal has no room: try again later, holding on
      stats.refused_full += 1;
      EXPECT_NE(reply.body.find("disk_full"), std::string::npos) << reply.body;
      worker.leases.insert(worker.leases.end(), worker.sent.begin(), worker.sent.end());
      return;
    }
    if (reply.status != 200 && reply.status != 201) {
      ADD_FAILURE() << "POST " << target << " " << reply.status << " " << reply.body;
      return;
    }
    if (target.ends_with("/workers")) {
      worker.id = d["worker"].GetUint64();
      return;
    }
    if (target.ends_with("/complete")) {
      const auto& outcomes = d["outcomes"].GetArray();
      ASSERT_EQ(outcomes.Size(), worker.sent.size());
      for (rapidjson::SizeType i = 0; i < outcomes.Size(); ++i) {
        if (std::string(outcomes[i]["outcome"].GetString()) != "accepted") continue;
        accepted_ += 1;
        stats.accepted += 1;
        const JobKey& key = worker.jobs.at(worker.sent[i]);
        ASSERT_TRUE(acknowledged_.insert(key).second)
            << std::get<0>(key) << " epoch " << std::get<1>(key) << " job " << std::get<2>(key)
            << " was acknowledged 'accepted' twice";
      }
      if (d.HasMember("next")) take_jobs(worker, d["next"]);
      return;
    }
    if (target.ends_with("/acquire")) take_jobs(worker, d);
  }

  void take_jobs(Worker& worker, const rapidjson::Value& answer) {
    if (std::string(answer["status"].GetString()) != "job") return;
    auto take = [&](const rapidjson::Value& job) {
      worker.leases.push_back(job["lease"].GetUint64());
      worker.jobs[job["lease"].GetUint64()] =
          JobKey{job["set"].GetString(), job["epoch"].GetInt64(), job["index"].GetUint64()};
    };
    if (answer.HasMember("jobs")) {
      for (const auto& job : answer["jobs"].GetArray()) take(job);
    } else {
      take(answer["job"]);
    }
  }

  void step_coordinator() {
    Wave wave = process_->coordinator->step(calls_, journal_.low_on_room());
    stats.parked_max = std::max(stats.parked_max, process_->coordinator->parked());
    waves_ += 1;
    pipeline_.push_back(Pending{std::move(wave), process_->state()});
  }

  // Writes the oldest wave waiting; false when the journal had no room (it waits).
  bool write_one() {
    Pending& p = pipeline_.front();
    if (auto r = journal_.write(*p.wave.writes); !r) {
      EXPECT_TRUE(journal_.last_write_was_full()) << r.error().message;
      return false;
    }
    durable_state_ = p.state;
    delivering_ = true;
    for (Outgoing& o : p.wave.replies) {
      if (pick(30) == 0) {  // lost after its commit
        stats.lost_replies += 1;
        continue;
      }
      o.to.respond(std::move(o.reply));
    }
    delivering_ = false;
    pipeline_.pop_front();
    check_counted();
    return true;
  }

  // The process dies: waves taken and not written are lost with their replies; a new one
  // restores from the journal and must come back exactly as of the last written wave.
  void crash() {
    const size_t pipeline_size = pipeline_.size();
    pipeline_.clear();
    calls_.clear();
    journal_.crash();
    lives_ += 1;
    restarts_ += 1;
    stats.restarts += 1;
    stats.parked_at_crash += process_->coordinator->parked();
    stats.waves_lost += pipeline_size;
    process_.reset();
    process_ = std::make_unique<Process>(wall_, journal_, false);
    ASSERT_TRUE(process_->restored) << process_->restore_error;
    const std::string restored = process_->state();
    ASSERT_TRUE(restored == durable_state_)
        << "restart " << restarts_ << ": the restored run (" << restored.size()
        << " bytes saved) is not the run as last committed (" << durable_state_.size() << ")";
    if (durable_state_.empty()) {  // the run itself was never written: create it again
      send_admin(HttpRequest{"POST", "/v1/runs", config_json(rng_), {}});
    }
    // Their connections broke: each asks again (the same request), after its timeout.
    for (Worker& w : workers_) {
      if (w.in_flight) w.sent_at = -1'000'000;
    }
  }

  // Every completion the run counts was written to the journal, and none is counted twice.
  void check_counted() {
    auto run = process_->engine.find("s");
    if (!run) return;
    uint64_t done = 0;
    for (const Epoch& e : (*run)->epochs()) done += e.done;
    // What the engine counts as of the last written wave; the pipeline may hold more.
    if (pipeline_.empty()) {
      ASSERT_EQ(done, journal_.completions_written());
    }
    ASSERT_LE(accepted_, journal_.completions_written())
        << "a worker was told 'accepted' more often than completions were written";
  }

  void check_done() {
    auto run = process_->engine.find("s");
    ASSERT_TRUE(run);
    uint64_t done = 0;
    for (const Epoch& e : (*run)->epochs()) {
      ASSERT_TRUE(e.closed()) << set_name(e.plan.set) << " epoch " << e.plan.epoch;
      ASSERT_EQ(e.resolved(), e.plan.size());
      done += e.done;
    }
    EXPECT_EQ(done, journal_.completions_written());
    // Restoring the final journal gives the final state, once more.
    crash();
  }

  struct Pending {
    Wave wave;
    std::string state;  // the run after this wave, as it must come back once it is written
  };

  std::mt19937_64 rng_;
  ManualClock wall_{1'000'000};
  MemoryJournal journal_;
  std::unique_ptr<Process> process_;
  std::vector<Worker> workers_;
  std::vector<Call> calls_;
  std::deque<Pending> pipeline_;
  std::string durable_state_;
  uint64_t waves_ = 0, lives_ = 0, restarts_ = 0, accepted_ = 0, cut_seq_ = 0;
  bool delivering_ = false;
  std::set<JobKey> acknowledged_;
};

TEST(CoordinatorSimulation, EveryBatchOnceAndNothingAcceptedLostAcrossCrashes) {
  const std::vector<uint64_t> seeds =
      testing::seeds_from_env("TRAINCOORD_SERVER_SIM_SEED", "TRAINCOORD_SERVER_SIM_SEEDS", 200);
  for (uint64_t seed : seeds) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (replay: TRAINCOORD_SERVER_SIM_SEED=" + std::to_string(seed) +
                 " traincoord_tests --gtest_filter='CoordinatorSimulation.*')");
    Simulation sim(seed);
    sim.run();
    if (HasFailure()) return;
  }
  std::printf(
      "%zu schedules: %llu replies, %llu completions accepted, %llu replies lost after their "
      "commit, %llu crashes (%llu waves lost unwritten, %llu long polls cut), %llu disks "
      "full (%llu requests refused 503), up to %zu long polls parked at once\n",
      seeds.size(), static_cast<unsigned long long>(stats.replies),
      static_cast<unsigned long long>(stats.accepted),
      static_cast<unsigned long long>(stats.lost_replies),
      static_cast<unsigned long long>(stats.restarts),
      static_cast<unsigned long long>(stats.waves_lost),
      static_cast<unsigned long long>(stats.parked_at_crash),
      static_cast<unsigned long long>(stats.disk_full),
      static_cast<unsigned long long>(stats.refused_full), stats.parked_max);
  // The faults happened (else this test proves little).
  EXPECT_GT(stats.restarts, seeds.size() / 2);
  EXPECT_GT(stats.lost_replies, 0u);
  if (seeds.size() >= 100) {
    EXPECT_GT(stats.waves_lost, 0u);
    EXPECT_GT(stats.parked_at_crash, 0u);
    EXPECT_GT(stats.refused_full, 0u);
  }
}

// A restore (or a new group that takes the run over) while the old group's workers wait in
// long polls: every one of them, an acquire or a complete + next, naming its group or not, is
// answered stale_generation by the wave that changed the group, and none gets a lease of the
// new generation (else the new group's epoch would wait for that lease to expire). Then the
// journal replays to the same run. Seeded: the schedule (how many workers, which kind of long
// poll, whether the tick or the restore itself wakes them, restore of a cut, fresh start or
// take-over by registration) comes from the seed.
class GroupChange {
 public:
  explicit GroupChange(uint64_t seed) : rng_(seed), journal_(1 + rng_() % 40) {
    process_ = std::make_unique<Process>(wall_, journal_, true);
  }

  void run() {
    call_admin(HttpRequest{"POST",
                           "/v1/runs",
                           R"({"name": "s", "data": {"train_batches": 12, "dev_batches": 2}, )"
                           R"("schedule": {"epochs": 2}, "leases": {"timeout": 10.0}, )"
                           R"("early_stop": {"rule": "none"}})",
                           {}});
    const int old_workers = 2 + pick(4);
    for (int i = 0; i < old_workers; ++i) register_worker("old" + std::to_string(i), "old");
    // A holder keeps one lease, so that nothing the others complete closes the epoch.
    std::vector<uint64_t> held = take_all({0});
    const bool with_cut = pick(3) != 0;
    if (with_cut) {
      ASSERT_EQ(post(0, "cuts", R"({"worker": 0, "group": "old", "seq": 1})").status, 200);
    }
    // The others take every job still open, then wait: an acquire or a complete + next.
    std::vector<size_t> waiting;
    for (int i = 1; i < old_workers; ++i) waiting.push_back(static_cast<size_t>(i));
    std::map<size_t, std::vector<uint64_t>> leases;
    for (bool more = true; more;) {
      more = false;
      for (size_t w : waiting) {
        auto got = acquire_now(w);
        if (got) {
          leases[w].push_back(*got);
          more = true;
        }
      }
    }
    std::map<size_t, std::optional<HttpReply>> answers;
    for (size_t w : waiting) {
      const std::string group = pick(2) == 0 ? R"(, "group": "old")" : "";
      const std::string wait = R"(, "wait_ms": )" + std::to_string(2000 + pick(20'000));
      std::string body = R"({"worker": )" + std::to_string(ids_[w]) + group + wait;
      std::string target = "acquire";
      if (!leases[w].empty() && pick(2) == 0) {
        target = "complete";
        body += R"(, "lease": )" + std::to_string(leases[w].back()) +
                R"(, "loss": 1, "samples": 1, "next": true)";
      }
      if (pick(2) == 0) body += R"(, "request": )" + std::to_string(1 + pick(1000));
      send(HttpRequest{"POST", "/v1/runs/s/" + target, body + "}", {}}, &answers[w]);
    }
    step();
    ASSERT_EQ(process_->coordinator->parked(), waiting.size());
    for (size_t w : waiting) ASSERT_FALSE(answers[w]) << "answered before the group changed";
    if (pick(2) == 0) {  // the tick may come first, or with the change
      wall_.advance(1 + pick(200));
      step();
    }
    // The new group.
    register_worker("new0", "new");
    if (with_cut) {
      const std::string body =
          pick(2) == 0 ? R"({"group": "new", "cut": 1})" : R"({"group": "new", "fresh": true})";
      call_admin(HttpRequest{"POST", "/v1/runs/s/restore", body, {}});
    }
    for (size_t w : waiting) {
      ASSERT_TRUE(answers[w]) << "old" << w << " still parked after its group was replaced";
      EXPECT_EQ(answers[w]->status, 409) << answers[w]->body;
      EXPECT_NE(answers[w]->body.find("\"stale_generation\""), std::string::npos)
          << answers[w]->body;
    }
    EXPECT_EQ(process_->coordinator->parked(), 0u);
    auto run = process_->engine.find("s");
    ASSERT_TRUE(run);
    for (int i = 0; i < old_workers; ++i) {
      EXPECT_TRUE((*run)->workers()[ids_[static_cast<size_t>(i)]].leases.empty())
          << "old" << i << " holds a lease of the new generation";
    }
    // The new group takes the jobs the old one held, at once.
    const size_t fresh = ids_.size() - 1;
    EXPECT_TRUE(acquire_now(fresh)) << "the new group's worker got no job";
    // The old holder's next request is refused too (named group or not).
    const HttpReply late = post(0, "complete",
                                R"({"worker": 0, "lease": )" + std::to_string(held.front()) +
                                    R"(, "loss": 1, "samples": 1})");
    EXPECT_NE(late.body.find("\"stale_generation\""), std::string::npos) << late.body;
    // What the journal kept replays to this very run.
    const std::string state = process_->state();
    process_.reset();
    process_ = std::make_unique<Process>(wall_, journal_, false);
    ASSERT_TRUE(process_->restored) << process_->restore_error;
    EXPECT_TRUE(process_->state() == state) << "the journal does not replay to the same run";
  }

 private:
  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

  void send(HttpRequest request, std::optional<HttpReply>* answer) {
    calls_.push_back(Call{std::move(request), ReplyTo{[answer](HttpReply r) { *answer = r; }, {}}});
  }

  // One step of the coordinator, its wave written, its replies delivered.
  void step() {
    Wave wave = process_->coordinator->step(calls_);
    ASSERT_TRUE(journal_.write(*wave.writes));
    for (Outgoing& o : wave.replies) o.to.respond(std::move(o.reply));
    wall_.advance(pick(3));
  }

  HttpReply call_admin(HttpRequest request) {
    std::optional<HttpReply> answer;
    send(std::move(request), &answer);
    step();
    EXPECT_TRUE(answer);
    return answer.value_or(HttpReply{});
  }

  HttpReply post(size_t w, const std::string& target, const std::string& body) {
    (void)w;
    return call_admin(HttpRequest{"POST", "/v1/runs/s/" + target, body, {}});
  }

  void register_worker(const std::string& name, const std::string& group) {
    const HttpReply r =
        post(0, "workers", R"({"name": ")" + name + R"(", "group": ")" + group + R"("})");
    ASSERT_EQ(r.status, 200) << r.body;
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    ids_.push_back(d["worker"].GetUint64());
  }

  // An acquire without a wait: the lease it got, if any.
  std::optional<uint64_t> acquire_now(size_t w) {
    const HttpReply r = post(w, "acquire", R"({"worker": )" + std::to_string(ids_[w]) + "}");
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    if (r.status != 200 || std::string(d["status"].GetString()) != "job") return std::nullopt;
    return d["job"]["lease"].GetUint64();
  }

  std::vector<uint64_t> take_all(std::vector<size_t> workers) {
    std::vector<uint64_t> leases;
    for (size_t w : workers) {
      if (auto l = acquire_now(w)) leases.push_back(*l);
    }
    return leases;
  }

  std::mt19937_64 rng_;
  ManualClock wall_{1'000'000};
  MemoryJournal journal_;
  std::unique_ptr<Process> process_;
  std::vector<Call> calls_;
  std::vector<uint64_t> ids_;
};

TEST(CoordinatorSimulation, ARestoreAnswersTheOldGroupsLongPollsStaleAndLeasesThemNothing) {
  const std::vector<uint64_t> seeds =
      testing::seeds_from_env("TRAINCOORD_SERVER_SIM_SEED", "TRAINCOORD_SERVER_SIM_SEEDS", 200);
  for (uint64_t seed : seeds) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (replay: TRAINCOORD_SERVER_SIM_SEED=" + std::to_string(seed) +
                 " traincoord_tests --gtest_filter='CoordinatorSimulation.ARestore*')");
    GroupChange sim(seed);
    sim.run();
    if (HasFailure()) return;
  }
}

// Step mode: each rank is handed only its own batches, so a parked acquire that gets nothing
// says nothing of the next rank's. Rank 0 parks at the epoch's end (its batches all trained);
// rank 1 parks while holding its last batch, whose lease then runs out: the batch goes back to
// rank 1, and rank 1's parked acquire gets it at once, though rank 0 parked first and still
// gets nothing (not when rank 1's own wait runs out, 20 s later).
TEST(CoordinatorParked, ARankParkedBehindAnotherGetsItsBatchGivenBackAtOnce) {
  ManualClock wall{1'000'000};
  MemoryJournal journal(1);
  Process process(wall, journal, true);
  std::vector<Call> calls;
  auto send = [&](const std::string& target, const std::string& body,
                  std::optional<HttpReply>* answer) {
    calls.push_back(Call{HttpRequest{"POST", target, body, {}},
                         ReplyTo{[answer](HttpReply r) { *answer = r; }, {}}});
    Wave wave = process.coordinator->step(calls);
    ASSERT_TRUE(journal.write(*wave.writes));
    for (Outgoing& o : wave.replies) o.to.respond(std::move(o.reply));
  };
  auto call = [&](const std::string& target, const std::string& body,
                  std::optional<HttpReply>* answer) { send("/v1/runs/s" + target, body, answer); };
  auto now = [&](const std::string& target, const std::string& body) {
    std::optional<HttpReply> answer;
    call(target, body, &answer);
    EXPECT_TRUE(answer) << target << " " << body << " parked";
    rapidjson::Document d;
    d.Parse(answer ? answer->body.c_str() : "{}");
    return d;
  };
  std::optional<HttpReply> created;
  send("/v1/runs",
       R"({"name": "s", "data": {"train_samples": 8, "batch_size": 2}, )"
       R"("schedule": {"epochs": 2, "mode": "steps"}, "leases": {"timeout": 10.0}})",
       &created);
  ASSERT_TRUE(created && created->status / 100 == 2) << (created ? created->body : "");
  for (int r = 0; r < 2; ++r) {
    const auto d =
        now("/workers", R"({"name": "r)" + std::to_string(r) + R"(", "group": "g", "rank": )" +
                            std::to_string(r) + R"(, "world_size": 2})");
    ASSERT_EQ(d["worker"].GetUint64(), static_cast<uint64_t>(r));
  }
  // 4 batches, 2 steps: each rank takes its two.
  std::vector<uint64_t> leases[2];
  for (int r = 0; r < 2; ++r) {
    const auto d = now("/acquire", R"({"worker": )" + std::to_string(r) + R"(, "jobs": 2})");
    ASSERT_STREQ(d["status"].GetString(), "job");
    ASSERT_EQ(d["jobs"].Size(), 2u);
    for (const auto& job : d["jobs"].GetArray()) leases[r].push_back(job["lease"].GetUint64());
  }
  for (uint64_t lease : leases[0]) {
    now("/complete",
        R"({"worker": 0, "lease": )" + std::to_string(lease) + R"(, "loss": 1, "samples": 2})");
  }
  now("/complete", R"({"worker": 1, "lease": )" + std::to_string(leases[1][0]) +
                       R"(, "loss": 1, "samples": 2})");
  std::optional<HttpReply> parked0, parked1;
  call("/acquire", R"({"worker": 0, "wait_ms": 20000})", &parked0);
  call("/acquire", R"({"worker": 1, "wait_ms": 20000})", &parked1);
  ASSERT_FALSE(parked0);
  ASSERT_FALSE(parked1);
  ASSERT_EQ(process.coordinator->parked(), 2u);
  // Rank 1's last lease runs out (it did not heartbeat): its batch goes back to rank 1.
  // (Time goes on in ticks: the server clock does not count a jump as time leases run.)
  for (int tick = 0; tick < 60 && !parked1; ++tick) {
    wall.advance(200);
    Wave wave = process.coordinator->step(calls);
    ASSERT_TRUE(journal.write(*wave.writes));
    for (Outgoing& o : wave.replies) o.to.respond(std::move(o.reply));
  }
  ASSERT_TRUE(parked1) << "rank 1 waits behind rank 0's parked acquire";
  rapidjson::Document d;
  d.Parse(parked1->body.c_str());
  ASSERT_STREQ(d["status"].GetString(), "job") << parked1->body;
  EXPECT_EQ(d["job"]["rank"].GetUint64(), 1u);
  EXPECT_EQ(d["job"]["attempt"].GetUint64(), 2u);
  EXPECT_FALSE(parked0);  // (nothing for rank 0 until the epoch closes)
  EXPECT_EQ(process.coordinator->parked(), 1u);
}

// A run stored before schedule.mode "auto" existed (config format "json", no mode: a job-mode
// run then) restores as a job-mode run, also when a rank of a group asked first, and replays
// exactly; the same text stored as "json/2" (auto) would replay differently, and the restart
// would stop.
TEST(StoredConfigUpgrade, ARunStoredBeforeAutoWithoutASnapshotReplaysAsTheJobModeRunItWas) {
  const std::string text = R"({"name": "s", "data": {"train_samples": 8, "batch_size": 2}, )"
                           R"("schedule": {"epochs": 1, "validation_every": 0}})";
  for (const std::string_view format : {std::string_view("json"), kStoredJson}) {
    SCOPED_TRACE(std::string(format));
    ManualClock wall{1'000'000};
    MemoryJournal journal(1000);  // (no snapshot: the restart replays every record)
    Process live(wall, journal, true);
    // As the older build created it: a job-mode run, its config stored without the mode.
    auto legacy = parse_stored_run_config("json", text, "test");
    ASSERT_TRUE(legacy);
    ASSERT_TRUE(live.engine.create_run(*legacy));
    journal.add_run("s", format, text, live.clock.now());
    std::vector<Call> calls;
    std::vector<std::optional<HttpReply>> answers(3);
    const char* requests[][2] = {
        {"/v1/runs/s/workers", R"({"name": "r0", "group": "g", "rank": 0, "world_size": 2})"},
        {"/v1/runs/s/acquire", R"({"worker": 0})"},
        {"/v1/runs/s/workers", R"({"name": "r1", "group": "g", "rank": 1, "world_size": 3})"},
    };
    for (size_t i = 0; i < 3; ++i) {
      calls.push_back(Call{HttpRequest{"POST", requests[i][0], requests[i][1], {}},
                           ReplyTo{[&answers, i](HttpReply r) { answers[i] = r; }, {}}});
      Wave wave = live.coordinator->step(calls);
      ASSERT_TRUE(journal.write(*wave.writes));
      for (Outgoing& o : wave.replies) o.to.respond(std::move(o.reply));
      ASSERT_TRUE(answers[i] && answers[i]->status == 200) << answers[i]->body;
    }
    // Job mode: a job for rank 0 (no step), and a rank of another world size is no conflict.
    EXPECT_EQ(answers[1]->body.find("\"step\""), std::string::npos) << answers[1]->body;
    Process restarted(wall, journal, false);
    if (format == "json") {
      ASSERT_TRUE(restarted.restored) << restarted.restore_error;
      EXPECT_EQ((*restarted.engine.find("s"))->mode(), ScheduleMode::kJobs);
      EXPECT_EQ(restarted.state(), live.state());
    } else {
      EXPECT_FALSE(restarted.restored);  // read as auto: the replies differ
    }
  }
}

// One life of a cost-balanced step-mode run: two ranks of a group train two epochs and report
// their batch times (rank 1 twice as slow, every 7th report a pause), answered by a build whose
// cost model fits with the declared shape or without (`declared_shape_fit`: false, as the build
// before it; set here, not read from the format, so that the build answering does not depend
// on the rule under test), its config stored as `stored_as`. Records, per (epoch, step, rank),
// the samples each rank was handed.
struct CostBalancedLife {
  explicit CostBalancedLife(const std::string& text) : text(text) {}
  std::string text;
  ManualClock wall{1'000'000};
  MemoryJournal journal{1000};  // (no snapshot: a restart replays every record)
  Process live{wall, journal, true};
  std::map<std::tuple<int64_t, uint64_t, uint32_t>, std::vector<uint64_t>> handed;
};

void answer_cost_balanced_run(CostBalancedLife& life, bool declared_shape_fit,
                              std::string_view stored_as, const std::vector<double>& lengths) {
  auto config = parse_run_config_json(life.text, "test");
  ASSERT_TRUE(config) << config.error().message;
  config->declared_shape_fit = declared_shape_fit;
  ASSERT_TRUE(life.live.engine.create_run(*config));
  life.journal.add_run("s", stored_as, life.text, life.live.clock.now());
  std::vector<Call> calls;
  auto post = [&](const std::string& target, const std::string& body) {
    std::optional<HttpReply> answer;
    calls.push_back(Call{HttpRequest{"POST", "/v1/runs/s" + target, body, {}},
                         ReplyTo{[&answer](HttpReply r) { answer = r; }, {}}});
    Wave wave = life.live.coordinator->step(calls);
    EXPECT_TRUE(life.journal.write(*wave.writes));
    for (Outgoing& o : wave.replies) o.to.respond(std::move(o.reply));
    EXPECT_TRUE(answer && answer->status == 200)
        << target << " " << body << ": " << (answer ? answer->body : "parked");
    rapidjson::Document d;
    d.Parse(answer ? answer->body.c_str() : "{}");
    return d;
  };
  for (int r = 0; r < 2; ++r) {
    post("/workers", R"({"name": "r)" + std::to_string(r) + R"(", "group": "g", "rank": )" +
                         std::to_string(r) + R"(, "world_size": 2})");
  }
  uint64_t completions = 0;
  bool finished = false;
  for (int round = 0; round < 200 && !finished; ++round) {
    struct Held {
      uint64_t lease;
      std::vector<uint64_t> samples;
    };
    std::vector<Held> step;
    for (uint32_t r = 0; r < 2; ++r) {
      const auto d = post("/acquire", R"({"worker": )" + std::to_string(r) + "}");
      ASSERT_TRUE(d.IsObject() && d.HasMember("status"));
      if (std::string_view(d["status"].GetString()) == "finished") {
        finished = true;
        break;
      }
      ASSERT_STREQ(d["status"].GetString(), "job");
      const auto& job = d["job"];
      ASSERT_EQ(job["rank"].GetUint64(), r);
      Held h{job["lease"].GetUint64(), {}};
      for (const auto& s : job["samples"].GetArray()) h.samples.push_back(s.GetUint64());
      life.handed[{job["epoch"].GetInt64(), job["step"].GetUint64(), r}] = h.samples;
      step.push_back(std::move(h));
    }
    ASSERT_TRUE(step.empty() || step.size() == 2) << "a step without every rank";
    for (uint32_t r = 0; r < step.size(); ++r) {
      // The batch's time: 0.002 + n·(0.0005·L + 0.00002·L²) s (the declared shape 4 : 1 : 0.04),
      // rank 1 twice as long, every 7th report ×3 (a pause).
      double longest = 0;
      for (uint64_t s : step[r].samples) longest = std::max(longest, lengths.at(s));
      const double n = static_cast<double>(step[r].samples.size());
      double seconds = 0.002 + n * (0.0005 * longest + 0.00002 * longest * longest);
      if (r == 1) seconds *= 2;
      if (++completions % 7 == 0) seconds *= 3;
      char text[48];
      std::snprintf(text, sizeof text, "%.9g", seconds);
      post("/complete", R"({"worker": )" + std::to_string(r) + R"(, "lease": )" +
                            std::to_string(step[r].lease) + R"(, "loss": 1, "samples": )" +
                            std::to_string(step[r].samples.size()) + R"(, "seconds": )" + text +
                            "}");
    }
    life.wall.advance(50);
  }
  ASSERT_TRUE(finished) << "the run did not finish";
}

// The epochs, plans and cost model of two runs (as far as these tests read them): equal.
void expect_same_cost_balanced_run(const Run& a, const Run& b) {
  ASSERT_EQ(a.epochs().size(), b.epochs().size());
  for (size_t i = 0; i < a.epochs().size(); ++i) {
    SCOPED_TRACE("epoch " + std::to_string(i));
    const Epoch &ea = a.epochs()[i], &eb = b.epochs()[i];
    EXPECT_EQ(ea.plan_cost.describe(), eb.plan_cost.describe());
    EXPECT_EQ(ea.plan_speeds, eb.plan_speeds);
    EXPECT_EQ(ea.replanned_after, eb.replanned_after);
    EXPECT_EQ(ea.samples, eb.samples);
    EXPECT_EQ(ea.done, eb.done);
    ASSERT_TRUE(ea.steps() && eb.steps());
    EXPECT_EQ(a.cost_plan(ea), b.cost_plan(eb));
  }
  ASSERT_TRUE(a.cost_model() && b.cost_model());
  EXPECT_EQ(a.cost_model()->reports(), b.cost_model()->reports());
  EXPECT_EQ(a.cost_model()->shared().a, b.cost_model()->shared().a);
  EXPECT_EQ(a.cost_model()->shared().b, b.cost_model()->shared().b);
  EXPECT_EQ(a.cost_model()->shared().c, b.cost_model()->shared().c);
  EXPECT_EQ(a.cost_model()->speeds(), b.cost_model()->speeds());
}

// A cost-balanced step-mode run stored before the cost model kept the declared cost's shape
// (config format "json/3": RunConfig::declared_shape_fit false) and restarted without a
// snapshot replays under the fit it was answered with: the same epochs, plans and cost model,
// each step's batches the samples its ranks were handed. Read as "json/4" (the current fit),
// the same journal would fit another model, plan the rest of the first epoch (its warm-up
// re-plan) and the second epoch otherwise (as the same requests answered under the current fit
// do), hand the ranks' leases other samples than they trained, and the restart stops.
TEST(StoredConfigUpgrade, ACostBalancedRunStoredBeforeTheDeclaredShapeFitReplaysAsItWasAnswered) {
  const std::vector<double> lengths = testing::lengths_of(240, 1);
  std::string inline_lengths;
  for (double l : lengths) {
    char text[32];
    std::snprintf(text, sizeof text, "%s%.17g", inline_lengths.empty() ? "" : ", ", l);
    inline_lengths += text;
  }
  const std::string text = R"({"name": "s", "data": {"train_samples": 240}, )"
                           R"("schedule": {"mode": "steps", "epochs": 2, "validation_every": 0, )"
                           R"("batch_budget": 400, "cost_a": 4, "cost_b": 1, "cost_c": 0.04}, )"
                           R"("leases": {"timeout": 60.0}, "lengths": {"train": [)" +
                           inline_lengths + "]}}";
  // As the older build answered it, and stored its config.
  CostBalancedLife old_build(text);
  ASSERT_NO_FATAL_FAILURE(answer_cost_balanced_run(old_build, false, "json/3", lengths));
  const traincoord::Run& answered = **old_build.live.engine.find("s");
  ASSERT_EQ(answered.state(), RunState::kCompleted);
  ASSERT_EQ(answered.epochs().size(), 2u);
  EXPECT_GT(answered.epochs()[0].replanned_after, 0u);     // epoch 0 re-planned with the fit
  ASSERT_FALSE(answered.epochs()[1].plan_speeds.empty());  // epoch 1 planned with it

  Process restarted(old_build.wall, old_build.journal, false);
  ASSERT_TRUE(restarted.restored) << restarted.restore_error;
  EXPECT_EQ(restarted.state(), old_build.live.state());
  const traincoord::Run& replayed = **restarted.engine.find("s");
  EXPECT_FALSE(replayed.config().declared_shape_fit);
  expect_same_cost_balanced_run(replayed, answered);
  for (const auto& [key, samples] : old_build.handed) {
    const auto& [epoch, step, rank] = key;
    EXPECT_EQ(
        replayed.cost_plan(replayed.epochs().at(epoch)).steps.at(step).batches.at(rank).samples,
        samples)
        << "epoch " << epoch << " step " << step << " rank " << rank;
  }

  // The same requests answered under the current fit: another cost model, and the first
  // epoch's re-plan and the second epoch planned otherwise (so the fits differ on these
  // reports, and a replay under the wrong one shows).
  CostBalancedLife new_build(text);
  ASSERT_NO_FATAL_FAILURE(answer_cost_balanced_run(new_build, true, kStoredJson, lengths));
  const traincoord::Run& current = **new_build.live.engine.find("s");
  ASSERT_EQ(current.epochs().size(), 2u);
  EXPECT_NE(current.cost_model()->shared().describe(), answered.cost_model()->shared().describe());
  EXPECT_NE(current.cost_plan(current.epochs()[1]), answered.cost_plan(answered.epochs()[1]));
  EXPECT_NE(new_build.handed, old_build.handed);
  Process new_restarted(new_build.wall, new_build.journal, false);  // (which replays as it was)
  ASSERT_TRUE(new_restarted.restored) << new_restarted.restore_error;
  EXPECT_TRUE((*new_restarted.engine.find("s"))->config().declared_shape_fit);
  EXPECT_EQ(new_restarted.state(), new_build.live.state());

  // The old build's journal with its config read as "json/4": the replay hands out other
  // samples than were answered, and the restart stops there.
  CostBalancedLife relabelled(text);
  ASSERT_NO_FATAL_FAILURE(answer_cost_balanced_run(relabelled, false, kStoredJson, lengths));
  EXPECT_EQ(relabelled.handed, old_build.handed);
  Process misread(relabelled.wall, relabelled.journal, false);
  EXPECT_FALSE(misread.restored);
  EXPECT_NE(misread.restore_error.find("does not replay as it was: POST /v1/runs/s/acquire"),
            std::string::npos)
      << misread.restore_error;
}

}  // namespace
}  // namespace traincoord
