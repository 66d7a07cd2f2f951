// How the C++ client reads the coordinator's replies (docs/API.md), shared by its files (not part
// of the public API). Every read checks the shape it expects: a reply that is not JSON, lacks a
// field, or holds one of another type is a ClientError with the code "bad_reply" naming the
// request and the field, never undefined behaviour.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <rapidjson/document.h>

#include "traincoord/client.h"

namespace traincoord::client {
struct Assignment;  // client/rendezvous.h
}

namespace traincoord::client::reply {

// The reply to POST .../workers.
struct Registration {
  uint32_t worker = 0;
  // When present: what the coordinator asked for, kept within [kHeartbeatIntervalMin,
  // kHeartbeatIntervalMax] (0 or less reads as the minimum).
  std::optional<int64_t> heartbeat_interval_ms;
  uint64_t generation = 0;             // 0 from a coordinator without groups
  bool restore_required = false;       // "group_state": "restore_required"
  std::optional<uint64_t> latest_cut;  // "latest_cut": N (absent or null: none)
};

// An acquire's answer: the reply to POST .../acquire, or the "next" of a completion reply.
struct Acquired {
  enum class Status { kJob, kWait, kFinished };
  Status status = Status::kWait;
  std::vector<Job> jobs;  // kJob: at least one ("job", or the list "jobs")
  Finished finished;      // kFinished
};

// The reply to POST .../complete: how each completion was taken, and, when it asked for the
// next jobs ("next": true), the acquire's answer.
struct CompletionReply {
  std::vector<Completed> outcomes;  // one per completion sent
  std::optional<Acquired> next;
};

// `what` names the request in messages ("POST /v1/runs/r/acquire").
Result<Registration> registration(const std::string& body, std::string_view what);
// `listed`: the acquire asked for "jobs": N, so its jobs are listed under "jobs".
Result<Acquired> acquired(const std::string& body, bool listed, std::string_view what);
// `listed`: the completions went as a list ("completions"; the reply has "outcomes", and its
// "next", when asked, lists its jobs) of `sent` completions; else one completion ("outcome" and
// "counted"). `next`: the request had "next": true.
Result<CompletionReply> completion(const std::string& body, bool listed, size_t sent, bool next,
                                   std::string_view what);

// The replies of the checkpoint cuts: POST .../cuts, GET .../cuts/ID, GET .../cuts and
// POST .../restore.
Result<CutShareTaken> cut_share(const std::string& body, std::string_view what);
Result<Cut> cut(const std::string& body, std::string_view what);
Result<CutList> cut_list(const std::string& body, std::string_view what);
Result<Restored> restored(const std::string& body, std::string_view what);

// The replies of the rendezvous of launch agents (client/rendezvous.h): POST .../nodes/join,
// poll and fail answer a node's assignment; its state and the run's state must be ones the core
// names (core/rendezvous.h, core/run_progress.h), and a running node's layout must hold together
// (node_rank < nnodes, rank_offset < world_size, a port, an address, a group). POST
// .../nodes/leave answers {"left": true}.
Result<Assignment> assignment(const std::string& body, std::string_view what);
Result<void> left(const std::string& body, std::string_view what);

// The error a reply with status `status` (not 2xx) to the request `what` carries: its {"error":
// {"code", "message", "field"}}, or, when the body is not that (a redirect, a proxy, another
// server), the code "http_STATUS" and a message naming `what`, the status and its `reason`,
// the `location` it points to (a redirect) and the start of the body.
ClientError error(int status, const std::string& body, std::string_view what,
                  std::string_view reason = {}, std::string_view location = {});

// A coordinator that does not lead the run (high availability, docs/API.md "Several
// coordinators"): HTTP 421 {"error": {"code": "not_leader", "leader": URL | null, "term": N | null,
// "retry_after_ms": N}}. leader empty: no leader known (an election); retry_after_ms is kept
// within [0, 10'000] (absent or of another type: 100).
struct NotLeader {
  std::string leader;
  std::optional<uint64_t> term;
  int64_t retry_after_ms = 100;
};
// The not_leader answer of a reply of `status` with `body`; nullopt for any other reply.
std::optional<NotLeader> not_leader(int status, const std::string& body);

// Parses `body` into `d` without recursion (a reply nested any depth deep cannot exhaust the
// stack). Every client path parses a reply through this.
void parse(rapidjson::Document& d, const std::string& body);

// The coordinator does not know this worker (it restarted without its state): register again.
bool unregistered(const ClientError& e);
// The coordinator no longer knows the worker or the lease (it restarted without its state): the
// completion is lost and the job will be handed out again.
bool forgotten(const ClientError& e);

}  // namespace traincoord::client::reply
