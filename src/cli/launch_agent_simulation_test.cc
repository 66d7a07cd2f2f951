// The agent of `traincoord launch` (launch_agent.h) driven by seeded schedules: a coordinator
// that answers, refuses, restarts rounds and vanishes for a while; ranks that exit 0, fail, ignore
// a SIGTERM; SIGINT and SIGTERM at any time; all on a simulated clock. After every step the
// invariants of docs/LAUNCH.md are checked: one set of ranks at a time, only in a round formed
// with this node; no rank left running at the end; --max-restarts, --rdzv-timeout,
// --join-timeout and the first contact's 10 s hold; the agent always ends, with the documented
// exit status.
//
//   TRAINCOORD_LAUNCH_SIM_SEED=1234 build/traincoord_tests --gtest_filter='LaunchAgentSim*'
// replays one schedule (TRAINCOORD_LAUNCH_SIM_TRACE=1 prints its steps);
// TRAINCOORD_LAUNCH_SIM_SEEDS=5000 runs more (500 by default).
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>

#include "cli/commands.h"
#include "cli/launch_agent.h"
#include "seeds.h"

namespace traincoord::cli {
namespace {

struct Stats {
  uint64_t schedules = 0, steps = 0, groups = 0, restarts = 0, signals = 0, unreachable = 0;
  uint64_t by_exit[256] = {};
  std::map<std::string, uint64_t> gave_up;  // by the start of the reason
  AgentMs simulated_ms = 0;
} stats;

// Why an agent gives up (docs/LAUNCH.md, "Waiting"), as its last line says.
constexpr const char* kGaveUpKinds[] = {"no restart left", "heartbeat",    "--rdzv-timeout",
                                        "--join-timeout",  "cannot reach", "does not answer as",
                                        "refused"};

// One node's world: the coordinator, the ranks, the signals, the clock.
class World {
 public:
  explicit World(uint64_t seed) : rng_(seed) {
    s_.url = "http://10.0.0.1:8470";
    s_.run = "digits";
    s_.node = "gpu7";
    s_.workers = pick(1, 3);
    s_.max_restarts = pick(0, 3);
    s_.rdzv_timeout_s = pick(1, 30);
    s_.join_timeout_s = pick(1, 60);
    s_.node_timeout_s = pick(1, 15);
    s_.tty = chance(0.5);
    grace_ms_ = pick(0, 10) * 1000;
    p_signal_ = std::vector<double>{0, 0.0005, 0.01}[pick(0, 2)];
    p_rank_fails_ = std::vector<double>{0, 0.2, 0.6}[pick(0, 2)];
    p_down_ = std::vector<double>{0, 0.05, 0.2}[pick(0, 2)];
    p_forms_ =
        std::vector<double>{0.4, 0.4, 0.02, 0}[pick(0, 3)];  // (0: the other nodes never come)
    not_a_coordinator_ = chance(0.02);  // (a wrong --url: a web server's 404 page)
    now_ = pick(0, 1'000'000);
    started_at_ = now_;
    run_ends_at_ = now_ + pick(0, 180'000);
    ranks_.resize(static_cast<size_t>(s_.workers));
  }

  void run() {
    LaunchAgent agent(s_, now_);
    std::vector<AgentAction> todo = agent.start(now_);
    for (uint64_t step = 0;; ++step) {
      ASSERT_LT(step, 200'000u) << "the agent did not end";
      ASSERT_LT(now_ - started_at_, 4LL * 3600 * 1000) << "the agent did not end in 4 h";
      ASSERT_FALSE(todo.empty());
      std::optional<AgentEvent> event;
      for (size_t i = 0; i < todo.size(); ++i) {
        const bool last = i + 1 == todo.size();
        ASSERT_EQ(awaits_event(todo[i]) || std::holds_alternative<Finish>(todo[i]), last)
            << "a batch ends with its one action awaiting an event, or with Finish";
        if (const auto* f = std::get_if<Finish>(&todo[i])) {
          return finished(f->outcome, agent);
        }
        if (trace_) describe(todo[i]);
        event = perform(todo[i]);
        if (::testing::Test::HasFatalFailure()) return;
      }
      check_deadlines();
      if (::testing::Test::HasFatalFailure()) return;
      ++stats.steps;
      todo = agent.on(*event, now_);
      ASSERT_LE(agent.restarts(), s_.max_restarts);
    }
  }

 private:
  struct Rank {
    bool alive = false;  // started and not reaped
    AgentMs exits_at = 0;
    int code = 0;
    bool stubborn = false;  // ignores SIGTERM
  };
  enum class Mode { kUp, kDown, kRefusing };

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  bool any_alive() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.alive; });
  }

