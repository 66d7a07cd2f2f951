// The history's rows name the worker that completed each job and carry dates (issue 34):
// ISO 8601 in UTC and milliseconds since the Unix epoch, read as the wall clock at the request
// less the time since on the coordinator's clock (docs/OBSERVABILITY.md, "The loss history").
#include "server/history_view.h"

#include <gtest/gtest.h>

#include <rapidjson/document.h>

#include <string>

#include "server/api.h"
#include "server/wall_time.h"

namespace traincoord {
namespace {

TEST(WallTime, Iso8601IsUtcToTheMillisecond) {
  EXPECT_EQ(iso8601_utc(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(iso8601_utc(951'782'400'123), "2000-02-29T00:00:00.123Z");  // a leap day
  EXPECT_EQ(iso8601_utc(1'800'000'000'123), "2027-01-15T08:00:00.123Z");
  EXPECT_EQ(iso8601_utc(1'767'225'599'999), "2025-12-31T23:59:59.999Z");
  EXPECT_EQ(iso8601_utc(-1), "1969-12-31T23:59:59.999Z");
}

class HistoryViewTest : public ::testing::Test {
 protected:
  HistoryViewTest() : engine_(clock_), api_(engine_, clock_) {
    EXPECT_EQ(post("/v1/runs", R"({"name": "h",
        "data": {"train_batches": 2, "dev_batches": 1, "order": "sequential"},
        "schedule": {"epochs": 1}})")
                  .status,
              201);
  }

  HttpReply post(const std::string& target, const std::string& body) {
    return std::get<HttpReply>(api_.handle({"POST", target, body, {}}));
  }

  // The first job of the run completed by a worker of this name.
  void complete_one(const std::string& worker_name) {
    ASSERT_EQ(post("/v1/runs/h/workers", R"({"name": ")" + worker_name + R"("})").status, 200);
    auto a = post("/v1/runs/h/acquire", R"({"worker": 0})");
    ASSERT_EQ(a.status, 200) << a.body;
    auto c = post("/v1/runs/h/complete", R"({"worker": 0, "lease": 1, "loss": 0.5})");
    ASSERT_EQ(c.status, 200) << c.body;
  }

  ManualClock clock_{5'000};
  Engine engine_;
  Api api_;
};

// No wall clock given: the system's. A job row's date plus its age is the wall clock at the
// request, which the test brackets by reading the system clock before and after.
TEST_F(HistoryViewTest, WithoutAWallClockRowsAreDatedByTheSystemClock) {
  complete_one("w-1");
  clock_.advance(2'500);
  const int64_t before = UnixClock().now();
  auto r = std::get<HttpReply>(api_.handle({"GET", "/v1/runs/h/history", "", {}}));
  const int64_t after = UnixClock().now();
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  ASSERT_FALSE(d.HasParseError()) << r.body;
  ASSERT_EQ(d["jobs"].Size(), 1u) << r.body;
  const auto& job = d["jobs"][0];
  EXPECT_STREQ(job["worker"].GetString(), "w-1");
  EXPECT_EQ(job["ago_ms"].GetInt64(), 2'500);
  const int64_t at = job["time_ms"].GetInt64() + job["ago_ms"].GetInt64();
  EXPECT_GE(at, before);
  EXPECT_LE(at, after);
  EXPECT_EQ(job["time"].GetString(), iso8601_utc(job["time_ms"].GetInt64()));
}

// A worker's name is a CSV field like any other: quoted when it holds a comma.
TEST_F(HistoryViewTest, ACsvJobRowQuotesAWorkerNameWithAComma) {
  complete_one("node 3, gpu 1");
  ManualClock wall(60'000);
  api_.set_wall_clock(&wall);
  auto r = std::get<HttpReply>(api_.handle({"GET", "/v1/runs/h/history?format=csv", "", {}}));
  EXPECT_EQ(r.body,
            "kind,set,epoch,job,closed,loss,done,jobs,ago_ms,worker,time,time_ms,samples,"
            "duration_s\r\n"
            "epoch,train,0,,false,,1,2,,,,,0,\r\n"
            "job,train,0,0,,0.5,,,0,\"node 3, gpu 1\",1970-01-01T00:01:00.000Z,60000,,\r\n");
}

// An epoch's dates and duration (issue 34): the status and GET .../epochs give when it opened
// and closed (ISO 8601 UTC) and how long it was open; GET /metrics the last closed epoch's
// duration per set. The train epoch opens at 5 s on the run's clock and closes at 8 s.
TEST_F(HistoryViewTest, AClosedEpochCarriesItsDatesAndDurationInStatusAndMetrics) {
  ASSERT_EQ(post("/v1/runs/h/workers", R"({"name": "w"})").status, 200);
  for (int lease = 1; lease <= 2; ++lease) {
    ASSERT_EQ(post("/v1/runs/h/acquire", R"({"worker": 0})").status, 200);
    clock_.advance(1'500);
    auto c = post("/v1/runs/h/complete", R"({"worker": 0, "loss": 0.5, "samples": 4, "lease": )" +
                                             std::to_string(lease) + "}");
    ASSERT_EQ(c.status, 200) << c.body;
  }
  clock_.advance(250);
  ManualClock wall(1'800'000'000'250);  // 2027-01-15T08:00:00.250Z, at 8.25 s on the run's clock
  api_.set_wall_clock(&wall);
  for (const std::string target : {"/v1/runs/h", "/v1/runs/h/epochs"}) {
    auto r = std::get<HttpReply>(api_.handle({"GET", target, "", {}}));
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    ASSERT_FALSE(d.HasParseError()) << r.body;
    ASSERT_GE(d["epochs"].Size(), 2u) << r.body;
    const auto& train = d["epochs"][0];
    ASSERT_STREQ(train["set"].GetString(), "train");
    EXPECT_STREQ(train["opened_at"].GetString(), "2027-01-15T07:59:57.000Z") << target;
    EXPECT_STREQ(train["closed_at"].GetString(), "2027-01-15T08:00:00.000Z") << target;
    EXPECT_DOUBLE_EQ(train["duration_s"].GetDouble(), 3.0) << target;
    const auto& dev = d["epochs"][1];
    ASSERT_STREQ(dev["set"].GetString(), "dev");
    EXPECT_TRUE(dev["closed_at"].IsNull() && dev["duration_s"].IsNull()) << "open: " << target;
    EXPECT_TRUE(dev["opened_at"].IsString()) << target;
  }
  const std::string metrics = api_.metrics_text();
  EXPECT_NE(metrics.find("# TYPE traincoord_run_epoch_duration_seconds gauge\n"
                         "traincoord_run_epoch_duration_seconds{run=\"h\",set=\"train\"} 3\n"
                         "# HELP"),
            std::string::npos)
      << "the train epoch's 3 s, and no dev series while dev 0 is open: " << metrics;
}

// The history's epoch rows carry each epoch's samples and duration_s (null while open), the
// same as the status's, so a dashboard charts samples/s per epoch from the history it polls.
TEST_F(HistoryViewTest, AHistoryEpochRowCarriesItsSamplesAndDuration) {
  ASSERT_EQ(post("/v1/runs/h/workers", R"({"name": "w"})").status, 200);
  for (int lease = 1; lease <= 2; ++lease) {
    ASSERT_EQ(post("/v1/runs/h/acquire", R"({"worker": 0})").status, 200);
    clock_.advance(1'500);
    auto c = post("/v1/runs/h/complete", R"({"worker": 0, "loss": 0.5, "samples": 4, "lease": )" +
                                             std::to_string(lease) + "}");
    ASSERT_EQ(c.status, 200) << c.body;
  }
  ManualClock wall(60'000);
  api_.set_wall_clock(&wall);
  auto r = std::get<HttpReply>(api_.handle({"GET", "/v1/runs/h/history", "", {}}));
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  ASSERT_FALSE(d.HasParseError()) << r.body;
  ASSERT_EQ(d["epochs"].Size(), 2u) << r.body;
  const auto& train = d["epochs"][0];
  EXPECT_EQ(train["samples"].GetUint64(), 8u) << r.body;
  EXPECT_DOUBLE_EQ(train["duration_s"].GetDouble(), 3.0) << r.body;
  const auto& dev = d["epochs"][1];
  EXPECT_EQ(dev["samples"].GetUint64(), 0u) << r.body;
  EXPECT_TRUE(dev["duration_s"].IsNull()) << r.body;
  auto lines = std::get<HttpReply>(api_.handle({"GET", "/v1/runs/h/history?format=jsonl", "", {}}));
  EXPECT_NE(lines.body.find(R"("samples":8,"duration_s":3.0})"), std::string::npos) << lines.body;
  EXPECT_NE(lines.body.find(R"("samples":0,"duration_s":null})"), std::string::npos) << lines.body;
  auto csv = std::get<HttpReply>(api_.handle({"GET", "/v1/runs/h/history?format=csv", "", {}}));
  EXPECT_EQ(csv.body.substr(0, csv.body.find("\r\njob,") + 2),
            "kind,set,epoch,job,closed,loss,done,jobs,ago_ms,worker,time,time_ms,samples,"
            "duration_s\r\n"
            "epoch,train,0,,true,0.5,2,2,0,,1970-01-01T00:01:00.000Z,60000,8,3\r\n"
            "epoch,dev,0,,false,,0,1,,,,,0,\r\n");
}

}  // namespace
}  // namespace traincoord
