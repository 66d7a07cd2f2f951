// Deterministic simulation of checkpoint cuts: a group of ranks trains a "model" that counts how
// often each batch of each epoch was applied to it, takes cuts (its checkpoints) at random
// steps, dies whole at random moments (mid-job, right after a cut, right after a restore, before
// its checkpoint was written), and a new group of a random size restores its latest checkpoint.
// Ranks of dead groups stay around as zombies whose requests must never count. The coordinator
// itself restarts from a snapshot now and then. At the end, the final model has every batch of
// every trained epoch exactly once, the epoch losses are those of the final lineage's reports,
// and the run ends as an undisturbed run of the same config does. Replay one schedule:
//   TRAINCOORD_CUT_SIM_SEED=1234 ./traincoord_tests --gtest_filter='CutSimulation.*'
//   TRAINCOORD_CUT_SIM_SEEDS=5000 runs more.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/run.h"
#include "core/run_codec.h"
#include "seeds.h"

namespace traincoord {
namespace {

// The loss of one batch: a fixed function of where it is, so that the expected epoch losses
// (and the early-stop decisions they lead to) are known whatever the schedule.
double batch_loss(uint64_t config_seed, SetKind set, int64_t epoch, uint64_t batch) {
  const double wobble =
      static_cast<double>((config_seed + batch * 7 + static_cast<uint64_t>(epoch) * 13) % 17) /
      17.0;
  if (set == SetKind::kTrain) return 2.0 / static_cast<double>(epoch + 1) + 0.01 * wobble;
  return 1.0 + 0.3 * std::sin(static_cast<double>(epoch) + static_cast<double>(config_seed % 5)) +
         0.01 * wobble;
}

using Counts = std::map<std::pair<int64_t, uint64_t>, int>;  // (epoch, train batch) -> visits

struct Checkpoint {
  uint64_t cut = 0;
  Counts model;
};

class CutWorld {
 public:
  explicit CutWorld(uint64_t seed) : seed_(seed), rng_(seed) {}

  RunConfig random_config() {
    RunConfig c;
    c.name = "cutsim" + std::to_string(seed_);
    c.train_batches = uniform(1, 40);
    c.dev_batches = uniform(0, 6);
    c.order = chance(0.5) ? BatchOrder::kShuffled : BatchOrder::kSequential;
    c.seed = rng_() % 1000;
    c.iters_per_worker = static_cast<int>(uniform(0, 4));  // 1 to 4 batches per job
    c.epochs = static_cast<int64_t>(uniform(1, 4));
    c.validation_every = c.dev_batches == 0 ? 0 : static_cast<int>(uniform(0, 2));
    c.overlap_epochs = chance(0.25);
    c.lease_timeout_ms = 1000;
    c.max_attempts = 1000;
    // A checkpoint not written is followed by the group's death at once, so the cut of the
    // last checkpoint written is at most one cut behind the latest: two kept are enough.
    c.keep_cuts = static_cast<uint32_t>(uniform(2, 4));
    if (c.validation_every > 0 && chance(0.5)) {
      c.early_stop.kind = EarlyStopKind::kPatience;
      c.early_stop.patience.patience = 1;
    }
    return c;
  }

