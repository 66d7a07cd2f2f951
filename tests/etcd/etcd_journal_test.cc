// The journal in etcd against a real 3-member cluster: a run written through the coordinator
// comes back exactly (snapshots in chunks included), a deposed leader's writes are refused and
// leave nothing, and etcd's storage stays bounded however long the run.
#include "journal/etcd_journal.h"

#include <gtest/gtest.h>

#include <zlib.h>

#include <random>

#include "core/run_codec.h"
#include "etcd/etcd_cluster.h"
#include "journal/etcd_election.h"
#include "server/coordinator.h"
#include "server/restore.h"

namespace traincoord {
namespace {

using testing::EtcdCluster;

std::string config_json(int train) {
  return R"({"name": "e", "data": {"train_batches": )" + std::to_string(train) +
         R"(, "dev_batches": 3}, "schedule": {"epochs": 3, "iters_per_worker": 1},)"
         R"( "leases": {"timeout": 5.0, "max_attempts": 100, "on_job_failure": "skip"},)"
         R"( "early_stop": {"rule": "none"}})";
}

EtcdJournalOptions options_of(const EtcdCluster& cluster, uint64_t snapshot_every) {
  auto o = parse_etcd_url("etcd://" + cluster.endpoints() + "/jt");
  EXPECT_TRUE(o);
  o->snapshot_every = snapshot_every;
  return *o;
}

// A coordinator on an etcd journal, without the network: each wave is written before its
// replies are delivered, as the server's commit pipeline does.
class Node {
 public:
  // `restore`: brings back what the journal holds first (a takeover).
  Node(ManualClock& wall, std::unique_ptr<EtcdJournal> journal, bool restore)
      : clock_(&wall), engine_(clock_), journal_(std::move(journal)) {
    if (restore) {
      Api replay(engine_, clock_, ApiLimits::none());
      auto report = restore_engine(*journal_, engine_, replay, clock_);
      EXPECT_TRUE(report) << report.error().message;
    } else {
      clock_.go_live(wall.now());
    }
    coordinator_ =
        std::make_unique<Coordinator>(engine_, clock_, journal_.get(), CoordinatorOptions{});
  }

  // One wave: the requests, then their write; the replies (empty when the write failed:
  // `write_error` says why).
  std::vector<HttpReply> wave(const std::vector<HttpRequest>& requests) {
    std::vector<Call> calls;
    auto replies = std::make_shared<std::vector<HttpReply>>();
    for (const HttpRequest& r : requests) {
      calls.push_back({r, ReplyTo{[replies](HttpReply reply) { replies->push_back(reply); }, {}}});
    }
    Wave w = coordinator_->step(calls);
    if (w.writes) {
      auto written = journal_->write(*w.writes);
      if (!written) {
        write_error = written.error();
        return {};
      }
    }
    for (Outgoing& o : w.replies) o.to.respond(std::move(o.reply));
    return *replies;
  }
  HttpReply post(const std::string& target, const std::string& body) {
    auto r = wave({HttpRequest{"POST", target, body, {}}});
    if (r.empty()) return HttpReply{0, {}, {}, {}, {}};
    return r[0];
  }

  std::string state() {
    auto run = engine_.find("e");
    return run ? RunCodec::save_journalled(**run) : std::string();
  }
  Engine& engine() { return engine_; }
  EtcdJournal& journal() { return *journal_; }
  std::optional<Error> write_error;

