// Step mode: when the Coordinator asks a parked acquire again (issue 32). A rank is handed only
// its own batches, so each rank's parked acquire may be asked, not only the first; but only
// once its run changed in a way that could answer it — an epoch opened or closed, a batch given
// back, a group replaced, ... — not on every report of the ranks still training (W ranks parked
// at an epoch's end were asked W² times in all). Counted through Coordinator::parked_retries()
// (GET /metrics: traincoord_parked_retries_total); the clock stands still unless a test moves it
// (no tick).
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/engine.h"
#include "journal/memory_journal.h"
#include "server/coordinator.h"
#include "server/server_clock.h"

namespace traincoord {
namespace {

class StepModeParked : public ::testing::Test {
 protected:
  StepModeParked() : clock_(&wall_), engine_(clock_), journal_(1) {
    clock_.go_live(wall_.now());
    coordinator_ = std::make_unique<Coordinator>(engine_, clock_, &journal_, CoordinatorOptions{});
  }

  // Sends one request in a wave of its own; `answer` is set once its reply goes out.
  void send(const std::string& target, const std::string& body, std::optional<HttpReply>* answer) {
    calls_.push_back(Call{HttpRequest{"POST", target, body, {}},
                          ReplyTo{[answer](HttpReply r) { *answer = std::move(r); }, {}}});
    step();
  }
  void step() {
    Wave wave = coordinator_->step(calls_);
    ASSERT_TRUE(journal_.write(*wave.writes));
    for (Outgoing& o : wave.replies) o.to.respond(std::move(o.reply));
  }
  rapidjson::Document now(const std::string& target, const std::string& body) {
    std::optional<HttpReply> answer;
    send("/v1/runs/s" + target, body, &answer);
    EXPECT_TRUE(answer) << target << " " << body << " parked";
    rapidjson::Document d;
    d.Parse(answer ? answer->body.c_str() : "{}");
    return d;
  }
  static std::string worker(uint32_t r) { return R"({"worker": )" + std::to_string(r); }
  // The completions of `leases`, as a complete's list.
  static std::string completions(const std::vector<uint64_t>& leases) {
    std::string out;
    for (uint64_t lease : leases) {
      out += (out.empty() ? "" : ",") + std::string(R"({"lease": )") + std::to_string(lease) +
             R"(, "loss": 1, "samples": 1})";
    }
    return "[" + out + "]";
  }
  static std::vector<uint64_t> leases_of(const rapidjson::Value& reply) {
    std::vector<uint64_t> leases;
    if (reply.HasMember("jobs")) {
      for (const auto& job : reply["jobs"].GetArray()) leases.push_back(job["lease"].GetUint64());
    }
    return leases;
  }

  // A step-mode run of `ranks` ranks of group g, 2 batches per rank per epoch, 2 epochs; every
  // rank takes its two batches of the first epoch (leases_).
  void start(uint32_t ranks) {
    std::optional<HttpReply> created;
    send("/v1/runs",
         R"({"name": "s", "data": {"train_samples": )" + std::to_string(2 * ranks) +
             R"(, "batch_size": 1}, "schedule": {"epochs": 2, "mode": "steps"}, )"
             R"("leases": {"timeout": 600.0}})",
         &created);
    ASSERT_TRUE(created && created->status == 201) << (created ? created->body : "");
    for (uint32_t r = 0; r < ranks; ++r) {
      const auto d = now("/workers", R"({"name": "r)" + std::to_string(r) +
                                         R"(", "group": "g", "rank": )" + std::to_string(r) +
                                         R"(, "world_size": )" + std::to_string(ranks) + "}");
      ASSERT_EQ(d["worker"].GetUint64(), r);
    }
    leases_.assign(ranks, {});
    for (uint32_t r = 0; r < ranks; ++r) {
      const auto d = now("/acquire", worker(r) + R"(, "jobs": 2})");
      leases_[r] = leases_of(d);
      ASSERT_EQ(leases_[r].size(), 2u) << r;
    }
  }

  // Rank r reports its batches as Phases' feed does (with a request for its next ones, no
  // wait), then long-polls for them: parked unless its report opened the next epoch.
  void report_and_poll(uint32_t r, std::optional<HttpReply>* poll) {
    const auto d = now("/complete", worker(r) + R"(, "completions": )" + completions(leases_[r]) +
                                        R"(, "next": true, "jobs": 2, "wait_ms": 0})");
    ASSERT_TRUE(d.HasMember("next")) << r;
    leases_[r].clear();
    if (std::string(d["next"]["status"].GetString()) == "job") {
      leases_[r] = leases_of(d["next"]);
      return;
    }
    send("/v1/runs/s/acquire", worker(r) + R"(, "jobs": 2, "wait_ms": 20000})", poll);
  }

  ManualClock wall_{1'000'000};
  ServerClock clock_;
  Engine engine_;
  MemoryJournal journal_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<Call> calls_;
  std::vector<std::vector<uint64_t>> leases_;
};