  // TRAINCOORD_LAUNCH_SIM_TRACE=1: each action as the agent asks for it, on the simulated clock.
  void describe(const AgentAction& action) const {
    static const char* kCalls[] = {"join", "poll", "fail", "leave"};
    std::printf("%10lld ms  ", static_cast<long long>(now_ - started_at_));
    if (const auto* r = std::get_if<Request>(&action)) {
      std::printf("request %s (timeout %lld ms)\n", kCalls[static_cast<int>(r->call)],
                  static_cast<long long>(r->timeout_ms));
    } else if (const auto* w = std::get_if<Wait>(&action)) {
      std::printf("wait %lld ms\n", static_cast<long long>(w->ms));
    } else if (const auto* say = std::get_if<Say>(&action)) {
      std::printf("say %s", say->text.c_str());
    } else {
      static const char* kNames[] = {"request",     "describe",     "wait",
                                     "start ranks", "signal ranks", "stop",
                                     "say",         "progress",     "finish"};
      std::printf("%s\n", kNames[action.index()]);
    }
  }

  std::optional<AgentEvent> perform(const AgentAction& action) {
    if (const auto* r = std::get_if<Request>(&action)) return Replied{r->call, reply(*r)};
    if (std::holds_alternative<Describe>(action)) {
      now_ += pick(1, 50);
      return Described{"waiting for nodes: 1 of 2 (gpu7)"};
    }
    if (const auto* w = std::get_if<Wait>(&action)) return wait(w->ms);
    if (const auto* s = std::get_if<StartRanks>(&action)) {
      start(*s);
      return std::nullopt;
    }
    if (const auto* s = std::get_if<SignalRanks>(&action)) {
      for (Rank& r : ranks_) {
        const AgentMs at = now_ + pick(0, 1000);
        if (r.alive && at < r.exits_at) {
          r.exits_at = at;
          r.code = 128 + s->signal;
        }
      }
      return std::nullopt;
    }
    if (std::holds_alternative<StopRanks>(action)) return stop();
    if (const auto* say = std::get_if<Say>(&action)) {
      EXPECT_FALSE(say->text.empty());
      EXPECT_EQ(say->text.find(": \n"), std::string::npos) << "an empty reason: " << say->text;
      return std::nullopt;
    }
    EXPECT_TRUE(std::holds_alternative<ReportProgress>(action));
    EXPECT_GT(groups_, 0) << "progress is reported once the ranks run";
    return std::nullopt;
  }

