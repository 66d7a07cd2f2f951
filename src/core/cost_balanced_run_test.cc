// Cost-balanced step mode in the run (schedule.batch_budget, docs/SEMANTICS.md "Cost-balanced
// step mode"): each epoch is planned by plan_epoch_steps from the lengths, the seed and the cost
// model frozen when it is laid out; the ranks' reported batch times fit the model, and the next
// epoch is planned with it. Lockstep, each sample once per epoch, requeues to the same rank,
// restores at another world size, and the same plan after a snapshot and after a replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/cost_test_config.h"
#include "core/run.h"
#include "core/run_codec.h"
#include "core/step_plan.h"

namespace traincoord {
namespace {

using testing::cost_config;
using testing::lengths_of;

// The true time of a batch: a + b·n·L + c·n·L² (seconds), rank `slow` twice as long.
double true_seconds(const RunConfig& c, const Job& job, uint32_t slow) {
  const std::vector<double>& lengths = job.set == SetKind::kTrain ? c.train_lengths : c.dev_lengths;
  double longest = 0;
  for (uint64_t s : job.samples) longest = std::max(longest, lengths[s]);
  const double n = static_cast<double>(job.samples.size());
  const double t = 0.002 + n * (0.0005 * longest + 0.00002 * longest * longest);
  return job.rank == slow ? 2 * t : t;
}

struct Key {
  SetKind set;
  int64_t epoch;
  auto operator<=>(const Key&) const = default;
};

class CostBalancedRun : public ::testing::Test {
 protected:
  std::vector<WorkerId> group(traincoord::Run& run, const std::string& name, uint32_t w) {
    std::vector<WorkerId> ids;
    for (uint32_t r = 0; r < w; ++r) {
      EXPECT_TRUE(run.join_group(name));
      ids.push_back(run.join(name + "-rank" + std::to_string(r), name, GroupRank{r, w}));
    }
    return ids;
  }
  // Completes `job` with its true time (rank `slow_` twice as slow); counts its samples.
  void train(traincoord::Run& run, WorkerId w, const Job& job) {
    ASSERT_TRUE(job.step_mode);
    Completion c{1.0, job.samples.size(), {}};
    c.seconds = true_seconds(run.config(), job, slow_);
    auto done = run.complete(w, job.lease, c);
    ASSERT_TRUE(done) << done.error().message;
    if (done->counted()) {
      for (uint64_t s : job.samples) trained_[{job.set, job.epoch}][s] += 1;
    }
  }
  // The ranks in lockstep until the run ends (at most `rounds` steps); checks each step.
  void train_in_lockstep(traincoord::Run& run, const std::vector<WorkerId>& ranks,
                         int rounds = 1000) {
    const uint32_t w = static_cast<uint32_t>(ranks.size());
    for (int round = 0; round < rounds && !run.finished(); ++round) {
      std::vector<Job> step;
      for (uint32_t r = 0; r < w; ++r) {
        auto a = run.acquire(ranks[r]);
        ASSERT_TRUE(a);
        if (a->status != AcquireStatus::kJob) continue;
        EXPECT_EQ(a->job.rank, r);
        step.push_back(a->job);
      }
      ASSERT_TRUE(step.size() == w || step.empty()) << "a step without every rank";
      double scale = 0;
      for (const Job& j : step) {
        EXPECT_EQ(j.step, step[0].step);
        EXPECT_EQ(j.steps, step[0].steps);
        scale += j.loss_scale;
        steps_[{j.set, j.epoch}][j.rank] += 1;
      }
      if (!step.empty()) {
        EXPECT_NEAR(scale, static_cast<double>(w), 1e-9);
      }
      for (uint32_t r = 0; r < step.size(); ++r) train(run, ranks[r], step[r]);
    }
  }
  void expect_each_sample_once(const RunConfig& c) {
    EXPECT_FALSE(trained_.empty());
    for (const auto& [key, counts] : trained_) {
      const uint64_t n = key.set == SetKind::kTrain ? c.train_samples : c.dev_samples;
      EXPECT_EQ(counts.size(), n) << set_name(key.set) << " epoch " << key.epoch;
      for (const auto& [sample, times] : counts) {
        EXPECT_EQ(times, 1u) << "sample " << sample << " of " << set_name(key.set) << " epoch "
                             << key.epoch;
      }
    }
  }
  ManualClock clock_;
  uint32_t slow_ = 1;
  std::map<Key, std::map<uint64_t, uint64_t>> trained_;
  std::map<Key, std::map<uint32_t, uint64_t>> steps_;
};

TEST_F(CostBalancedRun, EveryRankGetsTheSameStepsAndEverySampleOnceUnderTheBudget) {
  const RunConfig config = cost_config();
  traincoord::Run run(config, clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 3);
  // Epoch 0 is planned with the declared cost: every batch's padded length within the budget
  // (but a sample longer than the budget, alone).
  auto first = run.acquire(ranks[0]);
  ASSERT_TRUE(first && first->status == AcquireStatus::kJob);
  const Epoch& e0 = run.epochs()[0];
  ASSERT_TRUE(e0.steps());
  EXPECT_EQ(e0.plan_cost.describe(), config.cost.describe());
  EXPECT_TRUE(e0.plan_speeds.empty());
  const StepPlan& plan = run.cost_plan(e0);
  EXPECT_EQ(plan,
            plan_epoch_steps(
                StepPlanConfig{3, 5, SetKind::kTrain, 0, 60, config.cost, {}, BucketOptions{}}, 157,
                config.train_lengths, 0));
  for (const Step& s : plan.steps) {
    for (const RankBatch& b : s.batches) {
      if (b.samples.size() > 1) {
        EXPECT_LE(config.cost.padded(b.shape()), 60.0 + 1e-9);
      }
    }
  }
  EXPECT_GT(plan.buckets, 1u);
  ASSERT_TRUE(run.release(ranks[0], {first->job.lease}));
  train_in_lockstep(run, ranks);
  EXPECT_EQ(run.state(), RunState::kCompleted);
  expect_each_sample_once(config);
  for (const auto& [key, per_rank] : steps_) {
    EXPECT_EQ(per_rank.size(), 3u);
    EXPECT_EQ(per_rank.at(0), per_rank.at(1));
    EXPECT_EQ(per_rank.at(0), per_rank.at(2));
  }
  for (const Epoch& e : run.epochs()) {
    EXPECT_EQ(e.samples, e.plan.set == SetKind::kTrain ? 157u : 23u);
  }
}

TEST_F(CostBalancedRun, ReportedTimesFitTheModelAndTheNextEpochGivesTheSlowRankLess) {
  const RunConfig config = cost_config();
  traincoord::Run run(config, clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 2);
  EXPECT_EQ(run.cost_model(), nullptr);
  train_in_lockstep(run, ranks);
  ASSERT_EQ(run.state(), RunState::kCompleted);
  expect_each_sample_once(config);
  const CostModel* model = run.cost_model();
  ASSERT_NE(model, nullptr);
  EXPECT_TRUE(model->fitted());
  EXPECT_NEAR(model->speed(1), 2.0, 0.02);  // rank 1 is twice as slow
  EXPECT_NEAR(model->shared().c, 0.00002, 0.000002);
  // Epoch 0 was planned with the declared cost; train epoch 1 with the fitted one, frozen.
  const Epoch* train1 = nullptr;
  for (const Epoch& e : run.epochs()) {
    if (e.plan.set == SetKind::kTrain && e.plan.epoch == 1) train1 = &e;
  }
  ASSERT_NE(train1, nullptr);
  ASSERT_EQ(train1->plan_speeds.size(), 2u);
  EXPECT_NEAR(train1->plan_speeds[1], 2.0, 0.05);
  EXPECT_GT(train1->plan_cost.c, 0);  // the fitted model's quadratic term
  // So the slow rank's batches were about half the cost of the fast rank's.
  const StepPlan& plan = run.cost_plan(*train1);
  double fast = 0, slow = 0;
  for (const Step& s : plan.steps) {
    fast += train1->plan_cost.padded(s.batches[0].shape());
    slow += train1->plan_cost.padded(s.batches[1].shape());
  }
  EXPECT_LT(slow, 0.7 * fast);
  EXPECT_GT(slow, 0.35 * fast);
}

// Runs the same requests (two groups, a cut, a restore at another world size, leases that
// expire) and returns the run's snapshot: a journal replays exactly such a sequence.
std::string drive(ManualClock& clock, traincoord::Run& run, uint32_t w1, uint32_t w2,
                  int before_cut) {
  auto join = [&](const std::string& name, uint32_t w) {
    std::vector<WorkerId> ids;
    for (uint32_t r = 0; r < w; ++r) {
      (void)run.join_group(name);
      ids.push_back(run.join(name + "-" + std::to_string(r), name, GroupRank{r, w}));
    }
    return ids;
  };
  auto step = [&](const std::vector<WorkerId>& ranks) {
    std::vector<Job> jobs;
    for (WorkerId id : ranks) {
      auto a = run.acquire(id);
      if (a && a->status == AcquireStatus::kJob) jobs.push_back(a->job);
    }
    for (size_t r = 0; r < jobs.size(); ++r) {
      Completion c{0.5, jobs[r].samples.size(), {}};
      c.seconds = true_seconds(run.config(), jobs[r], 1);
      (void)run.complete(ranks[r], jobs[r].lease, c);
    }
  };
  const std::vector<WorkerId> g1 = join("g1", w1);
  for (int k = 0; k < before_cut && !run.finished(); ++k) step(g1);
  uint64_t cut = 0;
  for (uint32_t r = 0; r < w1; ++r) {
    auto share = run.cut(g1[r], "g1", 1, r, w1, {});
    if (share && share->complete) cut = share->cut;
  }
  for (int k = 0; k < 3; ++k) step(g1);  // undone by the restore
  (void)run.acquire(g1[0]);
  clock.advance(5000);
  run.expire_leases();
  const std::vector<WorkerId> g2 = join("g2", w2);
  (void)run.restore("g2", cut);
  for (int k = 0; k < 10 && !run.finished(); ++k) step(g2);
  return RunCodec::save(run);
}

TEST_F(CostBalancedRun, AReplayOfTheSameRequestsGivesTheSameModelAndPlansBitForBit) {
  const RunConfig config = cost_config();
  ManualClock clock_a, clock_b;
  traincoord::Run a(config, clock_a), b(config, clock_b);
  const std::string bytes_a = drive(clock_a, a, 2, 3, 70);
  const std::string bytes_b = drive(clock_b, b, 2, 3, 70);
  EXPECT_EQ(bytes_a, bytes_b);
  ASSERT_NE(a.cost_model(), nullptr);
  EXPECT_TRUE(a.cost_model()->fitted());
  // The epoch laid out after the model was fitted carries it, frozen.
  bool frozen = false;
  for (const Epoch& e : a.epochs()) frozen = frozen || !e.plan_speeds.empty();
  EXPECT_TRUE(frozen);
}

TEST_F(CostBalancedRun, ASnapshotRestoresTheFrozenModelTheModelAndTheSamePlan) {
  const RunConfig config = cost_config();
  ManualClock clock;
  traincoord::Run run(config, clock);
  (void)drive(clock, run, 2, 3, 70);
  const std::string bytes = RunCodec::save(run);
  auto loaded = RunCodec::load(config, bytes, clock);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(RunCodec::save(**loaded), bytes);
  ASSERT_NE((*loaded)->cost_model(), nullptr);
  EXPECT_EQ((*loaded)->cost_model()->shared().describe(), run.cost_model()->shared().describe());
  EXPECT_EQ((*loaded)->cost_model()->speeds(), run.cost_model()->speeds());
  for (size_t i = 0; i < run.epochs().size(); ++i) {
    const Epoch& here = run.epochs()[i];
    const Epoch& there = (*loaded)->epochs()[i];
    EXPECT_EQ(there.plan_speeds, here.plan_speeds);
    if (here.steps() && !here.closed()) {
      EXPECT_EQ((*loaded)->cost_plan(there), run.cost_plan(here)) << "epoch slot " << i;
    }
  }
  // The next batches, from both.
  for (uint32_t r = 0; r < 3; ++r) {
    const WorkerId id = *run.worker_id("g2-" + std::to_string(r));
    auto here = run.acquire(id);
    auto there = (*loaded)->acquire(id);
    ASSERT_TRUE(here && there);
    ASSERT_EQ(here->status, there->status);
    if (here->status == AcquireStatus::kJob) {
      EXPECT_EQ(here->job.samples, there->job.samples);
      EXPECT_EQ(here->job.loss_scale, there->job.loss_scale);
    }
  }
  // A damaged model is refused, naming it: its report count (the varint before the reference
  // fit, 3 + ranks doubles before the series and the mode at the end) one more than its ranks'
  // counts.
  const CostModel& model = *run.cost_model();
  ASSERT_LT(model.reports() + 1, 128u * 128u);
  const size_t varint = model.reports() < 128 ? 1 : 2;
  ASSERT_EQ(varint, model.reports() + 1 < 128 ? 1u : 2u);
  std::string damaged = bytes;
  const size_t at = damaged.size() - 1 - RunCodec::format10_bytes(run).size() -
                    8 * (3 + model.ranks()) - varint;  // (then the series, the mode)
  const uint64_t more = model.reports() + 1;
  if (varint == 1) {
    damaged[at] = static_cast<char>(more);
  } else {
    damaged[at] = static_cast<char>((more & 0x7f) | 0x80);
    damaged[at + 1] = static_cast<char>(more >> 7);
  }
  auto refused = RunCodec::load(config, damaged, clock);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("cost model"), std::string::npos)
      << refused.error().message;
  // And a frozen model loaded with a config of fixed batches is refused.
  RunConfig fixed = config;
  fixed.batch_budget = 0;
  fixed.train_lengths.clear();
  fixed.dev_lengths.clear();
  fixed.batch_size = 4;
  fixed.train_batches = 40;
  fixed.dev_batches = 6;
  ASSERT_TRUE(validate(fixed));
  EXPECT_FALSE(RunCodec::load(fixed, bytes, clock));
}

TEST_F(CostBalancedRun, AFormat8SnapshotStillLoads) {
  RunConfig config;
  config.name = "fixed";
  config.mode = ScheduleMode::kSteps;
  config.batch_size = 4;
  config.train_samples = 20;
  config.train_batches = 5;
  config.validation_every = 0;
  traincoord::Run run(config, clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 2);
  ASSERT_TRUE(run.acquire(ranks[0]));
  const std::string bytes = RunCodec::save(run);
  // Format 10's tail: the series, the mode, steps (1). Format 9's before it: per epoch three
  // doubles 0.0 and no speeds (25 zero bytes), no model (1).
  ASSERT_EQ(bytes.back(), '\1');
  const size_t ten = 1 + RunCodec::format10_bytes(run).size();
  const size_t tail = 25 * run.epochs().size() + 1;
  ASSERT_EQ(bytes.substr(bytes.size() - ten - tail, tail), std::string(tail, '\0'));
  std::string v8 = bytes.substr(0, bytes.size() - ten - tail);
  ASSERT_EQ(v8[5], 10);
  v8[5] = 8;
  auto old = RunCodec::load(config, v8, clock_);
  ASSERT_TRUE(old) << old.error().message;
  EXPECT_EQ(RunCodec::save(**old), bytes);
}

TEST_F(CostBalancedRun, AnExpiredBatchGoesBackToItsRankWithTheSameSamples) {
  const RunConfig config = cost_config();
  traincoord::Run run(config, clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 2);
  auto a0 = run.acquire(ranks[0]);
  auto a1 = run.acquire(ranks[1]);
  ASSERT_TRUE(a0 && a1);
  train(run, ranks[0], a0->job);
  clock_.advance(2000);
  run.expire_leases();
  auto again0 = run.acquire(ranks[0]);
  ASSERT_TRUE(again0 && again0->status == AcquireStatus::kJob);
  EXPECT_EQ(again0->job.step, 1u);
  auto again1 = run.acquire(ranks[1]);
  ASSERT_TRUE(again1 && again1->status == AcquireStatus::kJob);
  EXPECT_EQ(again1->job.step, 0u);
  EXPECT_EQ(again1->job.samples, a1->job.samples);
  EXPECT_EQ(again1->job.attempt, 2u);
}

// Groups die and restore their latest cut at random world sizes while ranks prefetch, report
// times and leases expire: each sample of each epoch once in the final lineage.
TEST_F(CostBalancedRun, SeededRestoresAtOtherWorldSizesTrainEachSampleOnce) {
  uint64_t relaid = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    trained_.clear();
    RunConfig config = cost_config();
    config.seed = seed;
    config.batch_budget = 30 + static_cast<double>(seed % 4) * 20;
    traincoord::Run run(config, clock_);
    uint64_t groups = 0, seq = 0;
    std::vector<WorkerId> ranks;
    std::string name;
    std::map<uint64_t, decltype(trained_)> at_cut;
    auto start_group = [&](bool restore) {
      const uint32_t w = 1 + static_cast<uint32_t>(rng() % 4);
      name = "g" + std::to_string(++groups);
      ranks = group(run, name, w);
      slow_ = w > 1 ? 1 : 7;
      if (const Cut* latest = run.latest_cut(); restore && latest != nullptr) {
        const uint64_t id = latest->id;
        relaid += latest->world_size != w ? 1 : 0;
        auto restored = run.restore(name, id);
        ASSERT_TRUE(restored) << restored.error().message;
        trained_ = at_cut[id];
      }
    };
    start_group(false);
    for (int round = 0; round < 4000 && !run.finished(); ++round) {
      const uint64_t event = rng() % 100;
      if (event < 3) {
        start_group(true);
        continue;
      }
      if (event < 8) {
        ++seq;
        for (uint32_t r = 0; r < ranks.size(); ++r) {
          auto share = run.cut(ranks[r], name, seq, r, static_cast<uint32_t>(ranks.size()), {});
          ASSERT_TRUE(share) << share.error().message;
          if (share->complete) at_cut[share->cut] = trained_;
        }
        continue;
      }
      if (event < 10) {
        clock_.advance(1500);
        run.expire_leases();
        continue;
      }
      std::vector<Job> step;
      for (WorkerId id : ranks) {
        auto a = run.acquire(id);
        ASSERT_TRUE(a);
        if (a->status == AcquireStatus::kJob) step.push_back(a->job);
      }
      for (size_t r = 0; r < step.size(); ++r) train(run, ranks[r], step[r]);
    }
    ASSERT_EQ(run.state(), RunState::kCompleted);
    expect_each_sample_once(config);
    // A snapshot of the finished run loads (every frozen model a plan takes).
    ASSERT_TRUE(RunCodec::load(config, RunCodec::save(run), clock_));
  }
  EXPECT_GT(relaid, 5u);
}

