#include "core/rendezvous.h"

#include <algorithm>

namespace traincoord {

std::string_view node_state_name(NodeState state) {
  switch (state) {
    case NodeState::kWaiting:
      return "waiting";
    case NodeState::kRunning:
      return "running";
    case NodeState::kRestart:
      return "restart";
  }
  return "unknown";
}

Rendezvous::Node* Rendezvous::find(std::string_view node) {
  for (Node& n : nodes_) {
    if (n.name == node) return &n;
  }
  return nullptr;
}

void Rendezvous::end_round(std::string why, TimeMs now) {
  last_end_ = std::move(why);
  round_ += 1;
  formed_ = false;
  members_.clear();
  last_join_ = now;
}

void Rendezvous::drop_lost(TimeMs now) {
  for (size_t i = 0; i < nodes_.size();) {
    const Node& n = nodes_[i];
    if (now - n.last_seen <= node_timeout_ms_) {
      ++i;
      continue;
    }
    const bool member =
        formed_ && std::find(members_.begin(), members_.end(), n.name) != members_.end();
    const std::string why = "node " + n.name + " lost (no heartbeat for " +
                            std::to_string((now - n.last_seen) / 1000) + " s)";
    nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(i));
    if (member) end_round(why, now);
  }
}

void Rendezvous::maybe_form(TimeMs now) {
  if (formed_ || min_nodes_ == 0) return;
  std::vector<Node*> candidates;
  for (Node& n : nodes_) {
    if (n.round == round_) candidates.push_back(&n);
  }
  const bool full = candidates.size() >= max_nodes_;
  const bool settled = candidates.size() >= min_nodes_ && now - last_join_ >= settle_ms_;
  if (!full && !settled) return;
  members_.clear();
  for (Node* n : candidates) {
    if (members_.size() < max_nodes_) {
      members_.push_back(n->name);
    } else {
      n->round = round_ + 1;  // over max_nodes: it joins the next round
    }
  }
  formed_ = true;
}

NodeAssignment Rendezvous::where(const Node& node) const {
  NodeAssignment a;
  a.round = node.round;
  a.restart_count = node.round - 1;
  if (node.round < round_) {
    a.state = NodeState::kRestart;
    a.why = last_end_;
    return a;
  }
  auto rank = std::find(members_.begin(), members_.end(), node.name);
  if (node.round != round_ || !formed_ || rank == members_.end()) return a;  // kWaiting
  a.state = NodeState::kRunning;
  a.node_rank = static_cast<uint32_t>(rank - members_.begin());
  a.nnodes = static_cast<uint32_t>(members_.size());
  for (size_t i = 0; i < members_.size(); ++i) {
    const Node* m = nullptr;
    for (const Node& n : nodes_) {
      if (n.name == members_[i]) m = &n;
    }
    // (a member that finished and left is gone from nodes_: it still counts, with the nproc it
    // ran; its ranks were numbered when the round formed)
    const uint32_t nproc = m ? m->nproc : 0;
    if (i < a.node_rank) a.rank_offset += nproc;
    a.world_size += nproc;
    if (i == 0 && m) {
      a.master_addr = m->addr;
      a.master_port = m->master_port;
    }
  }
  return a;
}

Result<NodeAssignment> Rendezvous::join(const NodeJoin& j, TimeMs now) {
  if (j.nproc < 1 || j.nproc > 1024) return invalid_argument("nproc", "must be between 1 and 1024");
  if (j.min_nodes < 1 || j.max_nodes < j.min_nodes || j.max_nodes > 1024) {
    return invalid_argument("nnodes", "MIN:MAX must have 1 <= MIN <= MAX <= 1024");
  }
  if (j.settle_ms < 0 || j.settle_ms > 3'600'000) {
    return invalid_argument("settle_ms", "must be between 0 and 3600000");
  }
  if (j.node_timeout_ms < 100 || j.node_timeout_ms > 3'600'000) {
    return invalid_argument("node_timeout_ms", "must be between 100 and 3600000");
  }
  if (!nodes_.empty() && (j.min_nodes != min_nodes_ || j.max_nodes != max_nodes_)) {
    return conflict("the agents of this run were started with --nnodes " +
                    std::to_string(min_nodes_) + ":" + std::to_string(max_nodes_) + ", node " +
                    j.node + " with " + std::to_string(j.min_nodes) + ":" +
                    std::to_string(j.max_nodes) + ": start every agent with the same --nnodes");
  }
  drop_lost(now);  // (after the checks: a refused join changes nothing)
  min_nodes_ = j.min_nodes;
  max_nodes_ = j.max_nodes;
  settle_ms_ = j.settle_ms;
  node_timeout_ms_ = j.node_timeout_ms;
  Node* n = find(j.node);
  if (n == nullptr) {
    nodes_.push_back(Node{j.node, {}, 0, 0, 0, 0});
    n = &nodes_.back();
  }
  n->addr = j.addr;
  n->nproc = j.nproc;
  n->master_port = j.master_port;
  n->last_seen = now;
  const bool member =
      formed_ && std::find(members_.begin(), members_.end(), j.node) != members_.end();
  if (member) {  // an agent of the running round joins again: its ranks are gone
    end_round("node " + j.node + " joined again (its agent restarted)", now);
    n = find(j.node);
  }
  if (formed_) {
    n->round = round_ + 1;  // a round runs without it: it joins the next one
  } else {
    n->round = round_;
    last_join_ = now;
  }
  maybe_form(now);
  return where(*n);
}

Result<NodeAssignment> Rendezvous::poll(std::string_view node, TimeMs now) {
  // A refused request changes nothing (the journal keeps only accepted ones): look first.
  Node* n = find(node);
  if (n == nullptr) {
    return not_found("node " + std::string(node) +
                     " is not in the rendezvous (it left, or was lost): join again");
  }
  n->last_seen = now;  // (it is heard now: not lost)
  drop_lost(now);
  n = find(node);
  maybe_form(now);
  return where(*n);
}

Result<void> Rendezvous::fail(std::string_view node, uint64_t round, std::string why,
                              TimeMs now) {
  Node* n = find(node);
  if (n == nullptr) return not_found("node " + std::string(node) + " is not in the rendezvous");
  n->last_seen = now;
  drop_lost(now);
  const bool member =
      formed_ && std::find(members_.begin(), members_.end(), node) != members_.end();
  if (round == round_ && member) end_round("node " + std::string(node) + ": " + why, now);
  return {};
}

Result<void> Rendezvous::leave(std::string_view node, TimeMs now) {
  drop_lost(now);
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const Node& n) { return n.name == node; });
  if (it != nodes_.end()) nodes_.erase(it);
  return {};
}

}  // namespace traincoord
