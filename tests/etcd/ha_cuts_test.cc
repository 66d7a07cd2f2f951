// Checkpoint cuts across etcd failovers (issue 20: "checkpoint cuts intact"; docs/HA.md,
// "Chaos"): a real 3-member etcd cluster on loopback, two coordinators, a data-parallel group
// of ranks in job mode (driven in lockstep by the test, over HTTP as the clients speak it:
// following 421 not_leader, a retried acquire with its request id) that trains a "model" counting
// its visits per (set, epoch, batch) and checkpoints {the model, the cut's id} at fixed steps, some
// cuts with partly trained jobs. The coordinator serving the run is killed with SIGKILL five
// times:
//   1. right after a cut was acknowledged complete (the reply to the last rank's share);
//   2. between two ranks' shares of a later cut (the other share completes it on the new
//      leader: the first share survived);
//   3. mid-training, after a later cut, more training, and one rank's share of a cut that never
//      completes; then the group "crashes" (its ranks stop) and a new group of 3 ranks
//      registers (restore_required, latest_cut: the last complete cut) and restores the last
//      checkpoint's cut;
//   4. right after that restore was acknowledged; the other ranks restore after the failover;
//   5. while the last share of a cut of the new group is on its way (its reply may be lost):
//      the share sent again answers the same cut, complete; no (group, seq) makes two cuts.
// Checks: after each failover, every cut a leader acknowledged complete is there, as it was
// acknowledged (its jobs done and partly trained jobs as the ranks counted them); the restore
// puts the run back at the cut (its jobs done; the old group fenced off); the new group
// trains to the end, and the final model, the checkpoint's counts plus the new group's
// training, has every batch of every epoch (train and dev) exactly once: the batches trained
// before the cut are not handed out again, those after it are. The coordinator's epoch losses
// are those of every batch trained once. Every process is stopped by its PID, also when the
// test fails; every loop is bounded.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "e2e/server_process.h"
#include "etcd/etcd_cluster.h"
#include "etcd/ha_http.h"
#include "etcd/ha_workers.h"

namespace traincoord {
namespace {

using testing::EtcdCluster;
using testing::http;
using testing::port_of;
using testing::Reply;
using testing::RunLog;
using testing::ServerProcess;
using testing::TempDir;

using Clock = std::chrono::steady_clock;

// 6 train jobs and 2 dev jobs of 3 batches per epoch, 3 epochs: 72 batches in all.
constexpr int kTrain = 18, kDev = 6, kBatchesPerJob = 3, kEpochs = 3;
constexpr const char* kRun = R"(name = "hacuts"
[data]
train_batches = 18
dev_batches = 6
[schedule]
mode = "jobs"
epochs = 3
iters_per_worker = 3
validation_every = 1
[leases]
timeout = 60.0
[cuts]
keep = 50
[early_stop]
rule = "none"
)";

using Batch = std::tuple<std::string, int64_t, int64_t>;  // set, epoch, batch index
using Model = std::map<Batch, int>;                       // visits

double batch_loss(const std::string& set, int64_t epoch, int64_t batch) {
  return (set == "dev" ? 100.0 : 0.0) + static_cast<double>(epoch) + 0.001 * batch;
}

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

// The ranks' view of a cut, as acknowledged: the same as the coordinator's record of it.
struct CutRecord {
  int64_t id = 0, jobs_done = 0, partial_jobs = 0, partial_batches = 0;
  Model model;  // the checkpoint's
};

class HaCuts : public ::testing::Test {
 protected:
  struct Held {
    uint64_t lease = 0;
    std::string set;
    int64_t epoch = 0;
    std::vector<int64_t> batches;
    size_t trained = 0;
  };
  struct Rank {
    int64_t worker = -1;
    size_t at = 0;  // the coordinator it believes leads
    std::optional<Held> held;
    uint64_t request = 0;
    bool finished = false;
  };
  struct Group {
    std::string name;
    std::vector<Rank> ranks;
    int seq = 0;            // the cuts it gave
    int64_t completed = 0;  // jobs it completed (counted, or answered duplicate)
  };

  void SetUp() override {
    ASSERT_TRUE(cluster_.started());
    config_ = dir_.write("hacuts.toml", kRun);
    journal_ = "etcd://" + cluster_.endpoints() + "/hacuts";
    for (int i = 0; i < 2; ++i) {
      coordinators_[i] = ServerProcess::start(serve_args());
      ASSERT_TRUE(coordinators_[i]);
      urls_.push_back(coordinators_[i]->url());
      if (i == 0) {
        ASSERT_EQ(await_leader(), 0);
      }
    }
  }

