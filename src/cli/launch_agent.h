// The agent of `traincoord launch` on one node (docs/LAUNCH.md, "Several nodes"), as a pure state
// machine: events in (a rendezvous reply, the end of a wait with the signal and the rank exits it
// saw, the ranks stopped), actions out (send a rendezvous request, start the ranks, signal them,
// stop them, wait, say a line, finish). No fork, socket, clock or signal inside: launch.cc
// performs the actions and feeds back what they met, with the time of its steady clock; the
// simulation (launch_agent_simulation_test.cc) drives it with seeded schedules instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "client/rendezvous.h"
#include "core/rendezvous.h"
#include "traincoord/client.h"

namespace traincoord::cli {

// Milliseconds on the driver's steady clock (any origin: only differences count).
using AgentMs = int64_t;

struct AgentSettings {
  std::string url;   // the coordinator(s), as the lines say them
  std::string run;   // the run
  std::string node;  // this node's name
  int workers = 1;   // ranks on this node (--nproc-per-node)
  int max_restarts = 0;
  int rdzv_timeout_s = 120;
  double join_timeout_s = 600;
  double node_timeout_s = 15;  // the heartbeat is a fifth of it (100 ms to 2 s)
  bool tty = false;            // progress redrawn every 500 ms, else every second
};

// What the coordinator says of this node's place in the rendezvous (a join, poll or fail reply):
// the C++ client's typed assignment, the core's NodeAssignment with the round's group and the
// run's state (client/rendezvous.h).
using Standing = client::Assignment;

enum class RdzvCall : uint8_t { kJoin, kPoll, kFail, kLeave };
using RdzvReply = tl::expected<Standing, client::ClientError>;

// ---- events ----
struct RankExit {
  int local_rank = 0;
  int exit_code = 0;  // 128 + N for a signal N; -1: the rank never started (fork failed)
};
struct Replied {  // the answer to a Request
  RdzvCall call = RdzvCall::kJoin;
  RdzvReply reply;
};
struct Described {  // the answer to Describe: "waiting for nodes: 1 of 2 (n0)"
  std::string text;
};
struct Waited {                 // the end of a Wait: early on SIGINT or SIGTERM
  int signal = 0;               // SIGINT, SIGTERM, or 0
  std::vector<RankExit> exits;  // the ranks that exited meanwhile
};
struct RanksStopped {  // the end of StopRanks: every rank exited
  std::vector<RankExit> exits;
};
using AgentEvent = std::variant<Replied, Described, Waited, RanksStopped>;

// ---- actions ----
// Awaits Replied. kJoin carries this node's settings (the driver's); kFail the round and why.
struct Request {
  RdzvCall call = RdzvCall::kJoin;
  AgentMs timeout_ms = 0;
  uint64_t round = 0;  // kFail
  std::string why;     // kFail
};
struct Describe {};  // awaits Described: who the rendezvous holds (GET .../nodes)
struct Wait {        // awaits Waited: up to `ms`, reaping the ranks that exit
  AgentMs ms = 0;
};
struct StartRanks {  // the ranks of the round `at` (rank_env gives each one's environment)
  Standing at;
  int restart_count = 0;
};
struct SignalRanks {  // passes `signal` on to every rank alive
  int signal = 0;
};
struct StopRanks {};  // awaits RanksStopped: SIGTERM, then SIGKILL after --grace
struct Say {          // a line (or lines) on stderr, as it is
  std::string text;
};
struct ReportProgress {};  // the epochs closed since the last report, and the progress line
// The agent is done: its outcome (launch_exit_code turns it and the run's state into a status).
struct AgentOutcome {
  bool interrupted = false;
  std::optional<std::string> gave_up_why;  // no restart left, the coordinator gone, a timeout
  std::vector<RankExit> failed_ranks;      // of the last group, exit code > 0; rank: global
  // Of the last group, ranks this agent stopped because the group stopped (no failure of their
  // own: 143 is the agent's SIGTERM); rank: global.
  std::vector<RankExit> stopped_ranks;
};
struct Finish {
  AgentOutcome outcome;
};
using AgentAction = std::variant<Request, Describe, Wait, StartRanks, SignalRanks, StopRanks, Say,
                                 ReportProgress, Finish>;

// Whether `action` awaits an event (Request, Describe, Wait, StopRanks).
bool awaits_event(const AgentAction& action);

class LaunchAgent {
 public:
  LaunchAgent(AgentSettings settings, AgentMs now);