 private:
  ServerClock clock_;
  Engine engine_;
  std::unique_ptr<EtcdJournal> journal_;
  std::unique_ptr<Coordinator> coordinator_;
};

// Workers that take a job and complete it, `waves` times (each wave: every worker's request).
// Returns false when a write failed.
bool drive(Node& node, ManualClock& wall, int workers, int waves, std::vector<uint64_t>* ids,
           std::vector<std::optional<uint64_t>>* leases) {
  if (ids->empty()) {
    for (int w = 0; w < workers; ++w) {
      HttpReply r = node.post("/v1/runs/e/workers", R"({"name": "w)" + std::to_string(w) + "\"}");
      if (r.status != 200) {
        std::printf("%s\n", r.body.c_str());
        return false;
      }
      ids->push_back(std::stoull(r.body.substr(r.body.find("\"worker\":") + 9)));
    }
    leases->assign(workers, std::nullopt);
  }
  for (int i = 0; i < waves; ++i) {
    std::vector<HttpRequest> requests;
    for (int w = 0; w < workers; ++w) {
      const std::string me = R"({"worker": )" + std::to_string((*ids)[w]);
      if ((*leases)[w]) {
        requests.push_back({"POST",
                            "/v1/runs/e/complete",
                            me + R"(, "completions": [{"lease": )" + std::to_string(*(*leases)[w]) +
                                R"(, "loss": 0.5, "samples": 4}], "next": true})",
                            {}});
      } else {
        requests.push_back({"POST", "/v1/runs/e/acquire", me + "}", {}});
      }
    }
    auto replies = node.wave(requests);
    if (replies.size() != requests.size()) return false;
    for (const HttpReply& r : replies) {
      if (r.status != 200) std::printf("%d %s\n", r.status, r.body.c_str());
    }
    for (int w = 0; w < workers; ++w) {
      const auto at = replies[w].body.find("\"lease\":");
      (*leases)[w] = at == std::string::npos
                         ? std::nullopt
                         : std::optional<uint64_t>(std::stoull(replies[w].body.substr(at + 8)));
    }
    wall.advance(7);
  }
  return true;
}

// Wins the leadership of the journal at `options` (or fails the test).
std::unique_ptr<EtcdJournal> lead(EtcdElection& election, const EtcdJournalOptions& options) {
  auto won = election.campaign();
  EXPECT_TRUE(won && *won) << (won ? "another leads" : won.error().message);
  if (!won || !*won) return nullptr;
  auto journal = EtcdJournal::open(options, **won, election.lease());
  EXPECT_TRUE(journal) << journal.error().message;
  return journal ? std::move(*journal) : nullptr;
}

size_t keys_under(const EtcdCluster& cluster, const std::string& prefix) {
  etcd::Client client({{cluster.endpoint(0)}, std::chrono::milliseconds(2000)});
  auto r = client.range(prefix, etcd::prefix_end(prefix), 0, true);
  return r ? static_cast<size_t>(r->count) : 0;
}

TEST(EtcdJournal, ParsesEtcdUrlsAndNamesWhatIsWrong) {
  auto o = parse_etcd_url("etcd://a:1,b:2/runs/x/");
  ASSERT_TRUE(o);
  EXPECT_EQ(o->endpoints, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(o->prefix, "/runs/x");
  EXPECT_EQ(parse_etcd_url("etcd://h:2379")->prefix, "/traincoord");
  for (const char* bad : {"http://h:1", "etcd://", "etcd://h", "etcd://h:x", "etcd://h:1/"}) {
    auto r = parse_etcd_url(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().field, "journal");
    EXPECT_NE(r.error().message.find(bad), std::string::npos) << r.error().message;
  }
}

TEST(EtcdJournal, ARunWrittenThroughTheCoordinatorComesBackExactly) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  auto options = options_of(cluster, 40);
  options.chunk_bytes = 700;  // a snapshot in several chunks, in several txns
  options.txn_bytes = 2000;
  ManualClock wall(1'000'000);
  EtcdElection election(options, "http://a", 60);  // (no keep-alive here)
  std::string state;
  std::vector<uint64_t> ids;
  std::vector<std::optional<uint64_t>> leases;
  {
    Node leader(wall, lead(election, options), false);
    ASSERT_EQ(leader.post("/v1/runs", config_json(60)).status, 201);
    ASSERT_TRUE(drive(leader, wall, 4, 60, &ids, &leases));
    state = leader.state();
    EXPECT_GT(leader.journal().txns(), leader.journal().writes());  // chunks and splits
  }
  // Snapshots covered and deleted the records before them; one generation of chunks is left.
  EXPECT_LT(keys_under(cluster, "/jt/log/"), 40u);
  const size_t chunks = keys_under(cluster, "/jt/chunk/");
  EXPECT_GE(chunks, 2u);
  EXPECT_LT(chunks, state.size() / 700 + 3);
  // Another coordinator brings it back from etcd, byte for byte, and goes on from there.
  Node reader(wall, std::move(*EtcdJournal::open(options, 0, 0)), true);
  EXPECT_EQ(reader.state(), state);
}

// A wave's records go to etcd deflated (fewer bytes per etcd write: its cost grows with them),
// and a journal whose records were written plain (before they were deflated) is still read.
TEST(EtcdJournal, RecordsAreDeflatedAndPlainOnesAreStillRead) {
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.started());
  const auto options = options_of(cluster, 100'000);
  ManualClock wall(1'000'000);
  EtcdElection election(options, "http://a", 60);
  std::string state;
  {
    std::vector<uint64_t> ids;
    std::vector<std::optional<uint64_t>> leases;
    Node leader(wall, lead(election, options), false);
    ASSERT_EQ(leader.post("/v1/runs", config_json(60)).status, 201);
    ASSERT_TRUE(drive(leader, wall, 8, 6, &ids, &leases));
    state = leader.state();
  }
  etcd::Client client({{cluster.endpoint(0)}, std::chrono::milliseconds(2000)});
  auto logs = client.range("/jt/log/", etcd::prefix_end("/jt/log/"));
  ASSERT_TRUE(logs) << logs.error().message;
  ASSERT_GE(logs->kvs.size(), 6u);
  size_t packed = 0, plain = 0;
  for (const auto& kv : logs->kvs) {
    ASSERT_EQ(kv.value[0], 'Z') << kv.key;
    const auto nl = kv.value.find('\n');
    std::string raw(std::stoull(kv.value.substr(1, nl - 1)), '\0');
    uLongf size = static_cast<uLongf>(raw.size());
    ASSERT_EQ(uncompress(reinterpret_cast<Bytef*>(raw.data()), &size,
                         reinterpret_cast<const Bytef*>(kv.value.data() + nl + 1),
                         static_cast<uLong>(kv.value.size() - nl - 1)),
              Z_OK);
    ASSERT_EQ(size, raw.size());
    packed += kv.value.size();
    plain += raw.size();
    ASSERT_TRUE(client.put(kv.key, raw));  // as written before records were deflated
  }
  EXPECT_LT(packed * 2, plain) << packed << " bytes deflated, " << plain << " plain";
  Node reader(wall, std::move(*EtcdJournal::open(options, 0, 0)), true);
  EXPECT_EQ(reader.state(), state);
}

TEST(EtcdJournal, ADeposedLeaderIsRefusedAndNothingOfItsWriteLands) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  const auto options = options_of(cluster, 1000);
  ManualClock wall(1'000'000);
  EtcdElection first(options, "http://first", 60), second(options, "http://second", 60);
  Node a(wall, lead(first, options), false);
  ASSERT_EQ(a.post("/v1/runs", config_json(30)).status, 201);
  std::vector<uint64_t> ids;
  std::vector<std::optional<uint64_t>> leases;
  ASSERT_TRUE(drive(a, wall, 3, 10, &ids, &leases));
  const std::string before = a.state();
  // The second cannot lead while the first does.
  auto lost = second.campaign();
  ASSERT_TRUE(lost);
  EXPECT_FALSE(*lost);
  // The first's lease ends (as when it expires): the second takes over.
  first.resign();
  Node b(wall, lead(second, options), true);
  EXPECT_EQ(b.state(), before);
  // The first, not knowing, writes its next wave: refused, nothing of it lands.
  EXPECT_FALSE(drive(a, wall, 3, 1, &ids, &leases));
  ASSERT_TRUE(a.write_error);
  EXPECT_EQ(a.write_error->reason, error_reason::kNotLeader);
  EXPECT_NE(a.write_error->message.find("http://second"), std::string::npos)
      << a.write_error->message;
  Node reader(wall, std::move(*EtcdJournal::open(options, 0, 0)), true);
  EXPECT_EQ(reader.state(), before);
  // The new leader writes on.
  std::vector<uint64_t> ids_b = ids;
  std::vector<std::optional<uint64_t>> leases_b = leases;
  EXPECT_TRUE(drive(b, wall, 3, 3, &ids_b, &leases_b));
  EXPECT_FALSE(b.write_error);
}

