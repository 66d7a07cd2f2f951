// Deterministic simulation of the core: random configs and random schedules with worker deaths,
// lease expiries, duplicate, late and foreign completions, failures and elastic joins. After each
// schedule the invariants a user relies on are checked. Every schedule comes from one seed:
//   TRAINCOORD_SIM_SEED=1234 ./traincoord_tests --gtest_filter='Simulation.*'   replays one;
//   TRAINCOORD_SIM_SEEDS=5000 runs more.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/early_stop.h"
#include "core/run.h"
#include "core/run_codec.h"
#include "seeds.h"

namespace traincoord {
namespace {

struct Accepted {
  uint64_t job;
  std::vector<uint64_t> batches;
  Completion completion;
};

class World {
 public:
  explicit World(uint64_t seed) : seed_(seed), rng_(seed) {}

  RunConfig random_config() {
    RunConfig c;
    c.name = "sim" + std::to_string(seed_);
    c.train_batches = uniform(1, 120);
    c.dev_batches = uniform(0, 10);
    c.order = chance(0.5) ? BatchOrder::kShuffled : BatchOrder::kSequential;
    c.seed = rng_();
    c.gpus_per_worker = static_cast<int>(uniform(1, 2));
    c.iters_per_worker = static_cast<int>(uniform(0, 3));
    c.replicas_to_agg = static_cast<int>(uniform(0, 3));
    c.validation_every = c.dev_batches == 0 ? 0 : static_cast<int>(uniform(0, 2));
    c.seed_compat = chance(0.25);
    c.overlap_epochs = chance(0.25);
    const uint64_t steps_per_epoch = std::max<uint64_t>(
        1, c.train_batches / (static_cast<uint64_t>(c.gpus_per_worker) *
                              static_cast<uint64_t>(std::max(1, c.replicas_to_agg))));
    c.start_step = chance(0.3) ? uniform(0, 2 * steps_per_epoch) : 0;
    // The last step of an epoch: the checkpoint's jobs may then be a whole seed_compat epoch.
    if (chance(0.1)) c.start_step = uniform(0, 2) * steps_per_epoch + steps_per_epoch - 1;
    // Mostly a target above the start epoch; sometimes one already reached.
    c.epochs = chance(0.3) ? -static_cast<int64_t>(uniform(1, 4))
                           : static_cast<int64_t>(c.start_step / steps_per_epoch + uniform(0, 4));
    c.lease_timeout_ms = 100;
    if (chance(0.3)) {
      c.max_attempts = 3;
      c.on_job_failure = JobFailurePolicy::kSkip;
    } else {
      c.max_attempts = 1000;
    }
    c.lease_history = chance(0.2) ? static_cast<uint32_t>(uniform(1, 4)) : 1024;
    if (c.validation_every > 0) {
      const double r = uniform01();
      if (r < 0.25) {
        c.early_stop.kind = EarlyStopKind::kWindow;
        c.early_stop.window = {static_cast<int>(uniform(2, 4)), 0.2, 0.2};
      } else if (r < 0.5) {
        c.early_stop.kind = EarlyStopKind::kPatience;
        c.early_stop.patience.patience = static_cast<int>(uniform(1, 3));
        c.early_stop.patience.check_finite = chance(0.5);
      }
    }
    return c;
  }

  void run_schedule() {
    config_ = random_config();
    ASSERT_TRUE(validate(config_)) << validate(config_).error().message;
    run_ = std::make_unique<Run>(config_, clock_);
    for (int i = 0, n = static_cast<int>(uniform(1, 6)); i < n; ++i) add_worker();
    const int steps = static_cast<int>(uniform(50, 3000));
    for (int step = 0; step < steps && !::testing::Test::HasFatalFailure(); ++step) chaos_step();
    drain();
  }

  void check_invariants() const;
  // One line about the schedule, for a replayed seed.
  std::string summary() const {
    const RunCounters& c = run_->counters();
    return std::string(run_state_name(run_->state())) + ": " + run_->state_reason() + "; epochs " +
           std::to_string(run_->epochs().size()) + ", hand-outs " + std::to_string(c.handouts) +
           ", expiries " + std::to_string(c.lease_expiries) + ", repeated " +
           std::to_string(c.completions_duplicate) + ", foreign " +
           std::to_string(c.completions_foreign) + ", failed jobs " +
           std::to_string(c.jobs_failed) + ", workers " + std::to_string(workers_.size());
  }

