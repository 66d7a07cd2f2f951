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
    c.seconds = no_seconds_ ? 0 : true_seconds(run.config(), job, slow_);
    if (pause_every_ > 0 && ++completions_ % pause_every_ == 0) c.seconds *= 3;  // a pause
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
        warming_[{a->job.set, a->job.epoch}][{a->job.step, r}] = run.warming_up(a->job);
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
  uint64_t pause_every_ = 0;  // every so many completions' time ×3 (0: none)
  bool no_seconds_ = false;   // complete without `seconds` (a loop that reports no times)
  // Run::warming_up of each job, by (step, rank)
  std::map<Key, std::map<std::pair<uint64_t, uint32_t>, bool>> warming_;
  uint64_t completions_ = 0;
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
  const size_t at = damaged.size() - RunCodec::format11_bytes(run).size() - 1 -
                    RunCodec::format10_bytes(run).size() - 8 * (3 + model.ranks()) -
                    varint;  // (then the series, the mode, the re-plans)
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
  // Format 11's tail: no epoch re-planned (a 0 each). Format 10's before it: the series, the
  // mode, steps (1). Format 9's before that: per epoch three doubles 0.0 and no speeds (25 zero
  // bytes), no model (1).
  const size_t eleven = run.epochs().size();
  ASSERT_EQ(bytes.substr(bytes.size() - eleven), std::string(eleven, '\0'));
  ASSERT_EQ(bytes[bytes.size() - eleven - 1], '\1');
  const size_t ten = eleven + 1 + RunCodec::format10_bytes(run).size();
  const size_t tail = 25 * run.epochs().size() + 1;
  ASSERT_EQ(bytes.substr(bytes.size() - ten - tail, tail), std::string(tail, '\0'));
  std::string v8 = bytes.substr(0, bytes.size() - ten - tail);
  ASSERT_EQ(v8[5], 11);
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

// ---- the warm-up re-plan (Epoch::replanned_after) ----

// The true time of a planned batch (as true_seconds), rank `slow` twice as long.
double true_time(const std::vector<double>& lengths, const RankBatch& b, uint32_t rank,
                 uint32_t slow) {
  if (b.samples.empty()) return 0;
  double longest = 0;
  for (uint64_t s : b.samples) longest = std::max(longest, lengths[s]);
  const double n = static_cast<double>(b.samples.size());
  const double t = 0.002 + n * (0.0005 * longest + 0.00002 * longest * longest);
  return rank == slow ? 2 * t : t;
}

// A plan's epoch time (Σ over steps of the slowest batch) and straggling S (mean over steps of
// the slowest batch's time over the mean batch's), under the true times.
struct TrueFigures {
  double time = 0;
  double straggling = 0;
};
TrueFigures true_figures(const StepPlan& plan, const std::vector<double>& lengths, uint32_t slow) {
  TrueFigures f;
  for (const Step& s : plan.steps) {
    double slowest = 0, sum = 0;
    for (uint32_t r = 0; r < s.batches.size(); ++r) {
      const double t = true_time(lengths, s.batches[r], r, slow);
      slowest = std::max(slowest, t);
      sum += t;
    }
    f.time += slowest;
    f.straggling += slowest / (sum / static_cast<double>(s.batches.size()));
  }
  f.straggling /= static_cast<double>(plan.steps.size());
  return f;
}

RunConfig one_epoch_config() {
  RunConfig c = cost_config();
  c.epochs = 1;
  c.validation_every = 0;
  return c;
}

