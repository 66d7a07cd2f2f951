// The rules of a JobStream's round trips (client/stream_round.h).
#include "client/stream_round.h"

#include <gtest/gtest.h>

namespace traincoord::client {
namespace {

TEST(StreamRound, KeepsDepthJobsAheadWithoutLongPolling) {
  EXPECT_EQ(plan_round({.depth = 4, .ready = 1}).jobs, 3u);
  EXPECT_FALSE(plan_round({.depth = 4, .ready = 1}).long_poll);
  EXPECT_FALSE(has_work({.depth = 4, .ready = 4}));
  EXPECT_EQ(plan_round({.depth = 4, .ready = 4}).jobs, 0u);
}

TEST(StreamRound, AStarvedCallerGetsALongPollForAtLeastOneJob) {
  const StreamRound r = plan_round({.depth = 1, .ready = 0, .waiting = true, .dry = true});
  EXPECT_EQ(r.jobs, 1u);
  EXPECT_TRUE(r.long_poll);
}

// The defect this file exists for: the caller still flagged as waiting after a job was
// delivered to it (its thread had not run yet). The stream asked for one more job, long-polling,
// round after round: on a busy machine it took a whole epoch and waited 20 s on a long poll while
// the completions of those jobs queued behind it.
TEST(StreamRound, ACallerWhoseJobIsReadyIsNotStarvedWhateverItsFlagSays) {
  const StreamState delivered{.depth = 1, .ready = 1, .waiting = true};
  EXPECT_FALSE(starved(delivered));
  EXPECT_FALSE(has_work(delivered));
  EXPECT_EQ(plan_round(delivered).jobs, 0u);
  EXPECT_FALSE(plan_round(delivered).long_poll);
  const StreamState deeper{.depth = 4, .ready = 2, .waiting = true};
  EXPECT_EQ(plan_round(deeper).jobs, 2u);
  EXPECT_FALSE(plan_round(deeper).long_poll);
}

TEST(StreamRound, NeverLongPollsWhileSendingCompletions) {
  const StreamRound r =
      plan_round({.depth = 2, .ready = 0, .completions = 3, .waiting = true, .dry = true});
  EXPECT_EQ(r.jobs, 2u);
  EXPECT_FALSE(r.long_poll);
}

TEST(StreamRound, ADryCoordinatorIsAskedAgainOnlyWhenTheCallerNeedsAJob) {
  EXPECT_FALSE(has_work({.depth = 2, .ready = 1, .dry = true}));
  EXPECT_EQ(plan_round({.depth = 2, .ready = 1, .completions = 1, .dry = true}).jobs, 0u);
  EXPECT_TRUE(has_work({.depth = 2, .ready = 0, .waiting = true, .dry = true}));
}

TEST(StreamRound, StoppingSendsCompletionsOnly) {
  EXPECT_TRUE(has_work({.depth = 2, .completions = 1, .stopping = true}));
  EXPECT_FALSE(has_work({.depth = 2, .waiting = true, .stopping = true}));
  EXPECT_EQ(plan_round({.depth = 2, .completions = 1, .waiting = true, .stopping = true}).jobs, 0u);
}

}  // namespace
}  // namespace traincoord::client
