// What renews a lease, as the clients rely on it to send heartbeats only when one is needed
// (issue 22, docs/PERFORMANCE.md "Many workers"): a lease handed out lives the whole timeout from
// its hand-out; only a heartbeat listing it (or listing none) renews it; the worker's other
// requests do not, so that a lease whose hand-out the worker never heard of still expires while
// the worker keeps working; and a lease that expired stays expired. Deterministic: an injected
// clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/clock.h"
#include "core/run.h"

namespace traincoord {
namespace {

constexpr TimeMs kTimeout = 6000;

RunConfig config() {
  RunConfig c;
  c.name = "leases";
  c.train_batches = 16;
  c.epochs = 1;
  c.order = BatchOrder::kSequential;
  c.lease_timeout_ms = kTimeout;
  c.max_attempts = 100;
  return c;
}

Completion done() {
  Completion c;
  c.loss = 0.5;
  c.samples = 1;
  return c;
}

Job take(traincoord::Run& run, WorkerId w) {
  auto a = run.acquire(w);
  EXPECT_TRUE(a.has_value());
  EXPECT_EQ(a->status, AcquireStatus::kJob);
  return a->job;
}

// A worker on jobs shorter than the heartbeat interval (a third of the timeout) sends no
// heartbeat: each job comes with a fresh lease and is completed long before it runs out.
TEST(LeaseRenewal, AJobShorterThanTheIntervalNeedsNoHeartbeat) {
  ManualClock clock;
  traincoord::Run run(config(), clock);
  const WorkerId w = run.join("w");
  Job job = take(run, w);
  EXPECT_EQ(job.deadline, clock.now() + kTimeout);
  for (int i = 0; i < 10; ++i) {
    clock.advance(kTimeout / 3 - 1);  // trains for just under the interval
    auto next = run.next_job(w, job.lease, done());
    ASSERT_TRUE(next) << next.error().message;
    EXPECT_EQ(next->completed.outcome, CompletionOutcome::kAccepted);
    ASSERT_EQ(next->next.status, AcquireStatus::kJob);
    job = next->next.job;
    EXPECT_EQ(job.deadline, clock.now() + kTimeout);  // fresh, whatever the one before had left
  }
  EXPECT_EQ(run.counters().lease_expiries, 0u);
}

// A lease lives its whole timeout from its hand-out, and not a millisecond more without a
// heartbeat, however busy its worker is with other requests meanwhile.
TEST(LeaseRenewal, OtherRequestsOfTheWorkerDoNotRenewALease) {
  ManualClock clock;
  traincoord::Run run(config(), clock);
  const WorkerId w = run.join("w");
  const Job held = take(run, w);
  for (int i = 0; i < 5; ++i) {  // completes other jobs every second meanwhile
    clock.advance(1000);
    const Job other = take(run, w);
    auto c = run.complete(w, other.lease, done());
    ASSERT_TRUE(c);
    EXPECT_EQ(c->outcome, CompletionOutcome::kAccepted);
  }
  clock.advance(kTimeout - 5000 - 1);  // the last millisecond of the lease
  EXPECT_EQ(run.counters().lease_expiries, 0u);
  ASSERT_TRUE(run.acquire(w));
  EXPECT_EQ(run.counters().lease_expiries, 0u);
  clock.advance(1);
  ASSERT_TRUE(run.acquire(w));  // (every call expires what is due)
  EXPECT_EQ(run.counters().lease_expiries, 1u);
  // A lease that expired stays expired: a heartbeat does not bring it back.
  const std::vector<LeaseId> only = {held.lease};
  auto still = run.heartbeat(w, &only);
  ASSERT_TRUE(still);
  EXPECT_EQ(std::count(still->begin(), still->end(), held.lease), 0);
}

// A heartbeat renews the leases it lists to now + timeout, the others not; a worker that then
// makes no request at all loses them a timeout after its last heartbeat.
TEST(LeaseRenewal, AHeartbeatRenewsWhatItListsAndSilenceLetsItExpire) {
  ManualClock clock;
  traincoord::Run run(config(), clock);
  const WorkerId w = run.join("w"), other = run.join("other");
  const Job a = take(run, w);
  const Job b = take(run, w);
  clock.advance(kTimeout / 3);
  const std::vector<LeaseId> only = {a.lease};
  ASSERT_TRUE(run.heartbeat(w, &only));
  clock.advance(kTimeout - kTimeout / 3);  // b's deadline: expired; a has a third left
  ASSERT_TRUE(run.acquire(other));
  EXPECT_EQ(run.counters().lease_expiries, 1u);
  auto held = run.heartbeat(w, &only);
  ASSERT_TRUE(held);
  EXPECT_EQ(*held, std::vector<LeaseId>{a.lease});
  (void)b;
  clock.advance(kTimeout);              // silence: no heartbeat, no request of w
  auto gone = run.heartbeat(w, &only);  // (expires what is due first)
  ASSERT_TRUE(gone);
  EXPECT_TRUE(gone->empty());
}

}  // namespace
}  // namespace traincoord