// A run of one epoch (an LLM's, or any long one): the first epoch is planned with the declared
// cost, every rank alike; once the model is fitted with every rank's speed (8 reports, 3 of
// each rank: 4 steps of 2 ranks), the next hand-out re-plans the steps not begun, and the slow
// rank gets about half the work per step for the rest of that same epoch.
TEST_F(CostBalancedRun, TheFirstEpochIsRePlannedOnceTheModelIsFittedAndTheSlowRankGetsLess) {
  RunConfig config = one_epoch_config();  // batches of a few dozen samples, not of a few
  config.train_samples = config.train_batches = 2000;
  config.train_lengths = lengths_of(2000, 1);
  config.batch_budget = 400;
  traincoord::Run run(config, clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 2);
  train_in_lockstep(run, ranks);
  ASSERT_EQ(run.state(), RunState::kCompleted);
  expect_each_sample_once(config);
  ASSERT_EQ(steps_.size(), 1u);
  EXPECT_EQ(steps_.begin()->second.at(0), steps_.begin()->second.at(1));
  ASSERT_EQ(run.epochs().size(), 1u);
  const Epoch& e = run.epochs()[0];
  EXPECT_EQ(e.replanned_after, 4u);  // the hand-out after the 8th report
  EXPECT_EQ(e.first_cost.describe(), config.cost.describe());
  ASSERT_EQ(e.plan_speeds.size(), 2u);
  EXPECT_NEAR(e.plan_speeds[1], 2.0, 0.1);
  EXPECT_NEAR(e.plan_speeds[0], 1.0, 1e-9);
  const StepPlan& plan = run.cost_plan(e);
  EXPECT_EQ(steps_.begin()->second.at(0), plan.steps.size());
  // The steps kept are the declared plan's; the rest gives the slow rank about half.
  const StepPlan declared = plan_epoch_steps(
      StepPlanConfig{2, config.seed, SetKind::kTrain, 0, 400, config.cost, {}, BucketOptions{}},
      2000, config.train_lengths, 0);
  ASSERT_GT(declared.steps.size(), 8u);
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(plan.steps[k], declared.steps[k]) << "step " << k;
  auto ratio = [&](const StepPlan& p, size_t from, size_t to) {  // slow ÷ fast, at speed 1
    double fast = 0, slow = 0;
    for (size_t k = from; k < to; ++k) {
      fast += true_time(config.train_lengths, p.steps[k].batches[0], 0, 9);
      slow += true_time(config.train_lengths, p.steps[k].batches[1], 1, 9);
    }
    return slow / fast;
  };
  const size_t last = plan.steps.size() - 1;  // (the last step splits what is left)
  EXPECT_NEAR(ratio(declared, 0, declared.steps.size() - 1), 1.0, 0.35);
  EXPECT_NEAR(ratio(plan, 4, last), 0.5, 0.15);
  // So the epoch straggles less and takes less time than planned blind throughout.
  const TrueFigures with = true_figures(plan, config.train_lengths, 1);
  const TrueFigures without = true_figures(declared, config.train_lengths, 1);
  EXPECT_LT(with.straggling, without.straggling - 0.1);
  EXPECT_LT(with.time, 0.9 * without.time);
  // Once: the event says it.
  int replans = 0;
  for (const Event& ev : run.events()) replans += ev.kind == EventKind::kEpochReplanned;
  EXPECT_EQ(replans, 1);
  // Until then its jobs said the epoch was warming up (the API's `warming_up`: a client sends
  // its reports at once and holds few steps ahead), and not from then on.
  const auto& warming = warming_[{SetKind::kTrain, 0}];
  ASSERT_EQ(warming.size(), 2 * plan.steps.size());
  for (const auto& [job, said] : warming) {
    EXPECT_EQ(said, job.first < e.replanned_after)
        << "step " << job.first << " rank " << job.second;
  }
}

// Ranks that report no times never let the model fit: the epoch is not said to be warming up
// once their first completions came without any (found by review: else a client fetched one
// step per round trip for the whole run).
TEST_F(CostBalancedRun, RanksThatReportNoTimesAreNotToldTheEpochIsWarmingUp) {
  RunConfig config = one_epoch_config();
  config.train_samples = config.train_batches = 2000;
  config.train_lengths = lengths_of(2000, 1);
  config.batch_budget = 400;
  no_seconds_ = true;
  traincoord::Run run(config, clock_);
  train_in_lockstep(run, group(run, "g", 2));
  ASSERT_EQ(run.state(), RunState::kCompleted);
  expect_each_sample_once(config);
  EXPECT_EQ(run.cost_model(), nullptr);
  const auto& warming = warming_[{SetKind::kTrain, 0}];
  ASSERT_GT(warming.size(), 8u);
  for (const auto& [job, said] : warming) EXPECT_EQ(said, job.first == 0) << job.first;
}

