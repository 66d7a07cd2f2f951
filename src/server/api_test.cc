#include "server/api.h"

#include <gtest/gtest.h>

#include <rapidjson/document.h>

#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/run_codec.h"
#include "core/utf8.h"

namespace traincoord {
namespace {

class ApiTest : public ::testing::Test {
 protected:
  ApiTest() : engine_(clock_), api_(engine_, clock_) {
    const HttpReply created = reply("POST", "/v1/runs", R"({"name": "r",
        "data": {"train_batches": 4, "dev_batches": 2, "order": "sequential"},
        "schedule": {"epochs": 1}, "leases": {"timeout": 1.0}})");
    EXPECT_EQ(created.status, 201) << created.body;
  }

  HttpReply reply(const std::string& method, const std::string& target,
                  const std::string& body = "") {
    auto r = api_.handle({method, target, body, {}});
    EXPECT_TRUE(std::holds_alternative<HttpReply>(r)) << target << " parked";
    return std::holds_alternative<HttpReply>(r) ? std::get<HttpReply>(r) : HttpReply{};
  }

  rapidjson::Document json(const std::string& method, const std::string& target,
                           const std::string& body = "", int status = 200) {
    const HttpReply r = reply(method, target, body);
    EXPECT_EQ(r.status, status) << method << " " << target << ": " << r.body;
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    EXPECT_FALSE(d.HasParseError()) << r.body;
    return d;
  }

  ManualClock clock_;
  Engine engine_;
  Api api_;
};

TEST_F(ApiTest, HealthzAnswers) {
  auto d = json("GET", "/healthz");
  EXPECT_STREQ(d["status"].GetString(), "ok");
}

TEST_F(ApiTest, RegisterAcquireCompleteAndNextInOneCall) {
  auto w = json("POST", "/v1/runs/r/workers", R"({"name": "host-1"})");
  EXPECT_EQ(w["worker"].GetUint(), 0u);
  EXPECT_EQ(w["heartbeat_interval_ms"].GetInt64(), 333);
  auto a = json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  ASSERT_STREQ(a["status"].GetString(), "job");
  EXPECT_EQ(a["job"]["lease"].GetUint64(), 1u);
  EXPECT_STREQ(a["job"]["set"].GetString(), "train");
  EXPECT_EQ(a["job"]["batches"][0].GetUint64(), 0u);
  auto c = json("POST", "/v1/runs/r/complete",
                R"({"worker": 0, "lease": 1, "loss": 0.5, "samples": 8, "next": true})");
  EXPECT_STREQ(c["outcome"].GetString(), "accepted");
  EXPECT_TRUE(c["counted"].GetBool());
  EXPECT_STREQ(c["next"]["status"].GetString(), "job");
  EXPECT_EQ(c["next"]["job"]["index"].GetUint64(), 1u);
}

TEST_F(ApiTest, ARepeatedCompletionIsIdempotent) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  const std::string done = R"({"worker": 0, "lease": 1, "loss": 0.5, "samples": 8})";
  EXPECT_STREQ(json("POST", "/v1/runs/r/complete", done)["outcome"].GetString(), "accepted");
  auto again = json("POST", "/v1/runs/r/complete", done);
  EXPECT_STREQ(again["outcome"].GetString(), "duplicate");
  EXPECT_FALSE(again["counted"].GetBool());
}

TEST_F(ApiTest, ErrorsCarryStatusCodeAndField) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/workers", R"({"name": "b"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");

  auto bad =
      json("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 1, "loss": "low"})", 400);
  EXPECT_STREQ(bad["error"]["code"].GetString(), "invalid_argument");
  EXPECT_STREQ(bad["error"]["field"].GetString(), "loss");
  auto negative = json("POST", "/v1/runs/r/complete",
                       R"({"worker": 0, "lease": 1, "loss": 1, "samples": -3})", 400);
  EXPECT_STREQ(negative["error"]["field"].GetString(), "samples");
  auto typo = json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "wait": 5})", 400);
  EXPECT_STREQ(typo["error"]["field"].GetString(), "wait");
  auto foreign =
      json("POST", "/v1/runs/r/complete", R"({"worker": 1, "lease": 1, "loss": 1})", 409);
  EXPECT_STREQ(foreign["error"]["code"].GetString(), "lease_not_yours");
  json("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 42, "loss": 1})", 404);
  json("POST", "/v1/runs/r/acquire", R"({"worker": 7})", 404);
  json("POST", "/v1/runs/nope/acquire", R"({"worker": 0})", 404);
  json("GET", "/v1/nothing", "", 404);
  json("POST", "/v1/runs/r/acquire", "{not json", 400);
  json("POST", "/v1/runs/r/acquire", "[1, 2]", 400);
  const HttpReply wrong = reply("GET", "/v1/runs/r/acquire");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.allow, "POST");
  EXPECT_EQ(reply("DELETE", "/v1/runs").status, 405);
  // None of it changed the run: job 0 is still leased to worker 0 and nothing is done.
  auto status = json("GET", "/v1/runs/r");
  EXPECT_EQ(status["progress"]["jobs_done"].GetUint64(), 0u);
  EXPECT_EQ(status["progress"]["jobs_running"].GetUint64(), 1u);
}

// Every error a worker meets in its lifecycle has a code of its own (docs/API.md), which both
// clients decide on; the HTTP status still says its kind.
TEST_F(ApiTest, ErrorsAProgramActsOnHaveACodeOfTheirOwn) {
  auto code = [&](const std::string& method, const std::string& target, const std::string& body,
                  int status) {
    auto d = json(method, target, body, status);
    return std::string(d["error"]["code"].GetString());
  };
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/workers", R"({"name": "b"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "jobs": 2})");

  EXPECT_EQ(code("POST", "/v1/runs/nope/acquire", R"({"worker": 0})", 404), "run_not_found");
  EXPECT_EQ(code("GET", "/v1/runs/nope", "", 404), "run_not_found");
  EXPECT_EQ(code("POST", "/v1/runs", R"({"name": "r", "data": {"train_batches": 4}})", 409),
            "run_exists");
  for (const char* action : {"acquire", "heartbeat", "leave"}) {
    EXPECT_EQ(code("POST", std::string("/v1/runs/r/") + action, R"({"worker": 9})", 404),
              "worker_not_registered")
        << action;
  }
  EXPECT_EQ(code("POST", "/v1/runs/r/complete", R"({"worker": 9, "lease": 1, "loss": 1})", 404),
            "worker_not_registered");
  EXPECT_EQ(code("POST", "/v1/runs/r/release", R"({"worker": 9, "leases": [1]})", 404),
            "worker_not_registered");
  EXPECT_EQ(code("POST", "/v1/runs/r/fail", R"({"worker": 9, "lease": 1})", 404),
            "worker_not_registered");

  EXPECT_EQ(code("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 42, "loss": 1})", 404),
            "lease_unknown");
  EXPECT_EQ(
      code("POST", "/v1/runs/r/complete",
           R"({"worker": 0, "completions": [{"lease": 1, "loss": 1}, {"lease": 42, "loss": 1}]})",
           404),
      "lease_unknown");
  EXPECT_EQ(code("POST", "/v1/runs/r/fail", R"({"worker": 0, "lease": 42})", 404), "lease_unknown");
  EXPECT_EQ(code("POST", "/v1/runs/r/release", R"({"worker": 0, "leases": [42]})", 404),
            "lease_unknown");

  EXPECT_EQ(code("POST", "/v1/runs/r/complete", R"({"worker": 1, "lease": 1, "loss": 1})", 409),
            "lease_not_yours");
  EXPECT_EQ(code("POST", "/v1/runs/r/fail", R"({"worker": 1, "lease": 1})", 409),
            "lease_not_yours");
  EXPECT_EQ(code("POST", "/v1/runs/r/release", R"({"worker": 1, "leases": [2]})", 409),
            "lease_not_yours");
  // A lease completed and no longer live is still the other worker's.
  json("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 1, "loss": 1})");
  EXPECT_EQ(code("POST", "/v1/runs/r/complete", R"({"worker": 1, "lease": 1, "loss": 1})", 409),
            "lease_not_yours");

  EXPECT_EQ(code("POST", "/v1/runs/r/next_index", R"({"set": "dev"})", 409), "epoch_not_started");

  // The errors no program reacts to keep their generic codes.
  EXPECT_EQ(code("POST", "/v1/runs/r/acquire", R"({"worker": 0, "wait": 5})", 400),
            "invalid_argument");
  EXPECT_EQ(code("GET", "/v1/nothing", "", 404), "not_found");
  EXPECT_EQ(code("POST", "/v1/runs/r/nothing", "{}", 404), "not_found");
  EXPECT_EQ(code("GET", "/v1/runs/r/acquire", "", 405), "method_not_allowed");
}

