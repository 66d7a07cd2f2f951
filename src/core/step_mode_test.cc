// Step mode in the run (schedule.mode = "steps", docs/SEMANTICS.md "Step mode"): a synchronous
// group gets one batch per rank per step, every rank the same number of steps, each sample of
// an epoch once, also across lease expiries, restores at the same and at another world size,
// and a snapshot.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "core/run.h"
#include "core/run_codec.h"
#include "core/sample_order.h"
#include "core/step_plan.h"

namespace traincoord {
namespace {

// ---- StepLayout: the plan of step_plan.h, computed a batch at a time ----

TEST(StepLayout, EveryBatchIsTheOneOfTheWholeEpochsPlan) {
  for (uint64_t m : {1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 64, 100, 257}) {
    for (uint64_t b : {1, 2, 3, 4, 8}) {
      for (uint32_t w : {1u, 2u, 3u, 4u, 7u, 8u}) {
        StepPlanConfig config;
        config.ranks = w;
        config.batch_size = b;
        config.seed = 11;
        const StepPlan plan = plan_epoch_steps(config, m, {}, 3);
        const StepLayout layout(m, b, w);
        ASSERT_EQ(layout.steps(), plan.steps.size()) << m << " " << b << " " << w;
        const SampleOrder order(m, 1, 11, SetKind::kTrain, SampleShuffle::kEpoch);
        for (uint64_t k = 0; k < layout.steps(); ++k) {
          for (uint32_t r = 0; r < w; ++r) {
            std::vector<uint64_t> places;
            layout.batch(k, r, &places);
            std::vector<uint64_t> samples;
            for (uint64_t p : places) samples.push_back(order.at(3, p));
            const RankBatch& expected = plan.steps[k].batches[r];
            ASSERT_EQ(samples, expected.samples) << m << " " << b << " " << w << " step " << k;
            ASSERT_DOUBLE_EQ(layout.loss_scale(k, r), expected.loss_scale);
          }
        }
      }
    }
  }
}

TEST(StepLayout, TheStepsFromOneOnHoldEveryPlaceFromItsFirstOn) {
  for (uint64_t m : {5, 9, 17, 64, 100}) {
    for (uint64_t b : {1, 2, 5}) {
      for (uint32_t w : {1u, 2u, 3u, 8u}) {
        const StepLayout layout(m, b, w);
        for (uint64_t step = 0; step <= layout.steps(); ++step) {
          std::vector<uint64_t> listed;
          const uint64_t first = layout.first_place_from(step, &listed);
          std::vector<uint64_t> expected;
          for (uint64_t k = step; k < layout.steps(); ++k) {
            for (uint32_t r = 0; r < w; ++r) layout.batch(k, r, &expected);
          }
          for (uint64_t p = first; p < m; ++p) listed.push_back(p);
          std::sort(listed.begin(), listed.end());
          std::sort(expected.begin(), expected.end());
          ASSERT_EQ(listed, expected) << m << " " << b << " " << w << " from " << step;
        }
      }
    }
  }
}

TEST(EpochSegment, MapsPlacesToThePositionsOfItsRuns) {
  const EpochSegment segment(EpochSegment::runs_of({9, 3, 4, 5, 20, 21, 10}));
  ASSERT_EQ(segment.runs().size(), 3u);  // 3-5, 9-10, 20-21
  EXPECT_EQ(segment.places(), 7u);
  std::vector<uint64_t> positions;
  for (uint64_t p = 0; p < segment.places(); ++p) positions.push_back(segment.position(p));
  EXPECT_EQ(positions, (std::vector<uint64_t>{3, 4, 5, 9, 10, 20, 21}));
  std::vector<PositionRun> runs;
  segment.runs_of_places(2, 6, &runs);
  ASSERT_EQ(runs.size(), 3u);  // places 2 … 5: positions 5, 9, 10, 20
  EXPECT_EQ(runs[0].first, 5u);
  EXPECT_EQ(runs[0].count, 1u);
  EXPECT_EQ(runs[1].first, 9u);
  EXPECT_EQ(runs[1].count, 2u);
  EXPECT_EQ(runs[2].first, 20u);
  EXPECT_EQ(runs[2].count, 1u);
  EXPECT_EQ(EpochSegment::merged({{10, 2}, {3, 7}}).size(), 1u);
}

// ---- the run ----

// 2 epochs of 23 train samples in batches of 2 (12 batches), a dev set of 5 samples.
RunConfig steps_config() {
  RunConfig c;
  c.name = "steps";
  c.mode = ScheduleMode::kSteps;
  c.batch_size = 2;
  c.train_samples = 23;
  c.train_batches = 12;
  c.dev_samples = 5;
  c.dev_batches = 3;
  c.epochs = 2;
  c.validation_every = 1;
  c.lease_timeout_ms = 1000;
  c.seed = 7;
  return c;
}

Completion report(uint64_t samples) { return Completion{1.0, samples, {}}; }

template <typename T>
std::string_view reason_of(const Result<T>& r) {
  return r ? std::string_view("ok") : r.error().reason;
}

struct Key {
  SetKind set;
  int64_t epoch;
  auto operator<=>(const Key&) const = default;
};

class StepModeTest : public ::testing::Test {
 protected:
  // Registers ranks 0 .. w-1 of `group`.
  std::vector<WorkerId> group(traincoord::Run& run, const std::string& name, uint32_t w) {
    std::vector<WorkerId> ids;
    for (uint32_t r = 0; r < w; ++r) {
      EXPECT_TRUE(run.check_rank(name + "-rank" + std::to_string(r), name, GroupRank{r, w}));
      EXPECT_TRUE(run.join_group(name));
      ids.push_back(run.join(name + "-rank" + std::to_string(r), name, GroupRank{r, w}));
    }
    return ids;
  }
  // Trains `job`: counts its samples as trained (into `trained`) and completes it.
  void train(traincoord::Run& run, WorkerId w, const Job& job) {
    ASSERT_TRUE(job.step_mode);
    for (uint64_t s : job.samples) trained_[{job.set, job.epoch}][s] += 1;
    auto done = run.complete(w, job.lease, report(job.samples.size()));
    ASSERT_TRUE(done) << done.error().message;
    ASSERT_TRUE(done->counted());
  }
  void expect_each_sample_once(uint64_t train, uint64_t dev) {
    for (const auto& [key, counts] : trained_) {
      const uint64_t n = key.set == SetKind::kTrain ? train : dev;
      EXPECT_EQ(counts.size(), n) << set_name(key.set) << " epoch " << key.epoch;
      for (const auto& [sample, times] : counts) {
        EXPECT_LT(sample, n);
        EXPECT_EQ(times, 1u) << "sample " << sample << " of " << set_name(key.set) << " epoch "
                             << key.epoch;
      }
    }
  }
  ManualClock clock_;
  std::map<Key, std::map<uint64_t, uint64_t>> trained_;
};

TEST_F(StepModeTest, EveryRankGetsTheSameStepsAndEverySampleIsTrainedOnce) {
  traincoord::Run run(steps_config(), clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 3);
  // The ranks move in lockstep, as DDP does: one batch each per step.
  std::map<Key, std::vector<uint64_t>> steps_of_rank[3];
  for (int round = 0; round < 100 && !run.finished(); ++round) {
    std::vector<Job> step;
    for (uint32_t r = 0; r < 3; ++r) {
      auto a = run.acquire(ranks[r]);
      ASSERT_TRUE(a);
      if (a->status != AcquireStatus::kJob) continue;
      EXPECT_EQ(a->job.rank, r);
      step.push_back(a->job);
      steps_of_rank[r][{a->job.set, a->job.epoch}].push_back(a->job.step);
    }
    ASSERT_TRUE(step.size() == 3 || step.empty()) << "a step without every rank";
    if (!step.empty()) {
      double scale = 0;
      uint64_t n = 0;
      for (const Job& j : step) {
        EXPECT_EQ(j.step, step[0].step);
        EXPECT_FALSE(j.samples.empty());
        scale += j.loss_scale;
        n += j.samples.size();
      }
      EXPECT_DOUBLE_EQ(scale, 3.0);  // Σ n_r · W / n = W
      for (const Job& j : step) {
        EXPECT_DOUBLE_EQ(j.loss_scale, static_cast<double>(j.samples.size()) * 3 / n);
      }
    }
    for (uint32_t r = 0; r < step.size(); ++r) train(run, ranks[r], step[r]);
  }
  EXPECT_EQ(run.state(), RunState::kCompleted);
  expect_each_sample_once(23, 5);
  for (const auto& [key, steps] : steps_of_rank[0]) {
    EXPECT_EQ(steps, steps_of_rank[1][key]);
    EXPECT_EQ(steps, steps_of_rank[2][key]);
  }
  // 23 samples over 3 ranks at 2 per batch: 3 full steps of 6, then 5 left over 3 ranks.
  EXPECT_EQ((steps_of_rank[0][Key{SetKind::kTrain, 0}].size()), 4u);
  // 5 dev samples: 5 < 6, one step of 2, 2 and 1.
  EXPECT_EQ((steps_of_rank[0][Key{SetKind::kDev, 0}].size()), 1u);
}

TEST_F(StepModeTest, APrefetchingRankTakesOnlyItsOwnBatchesAndTheOthersWaitForTheirs) {
  traincoord::Run run(steps_config(), clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 2);
  auto ahead = run.acquire(ranks[0], 0, 4);  // rank 0 prefetches 4 steps
  ASSERT_TRUE(ahead && ahead->status == AcquireStatus::kJob);
  ASSERT_EQ(ahead->more.size(), 3u);
  EXPECT_EQ(ahead->job.step, 0u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ahead->more[i].rank, 0u);
    EXPECT_EQ(ahead->more[i].step, i + 1);
  }
  auto other = run.acquire(ranks[1], 0, 2);
  ASSERT_TRUE(other && other->status == AcquireStatus::kJob);
  EXPECT_EQ(other->job.rank, 1u);
  EXPECT_EQ(other->job.step, 0u);  // its batch of step 0, not of step 4
  EXPECT_EQ(other->more[0].step, 1u);
}

TEST_F(StepModeTest, AnExpiredBatchGoesBackToItsRank) {
  traincoord::Run run(steps_config(), clock_);
  const std::vector<WorkerId> ranks = group(run, "g", 2);
  auto a0 = run.acquire(ranks[0]);
  auto a1 = run.acquire(ranks[1]);
  ASSERT_TRUE(a0 && a1);
  train(run, ranks[0], a0->job);
  clock_.advance(2000);  // rank 1's lease runs out
  run.expire_leases();
  auto again0 = run.acquire(ranks[0]);
  ASSERT_TRUE(again0 && again0->status == AcquireStatus::kJob);
  EXPECT_EQ(again0->job.step, 1u);  // rank 0 does not get rank 1's batch
  auto again1 = run.acquire(ranks[1]);
  ASSERT_TRUE(again1 && again1->status == AcquireStatus::kJob);
  EXPECT_EQ(again1->job.step, 0u);
  EXPECT_EQ(again1->job.samples, a1->job.samples);
  EXPECT_EQ(again1->job.attempt, 2u);
}

TEST_F(StepModeTest, RegistrationNeedsAGroupAndOneWorldSizePerGroup) {
  traincoord::Run run(steps_config(), clock_);
  // A worker may register without a rank (the Python Run() does, before Phases knows its rank), not
  // acquire.
  EXPECT_TRUE(run.check_rank("x", "", std::nullopt));
  const WorkerId alone = run.join("alone");
  EXPECT_EQ(reason_of(run.acquire(alone)), error_reason::kRankRequired);
  ASSERT_TRUE(run.join_group("g0"));
  const WorkerId no_rank = run.join("no-rank", "g0");
  EXPECT_EQ(reason_of(run.acquire(no_rank)), error_reason::kRankRequired);
  EXPECT_EQ(reason_of(run.check_rank("x", "g", GroupRank{2, 2})), "");
  EXPECT_EQ(run.check_rank("x", "g", GroupRank{2, 2}).error().field, "rank");
  group(run, "g", 2);
  EXPECT_EQ(reason_of(run.check_rank("x", "g", GroupRank{0, 3})), error_reason::kWorldSizeMismatch);
  EXPECT_TRUE(run.check_rank("x", "g", GroupRank{1, 2}));
  // A worker of a group before registers with the next one, first without its rank (as the
  // Python Run() does), then with a rank of another world size: its old rank is forgotten.
  ASSERT_TRUE(run.join_group("g2"));
  const WorkerId again = run.join("g-rank0", "g2");
  EXPECT_FALSE(run.workers()[again].rank.has_value());
  EXPECT_TRUE(run.check_rank("g-rank0", "g2", GroupRank{0, 3}));
  // A job-mode run takes a rank and ignores it.
  RunConfig jobs = steps_config();
  jobs.mode = ScheduleMode::kJobs;
  traincoord::Run plain(jobs, clock_);
  EXPECT_TRUE(plain.check_rank("x", "", std::nullopt));
  EXPECT_TRUE(plain.check_rank("x", "g", GroupRank{0, 3}));
}

TEST(StepModeConfig, StepsNeedSamplesABatchSizeAndOneBatchPerJob) {
  RunConfig c = steps_config();
  EXPECT_TRUE(validate(c));
  auto field_of = [](const RunConfig& x) {
    auto r = validate(x);
    return r ? std::string() : r.error().field;
  };
  RunConfig x = c;
  x.batch_size = 0;
  EXPECT_EQ(field_of(x), "data.batch_size");
  x = c;
  x.train_samples = 0;
  EXPECT_EQ(field_of(x), "data.train_samples");
  x = c;
  x.train_samples = 30;  // 15 batches of 2, not 12
  EXPECT_EQ(field_of(x), "data.train_samples");
  x = c;
  x.iters_per_worker = 2;
  EXPECT_EQ(field_of(x), "schedule.gpus_per_worker");
  x = c;
  x.seed_compat = true;
  EXPECT_EQ(field_of(x), "schedule.seed_compat");
  x = c;
  x.start_step = 3;
  EXPECT_EQ(field_of(x), "schedule.start_step");
}

// Trains the run with `ranks` in lockstep until `steps` steps are done (or the run ends), then
// each rank takes one more batch it does not report (in flight at the cut), and the group
// cuts. Returns the cut.
uint64_t train_then_cut(traincoord::Run& run, const std::vector<WorkerId>& ranks,
                        const std::string& group, int steps, uint64_t seq,
                        const std::function<void(WorkerId, const Job&)>& train) {
  for (int k = 0; k < steps && !run.finished(); ++k) {
    std::vector<Job> step;
    for (WorkerId w : ranks) {
      auto a = run.acquire(w);
      EXPECT_TRUE(a);
      if (a && a->status == AcquireStatus::kJob) step.push_back(a->job);
    }
    for (size_t r = 0; r < step.size(); ++r) train(ranks[r], step[r]);
  }
  for (WorkerId w : ranks) (void)run.acquire(w);  // in flight, never reported
  uint64_t cut = 0;
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    auto share = run.cut(ranks[r], group, seq, r, static_cast<uint32_t>(ranks.size()), {});
    EXPECT_TRUE(share) << share.error().message;
    if (share && share->complete) cut = share->cut;
  }
  return cut;
}