// A run stored by a build before the warm-up re-plan (RunConfig::warm_up_replan false: its
// stored config's format says so) trains its first epoch on the declared plan throughout, as
// that build answered it: its journal replays the same (found by review).
TEST_F(CostBalancedRun, ARunStoredBeforeTheWarmUpRePlanKeepsItsDeclaredPlan) {
  RunConfig config = one_epoch_config();
  config.train_samples = config.train_batches = 2000;
  config.train_lengths = lengths_of(2000, 1);
  config.batch_budget = 400;
  config.warm_up_replan = false;
  traincoord::Run run(config, clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 2);
  train_in_lockstep(run, ranks);
  ASSERT_EQ(run.state(), RunState::kCompleted);
  expect_each_sample_once(config);
  const Epoch& e = run.epochs()[0];
  EXPECT_EQ(e.replanned_after, 0u);
  EXPECT_TRUE(e.plan_speeds.empty());
  const StepPlan& plan = run.cost_plan(e);
  const StepPlan declared = plan_epoch_steps(
      StepPlanConfig{2, config.seed, SetKind::kTrain, 0, 400, config.cost, {}, BucketOptions{}},
      2000, config.train_lengths, 0);
  ASSERT_EQ(plan.steps.size(), declared.steps.size());
  for (size_t k = 0; k < plan.steps.size(); ++k) EXPECT_EQ(plan.steps[k], declared.steps[k]);
  for (const Event& ev : run.events()) EXPECT_NE(ev.kind, EventKind::kEpochReplanned);
  for (const auto& [job, said] : warming_[{SetKind::kTrain, 0}]) EXPECT_FALSE(said) << job.first;
}

// The cost model's fit follows the run's rules (RunConfig::declared_shape_fit, decided by the
// format its config was stored in): a run stored before it fits as that build did, and a
// snapshot restores the model under the rules of the config it is loaded with, the same fit bit
// for bit. With paused reports the two rules give different models: the plumbing is live.
TEST_F(CostBalancedRun, TheCostModelFitsUnderTheRunsStoredRules) {
  RunConfig config = one_epoch_config();
  config.epochs = 2;
  config.train_samples = config.train_batches = 600;
  config.train_lengths = lengths_of(600, 1);
  config.batch_budget = 400;
  config.cost = BatchCost{4, 1, 0.04};  // the true shape (true_seconds ×2000)
  pause_every_ = 7;
  std::vector<BatchCost> fits;
  for (const bool rule : {true, false}) {
    config.declared_shape_fit = rule;
    trained_.clear();
    completions_ = 0;
    traincoord::Run run(config, clock_);
    train_in_lockstep(run, group(run, "g", 2));
    ASSERT_EQ(run.state(), RunState::kCompleted);
    expect_each_sample_once(config);
    ASSERT_NE(run.cost_model(), nullptr);
    const BatchCost fit = run.cost_model()->shared();
    auto loaded = RunCodec::load(config, RunCodec::save(run), clock_);
    ASSERT_TRUE(loaded);
    ASSERT_NE((*loaded)->cost_model(), nullptr);
    const BatchCost again = (*loaded)->cost_model()->shared();
    EXPECT_EQ(again.a, fit.a);
    EXPECT_EQ(again.b, fit.b);
    EXPECT_EQ(again.c, fit.c);
    EXPECT_EQ((*loaded)->cost_model()->speeds(), run.cost_model()->speeds());
    fits.push_back(fit);
  }
  EXPECT_NE(fits[0].describe(), fits[1].describe());
}

// A rank ahead of the others (prefetch) has begun steps whose other batches wait, queued, for
// their ranks: the re-plan keeps every step up to the furthest begun, and the rank behind gets
// the very batches it would have had.
TEST_F(CostBalancedRun, TheRePlanKeepsEveryStepARankAheadBegan) {
  const RunConfig config = one_epoch_config();
  traincoord::Run run(config, clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 2);
  std::map<uint32_t, uint64_t> steps_of_rank;
  auto take = [&](uint32_t r, uint32_t n) {
    auto a = run.acquire(ranks[r], 0, n);
    EXPECT_TRUE(a && a->status == AcquireStatus::kJob);
    std::vector<Job> jobs;
    if (!a || a->status != AcquireStatus::kJob) return jobs;
    jobs.push_back(a->job);
    jobs.insert(jobs.end(), a->more.begin(), a->more.end());
    for (const Job& j : jobs) EXPECT_EQ(j.rank, r);
    steps_of_rank[r] += jobs.size();
    return jobs;
  };
  for (int k = 0; k < 3; ++k) {  // 6 reports: not fitted
    const Job j0 = take(0, 1).at(0), j1 = take(1, 1).at(0);
    train(run, ranks[0], j0);
    train(run, ranks[1], j1);
  }
  const std::vector<Job> ahead = take(0, 4);  // rank 0: steps 3 to 6
  ASSERT_EQ(ahead.size(), 4u);
  EXPECT_EQ(ahead.back().step, 6u);
  const Job behind = take(1, 1).at(0);  // rank 1: step 3
  EXPECT_EQ(behind.step, 3u);
  train(run, ranks[0], ahead[0]);
  train(run, ranks[1], behind);  // the 8th report: fitted, every rank's speed
  ASSERT_TRUE(run.cost_model()->fitted_for_every_rank());
  const StepPlan before = run.cost_plan(run.epochs()[0]);
  EXPECT_EQ(run.epochs()[0].replanned_after, 0u);
  const std::vector<Job> next = take(1, 3);  // re-plans, then steps 4 to 6 as planned before
  const Epoch& e = run.epochs()[0];
  EXPECT_EQ(e.replanned_after, 7u);
  ASSERT_EQ(next.size(), 3u);
  for (const Job& j : next) {
    EXPECT_EQ(j.samples, before.steps[j.step].batches[1].samples) << "step " << j.step;
  }
  // (A copy: the run drops its cached plan when the epoch closes, below.)
  const StepPlan after = run.cost_plan(e);
  for (size_t k = 0; k < 7; ++k) EXPECT_EQ(after.steps[k], before.steps[k]) << "step " << k;
  EXPECT_NE(after.steps[7], before.steps[7]);
  for (size_t i = 1; i < ahead.size(); ++i) train(run, ranks[0], ahead[i]);
  for (const Job& j : next) train(run, ranks[1], j);
  train_in_lockstep(run, ranks);
  ASSERT_EQ(run.state(), RunState::kCompleted);
  expect_each_sample_once(config);
  const uint64_t lockstep = steps_.begin()->second.at(0);
  EXPECT_EQ(steps_of_rank[0] + lockstep, after.steps.size());
  EXPECT_EQ(steps_of_rank[1] + steps_.begin()->second.at(1), after.steps.size());
}