TEST_F(ApiTest, SeveralJobsPerRequestAreHandedOutAndCompletedAsAList) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  auto a = json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "jobs": 3, "request": 7})");
  ASSERT_STREQ(a["status"].GetString(), "job");
  ASSERT_TRUE(a["jobs"].IsArray());
  ASSERT_EQ(a["jobs"].Size(), 3u);
  EXPECT_FALSE(a.HasMember("job"));
  for (rapidjson::SizeType i = 0; i < 3; ++i) {
    EXPECT_EQ(a["jobs"][i]["lease"].GetUint64(), i + 1);
    EXPECT_EQ(a["jobs"][i]["index"].GetUint64(), i);
  }
  // A retry of the same request (its reply lost) gets the same three jobs, not three more.
  auto again = json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "jobs": 3, "request": 7})");
  ASSERT_EQ(again["jobs"].Size(), 3u);
  for (rapidjson::SizeType i = 0; i < 3; ++i)
    EXPECT_EQ(again["jobs"][i]["lease"].GetUint64(), i + 1);

  // Two completed, and the next jobs asked for: only one train job is left before the barrier.
  auto c = json("POST", "/v1/runs/r/complete", R"({"worker": 0, "completions": [
      {"lease": 1, "loss": 0.5, "samples": 8}, {"lease": 2, "loss": 0.7, "samples": 8,
      "metrics": {"accuracy": 0.9}}], "next": true, "jobs": 2})");
  ASSERT_EQ(c["outcomes"].Size(), 2u);
  EXPECT_STREQ(c["outcomes"][0]["outcome"].GetString(), "accepted");
  EXPECT_TRUE(c["outcomes"][1]["counted"].GetBool());
  ASSERT_STREQ(c["next"]["status"].GetString(), "job");
  ASSERT_EQ(c["next"]["jobs"].Size(), 1u);
  EXPECT_EQ(c["next"]["jobs"][0]["index"].GetUint64(), 3u);
  // A repeated list: duplicates, counted once.
  auto dup = json("POST", "/v1/runs/r/complete",
                  R"({"worker": 0, "completions": [{"lease": 1, "loss": 0.5}]})");
  EXPECT_STREQ(dup["outcomes"][0]["outcome"].GetString(), "duplicate");
  auto status = json("GET", "/v1/runs/r");
  EXPECT_EQ(status["progress"]["jobs_done"].GetUint64(), 2u);
}

TEST_F(ApiTest, AListOfCompletionsIsAllOrNothing) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/workers", R"({"name": "b"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "jobs": 2})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 1})");
  // A lease never issued, another worker's lease: refused whole, lease 1 not counted either.
  json("POST", "/v1/runs/r/complete",
       R"({"worker": 0, "completions": [{"lease": 1, "loss": 1}, {"lease": 42, "loss": 1}]})", 404);
  auto foreign = json("POST", "/v1/runs/r/complete",
                      R"({"worker": 0, "completions": [{"lease": 1, "loss": 1},
                          {"lease": 3, "loss": 1}]})",
                      409);
  EXPECT_STREQ(foreign["error"]["code"].GetString(), "lease_not_yours");
  auto item = json("POST", "/v1/runs/r/complete",
                   R"({"worker": 0, "completions": [{"lease": 1, "loss": 1}, {"lease": 2}]})", 400);
  EXPECT_STREQ(item["error"]["field"].GetString(), "completions[1].loss");
  auto typo = json("POST", "/v1/runs/r/complete",
                   R"({"worker": 0, "completions": [{"lease": 1, "loss": 1, "sample": 3}]})", 400);
  EXPECT_STREQ(typo["error"]["field"].GetString(), "completions[0].sample");
  auto beside = json("POST", "/v1/runs/r/complete",
                     R"({"worker": 0, "lease": 1, "completions": [{"lease": 1, "loss": 1}]})", 400);
  EXPECT_STREQ(beside["error"]["field"].GetString(), "lease");
  json("POST", "/v1/runs/r/complete", R"({"worker": 0, "completions": []})", 400);
  json("POST", "/v1/runs/r/complete", R"({"worker": 0, "completions": [7]})", 400);
  auto no_next = json("POST", "/v1/runs/r/complete",
                      R"({"worker": 0, "lease": 1, "loss": 1, "jobs": 2})", 400);
  EXPECT_STREQ(no_next["error"]["field"].GetString(), "jobs");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "jobs": 0})", 400);
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "jobs": 65})", 400);
  auto status = json("GET", "/v1/runs/r");
  EXPECT_EQ(status["progress"]["jobs_done"].GetUint64(), 0u);
  EXPECT_EQ(status["progress"]["jobs_running"].GetUint64(), 3u);
}

TEST_F(ApiTest, AParkedAcquireForSeveralJobsIsAnsweredWithAList) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/workers", R"({"name": "b"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "jobs": 4})");
  auto parked = api_.handle(
      {"POST", "/v1/runs/r/acquire", R"({"worker": 1, "wait_ms": 5000, "jobs": 2})", {}});
  ASSERT_TRUE(std::holds_alternative<ParkedAcquire>(parked));
  json("POST", "/v1/runs/r/complete", R"({"worker": 0, "completions": [{"lease": 1, "loss": 1},
       {"lease": 2, "loss": 1}, {"lease": 3, "loss": 1}, {"lease": 4, "loss": 1}]})");
  auto answer = api_.retry(std::get<ParkedAcquire>(parked), false);
  ASSERT_TRUE(answer.has_value());
  rapidjson::Document d;
  d.Parse(answer->body.c_str());
  ASSERT_STREQ(d["status"].GetString(), "job");
  ASSERT_EQ(d["jobs"].Size(), 2u);  // the dev epoch: its two jobs
  EXPECT_STREQ(d["jobs"][1]["set"].GetString(), "dev");
}

TEST_F(ApiTest, NonFiniteLossesAreAcceptedAsData) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  auto c = json("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 1, "loss": NaN})");
  EXPECT_TRUE(c["counted"].GetBool());
  auto status = json("GET", "/v1/runs/r");
  EXPECT_EQ(status["counters"]["nonfinite_losses"].GetUint64(), 1u);
}

