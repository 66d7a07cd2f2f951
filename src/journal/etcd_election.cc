#include "journal/etcd_election.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

namespace traincoord {

EtcdElection::EtcdElection(const EtcdJournalOptions& options, std::string advertised_url,
                           int64_t ttl_s)
    : prefix_(options.prefix),
      leader_key_(options.prefix + "/leader"),
      url_(std::move(advertised_url)),
      ttl_s_(ttl_s),
      client_(std::make_unique<etcd::Client>(
          // Within a fraction of the lease's TTL: a keep-alive that cannot get through must
          // not hold the leader past it.
          etcd::ClientOptions{options.endpoints,
                              std::min(options.timeout, std::chrono::milliseconds(500)),
                              std::chrono::milliseconds(ttl_s * 1000 / 3), options.tls})) {
  if (!options.user.empty()) client_->authenticate_as(options.user, options.password);
}

EtcdElection::~EtcdElection() = default;

Result<Observation> EtcdElection::observe() {
  using Op = etcd::Operation;
  const std::string snaps = prefix_ + "/snap/", configs = prefix_ + "/config/";
  // (the configs: only their count, to know whether a run has no snapshot yet)
  auto r = client_->txn({}, {{Op::Kind::kRange, leader_key_, {}, {}, 0, 0},
                             {Op::Kind::kRange, prefix_ + "/head", {}, {}, 0, 0},
                             {Op::Kind::kRange, snaps, {}, etcd::prefix_end(snaps), 0, 0},
                             {Op::Kind::kRange, configs, {}, etcd::prefix_end(configs), 0, 1}});
  if (!r) return tl::unexpected(r.error());
  if (r->ranges.size() != 4)
    return failed_precondition("etcd answered a txn of 4 reads with " +
                               std::to_string(r->ranges.size()));
  Observation o;
  if (!r->ranges[0].kvs.empty()) {
    o.leader = LeaderInfo{r->ranges[0].kvs[0].value, r->ranges[0].kvs[0].create_revision};
  }
  if (!r->ranges[1].kvs.empty()) {
    int64_t term = 0;  // (the head is "TERM SEQ TIME", etcd_journal.h)
    std::sscanf(r->ranges[1].kvs[0].value.c_str(), "%" SCNd64 " %" SCNd64, &term, &o.head.seq);
    o.head.revision = r->ranges[1].kvs[0].mod_revision;
  }
  // (a snapshot is "SEQ TIME GEN CHUNKS BYTES")
  int64_t oldest =
      r->ranges[3].count > static_cast<int64_t>(r->ranges[2].kvs.size()) ? 0 : o.head.seq;
  for (const etcd::KeyValue& kv : r->ranges[2].kvs) {
    int64_t seq = 0;
    std::sscanf(kv.value.c_str(), "%" SCNd64, &seq);
    oldest = std::min(oldest, seq);
  }
  o.head.replay_records = std::max<int64_t>(0, o.head.seq - oldest);
  return o;
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
