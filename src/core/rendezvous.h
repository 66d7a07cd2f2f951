// The rendezvous of `traincoord launch` agents, one per node, through the coordinator (no other
// rendezvous service): agents join a round, the round forms once enough nodes joined, each gets
// its node rank, the world size, the master address and the group name its ranks carry; when a
// rank fails or a node is lost, the round ends and the agents that are left join the next one.
// Pure and deterministic: time comes in as arguments (docs/LAUNCH.md has the rules for users,
// docs/SECURITY.md "Rendezvous trust model" what a holder of the run's token can do to it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/error.h"

namespace traincoord {

// Bounds of what an agent may ask for (every node of a rendezvous must ask for the same).
inline constexpr TimeMs kMinNodeTimeoutMs = 1'000;
inline constexpr TimeMs kMaxNodeTimeoutMs = 600'000;
inline constexpr TimeMs kMaxSettleMs = 600'000;
inline constexpr uint32_t kMaxRendezvousNodes = 1024;  // --nnodes MAX at most
inline constexpr size_t kMinNodeSecretBytes = 16;
inline constexpr size_t kMaxNodeSecretBytes = 256;

struct NodeJoin {
  std::string node;  // the agent's name, unique per node
  std::string addr;  // where the node's ranks are reached (MASTER_ADDR when it is node rank 0):
                     // an IPv4 or IPv6 literal, or a host name (RFC 1123 labels)
  // A random string the agent draws once (kMinNodeSecretBytes..kMaxNodeSecretBytes printable
  // ASCII characters): every later request for this node must present it. Only a hash of it is
  // kept.
  std::string secret;
  uint32_t nproc = 1;
  uint16_t master_port = 0;  // a free port on the node, for MASTER_PORT when it is node rank 0
  // The settings of the whole rendezvous: every node present must have joined with the same.
  uint32_t min_nodes = 1;
  uint32_t max_nodes = 1;
  TimeMs settle_ms = 0;             // after min_nodes joined, how long later joins are awaited
  TimeMs node_timeout_ms = 15'000;  // an agent not heard of for this long is lost
};

enum class NodeState : uint8_t {
  kWaiting,  // the round has not formed, or formed without this node (it joins the next)
  kRunning,  // the round formed with this node: start the ranks of the assignment
  kRestart,  // the node's round ended (a rank failed, a node was lost): stop the ranks, join again
};
std::string_view node_state_name(NodeState state);

struct NodeAssignment {
  NodeState state = NodeState::kWaiting;
  uint64_t round = 0;          // the round the node joined (kRunning: the one it runs)
  uint64_t restart_count = 0;  // rounds that ended before this one (round - 1)
  // When kRunning (fixed when the round formed: a member leaving changes none of it):
  uint32_t node_rank = 0;
  uint32_t nnodes = 0;
  uint32_t world_size = 0;
  uint32_t rank_offset = 0;  // the global rank of the node's local rank 0
  std::string master_addr;
  uint16_t master_port = 0;
  std::string why;  // kRestart: why the round ended
};

// The hash of a node's secret the rendezvous keeps (XXH3, 128 bits).
struct NodeSecretHash {
  uint64_t low = 0;
  uint64_t high = 0;
  bool operator==(const NodeSecretHash&) const = default;
};
NodeSecretHash hash_node_secret(std::string_view secret);

class Rendezvous {
 public:
  // The agent joins (or joins again, after a restart) the round that is forming, or the next
  // one when a round runs without it. Fails (and changes nothing) for bad numbers, an `addr`
  // that is no address, a missing or malformed secret; for settings that differ from those of
  // the nodes present (conflict naming the field, the value there and the one sent); for a
  // node present under that name with another secret (conflict, node_secret_mismatch: the name
  // is free once that node is lost or left); for a new node when 2 x max_nodes nodes are
  // present (conflict, rendezvous_full: the round's members and as many waiting).
  // A node present that joins again while it is a member of the running round ends the round.
  Result<NodeAssignment> join(const NodeJoin& join, TimeMs now);
  // The agent's heartbeat and question: where does it stand? Fails with not_found for a node
  // not present (it left, or was lost: join again), node_secret_mismatch for another secret.
  Result<NodeAssignment> poll(std::string_view node, std::string_view secret, TimeMs now);
  // A rank of the node failed in `round`: the round ends (if it is the one running and the node
  // is a member). Fails as poll.
  Result<void> fail(std::string_view node, std::string_view secret, uint64_t round, std::string why,
                    TimeMs now);
  // The node's ranks all finished: it leaves without ending the round, and stays counted in its
  // layout (the others' world size, offsets and master do not change). When no member of the
  // running round is left, the round ends (the waiting nodes form the next). Leaving a node not
  // present succeeds; fails with node_secret_mismatch for another secret.
  Result<void> leave(std::string_view node, std::string_view secret, TimeMs now);

  uint64_t round() const { return round_; }
  bool formed() const { return formed_; }
  // The agents, in the order they joined, with the round each joined.
  struct Node {
    std::string name;
    std::string addr;
    uint32_t nproc = 0;
    uint16_t master_port = 0;
    uint64_t round = 0;
    TimeMs last_seen = 0;
    NodeSecretHash secret;
    bool has_secret = false;  // false only for a node restored from a snapshot older than 6
  };
  // A member of the running round, as it was when the round formed.
  struct Member {
    std::string name;
    uint32_t nproc = 0;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Member>& members() const { return members_; }  // node rank order
  uint32_t min_nodes() const { return min_nodes_; }
  uint32_t max_nodes() const { return max_nodes_; }
  TimeMs settle_ms() const { return settle_ms_; }
  TimeMs node_timeout_ms() const { return node_timeout_ms_; }
  const std::string& master_addr() const { return master_addr_; }
  uint16_t master_port() const { return master_port_; }
  const std::string& last_end() const { return last_end_; }  // why the last round ended
  // What breaks the rendezvous' invariants (for the snapshot codec's paired checks), or empty.
  std::string inconsistency() const;

 private:
  friend class RunCodec;
  Node* find(std::string_view node);
  const Node* find(std::string_view node) const;
  bool lost(const Node& node, TimeMs now) const { return now - node.last_seen > node_timeout_ms_; }
  bool member(std::string_view node) const;
  // The node, when present and `secret` is its own; else the error to answer.
  Result<Node*> check(std::string_view node, std::string_view secret);
  void drop_lost(TimeMs now);
  void maybe_form(TimeMs now);
  void end_round(std::string why, TimeMs now);
  NodeAssignment where(const Node& node) const;

  std::vector<Node> nodes_;
  uint64_t round_ = 1;
  bool formed_ = false;
  // The running round's layout, fixed when it formed.
  std::vector<Member> members_;
  std::string master_addr_;
  uint16_t master_port_ = 0;
  TimeMs last_join_ = 0;
  uint32_t min_nodes_ = 0;  // 0: no agent yet
  uint32_t max_nodes_ = 0;
  TimeMs settle_ms_ = 0;
  TimeMs node_timeout_ms_ = 0;
  std::string last_end_;
};

// Whether `addr` is an IPv4 or IPv6 literal, or a host name of RFC 1123 labels (at most 253
// characters; labels of 1 to 63 letters, digits and '-', neither first nor last).
bool valid_node_addr(std::string_view addr);

}  // namespace traincoord