// What the journal keeps of a request (Api::journal_body): its body without the whitespace,
// each number exactly as it was sent (its lexeme, sign and exponent included), from the one
// parse that also fills the handlers' document.
TEST_F(ApiTest, TheJournalKeepsTheBodyCompactWithEachNumberAsSent) {
  json("POST", "/v1/runs/r/workers", "{ \"name\" :\t\"a\" }");
  EXPECT_EQ(api_.journal_body(), R"({"name":"a"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "jobs": 2})");
  EXPECT_EQ(api_.journal_body(), R"({"worker":0,"jobs":2})");
  json("POST", "/v1/runs/r/complete",
       "{\"worker\": 0,\n \"lease\": 1, \"loss\": -5.000e-1, \"samples\": 8,"
       " \"metrics\": {\"acc\": 1E+2, \"x\": -0.0, \"big\": 123456789012345678901234}}");
  EXPECT_EQ(api_.journal_body(),
            R"({"worker":0,"lease":1,"loss":-5.000e-1,"samples":8,)"
            R"("metrics":{"acc":1E+2,"x":-0.0,"big":123456789012345678901234}})");
  json("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 2, "loss": -Infinity})");
  EXPECT_EQ(api_.journal_body(), R"({"worker":0,"lease":2,"loss":-Infinity})");
  // A number too long to keep is refused; a body that is not JSON is refused as such first.
  const std::string digits(65, '1');
  const HttpReply too_long =
      reply("POST", "/v1/runs/r/heartbeat", R"({"worker": 0, "x": )" + digits + "}");
  EXPECT_EQ(too_long.status, 400);
  EXPECT_NE(too_long.body.find("a number of 65 characters; at most 64"), std::string::npos)
      << too_long.body;
  const HttpReply not_json = reply("POST", "/v1/runs/r/heartbeat", "{\"x\": " + digits + ", }");
  EXPECT_EQ(not_json.status, 400);
  EXPECT_NE(not_json.body.find("not valid JSON"), std::string::npos) << not_json.body;
}

TEST_F(ApiTest, AcquireParksWhenAskedToWaitAndIsAnsweredWhenWorkAppears) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/workers", R"({"name": "b"})");
  for (int i = 0; i < 4; ++i) json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  // Nothing open (the train epoch is all handed out): no wait asked, a wait reply at once.
  auto now = json("POST", "/v1/runs/r/acquire", R"({"worker": 1})");
  EXPECT_STREQ(now["status"].GetString(), "wait");
  EXPECT_GT(now["retry_after_ms"].GetInt64(), 0);
  // Asked to wait: parked.
  auto parked =
      api_.handle({"POST", "/v1/runs/r/acquire", R"({"worker": 1, "wait_ms": 5000})", {}});
  ASSERT_TRUE(std::holds_alternative<ParkedAcquire>(parked));
  const ParkedAcquire p = std::get<ParkedAcquire>(parked);
  EXPECT_EQ(p.deadline, 5000);
  EXPECT_FALSE(api_.retry(p, false).has_value());
  for (int lease = 1; lease <= 4; ++lease) {
    json("POST", "/v1/runs/r/complete",
         R"({"worker": 0, "lease": )" + std::to_string(lease) + R"(, "loss": 1})");
  }
  auto answer = api_.retry(p, false);
  ASSERT_TRUE(answer.has_value());
  rapidjson::Document d;
  d.Parse(answer->body.c_str());
  EXPECT_STREQ(d["status"].GetString(), "job");
  EXPECT_STREQ(d["job"]["set"].GetString(), "dev");
}

TEST_F(ApiTest, AParkedAcquireTimesOutWithARetryHint) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  for (int i = 0; i < 4; ++i) json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  auto parked = api_.handle({"POST", "/v1/runs/r/acquire", R"({"worker": 0, "wait_ms": 100})", {}});
  ASSERT_TRUE(std::holds_alternative<ParkedAcquire>(parked));
  auto answer = api_.retry(std::get<ParkedAcquire>(parked), true);
  ASSERT_TRUE(answer.has_value());
  EXPECT_NE(answer->body.find("\"status\":\"wait\""), std::string::npos);
}

TEST_F(ApiTest, FinishedRunsSayWhy) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/cancel", R"({"reason": "sweep pruned"})");
  auto a = json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  EXPECT_STREQ(a["status"].GetString(), "finished");
  EXPECT_STREQ(a["state"].GetString(), "cancelled");
  EXPECT_STREQ(a["reason"].GetString(), "sweep pruned");
}

TEST_F(ApiTest, HeartbeatListsLiveLeasesAndFailRequeues) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  auto hb = json("POST", "/v1/runs/r/heartbeat", R"({"worker": 0})");
  ASSERT_EQ(hb["leases"].Size(), 1u);
  json("POST", "/v1/runs/r/fail", R"({"worker": 0, "lease": 1, "reason": "OOM"})");
  auto a = json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  EXPECT_EQ(a["job"]["index"].GetUint64(), 0u);
  EXPECT_EQ(a["job"]["attempt"].GetUint(), 2u);
}

TEST_F(ApiTest, NextIndexCountsPerSet) {
  auto i = json("POST", "/v1/runs/r/next_index", R"({"set": "train"})");
  EXPECT_EQ(i["position"].GetUint64(), 0u);
  EXPECT_EQ(i["batch"].GetUint64(), 0u);
  EXPECT_EQ(json("POST", "/v1/runs/r/next_index", R"({"set": "train"})")["position"].GetUint64(),
            1u);
  json("POST", "/v1/runs/r/next_index", R"({"set": "dev"})", 409);
  json("POST", "/v1/runs/r/next_index", R"({"set": "test"})", 400);
}

TEST_F(ApiTest, RunsAreListedCreatedAndRefusedByName) {
  auto list = json("GET", "/v1/runs");
  ASSERT_EQ(list["runs"].Size(), 1u);
  EXPECT_STREQ(list["runs"][0]["run"].GetString(), "r");
  json("POST", "/v1/runs", R"({"name": "r", "data": {"train_batches": 4}})", 409);
  auto bad = json("POST", "/v1/runs", R"({"name": "s", "data": {"train_batches": 0}})", 400);
  EXPECT_STREQ(bad["error"]["field"].GetString(), "data.train_batches");
  json("POST", "/v1/runs", R"({"name": "s", "data": {"train_batches": 4}})", 201);
  EXPECT_EQ(json("GET", "/v1/runs")["runs"].Size(), 2u);
}

// Issue 16, items 10 and 11: the first config was accepted and then aborted the server (and
// every run it served); the second was accepted with a job count that wrapped around.
TEST_F(ApiTest, AConfigThatValidatesIsServedAndOneThatCannotBePlannedIsRefusedByField) {
  json("POST", "/v1/runs", R"({"name": "resume", "data": {"train_batches": 3},
      "schedule": {"iters_per_worker": 2, "replicas_to_agg": 1, "start_step": 2, "epochs": 2,
                   "validation_every": 0, "seed_compat": true}})",
       201);
  json("POST", "/v1/runs/resume/workers", R"({"name": "a"})");
  auto job = json("POST", "/v1/runs/resume/acquire", R"({"worker": 0})");
  ASSERT_STREQ(job["status"].GetString(), "job");
  EXPECT_EQ(job["job"]["epoch"].GetInt64(), 0);
  auto done = json("POST", "/v1/runs/resume/complete",
                   R"({"worker": 0, "lease": 1, "loss": 1e300, "samples": 9007199254740992})");
  EXPECT_STREQ(done["outcome"].GetString(), "accepted");
  auto status = json("GET", "/v1/runs/resume");
  EXPECT_STREQ(status["state"].GetString(), "completed");
  ASSERT_TRUE(status["epochs"][0]["loss"].IsNumber());  // 1e300, not null
  EXPECT_DOUBLE_EQ(status["epochs"][0]["loss"].GetDouble(), 1e300);
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");  // the other run is still served

  auto huge = json("POST", "/v1/runs", R"({"name": "huge",
      "data": {"train_batches": 1125899906842624}, "schedule": {"epochs": 1000000}})",
                   400);
  EXPECT_STREQ(huge["error"]["field"].GetString(), "schedule.epochs");
  EXPECT_NE(std::string(huge["error"]["message"].GetString()).find("2^53"), std::string::npos);
}

