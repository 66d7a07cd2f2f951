// The agent of `traincoord launch` (launch_agent.h), one scenario at a time: what it does on each
// event, as docs/LAUNCH.md says.
#include "cli/launch_agent.h"

#include <gtest/gtest.h>

#include <csignal>

#include "cli/commands.h"

namespace traincoord::cli {
namespace {

AgentSettings settings(int workers = 2, int max_restarts = 1) {
  AgentSettings s;
  s.url = "http://10.0.0.1:8470";
  s.run = "digits";
  s.node = "gpu7";
  s.workers = workers;
  s.max_restarts = max_restarts;
  s.rdzv_timeout_s = 20;
  s.join_timeout_s = 30;
  s.node_timeout_s = 5;
  return s;
}

Standing running_round(uint64_t round) {
  Standing s;
  s.state = NodeState::kRunning;
  s.round = round;
  s.nnodes = 2;
  s.node_rank = 1;
  s.world_size = 4;
  s.rank_offset = 2;
  s.master_addr = "10.0.0.2";
  s.master_port = 29500;
  s.group = "rdzv-r" + std::to_string(round);
  s.run_state = RunState::kRunning;
  return s;
}

template <typename T>
const T* find(const std::vector<AgentAction>& actions) {
  for (const AgentAction& a : actions) {
    if (const T* t = std::get_if<T>(&a)) return t;
  }
  return nullptr;
}

client::ClientError unreachable() { return {0, "unreachable", "connection refused", ""}; }

TEST(LaunchAgent, JoinsThenStartsTheRanksOfTheRoundItFormedWith) {
  LaunchAgent agent(settings(), 0);
  auto out = agent.start(0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(std::get<Request>(out[0]).call, RdzvCall::kJoin);
  out = agent.on(Replied{RdzvCall::kJoin, running_round(1)}, 10);
  const auto* start = find<StartRanks>(out);
  ASSERT_NE(start, nullptr);
  EXPECT_EQ(start->at.group, "rdzv-r1");
  EXPECT_EQ(start->restart_count, 0);
  EXPECT_TRUE(std::holds_alternative<Wait>(out.back()));
}

TEST(LaunchAgent, AFailedRankFailsTheRoundStopsTheGroupAndJoinsAgain) {
  LaunchAgent agent(settings(2, 1), 0);
  agent.start(0);
  agent.on(Replied{RdzvCall::kJoin, running_round(1)}, 10);
  auto out = agent.on(Waited{0, {RankExit{1, 3}}}, 210);
  const auto* fail = find<Request>(out);
  ASSERT_NE(fail, nullptr);
  EXPECT_EQ(fail->call, RdzvCall::kFail);
  EXPECT_EQ(fail->round, 1u);
  EXPECT_EQ(fail->why, "worker rank3 exited with 3");
  Standing restart;
  restart.state = NodeState::kRestart;
  out = agent.on(Replied{RdzvCall::kFail, restart}, 220);
  ASSERT_TRUE(std::holds_alternative<StopRanks>(out.back()));
  out = agent.on(RanksStopped{{RankExit{0, 143}}}, 300);
  EXPECT_EQ(agent.restarts(), 1);
  ASSERT_TRUE(std::holds_alternative<Request>(out.back()));
  EXPECT_EQ(std::get<Request>(out.back()).call, RdzvCall::kJoin);
  out = agent.on(Replied{RdzvCall::kJoin, running_round(2)}, 400);
  ASSERT_NE(find<StartRanks>(out), nullptr);
  EXPECT_EQ(find<StartRanks>(out)->restart_count, 1);
  EXPECT_EQ(find<StartRanks>(out)->at.group, "rdzv-r2");
}

// Found in a loaded run of python/tests/test_launch_nodes.py: node A's group stops because a rank
// of node B failed; B rejoins first and round 2 forms with B alone (min nodes 1); the run
// completes while A waits for the group to re-form. A's ranks exited with 143, the SIGTERM A
// sent them: A must end 0 with the run, not 1.
TEST(LaunchAgent, ANodeWhoseGroupReformedWithoutItEndsWellWhenTheRunCompletes) {
  LaunchAgent agent(settings(2, 2), 0);
  agent.start(0);
  agent.on(Replied{RdzvCall::kJoin, running_round(1)}, 10);
  Standing ended = running_round(1);
  ended.state = NodeState::kRestart;  // the heartbeat: round 1 ended (a rank elsewhere failed)
  agent.on(Waited{0, {}}, 5'000);
  auto out = agent.on(Replied{RdzvCall::kPoll, ended}, 5'010);
  ASSERT_TRUE(std::holds_alternative<StopRanks>(out.back()));
  out = agent.on(RanksStopped{{RankExit{0, 143}, RankExit{1, 143}}}, 5'100);
  ASSERT_EQ(std::get<Request>(out.back()).call, RdzvCall::kJoin);
  Standing done;
  done.state = NodeState::kWaiting;
  done.run_state = RunState::kCompleted;
  out = agent.on(Replied{RdzvCall::kJoin, done}, 5'200);
  ASSERT_EQ(std::get<Request>(out.back()).call, RdzvCall::kLeave);
  out = agent.on(Replied{RdzvCall::kLeave, Standing{}}, 5'300);
  ASSERT_TRUE(agent.finished());
  const AgentOutcome& o = std::get<Finish>(out.back()).outcome;
  EXPECT_TRUE(o.failed_ranks.empty());
  ASSERT_EQ(o.stopped_ranks.size(), 2u);
  EXPECT_EQ(o.stopped_ranks[0].local_rank, 2);  // (the global rank)
  EXPECT_EQ(o.stopped_ranks[1].exit_code, 143);
  EXPECT_FALSE(o.gave_up_why);
  EXPECT_EQ(launch_exit_code(o, "completed"), exit_code::kOk);
}

// (found by review) A rank that crashed on its own just before the stop's SIGTERM reached it
// exits with its own code: that is a failure, named, whatever the stop was for.
TEST(LaunchAgent, ARankThatCrashedOnItsOwnDuringTheStopStillCountsAsFailed) {
  LaunchAgent agent(settings(2, 2), 0);
  agent.start(0);
  agent.on(Replied{RdzvCall::kJoin, running_round(1)}, 10);
  Standing ended = running_round(1);
  ended.state = NodeState::kRestart;
  agent.on(Waited{0, {}}, 5'000);
  agent.on(Replied{RdzvCall::kPoll, ended}, 5'010);
  agent.on(RanksStopped{{RankExit{0, 139}, RankExit{1, 143}}}, 5'100);
  Standing done;
  done.state = NodeState::kWaiting;
  done.run_state = RunState::kCompleted;
  agent.on(Replied{RdzvCall::kJoin, done}, 5'200);
  auto out = agent.on(Replied{RdzvCall::kLeave, Standing{}}, 5'300);
  ASSERT_TRUE(agent.finished());
  const AgentOutcome& o = std::get<Finish>(out.back()).outcome;
  ASSERT_EQ(o.failed_ranks.size(), 1u);
  EXPECT_EQ(o.failed_ranks[0].local_rank, 2);
  EXPECT_EQ(o.failed_ranks[0].exit_code, 139);
  ASSERT_EQ(o.stopped_ranks.size(), 1u);
  EXPECT_EQ(o.stopped_ranks[0].local_rank, 3);
  EXPECT_EQ(launch_exit_code(o, "completed"), exit_code::kFailed);
}

TEST(LaunchAgent, GivesUpWithNoRestartLeftAndExits1) {
  LaunchAgent agent(settings(1, 0), 0);
  agent.start(0);
  agent.on(Replied{RdzvCall::kJoin, running_round(1)}, 10);
  agent.on(Waited{0, {RankExit{0, 1}}}, 210);
  Standing restart;
  restart.state = NodeState::kRestart;
  agent.on(Replied{RdzvCall::kFail, restart}, 220);
  auto out = agent.on(RanksStopped{}, 230);
  ASSERT_EQ(std::get<Request>(out.back()).call, RdzvCall::kLeave);
  out = agent.on(Replied{RdzvCall::kLeave, Standing{}}, 240);
  ASSERT_TRUE(agent.finished());
  const AgentOutcome& o = std::get<Finish>(out.back()).outcome;
  EXPECT_EQ(o.gave_up_why.value_or(""),
            "worker rank2 exited with 1; no restart left (--max-restarts 0)");
  ASSERT_EQ(o.failed_ranks.size(), 1u);
  EXPECT_EQ(o.failed_ranks[0].local_rank, 2);  // (the global rank)
  EXPECT_EQ(launch_exit_code(o, "running"), exit_code::kFailed);
}

TEST(LaunchAgent, ASignalGoesToTheRanksThenStopsThemAndExits130) {
  LaunchAgent agent(settings(), 0);
  agent.start(0);
  agent.on(Replied{RdzvCall::kJoin, running_round(1)}, 10);
  auto out = agent.on(Waited{SIGINT, {}}, 100);
  ASSERT_NE(find<SignalRanks>(out), nullptr);
  EXPECT_EQ(find<SignalRanks>(out)->signal, SIGINT);
  // (the heartbeat may go first; the group then stops)
  while (!std::holds_alternative<StopRanks>(out.back())) {
    ASSERT_TRUE(std::holds_alternative<Request>(out.back()));
    out = agent.on(Replied{RdzvCall::kPoll, running_round(1)}, 120);
  }
  out = agent.on(RanksStopped{{RankExit{0, 130}, RankExit{1, 130}}}, 200);
  ASSERT_EQ(std::get<Request>(out.back()).call, RdzvCall::kLeave);
  out = agent.on(Replied{RdzvCall::kLeave, Standing{}}, 210);
  EXPECT_EQ(launch_exit_code(std::get<Finish>(out.back()).outcome, "running"),
            exit_code::kInterrupted);
}

TEST(LaunchAgent, AWrongUrlFailsWithinTheFirstContactsTenSeconds) {
  LaunchAgent agent(settings(), 0);
  auto out = agent.start(0);
  AgentMs now = 0;
  for (int i = 0; i < 1000 && !agent.finished(); ++i) {
    if (const auto* r = std::get_if<Request>(&out.back())) {
      now += r->timeout_ms;
      out = agent.on(Replied{r->call, tl::unexpected(unreachable())}, now);
    } else {
      now += std::get<Wait>(out.back()).ms;
      out = agent.on(Waited{}, now);
    }
  }
  ASSERT_TRUE(agent.finished());
  EXPECT_GE(now, 9'500);
  EXPECT_LE(now, 10'000);
  const std::string why = std::get<Finish>(out.back()).outcome.gave_up_why.value_or("");
  EXPECT_TRUE(why.starts_with("cannot reach a coordinator at http://10.0.0.1:8470 (tried for 9 s"))
      << why;
}

TEST(LaunchAgent, AnAnswerThatIsNoCoordinatorsFailsAtOnce) {
  LaunchAgent agent(settings(), 0);
  agent.start(0);
  auto out = agent.on(Replied{RdzvCall::kJoin,
                              tl::unexpected(client::ClientError{404, "http_404", "HTTP 404", ""})},
                      5);
  ASSERT_TRUE(agent.finished());
  EXPECT_EQ(std::get<Finish>(out.back()).outcome.gave_up_why.value_or(""),
            "the server at http://10.0.0.1:8470 does not answer as a traincoord coordinator "
            "(HTTP 404); check --url");
}

TEST(LaunchAgent, TheRankEnvironmentIsTorchrunsAndOurs) {
  const auto env = rank_env(settings(2, 3), running_round(4), 1, 2, "/tmp/token");
  const std::vector<std::string> want{"TRAINCOORD_URL=http://10.0.0.1:8470",
                                      "TRAINCOORD_RUN=digits",
                                      "TRAINCOORD_WORKER=rank3",
                                      "TRAINCOORD_GROUP=rdzv-r4",
                                      "RANK=3",
                                      "LOCAL_RANK=1",
                                      "WORLD_SIZE=4",
                                      "LOCAL_WORLD_SIZE=2",
                                      "GROUP_RANK=1",
                                      "GROUP_WORLD_SIZE=2",
                                      "ROLE_RANK=3",
                                      "ROLE_WORLD_SIZE=4",
                                      "ROLE_NAME=default",
                                      "MASTER_ADDR=10.0.0.2",
                                      "MASTER_PORT=29500",
                                      "TORCHELASTIC_RUN_ID=digits",
                                      "TORCHELASTIC_RESTART_COUNT=2",
                                      "TORCHELASTIC_MAX_RESTARTS=3",
                                      "TRAINCOORD_TOKEN_FILE=/tmp/token"};
  EXPECT_EQ(env, want);
}

TEST(LaunchAgent, ExitStatusFollowsTheDocumentedTable) {
  AgentOutcome ok;
  EXPECT_EQ(launch_exit_code(ok, "completed"), exit_code::kOk);
  EXPECT_EQ(launch_exit_code(ok, "early_stopped"), exit_code::kOk);
  EXPECT_EQ(launch_exit_code(ok, "running"), exit_code::kRunUnfinished);
  EXPECT_EQ(launch_exit_code(ok, "unknown"), exit_code::kRunUnfinished);
  AgentOutcome failed;
  failed.failed_ranks.push_back(RankExit{0, 1});
  EXPECT_EQ(launch_exit_code(failed, "completed"), exit_code::kFailed);
  AgentOutcome gave_up;
  gave_up.gave_up_why = "gave up";
  EXPECT_EQ(launch_exit_code(gave_up, "completed"), exit_code::kFailed);
  AgentOutcome interrupted = failed;
  interrupted.interrupted = true;
  EXPECT_EQ(launch_exit_code(interrupted, "completed"), exit_code::kInterrupted);
}

}  // namespace
}  // namespace traincoord::cli