TEST_F(StepModeTest, ARestoreAtAnotherWorldSizeLaysOutWhatIsLeftAndTrainsEachSampleOnce) {
  for (uint32_t w2 : {1u, 2u, 4u, 5u}) {
    SCOPED_TRACE("restored at " + std::to_string(w2) + " ranks");
    trained_.clear();
    RunConfig config = steps_config();
    config.train_samples = 101;
    config.train_batches = 51;
    traincoord::Run run(config, clock_);
    const std::vector<WorkerId> first = group(run, "g1", 3);
    auto train_fn = [&](WorkerId w, const Job& j) { train(run, w, j); };
    const uint64_t cut = train_then_cut(run, first, "g1", 5, 1, train_fn);
    ASSERT_NE(cut, 0u);
    // The group trains on past its cut, then dies: what it trained after the cut is undone.
    auto lineage = trained_;
    (void)train_then_cut(run, first, "g1", 3, 2, train_fn);
    trained_ = lineage;

    const std::vector<WorkerId> second = group(run, "g2", w2);
    auto restored = run.restore("g2", cut);
    ASSERT_TRUE(restored) << restored.error().message;
    EXPECT_EQ(run.group_ranks(), w2);
    std::map<Key, std::vector<size_t>> steps_per_rank;
    for (int round = 0; round < 500 && !run.finished(); ++round) {
      bool any = false;
      for (uint32_t r = 0; r < w2; ++r) {
        auto a = run.acquire(second[r]);
        ASSERT_TRUE(a);
        if (a->status != AcquireStatus::kJob) continue;
        any = true;
        EXPECT_EQ(a->job.rank, r);
        train(run, second[r], a->job);
      }
      ASSERT_TRUE(any || run.finished());
    }
    EXPECT_EQ(run.state(), RunState::kCompleted);
    expect_each_sample_once(101, 5);
  }
}