 private:
  struct SimWorker {
    WorkerId id;
    bool alive = true;
    std::optional<Job> job;
    std::vector<Job> zombie_jobs;  // jobs it held when it "died", maybe completed late
  };

  uint64_t uniform(uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_);
  }
  double uniform01() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  bool chance(double p) { return uniform01() < p; }

  void add_worker() {
    SimWorker w;
    w.id = run_->join("w" + std::to_string(workers_.size()));
    workers_.push_back(w);
  }

  SimWorker* pick(bool (*want)(const SimWorker&)) {
    std::vector<SimWorker*> candidates;
    for (SimWorker& w : workers_) {
      if (want(w)) candidates.push_back(&w);
    }
    if (candidates.empty()) return nullptr;
    return candidates[uniform(0, candidates.size() - 1)];
  }

  Completion random_completion() {
    Completion c;
    c.loss = chance(0.03) ? NAN : uniform01() * 5;
    c.samples = uniform(0, 8);
    if (chance(0.02)) {  // a loss * samples far past the largest double
      c.loss = 1e300 * (1 + uniform01());
      c.samples = uint64_t{1} << 53;
    }
    if (chance(0.5)) c.metrics.push_back({"accuracy", uniform01()});
    return c;
  }

  void record(const Job& job, const Completion& c, const Completed& outcome) {
    if (!outcome.counted()) return;
    Accepted a{job.index, {}, c};
    run_->batches_of(job, &a.batches);
    accepted_[{static_cast<int>(job.set), job.epoch}].push_back(std::move(a));
  }

  void take_next(SimWorker& w, const Acquired& a) {
    w.job.reset();
    if (a.status == AcquireStatus::kJob) w.job = a.job;
  }

  void complete(SimWorker& w, const Job& job, bool with_next) {
    const Completion c = random_completion();
    if (with_next) {
      auto r = run_->next_job(w.id, job.lease, c);
      ASSERT_TRUE(r) << r.error().message;
      record(job, c, r->completed);
      take_next(w, r->next);
    } else {
      auto r = run_->complete(w.id, job.lease, c);
      ASSERT_TRUE(r) << r.error().message;
      record(job, c, *r);
      w.job.reset();
    }
    sent_.push_back({w.id, job});
  }

  // As the durable store does after a crash: the run continues from its saved state.
  void save_and_restore() {
    const std::string saved = RunCodec::save(*run_);
    auto loaded = RunCodec::load(config_, saved, clock_);
    ASSERT_TRUE(loaded) << loaded.error().message;
    ASSERT_EQ(RunCodec::save(**loaded), saved) << "a restored run saves differently";
    run_ = std::move(*loaded);
  }

  void chaos_step() {
    if (chance(0.02)) save_and_restore();
    const double r = uniform01();
    if (r < 0.40) {  // a worker finishes its job
      if (SimWorker* w = pick([](const SimWorker& s) { return s.alive && s.job.has_value(); })) {
        const Job job = *w->job;
        complete(*w, job, chance(0.5));
      }
    } else if (r < 0.55) {  // an idle worker asks for work
      if (SimWorker* w = pick([](const SimWorker& s) { return s.alive && !s.job; })) {
        auto a = run_->acquire(w->id);
        ASSERT_TRUE(a);
        take_next(*w, *a);
      }
    } else if (r < 0.63) {
      clock_.advance(static_cast<TimeMs>(uniform(0, 150)));
    } else if (r < 0.70) {
      if (SimWorker* w = pick([](const SimWorker& s) { return s.alive; })) {
        ASSERT_TRUE(run_->heartbeat(w->id));
      }
    } else if (r < 0.73) {  // a worker dies silently, holding its job
      if (SimWorker* w = pick([](const SimWorker& s) { return s.alive && s.job.has_value(); })) {
        w->zombie_jobs.push_back(*w->job);
        w->job.reset();
        w->alive = false;
      }
    } else if (r < 0.77) {  // a dead worker comes back and reports what it had finished late
      if (SimWorker* w = pick([](const SimWorker& s) { return !s.alive; })) {
        for (const Job& job : w->zombie_jobs) complete(*w, job, false);
        w->zombie_jobs.clear();
        w->alive = true;
      }
    } else if (r < 0.80) {  // a worker leaves cleanly
      if (SimWorker* w = pick([](const SimWorker& s) { return s.alive; })) {
        ASSERT_TRUE(run_->leave(w->id));
        w->job.reset();
        w->alive = chance(0.5);  // and may come back at once (it rejoins on its next call)
        if (!w->alive) w->zombie_jobs.clear();
      }
    } else if (r < 0.83) {
      if (workers_.size() < 12) add_worker();
    } else if (r < 0.86) {  // a worker gives up its job
      if (SimWorker* w = pick([](const SimWorker& s) { return s.alive && s.job.has_value(); })) {
        ASSERT_TRUE(run_->fail(w->id, w->job->lease, "simulated failure"));
        w->job.reset();
      }
    } else if (r < 0.94) {  // a completion is sent again (a lost reply, a retry)
      if (!sent_.empty()) {
        const auto& [id, job] = sent_[uniform(0, sent_.size() - 1)];
        auto again = run_->complete(id, job.lease, random_completion());
        ASSERT_TRUE(again) << again.error().message;
        EXPECT_FALSE(again->counted()) << "a repeated completion was counted twice";
      }
    } else {  // a worker completes another worker's live lease
      SimWorker* owner = pick([](const SimWorker& s) { return s.alive && s.job.has_value(); });
      SimWorker* thief = pick([](const SimWorker& s) { return s.alive; });
      if (owner && thief && owner != thief) {
        auto r2 = run_->complete(thief->id, owner->job->lease, random_completion());
        // Still live: a conflict. Already expired and superseded: never counted.
        if (r2) {
          EXPECT_FALSE(r2->counted());
        } else {
          EXPECT_EQ(r2.error().code, ErrorCode::kConflict);
        }
      }
    }
  }

