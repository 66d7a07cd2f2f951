// The etcd client against a real 3-member cluster on loopback (Debian's etcd-server): every
// call it makes, the fail-over to another member, the timeouts.
#include "journal/etcd_client.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <thread>

#include "e2e/server_process.h"
#include "etcd/etcd_cluster.h"
#include "etcd/ha_http.h"
#include "journal/etcd_options.h"

namespace traincoord {
namespace {

using testing::EtcdCluster;

std::vector<std::string> endpoints(const EtcdCluster& c) {
  std::vector<std::string> e;
  for (size_t i = 0; i < c.size(); ++i) e.push_back(c.endpoint(i));
  return e;
}

TEST(EtcdBase64, RoundTripsEveryByteAndRefusesWhatIsNotBase64) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n < 7; ++n) {
    std::string out;
    ASSERT_TRUE(etcd::base64_decode(etcd::base64_encode(all.substr(0, 250 + n)), &out));
    EXPECT_EQ(out, all.substr(0, 250 + n));
  }
  EXPECT_EQ(etcd::base64_encode("ab"), "YWI=");
  std::string out;
  EXPECT_FALSE(etcd::base64_decode("YW?=", &out));
  EXPECT_FALSE(etcd::base64_decode("YWI", &out));
  EXPECT_EQ(etcd::prefix_end("a/b"), "a/c");
}

TEST(EtcdCluster, StartsThreeMembersAndStopsEachByItsPid) {
  std::vector<pid_t> pids;
  {
    EtcdCluster cluster;
    ASSERT_TRUE(cluster.started());
    for (size_t i = 0; i < cluster.size(); ++i) {
      pids.push_back(cluster.pid(i));
      EXPECT_EQ(::kill(cluster.pid(i), 0), 0);
    }
  }
  for (pid_t pid : pids) EXPECT_NE(::kill(pid, 0), 0) << "etcd member " << pid << " still runs";
}

TEST(EtcdClient, PutRangeTxnDeleteLeaseAndCompaction) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  etcd::Client client({endpoints(cluster), std::chrono::milliseconds(2000)});
  const std::string binary("v\0\xff\n", 4);
  auto put = client.put("/t/a", binary);
  ASSERT_TRUE(put) << put.error().message;
  ASSERT_TRUE(client.put("/t/b", "2"));
  auto got = client.range("/t/", etcd::prefix_end("/t/"));
  ASSERT_TRUE(got);
  ASSERT_EQ(got->kvs.size(), 2u);
  EXPECT_EQ(got->kvs[0].value, binary);
  EXPECT_EQ(got->kvs[0].create_revision, *put);
  EXPECT_EQ(got->count, 2);

  // A txn's compares decide its branch; the failure branch reads.
  auto lost =
      client.txn({{etcd::Compare::Target::kCreate, etcd::Compare::Op::kEqual, "/t/a", 0, {}}},
                 {{etcd::Operation::Kind::kPut, "/t/a", "x", {}, 0, 0}},
                 {{etcd::Operation::Kind::kRange, "/t/a", {}, {}, 0, 0}});
  ASSERT_TRUE(lost);
  EXPECT_FALSE(lost->succeeded);
  ASSERT_EQ(lost->ranges.size(), 1u);
  EXPECT_EQ(lost->ranges[0].kvs.at(0).value, binary);
  auto won =
      client.txn({{etcd::Compare::Target::kValue, etcd::Compare::Op::kEqual, "/t/b", 0, "2"}},
                 {{etcd::Operation::Kind::kPut, "/t/b", "3", {}, 0, 0}});
  ASSERT_TRUE(won);
  EXPECT_TRUE(won->succeeded);
  EXPECT_EQ(client.range("/t/b")->kvs.at(0).value, "3");

  // A key under a lease goes with it.
  auto lease = client.lease_grant(5);
  ASSERT_TRUE(lease);
  EXPECT_GT(lease->id, 0);
  ASSERT_TRUE(client.put("/t/leased", "x", lease->id));
  auto kept = client.lease_keep_alive(lease->id);
  ASSERT_TRUE(kept);
  EXPECT_GT(kept->ttl_s, 0);
  ASSERT_TRUE(client.lease_revoke(lease->id));
  EXPECT_TRUE(client.range("/t/leased")->kvs.empty());
  auto gone = client.lease_keep_alive(lease->id);
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->ttl_s, 0);

  auto deleted = client.delete_range("/t/", etcd::prefix_end("/t/"));
  ASSERT_TRUE(deleted);
  EXPECT_EQ(*deleted, 2);
  auto status = client.status();
  ASSERT_TRUE(status);
  EXPECT_EQ(status->version, "3.4.23");
  ASSERT_TRUE(client.compact(status->revision));
  ASSERT_TRUE(client.compact(status->revision - 1));  // compacted already: not an error
  // What etcd refuses comes back as an error that says so.
  auto refused = client.put("/t/x", "y", 12345);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("lease not found"), std::string::npos)
      << refused.error().message;
}

