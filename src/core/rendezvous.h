// The rendezvous of `traincoord launch` agents, one per node, through the coordinator (no other
// rendezvous service): agents join a round, the round forms once enough nodes joined, each gets
// its node rank, the world size, the master address and the group name its ranks carry; when a
// rank fails or a node is lost, the round ends and the agents that are left join the next one.
// Pure and deterministic: time comes in as arguments (docs/LAUNCH.md has the rules for users).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/error.h"

namespace traincoord {

struct NodeJoin {
  std::string node;  // the agent's name, unique per node
  std::string addr;  // where the node's ranks are reached (MASTER_ADDR when it is node rank 0)
  uint32_t nproc = 1;
  uint16_t master_port = 0;  // a free port on the node, for MASTER_PORT when it is node rank 0
  uint32_t min_nodes = 1;
  uint32_t max_nodes = 1;
  TimeMs settle_ms = 0;         // after min_nodes joined, how long later joins are awaited
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
  // When kRunning:
  uint32_t node_rank = 0;
  uint32_t nnodes = 0;
  uint32_t world_size = 0;
  uint32_t rank_offset = 0;  // the global rank of the node's local rank 0
  std::string master_addr;
  uint16_t master_port = 0;
  std::string why;  // kRestart: why the round ended
};

class Rendezvous {
 public:
  // The agent joins (or joins again, after a restart) the round that is forming, or the next
  // one when a round runs without it. Fails for bad numbers, or min/max that differ from those
  // of the agents already there (conflict).
  Result<NodeAssignment> join(const NodeJoin& join, TimeMs now);
  // The agent's heartbeat and question: where does it stand?
  Result<NodeAssignment> poll(std::string_view node, TimeMs now);
  // A rank of the node failed in `round`: the round ends (if it is the one running).
  Result<void> fail(std::string_view node, uint64_t round, std::string why, TimeMs now);
  // The node's ranks all finished: it leaves without ending the round.
  Result<void> leave(std::string_view node, TimeMs now);

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
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<std::string>& members() const { return members_; }  // node rank order
  uint32_t min_nodes() const { return min_nodes_; }
  uint32_t max_nodes() const { return max_nodes_; }
  const std::string& last_end() const { return last_end_; }  // why the last round ended

 private:
  friend class RunCodec;
  Node* find(std::string_view node);
  void drop_lost(TimeMs now);
  void maybe_form(TimeMs now);
  void end_round(std::string why, TimeMs now);
  NodeAssignment where(const Node& node) const;

  std::vector<Node> nodes_;
  uint64_t round_ = 1;
  bool formed_ = false;
  std::vector<std::string> members_;
  TimeMs last_join_ = 0;
  uint32_t min_nodes_ = 0;  // 0: no agent yet
  uint32_t max_nodes_ = 0;
  TimeMs settle_ms_ = 0;
  TimeMs node_timeout_ms_ = 0;
  std::string last_end_;
};

}  // namespace traincoord