TEST_F(ApiTest, StatusShowsEpochsWorkersEarlyStopAndEvents) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  for (int lease = 1; lease <= 4; ++lease) {
    json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
    json("POST", "/v1/runs/r/complete",
         R"({"worker": 0, "lease": )" + std::to_string(lease) + R"(, "loss": )" +
             std::to_string(lease) + R"(, "samples": 1, "metrics": {"accuracy": 0.5}})");
  }
  auto s = json("GET", "/v1/runs/r");
  EXPECT_STREQ(s["state"].GetString(), "running");
  ASSERT_EQ(s["epochs"].Size(), 2u);
  EXPECT_DOUBLE_EQ(s["epochs"][0]["loss"].GetDouble(), 2.5);
  EXPECT_DOUBLE_EQ(s["epochs"][0]["metrics"]["accuracy"].GetDouble(), 0.5);
  EXPECT_STREQ(s["current"]["set"].GetString(), "dev");
  EXPECT_EQ(s["workers"][0]["jobs_done"].GetUint64(), 4u);
  EXPECT_STREQ(s["early_stop"]["rule"].GetString(), "none");
  EXPECT_GT(s["events"].Size(), 0u);
  EXPECT_EQ(s["progress"]["jobs_planned"].GetUint64(), 6u);
}

// The history as CSV (a row per epoch, then per recent completion, a column per metric) and
// as JSON lines, with the same figures as the JSON. Each job row names its worker, and each row
// is dated: the wall clock at the request less the time since (ISO 8601 UTC and ms).
TEST_F(ApiTest, HistoryComesAsCsvAndJsonLines) {
  ManualClock wall(1'800'000'000'123);  // 2027-01-15T08:00:00.123Z
  api_.set_wall_clock(&wall);
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/workers", R"({"name": "b"})");
  for (int lease = 1; lease <= 4; ++lease) {
    const std::string worker = std::to_string((lease - 1) % 2);
    json("POST", "/v1/runs/r/acquire", R"({"worker": )" + worker + "}");
    json("POST", "/v1/runs/r/complete",
         R"({"worker": )" + worker + R"(, "lease": )" + std::to_string(lease) + R"(, "loss": )" +
             std::to_string(lease) +
             R"(, "samples": 1, "metrics": {"accuracy": 0.5, "top,1": 0.25}})");
    clock_.advance(1000);
  }
  const HttpReply csv = reply("GET", "/v1/runs/r/history?format=csv");
  EXPECT_EQ(csv.status, 200);
  EXPECT_EQ(csv.content_type, "text/csv; charset=utf-8");
  EXPECT_EQ(csv.body,
            "kind,set,epoch,job,closed,loss,done,jobs,ago_ms,worker,time,time_ms,samples,"
            "duration_s,metric.accuracy,\"metric.top,1\"\r\n"
            "epoch,train,0,,true,2.5,4,4,1000,,2027-01-15T07:59:59.123Z,1799999999123,4,3,0.5,"
            "0.25\r\n"
            "epoch,dev,0,,false,,0,2,,,,,0,,,\r\n"
            "job,train,0,0,,1,,,4000,a,2027-01-15T07:59:56.123Z,1799999996123,,,,\r\n"
            "job,train,0,1,,2,,,3000,b,2027-01-15T07:59:57.123Z,1799999997123,,,,\r\n"
            "job,train,0,2,,3,,,2000,a,2027-01-15T07:59:58.123Z,1799999998123,,,,\r\n"
            "job,train,0,3,,4,,,1000,b,2027-01-15T07:59:59.123Z,1799999999123,,,,\r\n");

  const HttpReply lines = reply("GET", "/v1/runs/r/history?x=1&format=jsonl");
  EXPECT_EQ(lines.content_type, "application/x-ndjson");
  std::vector<rapidjson::Document> rows;
  size_t start = 0;
  for (size_t end; (end = lines.body.find('\n', start)) != std::string::npos; start = end + 1) {
    rows.emplace_back().Parse(lines.body.substr(start, end - start).c_str());
    ASSERT_FALSE(rows.back().HasParseError()) << lines.body;
  }
  EXPECT_EQ(start, lines.body.size()) << "every line ends with a newline";
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_STREQ(rows[0]["kind"].GetString(), "epoch");
  EXPECT_DOUBLE_EQ(rows[0]["loss"].GetDouble(), 2.5);
  EXPECT_DOUBLE_EQ(rows[0]["metrics"]["top,1"].GetDouble(), 0.25);
  EXPECT_TRUE(rows[1]["loss"].IsNull());
  EXPECT_STREQ(rows[5]["kind"].GetString(), "job");
  EXPECT_EQ(rows[5]["job"].GetUint64(), 3u);
  EXPECT_DOUBLE_EQ(rows[5]["loss"].GetDouble(), 4.0);
  EXPECT_STREQ(rows[5]["worker"].GetString(), "b");
  EXPECT_STREQ(rows[5]["time"].GetString(), "2027-01-15T07:59:59.123Z");
  EXPECT_EQ(rows[5]["time_ms"].GetInt64(), 1'799'999'999'123);
  EXPECT_STREQ(rows[2]["worker"].GetString(), "a");
  EXPECT_EQ(rows[2]["time_ms"].GetInt64(), 1'799'999'996'123);
  EXPECT_STREQ(rows[0]["time"].GetString(), "2027-01-15T07:59:59.123Z");
  EXPECT_TRUE(rows[1]["time"].IsNull() && rows[1]["time_ms"].IsNull()) << "dev 0 is open";

  auto plain = json("GET", "/v1/runs/r/history?format=json");
  EXPECT_DOUBLE_EQ(plain["epochs"][0]["loss"].GetDouble(), 2.5);
  EXPECT_EQ(plain["epochs"][0]["closed_ago_ms"].GetInt64(), 1000);
  EXPECT_EQ(plain["epochs"][0]["time_ms"].GetInt64(), 1'799'999'999'123);
  EXPECT_STREQ(plain["jobs"][1]["worker"].GetString(), "b");
  EXPECT_STREQ(plain["jobs"][1]["time"].GetString(), "2027-01-15T07:59:57.123Z");
  auto bad = json("GET", "/v1/runs/r/history?format=xml", "", 400);
  EXPECT_STREQ(bad["error"]["field"].GetString(), "format");
}

// Every string a client sends that is stored and shown back is checked where it enters.
TEST_F(ApiTest, NamesAndReasonsMustBePrintableUtf8AndAreRefusedNamingTheField) {
  auto refused = [&](const std::string& target, const std::string& body, const char* field) {
    auto d = json("POST", target, body, 400);
    EXPECT_STREQ(d["error"]["code"].GetString(), "invalid_argument") << body;
    EXPECT_STREQ(d["error"]["field"].GetString(), field) << body;
  };
  for (const char* name : {"\"w\xff\"", "\"\\u001b[2J\"", "\"a\\nb\"", "\"\"", "\"w\xc2\x9b\"",
                           "\"w\\u202e\"", "\"\\udc00\""}) {
    refused("/v1/runs/r/workers", std::string(R"({"name": )") + name + "}", "name");
  }
  refused("/v1/runs/r/workers", R"({"name": ")" + std::string(129, 'a') + R"("})", "name");
  json("POST", "/v1/runs/r/workers", R"({"name": "gpu-\u00e9quipe-\u65e5"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  refused("/v1/runs/r/complete",
          "{\"worker\": 0, \"lease\": 1, \"loss\": 1, \"metrics\": {\"acc\xff\": 1}}", "metrics");
  refused("/v1/runs/r/complete",
          R"({"worker": 0, "lease": 1, "loss": 1, "metrics": {"\u001b]0;x": 1}})", "metrics");
  refused("/v1/runs/r/fail", R"({"worker": 0, "lease": 1, "reason": "\u001b[31mOOM"})", "reason");
  refused("/v1/runs/r/cancel", "{\"reason\": \"bye\xc3\"}", "reason");
  // A reason is a message: a traceback's lines and tabs are kept.
  json("POST", "/v1/runs/r/fail", R"({"worker": 0, "lease": 1, "reason": "Traceback:\n\tOOM"})");
  // Nothing refused was stored: every reply, and /metrics, is valid UTF-8.
  const HttpReply status = reply("GET", "/v1/runs/r");
  EXPECT_TRUE(utf8::valid(status.body));
  EXPECT_EQ(status.body.find('\x1b'), std::string::npos);
  EXPECT_TRUE(utf8::valid(api_.metrics_text()));
  auto d = json("GET", "/v1/runs/r");
  EXPECT_EQ(d["workers"].Size(), 1u);
}