  void run_schedule() {
    config_ = random_config();
    ASSERT_TRUE(validate(config_)) << validate(config_).error().message;
    run_ = std::make_unique<Run>(config_, clock_);
    start_group(/*restore=*/false);
    for (int round = 0;; ++round) {
      for (int step = 0; step < 20000 && !run_->finished(); ++step) {
        if (::testing::Test::HasFailure()) return;
        chaos_step();
      }
      ASSERT_TRUE(run_->finished()) << "the run did not finish in 20000 steps";
      // Sometimes the group dies after the run ended, before its last checkpoint was written:
      // the restored run (if its cut was taken while it ran) runs again.
      if (round == 2 || !chance(0.4)) break;
      kill_group();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  void check() const;
  std::string summary() const {
    const RunCounters& c = run_->counters();
    return std::string(run_state_name(run_->state())) + "; cuts " + std::to_string(c.cuts) +
           ", restores " + std::to_string(c.restores) + ", withdrawn " +
           std::to_string(c.jobs_withdrawn) + ", voided " + std::to_string(c.leases_voided) +
           ", groups " + std::to_string(groups_) + ", zombie refusals " +
           std::to_string(zombie_refusals_) + ", coordinator restarts " +
           std::to_string(coordinator_restarts_);
  }

 private:
  struct Held {
    Job job;
    std::vector<uint64_t> batches;
    size_t trained = 0;
  };
  struct Rank {
    WorkerId worker = 0;
    std::deque<Held> jobs;  // the head is being trained; the others are prefetched
    bool done = false;      // acquire said finished
  };
  struct Zombie {
    std::string group;
    WorkerId worker;
    Job job;
  };

  uint64_t uniform(uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  // A new incarnation of the group: registers its ranks, restores the latest checkpoint written
  // (the model with it), and takes a first cut right away when it has none (the "checkpoint at
  // step 0" that makes a crash before the first real checkpoint restart from the beginning).
  void start_group(bool restore) {
    groups_ += 1;
    group_ = "g" + std::to_string(groups_);
    ranks_.clear();
    const uint64_t n = uniform(1, 4);
    for (uint64_t i = 0; i < n; ++i) {
      auto state = run_->join_group(group_);
      ASSERT_TRUE(state) << state.error().message;
      if (restore && checkpoint_) {
        ASSERT_EQ(*state, GroupState::kRestoreRequired);
      }
      Rank r;
      r.worker = run_->join("rank" + std::to_string(i));
      ranks_.push_back(std::move(r));
    }
    seq_ = 0;
    if (restore && checkpoint_) {
      // Every rank restores the same cut; the first one does it.
      for (uint64_t i = 0; i < n; ++i) {
        auto restored = run_->restore(group_, checkpoint_->cut);
        ASSERT_TRUE(restored) << restored.error().message;
        EXPECT_EQ(restored->restored, i == 0);
      }
      model_ = checkpoint_->model;
    } else {
      model_.clear();
    }
    ASSERT_TRUE(run_->admit(group_));
    if (!checkpoint_) take_cut(/*write=*/true);
  }

  // The whole group dies: its ranks become zombies that may still send what they held.
  void kill_group() {
    for (Rank& r : ranks_) {
      for (Held& h : r.jobs) zombies_.push_back(Zombie{group_, r.worker, h.job});
    }
    start_group(/*restore=*/true);
  }

  // Every rank gives its share, in a random order, with no training in between (DDP ranks meet
  // at the same step). `write`: the checkpoint with the cut is written (else the group dies
  // before writing it, and its next incarnation restores an older cut).
  void take_cut(bool write) {
    seq_ += 1;
    std::vector<uint32_t> order(ranks_.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng_);
    std::optional<CutShareReply> last;
    for (uint32_t rank : order) {
      Rank& r = ranks_[rank];
      std::vector<CutPart> parts;
      if (!r.jobs.empty() && r.jobs.front().trained > 0) {
        const Held& h = r.jobs.front();
        parts.push_back(CutPart{h.job.lease, h.trained, report_of(h, h.trained)});
      }
      auto share =
          run_->cut(r.worker, group_, seq_, rank, static_cast<uint32_t>(ranks_.size()), parts);
      ASSERT_TRUE(share) << share.error().message;
      last = *share;
    }
    ASSERT_TRUE(last && last->complete);
    if (write) checkpoint_ = Checkpoint{last->cut, model_};
  }

  Completion report_of(const Held& h, size_t batches) const {
    double sum = 0;
    for (size_t i = 0; i < batches; ++i) {
      sum += batch_loss(config_.seed, h.job.set, h.job.epoch, h.batches[i]);
    }
    Completion c;
    c.loss = sum / static_cast<double>(batches);
    c.samples = batches;
    return c;
  }

  void fill(Rank& r) {
    if (r.done || r.jobs.size() >= 2) return;
    auto a = run_->acquire(r.worker);
    ASSERT_TRUE(a) << a.error().message;
    if (a->status == AcquireStatus::kFinished) {
      r.done = true;
      return;
    }
    if (a->status != AcquireStatus::kJob) return;
    Held h;
    h.job = a->job;
    run_->batches_of(h.job, &h.batches);
    ASSERT_FALSE(h.batches.empty());
    r.jobs.push_back(std::move(h));
  }

  // One batch of the rank's head job goes into the model; a job trained whole is completed.
  void train(Rank& r) {
    if (r.jobs.empty()) return;
    Held& h = r.jobs.front();
    if (h.job.set == SetKind::kTrain) model_[{h.job.epoch, h.batches[h.trained]}] += 1;
    h.trained += 1;
    if (h.trained < h.batches.size()) return;
    auto c = run_->complete(r.worker, h.job.lease, report_of(h, h.trained));
    ASSERT_TRUE(c) << c.error().message;
    ASSERT_EQ(c->outcome, CompletionOutcome::kAccepted) << completion_outcome_name(c->outcome);
    r.jobs.pop_front();
  }

  void zombie_speaks() {
    if (zombies_.empty()) return;
    const size_t i = uniform(0, zombies_.size() - 1);
    const Zombie z = zombies_[i];
    zombies_.erase(zombies_.begin() + static_cast<std::ptrdiff_t>(i));
    // The API refuses every request of an earlier group before it reaches the run ...
    auto admitted = run_->admit(z.group);
    ASSERT_FALSE(admitted) << "a request of dead group " << z.group << " was admitted";
    EXPECT_EQ(admitted.error().reason, error_reason::kStaleGeneration);
    zombie_refusals_ += 1;
    // ... and its leases are void anyway: a completion that got through would not count.
    auto c = run_->complete(z.worker, z.job.lease, Completion{1.0, 1, {}});
    if (c) {
      EXPECT_FALSE(c->counted()) << "a zombie's completion counted";
    }
  }

  void restart_coordinator() {
    const std::string bytes = RunCodec::save(*run_);
    auto loaded = RunCodec::load(config_, bytes, clock_);
    ASSERT_TRUE(loaded) << loaded.error().message;
    run_ = std::move(*loaded);
    ASSERT_EQ(RunCodec::save(*run_), bytes);
    coordinator_restarts_ += 1;
  }

  void chaos_step() {
    clock_.advance(1);
    for (Rank& r : ranks_) {
      auto hb = run_->heartbeat(r.worker);
      ASSERT_TRUE(hb) << hb.error().message;
    }
    const double x = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (x < 0.02) {
      kill_group();
    } else if (x < 0.06) {
      const bool written = !chance(0.15);
      take_cut(written);
      if (::testing::Test::HasFatalFailure()) return;
      if (!written || chance(0.2)) kill_group();  // before its checkpoint was written, or after
    } else if (x < 0.07) {
      zombie_speaks();
    } else if (x < 0.075) {
      restart_coordinator();
    } else {
      Rank& r = ranks_[uniform(0, ranks_.size() - 1)];
      fill(r);
      if (::testing::Test::HasFatalFailure()) return;
      train(r);
      if (chance(0.01)) kill_group();  // mid-job
    }
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
  ManualClock clock_;
  RunConfig config_;
  std::unique_ptr<Run> run_;
  std::string group_;
  std::vector<Rank> ranks_;
  std::vector<Zombie> zombies_;
  Counts model_;
  std::optional<Checkpoint> checkpoint_;
  uint64_t seq_ = 0;
  uint64_t groups_ = 0;
  uint64_t zombie_refusals_ = 0;
  uint64_t coordinator_restarts_ = 0;

 public:
  const Run& run() const { return *run_; }
  const Counts& model() const { return model_; }
  const RunConfig& config() const { return config_; }
};

// The same config trained by one worker with no fault: the reference for how the run ends.
std::unique_ptr<Run> undisturbed(const RunConfig& config, const Clock& clock) {
  auto run = std::make_unique<Run>(config, clock);
  const WorkerId w = run->join("solo");
  for (int i = 0; i < 100000 && !run->finished(); ++i) {
    auto a = run->acquire(w);
    if (!a || a->status != AcquireStatus::kJob) break;
    std::vector<uint64_t> batches;
    run->batches_of(a->job, &batches);
    double sum = 0;
    for (uint64_t b : batches) sum += batch_loss(config.seed, a->job.set, a->job.epoch, b);
    (void)run->complete(w, a->job.lease,
                        Completion{sum / static_cast<double>(batches.size()), batches.size(), {}});
  }
  return run;
}

void CutWorld::check() const {
  const Run& run = *run_;
  // Every batch of every train epoch the run closed is in the final model exactly once; of an
  // epoch still open when the run ended (overlap mode, early stop), at most once.
  for (const auto& [key, visits] : model_) {
    EXPECT_LE(visits, 1) << "batch " << key.second << " of epoch " << key.first << " trained "
                         << visits << " times into the final model";
  }
  for (const Epoch& e : run.epochs()) {
    if (e.plan.set != SetKind::kTrain || !e.closed()) continue;
    const EpochOrder order = run.order_of(e.plan.epoch, SetKind::kTrain);
    for (uint64_t p = 0; p < e.set_batches; ++p) {
      auto it = model_.find({e.plan.epoch, order.batch_at(p)});
      EXPECT_TRUE(it != model_.end() && it->second == 1)
          << "batch " << order.batch_at(p) << " of closed epoch " << e.plan.epoch
          << " is not in the final model";
    }
  }
  // The epoch losses are the means of the final lineage's reports: every batch once.
  for (const Epoch& e : run.epochs()) {
    if (!e.closed()) continue;
    const EpochOrder order = run.order_of(e.plan.epoch, e.plan.set);
    double sum = 0;
    for (uint64_t p = 0; p < e.set_batches; ++p) {
      sum += batch_loss(config_.seed, e.plan.set, e.plan.epoch, order.batch_at(p));
    }
    const double mean = sum / static_cast<double>(e.set_batches);
    EXPECT_NEAR(e.loss, mean, 1e-9 * std::max(1.0, std::fabs(mean)))
        << set_name(e.plan.set) << " epoch " << e.plan.epoch;
    EXPECT_EQ(e.samples, e.set_batches) << set_name(e.plan.set) << " epoch " << e.plan.epoch;
  }
  // The run ends as an undisturbed run does: same state, same epochs, same early stop.
  ManualClock clock;
  auto reference = undisturbed(config_, clock);
  EXPECT_EQ(run.state(), reference->state());
  if (!config_.overlap_epochs) {  // (in overlap mode, how far the next epoch got depends on timing)
    ASSERT_EQ(run.epochs().size(), reference->epochs().size());
    for (size_t i = 0; i < run.epochs().size(); ++i) {
      EXPECT_EQ(run.epochs()[i].plan.epoch, reference->epochs()[i].plan.epoch);
      EXPECT_EQ(run.epochs()[i].plan.set, reference->epochs()[i].plan.set);
    }
  }
  const EarlyStopState& es = run.early_stop().state();
  const EarlyStopState& ref = reference->early_stop().state();
  EXPECT_EQ(es.best_epoch, ref.best_epoch);
  EXPECT_EQ(es.stopped, ref.stopped);
  EXPECT_EQ(es.stopped_at_epoch, ref.stopped_at_epoch);
  EXPECT_EQ(es.observed.size(), ref.observed.size());
}

TEST(CutSimulation, EveryBatchIsInTheFinalModelExactlyOnce) {
  const std::vector<uint64_t> seeds =
      testing::seeds_from_env("TRAINCOORD_CUT_SIM_SEED", "TRAINCOORD_CUT_SIM_SEEDS", 300);
  uint64_t restores = 0;
  uint64_t withdrawn = 0;
  uint64_t partial = 0;
  for (uint64_t seed : seeds) {
    SCOPED_TRACE("replay with TRAINCOORD_CUT_SIM_SEED=" + std::to_string(seed));
    CutWorld world(seed);
    world.run_schedule();
    if (HasFatalFailure()) return;
    world.check();
    restores += world.run().counters().restores;
    withdrawn += world.run().counters().jobs_withdrawn;
    for (const Cut& c : world.run().cuts()) partial += c.partial_jobs;
    if (std::getenv("TRAINCOORD_SIM_VERBOSE"))
      std::printf("seed %llu: %s\n", static_cast<unsigned long long>(seed),
                  world.summary().c_str());
    if (HasFailure()) {
      ADD_FAILURE() << "seed " << seed << ": " << world.summary();
      return;
    }
  }
  // The schedules did exercise what they are for.
  if (seeds.size() >= 100) {
    EXPECT_GT(restores, seeds.size());
    EXPECT_GT(withdrawn, 0u);
    EXPECT_GT(partial, 0u);
  }
}

}  // namespace
}  // namespace traincoord