// Found by the seeded restores above: the rest of an epoch (69 samples, 4 ranks) fits one
// step, which the runs deal gave to three ranks; the fourth takes a sample from the step itself.
TEST(CostBalancedPlan, AOneStepRestLendsToTheRankItDealtNothing) {
  const std::vector<double> lengths = lengths_of(157, 1);
  const std::vector<uint64_t> untrained = {
      3,   11,  12,  13,  14,  16,  22,  24,  30,  31,  34,  35,  38,  39,  42,  44,  48,  50,
      51,  55,  56,  58,  62,  65,  66,  68,  69,  71,  73,  74,  76,  78,  80,  81,  82,  84,
      86,  87,  88,  96,  97,  98,  100, 102, 108, 110, 111, 112, 113, 115, 117, 118, 120, 121,
      127, 129, 131, 134, 135, 136, 137, 138, 140, 141, 142, 145, 149, 151, 154};
  StepPlanConfig c;
  c.ranks = 4;
  c.seed = 6;
  c.batch_budget = 70;
  c.cost = BatchCost{0, 1, 0};
  const StepPlan plan = plan_rest_of_epoch(c, 157, lengths, 0, untrained);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.samples(), untrained.size());
  for (const RankBatch& b : plan.steps[0].batches) EXPECT_FALSE(b.samples.empty());
}

TEST(CostBalancedConfig, NeedsOneLengthPerSampleABudgetAndACost) {
  auto field_of = [](const RunConfig& x) {
    auto r = validate(x);
    return r ? std::string() : r.error().field;
  };
  const RunConfig c = cost_config();
  EXPECT_EQ(field_of(c), "");
  RunConfig x = c;
  x.train_lengths.pop_back();
  EXPECT_EQ(field_of(x), "data.train_lengths");
  x = c;
  x.dev_lengths[3] = -1;
  EXPECT_EQ(field_of(x), "data.dev_lengths");
  x = c;
  x.batch_size = 4;
  EXPECT_EQ(field_of(x), "data.batch_size");
  x = c;
  x.cost = BatchCost{1, 0, 0};
  EXPECT_EQ(field_of(x), "schedule.cost_b");
  x = c;
  x.mode = ScheduleMode::kJobs;
  EXPECT_EQ(field_of(x), "schedule.batch_budget");
  x = c;
  x.batch_budget = 0;  // lengths without a budget
  EXPECT_EQ(field_of(x), "data.train_lengths");
}

}  // namespace
}  // namespace traincoord