TEST_F(ApiTest, ARunNameIsRefusedUnlessItIsASafePathSegment) {
  for (const char* name : {".", "..", ".hidden", "caf\\u00e9", "a/b"}) {
    auto d = json("POST", "/v1/runs",
                  std::string(R"({"name": ")") + name + R"(", "data": {"train_batches": 2}})", 400);
    EXPECT_STREQ(d["error"]["field"].GetString(), "name") << name;
  }
  json("POST", "/v1/runs", R"({"name": "admin", "data": {"train_batches": 2}})", 201);
}

TEST_F(ApiTest, DuplicateKeysAreRefusedNamingTheKey) {
  json("POST", "/v1/runs/r/workers", R"({"name": "w"})");
  auto d = json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "worker": 0})", 400);
  EXPECT_STREQ(d["error"]["field"].GetString(), "worker");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  // Two values for one metric must not both be averaged in.
  d = json("POST", "/v1/runs/r/complete",
           R"({"worker": 0, "lease": 1, "loss": 1, "samples": 1,
               "metrics": {"acc": 0.9, "acc": 0.1}})",
           400);
  EXPECT_STREQ(d["error"]["field"].GetString(), "metrics.acc");
  d = json("POST", "/v1/runs/r/complete",
           R"({"worker": 0, "completions": [{"lease": 1, "loss": 1, "loss": 2}]})", 400);
  EXPECT_STREQ(d["error"]["field"].GetString(), "completions[0].loss");
  EXPECT_EQ(json("GET", "/v1/runs/r")["progress"]["jobs_done"].GetUint64(), 0u);
  d = json("POST", "/v1/runs", R"({"name": "x", "name": "y", "data": {"train_batches": 2}})", 400);
  EXPECT_STREQ(d["error"]["field"].GetString(), "name");
  d = json("POST", "/v1/runs", R"({"name": "x", "data": {"train_batches": 2, "train_batches": 9}})",
           400);
  EXPECT_STREQ(d["error"]["field"].GetString(), "data.train_batches");
}

TEST_F(ApiTest, RepliesAreValidUtf8EvenWhenTheRequestEchoedIsNot) {
  const HttpReply r = reply("GET", "/v1/runs/r\xff\xfe");
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(utf8::valid(r.body)) << r.body;
  const HttpReply unknown = reply("POST", "/v1/runs/r/workers", "{\"name\": \"w\", \"x\xff\": 1}");
  EXPECT_EQ(unknown.status, 400);
  EXPECT_TRUE(utf8::valid(unknown.body)) << unknown.body;
}

}  // namespace
}  // namespace traincoord

#include <filesystem>

#include "server/auth.h"

