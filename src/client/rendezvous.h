// The rendezvous of launch agents (docs/LAUNCH.md, "Several nodes"; docs/API.md, the nodes/
// endpoints) as typed calls of the C++ client: join, poll, fail and leave answer the node's
// assignment in the core's own types (NodeAssignment, NodeState, RunState: core/rendezvous.h,
// core/run_progress.h), read strictly from the coordinator's JSON. Not part of the installed
// client API (include/traincoord/client.h must not include the core's headers): `traincoord
// launch` is the agent that uses it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/rendezvous.h"
#include "core/run_progress.h"
#include "traincoord/client.h"

namespace traincoord::client {

// A node's standing in the rendezvous, as a join, poll or fail answers it: the core's assignment
// (when kRunning, its layout; when kRestart, why the round ended), the group its ranks carry and
// the run's state.
struct Assignment : NodeAssignment {
  std::string group;  // kRunning: the group of the round's ranks (TRAINCOORD_GROUP); else empty
  RunState run_state = RunState::kRunning;
};

// One node's requests to the rendezvous of one run. Each call is one request without retries
// (the agent paces its own), to the coordinator that leads the run (several comma-separated
// urls: as post() goes); it fails as post() does (unreachable, the coordinator's refusal with its
// code: node_secret_mismatch, rendezvous_full, rendezvous_settings_conflict, not_found, ...), or
// with bad_reply naming the request and the field for a reply it cannot read (a state it does not
// know, a field missing, of another type or out of range).
class Rendezvous {
 public:
  Rendezvous(std::string url, std::string run, std::string token);

  // POST .../nodes/join: the node joins (again) with its settings (core/rendezvous.h, NodeJoin).
  Result<Assignment> join(const NodeJoin& join, std::chrono::milliseconds timeout) const;
  // POST .../nodes/poll: the node's heartbeat, answered with where it stands.
  Result<Assignment> poll(std::string_view node, std::string_view secret,
                          std::chrono::milliseconds timeout) const;
  // POST .../nodes/fail: a rank of the node failed in `round` (the round ends); answered as poll.
  Result<Assignment> fail(std::string_view node, std::string_view secret, uint64_t round,
                          std::string_view why, std::chrono::milliseconds timeout) const;
  // POST .../nodes/leave: the node's ranks all finished; it leaves without ending the round.
  Result<void> leave(std::string_view node, std::string_view secret,
                     std::chrono::milliseconds timeout) const;

 private:
  Result<std::string> call(std::string_view action, const std::string& body,
                           std::chrono::milliseconds timeout) const;
  std::string what(std::string_view action) const;  // "POST /v1/runs/RUN/nodes/ACTION"

  std::string url_, run_, token_;
};

}  // namespace traincoord::client
