// The C++ client's groups and checkpoint cuts against the real binary: ranks of a group give
// their shares of a cut, a restarted group must restore (or start fresh) before it gets jobs,
// the group before it is refused on every request, and the model's lineage (what was trained
// up to the cut, then everything after the restore) trains every batch exactly once. And what
// `traincoord status` shows of it.
#include <gtest/gtest.h>

#include <rapidjson/document.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "server_process.h"
#include "traincoord/client.h"

namespace traincoord {
namespace {

using testing::run_command;
using testing::ServerProcess;
using testing::TempDir;

// 12 train batches in jobs of 3: 4 jobs an epoch, 2 epochs, no dev set.
constexpr const char* kRun = R"(
name = "cuts"
[data]
train_batches = 12
dev_batches = 0
order = "shuffled"
seed = 5
[schedule]
epochs = 2
iters_per_worker = 3
[leases]
timeout = 5
[cuts]
keep = 2
)";
constexpr uint64_t kBatches = 12;
constexpr int64_t kEpochs = 2;

class ClientCuts : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string config = dir_.write("cuts.toml", kRun);
    server_ = ServerProcess::start({"--config", config, "--in-memory"});
    ASSERT_NE(server_, nullptr);
  }

  client::Options options(const std::string& name, const std::string& group) const {
    client::Options o;
    o.url = server_->url();
    o.run = "cuts";
    o.worker_name = name;
    o.group = group;
    o.long_poll = std::chrono::milliseconds(2000);
    o.give_up_after = std::chrono::milliseconds(20000);
    return o;
  }

  std::unique_ptr<client::Worker> connect(const std::string& name, const std::string& group) {
    auto w = client::Worker::connect(options(name, group));
    EXPECT_TRUE(w) << w.error().message;
    return w ? std::move(*w) : nullptr;
  }

  rapidjson::Document status() const {
    auto body = client::get(server_->url(), "/v1/runs/cuts");
    EXPECT_TRUE(body) << body.error().message;
    rapidjson::Document d;
    d.Parse(body ? body->c_str() : "{}");
    return d;
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

// The batches a model was trained on, per epoch.
using Lineage = std::map<int64_t, std::multiset<uint64_t>>;

void add(Lineage* lineage, const client::Job& job, size_t batches) {
  for (size_t i = 0; i < batches && i < job.batches.size(); ++i) {
    (*lineage)[job.epoch].insert(job.batches[i]);
  }
}

void expect_exactly_once(const Lineage& lineage) {
  ASSERT_EQ(lineage.size(), static_cast<size_t>(kEpochs));
  for (const auto& [epoch, batches] : lineage) {
    EXPECT_EQ(batches.size(), kBatches) << "epoch " << epoch;
    for (uint64_t b = 0; b < kBatches; ++b) {
      EXPECT_EQ(batches.count(b), 1u) << "epoch " << epoch << " batch " << b;
    }
  }
}

client::CutShare share_of(uint64_t seq, uint32_t rank, uint32_t world_size,
                          std::vector<client::CutPart> parts = {}) {
  return client::CutShare{seq, rank, world_size, std::move(parts)};
}

client::CutPart part_of(const client::Job& job, uint64_t batches) {
  return client::CutPart{
      job.lease, batches, 0.25 * static_cast<double>(batches), 4 * batches, {{"accuracy", 0.5}}};
}

// The code of a call's error ("succeeded" when it did not fail), and its field.
template <typename T>
std::string code(const client::Result<T>& r) {
  return r ? "succeeded" : r.error().code;
}
template <typename T>
std::string field(const client::Result<T>& r) {
  return r ? "succeeded" : r.error().field;
}

client::Completion done_with(const client::Job& job) {
  return {0.5, 4 * job.batches.size(), {}, 0};
}

TEST_F(ClientCuts, ACutIsCompleteOnceEveryRankOfTheGroupGaveItsShare) {
  auto rank0 = connect("r0", "job-1/0");
  auto rank1 = connect("r1", "job-1/0");
  ASSERT_TRUE(rank0 && rank1);
  EXPECT_EQ(rank0->group(), "job-1/0");
  EXPECT_EQ(rank1->generation(), 1u);  // the first group took the run over
  EXPECT_FALSE(rank1->restore_required());
  EXPECT_FALSE(rank1->latest_cut());

  auto job0 = rank0->next();
  ASSERT_TRUE(job0 && *job0) << (job0 ? "finished" : job0.error().message);
  ASSERT_EQ((*job0)->batches.size(), 3u);
  auto first = rank0->give_cut_share(share_of(1, 0, 2, {part_of(**job0, 2)}));
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_FALSE(first->complete);
  EXPECT_EQ(first->ranks, std::vector<uint32_t>{0});
  EXPECT_EQ(first->world_size, 2u);
  EXPECT_EQ(first->generation, 1u);
  auto again = rank0->give_cut_share(share_of(1, 0, 2, {part_of(**job0, 2)}));
  ASSERT_TRUE(again) << again.error().message;  // the same share again changes nothing
  EXPECT_EQ(again->cut, first->cut);
  EXPECT_FALSE(again->complete);

  // Rank 1 has not given its share: waiting for the cut names it.
  auto waited = rank0->wait_for_cut(first->cut, std::chrono::milliseconds(150));
  ASSERT_FALSE(waited);
  EXPECT_EQ(waited.error().code, client::codes::kCutTimeout);
  EXPECT_NE(waited.error().message.find("missing ranks 1"), std::string::npos)
      << waited.error().message;

  auto pending = rank0->cut(first->cut);
  ASSERT_TRUE(pending) << pending.error().message;
  EXPECT_FALSE(pending->complete);
  EXPECT_FALSE(pending->completed_ago);
  EXPECT_EQ(pending->group, "job-1/0");

  auto last = rank1->give_cut_share(share_of(1, 1, 2));  // rank 1 holds no job
  ASSERT_TRUE(last) << last.error().message;
  EXPECT_TRUE(last->complete);
  EXPECT_EQ(last->cut, first->cut);
  EXPECT_EQ(last->ranks, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(rank1->latest_cut(), first->cut);

  auto cut = rank0->wait_for_cut(first->cut, std::chrono::seconds(5));
  ASSERT_TRUE(cut) << cut.error().message;
  EXPECT_TRUE(cut->complete);
  EXPECT_TRUE(cut->completed_ago);
  EXPECT_EQ(cut->seq, 1u);
  EXPECT_EQ(cut->generation, 1u);
  EXPECT_EQ(cut->state, "running");
  EXPECT_EQ(cut->epoch, 0);
  EXPECT_EQ(cut->set, "train");
  EXPECT_EQ(cut->jobs_done, 0u);
  EXPECT_EQ(cut->partial_jobs, 1u);
  EXPECT_EQ(cut->partial_batches, 2u);

  auto list = rank1->cuts();
  ASSERT_TRUE(list) << list.error().message;
  EXPECT_EQ(list->keep, 2u);
  EXPECT_EQ(list->generation, 1u);
  EXPECT_EQ(list->group, "job-1/0");
  ASSERT_EQ(list->cuts.size(), 1u);
  EXPECT_EQ(list->cuts[0].id, first->cut);
  EXPECT_TRUE(list->cuts[0].complete);

  auto missing = rank1->cut(first->cut + 100);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, client::codes::kCutNotFound);
  EXPECT_EQ(missing.error().http_status, 404);
}

TEST_F(ClientCuts, ASharesRefusalsCarryTheirCodes) {
  auto rank0 = connect("r0", "g1");
  auto rank1 = connect("r1", "g1");
  ASSERT_TRUE(rank0 && rank1);
  auto job = rank0->next();
  ASSERT_TRUE(job && *job);
  const client::Job held = **job;

  auto whole = rank0->give_cut_share(share_of(1, 0, 2, {part_of(held, held.batches.size())}));
  ASSERT_FALSE(whole);  // a job trained whole is completed, not part of a cut
  EXPECT_EQ(whole.error().code, "invalid_argument");
  auto rank_out = rank0->give_cut_share(share_of(1, 2, 2));
  ASSERT_FALSE(rank_out);
  EXPECT_EQ(rank_out.error().code, "invalid_argument");
  EXPECT_EQ(rank_out.error().field, "rank");
  auto foreign = rank1->give_cut_share(share_of(1, 1, 2, {part_of(held, 1)}));
  ASSERT_FALSE(foreign);
  EXPECT_EQ(foreign.error().code, client::codes::kLeaseNotYours);

  auto done = rank0->complete(held, done_with(held));
  ASSERT_TRUE(done && done->counted);
  auto not_held = rank0->give_cut_share(share_of(1, 0, 2, {part_of(held, 1)}));
  ASSERT_FALSE(not_held);
  EXPECT_EQ(not_held.error().code, client::codes::kLeaseNotHeld);

  ASSERT_TRUE(rank0->give_cut_share(share_of(1, 0, 2)));
  auto mismatch = rank1->give_cut_share(share_of(1, 1, 3));
  ASSERT_FALSE(mismatch);
  EXPECT_EQ(mismatch.error().code, client::codes::kCutMismatch);
  EXPECT_EQ(mismatch.error().http_status, 409);

  // Without a group there is no cut and no restore; a group that is not a name is refused
  // before anything is sent.
  auto ungrouped = connect("free", "");
  ASSERT_TRUE(ungrouped);
  EXPECT_EQ(field(ungrouped->give_cut_share(share_of(1, 0, 1))), "group");
  EXPECT_EQ(field(ungrouped->restore(1)), "group");
  EXPECT_EQ(field(ungrouped->start_fresh()), "group");
  for (const std::string& bad :
       {std::string("has space"), std::string(129, 'g'), std::string("tab\there")}) {
    auto refused = client::Worker::connect(options("bad", bad));
    ASSERT_FALSE(refused) << bad;
    EXPECT_EQ(refused.error().code, "invalid_argument");
    EXPECT_EQ(refused.error().field, "group");
  }
}

// The acceptance path through the C++ client: group 1 trains, checkpoints with a cut in the
// middle of a job, trains on and "dies"; group 2 registers, is told to restore, restores the
// cut, and trains the run to its end. The model's lineage is every batch exactly once; group 1
// is refused on every request from the restore on.
TEST_F(ClientCuts, ARestartedGroupRestoresTheCutAndTheModelTrainsEveryBatchOnce) {
  Lineage lineage;  // what the model restored from the checkpoint, then group 2, trained
  auto old = connect("a0", "run-1");
  ASSERT_TRUE(old);
  auto j1 = old->next();
  ASSERT_TRUE(j1 && *j1);
  ASSERT_TRUE(old->complete(**j1, done_with(**j1))->counted);
  add(&lineage, **j1, 3);
  auto j2 = old->next();
  ASSERT_TRUE(j2 && *j2);
  auto taken = old->give_cut_share(share_of(1, 0, 1, {part_of(**j2, 1)}));
  ASSERT_TRUE(taken) << taken.error().message;
  ASSERT_TRUE(taken->complete);
  add(&lineage, **j2, 1);  // the checkpoint holds the first batch of j2
  const uint64_t cut = taken->cut;
  // Group 1 goes on after its checkpoint: this is lost with it.
  ASSERT_TRUE(old->complete(**j2, done_with(**j2))->counted);
  auto j3 = old->next();
  ASSERT_TRUE(j3 && *j3);
  ASSERT_TRUE(old->complete(**j3, done_with(**j3))->counted);
  auto j4 = old->next();  // held when group 1 dies
  ASSERT_TRUE(j4 && *j4);

  auto fresh = connect("b0", "run-2");
  ASSERT_TRUE(fresh);
  EXPECT_TRUE(fresh->restore_required());
  EXPECT_EQ(fresh->latest_cut(), cut);
  EXPECT_EQ(fresh->generation(), 1u);
  auto early = fresh->next();
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().code, client::codes::kRestoreRequired);
  EXPECT_EQ(early.error().http_status, 409);

  auto restored = fresh->restore(cut);
  ASSERT_TRUE(restored) << restored.error().message;
  EXPECT_TRUE(restored->restored);
  EXPECT_EQ(restored->cut, cut);
  EXPECT_EQ(restored->generation, 2u);
  EXPECT_EQ(restored->withdrawn_jobs, 2u);  // j2 and j3, completed after the cut
  EXPECT_EQ(restored->leases_voided, 1u);   // j4
  EXPECT_EQ(restored->state, "running");
  EXPECT_FALSE(fresh->restore_required());
  EXPECT_EQ(fresh->generation(), 2u);

  // Another rank of group 2 restores the same: nothing more happens. Another target: refused.
  auto peer = connect("b1", "run-2");
  ASSERT_TRUE(peer);
  EXPECT_FALSE(peer->restore_required());
  auto same = peer->restore(cut);
  ASSERT_TRUE(same) << same.error().message;
  EXPECT_FALSE(same->restored);
  EXPECT_EQ(same->generation, 2u);
  EXPECT_EQ(code(peer->start_fresh()), client::codes::kRestoreConflict);
  EXPECT_EQ(code(peer->restore(cut + 7)), client::codes::kRestoreConflict);

  // Group 1 is fenced off on every request it makes (the group travels with each one).
  EXPECT_EQ(code(old->next()), client::codes::kStaleGeneration);
  EXPECT_EQ(code(old->next_jobs(2)), client::codes::kStaleGeneration);
  EXPECT_EQ(code(old->complete(**j4, done_with(**j4))), client::codes::kStaleGeneration);
  EXPECT_EQ(code(old->fail(**j4, "oops")), client::codes::kStaleGeneration);
  EXPECT_EQ(code(old->release({**j4})), client::codes::kStaleGeneration);
  EXPECT_EQ(code(old->give_cut_share(share_of(2, 0, 1))), client::codes::kStaleGeneration);
  EXPECT_EQ(code(old->restore(cut)), client::codes::kStaleGeneration);
  EXPECT_EQ(code(old->leave()), client::codes::kStaleGeneration);
  auto again = client::Worker::connect(options("a1", "run-1"));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, client::codes::kStaleGeneration);

  // Group 2 trains the rest: the job partly trained at the cut comes back with its other
  // batches only.
  bool remainder_seen = false;
  auto job = fresh->next();
  while (job && *job) {
    const client::Job j = **job;
    if (j.epoch == (*j2)->epoch && j.index == (*j2)->index) {
      EXPECT_EQ(j.batches, std::vector<uint64_t>((*j2)->batches.begin() + 1, (*j2)->batches.end()));
      remainder_seen = true;
    }
    job = fresh->complete_and_next(j, done_with(j));
    if (job && fresh->last_completed().counted) add(&lineage, j, j.batches.size());
  }
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_EQ(fresh->finished()->state, "completed");
  EXPECT_TRUE(remainder_seen);
  expect_exactly_once(lineage);

  const auto s = status();
  EXPECT_EQ(s["generation"].GetUint64(), 2u);
  EXPECT_STREQ(s["group"].GetString(), "run-2");
  EXPECT_EQ(s["counters"]["cuts"].GetUint64(), 1u);
  EXPECT_EQ(s["counters"]["restores"].GetUint64(), 1u);
  EXPECT_EQ(s["counters"]["jobs_withdrawn"].GetUint64(), 2u);
  EXPECT_EQ(s["cuts"]["latest"]["id"].GetUint64(), cut);
  std::multiset<std::string> kinds;
  for (const auto& e : s["events"].GetArray()) kinds.insert(e["kind"].GetString());
  EXPECT_EQ(kinds.count("group_started"), 2u);  // run-1, then run-2 by its restore
  EXPECT_EQ(kinds.count("cut_taken"), 1u);
  EXPECT_EQ(kinds.count("restored"), 1u);

  // What `traincoord status` shows of it.
  int code = -1;
  const std::string out = run_command(
      std::string(TRAINCOORD_BIN) + " status cuts --url " + server_->url() + " 2>&1", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("group run-2, generation 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("latest: cut " + std::to_string(cut) +
                     ", train epoch 0, 1 jobs done, 1 partly trained (1 batches), "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("cuts taken 1, restores 1, jobs withdrawn 2, leases voided 1\n"),
            std::string::npos)
      << out;
}

