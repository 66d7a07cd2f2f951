#include "core/rendezvous.h"

#include <arpa/inet.h>
#include <xxhash.h>

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

NodeSecretHash hash_node_secret(std::string_view secret) {
  const XXH128_hash_t h = XXH3_128bits(secret.data(), secret.size());
  return NodeSecretHash{h.low64, h.high64};
}

bool valid_node_addr(std::string_view addr) {
  if (addr.empty() || addr.size() > 253) return false;
  // (inet_pton only parses: no socket, no lookup)
  const std::string text(addr);
  unsigned char bytes[16];
  if (inet_pton(AF_INET, text.c_str(), bytes) == 1) return true;
  if (inet_pton(AF_INET6, text.c_str(), bytes) == 1) return true;
  std::string_view last_label;
  size_t start = 0;
  for (;;) {
    const size_t dot = addr.find('.', start);
    const std::string_view label =
        addr.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (const char c : label) {
      const bool ok =
          (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
      if (!ok) return false;
    }
    last_label = label;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  // A name whose last label is all digits reads as a (bad) IPv4 address, e.g. 10.0.0.300.
  return !std::all_of(last_label.begin(), last_label.end(),
                      [](char c) { return c >= '0' && c <= '9'; });
}

Rendezvous::Node* Rendezvous::find(std::string_view node) {
  for (Node& n : nodes_) {
    if (n.name == node) return &n;
  }
  return nullptr;
}

const Rendezvous::Node* Rendezvous::find(std::string_view node) const {
  for (const Node& n : nodes_) {
    if (n.name == node) return &n;
  }
  return nullptr;
}

bool Rendezvous::member(std::string_view node) const {
  return formed_ && std::any_of(members_.begin(), members_.end(),
                                [&](const Member& m) { return m.name == node; });
}

Result<Rendezvous::Node*> Rendezvous::check(std::string_view node, std::string_view secret) {
  Node* n = find(node);
  if (n == nullptr) {
    return not_found("node " + std::string(node) +
                     " is not in the rendezvous (it left, or was lost): join again");
  }
  if (n->has_secret && n->secret != hash_node_secret(secret)) {
    return conflict("node " + std::string(node) +
                        " joined the rendezvous with another secret: only its own agent may "
                        "speak for it (another agent runs under this name? give each node its "
                        "own --node)",
                    error_reason::kNodeSecretMismatch);
  }
  return n;
}

void Rendezvous::end_round(std::string why, TimeMs now) {
  last_end_ = std::move(why);
  round_ += 1;
  formed_ = false;
  members_.clear();
  master_addr_.clear();
  master_port_ = 0;
  last_join_ = now;
}

void Rendezvous::drop_lost(TimeMs now) {
  for (size_t i = 0; i < nodes_.size();) {
    const Node& n = nodes_[i];
    if (!lost(n, now)) {
      ++i;
      continue;
    }
    const bool was_member = member(n.name) && n.round == round_;
    const std::string why = "node " + n.name + " lost (no heartbeat for " +
                            std::to_string((now - n.last_seen) / 1000) + " s)";
    nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(i));
    if (was_member) end_round(why, now);
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
      members_.push_back(Member{n->name, n->nproc});
    } else {
      n->round = round_ + 1;  // over max_nodes: it joins the next round
    }
  }
  // The layout is fixed now: node rank 0's address and port, each member's processes.
  master_addr_ = candidates.front()->addr;
  master_port_ = candidates.front()->master_port;
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
  auto rank = std::find_if(members_.begin(), members_.end(),
                           [&](const Member& m) { return m.name == node.name; });
  if (node.round != round_ || !formed_ || rank == members_.end()) return a;  // kWaiting
  a.state = NodeState::kRunning;
  a.node_rank = static_cast<uint32_t>(rank - members_.begin());
  a.nnodes = static_cast<uint32_t>(members_.size());
  for (size_t i = 0; i < members_.size(); ++i) {
    // (a member that finished and left still counts: its ranks were numbered when the round
    // formed, and the others' must not move)
    if (i < a.node_rank) a.rank_offset += members_[i].nproc;
    a.world_size += members_[i].nproc;
  }
  a.master_addr = master_addr_;
  a.master_port = master_port_;
  return a;
}