TEST_F(StepModeTest, ASnapshotKeepsTheLayoutAndTheRanks) {
  RunConfig config = steps_config();
  traincoord::Run run(config, clock_);
  const std::vector<WorkerId> first = group(run, "g1", 3);
  auto train_fn = [&](WorkerId w, const Job& j) { train(run, w, j); };
  const uint64_t cut = train_then_cut(run, first, "g1", 2, 1, train_fn);
  const std::vector<WorkerId> second = group(run, "g2", 2);
  ASSERT_TRUE(run.restore("g2", cut));
  auto a = run.acquire(second[1]);  // lays the epoch out anew for 2 ranks
  ASSERT_TRUE(a && a->status == AcquireStatus::kJob);
  const std::string bytes = RunCodec::save(run);
  auto loaded = RunCodec::load(config, bytes, clock_);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(RunCodec::save(**loaded), bytes);
  EXPECT_EQ((*loaded)->group_ranks(), 2u);
  auto b = (*loaded)->acquire(second[0]);
  auto b_here = run.acquire(second[0]);
  ASSERT_TRUE(b && b_here && b->status == AcquireStatus::kJob);
  EXPECT_EQ(b->job.samples, b_here->job.samples);
  EXPECT_EQ(b->job.step, b_here->job.step);
  EXPECT_EQ(b->job.steps, b_here->job.steps);
}