  // The coordinator's answer to `r`, after the time it took.
  RdzvReply reply(const Request& r) {
    if (r.call == RdzvCall::kJoin) {
      EXPECT_FALSE(any_alive()) << "a node joins again only with its ranks stopped";
    }
    EXPECT_GE(r.timeout_ms, 100);
    EXPECT_LE(r.timeout_ms, 10'000);
    const bool heartbeat = r.call == RdzvCall::kPoll && any_alive();
    const bool forming = r.call == RdzvCall::kJoin || (r.call == RdzvCall::kPoll && !heartbeat);
    const AgentMs sent = now_;
    if (now_ >= mode_until_) {
      const double d = std::uniform_real_distribution<double>(0, 1)(rng_);
      mode_ = d < p_down_ ? Mode::kDown : d < 2 * p_down_ ? Mode::kRefusing : Mode::kUp;
      mode_until_ = now_ + pick(0, 60'000);
    }
    RdzvReply reply = answer(r, heartbeat);
    now_ += reply || reply.error().http_status != 0 ? pick(1, 50) : r.timeout_ms;
    // The oracle's clocks (docs/LAUNCH.md, "Waiting"): trouble runs from the first request
    // unanswered (or refused, or answered `restart`, on the way to a round) to the next answer.
    const bool trouble = heartbeat ? !reply && reply.error().http_status == 0
                                   : forming && (!reply || reply->state == NodeState::kRestart);
    if (forming || heartbeat) {
      if (!trouble) {
        trouble_since_.reset();
      } else if (!trouble_since_) {
        trouble_since_ = sent;
      }
    }
    if (reply || (reply.error().http_status != 0 && !reply.error().code.starts_with("http_"))) {
      reached_ = true;
    }
    if (forming && reply && reply->state == NodeState::kWaiting &&
        reply->run_state == RunState::kRunning) {
      if (!waiting_since_) waiting_since_ = now_;
      if (now_ - *waiting_since_ >= static_cast<AgentMs>(s_.join_timeout_s * 1000) + 1000) {
        finish_within_ = 4;  // (this reply, Describe, leave, Finish)
      }
    }
    if (forming && reply && reply->state == NodeState::kRunning) {
      running_round_ = reply->round;
      formed_ = *reply;
    } else {
      formed_.reset();
    }
    if (!reply) stats.unreachable += reply.error().http_status == 0;
    return reply;
  }

  RdzvReply answer(const Request& r, bool heartbeat) {
    auto error = [](int status, std::string code) {
      return tl::unexpected(client::ClientError{status, code, "said " + code, ""});
    };
    if (not_a_coordinator_) return error(404, "http_404");
    if (mode_ == Mode::kDown) return error(0, "unreachable");
    if (mode_ == Mode::kRefusing) {
      switch (pick(0, 20)) {
        case 0:
          return error(409, "rendezvous_settings_conflict");  // (gives up: exit 1)
        case 1:
          return error(404, "http_404");  // (not a coordinator: fails at once before a contact)
        case 2:
          return error(503, "not_leader");
        case 3:
          return error(409, "rendezvous_full");
        case 4:
          return error(409, "node_secret_mismatch");
        case 5:
          return error(404, "not_found");
        default:
          return error(503, "unavailable");
      }
    }
    Standing s;
    s.run_state = now_ >= run_ends_at_ ? RunState::kCompleted : RunState::kRunning;
    if (r.call == RdzvCall::kFail) {
      s.state = NodeState::kRestart;
      return s;
    }
    if (r.call == RdzvCall::kLeave) return s;
    if (heartbeat) {
      const int d = pick(0, 999);
      if (d < 3) return error(404, "not_found");  // (taken for lost)
      if (d < 8) {
        s.state = chance(0.5) ? NodeState::kRestart : NodeState::kWaiting;
        s.why = chance(0.5) ? "node gpu1 was lost" : "";
        return s;
      }
      s.state = NodeState::kRunning;
      s.round = running_round_;
      return s;
    }
    if (s.run_state != RunState::kRunning) return s;  // (the run ended: waiting, nothing to train)
    const int d = pick(0, 99);
    if (d < 10) {
      s.state = NodeState::kRestart;
      s.why = chance(0.5) ? "rank3 exited with 1" : "";
      return s;
    }
    if (d >= 10 + static_cast<int>(p_forms_ * 100)) return s;  // waiting for nodes
    s.state = NodeState::kRunning;
    s.round = ++round_;
    s.nnodes = static_cast<uint32_t>(pick(1, 4));
    s.node_rank = static_cast<uint32_t>(pick(0, static_cast<int>(s.nnodes) - 1));
    s.rank_offset = s.node_rank * static_cast<uint32_t>(s_.workers);
    s.world_size = s.nnodes * static_cast<uint32_t>(s_.workers);
    s.master_addr = "10.0.0.2";
    s.master_port = static_cast<uint16_t>(pick(1024, 65535));
    s.group = "rdzv-r" + std::to_string(s.round);
    return s;
  }

  Waited wait(AgentMs ms) {
    EXPECT_GE(ms, 0);
    EXPECT_LE(ms, 2000);
    Waited w;
    AgentMs end = now_ + ms;
    if (ms > 0 && chance(p_signal_)) {
      end = now_ + pick(0, static_cast<int>(ms));
      w.signal = chance(0.5) ? SIGINT : SIGTERM;
      signalled_ = true;
      ++stats.signals;
    }
    now_ = end;
    w.exits = reap();
    return w;
  }

  std::vector<RankExit> reap() {
    std::vector<RankExit> exits;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      Rank& r = ranks_[i];
      if (!r.alive || r.exits_at > now_) continue;
      r.alive = false;
      exits.push_back(RankExit{static_cast<int>(i), r.code});
      if (r.code != 0) failed_by_itself_ = failed_by_itself_ || !stopping_;
    }
    return exits;
  }

  void start(const StartRanks& s) {
    ASSERT_FALSE(any_alive()) << "two sets of ranks at once";
    ASSERT_TRUE(formed_) << "ranks started outside a round formed with this node";
    EXPECT_EQ(s.at.round, formed_->round);
    EXPECT_EQ(s.at.group, formed_->group);
    EXPECT_EQ(s.restart_count, groups_);
    ++groups_;
    ++stats.groups;
    ASSERT_LE(groups_, s_.max_restarts + 1) << "more groups than --max-restarts allows";
    const auto env = rank_env(s_, s.at, s_.workers - 1, s.restart_count, "");
    EXPECT_NE(std::find(env.begin(), env.end(),
                        "RANK=" + std::to_string(s.at.rank_offset + s_.workers - 1)),
              env.end());
    EXPECT_NE(std::find(env.begin(), env.end(), "TRAINCOORD_GROUP=" + s.at.group), env.end());
    failed_by_itself_ = false;
    waiting_since_.reset();
    for (Rank& r : ranks_) {
      r.alive = true;
      // A rank fails, or quits early, or ends with the run (as a training script does).
      r.code = chance(p_rank_fails_) ? std::vector<int>{1, 2, 137}[pick(0, 2)] : 0;
      r.exits_at = r.code != 0 || chance(0.2) ? now_ + pick(200, 120'000)
                                              : std::max(now_, run_ends_at_) + pick(0, 2000);
      r.stubborn = chance(0.2);
    }
  }

  RanksStopped stop() {
    stopping_ = true;
    RanksStopped stopped{reap()};
    AgentMs last = now_;
    for (Rank& r : ranks_) {
      if (!r.alive) continue;
      const AgentMs at = r.stubborn ? now_ + grace_ms_ : std::min(r.exits_at, now_ + pick(0, 500));
      if (at >= r.exits_at) {
        // (it exited of itself first: its own code)
      } else {
        r.code = r.stubborn ? 137 : 143;
      }
      r.exits_at = std::min(r.exits_at, at);
      last = std::max(last, r.exits_at);
    }
    now_ = last;
    for (const RankExit& e : reap()) stopped.exits.push_back(e);
    stopping_ = false;
    EXPECT_FALSE(any_alive());
    return stopped;
  }

  // The deadlines the agent keeps while it runs (docs/LAUNCH.md, "Waiting: never silent, never
  // endless"). --rdzv-timeout is checked when a request comes back unanswered, so the agent may
  // overshoot it by what was in flight then: today, at worst, the heartbeat sent before the
  // deadline (counted from when it was sent: 10 s), a rank failing meanwhile (the fail request,
  // 10 s, then the stop, --grace), the join after it (10 s), a backoff (2 s), the seconds'
  // rounding and the waits (1.4 s).
  void check_deadlines() {
    if (trouble_since_) {
      const AgentMs overshoot = 10'000 + 10'000 + grace_ms_ + 10'000 + 2'000 + 1'400;
      ASSERT_LE(now_ - *trouble_since_, s_.rdzv_timeout_s * 1000LL + overshoot)
          << "--rdzv-timeout " << s_.rdzv_timeout_s << " s not kept";
    }
    if (!reached_) {
      ASSERT_LE(now_ - started_at_, std::min<AgentMs>(9'500, s_.rdzv_timeout_s * 1000LL) + 3'200)
          << "the first contact took longer than its 10 s";
    }
    if (finish_within_ > 0) {
      ASSERT_GT(--finish_within_, 0) << "--join-timeout not kept";
    }
  }

  void finished(const AgentOutcome& outcome, const LaunchAgent& agent) {
    EXPECT_FALSE(any_alive()) << "the agent ended with ranks running";
    const std::string state = now_ >= run_ends_at_ ? "completed" : "running";
    const int code = launch_exit_code(outcome, state);
    ++stats.schedules;
    stats.restarts += static_cast<uint64_t>(agent.restarts());
    stats.by_exit[code] += 1;
    stats.simulated_ms += now_ - started_at_;
    EXPECT_EQ(outcome.interrupted, signalled_);
    EXPECT_EQ(code == exit_code::kInterrupted, signalled_) << "130 exactly when interrupted";
    if (code == exit_code::kOk) {
      EXPECT_EQ(state, "completed");
      EXPECT_FALSE(failed_by_itself_) << "0 although a rank failed";
    }
    if (state == "completed" && !failed_by_itself_ && !signalled_ && !outcome.gave_up_why) {
      // (ranks this agent stopped for a restart are no failure: the run's end says how it went)
      EXPECT_EQ(code, exit_code::kOk) << "the run completed and no rank of this node failed";
    }
    if (failed_by_itself_ && !signalled_ && agent.restarts() == s_.max_restarts) {
      EXPECT_EQ(code, exit_code::kFailed) << "a rank failed with no restart left";
    }
    const std::string why = outcome.gave_up_why.value_or("");
    if (why.find("no restart left") != std::string::npos) {
      EXPECT_EQ(groups_, s_.max_restarts + 1);
    }
    if (why.starts_with("gave up after --rdzv-timeout")) {
      ASSERT_TRUE(trouble_since_) << why;
      EXPECT_GE(now_ - *trouble_since_, s_.rdzv_timeout_s * 1000LL) << why;
    }
    if (why.starts_with("gave up after --join-timeout")) {
      ASSERT_TRUE(waiting_since_) << why;
      EXPECT_GE(now_ - *waiting_since_, static_cast<AgentMs>(s_.join_timeout_s * 1000)) << why;
    }
    if (why.starts_with("cannot reach")) {
      EXPECT_FALSE(reached_);
      EXPECT_GE(now_ - started_at_, std::min<AgentMs>(9'500, s_.rdzv_timeout_s * 1000LL));
    }
    EXPECT_FALSE(outcome.gave_up_why && outcome.gave_up_why->empty());
    if (outcome.gave_up_why) {
      for (const char* kind : kGaveUpKinds) {
        if (why.find(kind) != std::string::npos) {
          stats.gave_up[kind] += 1;
          break;
        }
      }
    }
  }

  std::mt19937_64 rng_;
  AgentSettings s_;
  AgentMs now_ = 0, started_at_ = 0, grace_ms_ = 0, run_ends_at_ = 0, mode_until_ = 0;
  double p_signal_ = 0, p_rank_fails_ = 0, p_down_ = 0, p_forms_ = 0;
  bool not_a_coordinator_ = false;
  const bool trace_ = std::getenv("TRAINCOORD_LAUNCH_SIM_TRACE") != nullptr;
  Mode mode_ = Mode::kUp;
  uint64_t round_ = 0, running_round_ = 0;
  std::optional<Standing> formed_;  // the last reply, when it formed a round with this node
  std::vector<Rank> ranks_;
  int groups_ = 0;
  bool signalled_ = false, reached_ = false, stopping_ = false, failed_by_itself_ = false;
  std::optional<AgentMs> trouble_since_, waiting_since_;
  int finish_within_ = 0;
};

// A broken invariant inside the agent (TC_ASSERT) aborts the process; say which seed to replay.
volatile uint64_t current_seed = 0;
extern "C" void report_launch_sim_seed_on_abort(int) {
  char line[112];
  const int n = std::snprintf(line, sizeof line,
                              "\nlaunch agent simulation aborted: replay with "
                              "TRAINCOORD_LAUNCH_SIM_SEED=%llu\n",
                              static_cast<unsigned long long>(current_seed));
  if (n > 0) (void)!write(2, line, static_cast<size_t>(n));
  std::signal(SIGABRT, SIG_DFL);
}

TEST(LaunchAgentSimulation, RandomSchedulesKeepEveryInvariant) {
  const std::vector<uint64_t> seeds =
      testing::seeds_from_env("TRAINCOORD_LAUNCH_SIM_SEED", "TRAINCOORD_LAUNCH_SIM_SEEDS", 500);
  std::signal(SIGABRT, report_launch_sim_seed_on_abort);
  for (uint64_t seed : seeds) {
    current_seed = seed;
    SCOPED_TRACE("replay with TRAINCOORD_LAUNCH_SIM_SEED=" + std::to_string(seed) +
                 " traincoord_tests --gtest_filter='LaunchAgentSimulation.*'");
    World(seed).run();
    if (HasFailure()) return;
  }
  std::signal(SIGABRT, SIG_DFL);
  std::printf(
      "%llu schedules, %llu steps, %llu groups started, %llu restarts, %llu signals, %llu "
      "requests unanswered, %.1f simulated hours; exit 0: %llu, 1: %llu, 4: %llu, 130: %llu\n",
      static_cast<unsigned long long>(stats.schedules),
      static_cast<unsigned long long>(stats.steps), static_cast<unsigned long long>(stats.groups),
      static_cast<unsigned long long>(stats.restarts),
      static_cast<unsigned long long>(stats.signals),
      static_cast<unsigned long long>(stats.unreachable), stats.simulated_ms / 3.6e6,
      static_cast<unsigned long long>(stats.by_exit[0]),
      static_cast<unsigned long long>(stats.by_exit[1]),
      static_cast<unsigned long long>(stats.by_exit[4]),
      static_cast<unsigned long long>(stats.by_exit[130]));
  for (const auto& [why, n] : stats.gave_up) {
    std::printf("  gave up %llu times: %s\n", static_cast<unsigned long long>(n), why.c_str());
  }
  // Every outcome is reached by some schedule (else the world is too kind to test much).
  if (seeds.size() >= 200) {
    for (int code : {0, 1, 4, 130}) EXPECT_GT(stats.by_exit[code], 0u) << "exit " << code;
    for (const char* kind : kGaveUpKinds) EXPECT_GT(stats.gave_up[kind], 0u) << kind;
  }
}

}  // namespace
}  // namespace traincoord::cli