  // The first actions: a join. Every batch the agent returns ends with exactly one action that
  // awaits an event (the driver performs the others in order, then that one, and calls on() with
  // what it met) or with Finish.
  std::vector<AgentAction> start(AgentMs now);
  // REQUIRES: start() was called, the agent is not finished, and `event` answers the last batch's
  // awaiting action (asserted).
  std::vector<AgentAction> on(const AgentEvent& event, AgentMs now);

  bool finished() const { return phase_ == Phase::kDone; }
  int restarts() const { return restarts_; }

 private:
  // What the agent awaits.
  enum class Phase : uint8_t {
    kForming,         // Replied to a join or poll
    kTroubleWait,     // Waited, then join again
    kFormingWait,     // Waited, then poll
    kDescribeToSay,   // Described: say who is awaited
    kDescribeToQuit,  // Described: give up (--join-timeout)
    kRunningWait,     // Waited while the ranks run
    kHeartbeat,       // Replied to a poll while the ranks run
    kFailing,         // Replied to fail
    kStopping,        // RanksStopped
    kLeaving,         // Replied to leave, then finish
    kDone,
  };
  // What follows the ranks stopped.
  enum class AfterStop : uint8_t { kLeave, kFinish, kRestartOrGiveUp };

  struct Pace {  // due at once, then every `every_ms` until reset
    AgentMs every_ms;
    std::optional<AgentMs> last;
    bool due(AgentMs now);
  };

  void replied(const Replied& r, AgentMs now, std::vector<AgentAction>& out);
  void heartbeat(const RdzvReply& polled, std::vector<AgentAction>& out);
  void waited(const Waited& w, AgentMs now, std::vector<AgentAction>& out);
  void forming(const RdzvReply& standing, AgentMs now, std::vector<AgentAction>& out);
  bool in_trouble(const std::string& waited_for, AgentMs now, std::vector<AgentAction>& out);
  bool heartbeat_unanswered(const client::ClientError& e, AgentMs now,
                            std::vector<AgentAction>& out);
  void start_group(const Standing& at, AgentMs now, std::vector<AgentAction>& out);
  void running(std::vector<AgentAction>& out);
  void group_ends(std::vector<AgentAction>& out);
  void stopped(AgentMs now, std::vector<AgentAction>& out);
  void take_signal(int signal, std::vector<AgentAction>& out);
  void record_exit(const RankExit& exit);
  void request(RdzvCall call, AgentMs now, std::vector<AgentAction>& out, uint64_t round = 0,
               std::string why = "");
  void leave_and_finish(AgentMs now, std::vector<AgentAction>& out);
  void finish(std::vector<AgentAction>& out);
  void give_up(std::string why);
  void note_reply(const RdzvReply& reply);

  AgentSettings s_;
  AgentMs started_, first_contact_by_, poll_ms_;
  Phase phase_ = Phase::kForming;
  bool reached_ = false;  // whether a coordinator answered this agent once
  bool interrupted_ = false;
  std::optional<std::string> gave_up_why_;
  int restarts_ = 0;
  Standing at_;  // the round the ranks run in
  std::optional<AgentMs> trouble_since_, waiting_since_;
  Pace trouble_said_{10'000, {}}, waiting_said_{5'000, {}};
  AgentMs backoff_ms_ = 0;
  // The group of this node: each rank's exit code (-1 while it runs or never ran), alive or not,
  // and whether the agent stopped it with its group, for a restart (then no failure).
  std::vector<int> exit_codes_;
  std::vector<bool> stopped_with_group_;
  std::vector<bool> alive_;
  std::optional<std::string> failure_;  // why this node's group stops
  bool round_ended_ = false, coordinator_gone_ = false;
  AgentMs last_poll_, last_print_, iteration_now_ = 0;
  AfterStop after_stop_ = AfterStop::kFinish;
};

// The environment of local rank `local` of the round `at` (docs/LAUNCH.md, "Environment of a
// rank"): torchrun's variables and TRAINCOORD_*.
std::vector<std::string> rank_env(const AgentSettings& s, const Standing& at, int local,
                                  int restart_count, const std::string& token_file);

// The exit status of `launch` (docs/LAUNCH.md, "Exit status") for the agent's outcome and the
// run's state at the end ("unknown" when the coordinator did not say).
int launch_exit_code(const AgentOutcome& outcome, const std::string& run_state);

// Why an agent gives up on a coordinator that never answered it, or nothing while it may still
// answer: no answer by the first contact's deadline (`out_of_time`), or an answer that is not a
// traincoord coordinator's.
std::optional<std::string> first_contact_failure(const client::ClientError& e,
                                                 const std::string& url, bool out_of_time,
                                                 long tried_s);

}  // namespace traincoord::cli
