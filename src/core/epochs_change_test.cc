// schedule.epochs changed on a started run (--apply-config-changes, issue 34): the run is saved
// and loaded with the new config; RunCodec::load keeps the epochs opened and goes on to the new
// target.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <utility>

#include "core/run.h"
#include "core/run_codec.h"

namespace traincoord {
namespace {

RunConfig config_of(int64_t epochs) {
  RunConfig c;
  c.name = "grow";
  c.train_batches = 4;
  c.dev_batches = 2;
  c.order = BatchOrder::kShuffled;
  c.seed = 5;
  c.epochs = epochs;
  c.validation_every = 1;
  c.lease_timeout_ms = 1000;
  return c;
}

// Trains until the run says it is finished (or `max_jobs` jobs); returns the batches trained per
// (set, epoch).
std::map<std::pair<int, int64_t>, std::multiset<uint64_t>> train(Run& run, int max_jobs = 1000) {
  std::map<std::pair<int, int64_t>, std::multiset<uint64_t>> trained;
  const WorkerId w = run.join("w");
  for (int i = 0; i < max_jobs; ++i) {
    auto a = run.acquire(w);
    EXPECT_TRUE(a);
    if (!a || a->status != AcquireStatus::kJob) break;
    std::vector<uint64_t> batches;
    run.batches_of(a->job, &batches);
    Completion c;
    c.loss = 1.0;
    c.samples = 1;
    EXPECT_TRUE(run.complete(w, a->job.lease, c));
    for (uint64_t b : batches) trained[{static_cast<int>(a->job.set), a->job.epoch}].insert(b);
  }
  return trained;
}

TEST(EpochsChange, ACompletedRunRaisedToMoreEpochsTrainsOnlyTheEpochsAdded) {
  ManualClock clock;
  traincoord::Run run(config_of(2), clock);
  auto first = train(run);
  ASSERT_EQ(run.state(), RunState::kCompleted);
  ASSERT_EQ(first.size(), 4u);  // train and dev of epochs 0 and 1

  auto raised = RunCodec::load(config_of(4), RunCodec::save(run), clock);
  ASSERT_TRUE(raised) << raised.error().message;
  EXPECT_EQ((*raised)->state(), RunState::kRunning);
  EXPECT_EQ((*raised)->events().back().kind, EventKind::kEpochOpened);
  auto more = train(**raised);
  EXPECT_EQ((*raised)->state(), RunState::kCompleted);
  // Epochs 2 and 3 only, each batch once, and the epochs 0 and 1 kept as they were.
  std::set<std::pair<int, int64_t>> epochs;
  for (const auto& [key, batches] : more) {
    epochs.insert(key);
    const uint64_t n = key.first == 0 ? 4 : 2;
    std::multiset<uint64_t> all;
    for (uint64_t b = 0; b < n; ++b) all.insert(b);
    EXPECT_EQ(batches, all) << "set " << key.first << " epoch " << key.second;
  }
  EXPECT_EQ(epochs, (std::set<std::pair<int, int64_t>>{{0, 2}, {1, 2}, {0, 3}, {1, 3}}));
  EXPECT_EQ((*raised)->epochs().size(), 8u);
  EXPECT_EQ((*raised)->planned_jobs(), (*raised)->counters().completions_accepted);
}

TEST(EpochsChange, ATargetBelowAnOpenedEpochIsRefusedAndOneDownToItEndsTheRunThere) {
  ManualClock clock;
  traincoord::Run run(config_of(4), clock);
  train(run, 15);  // epochs 0 and 1 (4 train and 2 dev jobs each), into epoch 2
  const int64_t opened = run.epochs().back().plan.epoch;
  ASSERT_GE(opened, 1);
  EXPECT_EQ(run.opened_train_end(), opened + 1);  // what --apply-config-changes checks first
  auto lowered = RunCodec::load(config_of(opened), RunCodec::save(run), clock);
  ASSERT_FALSE(lowered);  // (past that check, only damage gets here)
  EXPECT_NE(lowered.error().message.find("opened train epoch " + std::to_string(opened)),
            std::string::npos)
      << lowered.error().message;
  // Lowered to the epochs opened: the run ends after them.
  auto ok = RunCodec::load(config_of(opened + 1), RunCodec::save(run), clock);
  ASSERT_TRUE(ok) << ok.error().message;
  train(**ok);
  EXPECT_EQ((*ok)->state(), RunState::kCompleted);
  EXPECT_EQ((*ok)->epochs().back().plan.epoch, opened);
}

TEST(EpochsChange, AnEarlyStoppedRunStaysStoppedAndTheSameConfigChangesNothing) {
  ManualClock clock;
  traincoord::Run run(config_of(2), clock);
  train(run);
  const std::string saved = RunCodec::save(run);
  auto same = RunCodec::load(config_of(2), saved, clock);
  ASSERT_TRUE(same);
  EXPECT_EQ(RunCodec::save(**same), saved);

  RunConfig stopping = config_of(6);
  stopping.early_stop.kind = EarlyStopKind::kPatience;
  stopping.early_stop.patience.patience = 1;
  traincoord::Run run2(stopping, clock);
  train(run2);  // every dev loss is 1.0: no improvement, stopped after epoch 1
  ASSERT_EQ(run2.state(), RunState::kEarlyStopped);
  stopping.epochs = 10;
  auto raised = RunCodec::load(stopping, RunCodec::save(run2), clock);
  ASSERT_TRUE(raised);
  EXPECT_EQ((*raised)->state(), RunState::kEarlyStopped);
}

}  // namespace
}  // namespace traincoord