TEST_F(ClientCuts, AFreshStartGoesOnFromTheLedgerAsItIs) {
  auto old = connect("a0", "first");
  ASSERT_TRUE(old);
  auto j1 = old->next();
  ASSERT_TRUE(j1 && *j1);
  ASSERT_TRUE(old->give_cut_share(share_of(1, 0, 1))->complete);
  ASSERT_TRUE(old->complete(**j1, done_with(**j1))->counted);

  auto next = connect("b0", "second");
  ASSERT_TRUE(next);
  ASSERT_TRUE(next->restore_required());
  auto fresh = next->start_fresh();
  ASSERT_TRUE(fresh) << fresh.error().message;
  EXPECT_TRUE(fresh->restored);
  EXPECT_FALSE(fresh->cut);
  EXPECT_EQ(fresh->withdrawn_jobs, 0u);
  EXPECT_EQ(fresh->generation, 2u);
  auto job = next->next();
  ASSERT_TRUE(job && *job) << (job ? "finished" : job.error().message);
  EXPECT_FALSE((*job)->epoch == (*j1)->epoch && (*job)->index == (*j1)->index)
      << "a job done before a fresh start is not handed out again";
  EXPECT_EQ(status()["progress"]["jobs_done"].GetUint64(), 1u);
}

// Through a JobStream: the share goes after the completions the stream had queued, so the jobs
// trained whole count in the cut.
TEST_F(ClientCuts, AStreamSendsItsQueuedCompletionsBeforeTheShare) {
  auto worker = connect("s0", "streamed");
  ASSERT_TRUE(worker);
  client::JobStream stream(*worker, 2);
  for (int i = 0; i < 2; ++i) {
    auto job = stream.next();
    ASSERT_TRUE(job && *job);
    stream.complete(**job, done_with(**job));  // queued, sent behind
  }
  auto held = stream.next();
  ASSERT_TRUE(held && *held);
  auto taken = stream.give_cut_share(share_of(1, 0, 1, {part_of(**held, 2)}));
  ASSERT_TRUE(taken) << taken.error().message;
  ASSERT_TRUE(taken->complete);
  auto cut = worker->cut(taken->cut);
  ASSERT_TRUE(cut) << cut.error().message;
  EXPECT_EQ(cut->jobs_done, 2u);
  EXPECT_EQ(cut->partial_jobs, 1u);
  EXPECT_EQ(cut->partial_batches, 2u);
  const auto outcomes = stream.outcomes();
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_TRUE(outcomes[0].counted && outcomes[1].counted);
  stream.complete(**held, done_with(**held));
  ASSERT_TRUE(stream.flush());
  EXPECT_EQ(stream.outcomes().size(), 3u);
  ASSERT_TRUE(stream.close());
}

}  // namespace
}  // namespace traincoord