namespace {

// A setting of the whole rendezvous that a joining node must share with the nodes present.
std::string disagreement(std::string_view field, std::string_view flag, int64_t there, int64_t sent,
                         std::string_view node) {
  return "the nodes in the rendezvous of this run joined with " + std::string(field) + " " +
         std::to_string(there) + ", node " + std::string(node) + " sent " + std::to_string(sent) +
         ": start every agent with the same " + std::string(flag) +
         " (the rendezvous takes new settings once every node left or was lost)";
}

}  // namespace

std::string Rendezvous::inconsistency() const {
  if (round_ < 1) return "rendezvous round 0";
  if (formed_ && (members_.empty() || members_.size() > max_nodes_)) {
    return "a formed rendezvous round of " + std::to_string(members_.size()) + " members, most " +
           std::to_string(max_nodes_);
  }
  if (!formed_ && (!members_.empty() || !master_addr_.empty())) {
    return "a rendezvous round not formed, with a layout";
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.round > round_ + 1) return "rendezvous node " + n.name + " of a round to come";
    if (n.nproc < 1 || n.nproc > 1024) return "rendezvous node " + n.name + " without processes";
    for (size_t k = 0; k < i; ++k) {
      if (nodes_[k].name == n.name) return "rendezvous node " + n.name + " twice";
    }
  }
  for (size_t i = 0; i < members_.size(); ++i) {
    for (size_t k = 0; k < i; ++k) {
      if (members_[k].name == members_[i].name) {
        return "rendezvous member " + members_[i].name + " twice";
      }
    }
  }
  return "";
}