  // Lets the survivors finish the run: dead workers stay dead (their leases expire), and one
  // fresh worker joins in case every worker has died.
  void drain() {
    add_worker();
    for (int round = 0; round < 200000 && !run_->finished(); ++round) {
      bool progressed = false;
      for (SimWorker& w : workers_) {
        if (!w.alive) continue;
        if (w.job) {
          const Job job = *w.job;
          complete(w, job, true);
          progressed = true;
        } else {
          auto a = run_->acquire(w.id);
          ASSERT_TRUE(a);
          take_next(w, *a);
          progressed |= a->status == AcquireStatus::kJob;
        }
        if (run_->finished() || ::testing::Test::HasFatalFailure()) break;
      }
      if (!progressed) clock_.advance(config_.lease_timeout_ms + 1);
    }
    ASSERT_TRUE(run_->finished()) << "the run never finished";
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
  ManualClock clock_;
  RunConfig config_;
  std::unique_ptr<Run> run_;
  std::vector<SimWorker> workers_;
  std::vector<std::pair<WorkerId, Job>> sent_;
  std::map<std::pair<int, int64_t>, std::vector<Accepted>> accepted_;
};

void World::check_invariants() const {
  const Run& run = *run_;
  const Plan& plan = run.plan();
  EXPECT_NE(run.state(), RunState::kFailed) << "the skip policy never fails a run";

  std::set<std::pair<int, int64_t>> epochs_seen;
  for (const Epoch& e : run.epochs()) {
    const auto key = std::make_pair(static_cast<int>(e.plan.set), e.plan.epoch);
    EXPECT_TRUE(epochs_seen.insert(key).second)
        << set_name(e.plan.set) << " epoch " << e.plan.epoch << " opened twice";
    auto it = accepted_.find(key);
    const std::vector<Accepted> none;
    const std::vector<Accepted>& done = it == accepted_.end() ? none : it->second;

    // Each job counted at most once, and the epoch's counts agree.
    std::set<uint64_t> jobs;
    for (const Accepted& a : done) {
      EXPECT_TRUE(jobs.insert(a.job).second) << "job " << a.job << " counted twice";
      EXPECT_GE(a.job, e.plan.first_job);
      EXPECT_LT(a.job, e.plan.end_job);
    }
    EXPECT_EQ(done.size(), e.done);
    for (uint64_t f : e.failed_jobs) EXPECT_EQ(jobs.count(f), 0u) << "failed job " << f << " done";

    // Each batch trained at most once; a closed epoch covers all its batches exactly once.
    std::multiset<uint64_t> batches;
    for (const Accepted& a : done) batches.insert(a.batches.begin(), a.batches.end());
    for (uint64_t b : batches) EXPECT_EQ(batches.count(b), 1u) << "batch " << b << " twice";
    if (e.closed()) {
      EXPECT_EQ(e.done + e.failed, e.plan.size());
      std::multiset<uint64_t> expected;
      const EpochOrder order = run.order_of(e.plan.epoch, e.plan.set);
      std::set<uint64_t> failed(e.failed_jobs.begin(), e.failed_jobs.end());
      for (uint64_t j = e.plan.first_job; j < e.plan.end_job; ++j) {
        if (failed.count(j)) continue;
        const BatchSpan span = job_batches(e.set_batches, plan.batches_per_job, j);
        for (uint64_t p = span.first; p < span.first + span.count; ++p) {
          expected.insert(order.batch_at(p));
        }
      }
      EXPECT_EQ(batches, expected) << set_name(e.plan.set) << " epoch " << e.plan.epoch;

      // The epoch loss equals a direct computation from the counted completions.
      // (In long double, whose range holds loss * samples of any double loss.)
      long double weighted = 0, plain = 0;
      uint64_t samples = 0, finite = 0;
      for (const Accepted& a : done) {
        if (!std::isfinite(a.completion.loss)) continue;
        weighted += static_cast<long double>(a.completion.loss) *
                    static_cast<long double>(a.completion.samples);
        samples += a.completion.samples;
        plain += a.completion.loss;
        finite += 1;
      }
      const double expected_loss =
          finite == 0 ? NAN
          : (!config_.seed_compat && samples > 0)
              ? static_cast<double>(weighted / static_cast<long double>(samples))
              : static_cast<double>(plain / static_cast<long double>(finite));
      if (std::isnan(expected_loss)) {
        EXPECT_TRUE(std::isnan(e.loss));
      } else {
        EXPECT_NEAR(e.loss, expected_loss, 1e-9 * std::max(1.0, std::fabs(expected_loss)));
      }
    }
  }

  // A completed run opened and closed every planned epoch.
  if (run.state() == RunState::kCompleted) {
    uint64_t resolved = 0;
    for (const Epoch& e : run.epochs()) {
      EXPECT_TRUE(e.closed());
      resolved += e.resolved();
    }
    EXPECT_EQ(resolved, run.planned_jobs());
    size_t planned_epochs = 0;
    for (int64_t e = plan.start_epoch; e < plan.end_epoch; ++e) {
      planned_epochs += 1 + (dev_epoch_plan(plan, config_, e) ? 1 : 0);
    }
    EXPECT_EQ(run.epochs().size(), planned_epochs);
  }

  // Early stopping saw the closed dev epochs in order and decided as a fresh rule does.
  EarlyStopRule replay(config_.early_stop);
  bool stopped = false;
  for (const Epoch& e : run.epochs()) {
    if (e.plan.set != SetKind::kDev || !e.closed() || stopped) continue;
    const double value =
        replay.monitor() == "loss" ? e.loss : e.metric(replay.monitor(), !config_.seed_compat);
    stopped = replay.observe(e.plan.epoch, value, e.nonfinite_jobs == 0) &&
              config_.early_stop.kind != EarlyStopKind::kNone;
  }
  EXPECT_EQ(run.state() == RunState::kEarlyStopped, stopped);
  EXPECT_EQ(run.early_stop().state().stopped_at_epoch, replay.state().stopped_at_epoch);
}

// A broken invariant inside the core aborts the process; say which seed to replay first.
volatile uint64_t current_seed = 0;
extern "C" void report_seed_on_abort(int) {
  char line[96];
  const int n = std::snprintf(line, sizeof line,
                              "\nsimulation aborted: replay with TRAINCOORD_SIM_SEED=%llu\n",
                              static_cast<unsigned long long>(current_seed));
  if (n > 0) (void)!write(2, line, static_cast<size_t>(n));
  std::signal(SIGABRT, SIG_DFL);
}

TEST(Simulation, RandomSchedulesKeepEveryInvariant) {
  const std::vector<uint64_t> seeds =
      testing::seeds_from_env("TRAINCOORD_SIM_SEED", "TRAINCOORD_SIM_SEEDS", 1000);
  std::signal(SIGABRT, report_seed_on_abort);
  for (uint64_t seed : seeds) {
    current_seed = seed;
    SCOPED_TRACE("replay with TRAINCOORD_SIM_SEED=" + std::to_string(seed));
    World world(seed);
    world.run_schedule();
    if (HasFatalFailure()) return;
    world.check_invariants();
    if (std::getenv("TRAINCOORD_SIM_VERBOSE"))
      std::printf("seed %llu: %s\n", static_cast<unsigned long long>(seed),
                  world.summary().c_str());
    if (HasFailure()) {
      ADD_FAILURE() << "seed " << seed << " broke an invariant";
      return;
    }
  }
}

}  // namespace
}  // namespace traincoord
