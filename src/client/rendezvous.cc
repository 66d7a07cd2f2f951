#include "client/rendezvous.h"

#include <utility>

#include "client/reply.h"
#include "json/json_writer.h"

namespace traincoord::client {

Rendezvous::Rendezvous(std::string url, std::string run, std::string token)
    : url_(std::move(url)), run_(std::move(run)), token_(std::move(token)) {}

std::string Rendezvous::what(std::string_view action) const {
  return "POST /v1/runs/" + run_ + "/nodes/" + std::string(action);
}

Result<std::string> Rendezvous::call(std::string_view action, const std::string& body,
                                     std::chrono::milliseconds timeout) const {
  return post(url_, "/v1/runs/" + run_ + "/nodes/" + std::string(action), body, timeout, token_);
}

Result<Assignment> Rendezvous::join(const NodeJoin& join, std::chrono::milliseconds timeout) const {
  JsonWriter j;
  j.begin_object();
  j.field("node", join.node).field("secret", join.secret).field("addr", join.addr);
  j.field("nproc", static_cast<uint64_t>(join.nproc));
  j.field("master_port", static_cast<uint64_t>(join.master_port));
  j.field("min_nodes", static_cast<uint64_t>(join.min_nodes));
  j.field("max_nodes", static_cast<uint64_t>(join.max_nodes));
  j.field("settle_ms", static_cast<uint64_t>(join.settle_ms));
  j.field("node_timeout_ms", static_cast<uint64_t>(join.node_timeout_ms));
  j.end_object();
  auto body = call("join", j.str(), timeout);
  if (!body) return tl::unexpected(body.error());
  return reply::assignment(*body, what("join"));
}

Result<Assignment> Rendezvous::poll(std::string_view node, std::string_view secret,
                                    std::chrono::milliseconds timeout) const {
  JsonWriter j;
  j.begin_object().field("node", node).field("secret", secret).end_object();
  auto body = call("poll", j.str(), timeout);
  if (!body) return tl::unexpected(body.error());
  return reply::assignment(*body, what("poll"));
}

Result<Assignment> Rendezvous::fail(std::string_view node, std::string_view secret, uint64_t round,
                                    std::string_view why, std::chrono::milliseconds timeout) const {
  JsonWriter j;
  j.begin_object().field("node", node).field("secret", secret);
  j.field("round", round).field("why", why).end_object();
  auto body = call("fail", j.str(), timeout);
  if (!body) return tl::unexpected(body.error());
  return reply::assignment(*body, what("fail"));
}

Result<void> Rendezvous::leave(std::string_view node, std::string_view secret,
                               std::chrono::milliseconds timeout) const {
  JsonWriter j;
  j.begin_object().field("node", node).field("secret", secret).end_object();
  auto body = call("leave", j.str(), timeout);
  if (!body) return tl::unexpected(body.error());
  return reply::left(*body, what("leave"));
}

}  // namespace traincoord::client
