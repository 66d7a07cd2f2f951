// The run's status stays small however many epochs a run has, and what it leaves out is paged:
// GET /v1/runs/{run}/epochs and GET /v1/runs/{run}/history list every epoch exactly once, and a
// poller that remembers the last completion it saw gets only the newer ones (docs/API.md).
#include <gtest/gtest.h>

#include <rapidjson/document.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "server/api.h"

namespace traincoord {
namespace {

constexpr uint64_t kEpochs = 20'000;  // opened: 10,000 of each set

// The set and number of the epoch opened at `position`: train 0, dev 0, train 1, ...
std::pair<std::string, int64_t> epoch_at(uint64_t position) {
  return {position % 2 == 0 ? "train" : "dev", static_cast<int64_t>(position / 2)};
}

// The loss of the i-th completion: always better, so that early stopping never stops the run.
double loss_of(uint64_t i) { return 1e6 - static_cast<double>(i); }

// A run of 10,000 train and 10,000 dev epochs of one job each, trained to the end through the
// API, with early stopping watching every dev epoch.
class StatusViewTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    clock_ = new ManualClock();
    engine_ = new Engine(*clock_);
    api_ = new Api(*engine_, *clock_);
    wall_ = new ManualClock(1'000'000'000'000);  // 2001-09-09T01:46:40.000Z
    api_->set_wall_clock(wall_);
    EXPECT_EQ(reply("POST", "/v1/runs", R"({"name": "long",
        "data": {"train_batches": 1, "dev_batches": 1, "order": "sequential"},
        "schedule": {"epochs": 10000, "validation_every": 1},
        "early_stop": {"rule": "patience", "patience": 3}})")
                  .status,
              201);
    json("POST", "/v1/runs/long/workers", R"({"name": "w"})");
    uint64_t lease =
        json("POST", "/v1/runs/long/acquire", R"({"worker": 0})")["job"]["lease"].GetUint64();
    for (uint64_t i = 0; i < kEpochs; ++i) {
      clock_->advance(1);
      auto next =
          json("POST", "/v1/runs/long/complete",
               R"({"worker": 0, "next": true, "metrics": {"acc": 0.25}, "loss": )" +
                   std::to_string(loss_of(i)) + R"(, "lease": )" + std::to_string(lease) + "}");
      ASSERT_STREQ(next["outcome"].GetString(), "accepted") << "epoch " << i;
      if (i + 1 < kEpochs) {
        ASSERT_STREQ(next["next"]["status"].GetString(), "job") << "epoch " << i;
        lease = next["next"]["job"]["lease"].GetUint64();
      }
    }
  }

  static void TearDownTestSuite() {
    delete api_;
    delete wall_;
    delete engine_;
    delete clock_;
  }

  static HttpReply reply(const std::string& method, const std::string& target,
                         const std::string& body = "") {
    auto r = api_->handle({method, target, body, {}});
    EXPECT_TRUE(std::holds_alternative<HttpReply>(r)) << target << " parked";
    return std::holds_alternative<HttpReply>(r) ? std::get<HttpReply>(r) : HttpReply{};
  }

  static rapidjson::Document json(const std::string& method, const std::string& target,
                                  const std::string& body = "", int status = 200) {
    const HttpReply r = reply(method, target, body);
    EXPECT_EQ(r.status, status) << method << " " << target << ": " << r.body.substr(0, 300);
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    EXPECT_FALSE(d.HasParseError()) << r.body.substr(0, 300);
    return d;
  }

  static ManualClock* clock_;
  static ManualClock* wall_;  // the wall clock the history dates its rows by
  static Engine* engine_;
  static Api* api_;
};

ManualClock* StatusViewTest::clock_ = nullptr;
ManualClock* StatusViewTest::wall_ = nullptr;
Engine* StatusViewTest::engine_ = nullptr;
Api* StatusViewTest::api_ = nullptr;

