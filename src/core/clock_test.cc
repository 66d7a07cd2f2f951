#include "core/clock.h"

#include <gtest/gtest.h>

#include "core/run.h"

namespace traincoord {
namespace {

TEST(RunningTime, FollowsItsReadingsWhileReadAtLeastEveryMaxStep) {
  RunningTime t(250);
  EXPECT_EQ(t.at(1000), 1000);  // the first reading starts it
  EXPECT_EQ(t.at(1050), 1050);
  EXPECT_EQ(t.at(1300), 1300);  // a gap of exactly max_step counts in full
  EXPECT_EQ(t.skipped(), 0);
  EXPECT_EQ(t.pauses(), 0u);
}

TEST(RunningTime, ALongerGapCountsAsMaxStepOnly) {
  RunningTime t(250);
  t.at(0);
  EXPECT_EQ(t.at(60'000), 250);  // stopped for a minute
  EXPECT_EQ(t.at(60'050), 300);  // then on as before
  EXPECT_EQ(t.skipped(), 60'000 - 250);
  EXPECT_EQ(t.pauses(), 1u);
}

TEST(RunningTime, NeverGoesBack) {
  RunningTime t(250);
  t.at(500);
  EXPECT_EQ(t.at(400), 500);
  EXPECT_EQ(t.at(550), 550);
}

// The run's clock in the server: a raw clock that runs on while the coordinator is stopped, read
// through RunningTime (ServerClock does the same with the steady clock).
class RunningClock final : public Clock {
 public:
  explicit RunningClock(const Clock& raw) : raw_(raw) {}
  TimeMs now() const override { return time_.at(raw_.now()); }

 private:
  const Clock& raw_;
  mutable RunningTime time_{250};
};

RunConfig one_job_config() {
  RunConfig c;
  c.name = "pause";
  c.train_batches = 1;
  c.validation_every = 0;
  c.lease_timeout_ms = 1000;
  return c;
}

// The coordinator's tick (every 50 ms) for `ms` of raw time; `worker` heartbeats every
// `heartbeat_every` ms (0: never).
void tick(ManualClock& raw, traincoord::Run& run, TimeMs ms, WorkerId worker,
          TimeMs heartbeat_every) {
  for (TimeMs t = 50; t <= ms; t += 50) {
    raw.advance(50);
    run.expire_leases();
    if (heartbeat_every > 0 && t % heartbeat_every == 0) {
      ASSERT_TRUE(run.heartbeat(worker));
    }
  }
}

// Issue 16, item 12: a coordinator stopped for longer than the lease timeout expired every
// healthy worker's lease on resume, and charged each a failed attempt.
TEST(Leases, AHeartbeatingWorkersLeaseSurvivesAPauseOfTheCoordinatorLongerThanTheTimeout) {
  for (const bool running_time : {true, false}) {
    ManualClock raw;
    RunningClock running(raw);
    const Clock& clock = running_time ? static_cast<const Clock&>(running) : raw;
    traincoord::Run run(one_job_config(), clock);
    const WorkerId w = run.join("healthy");
    const Job job = run.acquire(w)->job;
    ASSERT_NO_FATAL_FAILURE(tick(raw, run, 2000, w, 300));  // heartbeats every 300 ms
    raw.advance(30'000);           // SIGSTOP for 30 s, 30 lease timeouts; then SIGCONT
    run.expire_leases();           // the first tick after the pause comes before any request
    auto held = run.heartbeat(w);  // the heartbeat that waited in the socket meanwhile
    ASSERT_TRUE(held);
    if (!running_time) {  // what happened before: the raw clock's jump expired the lease
      EXPECT_EQ(run.counters().lease_expiries, 1u);
      continue;
    }
    ASSERT_EQ(held->size(), 1u);
    EXPECT_EQ(held->front(), job.lease);
    ASSERT_NO_FATAL_FAILURE(tick(raw, run, 2000, w, 300));
    auto done = run.complete(w, job.lease, Completion{1.0, 1, {}});
    ASSERT_TRUE(done);
    EXPECT_EQ(done->outcome, CompletionOutcome::kAccepted);
    EXPECT_EQ(run.counters().lease_expiries, 0u);
    EXPECT_EQ(run.counters().rehandouts, 0u);
    EXPECT_EQ(run.state(), RunState::kCompleted);
  }
}

TEST(Leases, ASilentWorkersLeaseStillExpiresAfterTheTimeoutOfRunningTime) {
  ManualClock raw;
  RunningClock clock(raw);
  RunConfig c = one_job_config();
  c.max_attempts = 2;
  traincoord::Run run(c, clock);
  const WorkerId w = run.join("silent");
  ASSERT_TRUE(run.acquire(w));
  ASSERT_NO_FATAL_FAILURE(tick(raw, run, 500, w, 0));
  raw.advance(30'000);  // a pause counts as 250 ms: 750 ms of the timeout gone
  run.expire_leases();
  EXPECT_EQ(run.counters().lease_expiries, 0u);
  ASSERT_NO_FATAL_FAILURE(tick(raw, run, 200, w, 0));
  EXPECT_EQ(run.counters().lease_expiries, 0u);
  ASSERT_NO_FATAL_FAILURE(tick(raw, run, 100, w, 0));  // running time reaches the deadline
  EXPECT_EQ(run.counters().lease_expiries, 1u);
}

}  // namespace
}  // namespace traincoord