TEST(EtcdClient, FailsOverToAnotherMemberWhenOneIsKilledOrPaused) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  etcd::Client client({endpoints(cluster), std::chrono::milliseconds(500)});
  ASSERT_TRUE(client.put("/f/a", "1"));
  EXPECT_EQ(client.current_endpoint(), cluster.endpoint(0));
  cluster.kill(0);
  auto after_kill = client.put("/f/a", "2");
  ASSERT_TRUE(after_kill) << after_kill.error().message;
  EXPECT_NE(client.current_endpoint(), cluster.endpoint(0));
  // A paused member does not answer: the call times out there and goes to another.
  ASSERT_TRUE(cluster.restart(0));
  const size_t now_at = client.current_endpoint() == cluster.endpoint(1) ? 1 : 2;
  cluster.stop(now_at);
  auto back = client.range("/f/a");
  cluster.resume(now_at);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_NE(client.current_endpoint(), cluster.endpoint(now_at));
  EXPECT_EQ(back->kvs.at(0).value, "2");
}

// The member that leads etcd's Raft (-1: none found).
int raft_leader(const EtcdCluster& cluster) {
  for (size_t i = 0; i < 3; ++i) {
    etcd::Client one(
        {{cluster.endpoint(i)}, std::chrono::milliseconds(500), std::chrono::milliseconds(500)});
    auto s = one.status();
    if (s && !s->leader.empty() && s->member_id == s->leader) return static_cast<int>(i);
  }
  return -1;
}

