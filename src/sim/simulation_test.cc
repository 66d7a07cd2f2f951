#include "sim/simulation.h"

#include <gtest/gtest.h>

#include <rapidjson/document.h>

#include <cstdint>
#include <limits>
#include <set>
#include <sstream>

namespace traincoord {
namespace {

RunConfig config() {
  RunConfig c;
  c.name = "sim";
  c.train_batches = 12;
  c.dev_batches = 4;
  c.iters_per_worker = 2;
  c.epochs = 4;
  c.validation_every = 1;
  c.early_stop.kind = EarlyStopKind::kWindow;
  c.early_stop.window = {3, 0.01, 0.01};
  return c;
}

TEST(Simulate, RunsThePlanToTheEndAndStopsEarlyOnARisingDevLoss) {
  SimulationOptions o;
  o.workers = 3;
  auto table =
      parse_loss_table("train 0 3\ntrain 1 2\ndev 0 1.0 # first\ndev 1 0.9\ndev 2 1.5\n", "losses");
  ASSERT_TRUE(table) << table.error().message;
  o.losses = *table;
  auto r = simulate(config(), o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->state, RunState::kEarlyStopped);
  EXPECT_EQ(r->early_stop.stopped_at_epoch, 2);
  EXPECT_EQ(r->early_stop.best_epoch, 1);
  // 3 train epochs of 6 jobs and 3 dev epochs of 2, then nothing.
  EXPECT_EQ(r->handouts.size(), 3u * 6 + 3u * 2);
  ASSERT_EQ(r->epochs.size(), 6u);
  EXPECT_DOUBLE_EQ(r->epochs[0].loss, 3.0);
  EXPECT_DOUBLE_EQ(r->epochs[1].loss, 1.0);
  EXPECT_DOUBLE_EQ(r->epochs[2].loss, 2.0);
}

// Issue 16, item 11: a job's samples (batches x batch_size) wrapped around past 2^64.
TEST(Simulate, AJobsSampleCountSaturatesInsteadOfWrapping) {
  RunConfig c;
  c.name = "wide";
  c.train_batches = 1 << 14;
  c.iters_per_worker = 1 << 14;      // one job of 2^14 batches ...
  c.batch_size = uint64_t{1} << 50;  // ... of 2^50 samples each: 2^64 samples
  c.validation_every = 0;
  auto r = simulate(c, SimulationOptions{});
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->epochs.size(), 1u);
  EXPECT_EQ(r->epochs[0].samples, std::numeric_limits<uint64_t>::max());
}

TEST(Simulate, EveryBatchOfEveryEpochIsHandedOutOnceWhateverTheOrder) {
  RunConfig c = config();
  c.early_stop.kind = EarlyStopKind::kNone;
  for (CompletionOrder order :
       {CompletionOrder::kFifo, CompletionOrder::kLifo, CompletionOrder::kRandom}) {
    SimulationOptions o;
    o.workers = 5;
    o.order = order;
    o.seed = 3;
    auto r = simulate(c, o);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->state, RunState::kCompleted);
    std::map<std::pair<SetKind, int64_t>, std::multiset<uint64_t>> seen;
    for (const Handout& h : r->handouts) {
      seen[{h.job.set, h.job.epoch}].insert(h.batches.begin(), h.batches.end());
    }
    ASSERT_EQ(seen.size(), 8u);
    for (const auto& [key, batches] : seen) {
      const uint64_t n = key.first == SetKind::kTrain ? 12 : 4;
      EXPECT_EQ(batches.size(), n);
      EXPECT_EQ(std::set<uint64_t>(batches.begin(), batches.end()).size(), n);
    }
  }
}

TEST(Simulate, RandomOrderIsReproducibleFromItsSeed) {
  SimulationOptions o;
  o.workers = 4;
  o.order = CompletionOrder::kRandom;
  o.seed = 11;
  RunConfig c = config();
  c.overlap_epochs = true;
  auto a = simulate(c, o), b = simulate(c, o);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(trace_json(*a, o), trace_json(*b, o));
  o.seed = 12;
  auto other = simulate(c, o);
  EXPECT_NE(trace_json(*a, o), trace_json(*other, o));
}

TEST(Simulate, JsonTraceIsValidAndCarriesThePlanHandoutsAndResult) {
  SimulationOptions o;
  o.workers = 2;
  auto r = simulate(config(), o);
  ASSERT_TRUE(r);
  rapidjson::Document d;
  d.Parse(trace_json(*r, o).c_str());
  ASSERT_FALSE(d.HasParseError());
  EXPECT_EQ(d["plan"]["train_jobs_per_epoch"].GetUint64(), 6u);
  EXPECT_EQ(d["handouts"].Size(), r->handouts.size());
  EXPECT_STREQ(d["handouts"][0]["set"].GetString(), "train");
  EXPECT_EQ(d["handouts"][0]["batches"].Size(), 2u);
  EXPECT_STREQ(d["result"]["state"].GetString(), "early_stopped");  // constant loss plateaus
  EXPECT_TRUE(d["result"]["early_stopped"].GetBool());
}

TEST(Simulate, TextReportShowsPlanHandoutsEpochsAndResult) {
  SimulationOptions o;
  o.workers = 2;
  auto r = simulate(config(), o);
  ASSERT_TRUE(r);
  std::ostringstream out;
  print_report(*r, o, out);
  const std::string text = out.str();
  EXPECT_NE(text.find("batches_per_job 2"), std::string::npos);
  EXPECT_NE(text.find("validation after epochs: 0, 1, 2, 3"), std::string::npos);
  EXPECT_NE(text.find("  1 w0 train 0 0/6"), std::string::npos);
  EXPECT_NE(text.find("dev 2: loss 1"), std::string::npos);
  EXPECT_NE(text.find("result: early_stopped"), std::string::npos);
}

TEST(Simulate, LossTableRefusesMalformedLines) {
  auto bad = parse_loss_table("test 1 2\n", "l.txt");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("l.txt:1"), std::string::npos);
  EXPECT_FALSE(parse_loss_table("dev one 2\n", "l.txt"));
  EXPECT_FALSE(parse_loss_table("dev 1 2 3\n", "l.txt"));
  EXPECT_TRUE(parse_loss_table("# nothing\n\n", "l.txt"));
}

TEST(Simulate, RefusesZeroWorkers) {
  SimulationOptions o;
  o.workers = 0;
  EXPECT_FALSE(simulate(config(), o));
}

}  // namespace
}  // namespace traincoord