namespace traincoord {
namespace {

TEST(Auth, TokensGateEachEndpointByRole) {
  char pattern[] = "/tmp/traincoord-auth-XXXXXX";
  const std::string dir = mkdtemp(pattern);
  auto auth = Auth::open(dir + "/tokens");
  ASSERT_TRUE(auth) << auth.error().message;
  const std::string worker = *auth->worker_token("r");
  const std::string admin = auth->admin_token();
  auto status = [&](const char* method, const char* target, const std::string& token) {
    auto r = auth->check(method, target, token.empty() ? "" : "Bearer " + token);
    return r ? r->status : 200;
  };
  EXPECT_EQ(status("GET", "/healthz", ""), 200);
  EXPECT_EQ(status("GET", "/", ""), 200);
  EXPECT_EQ(status("POST", "/v1/runs/r/acquire", ""), 401);
  EXPECT_EQ(status("POST", "/v1/runs/r/acquire", "nope"), 403);
  EXPECT_EQ(status("POST", "/v1/runs/r/acquire", worker), 200);
  EXPECT_EQ(status("POST", "/v1/runs/other/acquire", worker), 403);
  EXPECT_EQ(status("POST", "/v1/runs/r/cancel", worker), 403);
  EXPECT_EQ(status("POST", "/v1/runs/r/cancel", admin), 200);
  EXPECT_EQ(status("POST", "/v1/runs/r/config", worker), 403);
  EXPECT_EQ(status("POST", "/v1/runs/r/config", admin), 200);
  EXPECT_EQ(status("POST", "/v1/runs", worker), 403);
  EXPECT_EQ(status("GET", "/metrics", admin), 200);
  EXPECT_EQ(status("POST", "/v1/runs/unknown/acquire", "x"), 403);  // no token made for it
  EXPECT_FALSE(std::filesystem::exists(dir + "/tokens/unknown.token"));
  EXPECT_TRUE(equal_in_constant_time("abc", "abc"));
  EXPECT_FALSE(equal_in_constant_time("abc", "abd"));
  EXPECT_FALSE(equal_in_constant_time("abc", "ab"));
  // The same directory gives the same tokens back.
  auto again = Auth::open(dir + "/tokens");
  EXPECT_EQ(again->admin_token(), admin);
  EXPECT_EQ(*again->worker_token("r"), worker);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace traincoord

namespace traincoord {
namespace {

std::string concrete(std::string_view path) {
  std::string p(path);
  if (auto at = p.find("{run}"); at != std::string::npos) p.replace(at, 5, "r");
  return p;
}

// One table: what routing answers, the metrics label and the docs all follow its rows.
TEST_F(ApiTest, EveryEndpointOfTheTableIsRoutedLabelledAndDocumented) {
  std::ifstream in(std::string(TRAINCOORD_SOURCE_DIR) + "/docs/API.md");
  const std::string docs((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(docs.empty());
  std::set<std::pair<std::string_view, std::string_view>> seen;
  for (const Endpoint& e : Api::endpoints()) {
    SCOPED_TRACE(std::string(e.method) + " " + std::string(e.path));
    EXPECT_TRUE(seen.emplace(e.method, e.path).second) << "listed twice";
    const std::string target = concrete(e.path);
    EXPECT_EQ(Api::endpoint_of(e.method, target), e.name);
    EXPECT_NE(docs.find("`" + std::string(e.method) + " " + std::string(e.path)), std::string::npos)
        << "not in docs/API.md";
    if (!e.handler) continue;  // (served by the coordinator)
    // Routed to its handler: never "no endpoint" (a bad body is a 400, not a 404).
    auto reply = api_.handle({std::string(e.method), target, "{}", {}});
    if (auto* r = std::get_if<HttpReply>(&reply)) {
      EXPECT_NE(r->status, 405) << r->body;
      EXPECT_EQ(r->body.find("no endpoint"), std::string::npos) << r->body;
    }
    // The other method on its path is a 405 naming the one allowed (when no row takes it).
    const std::string other = e.method == "GET" ? "POST" : "GET";
    if (Api::find_endpoint(other, target) == nullptr) {
      auto wrong = api_.handle({other, target, "{}", {}});
      ASSERT_TRUE(std::holds_alternative<HttpReply>(wrong));
      EXPECT_EQ(std::get<HttpReply>(wrong).status, 405);
      EXPECT_NE(std::get<HttpReply>(wrong).allow.find(e.method), std::string::npos);
    }
  }
  EXPECT_EQ(Api::endpoint_of("GET", "/"), "dashboard");
  EXPECT_EQ(Api::endpoint_of("GET", "/app.js"), "dashboard");
  EXPECT_EQ(Api::endpoint_of("POST", "/v1/runs/r/nothing"), "other");
  EXPECT_EQ(std::get<HttpReply>(api_.handle({"POST", "/v1/runs/r/nothing", "{}", {}})).status, 404);
}

}  // namespace
}  // namespace traincoord

namespace traincoord {
namespace {

std::string code_of(const HttpReply& r) {
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  if (d.HasParseError() || !d.HasMember("error")) return "(none: " + r.body + ")";
  return d["error"]["code"].GetString();
}

TEST_F(ApiTest, CutsRestoresAndGroupsOverHttp) {
  auto w = json("POST", "/v1/runs/r/workers", R"({"name": "a", "group": "g1"})");
  EXPECT_STREQ(w["group_state"].GetString(), "current");
  EXPECT_EQ(w["generation"].GetUint64(), 1u);
  EXPECT_TRUE(w["latest_cut"].IsNull());
  auto a = json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "group": "g1", "jobs": 2})");
  ASSERT_STREQ(a["status"].GetString(), "job");
  // Jobs of one batch: a share with a partly trained job is refused (nothing is partly
  // trained), an empty share makes the cut.
  const HttpReply whole = reply("POST", "/v1/runs/r/cuts",
                                R"({"worker": 0, "group": "g1", "seq": 1, "parts": [
                                    {"lease": 1, "batches": 1, "loss": 1, "samples": 1}]})");
  EXPECT_EQ(whole.status, 400) << whole.body;
  EXPECT_NE(whole.body.find("\"field\":\"parts\""), std::string::npos) << whole.body;
  auto cut = json("POST", "/v1/runs/r/cuts", R"({"worker": 0, "group": "g1", "seq": 1})");
  EXPECT_EQ(cut["cut"].GetUint64(), 1u);
  EXPECT_TRUE(cut["complete"].GetBool());
  json("POST", "/v1/runs/r/complete",
       R"({"worker": 0, "group": "g1", "lease": 1, "loss": 2, "samples": 1})");

  auto list = json("GET", "/v1/runs/r/cuts");
  ASSERT_EQ(list["cuts"].Size(), 1u);
  EXPECT_EQ(list["cuts"][0]["jobs_done"].GetUint64(), 0u);
  EXPECT_EQ(json("GET", "/v1/runs/r/cuts/1")["id"].GetUint64(), 1u);
  EXPECT_EQ(code_of(reply("GET", "/v1/runs/r/cuts/7")), "cut_not_found");
  EXPECT_EQ(reply("GET", "/v1/runs/r/cuts/x").status, 400);

  // A new group: registered, then refused until it restores.
  auto w2 = json("POST", "/v1/runs/r/workers", R"({"name": "b", "group": "g2"})");
  EXPECT_STREQ(w2["group_state"].GetString(), "restore_required");
  EXPECT_EQ(w2["latest_cut"].GetUint64(), 1u);
  const HttpReply refused = reply("POST", "/v1/runs/r/acquire", R"({"worker": 1, "group": "g2"})");
  EXPECT_EQ(refused.status, 409);
  EXPECT_EQ(code_of(refused), "restore_required");
  EXPECT_EQ(reply("POST", "/v1/runs/r/restore", R"({"group": "g2"})").status, 400);
  EXPECT_EQ(
      reply("POST", "/v1/runs/r/restore", R"({"group": "g2", "cut": 1, "fresh": true})").status,
      400);
  EXPECT_EQ(code_of(reply("POST", "/v1/runs/r/restore", R"({"group": "g2", "cut": 5})")),
            "cut_not_found");
  auto restored = json("POST", "/v1/runs/r/restore", R"({"group": "g2", "cut": 1})");
  EXPECT_TRUE(restored["restored"].GetBool());
  EXPECT_EQ(restored["generation"].GetUint64(), 2u);
  EXPECT_EQ(restored["withdrawn_jobs"].GetUint64(), 1u);
  EXPECT_EQ(restored["leases_voided"].GetUint64(), 1u);
  EXPECT_FALSE(
      json("POST", "/v1/runs/r/restore", R"({"group": "g2", "cut": 1})")["restored"].GetBool());
  // The old group is refused everywhere, and nothing it sends is counted.
  for (const char* action : {"acquire", "heartbeat", "complete", "release", "leave", "cuts"}) {
    const std::string body =
        std::string(action) == "complete"
            ? R"({"worker": 0, "group": "g1", "lease": 2, "loss": 1, "samples": 1})"
            : R"({"worker": 0, "group": "g1", "seq": 2, "leases": []})";
    const HttpReply stale = reply("POST", std::string("/v1/runs/r/") + action, body);
    EXPECT_EQ(stale.status, 409) << action << ": " << stale.body;
    EXPECT_EQ(code_of(stale), "stale_generation") << action;
  }
  EXPECT_EQ(code_of(reply("POST", "/v1/runs/r/workers", R"({"name": "a", "group": "g1"})")),
            "stale_generation");
  auto status = json("GET", "/v1/runs/r");
  EXPECT_EQ(status["generation"].GetUint64(), 2u);
  EXPECT_STREQ(status["group"].GetString(), "g2");
  EXPECT_EQ(status["counters"]["restores"].GetUint64(), 1u);
  EXPECT_EQ(status["counters"]["jobs_withdrawn"].GetUint64(), 1u);
  EXPECT_EQ(status["cuts"]["latest"]["id"].GetUint64(), 1u);
  EXPECT_EQ(status["progress"]["jobs_done"].GetUint64(), 0u);
  // The new group trains the withdrawn job again.
  auto again = json("POST", "/v1/runs/r/acquire", R"({"worker": 1, "group": "g2"})");
  EXPECT_EQ(again["job"]["index"].GetUint64(), 0u);
  const std::string metrics = api_.metrics_text();
  EXPECT_NE(metrics.find("traincoord_run_restores_total{run=\"r\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("traincoord_run_generation{run=\"r\"} 2"), std::string::npos);
}

// /metrics counts the samples trained per set, so that rate() gives a run's samples/s.
TEST_F(ApiTest, SeriesListEveryCompletionsLossAndMetricsAndAPollOnlyTheNewerOnes) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  for (int lease = 1; lease <= 4; ++lease) {
    json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
    json("POST", "/v1/runs/r/complete",
         R"({"worker": 0, "lease": )" + std::to_string(lease) + R"(, "loss": )" +
             std::to_string(lease) + R"(, "samples": 1, "metrics": {"lr": 0.5, "top,1": 0.25}})");
  }
  const rapidjson::Document all = json("GET", "/v1/runs/r/series");
  EXPECT_EQ(all["completions"].GetUint64(), 4u);
  ASSERT_EQ(all["series"].Size(), 3u);  // train: loss, lr, "top,1"
  const auto& loss = all["series"][0];
  EXPECT_STREQ(loss["set"].GetString(), "train");
  EXPECT_STREQ(loss["name"].GetString(), "loss");
  EXPECT_EQ(loss["stride"].GetUint64(), 1u);
  EXPECT_EQ(loss["count"].GetUint64(), 4u);
  ASSERT_EQ(loss["points"].Size(), 4u);
  EXPECT_EQ(loss["points"][3][0].GetUint64(), 4u);  // n
  EXPECT_EQ(loss["points"][3][1].GetInt64(), 0);    // epoch
  EXPECT_DOUBLE_EQ(loss["points"][3][2].GetDouble(), 4.0);
  EXPECT_TRUE(loss["latest"].IsNull());  // (every value kept: stride 1)
  const rapidjson::Document newer = json("GET", "/v1/runs/r/series?after=3");
  EXPECT_EQ(newer["after"].GetUint64(), 3u);
  for (const auto& series : newer["series"].GetArray()) {
    ASSERT_EQ(series["points"].Size(), 1u);
    EXPECT_EQ(series["points"][0][0].GetUint64(), 4u);
  }
  const HttpReply csv = reply("GET", "/v1/runs/r/series?format=csv&after=2");
  EXPECT_EQ(csv.content_type, "text/csv; charset=utf-8");
  EXPECT_EQ(csv.body,
            "set,name,n,epoch,value\n"
            "train,loss,3,0,3\ntrain,loss,4,0,4\n"
            "train,lr,3,0,0.5\ntrain,lr,4,0,0.5\n"
            "train,\"top,1\",3,0,0.25\ntrain,\"top,1\",4,0,0.25\n");
  EXPECT_STREQ(json("GET", "/v1/runs/r/series?after=x", "", 400)["error"]["field"].GetString(),
               "after");
  EXPECT_STREQ(json("GET", "/v1/runs/r/series?format=xml", "", 400)["error"]["field"].GetString(),
               "format");
}

TEST_F(ApiTest, MetricsCountTheSamplesTrainedPerSet) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  json("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 1, "loss": 0.5, "samples": 7})");
  const std::string metrics = api_.metrics_text();
  EXPECT_NE(metrics.find("traincoord_run_samples_total{run=\"r\",set=\"train\"} 7\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("traincoord_run_samples_total{run=\"r\",set=\"dev\"} 0\n"),
            std::string::npos);
  // Per worker too (rate() is its samples/s), and in the status.
  EXPECT_NE(metrics.find("traincoord_worker_samples_total{run=\"r\",worker=\"a\"} 7\n"),
            std::string::npos)
      << metrics;
  EXPECT_EQ(json("GET", "/v1/runs/r")["workers"][0]["samples_done"].GetUint64(), 7u);
}

// The old group's long polls, parked when a new group restores: answered stale_generation,
// however they named their group, and no lease of the new generation goes to them.
TEST_F(ApiTest, ARestoreAnswersTheOldGroupsParkedAcquiresStaleAndLeasesThemNothing) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a", "group": "g1"})");
  for (int i = 0; i < 4; ++i) json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "group": "g1"})");
  json("POST", "/v1/runs/r/cuts", R"({"worker": 0, "group": "g1", "seq": 1})");
  // Nothing open: an acquire, and a complete + next (naming no group), wait.
  auto acquire = api_.handle(
      {"POST", "/v1/runs/r/acquire", R"({"worker": 0, "group": "g1", "wait_ms": 5000})", {}});
  ASSERT_TRUE(std::holds_alternative<ParkedAcquire>(acquire));
  auto complete = api_.handle({"POST",
                               "/v1/runs/r/complete",
                               R"({"worker": 0, "lease": 1, "loss": 1, "next": true,
                                   "wait_ms": 5000})",
                               {}});
  ASSERT_TRUE(std::holds_alternative<ParkedAcquire>(complete));
  const std::vector<ParkedAcquire> parked{std::get<ParkedAcquire>(acquire),
                                          std::get<ParkedAcquire>(complete)};
  for (const ParkedAcquire& p : parked) EXPECT_FALSE(api_.refusal(p));

  json("POST", "/v1/runs/r/workers", R"({"name": "b", "group": "g2"})");
  json("POST", "/v1/runs/r/restore", R"({"group": "g2", "cut": 1})");
  for (const ParkedAcquire& p : parked) {
    for (bool timed_out : {false, true}) {
      auto answer = api_.retry(p, timed_out);
      ASSERT_TRUE(answer.has_value());
      EXPECT_EQ(answer->status, 409) << answer->body;
      EXPECT_EQ(code_of(*answer), "stale_generation") << answer->body;
      EXPECT_EQ(api_.effect(), Effect::kNone);
    }
    EXPECT_TRUE(api_.refusal(p));
  }
  auto status = json("GET", "/v1/runs/r");
  EXPECT_EQ(status["counters"]["handouts"].GetUint64(), 4u) << "a lease went to the old group";
  // Every job is the new group's to take.
  for (int i = 0; i < 4; ++i) {
    auto a = json("POST", "/v1/runs/r/acquire", R"({"worker": 1, "group": "g2"})");
    EXPECT_STREQ(a["status"].GetString(), "job");
  }
}