TEST_F(StatusViewTest, TheStatusOfARunOf20000EpochsListsTheLatestAndCountsThemAll) {
  const HttpReply r = reply("GET", "/v1/runs/long");
  ASSERT_EQ(r.status, 200);
  EXPECT_LT(r.body.size(), 64u * 1024) << "the status a dashboard polls stays small";
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  ASSERT_FALSE(d.HasParseError());
  EXPECT_STREQ(d["state"].GetString(), "completed");
  EXPECT_EQ(d["epochs_total"].GetUint64(), kEpochs);
  EXPECT_EQ(d["epochs_from"].GetUint64(), kEpochs - 100);
  ASSERT_EQ(d["epochs"].Size(), 100u);
  EXPECT_EQ(d["epochs"][0]["epoch"].GetInt64(), epoch_at(kEpochs - 100).second);
  EXPECT_EQ(d["epochs"][99]["epoch"].GetInt64(), epoch_at(kEpochs - 1).second);
  EXPECT_STREQ(d["epochs"][99]["set"].GetString(), "dev");
  // The aggregates still cover the whole run.
  EXPECT_EQ(d["progress"]["jobs_done"].GetUint64(), kEpochs);
  EXPECT_EQ(d["counters"]["completions_accepted"].GetUint64(), kEpochs);
  EXPECT_EQ(d["early_stop"]["best_epoch"].GetInt64(), epoch_at(kEpochs - 1).second);
  EXPECT_EQ(d["early_stop"]["observed_total"].GetUint64(), kEpochs / 2);
  ASSERT_EQ(d["early_stop"]["observed"].Size(), 100u);
  EXPECT_EQ(d["early_stop"]["observed"][99]["epoch"].GetInt64(), epoch_at(kEpochs - 1).second);
}

TEST_F(StatusViewTest, TheStatusListsAsManyLatestEpochsAsAskedUpTo1000) {
  auto none = json("GET", "/v1/runs/long?epochs=0");
  EXPECT_EQ(none["epochs"].Size(), 0u);
  EXPECT_EQ(none["epochs_from"].GetUint64(), kEpochs);
  EXPECT_EQ(none["epochs_total"].GetUint64(), kEpochs);
  auto most = json("GET", "/v1/runs/long?epochs=1000");
  ASSERT_EQ(most["epochs"].Size(), 1000u);
  EXPECT_EQ(most["epochs"][999]["epoch"].GetInt64(), epoch_at(kEpochs - 1).second);
  for (const char* bad : {"1001", "x", "", "-1", "1e3", "18446744073709551616"}) {
    auto refused = json("GET", std::string("/v1/runs/long?epochs=") + bad, "", 400);
    EXPECT_STREQ(refused["error"]["code"].GetString(), "invalid_argument") << bad;
    EXPECT_STREQ(refused["error"]["field"].GetString(), "epochs") << bad;
  }
}

TEST_F(StatusViewTest, PagingTheEpochsListsEveryEpochOnceInOpeningOrder) {
  std::set<std::pair<std::string, int64_t>> seen;
  uint64_t from = 0;
  int pages = 0;
  for (; pages < 100 && from < kEpochs; ++pages) {
    const HttpReply r = reply("GET", "/v1/runs/long/epochs?from=" + std::to_string(from));
    ASSERT_EQ(r.status, 200) << r.body.substr(0, 300);
    EXPECT_LT(r.body.size(), 1024u * 1024);
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    ASSERT_EQ(d["epochs_total"].GetUint64(), kEpochs);
    ASSERT_EQ(d["epochs_from"].GetUint64(), from);
    const auto& page = d["epochs"];
    ASSERT_GT(page.Size(), 0u);
    EXPECT_LE(page.Size(), 1000u);
    for (const auto& e : page.GetArray()) {
      const uint64_t position = seen.size();
      const std::pair<std::string, int64_t> key{e["set"].GetString(), e["epoch"].GetInt64()};
      EXPECT_EQ(key, epoch_at(position)) << "in opening order";
      EXPECT_TRUE(seen.insert(key).second) << "epoch listed twice";
      EXPECT_TRUE(e["closed"].GetBool());
      EXPECT_DOUBLE_EQ(e["loss"].GetDouble(), loss_of(position));
    }
    from += page.Size();
  }
  EXPECT_EQ(seen.size(), kEpochs);
  EXPECT_EQ(pages, 20);
  // Past the end: an empty page, not an error (a poller asks for what is new).
  auto past = json("GET", "/v1/runs/long/epochs?from=999999");
  EXPECT_EQ(past["epochs"].Size(), 0u);
  EXPECT_EQ(past["epochs_from"].GetUint64(), kEpochs);
  auto few = json("GET", "/v1/runs/long/epochs?from=5&limit=3");
  ASSERT_EQ(few["epochs"].Size(), 3u);
  EXPECT_EQ(few["epochs"][0]["epoch"].GetInt64(), epoch_at(5).second);
  json("GET", "/v1/runs/long/epochs?limit=1001", "", 400);
  json("GET", "/v1/runs/long/epochs?from=a", "", 400);
}

