// The rendezvous endpoints (docs/API.md, "Launch agents: the rendezvous"): each node's secret,
// the bounds, and what GET nodes shows, as a holder of the run's token meets them.
#include <gtest/gtest.h>

#include <rapidjson/document.h>

#include <string>

#include "server/api.h"

namespace traincoord {
namespace {

class RendezvousApiTest : public ::testing::Test {
 protected:
  RendezvousApiTest() : engine_(clock_), api_(engine_, clock_) {
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
                           const std::string& body, int status) {
    const HttpReply r = reply(method, target, body);
    EXPECT_EQ(r.status, status) << method << " " << target << " " << body << ": " << r.body;
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    EXPECT_FALSE(d.HasParseError()) << r.body;
    return d;
  }

  static std::string join_body(const std::string& node, const std::string& secret,
                               const std::string& extra = "") {
    return R"({"node": ")" + node + R"(", "secret": ")" + secret +
           R"(", "addr": "10.0.0.1", "nproc": 2, "master_port": 29500, "min_nodes": 2,
               "max_nodes": 2, "settle_ms": 0, "node_timeout_ms": 5000)" +
           extra + "}";
  }
  static std::string node_body(const std::string& node, const std::string& secret) {
    return R"({"node": ")" + node + R"(", "secret": ")" + secret + R"("})";
  }
  static std::string code(const rapidjson::Document& d) {
    return d.HasMember("error") ? d["error"]["code"].GetString() : "";
  }

  ManualClock clock_;
  Engine engine_;
  Api api_;
};

const std::string kSecretA = "0123456789abcdef0123456789abcdef";
const std::string kSecretB = "fedcba9876543210fedcba9876543210";
const std::string kThief = "00000000000000000000000000000000";

TEST_F(RendezvousApiTest, ANodesRequestsNeedItsSecret) {
  json("POST", "/v1/runs/r/nodes/join", join_body("a", kSecretA), 200);
  auto b = json("POST", "/v1/runs/r/nodes/join", join_body("b", kSecretB), 200);
  ASSERT_STREQ(b["state"].GetString(), "running");
  // Without a secret: refused, naming the field.
  auto bare = json("POST", "/v1/runs/r/nodes/poll", R"({"node": "a"})", 400);
  EXPECT_STREQ(bare["error"]["field"].GetString(), "secret");
  // Another holder of the run's token, with the wrong secret: refused at every endpoint.
  EXPECT_EQ(code(json("POST", "/v1/runs/r/nodes/join", join_body("a", kThief), 409)),
            "node_secret_mismatch");
  EXPECT_EQ(code(json("POST", "/v1/runs/r/nodes/poll", node_body("a", kThief), 409)),
            "node_secret_mismatch");
  EXPECT_EQ(code(json("POST", "/v1/runs/r/nodes/fail",
                      R"({"node": "a", "secret": ")" + kThief + R"(", "round": 1})", 409)),
            "node_secret_mismatch");
  EXPECT_EQ(code(json("POST", "/v1/runs/r/nodes/leave", node_body("b", kThief), 409)),
            "node_secret_mismatch");
  // The round runs on, unchanged.
  auto a = json("POST", "/v1/runs/r/nodes/poll", node_body("a", kSecretA), 200);
  EXPECT_STREQ(a["state"].GetString(), "running");
  EXPECT_EQ(a["round"].GetUint64(), 1u);
  EXPECT_EQ(a["world_size"].GetUint64(), 4u);
  // GET nodes never shows a secret.
  const HttpReply nodes = reply("GET", "/v1/runs/r/nodes");
  EXPECT_EQ(nodes.body.find(kSecretA), std::string::npos) << nodes.body;
  EXPECT_EQ(nodes.body.find("secret"), std::string::npos) << nodes.body;
}

TEST_F(RendezvousApiTest, BoundsTheNodesTheTimeoutsAndTheAddresses) {
  // 2 x max_nodes nodes at most: the round's and as many waiting.
  for (int i = 0; i < 4; ++i) {
    json("POST", "/v1/runs/r/nodes/join", join_body("n" + std::to_string(i), kSecretA), 200);
  }
  auto full = json("POST", "/v1/runs/r/nodes/join", join_body("n4", kSecretA), 409);
  EXPECT_EQ(code(full), "rendezvous_full");
  const HttpReply nodes = reply("GET", "/v1/runs/r/nodes");
  rapidjson::Document d;
  d.Parse(nodes.body.c_str());
  EXPECT_EQ(d["nodes"].Size(), 4u);
  // A setting of the round that differs: a conflict naming it, the value there and the one sent.
  auto hasty = json("POST", "/v1/runs/r/nodes/join",
                    R"({"node": "n0", "secret": ")" + kSecretA +
                        R"(", "min_nodes": 2, "max_nodes": 2, "node_timeout_ms": 1000})",
                    409);
  EXPECT_EQ(code(hasty), "rendezvous_settings_conflict");
  const std::string message = hasty["error"]["message"].GetString();
  EXPECT_NE(message.find("node_timeout_ms 5000"), std::string::npos) << message;
  EXPECT_NE(message.find("sent 1000"), std::string::npos) << message;
  // Bounds, whoever comes first.
  auto hour = json("POST", "/v1/runs/r/nodes/join",
                   R"({"node": "x", "secret": ")" + kSecretB +
                       R"(", "min_nodes": 1, "max_nodes": 1, "node_timeout_ms": 3600000})",
                   400);
  EXPECT_STREQ(hour["error"]["field"].GetString(), "node_timeout_ms");
  auto addr =
      json("POST", "/v1/runs/r/nodes/join",
           R"({"node": "y", "secret": ")" + kSecretB + R"(", "addr": "10.0.0.1; rm"})", 400);
  EXPECT_STREQ(addr["error"]["field"].GetString(), "addr");
}

}  // namespace
}  // namespace traincoord