TEST_F(ApiTest, AWorkerIsFencedByTheGroupItRegisteredWithNotByWhatItsRequestsName) {
  json("POST", "/v1/runs/r/workers", R"({"name": "a", "group": "g1"})");
  json("POST", "/v1/runs/r/workers", R"({"name": "solo"})");  // ungrouped
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0, "group": "g1"})");
  json("POST", "/v1/runs/r/cuts", R"({"worker": 0, "group": "g1", "seq": 1})");
  json("POST", "/v1/runs/r/workers", R"({"name": "b", "group": "g2"})");
  json("POST", "/v1/runs/r/restore", R"({"group": "g2", "cut": 1})");
  // Worker 0 (of g1) naming no group, or naming g2: refused, nothing counted, no cut share.
  for (const char* group : {"", R"(, "group": "g2")"}) {
    for (const auto& [action, fields] : std::vector<std::pair<std::string, std::string>>{
             {"acquire", ""},
             {"heartbeat", ""},
             {"complete", R"(, "lease": 1, "loss": 1, "samples": 1)"},
             {"fail", R"(, "lease": 1)"},
             {"release", R"(, "leases": [1])"},
             {"cuts", R"(, "seq": 1)"},
             {"leave", ""}}) {
      if (action == "cuts" && std::string(group).empty()) continue;  // (a cut names its group)
      const HttpReply stale = reply("POST", "/v1/runs/r/" + action,
                                    R"({"worker": 0)" + std::string(group) + fields + "}");
      EXPECT_EQ(stale.status, 409) << action << group << ": " << stale.body;
      EXPECT_EQ(code_of(stale), "stale_generation") << action << group;
    }
  }
  auto status = json("GET", "/v1/runs/r");
  EXPECT_EQ(status["progress"]["jobs_done"].GetUint64(), 0u);
  EXPECT_EQ(status["counters"]["handouts"].GetUint64(), 1u);
  EXPECT_EQ(json("GET", "/v1/runs/r/cuts")["cuts"].Size(), 1u);
  // Worker 2 (of g2) naming another group than its own: a mismatch (stale, for a past group).
  const HttpReply mismatch = reply("POST", "/v1/runs/r/acquire", R"({"worker": 2, "group": "g9"})");
  EXPECT_EQ(mismatch.status, 409) << mismatch.body;
  EXPECT_EQ(code_of(mismatch), "group_mismatch");
  EXPECT_EQ(code_of(reply("POST", "/v1/runs/r/acquire", R"({"worker": 2, "group": "g1"})")),
            "stale_generation");
  EXPECT_STREQ(json("POST", "/v1/runs/r/acquire", R"({"worker": 2})")["status"].GetString(), "job");
  // The ungrouped worker is judged by the group its request names.
  EXPECT_EQ(code_of(reply("POST", "/v1/runs/r/heartbeat", R"({"worker": 1, "group": "g1"})")),
            "stale_generation");
  json("POST", "/v1/runs/r/heartbeat", R"({"worker": 1})");
  json("POST", "/v1/runs/r/heartbeat", R"({"worker": 1, "group": "g2"})");
  // Registering again naming no group does not shed the group it registered with: refused.
  const HttpReply shed = reply("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  EXPECT_EQ(code_of(shed), "stale_generation") << shed.body;
  EXPECT_EQ(code_of(reply("POST", "/v1/runs/r/acquire", R"({"worker": 0})")), "stale_generation");
  // Registered again under the new group, the name is the new group's; naming none then keeps
  // it.
  json("POST", "/v1/runs/r/workers", R"({"name": "a", "group": "g2"})");
  json("POST", "/v1/runs/r/heartbeat", R"({"worker": 0})");
  json("POST", "/v1/runs/r/workers", R"({"name": "a"})");
  EXPECT_EQ(code_of(reply("POST", "/v1/runs/r/heartbeat", R"({"worker": 0, "group": "g9"})")),
            "group_mismatch");
}