Result<NodeAssignment> Rendezvous::join(const NodeJoin& j, TimeMs now) {
  // A refused join changes nothing (the journal keeps only accepted requests): every check
  // comes before the first change.
  if (j.nproc < 1 || j.nproc > 1024) return invalid_argument("nproc", "must be between 1 and 1024");
  if (j.min_nodes < 1 || j.max_nodes < j.min_nodes || j.max_nodes > kMaxRendezvousNodes) {
    return invalid_argument("nnodes", "MIN:MAX must have 1 <= MIN <= MAX <= 1024");
  }
  if (j.settle_ms < 0 || j.settle_ms > kMaxSettleMs) {
    return invalid_argument("settle_ms", "must be between 0 and " + std::to_string(kMaxSettleMs));
  }
  if (j.node_timeout_ms < kMinNodeTimeoutMs || j.node_timeout_ms > kMaxNodeTimeoutMs) {
    return invalid_argument("node_timeout_ms", "must be between " +
                                                   std::to_string(kMinNodeTimeoutMs) + " and " +
                                                   std::to_string(kMaxNodeTimeoutMs));
  }
  if (!valid_node_addr(j.addr)) {
    return invalid_argument("addr",
                            "must be an IPv4 or IPv6 address, or a host name (letters, "
                            "digits, '-' and '.'), where the other nodes reach this one");
  }
  const bool secret_ok =
      j.secret.size() >= kMinNodeSecretBytes && j.secret.size() <= kMaxNodeSecretBytes &&
      std::all_of(j.secret.begin(), j.secret.end(), [](char c) { return c > ' ' && c < 127; });
  if (!secret_ok) {
    return invalid_argument("secret", "must be " + std::to_string(kMinNodeSecretBytes) + " to " +
                                          std::to_string(kMaxNodeSecretBytes) +
                                          " printable ASCII characters, drawn at random by the "
                                          "agent once");
  }
  // The nodes present (a lost one is dropped below: its name and its settings no longer count).
  size_t present = 0;
  for (const Node& n : nodes_) present += !lost(n, now);
  if (present > 0) {
    const std::string_view reason = error_reason::kRendezvousSettingsConflict;
    if (j.min_nodes != min_nodes_ || j.max_nodes != max_nodes_) {
      return conflict("the nodes in the rendezvous of this run joined with --nnodes " +
                          std::to_string(min_nodes_) + ":" + std::to_string(max_nodes_) +
                          ", node " + j.node + " sent " + std::to_string(j.min_nodes) + ":" +
                          std::to_string(j.max_nodes) +
                          ": start every agent with the same --nnodes",
                      reason);
    }
    if (j.settle_ms != settle_ms_) {
      return conflict(disagreement("settle_ms", "--settle", settle_ms_, j.settle_ms, j.node),
                      reason);
    }
    if (j.node_timeout_ms != node_timeout_ms_) {
      return conflict(disagreement("node_timeout_ms", "--node-timeout", node_timeout_ms_,
                                   j.node_timeout_ms, j.node),
                      reason);
    }
  }
  const Node* known = find(j.node);
  if (known != nullptr && lost(*known, now)) known = nullptr;  // (its name is free)
  if (known != nullptr && known->has_secret && known->secret != hash_node_secret(j.secret)) {
    return conflict("node " + j.node +
                        " is in the rendezvous already, joined with another secret: is another "
                        "agent running under this name? Give each node its own --node (the name "
                        "is free once that node leaves, or after --node-timeout without a "
                        "heartbeat)",
                    error_reason::kNodeSecretMismatch);
  }
  // The members of the running round and as many waiting for the next: enough for the next
  // round to take max_nodes whoever of them goes.
  const size_t limit = 2 * static_cast<size_t>(j.max_nodes);
  if (known == nullptr && present >= limit) {
    return conflict("the rendezvous of this run holds " + std::to_string(present) +
                        " nodes already, the most it takes with --nnodes MAX " +
                        std::to_string(j.max_nodes) +
                        " (the running round's and as many "
                        "waiting): node " +
                        j.node + " may join once one leaves or is lost",
                    error_reason::kRendezvousFull);
  }

  drop_lost(now);
  min_nodes_ = j.min_nodes;
  max_nodes_ = j.max_nodes;
  settle_ms_ = j.settle_ms;
  node_timeout_ms_ = j.node_timeout_ms;
  Node* n = find(j.node);
  const bool was_present = n != nullptr;
  if (n == nullptr) {
    nodes_.push_back(Node{j.node, {}, 0, 0, 0, 0, hash_node_secret(j.secret), true});
    n = &nodes_.back();
  }
  n->addr = j.addr;
  n->nproc = j.nproc;
  n->master_port = j.master_port;
  n->last_seen = now;
  n->secret = hash_node_secret(j.secret);
  n->has_secret = true;
  // An agent of the running round joins again: its ranks are gone. (A node under the name of a
  // member that left is another node: it waits for the next round.)
  if (was_present && member(j.node) && n->round == round_) {
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

Result<NodeAssignment> Rendezvous::poll(std::string_view node, std::string_view secret,
                                        TimeMs now) {
  // A refused request changes nothing (the journal keeps only accepted ones): look first.
  Result<Node*> n = check(node, secret);
  if (!n) return tl::unexpected(n.error());
  (*n)->last_seen = now;  // (it is heard now: not lost)
  drop_lost(now);
  maybe_form(now);
  return where(*find(node));
}

Result<void> Rendezvous::fail(std::string_view node, std::string_view secret, uint64_t round,
                              std::string why, TimeMs now) {
  Result<Node*> checked = check(node, secret);
  if (!checked) return tl::unexpected(checked.error());
  (*checked)->last_seen = now;
  drop_lost(now);
  const Node* n = find(node);
  if (round == round_ && member(node) && n->round == round_) {
    end_round("node " + std::string(node) + ": " + why, now);
  }
  return {};
}

Result<void> Rendezvous::leave(std::string_view node, std::string_view secret, TimeMs now) {
  if (find(node) != nullptr) {
    if (Result<Node*> n = check(node, secret); !n) return tl::unexpected(n.error());
  }
  drop_lost(now);
  auto it =
      std::find_if(nodes_.begin(), nodes_.end(), [&](const Node& n) { return n.name == node; });
  if (it == nodes_.end()) return {};
  nodes_.erase(it);
  // The round's layout stays as it formed (the others' ranks keep their numbers). With none of
  // its members left, the round is over: the nodes waiting form the next one.
  if (formed_) {
    const bool anyone_left = std::any_of(nodes_.begin(), nodes_.end(), [&](const Node& n) {
      return n.round == round_ && member(n.name);
    });
    if (!anyone_left) {
      end_round("every node of round " + std::to_string(round_) + " left", now);
      maybe_form(now);
    }
  }
  return {};
}

}  // namespace traincoord
