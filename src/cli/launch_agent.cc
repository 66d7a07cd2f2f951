#include "cli/launch_agent.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <utility>

#include "cli/commands.h"
#include "core/error.h"

namespace traincoord::cli {

namespace {

// How long an agent tries to reach a coordinator that never answered it: a wrong --url fails
// fast, as the Python client's first contact does.
constexpr AgentMs kFirstContactMs = 9'500;  // (10 s in all)

long seconds_between(AgentMs from, AgentMs to) { return static_cast<long>((to - from) / 1000); }

// "600", "2.5": seconds as a line says them.
std::string number_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

}  // namespace

bool awaits_event(const AgentAction& action) {
  return std::holds_alternative<Request>(action) || std::holds_alternative<Describe>(action) ||
         std::holds_alternative<Wait>(action) || std::holds_alternative<StopRanks>(action);
}

std::optional<std::string> first_contact_failure(const client::ClientError& e,
                                                 const std::string& url, bool out_of_time,
                                                 long tried_s) {
  if (e.code == client::codes::kBadReply || e.code.starts_with("http_")) {
    return "the server at " + url + " does not answer as a traincoord coordinator (" + e.message +
           "); check --url";
  }
  if (e.code != client::codes::kUnreachable || !out_of_time) return std::nullopt;
  return "cannot reach a coordinator at " + url + " (tried for " + std::to_string(tried_s) +
         " s: " + e.message +
         "); check --url, and that a coordinator serves it there (traincoord serve --config "
         "RUN.toml --listen 0.0.0.0:8470)";
}

std::vector<std::string> rank_env(const AgentSettings& s, const Standing& at, int local,
                                  int restart_count, const std::string& token_file) {
  const int rank = static_cast<int>(at.rank_offset) + local;
  return {"TRAINCOORD_URL=" + s.url,
          "TRAINCOORD_RUN=" + s.run,
          "TRAINCOORD_WORKER=rank" + std::to_string(rank),
          "TRAINCOORD_GROUP=" + at.group,
          "RANK=" + std::to_string(rank),
          "LOCAL_RANK=" + std::to_string(local),
          "WORLD_SIZE=" + std::to_string(at.world_size),
          "LOCAL_WORLD_SIZE=" + std::to_string(s.workers),
          "GROUP_RANK=" + std::to_string(at.node_rank),
          "GROUP_WORLD_SIZE=" + std::to_string(at.nnodes),
          "ROLE_RANK=" + std::to_string(rank),
          "ROLE_WORLD_SIZE=" + std::to_string(at.world_size),
          "ROLE_NAME=default",
          "MASTER_ADDR=" + at.master_addr,
          "MASTER_PORT=" + std::to_string(at.master_port),
          "TORCHELASTIC_RUN_ID=" + s.run,
          "TORCHELASTIC_RESTART_COUNT=" + std::to_string(restart_count),
          "TORCHELASTIC_MAX_RESTARTS=" + std::to_string(s.max_restarts),
          "TRAINCOORD_TOKEN_FILE=" + token_file};
}

int launch_exit_code(const AgentOutcome& outcome, const std::string& run_state) {
  if (outcome.interrupted) return exit_code::kInterrupted;
  if (!outcome.failed_ranks.empty() || outcome.gave_up_why) return exit_code::kFailed;
  if (run_state == "completed" || run_state == "early_stopped") return exit_code::kOk;
  return exit_code::kRunUnfinished;
}

bool LaunchAgent::Pace::due(AgentMs now) {
  if (last && now - *last < every_ms) return false;
  last = now;
  return true;
}

LaunchAgent::LaunchAgent(AgentSettings settings, AgentMs now)
    : s_(std::move(settings)),
      started_(now),
      first_contact_by_(now + std::min<AgentMs>(kFirstContactMs, s_.rdzv_timeout_s * 1000LL)),
      poll_ms_(std::clamp<AgentMs>(static_cast<AgentMs>(s_.node_timeout_s * 1000 / 5), 100, 2000)),
      exit_codes_(static_cast<size_t>(s_.workers), -1),
      stopped_with_group_(static_cast<size_t>(s_.workers), false),
      alive_(static_cast<size_t>(s_.workers), false),
      last_poll_(now),
      last_print_(now - 10'000) {}

std::vector<AgentAction> LaunchAgent::start(AgentMs now) {
  std::vector<AgentAction> out;
  request(RdzvCall::kJoin, now, out);
  phase_ = Phase::kForming;
  return out;
}

void LaunchAgent::request(RdzvCall call, AgentMs now, std::vector<AgentAction>& out, uint64_t round,
                          std::string why) {
  // Before a first answer, a request waits no longer than the first contact has left (100 ms
  // to 3 s): a wrong --url is said by then.
  const AgentMs timeout =
      reached_ ? 10'000
               : std::clamp<AgentMs>(std::max<AgentMs>(0, first_contact_by_ - now), 100, 3'000);
  out.emplace_back(Request{call, timeout, round, std::move(why)});
}

void LaunchAgent::note_reply(const RdzvReply& reply) {
  if (reply || (reply.error().http_status != 0 && !reply.error().code.starts_with("http_"))) {
    reached_ = true;
  }
}

void LaunchAgent::give_up(std::string why) { gave_up_why_ = std::move(why); }

std::vector<AgentAction> LaunchAgent::on(const AgentEvent& event, AgentMs now) {
  TC_ASSERT(phase_ != Phase::kDone);
  std::vector<AgentAction> out;
  if (const auto* r = std::get_if<Replied>(&event)) {
    replied(*r, now, out);
  } else if (const auto* d = std::get_if<Described>(&event)) {
    if (phase_ == Phase::kDescribeToQuit) {
      give_up("gave up after --join-timeout " + number_text(s_.join_timeout_s) + " s " + d->text +
              "; start the other nodes' agents (the same --url, --run and --nnodes), or lower "
              "--nnodes");
      leave_and_finish(now, out);
    } else {
      TC_ASSERT(phase_ == Phase::kDescribeToSay);
      out.emplace_back(Say{"traincoord launch: " + d->text + "\n"});
      out.emplace_back(Wait{std::min<AgentMs>(poll_ms_, 200)});  // (a round forming: answer soon)
      phase_ = Phase::kFormingWait;
    }
  } else if (const auto* w = std::get_if<Waited>(&event)) {
    waited(*w, now, out);
  } else {
    TC_ASSERT(phase_ == Phase::kStopping);
    for (const RankExit& e : std::get<RanksStopped>(event).exits) {
      const auto r = static_cast<size_t>(e.local_rank);
      const bool stopped_here = r < alive_.size() && alive_[r];
      record_exit(e);
      // A rank this agent stopped because its group stopped (a rank failed, here or on another
      // node; the round ended) did not fail: its SIGTERM's 143 is the agent's doing. Else a node
      // whose group re-forms without it, and whose run then ends, would exit 1 on that 143.
      // (Only an exit the stop explains: a rank that crashed on its own just before the SIGTERM
      // reached it, with 1 or 139, is still a failure.)
      const bool by_the_stop =
          e.exit_code == 0 || e.exit_code == 128 + SIGTERM || e.exit_code == 128 + SIGKILL;
      if (stopped_here && by_the_stop && after_stop_ == AfterStop::kRestartOrGiveUp) {
        stopped_with_group_[r] = true;
      }
    }
    TC_ASSERT(std::none_of(alive_.begin(), alive_.end(), [](bool a) { return a; }));
    stopped(now, out);
  }
  TC_ASSERT(!out.empty() &&
            (awaits_event(out.back()) || std::holds_alternative<Finish>(out.back())));
  return out;
}

void LaunchAgent::replied(const Replied& r, AgentMs now, std::vector<AgentAction>& out) {
  note_reply(r.reply);
  switch (phase_) {
    case Phase::kForming:
      TC_ASSERT(r.call == RdzvCall::kJoin || r.call == RdzvCall::kPoll);
      return forming(r.reply, now, out);
    case Phase::kHeartbeat:
      TC_ASSERT(r.call == RdzvCall::kPoll);
      return heartbeat(r.reply, out);
    case Phase::kFailing:
      TC_ASSERT(r.call == RdzvCall::kFail);
      out.emplace_back(StopRanks{});
      phase_ = Phase::kStopping;
      after_stop_ = AfterStop::kRestartOrGiveUp;
      return;
    case Phase::kLeaving:
      TC_ASSERT(r.call == RdzvCall::kLeave);
      return finish(out);
    default:
      TC_ASSERT(false);  // a reply the agent did not ask for
  }
}

// The reply to the heartbeat of a running round.
void LaunchAgent::heartbeat(const RdzvReply& polled, std::vector<AgentAction>& out) {
  if (polled || polled.error().http_status != 0) {
    trouble_since_.reset();
    trouble_said_.last.reset();
  } else {
    coordinator_gone_ = heartbeat_unanswered(polled.error(), iteration_now_, out);
  }
  if (polled && polled->state != NodeState::kRunning) {
    round_ended_ = true;
    out.emplace_back(Say{"\ntraincoord launch: the group stops: " +
                         (polled->why.empty() ? std::string("the round ended") : polled->why) +
                         "\n"});
  } else if (!polled && (polled.error().code == "not_found" ||
                         polled.error().code == client::codes::kNodeSecretMismatch)) {
    round_ended_ = true;  // this node was taken for lost (its name taken since): join again
  }
  running(out);
}

// The end of a wait: a signal passed on, the ranks that exited, then the next turn of the loop
// the wait was in.
void LaunchAgent::waited(const Waited& w, AgentMs now, std::vector<AgentAction>& out) {
  take_signal(w.signal, out);
  for (const RankExit& e : w.exits) record_exit(e);
  if (phase_ == Phase::kTroubleWait || phase_ == Phase::kFormingWait) {
    request(phase_ == Phase::kTroubleWait ? RdzvCall::kJoin : RdzvCall::kPoll, now, out);
    phase_ = Phase::kForming;
    return;
  }
  TC_ASSERT(phase_ == Phase::kRunningWait);
  iteration_now_ = now;
  if (!failure_ && now - last_poll_ >= poll_ms_) {  // the heartbeat
    last_poll_ = now;
    request(RdzvCall::kPoll, now, out);
    phase_ = Phase::kHeartbeat;
    return;
  }
  running(out);
}

void LaunchAgent::take_signal(int signal, std::vector<AgentAction>& out) {
  if (signal != SIGINT && signal != SIGTERM) return;
  interrupted_ = true;
  out.emplace_back(Say{std::string("\ntraincoord launch: ") +
                       (signal == SIGINT ? "SIGINT" : "SIGTERM") +
                       ", passing it to the workers\n"});
  out.emplace_back(SignalRanks{signal});
}

void LaunchAgent::record_exit(const RankExit& e) {
  const auto r = static_cast<size_t>(e.local_rank);
  TC_ASSERT(r < alive_.size());
  if (!alive_[r]) return;
  alive_[r] = false;
  exit_codes_[r] = e.exit_code;
  // (-1: never started; a rank stopped after an interrupt is no failure of its own)
  if (phase_ == Phase::kRunningWait && e.exit_code != 0 && e.exit_code != -1 && !interrupted_ &&
      !failure_) {
    failure_ = "worker rank" + std::to_string(at_.rank_offset + e.local_rank) + " exited with " +
               std::to_string(e.exit_code);
  }
}

// One turn of the loop that waits for a round: `standing` is the reply of a join or a poll.
void LaunchAgent::forming(const RdzvReply& standing, AgentMs now, std::vector<AgentAction>& out) {
  if (interrupted_) return finish(out);
  if (!standing) {
    const client::ClientError& e = standing.error();
    if (!reached_) {
      if (auto why = first_contact_failure(e, s_.url, now >= first_contact_by_,
                                           seconds_between(started_, now))) {
        give_up(*why);
        return finish(out);
      }
    }
    // (not_leader: several coordinators, and none leads the run yet: an election)
    const bool transient = e.code == client::codes::kUnreachable ||
                           e.code == client::codes::kNotLeader || e.http_status == 503 ||
                           e.code == "not_found" || e.code == client::codes::kNodeSecretMismatch ||
                           e.code == client::codes::kRendezvousFull;
    if (!transient) {
      give_up("the rendezvous at " + s_.url + " refused node " + s_.node + ": " + e.message);
      return finish(out);
    }
    if (in_trouble("the rendezvous at " + s_.url + " to take node " + s_.node + ": " + e.message,
                   now, out)) {
      return finish(out);
    }
    return;
  }
  if (standing->state == NodeState::kRestart) {
    // (once after a round ended before this node polled; every time: a coordinator astray)
    const std::string why = standing->why.empty() ? "" : " (" + standing->why + ")";
    if (in_trouble("a round: the coordinator at " + s_.url +
                       " answered `restart` to every join of node " + s_.node + why,
                   now, out)) {
      return finish(out);
    }
    return;
  }
  trouble_since_.reset();
  trouble_said_.last.reset();
  backoff_ms_ = 0;
  if (standing->state != NodeState::kRunning) {
    if (standing->run_state != RunState::kRunning) {
      // The run ended while this node waited for a group: nothing left to train.
      return leave_and_finish(now, out);
    }
    // Not in a running round: a line every 5 s says for whom it waits; --join-timeout ends it.
    if (!waiting_since_) waiting_since_ = now;
    if (seconds_between(*waiting_since_, now) >= s_.join_timeout_s) {
      out.emplace_back(Describe{});
      phase_ = Phase::kDescribeToQuit;
    } else if (waiting_said_.due(now)) {
      out.emplace_back(Describe{});
      phase_ = Phase::kDescribeToSay;
    } else {
      out.emplace_back(Wait{std::min<AgentMs>(poll_ms_, 200)});  // (a round forming: answer soon)
      phase_ = Phase::kFormingWait;
    }
    return;
  }
  start_group(*standing, now, out);
}

// Trouble on the way to a round: the coordinator unreachable (restarting, a network blip), a
// refusal that may pass (this node's name still held by its lost agent; the rendezvous full),
// or `restart` answered to a join. Each retry waits longer (100 ms doubling to 2 s: a few
// requests a second at most, whatever the coordinator answers); after --rdzv-timeout seconds
// of it the agent gives up, saying what it waited for. The same clock runs while the ranks train
// and the coordinator does not answer their agent's heartbeat: --rdzv-timeout holds at every
// stage. A line says what the agent waits for, every 10 s at most. Returns true: give up.
bool LaunchAgent::in_trouble(const std::string& waited_for, AgentMs now,
                             std::vector<AgentAction>& out) {
  if (!trouble_since_) trouble_since_ = now;
  const long waited = seconds_between(*trouble_since_, now);
  if (waited >= s_.rdzv_timeout_s) {
    give_up("gave up after --rdzv-timeout " + std::to_string(s_.rdzv_timeout_s) +
            " s waiting for " + waited_for);
    return true;
  }
  if (waited >= 2 && trouble_said_.due(now)) {
    out.emplace_back(Say{"traincoord launch: waiting for " + waited_for + " (" +
                         std::to_string(waited) + " s so far; giving up after --rdzv-timeout " +
                         std::to_string(s_.rdzv_timeout_s) + " s)\n"});
  }
  backoff_ms_ = backoff_ms_ == 0 ? 100 : std::min<AgentMs>(backoff_ms_ * 2, 2000);
  out.emplace_back(Wait{
      reached_ ? backoff_ms_
               : std::min<AgentMs>(backoff_ms_, std::max<AgentMs>(0, first_contact_by_ - now))});
  phase_ = Phase::kTroubleWait;
  return false;
}

// The heartbeat of a running round unanswered: the ranks go on until --rdzv-timeout, then stop.
// Returns true: give up.
bool LaunchAgent::heartbeat_unanswered(const client::ClientError& e, AgentMs now,
                                       std::vector<AgentAction>& out) {
  if (!trouble_since_) trouble_since_ = now;
  const long waited = seconds_between(*trouble_since_, now);
  if (waited >= s_.rdzv_timeout_s) {
    give_up("gave up after --rdzv-timeout " + std::to_string(s_.rdzv_timeout_s) +
            " s: the coordinator at " + s_.url + " did not answer node " + s_.node +
            "'s heartbeat (" + e.message + "); its ranks were stopped");
    return true;
  }
  if (trouble_said_.due(now)) {
    out.emplace_back(Say{"traincoord launch: the coordinator at " + s_.url + " does not answer (" +
                         e.message + "); the ranks go on; " + std::to_string(waited) +
                         " s so far, giving up after --rdzv-timeout " +
                         std::to_string(s_.rdzv_timeout_s) + " s\n"});
  }
  return false;
}

void LaunchAgent::start_group(const Standing& at, AgentMs now, std::vector<AgentAction>& out) {
  at_ = at;
  waiting_since_.reset();
  waiting_said_.last.reset();
  out.emplace_back(Say{"traincoord launch: node " + s_.node + " is node rank " +
                       std::to_string(at.node_rank) + " of " + std::to_string(at.nnodes) +
                       " (round " + std::to_string(at.round) + ", world size " +
                       std::to_string(at.world_size) + ", master " + at.master_addr + ":" +
                       std::to_string(at.master_port) + ")\n"});
  out.emplace_back(StartRanks{at, restarts_});
  std::fill(exit_codes_.begin(), exit_codes_.end(), -1);
  std::fill(stopped_with_group_.begin(), stopped_with_group_.end(), false);
  std::fill(alive_.begin(), alive_.end(), true);
  failure_.reset();
  round_ended_ = coordinator_gone_ = false;
  phase_ = Phase::kRunningWait;
  iteration_now_ = now;
  if (s_.workers > 0) {
    out.emplace_back(Wait{200});
  } else {
    group_ends(out);
  }
}

// The rest of a turn of the loop that watches the ranks: the progress when due, then the next
// wait while the group goes on.
void LaunchAgent::running(std::vector<AgentAction>& out) {
  if (iteration_now_ - last_print_ >= (s_.tty ? 500 : 1000)) {
    last_print_ = iteration_now_;
    out.emplace_back(ReportProgress{});
  }
  const bool any_alive = std::any_of(alive_.begin(), alive_.end(), [](bool a) { return a; });
  if (any_alive && !failure_ && !round_ended_ && !coordinator_gone_ && !interrupted_) {
    out.emplace_back(Wait{200});
    phase_ = Phase::kRunningWait;
    return;
  }
  group_ends(out);
}

// The group of this node ends: interrupted, the coordinator gone, every rank done, a rank failed,
// or the round ended.
void LaunchAgent::group_ends(std::vector<AgentAction>& out) {
  if (interrupted_ || coordinator_gone_) {
    out.emplace_back(StopRanks{});  // (interrupted: SIGTERM again, then SIGKILL after --grace)
    phase_ = Phase::kStopping;
    after_stop_ = interrupted_ ? AfterStop::kLeave : AfterStop::kFinish;
    return;
  }
  if (!failure_ && !round_ended_) return leave_and_finish(iteration_now_, out);  // all exited 0
  // A DDP process group does not take a restarted rank back: the whole group stops, on every
  // node, and starts again with the nodes still there (as torchrun's agents do); its ranks
  // restore their last checkpoint, and the data its cut (docs/LAUNCH.md).
  if (failure_) {
    out.emplace_back(Say{"\ntraincoord launch: " + *failure_ + "\n"});
    request(RdzvCall::kFail, iteration_now_, out, at_.round, *failure_);
    phase_ = Phase::kFailing;
    return;
  }
  out.emplace_back(StopRanks{});
  phase_ = Phase::kStopping;
  after_stop_ = AfterStop::kRestartOrGiveUp;
}

void LaunchAgent::stopped(AgentMs now, std::vector<AgentAction>& out) {
  switch (after_stop_) {
    case AfterStop::kLeave:
      return leave_and_finish(now, out);
    case AfterStop::kFinish:
      return finish(out);
    case AfterStop::kRestartOrGiveUp:
      if (restarts_ >= s_.max_restarts) {
        give_up((failure_ ? *failure_ : std::string("the group stopped")) +
                "; no restart left (--max-restarts " + std::to_string(s_.max_restarts) + ")");
        return leave_and_finish(now, out);
      }
      restarts_ += 1;
      out.emplace_back(Say{"traincoord launch: restarting the group (" + std::to_string(restarts_) +
                           " of " + std::to_string(s_.max_restarts) + ")\n"});
      request(RdzvCall::kJoin, now, out);
      phase_ = Phase::kForming;
  }
}

void LaunchAgent::leave_and_finish(AgentMs now, std::vector<AgentAction>& out) {
  request(RdzvCall::kLeave, now, out);
  phase_ = Phase::kLeaving;
}

void LaunchAgent::finish(std::vector<AgentAction>& out) {
  AgentOutcome outcome;
  outcome.interrupted = interrupted_;
  outcome.gave_up_why = gave_up_why_;
  for (size_t r = 0; r < exit_codes_.size(); ++r) {
    if (exit_codes_[r] <= 0) continue;  // (-1: never started, the run ended before a group formed)
    (stopped_with_group_[r] ? outcome.stopped_ranks : outcome.failed_ranks)
        .push_back(RankExit{static_cast<int>(at_.rank_offset + r), exit_codes_[r]});
  }
  out.emplace_back(Finish{std::move(outcome)});
  phase_ = Phase::kDone;
}

}  // namespace traincoord::cli