// The requests of a run whose first epoch is re-planned while rank 0 is ahead, a cut after it,
// and batches in flight at the end: a journal replays exactly such a sequence.
std::string drive_warm_up(traincoord::Run& run, std::vector<WorkerId>* ids) {
  for (uint32_t r = 0; r < 2; ++r) {
    (void)run.join_group("g");
    ids->push_back(run.join("g-" + std::to_string(r), "g", GroupRank{r, 2}));
  }
  auto report = [&](uint32_t r, const Job& j) {
    Completion c{0.5, j.samples.size(), {}};
    c.seconds = true_seconds(run.config(), j, 1);
    (void)run.complete((*ids)[r], j.lease, c);
  };
  for (int k = 0; k < 3; ++k) {
    const auto a = run.acquire((*ids)[0]);
    const auto b = run.acquire((*ids)[1]);
    report(0, a->job);
    report(1, b->job);
  }
  const auto ahead = run.acquire((*ids)[0], 0, 3);
  const auto behind = run.acquire((*ids)[1]);
  report(0, ahead->job);
  report(1, behind->job);
  const auto next = run.acquire((*ids)[1], 0, 2);  // the re-plan
  for (const Job& j : ahead->more) report(0, j);
  report(1, next->job);
  for (uint32_t r = 0; r < 2; ++r) (void)run.cut((*ids)[r], "g", 1, r, 2, {});
  (void)run.acquire((*ids)[0]);  // in flight at the snapshot
  return RunCodec::save(run);
}

