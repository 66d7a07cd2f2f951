// Watching high availability (docs/HA.md "Watching it"): GET /v1/coordinator, /metrics and
// `traincoord status` on a leader and on a standby say who leads (url, term), this one's role,
// where the journal's head is as each saw it (the standby follows the leader's writes), and the
// takeovers; a standby still answers run requests 421. Real etcd (one member) and two real
// coordinators on loopback, each stopped by its PID, also when the test fails.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <cstdio>
#include <thread>

#include "e2e/server_process.h"
#include "etcd/etcd_cluster.h"
#include "etcd/ha_http.h"

namespace traincoord {
namespace {

using testing::EtcdCluster;
using testing::http;
using testing::Reply;
using testing::ServerProcess;
using testing::TempDir;

constexpr const char* kRun = R"(name = "watch"
[data]
train_batches = 20
dev_batches = 2
[schedule]
epochs = 2
[early_stop]
rule = "none"
)";

rapidjson::Document coordinator_of(const std::string& url) {
  rapidjson::Document d;
  const Reply r = http(url, "GET", "/v1/coordinator");
  d.Parse(r.status == 200 ? r.body.c_str() : "null");
  return d;
}

std::string metrics_of(const std::string& url) { return http(url, "GET", "/metrics").body; }

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// `traincoord status RUN --url URLS`: what it printed.
std::string status_output(const std::string& urls) {
  const std::string command = std::string(TRAINCOORD_BIN) + " status watch --url " + urls + " 2>&1";
  FILE* p = popen(command.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// Polls (at most 20 s) until `done` holds.
template <typename F>
bool eventually(F done) {
  for (int i = 0; i < 200; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(HighAvailabilityWatch, LeaderAndStandbySayWhoLeadsTheJournalsLagAndTheTakeovers) {
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.started());
  TempDir dir;
  const std::string config = dir.write("watch.toml", kRun);
  const std::string journal = "etcd://" + cluster.endpoints() + "/watch";
  auto a = ServerProcess::start({"--config", config, "--journal", journal});
  ASSERT_TRUE(a);
  ASSERT_TRUE(eventually([&] { return http(a->url(), "GET", "/v1/runs/watch").status == 200; }));
  auto b = ServerProcess::start({"--config", config, "--journal", journal});
  ASSERT_TRUE(b);

  // The leader: its role, itself as the leader, the head it wrote, one takeover (its first).
  rapidjson::Document ca = coordinator_of(a->url());
  ASSERT_TRUE(ca.IsObject()) << http(a->url(), "GET", "/v1/coordinator").body;
  EXPECT_STREQ(ca["mode"].GetString(), "ha");
  EXPECT_STREQ(ca["role"].GetString(), "leader");
  EXPECT_EQ(std::string(ca["url"].GetString()), a->url());
  EXPECT_EQ(std::string(ca["leader"]["url"].GetString()), a->url());
  const int64_t term = ca["leader"]["term"].GetInt64();
  EXPECT_GT(term, 0);
  EXPECT_EQ(ca["takeovers"].GetInt64(), 1);
  EXPECT_TRUE(ca["last_takeover_ms"].IsInt64());

  // The leader writes (a worker registers): the standby sees the head move to the leader's.
  ASSERT_EQ(http(a->url(), "POST", "/v1/runs/watch/workers", R"({"name": "w"})").status, 200);
  int64_t head = 0;
  ASSERT_TRUE(eventually([&] {
    rapidjson::Document d = coordinator_of(a->url());
    head = d.IsObject() && d["journal"].IsObject() ? d["journal"]["head_seq"].GetInt64() : 0;
    return head > 0;
  }));
  rapidjson::Document cb;
  ASSERT_TRUE(eventually([&] {
    cb = coordinator_of(b->url());
    return cb.IsObject() && cb["leader"].IsObject() && cb["journal"].IsObject() &&
           cb["journal"]["head_seq"].GetInt64() == head;
  })) << http(b->url(), "GET", "/v1/coordinator").body
      << " vs the leader's head " << head;
  EXPECT_STREQ(cb["role"].GetString(), "standby");
  EXPECT_EQ(std::string(cb["url"].GetString()), b->url());
  EXPECT_EQ(std::string(cb["leader"]["url"].GetString()), a->url());
  EXPECT_EQ(cb["leader"]["term"].GetInt64(), term);
  EXPECT_EQ(cb["journal"]["head_revision"].GetInt64(),
            coordinator_of(a->url())["journal"]["head_revision"].GetInt64());
  EXPECT_GE(cb["journal"]["replay_records"].GetInt64(), 1);
  EXPECT_GE(cb["journal"]["seen_ms_ago"].GetInt64(), 0);
  EXPECT_EQ(cb["takeovers"].GetInt64(), 0);
  EXPECT_TRUE(cb["last_takeover_ms"].IsNull());
  // ... while run requests still get 421 there.
  EXPECT_EQ(http(b->url(), "GET", "/v1/runs/watch").status, 421);

  const std::string ma = metrics_of(a->url()), mb = metrics_of(b->url());
  EXPECT_TRUE(has(ma, "\ntraincoord_ha_leading 1\n")) << ma;
  EXPECT_TRUE(has(mb, "\ntraincoord_ha_leading 0\n")) << mb;
  EXPECT_TRUE(has(mb, "traincoord_ha_leader_term " + std::to_string(term) + "\n")) << mb;
  EXPECT_TRUE(has(
      mb, "traincoord_ha_leader_info{leader=\"" + a->url() + "\",self=\"" + b->url() + "\"} 1\n"))
      << mb;
  EXPECT_TRUE(has(mb, "traincoord_ha_journal_head_seq " + std::to_string(head) + "\n")) << mb;
  EXPECT_TRUE(has(mb, "traincoord_ha_journal_seen_age_seconds ")) << mb;
  EXPECT_TRUE(has(ma, "traincoord_ha_takeovers_total 1\n")) << ma;
  EXPECT_TRUE(has(mb, "traincoord_ha_takeovers_total 0\n")) << mb;

  // `status` given both urls: a line per coordinator, then the run (from the leader).
  const std::string shown = status_output(b->url() + "," + a->url());
  EXPECT_TRUE(has(shown, "coordinators:")) << shown;
  EXPECT_TRUE(has(shown, a->url() + "  leader  term " + std::to_string(term))) << shown;
  EXPECT_TRUE(has(shown, b->url() + "  standby following " + a->url())) << shown;
  EXPECT_TRUE(has(shown, "journal head " + std::to_string(head))) << shown;
  EXPECT_TRUE(has(shown, "run watch")) << shown;

  // The leader killed: the standby takes over, counts it, and says when.
  a->kill(SIGKILL);
  ASSERT_TRUE(eventually([&] { return http(b->url(), "GET", "/v1/runs/watch").status == 200; }));
  cb = coordinator_of(b->url());
  ASSERT_TRUE(cb.IsObject());
  EXPECT_STREQ(cb["role"].GetString(), "leader");
  EXPECT_EQ(std::string(cb["leader"]["url"].GetString()), b->url());
  EXPECT_GT(cb["leader"]["term"].GetInt64(), term);
  EXPECT_EQ(cb["takeovers"].GetInt64(), 1);
  EXPECT_TRUE(cb["last_takeover_ms"].IsInt64());
  EXPECT_GE(cb["last_takeover_s"].GetDouble(), 0.0);
  EXPECT_GE(cb["journal"]["head_seq"].GetInt64(), head);
  const std::string after = metrics_of(b->url());
  EXPECT_TRUE(has(after, "\ntraincoord_ha_leading 1\n")) << after;
  EXPECT_TRUE(has(after, "traincoord_ha_takeovers_total 1\n")) << after;
  EXPECT_TRUE(has(after, "traincoord_ha_last_takeover_timestamp_seconds ")) << after;
  const std::string shown_after = status_output(b->url() + "," + a->url());
  EXPECT_TRUE(has(shown_after, b->url() + "  leader  term")) << shown_after;
  EXPECT_TRUE(has(shown_after, "takeovers 1 (last ")) << shown_after;
}

// One coordinator alone (no etcd): GET /v1/coordinator says so; status prints no such lines.
TEST(HighAvailabilityWatch, ACoordinatorAloneSaysItIsSingle) {
  TempDir dir;
  const std::string config = dir.write("watch.toml", kRun);
  auto a = ServerProcess::start({"--config", config, "--in-memory"});
  ASSERT_TRUE(a);
  rapidjson::Document d = coordinator_of(a->url());
  ASSERT_TRUE(d.IsObject());
  EXPECT_STREQ(d["mode"].GetString(), "single");
  EXPECT_STREQ(d["role"].GetString(), "leader");
  EXPECT_TRUE(d["leader"].IsNull());
  EXPECT_FALSE(has(metrics_of(a->url()), "traincoord_ha_"));
  const std::string shown = status_output(a->url());
  EXPECT_FALSE(has(shown, "coordinators:")) << shown;
  EXPECT_TRUE(has(shown, "run watch")) << shown;
}

}  // namespace
}  // namespace traincoord