TEST_F(StepModeParked, RanksParkedAtAnEpochsEndAreAskedOnceWhenTheNextOpens) {
  constexpr uint32_t kRanks = 64;
  start(kRanks);
  std::vector<std::optional<HttpReply>> polls(kRanks);
  for (uint32_t r = 0; r + 1 < kRanks; ++r) report_and_poll(r, &polls[r]);
  // 63 ranks wait for the last one's report; their reports (and long polls) came one wave each,
  // and none of them was asked again meanwhile: no report of a rank still training can answer
  // another rank's parked acquire (before: 63·62 retries, each a core acquire).
  EXPECT_EQ(coordinator_->parked(), kRanks - 1);
  EXPECT_EQ(coordinator_->parked_retries(), 0u);
  for (uint32_t r = 0; r + 1 < kRanks; ++r) EXPECT_FALSE(polls[r]) << r;
  // The last report closes the epoch and opens the next: each parked acquire is asked once,
  // and each gets its rank's two batches of epoch 1.
  report_and_poll(kRanks - 1, &polls[kRanks - 1]);
  EXPECT_EQ(leases_[kRanks - 1].size(), 2u);
  EXPECT_EQ(coordinator_->parked(), 0u);
  EXPECT_EQ(coordinator_->parked_retries(), kRanks - 1);
  for (uint32_t r = 0; r + 1 < kRanks; ++r) {
    ASSERT_TRUE(polls[r]) << r;
    rapidjson::Document d;
    d.Parse(polls[r]->body.c_str());
    ASSERT_STREQ(d["status"].GetString(), "job") << polls[r]->body;
    ASSERT_EQ(d["jobs"].Size(), 2u);
    for (const auto& job : d["jobs"].GetArray()) {
      EXPECT_EQ(job["epoch"].GetInt64(), 1);
      EXPECT_EQ(job["rank"].GetUint64(), r);
    }
  }
  // The count is exported.
  std::optional<HttpReply> metrics;
  calls_.push_back(Call{HttpRequest{"GET", "/metrics", "", {}},
                        ReplyTo{[&metrics](HttpReply r) { metrics = std::move(r); }, {}}});
  step();
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("\ntraincoord_parked_retries_total 63\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("\ntraincoord_parked_acquires 0\n"), std::string::npos);
}

// A batch given back (here released by its rank) goes to its rank's parked acquire at once:
// a release is no report, and counts as a change whatever it did.
TEST_F(StepModeParked, ABatchReleasedGoesToItsRanksParkedAcquireAtOnce) {
  start(2);
  std::optional<HttpReply> poll0, poll1;
  report_and_poll(0, &poll0);
  ASSERT_FALSE(poll0);
  // Rank 1 holds its two batches and long-polls for more: nothing for it either.
  send("/v1/runs/s/acquire", worker(1) + R"(, "jobs": 2, "wait_ms": 20000})", &poll1);
  ASSERT_FALSE(poll1);
  ASSERT_EQ(coordinator_->parked(), 2u);
  const uint64_t before = coordinator_->parked_retries();
  const auto released =
      now("/release", worker(1) + R"(, "leases": [)" + std::to_string(leases_[1][1]) + "]}");
  ASSERT_EQ(released["released"].GetUint64(), 1u) << "release";
  ASSERT_TRUE(poll1) << "rank 1's parked acquire was not answered with its batch given back";
  rapidjson::Document d;
  d.Parse(poll1->body.c_str());
  ASSERT_STREQ(d["status"].GetString(), "job") << poll1->body;
  EXPECT_EQ(d["jobs"][0]["rank"].GetUint64(), 1u);
  EXPECT_EQ(d["jobs"][0]["epoch"].GetInt64(), 0);
  EXPECT_FALSE(poll0);  // (rank 0: nothing until the epoch closes)
  EXPECT_EQ(coordinator_->parked_retries() - before, 2u);  // each asked once
}

// A new group takes the run over (no cut yet): the parked acquires of the group it replaced are
// answered stale_generation at once, not when their wait runs out.
TEST_F(StepModeParked, TheParkedAcquiresOfAReplacedGroupAreRefusedAtOnce) {
  start(4);
  std::vector<std::optional<HttpReply>> polls(4);
  for (uint32_t r = 0; r < 3; ++r) report_and_poll(r, &polls[r]);
  ASSERT_EQ(coordinator_->parked(), 3u);
  now("/workers", R"({"name": "h0", "group": "h", "rank": 0, "world_size": 1})");
  EXPECT_EQ(coordinator_->parked(), 0u);
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(polls[r]) << r;
    rapidjson::Document d;
    d.Parse(polls[r]->body.c_str());
    ASSERT_TRUE(d.HasMember("error")) << polls[r]->body;
    EXPECT_STREQ(d["error"]["code"].GetString(), "stale_generation");
  }
}

// Nothing changes: a parked acquire is still answered "wait" once its wait runs out, and while
// it waits it is asked again only by the once-a-second sweep of the ticks.
TEST_F(StepModeParked, AWaitRunsOutWhenNothingChanges) {
  constexpr uint32_t kRanks = 8;
  start(kRanks);
  std::vector<std::optional<HttpReply>> polls(kRanks);
  for (uint32_t r = 0; r + 1 < kRanks; ++r) report_and_poll(r, &polls[r]);
  ASSERT_EQ(coordinator_->parked(), kRanks - 1);
  // 25 s in ticks of 200 ms (the server clock does not count a jump as time leases run).
  for (int tick = 0; tick < 125 && coordinator_->parked() > 0; ++tick) {
    wall_.advance(200);
    step();
  }
  EXPECT_EQ(coordinator_->parked(), 0u);
  for (uint32_t r = 0; r + 1 < kRanks; ++r) {
    ASSERT_TRUE(polls[r]) << r;
    rapidjson::Document d;
    d.Parse(polls[r]->body.c_str());
    EXPECT_STREQ(d["status"].GetString(), "wait") << polls[r]->body;
  }
  // About 20 sweeps of 7 acquires, and the 7 answers of their timeouts; not one per tick each
  // (100 ticks of 7).
  EXPECT_LE(coordinator_->parked_retries(), (kRanks - 1) * 22);
  EXPECT_GE(coordinator_->parked_retries(), kRanks - 1);
}

}  // namespace
}  // namespace traincoord