TEST_F(CostBalancedRun, AReplayAndASnapshotAfterTheRePlanGiveTheSameStateAndPlan) {
  const RunConfig config = one_epoch_config();
  ManualClock clock_a, clock_b;
  traincoord::Run a(config, clock_a), b(config, clock_b);
  std::vector<WorkerId> ids_a, ids_b;
  const std::string bytes = drive_warm_up(a, &ids_a);
  EXPECT_EQ(drive_warm_up(b, &ids_b), bytes);
  const Epoch& e = a.epochs()[0];
  ASSERT_EQ(e.replanned_after, 6u);
  ASSERT_EQ(e.leased, 2u);  // rank 1's step 5, rank 0's step 6
  EXPECT_NE(RunCodec::format11_bytes(a), std::string(1, '\0'));
  // The snapshot loads to the same state, the same plan, the same next batches.
  auto loaded = RunCodec::load(config, bytes, clock_a);
  ASSERT_TRUE(loaded) << loaded.error().message;
  traincoord::Run& c = **loaded;
  EXPECT_EQ(RunCodec::save(c), bytes);
  EXPECT_EQ(c.epochs()[0].replanned_after, 6u);
  EXPECT_EQ(c.cost_plan(c.epochs()[0]), a.cost_plan(e));
  for (int k = 0; k < 4; ++k) {
    for (uint32_t r = 0; r < 2; ++r) {
      auto here = a.acquire(ids_a[r]);
      auto there = c.acquire(ids_a[r]);
      ASSERT_TRUE(here && there);
      ASSERT_EQ(here->status, there->status);
      if (here->status != AcquireStatus::kJob) continue;
      EXPECT_EQ(here->job.samples, there->job.samples);
      EXPECT_EQ(here->job.steps, there->job.steps);
    }
  }
  EXPECT_EQ(RunCodec::save(c), RunCodec::save(a));
  // A damaged re-plan is refused, naming it: kept steps past those begun (the first byte of
  // format 11's tail, after the mode).
  std::string damaged = bytes;
  const size_t at = damaged.size() - RunCodec::format11_bytes(b).size();
  ASSERT_EQ(damaged[at], '\6');
  damaged[at] = 100;
  auto refused = RunCodec::load(config, damaged, clock_a);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("re-planned"), std::string::npos)
      << refused.error().message;
  // A format 10 snapshot (no re-plan kept at its end) still loads, as not re-planned.
  traincoord::Run fresh(config, clock_b);
  std::vector<WorkerId> ids;
  for (uint32_t r = 0; r < 2; ++r) {
    (void)fresh.join_group("g");
    ids.push_back(fresh.join("g-" + std::to_string(r), "g", GroupRank{r, 2}));
  }
  ASSERT_TRUE(fresh.acquire(ids[0]));
  const std::string now = RunCodec::save(fresh);
  std::string v10 = now.substr(0, now.size() - RunCodec::format11_bytes(fresh).size());
  ASSERT_EQ(v10[5], 11);
  v10[5] = 10;
  auto old = RunCodec::load(config, v10, clock_b);
  ASSERT_TRUE(old) << old.error().message;
  EXPECT_EQ(RunCodec::save(**old), now);
}

// After the re-plan, a cut restored at another world size lays out the rest for it (the re-plan
// dropped, with the declared cost: the model is of the world size before); a cut from before it,
// restored at the same world size once the model is fitted, is re-planned at its first
// hand-out. Each sample once in both lineages.
TEST_F(CostBalancedRun, RestoresBeforeAndAfterTheRePlanTrainEachSampleOnce) {
  const RunConfig config = one_epoch_config();
  {
    traincoord::Run run(config, clock_);
    std::vector<WorkerId> g = group(run, "g", 2);
    train_in_lockstep(run, g, 6);
    ASSERT_EQ(run.epochs()[0].replanned_after, 4u);
    for (uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(run.cut(g[r], "g", 1, r, 2, {}));
    const auto at_cut = trained_;
    const uint64_t cut = run.latest_cut()->id;
    ASSERT_EQ(run.find_cut(cut)->saved.epochs[0].replanned_after, 4u);
    train_in_lockstep(run, g, 2);  // undone by the restore
    std::vector<WorkerId> h = group(run, "h", 3);
    ASSERT_TRUE(run.restore("h", cut));
    trained_ = at_cut;
    train_in_lockstep(run, h, 1);
    const Epoch& e = run.epochs()[0];
    EXPECT_EQ(e.ranks, 3u);
    EXPECT_EQ(e.replanned_after, 0u);
    EXPECT_TRUE(e.plan_speeds.empty());  // (the model is of 2 ranks)
    train_in_lockstep(run, h);
    ASSERT_EQ(run.state(), RunState::kCompleted);
    expect_each_sample_once(config);
  }
  trained_.clear();
  traincoord::Run run(config, clock_);
  std::vector<WorkerId> g = group(run, "g", 2);
  train_in_lockstep(run, g, 2);
  for (uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(run.cut(g[r], "g", 1, r, 2, {}));
  const auto at_cut = trained_;
  train_in_lockstep(run, g, 6);  // fitted, re-planned after 4
  ASSERT_EQ(run.epochs()[0].replanned_after, 4u);
  std::vector<WorkerId> k = group(run, "k", 2);
  ASSERT_TRUE(run.restore("k", run.latest_cut()->id));
  trained_ = at_cut;
  EXPECT_EQ(run.epochs()[0].replanned_after, 0u);  // as the cut saved it: planned blind
  EXPECT_TRUE(run.epochs()[0].plan_speeds.empty());
  train_in_lockstep(run, k, 1);
  EXPECT_EQ(run.epochs()[0].replanned_after, 2u);  // the steps the cut had begun
  train_in_lockstep(run, k);
  ASSERT_EQ(run.state(), RunState::kCompleted);
  expect_each_sample_once(config);
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