// POST /v1/runs/{run}/config (docs/API.md "Changing a started run's config"): the rules of
// --apply-config-changes, live. The run of the fixture trains 1 epoch of 4 batches.
constexpr const char* kChangedToml = R"(name = "r"
[data]
train_batches = 4
dev_batches = 2
order = "sequential"
[schedule]
epochs = EPOCHS
[leases]
timeout = 1.0
)";

std::string toml_body(const std::string& toml) {
  std::string escaped;
  for (char c : toml)
    escaped += c == '\n' ? std::string("\\n") : c == '"' ? std::string("\\\"") : std::string(1, c);
  return R"({"toml": ")" + escaped + R"("})";
}

std::string with_epochs(int epochs) {
  std::string toml = kChangedToml;
  toml.replace(toml.find("EPOCHS"), 6, std::to_string(epochs));
  return toml;
}

TEST_F(ApiTest, AStartedRunTakesMoreEpochsThroughTheAdminCall) {
  json("POST", "/v1/runs/r/workers", R"({"name": "w"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  auto same = json("POST", "/v1/runs/r/config", toml_body(with_epochs(1)));
  EXPECT_EQ(same["changed"].Size(), 0u);
  EXPECT_FALSE(same["applied"].GetBool());
  auto raised = json("POST", "/v1/runs/r/config", toml_body(with_epochs(3)));
  ASSERT_EQ(raised["changed"].Size(), 1u);
  EXPECT_STREQ(raised["changed"][0].GetString(), "schedule.epochs");
  EXPECT_TRUE(raised["applied"].GetBool());
  EXPECT_EQ(raised["summary"]["target_epoch"].GetInt64(), 3);
  auto status = json("GET", "/v1/runs/r");
  EXPECT_EQ(status["plan"]["target_epoch"].GetInt64(), 3);
  bool evented = false;
  for (const auto& e : status["events"].GetArray()) {
    evented = evented ||
              (std::string(e["kind"].GetString()) == "config_changed" &&
               std::string(e["text"].GetString()) == "changed through the API: schedule.epochs");
  }
  EXPECT_TRUE(evented);
  // The lease held before the change is still the worker's: completed as any other.
  auto done = json("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 1, "loss": 0.5})");
  EXPECT_STREQ(done["outcome"].GetString(), "accepted");
}

TEST_F(ApiTest, AConfigChangeARunCannotTakeIsRefusedAndChangesNothing) {
  const std::string before = RunCodec::save(**engine_.find("r"));
  auto code = [&](const std::string& body, int status) {
    const HttpReply r = reply("POST", "/v1/runs/r/config", body);
    EXPECT_EQ(r.status, status) << body << ": " << r.body;
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    return d.IsObject() && d.HasMember("error")
               ? std::string(d["error"]["code"].GetString()) + " " +
                     (d["error"].HasMember("field") ? d["error"]["field"].GetString() : "") + " " +
                     d["error"]["message"].GetString()
               : std::string();
  };
  std::string batches = with_epochs(1);
  batches.replace(batches.find("train_batches = 4"), 17, "train_batches = 5");
  EXPECT_NE(code(toml_body(batches), 409)
                .find("config_change_refused  run r: a started run "
                      "cannot change data.train_batches"),
            std::string::npos);
  std::string other = with_epochs(2);
  other.replace(other.find("\"r\""), 3, "\"q\"");
  EXPECT_NE(code(toml_body(other), 400).find("invalid_argument name"), std::string::npos);
  EXPECT_NE(code("{}", 400).find("invalid_argument toml"), std::string::npos);
  EXPECT_NE(code(R"({"toml": "x", "config": {}})", 400).find("invalid_argument config"),
            std::string::npos);
  EXPECT_NE(code(toml_body("name = "), 400).find("invalid_argument"), std::string::npos);
  // The coordinator reads no file a config sent to it names.
  std::string with_file = with_epochs(2);
  with_file.replace(with_file.find("[schedule]"), 10,
                    "train_lengths = \"/etc/hostname\"\n[schedule]");
  EXPECT_NE(code(toml_body(with_file), 400).find("a lengths file is read only from a config file"),
            std::string::npos);
  EXPECT_EQ(RunCodec::save(**engine_.find("r")), before);
  EXPECT_EQ(reply("POST", "/v1/runs/nope/config", toml_body(with_epochs(2))).status, 404);
}

// A "config" object nested deeply (the body parse is iterative and allows any depth)
// is refused, not re-serialized by a recursive Accept that overflows the stack (it was:
// `serve` exited 139 on {"config":{"a":[[[...400000...]]]}}; found by review).
TEST_F(ApiTest, ADeeplyNestedConfigObjectIsRefusedNotACrash) {
  const size_t n = 400000;
  const std::string body = R"({"config":{"a":)" + std::string(n, '[') + std::string(n, ']') + "}}";
  EXPECT_EQ(reply("POST", "/v1/runs/r/config", body).status, 400);
}

// A dry run, and a config equal to the run's, change nothing, so the journal keeps
// nothing of them (DURABILITY.md: "nothing of a request that changed nothing"), not their
// bodies (up to 1 MiB each) until the next snapshot.
TEST_F(ApiTest, ADryRunOrANoOpConfigChangeIsNotJournalled) {
  std::string dry = toml_body(with_epochs(3));
  dry.insert(dry.size() - 1, R"(, "dry_run": true)");
  EXPECT_EQ(reply("POST", "/v1/runs/r/config", dry).status, 200);
  EXPECT_EQ(api_.effect(), Effect::kNone);
  EXPECT_EQ(reply("POST", "/v1/runs/r/config", toml_body(with_epochs(1))).status, 200);
  EXPECT_EQ(api_.effect(), Effect::kNone);
}

// A live change keeps what the run showed (its events, its recent jobs), which a RunCodec
// round trip alone drops (they are not saved): it must not look like a restart.
TEST_F(ApiTest, ALiveChangeKeepsTheRunsEventsAndRecentJobs) {
  json("POST", "/v1/runs/r/workers", R"({"name": "w"})");
  json("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
  json("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 1, "loss": 0.5})");
  const size_t events = json("GET", "/v1/runs/r")["events"].Size();
  ASSERT_GE(events, 2u);
  ASSERT_EQ(json("GET", "/v1/runs/r/history")["jobs"].Size(), 1u);
  json("POST", "/v1/runs/r/config", toml_body(with_epochs(3)));
  EXPECT_EQ(json("GET", "/v1/runs/r")["events"].Size(), events + 1);
  EXPECT_EQ(json("GET", "/v1/runs/r/history")["jobs"].Size(), 1u);
}

}  // namespace
}  // namespace traincoord