// With prefer_leader (the journal's writes), calls go to the member that leads etcd's Raft,
// wherever it is in the list, and to the new leader once that one is killed.
TEST(EtcdClient, PreferringTheLeaderCallsTheMemberThatLeadsRaft) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  int leader = -1;
  for (int i = 0; i < 100 && leader < 0; ++i) {
    leader = raft_leader(cluster);
    if (leader < 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(leader, 0);
  const size_t follower = (static_cast<size_t>(leader) + 1) % 3;
  std::vector<std::string> list = {cluster.endpoint(follower)};
  for (size_t i = 0; i < 3; ++i) {
    if (i != follower) list.push_back(cluster.endpoint(i));
  }
  etcd::ClientOptions options{list, std::chrono::milliseconds(500)};
  options.prefer_leader = true;
  etcd::Client client(options);
  ASSERT_TRUE(client.put("/l/a", "1"));
  EXPECT_EQ(client.current_endpoint(), cluster.endpoint(static_cast<size_t>(leader)));
  // Without it, the first member of the list.
  etcd::Client plain({list, std::chrono::milliseconds(500)});
  ASSERT_TRUE(plain.put("/l/a", "2"));
  EXPECT_EQ(plain.current_endpoint(), cluster.endpoint(follower));
  // The leader killed: the calls go to the one elected next.
  cluster.kill(static_cast<size_t>(leader));
  int next = -1;
  for (int i = 0; i < 100 && next < 0; ++i) {
    next = raft_leader(cluster);
    if (next < 0 || next == leader) {
      next = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_GE(next, 0);
  for (int i = 0; i < 2; ++i) {  // (the first call finds the member gone, the next the leader)
    auto put = client.put("/l/a", "3");
    ASSERT_TRUE(put) << put.error().message;
  }
  EXPECT_EQ(client.current_endpoint(), cluster.endpoint(static_cast<size_t>(next)));
}

TEST(EtcdClient, SaysWhichMembersItTriedWhenNoneAnswers) {
  etcd::Client client({{"127.0.0.1:1", "127.0.0.1:2"},
                       std::chrono::milliseconds(300),
                       std::chrono::milliseconds(500)});
  auto r = client.put("/x", "y");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("127.0.0.1:"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("connect"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace traincoord

namespace traincoord {
namespace {

// etcd's authentication (user and password): a client with the right ones gets a token per
// connection and is served; without a user, or with a wrong password, it is refused, saying so.
// The coordinator takes the user in its --journal url and serves the run through it.
TEST(EtcdAuth, AUserWithItsPasswordIsServedOthersAreRefused) {
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.started());
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v3/auth/user/add", R"({"name": "root", "password": "s3cret"})"},
           {"/v3/auth/role/add", R"({"name": "root"})"},
           {"/v3/auth/user/grant", R"({"user": "root", "role": "root"})"},
           {"/v3/auth/enable", "{}"}}) {
    const std::string reply = cluster.post(0, path, body);
    ASSERT_EQ(reply.find("\"error\""), std::string::npos) << path << ": " << reply;
  }
  etcd::ClientOptions options{
      {cluster.endpoint(0)}, std::chrono::milliseconds(1000), std::chrono::milliseconds(1500)};
  {
    etcd::Client anonymous(options);
    auto put = anonymous.put("/auth/k", "v");
    ASSERT_FALSE(put);
    EXPECT_NE(put.error().message.find("user name is empty"), std::string::npos)
        << put.error().message;
  }
  {
    etcd::Client client(options);
    client.authenticate_as("root", "guess");
    auto put = client.put("/auth/k", "v");
    ASSERT_FALSE(put);
    EXPECT_NE(put.error().message.find("authentication as root failed"), std::string::npos)
        << put.error().message;
  }
  etcd::Client client(options);
  client.authenticate_as("root", "s3cret");
  ASSERT_TRUE(client.put("/auth/k", "v")) << client.put("/auth/k", "v").error().message;
  auto got = client.range("/auth/k");
  ASSERT_TRUE(got) << got.error().message;
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "v");
  auto lease = client.lease_grant(5);
  ASSERT_TRUE(lease) << lease.error().message;
  EXPECT_TRUE(client.lease_revoke(lease->id));

  // A coordinator given the user in its url leads and serves the run; it never says the password.
  testing::TempDir dir;
  const std::string config = dir.write("auth.toml", R"(name = "auth"
[data]
train_batches = 4
[schedule]
epochs = 1
)");
  auto server = testing::ServerProcess::start(
      {"--config", config, "--journal", "etcd://root:s3cret@" + cluster.endpoint(0) + "/auth"});
  ASSERT_TRUE(server);
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    served = testing::http(server->url(), "GET", "/v1/runs/auth").status == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(served) << server->read_output();
  EXPECT_EQ(server->read_output().find("s3cret"), std::string::npos) << server->read_output();
  EXPECT_NE(server->read_output().find("etcd://root@"), std::string::npos) << server->read_output();
}

TEST(EtcdAuth, TheJournalUrlTakesAUserAndItsPasswordAndHidesIt) {
  auto o = parse_etcd_url("etcd://root:pw@a:1,b:2/p");
  ASSERT_TRUE(o) << o.error().message;
  EXPECT_EQ(o->user, "root");
  EXPECT_EQ(o->password, "pw");
  EXPECT_EQ(o->endpoints, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(o->prefix, "/p");
  auto bad = parse_etcd_url("etcd://root:pw@a/p");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message.find("pw@"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("root:***@"), std::string::npos) << bad.error().message;
  unsetenv("TRAINCOORD_ETCD_PASSWORD");
  EXPECT_FALSE(parse_etcd_url("etcd://root@a:1"));
  setenv("TRAINCOORD_ETCD_PASSWORD", "from-env", 1);
  auto env = parse_etcd_url("etcd://root@a:1");
  unsetenv("TRAINCOORD_ETCD_PASSWORD");
  ASSERT_TRUE(env) << env.error().message;
  EXPECT_EQ(env->password, "from-env");
}

}  // namespace
}  // namespace traincoord