TEST(EtcdJournal, CompactionKeepsEtcdStorageBoundedOverALongRun) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.started());
  auto options = options_of(cluster, 50);
  options.compact_every = 25;
  const int waves = std::getenv("TRAINCOORD_ETCD_LONG_WAVES")
                        ? std::atoi(std::getenv("TRAINCOORD_ETCD_LONG_WAVES"))
                        : 300;
  ManualClock wall(1'000'000);
  EtcdElection election(options, "http://a", 60);  // (no keep-alive here)
  Node leader(wall, lead(election, options), false);
  ASSERT_EQ(leader.post("/v1/runs", config_json(100000)).status, 201);
  std::vector<uint64_t> ids;
  std::vector<std::optional<uint64_t>> leases;
  etcd::Client client({{cluster.endpoint(0)}, std::chrono::milliseconds(2000)});
  size_t max_keys = 0;
  for (int done = 0; done < waves; done += 50) {
    auto kept = election.keep_alive();  // (a long run outlasts the lease)
    ASSERT_TRUE(kept && *kept);
    ASSERT_TRUE(drive(leader, wall, 8, 50, &ids, &leases))
        << "after " << done << " waves: "
        << (leader.write_error ? leader.write_error->message : "a request was refused");
    max_keys = std::max(max_keys, keys_under(cluster, "/jt/"));
  }
  auto status = client.status();
  ASSERT_TRUE(status);
  std::printf(
      "after %d waves (%llu txns, %llu compactions): at most %zu keys, revision %lld, db "
      "%lld bytes (%lld in use)\n",
      waves, static_cast<unsigned long long>(leader.journal().txns()),
      static_cast<unsigned long long>(leader.journal().compactions()), max_keys,
      static_cast<long long>(status->revision), static_cast<long long>(status->db_size),
      static_cast<long long>(status->db_size_in_use));
  // Keys: a snapshot's chunks, at most snapshot_every/8 record keys, and a few more.
  EXPECT_LT(max_keys, 30u);
  EXPECT_GE(leader.journal().compactions(), static_cast<uint64_t>(waves / 25 - 1));
  // The history before the last compaction is gone.
  auto old = client.range("/jt/head", {}, 0, false, 2);
  ASSERT_FALSE(old);
  EXPECT_NE(old.error().message.find("compacted"), std::string::npos) << old.error().message;
}

}  // namespace
}  // namespace traincoord