  std::vector<std::string> serve_args() const {
    // A snapshot every 7 records (etcd's default is 10,000): each new leader loads the run,
    // its cuts included, from a snapshot in etcd and replays the records since it.
    const char* every = std::getenv("HA_CUTS_SNAPSHOT_EVERY");
    return {"--config",         config_,
            "--journal",        journal_,
            "--snapshot-every", every && *every ? every : "7"};
  }

  // Which coordinator serves the run now (-1: none).
  int leader() {
    for (int i = 0; i < 2; ++i) {
      if (coordinators_[i] &&
          http(urls_[i], "GET", "/v1/runs/hacuts?epochs=0", "", 1000).status == 200)
        return i;
    }
    return -1;
  }
  int await_leader() {
    for (int i = 0; i < 600; ++i) {  // 30 s
      if (int l = leader(); l >= 0) return l;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  // Kills the coordinator serving the run with SIGKILL (by its PID), waits for the other to
  // serve it, and starts the killed one again on its port (a standby now).
  // `known`: the coordinator that leads, when the caller knows it (no time lost asking).
  void kill_leader(const char* when, int known = -1) {
    const int led = known >= 0 ? known : leader();
    ASSERT_GE(led, 0) << "no coordinator serves the run before the kill " << when << say_all();
    if (known < 0) snapshots_ += snapshots_by(led);
    const auto killed_at = Clock::now();
    coordinators_[led]->kill(SIGKILL);
    coordinators_[led].reset();
    const int now = await_leader();
    ASSERT_EQ(now, 1 - led) << "no coordinator serves the run after the kill " << when << say_all();
    std::printf("ha_cuts: leader %s killed %s; %s serves the run %.2f s later\n",
                urls_[led].c_str(), when, urls_[now].c_str(),
                std::chrono::duration<double>(Clock::now() - killed_at).count());
    coordinators_[led] = ServerProcess::start(serve_args(), port_of(urls_[led]));
    ASSERT_TRUE(coordinators_[led]) << "cannot start " << urls_[led] << " again";
    failovers_ += 1;
  }

  // The snapshots coordinator `i` wrote to etcd since it started (its /metrics).
  int64_t snapshots_by(int i) {
    const Reply r = http(urls_[i], "GET", "/metrics", "", 3000);
    const std::string name = "\ntraincoord_etcd_snapshots_total ";
    const auto at = r.body.find(name);
    return at == std::string::npos ? 0 : std::stoll(r.body.substr(at + name.size()));
  }

  std::string say_all() {
    std::string s;
    for (int i = 0; i < 2; ++i) {
      if (coordinators_[i])
        s += "\ncoordinator " + urls_[i] + ":\n" + coordinators_[i]->read_output();
    }
    return s;
  }

  // A POST as a client makes it: to the coordinator the rank believes leads, following 421s
  // and retrying the same body on no answer (at most 20 s).
  Reply post(Rank& rank, const std::string& action, const std::string& body) {
    return testing::post(urls_, &rank.at, "/v1/runs/hacuts/" + action, body, log_);
  }
  rapidjson::Document get(const std::string& target) {
    for (int i = 0; i < 100; ++i) {  // (bounded: a leader is there within seconds)
      const int l = leader();
      if (l >= 0) {
        const Reply r = http(urls_[l], "GET", target, "", 5000);
        if (r.status == 200) return parse(r.body);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "no leader answered GET " << target << say_all();
    return parse("null");
  }

  // Registers the ranks of `group`; returns the registrations' replies (parsed).
  std::vector<rapidjson::Document> join(Group& g, int world_size) {
    std::vector<rapidjson::Document> replies;
    g.ranks.resize(static_cast<size_t>(world_size));
    for (int r = 0; r < world_size; ++r) {
      const Reply reply = post(g.ranks[r], "workers",
                               R"({"name": ")" + g.name + "-rank" + std::to_string(r) +
                                   R"(", "group": ")" + g.name + "\"}");
      EXPECT_EQ(reply.status, 200) << reply.body;
      replies.push_back(parse(reply.body));
      g.ranks[r].worker = replies.back().IsObject() && replies.back().HasMember("worker")
                              ? replies.back()["worker"].GetInt64()
                              : -1;
    }
    return replies;
  }

  std::string me(const Group& g, const Rank& rank) {
    return R"({"worker": )" + std::to_string(rank.worker) + R"(, "group": ")" + g.name + "\"";
  }

  // One optimizer step of the group: each rank without a job asks for one (no waiting: the
  // group moves in lockstep), then trains one batch of its job (a visit in `model_`), and
  // completes the job once its every batch is trained. Returns whether every rank is finished.
  bool step(Group& g) {
    bool all_finished = true;
    for (size_t r = 0; r < g.ranks.size(); ++r) {
      Rank& rank = g.ranks[r];
      if (rank.finished) continue;
      all_finished = false;
      if (!rank.held) {
        const Reply reply =
            post(rank, "acquire",
                 me(g, rank) + R"(, "request": )" + std::to_string(++rank.request) + "}");
        EXPECT_EQ(reply.status, 200) << g.name << " rank " << r << ": " << reply.body;
        if (reply.status != 200) return true;
        rapidjson::Document d = parse(reply.body);
        const std::string status = d["status"].GetString();
        if (status == "finished") {
          EXPECT_STREQ(d["state"].GetString(), "completed") << reply.body;
          rank.finished = true;
          continue;
        }
        if (status != "job") continue;  // (an epoch barrier: another rank holds its last job)
        const auto& job = d["job"];
        Held h;
        h.lease = job["lease"].GetUint64();
        h.set = job["set"].GetString();
        h.epoch = job["epoch"].GetInt64();
        for (const auto& b : job["batches"].GetArray()) h.batches.push_back(b.GetInt64());
        EXPECT_FALSE(h.batches.empty()) << reply.body;
        if (h.batches.empty()) return true;
        rank.held = h;
      }
      Held& h = *rank.held;
      model_[{h.set, h.epoch, h.batches[h.trained]}] += 1;
      h.trained += 1;
      if (h.trained == h.batches.size()) {
        const Reply reply = post(rank, "complete",
                                 me(g, rank) + R"(, "lease": )" + std::to_string(h.lease) +
                                     R"(, "loss": )" + number(loss_of(h, 0, h.batches.size())) +
                                     R"(, "samples": )" + std::to_string(h.batches.size()) + "}");
        EXPECT_EQ(reply.status, 200) << g.name << " rank " << r << ": " << reply.body;
        if (reply.status != 200) return true;
        const std::string outcome = parse(reply.body)["outcome"].GetString();
        // (duplicate: a retry of a completion the killed leader had committed)
        EXPECT_TRUE(outcome == "accepted" || outcome == "duplicate") << reply.body;
        g.completed += 1;
        rank.held.reset();
      }
    }
    return all_finished;
  }

  static double loss_of(const Held& h, size_t from, size_t to) {
    double sum = 0;
    for (size_t i = from; i < to; ++i) sum += batch_loss(h.set, h.epoch, h.batches[i]);
    return sum / static_cast<double>(to - from);
  }
  static std::string number(double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", x);
    return buf;
  }

  // Rank `r`'s share of the group's cut `seq`: its partly trained job, if any.
  std::string share_body(Group& g, size_t r, int seq, int64_t* partial_jobs,
                         int64_t* partial_batches) {
    Rank& rank = g.ranks[r];
    std::string parts;
    if (rank.held && rank.held->trained > 0) {
      const Held& h = *rank.held;
      parts = R"({"lease": )" + std::to_string(h.lease) + R"(, "batches": )" +
              std::to_string(h.trained) + R"(, "loss": )" + number(loss_of(h, 0, h.trained)) +
              R"(, "samples": )" + std::to_string(h.trained) + "}";
      *partial_jobs += 1;
      *partial_batches += static_cast<int64_t>(h.trained);
    }
    return me(g, rank) + R"(, "seq": )" + std::to_string(seq) + R"(, "rank": )" +
           std::to_string(r) + R"(, "world_size": )" + std::to_string(g.ranks.size()) +
           R"(, "parts": [)" + parts + "]}";
  }
  Reply share(Group& g, size_t r, int seq, int64_t* partial_jobs, int64_t* partial_batches) {
    return post(g.ranks[r], "cuts", share_body(g, r, seq, partial_jobs, partial_batches));
  }

  // Every rank gives its share of the group's next cut; the checkpoint (the model, the cut's
  // id) is saved once the last share's reply says the cut is complete.
  // With `kill_after_first`, the leader is killed once rank 0's share was answered (the cut
  // half given): the other ranks' shares complete it on the new leader, as one cut.
  // With `kill_during_last`, the leader is killed while the last share is on its way (its reply
  // may be lost): the share sent again to the new leader answers the same cut, complete.
  void checkpoint(Group& g, bool kill_after_first = false, bool kill_during_last = false) {
    g.seq += 1;
    CutRecord c;
    c.jobs_done = jobs_done_before_ + g.completed;
    for (size_t r = 0; r < g.ranks.size(); ++r) {
      std::optional<int64_t> first_answer;  // the cut the share in flight was answered, if it was
      if (kill_during_last && r + 1 == g.ranks.size()) {
        int64_t pj = 0, pb = 0;
        const int led = leader();
        ASSERT_GE(led, 0);
        const std::string body = share_body(g, r, g.seq, &pj, &pb);
        Reply in_flight;  // sent once, to the leader: its reply may be lost
        std::thread sender(
            [&] { in_flight = http(urls_[led], "POST", "/v1/runs/hacuts/cuts", body, 5000); });
        std::this_thread::sleep_for(std::chrono::microseconds(500));
        kill_leader("while the last share of a cut was on its way", led);
        sender.join();
        ASSERT_FALSE(HasFailure());
        std::printf("ha_cuts: the share on its way was answered: %s\n",
                    in_flight.status ? in_flight.body.c_str() : "(no answer)");
        if (in_flight.status == 200) first_answer = parse(in_flight.body)["cut"].GetInt64();
      }
      const Reply reply = share(g, r, g.seq, &c.partial_jobs, &c.partial_batches);
      ASSERT_EQ(reply.status, 200) << reply.body;
      rapidjson::Document d = parse(reply.body);
      ASSERT_EQ(d["complete"].GetBool(), r + 1 == g.ranks.size()) << reply.body;
      if (r > 0) {
        ASSERT_EQ(d["cut"].GetInt64(), c.id) << "rank " << r << "'s share made another cut";
        ASSERT_EQ(d["ranks"].Size(), static_cast<rapidjson::SizeType>(r + 1))
            << "a share given before the failover was lost: " << reply.body;
      }
      c.id = d["cut"].GetInt64();
      if (first_answer) {
        EXPECT_EQ(*first_answer, c.id) << "the share sent again made another cut";
      }
      if (r == 0 && kill_after_first) {
        ASSERT_NO_FATAL_FAILURE(kill_leader("between two shares of a cut"));
      }
    }
    c.model = model_;
    acknowledged_.push_back(c);
  }

  // Every cut acknowledged complete is kept by the run's leader now, as it was acknowledged.
  void expect_cuts_intact(const char* when) {
    rapidjson::Document d = get("/v1/runs/hacuts/cuts");
    ASSERT_TRUE(d.IsObject()) << when;
    std::map<int64_t, const rapidjson::Value*> kept;
    std::map<std::pair<std::string, int64_t>, int> taken;  // (group, seq) -> cuts
    for (const auto& c : d["cuts"].GetArray()) {
      kept[c["id"].GetInt64()] = &c;
      const int n = taken[{c["group"].GetString(), c["seq"].GetInt64()}] += 1;
      EXPECT_EQ(n, 1) << "two cuts of group " << c["group"].GetString() << " seq "
                      << c["seq"].GetInt64() << " " << when;
    }
    for (const CutRecord& a : acknowledged_) {
      ASSERT_TRUE(kept.count(a.id)) << "cut " << a.id << " was acknowledged complete, and is "
                                    << "not kept " << when << say_all();
      const rapidjson::Value& c = *kept[a.id];
      EXPECT_TRUE(c["complete"].GetBool()) << "cut " << a.id << " " << when;
      EXPECT_EQ(c["jobs_done"].GetInt64(), a.jobs_done) << "cut " << a.id << " " << when;
      EXPECT_EQ(c["partial_jobs"].GetInt64(), a.partial_jobs) << "cut " << a.id << " " << when;
      EXPECT_EQ(c["partial_batches"].GetInt64(), a.partial_batches)
          << "cut " << a.id << " " << when;
    }
  }

  EtcdCluster cluster_;
  TempDir dir_;
  std::string config_, journal_;
  std::unique_ptr<ServerProcess> coordinators_[2];
  std::vector<std::string> urls_;
  RunLog log_;
  Model model_;                   // the group's model now
  int64_t jobs_done_before_ = 0;  // jobs done when the current group took over
  std::vector<CutRecord> acknowledged_;
  int failovers_ = 0;
  int64_t snapshots_ = 0;  // written by the leaders before they were killed
};

TEST_F(HaCuts, CutsAcknowledgedBeforeLeaderKillsAreKeptAndARestoreTrainsEachBatchOnce) {
  const auto from = Clock::now();
  Group g1{"g1", {}, 0, 0};
  for (const auto& reply : join(g1, 2)) {
    ASSERT_TRUE(reply.IsObject());
    EXPECT_STREQ(reply["group_state"].GetString(), "current");
  }
  ASSERT_FALSE(HasFailure());
  // Steps 1-4, cut 1 (rank 1's job half trained); steps 5-8, cut 2; the leader killed at once.
  for (int s = 0; s < 4; ++s) ASSERT_FALSE(step(g1));
  ASSERT_NO_FATAL_FAILURE(checkpoint(g1));
  for (int s = 0; s < 4; ++s) ASSERT_FALSE(step(g1));
  ASSERT_NO_FATAL_FAILURE(checkpoint(g1));
  ASSERT_NO_FATAL_FAILURE(kill_leader("right after cut 2 was acknowledged"));
  ASSERT_NO_FATAL_FAILURE(expect_cuts_intact("after the first failover"));

  // The group trains on under the new leader: steps 9-14, cut 3 (the checkpoint it will
  // restart from; the leader killed between its two shares), steps 15-19 (trained, then lost with
  // the group), rank 0's share of a cut 4 that never completes; the leader killed mid-training.
  for (int s = 0; s < 6; ++s) ASSERT_FALSE(step(g1));
  ASSERT_NO_FATAL_FAILURE(checkpoint(g1, /*kill_after_first=*/true));
  const CutRecord last = acknowledged_.back();
  for (int s = 0; s < 5; ++s) ASSERT_FALSE(step(g1));
  {
    int64_t pj = 0, pb = 0;
    const Reply half = share(g1, 0, g1.seq + 1, &pj, &pb);
    ASSERT_EQ(half.status, 200) << half.body;
    EXPECT_FALSE(parse(half.body)["complete"].GetBool());
  }
  ASSERT_FALSE(step(g1));
  ASSERT_NO_FATAL_FAILURE(kill_leader("mid-training, after cut 3 and half of cut 4"));
  ASSERT_NO_FATAL_FAILURE(expect_cuts_intact("after the third failover"));
  const Model lost_with_g1 = model_;

  // The group crashes; its restart (a new group, 3 ranks) restores the last checkpoint's cut.
  Group g2{"g2", {}, 0, 0};
  std::vector<rapidjson::Document> joined = join(g2, 3);
  for (const auto& reply : joined) {
    ASSERT_TRUE(reply.IsObject());
    EXPECT_STREQ(reply["group_state"].GetString(), "restore_required");
    EXPECT_EQ(reply["latest_cut"].GetInt64(), last.id) << "the last cut acknowledged";
  }
  ASSERT_FALSE(HasFailure());
  model_ = last.model;  // load_state_dict: the model of the checkpoint
  jobs_done_before_ = last.jobs_done;
  const std::string restore = R"({"group": "g2", "cut": )" + std::to_string(last.id) + "}";
  Reply r = post(g2.ranks[0], "restore", restore);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(parse(r.body)["restored"].GetBool()) << r.body;
  const int64_t generation = parse(r.body)["generation"].GetInt64();
  ASSERT_NO_FATAL_FAILURE(kill_leader("right after the restore was acknowledged"));
  for (size_t k = 1; k < g2.ranks.size(); ++k) {  // the other ranks restore the same cut
    r = post(g2.ranks[k], "restore", restore);
    ASSERT_EQ(r.status, 200) << r.body;
    rapidjson::Document d = parse(r.body);
    EXPECT_FALSE(d["restored"].GetBool()) << "the restore was lost in the failover: " << r.body;
    EXPECT_EQ(d["generation"].GetInt64(), generation) << r.body;
  }
  ASSERT_NO_FATAL_FAILURE(expect_cuts_intact("after the fourth failover"));
  {
    rapidjson::Document d = get("/v1/runs/hacuts?epochs=0");
    ASSERT_TRUE(d.IsObject());
    EXPECT_EQ(d["generation"].GetInt64(), generation);
    EXPECT_STREQ(d["group"].GetString(), "g2");
    EXPECT_EQ(d["progress"]["jobs_done"].GetInt64(), last.jobs_done)
        << "the restore put the run back at cut " << last.id;
    EXPECT_EQ(d["counters"]["restores"].GetInt64(), 1);
  }
  // The old group is fenced off, also its completion of a lease it still holds.
  for (Rank& rank : g1.ranks) {
    if (!rank.held) continue;
    const Reply stale = post(rank, "complete",
                             me(g1, rank) + R"(, "lease": )" + std::to_string(rank.held->lease) +
                                 R"(, "loss": 1, "samples": 1})");
    EXPECT_EQ(stale.status, 409) << stale.body;
    EXPECT_NE(stale.body.find("stale_generation"), std::string::npos) << stale.body;
  }

  // The new group trains to the end, with a cut of its own on the way.
  bool done = false;
  for (int s = 0; s < 200 && !done; ++s) {
    if (s == 5) {
      ASSERT_NO_FATAL_FAILURE(
          checkpoint(g2, /*kill_after_first=*/false, /*kill_during_last=*/true));
    }
    done = step(g2);
    ASSERT_FALSE(HasFailure()) << say_all();
  }
  ASSERT_TRUE(done) << "the new group did not finish in 200 steps" << say_all();
  ASSERT_NO_FATAL_FAILURE(expect_cuts_intact("at the end"));

  // Every batch of every epoch in the final model exactly once: those of the checkpoint were
  // not handed out again, those trained after the cut (lost with g1) were.
  int64_t visits = 0;
  for (const std::string set : {"train", "dev"}) {
    for (int64_t e = 0; e < kEpochs; ++e) {
      for (int64_t b = 0; b < (set == "train" ? kTrain : kDev); ++b) {
        const auto it = model_.find({set, e, b});
        EXPECT_EQ(it == model_.end() ? 0 : it->second, 1)
            << set << " epoch " << e << " batch " << b;
      }
    }
  }
  for (const auto& [batch, n] : model_) visits += n;
  EXPECT_EQ(visits, kEpochs * (kTrain + kDev)) << "a batch of no epoch of the run was trained";
  int64_t lost = 0;
  for (const auto& [batch, n] : lost_with_g1) lost += n - (last.model.count(batch) ? 1 : 0);
  EXPECT_GT(lost, 0) << "the test meant g1 to train past its last cut";

  // The coordinator's epoch losses: those of every batch trained once.
  rapidjson::Document d = get("/v1/runs/hacuts?epochs=1000");
  ASSERT_TRUE(d.IsObject());
  EXPECT_STREQ(d["state"].GetString(), "completed");
  ASSERT_EQ(d["epochs"].Size(), static_cast<rapidjson::SizeType>(2 * kEpochs));
  for (const auto& e : d["epochs"].GetArray()) {
    const std::string set = e["set"].GetString();
    const int64_t epoch = e["epoch"].GetInt64();
    const int64_t n = set == "train" ? kTrain : kDev;
    double expected = 0;
    for (int64_t b = 0; b < n; ++b) expected += batch_loss(set, epoch, b) / static_cast<double>(n);
    EXPECT_EQ(e["samples"].GetDouble(), static_cast<double>(n)) << set << " epoch " << epoch;
    EXPECT_NEAR(e["loss"].GetDouble(), expected, 1e-9) << set << " epoch " << epoch;
  }
  EXPECT_EQ(failovers_, 5);
  EXPECT_GT(snapshots_, 0) << "no leader wrote a snapshot before it was killed";
  std::printf(
      "ha_cuts: %zu cuts acknowledged, each kept across %d failovers (%lld snapshots written by "
      "the killed leaders); restored cut %lld "
      "(%lld jobs done, %lld batches in partly trained jobs); %lld batches trained after it "
      "handed out again; every batch once; %.1f s\n",
      acknowledged_.size(), failovers_, static_cast<long long>(snapshots_),
      static_cast<long long>(last.id), static_cast<long long>(last.jobs_done),
      static_cast<long long>(last.partial_batches), static_cast<long long>(lost),
      std::chrono::duration<double>(Clock::now() - from).count());
}

}  // namespace
}  // namespace traincoord
