// What the journal keeps of a request is its canonical record, bounded by what the request may
// change (docs/SECURITY.md, "Limits"), and the request rules that keep that record honest: a
// body is JSON text alone (no NUL byte after it), and a name that identifies something is one
// sequence of bytes per look (NFC, no invisible characters).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/run_codec.h"
#include "journal/memory_journal.h"
#include "server/coordinator.h"
#include "server/restore.h"

namespace traincoord {
namespace {

constexpr const char* kConfig = R"({"name": "r",
    "data": {"train_batches": 4, "dev_batches": 2, "order": "sequential"},
    "schedule": {"epochs": 1}, "leases": {"timeout": 10.0}, "early_stop": {"rule": "none"}})";

// A coordinator on an in-memory journal and a manual clock, as the server runs it.
class RequestRecordTest : public ::testing::Test {
 protected:
  RequestRecordTest() : clock_(&wall_), engine_(clock_) {
    clock_.go_live(0);
    coordinator_ = std::make_unique<Coordinator>(engine_, clock_, &journal_, CoordinatorOptions{});
    EXPECT_EQ(call("POST", "/v1/runs", kConfig).status, 201);
  }

  // One request in its own wave, written before its reply is read (as the server does).
  HttpReply call(const std::string& method, const std::string& target, const std::string& body) {
    std::vector<Call> calls;
    HttpReply got;
    calls.push_back(Call{HttpRequest{method, target, body, {}},
                         ReplyTo{[&got](HttpReply r) { got = std::move(r); }, {}}});
    Wave wave = coordinator_->step(calls);
    if (wave.writes) {
      EXPECT_TRUE(journal_.write(*wave.writes).has_value());
    }
    for (Outgoing& out : wave.replies) out.to.respond(std::move(out.reply));
    return got;
  }

  std::vector<Record> records() {
    std::vector<Record> all;
    EXPECT_TRUE(journal_
                    .for_each_record([&](const Record& r) -> Result<void> {
                      all.push_back(r);
                      return {};
                    })
                    .has_value());
    return all;
  }

  ManualClock wall_;
  ServerClock clock_;
  Engine engine_;
  MemoryJournal journal_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(RequestRecordTest, PaddingIsNotJournalled) {
  const std::string pad(1 << 20, ' ');  // 1 MiB of JSON whitespace, under the body limit
  ASSERT_EQ(call("POST", "/v1/runs/r/workers", "{" + pad + R"("name": "w0"})").status, 200);
  ASSERT_EQ(call("POST", "/v1/runs/r/acquire", R"({"worker": 0})" + pad).status, 200);
  for (int i = 0; i < 20; ++i) {
    wall_.advance(1);
    ASSERT_EQ(call("POST", "/v1/runs/r/heartbeat", "{\"worker\":" + pad + "0}").status, 200);
  }
  // A number padded with digits that do not change its value is refused: the journal keeps
  // numbers as they were written, so their length is bounded.
  const std::string padded = "0.5" + std::string(100'000, '0');
  const HttpReply refused =
      call("POST", "/v1/runs/r/complete",
           R"({"worker": 0, "lease": 1, "samples": 8, "loss": )" + padded + "}");
  EXPECT_EQ(refused.status, 400) << refused.body.substr(0, 200);
  EXPECT_NE(refused.body.find("at most 64"), std::string::npos) << refused.body.substr(0, 200);
  ASSERT_EQ(
      call("POST", "/v1/runs/r/complete", R"({"worker": 0, "lease": 1, "samples": 8, "loss": 0.5})")
          .status,
      200);
  const std::vector<Record> kept = records();
  ASSERT_GE(kept.size(), 3u);  // registration, acquire, completion (heartbeats may be kept too)
  size_t bytes = 0;
  for (const Record& r : kept) {
    EXPECT_LE(r.body.size(), 200u) << r.target << ": " << r.body.substr(0, 80);
    EXPECT_EQ(r.body.find(' '), std::string::npos) << r.body;
    bytes += r.body.size();
  }
  EXPECT_LT(bytes, 4096u);
}

TEST_F(RequestRecordTest, CanonicalRecordsReplayToTheSameRun) {
  ASSERT_EQ(call("POST", "/v1/runs/r/workers", "{\n  \"name\" : \"w0\" \n }").status, 200);
  ASSERT_EQ(call("POST", "/v1/runs/r/acquire", R"({ "worker" : 0 , "jobs" : 2 })").status, 200);
  // Numbers that are not written as the shortest form, and a non-finite loss (Python writes
  // NaN for a diverged loss): the record keeps the same values.
  ASSERT_EQ(call("POST", "/v1/runs/r/complete",
                 R"({"worker": 0, "completions": [
                     {"lease": 1, "loss": 2.50000, "samples": 8, "metrics": {"acc": 1e-1}},
                     {"lease": 2, "loss": NaN, "samples": 8, "metrics": {"é": -0.0}}]})")
                .status,
            200);
  // Losses of 17 significant digits, as Python's repr writes them: RapidJSON's fast parser
  // may read such a text 1 ULP off, and the double written back would then read another ULP
  // off on replay; the record keeps the text, which replays to the same double.
  int completed = 0;
  for (const char* loss : {"1.3387664401253274", "0.30000000000000004", "2.7182818284590451",
                           "1.0000000000000002", "9.8765432109876543e-05"}) {
    const auto handed = call("POST", "/v1/runs/r/acquire", R"({"worker": 0})");
    ASSERT_EQ(handed.status, 200) << handed.body;
    const auto at = handed.body.find("\"lease\":");
    if (at == std::string::npos) break;  // (the run's jobs are all handed out)
    completed += 1;
    const std::string lease =
        handed.body.substr(at + 8, handed.body.find_first_of(",}", at) - at - 8);
    ASSERT_EQ(
        call("POST", "/v1/runs/r/complete",
             R"({"worker": 0, "lease": )" + lease + R"(, "samples": 8, "loss": )" + loss + "}")
            .status,
        200)
        << loss;
  }
  ASSERT_GE(completed, 2);
  const std::string before = RunCodec::save_journalled(**engine_.find("r"));