TEST_F(StatusViewTest, PagingTheHistoryListsEveryEpochOnceAndOnlyNewerCompletions) {
  std::set<std::pair<std::string, int64_t>> seen;
  uint64_t from = 0;
  for (int pages = 0; pages < 100 && from < kEpochs; ++pages) {
    auto d = json("GET", "/v1/runs/long/history?limit=5000&jobs_after=" + std::to_string(kEpochs) +
                             "&from=" + std::to_string(from));
    ASSERT_EQ(d["epochs_total"].GetUint64(), kEpochs);
    ASSERT_EQ(d["epochs_from"].GetUint64(), from);
    ASSERT_GT(d["epochs"].Size(), 0u);
    EXPECT_LE(d["epochs"].Size(), 5000u);
    EXPECT_EQ(d["jobs"].Size(), 0u) << "no completion after the newest";
    for (const auto& e : d["epochs"].GetArray()) {
      const std::pair<std::string, int64_t> key{e["set"].GetString(), e["epoch"].GetInt64()};
      EXPECT_EQ(key, epoch_at(seen.size())) << "in opening order";
      EXPECT_TRUE(seen.insert(key).second) << "epoch listed twice";
      EXPECT_DOUBLE_EQ(e["metrics"]["acc"].GetDouble(), 0.25);
    }
    from += d["epochs"].Size();
  }
  EXPECT_EQ(seen.size(), kEpochs);

  // Completions are numbered in the order they were counted; the newest is jobs_total.
  auto latest = json("GET", "/v1/runs/long/history?limit=0&jobs_after=19990");
  EXPECT_EQ(latest["epochs"].Size(), 0u);
  EXPECT_EQ(latest["jobs_total"].GetUint64(), kEpochs);
  ASSERT_EQ(latest["jobs"].Size(), 10u);
  for (rapidjson::SizeType i = 0; i < 10; ++i) {
    EXPECT_EQ(latest["jobs"][i]["n"].GetUint64(), 19991u + i);
    EXPECT_EQ(latest["jobs"][i]["epoch"].GetInt64(), epoch_at(19990 + i).second);
    EXPECT_DOUBLE_EQ(latest["jobs"][i]["loss"].GetDouble(), loss_of(19990 + i));
  }
  // The history keeps the latest 4,096: an older number lists them all.
  auto kept = json("GET", "/v1/runs/long/history?limit=0");
  ASSERT_EQ(kept["jobs"].Size(), Run::kRecentKept);
  EXPECT_EQ(kept["jobs"][0]["n"].GetUint64(), kEpochs - Run::kRecentKept + 1);
  // The same selection in the other formats.
  const HttpReply csv =
      reply("GET", "/v1/runs/long/history?format=csv&from=3&limit=2&jobs_after=19999");
  // (the epochs closed 19,996 and 19,995 ms before the wall clock's 1e12 ms)
  EXPECT_EQ(csv.body,
            "kind,set,epoch,job,closed,loss,done,jobs,ago_ms,worker,time,time_ms,samples,"
            "duration_s,metric.acc\r\n"
            "epoch,dev,1,,true,999997,1,1,19996,,2001-09-09T01:46:20.004Z,999999980004,0,0.001,"
            "0.25\r\n"
            "epoch,train,2,,true,999996,1,1,19995,,2001-09-09T01:46:20.005Z,999999980005,0,0.001,"
            "0.25\r\n"
            "job,dev,9999,0,,980001,,,0,w,2001-09-09T01:46:40.000Z,1000000000000,,,\r\n");
  const HttpReply jsonl =
      reply("GET", "/v1/runs/long/history?format=jsonl&limit=1&jobs_after=19999");
  EXPECT_NE(jsonl.body.find(R"({"kind":"epoch","set":"train","epoch":0,)"), std::string::npos);
  EXPECT_NE(jsonl.body.find(R"({"kind":"job","n":20000,)"), std::string::npos) << jsonl.body;
  EXPECT_EQ(std::count(jsonl.body.begin(), jsonl.body.end(), '\n'), 2);
  auto bad = json("GET", "/v1/runs/long/history?jobs_after=-1", "", 400);
  EXPECT_STREQ(bad["error"]["field"].GetString(), "jobs_after");
}

}  // namespace
}  // namespace traincoord
