#include "journal/etcd_election.h"

#include <algorithm>

namespace traincoord {

EtcdElection::EtcdElection(const EtcdJournalOptions& options, std::string advertised_url,
                           int64_t ttl_s)
    : leader_key_(options.prefix + "/leader"),
      url_(std::move(advertised_url)),
      ttl_s_(ttl_s),
      client_(std::make_unique<etcd::Client>(
          // Within a fraction of the lease's TTL: a keep-alive that cannot get through must
          // not hold the leader past it.
          etcd::ClientOptions{options.endpoints,
                              std::min(options.timeout, std::chrono::milliseconds(500)),
                              std::chrono::milliseconds(ttl_s * 1000 / 3)})) {}

EtcdElection::~EtcdElection() = default;

Result<std::optional<LeaderInfo>> EtcdElection::observe() {
  auto r = client_->range(leader_key_);
  if (!r) return tl::unexpected(r.error());
  if (r->kvs.empty()) return std::optional<LeaderInfo>();
  return std::optional<LeaderInfo>(LeaderInfo{r->kvs[0].value, r->kvs[0].create_revision});
}

Result<std::optional<int64_t>> EtcdElection::campaign() {
  if (lease_ == 0) {
    auto granted = client_->lease_grant(ttl_s_);
    if (!granted) return tl::unexpected(granted.error());
    lease_ = granted->id;
  } else {
    // The lease kept from a lost try may have expired meanwhile.
    auto kept = client_->lease_keep_alive(lease_);
    if (!kept) return tl::unexpected(kept.error());
    if (kept->ttl_s == 0) {
      lease_ = 0;
      return campaign();
    }
  }
  auto r = client_->txn(
      {{etcd::Compare::Target::kCreate, etcd::Compare::Op::kEqual, leader_key_, 0, {}}},
      {{etcd::Operation::Kind::kPut, leader_key_, url_, {}, lease_, 0}});
  if (!r) return tl::unexpected(r.error());
  if (!r->succeeded) return std::optional<int64_t>();
  return std::optional<int64_t>(r->revision);
}

Result<bool> EtcdElection::keep_alive() {
  if (lease_ == 0) return false;
  auto kept = client_->lease_keep_alive(lease_);
  if (!kept) return tl::unexpected(kept.error());
  if (kept->ttl_s == 0) lease_ = 0;
  return kept->ttl_s > 0;
}

void EtcdElection::resign() {
  if (lease_ == 0) return;
  (void)client_->lease_revoke(lease_);  // (unreachable: it expires after its TTL instead)
  lease_ = 0;
}

}  // namespace traincoord