  ServerClock clock(&wall_);
  Engine engine(clock);
  Api replay(engine, clock, ApiLimits::none());
  auto report = restore_engine(journal_, engine, replay, clock);
  ASSERT_TRUE(report.has_value()) << report.error().message;
  EXPECT_EQ(RunCodec::save_journalled(**engine.find("r")), before);
}

TEST_F(RequestRecordTest, ABodyWithANulByteAfterItIsRefused) {
  const std::string body = std::string(R"({"name": "w0"})") + '\0' + "trailing";
  const HttpReply r = call("POST", "/v1/runs/r/workers", body);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("NUL"), std::string::npos) << r.body;
  EXPECT_EQ(call("POST", "/v1/runs/r/workers", std::string(R"({"name": "w0"})") + '\0').status,
            400);
  EXPECT_TRUE(records().empty());
}

// RapidJSON's Parse(data, size) skips a byte order mark, and a lone 0xEF, 0xBB or 0xBF byte
// too; such a body was accepted as JSON, then failed the canonical writer's assertion (found by
// fuzz_api). Any byte before the JSON text is refused, as any other invalid JSON.
TEST_F(RequestRecordTest, ABodyWithBytesBeforeItsJsonIsRefused) {
  for (const std::string prefix : {"\xEF", "\xBB", "\xBF", "\xEF\xBB\xBF", "\xEF\x7B"}) {
    const HttpReply r = call("POST", "/v1/runs/r/workers", prefix + R"({"name": "w0"} )");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("not valid JSON"), std::string::npos) << r.body;
  }
  EXPECT_TRUE(records().empty());
  EXPECT_EQ(call("POST", "/v1/runs/r/workers", R"({"name": "w0"})").status, 200);
}

TEST_F(RequestRecordTest, NamesThatLookAlikeAreOneNameOrRefused) {
  ASSERT_EQ(call("POST", "/v1/runs/r/workers", R"({"name": "w0"})").status, 200);
  // w0 followed by U+200B ZERO WIDTH SPACE: refused, naming the character.
  HttpReply r = call("POST", "/v1/runs/r/workers", "{\"name\": \"w0\xE2\x80\x8B\"}");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("U+200B"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\"field\":\"name\""), std::string::npos) << r.body;
  // The same as \u escapes, and the soft hyphen and a variation selector.
  for (const char* name : {R"(w\u200b0)", R"(w\u00ad0)", R"(w0\ufe0f)", R"(\u2060w0)"}) {
    EXPECT_EQ(
        call("POST", "/v1/runs/r/workers", std::string("{\"name\": \"") + name + "\"}").status, 400)
        << name;
  }
  // "é" decomposed (e + U+0301 COMBINING ACUTE ACCENT) is refused with its composed form named;
  // composed, it is accepted.
  r = call("POST", "/v1/runs/r/workers", "{\"name\": \"re\xCC\x81seau\"}");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("NFC"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("r\xC3\xA9seau"), std::string::npos) << r.body;
  EXPECT_EQ(call("POST", "/v1/runs/r/workers", "{\"name\": \"r\xC3\xA9seau\"}").status, 200);
  // Metric names too: they key a series.
  ASSERT_EQ(call("POST", "/v1/runs/r/acquire", R"({"worker": 0})").status, 200);
  r = call("POST", "/v1/runs/r/complete",
           "{\"worker\": 0, \"lease\": 1, \"loss\": 1, \"metrics\": {\"acc\xE2\x80\x8B\": 1}}");
  EXPECT_EQ(r.status, 400) << r.body;
  // Messages (a failure's reason) may hold them: a traceback is text, not a name.
  EXPECT_EQ(call("POST", "/v1/runs/r/fail",
                 "{\"worker\": 0, \"lease\": 1, \"reason\": \"emoji \xF0\x9F\x91\xA9\xE2\x80\x8D"
                 "\xF0\x9F\x92\xBB\"}")
                .status,
            200);
}

}  // namespace
}  // namespace traincoord