// A seeded simulation: ranks of changing groups train with prefetch, leases expire, ranks
// give batches back, groups cut and restore at random world sizes. Whatever happens, each
// sample of each epoch is trained exactly once in the lineage the run ends with.
TEST_F(StepModeTest, SeededSimulationTrainsEachSampleOnceInTheFinalLineage) {
  uint64_t relaid = 0, restores = 0, epochs_done = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    trained_.clear();
    RunConfig config = steps_config();
    config.train_samples = 37 + seed % 13;
    config.batch_size = 1 + seed % 3;
    config.train_batches = (config.train_samples + config.batch_size - 1) / config.batch_size;
    config.dev_samples = 3 + seed % 5;
    config.dev_batches = (config.dev_samples + config.batch_size - 1) / config.batch_size;
    config.epochs = 3;
    traincoord::Run run(config, clock_);
    uint64_t groups = 0, seq = 0;
    std::vector<WorkerId> ranks;
    std::string name;
    std::map<uint64_t, decltype(trained_)> at_cut;  // the lineage each cut saved
    std::vector<std::vector<Job>> held;
    auto start_group = [&](bool restore) {
      const uint32_t w = 1 + static_cast<uint32_t>(rng() % 4);
      name = "g" + std::to_string(++groups);
      ranks = group(run, name, w);
      held.assign(w, {});
      // With a cut, the group restores the latest (and what was trained after it is
      // undone); without one it took the run over as it is when it registered.
      if (const Cut* latest = run.latest_cut(); restore && latest != nullptr) {
        const uint64_t id = latest->id;
        const uint32_t before = latest->world_size;
        auto restored = run.restore(name, id);
        ASSERT_TRUE(restored) << restored.error().message;
        restores += 1;
        relaid += before != w ? 1 : 0;
        trained_ = at_cut[id];
      }
    };
    start_group(false);
    for (int round = 0; round < 3000 && !run.finished(); ++round) {
      const uint64_t event = rng() % 100;
      if (event < 3) {  // the group dies and a new one takes over from the latest cut
        start_group(true);
        continue;
      }
      if (event < 8) {  // a cut at a step boundary: every rank reports what it trained
        ++seq;          // (batches held ahead are in flight: open again in the cut)
        for (uint32_t r = 0; r < ranks.size(); ++r) {
          auto share = run.cut(ranks[r], name, seq, r, static_cast<uint32_t>(ranks.size()), {});
          ASSERT_TRUE(share) << share.error().message;
          if (share->complete) at_cut[share->cut] = trained_;
        }
        continue;
      }
      if (event < 10) {  // time passes: leases may run out
        clock_.advance(1500);
        for (auto& h : held) h.clear();
        run.expire_leases();
        continue;
      }
      // Each rank fetches up to 3 ahead and trains its oldest, in lockstep.
      for (uint32_t r = 0; r < ranks.size(); ++r) {
        if (held[r].size() < 2) {
          auto a = run.acquire(ranks[r], 0, 2);
          ASSERT_TRUE(a);
          if (a->status == AcquireStatus::kJob) {
            held[r].push_back(a->job);
            for (const Job& m : a->more) held[r].push_back(m);
          }
        }
      }
      for (uint32_t r = 0; r < ranks.size(); ++r) {
        if (held[r].empty()) continue;
        const Job job = held[r].front();
        held[r].erase(held[r].begin());
        auto done = run.complete(ranks[r], job.lease, report(job.samples.size()));
        ASSERT_TRUE(done);
        if (done->counted()) {
          for (uint64_t s : job.samples) trained_[{job.set, job.epoch}][s] += 1;
        }
      }
    }
    ASSERT_EQ(run.state(), RunState::kCompleted);
    expect_each_sample_once(config.train_samples, config.dev_samples);
    // The coordinator's epochs agree: every epoch counts its samples once.
    for (const Epoch& e : run.epochs()) {
      EXPECT_EQ(e.samples,
                e.plan.set == SetKind::kTrain ? config.train_samples : config.dev_samples);
    }
    epochs_done += run.epochs().size();
  }
  // The seeds did what they are for: restores, many at another world size, whole runs.
  EXPECT_GT(restores, 20u);
  EXPECT_GT(relaid, 10u);
  EXPECT_EQ(epochs_done, 40u * 6);
}

}  // namespace
}  // namespace traincoord
