// A small client of etcd's v3 API (etcd 3.4) over its HTTP/JSON gateway: the key-value calls
// (range, put, txn with compares, delete range, compaction), leases (grant, keep-alive, revoke)
// and the member status. Keys and values go base64 on the wire; this class takes and returns
// raw bytes.
//
// One connection at a time (HTTP/1.1 keep-alive, or HTTPS: TlsFiles) to one member of the endpoint
// list; when a member does not answer within the timeout, refuses the connection, or says it has no
// leader, the call goes to the next member, round and round until give_up_after. Not thread-safe:
// one client per thread.
//
// A call that timed out may still have been applied: a txn retried on another member may find
// its own earlier effect (callers that care make their txns recognise it; see etcd_run_journal.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace traincoord::etcd {

struct KeyValue {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, version = 0, lease = 0;
};

struct RangeResult {
  int64_t revision = 0;  // the store's revision when read
  int64_t count = 0;     // keys in the range (also when only some are returned)
  std::vector<KeyValue> kvs;
};

// A condition of a txn: target(key) op number_or_value.
struct Compare {
  enum class Target { kCreate, kMod, kVersion, kValue, kLease };
  enum class Op { kEqual, kNotEqual, kGreater, kLess };
  Target target = Target::kCreate;
  Op op = Op::kEqual;
  std::string key;
  int64_t number = 0;  // kCreate, kMod, kVersion, kLease
  std::string value;   // kValue
};

// An operation of a txn.
struct Operation {
  enum class Kind { kPut, kDeleteRange, kRange };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;      // kPut
  std::string range_end;  // kDeleteRange, kRange: [key, range_end); empty: the key alone
  int64_t lease = 0;      // kPut: 0 for none
  int64_t limit = 0;      // kRange
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;  // the store's revision after it (of its writes, when it wrote)
  // For each kRange operation of the branch that ran, in order: what it read.
  std::vector<RangeResult> ranges;
};

struct Lease {
  int64_t id = 0;
  int64_t ttl_s = 0;  // 0 from keep_alive: the lease is gone (expired or revoked)
};

struct MemberStatus {
  int64_t revision = 0;
  int64_t db_size = 0;         // bytes of the backend file
  int64_t db_size_in_use = 0;  // bytes of it in use (the rest is free pages)
  std::string version;
  std::string member_id, leader;  // its member ID, and the Raft leader's (decimal)
};

// TLS to etcd (etcdctl's --cacert, --cert, --key): the members are verified against `ca_file`
// (empty: the system's CAs) and the host of their endpoint (a name or an IP address in their
// certificate); with `cert_file`, the client shows that certificate (etcd's
// --client-cert-auth), its key in `key_file` (empty: in `cert_file`).
struct TlsFiles {
  bool enabled = false;  // false: plain HTTP, the files unused
  std::string ca_file, cert_file, key_file;
};

// Checks that the files of `tls` can be used (readable PEM, a key that matches the
// certificate). Returns an error naming the flag ("etcd-cacert", "etcd-cert", "etcd-key") and
// the file, never the key's bytes.
Result<void> check_tls_files(const TlsFiles& tls);

struct ClientOptions {
  std::vector<std::string> endpoints;       // "host:port"
  std::chrono::milliseconds timeout{2000};  // per attempt at one member
  // A call tries the members in turn until one answers or this much time has passed (etcd
  // elects a new Raft leader within about two election timeouts of losing one).
  std::chrono::milliseconds give_up_after{5000};
  TlsFiles tls{};  // HTTPS to every member when enabled
  // Send calls to the member that leads etcd's Raft when it is one of `endpoints`: a write sent
  // to a follower is forwarded to the leader and answered once the follower has applied it too.
  // Looked up (the member's status and the member list, two calls) before the first call, after
  // a call went to another member, and after a reply names a new Raft term.
  bool prefer_leader = false;
};

// The key just past every key that starts with `prefix` (etcd's "prefix" range end).
std::string prefix_end(std::string_view prefix);
std::string base64_encode(std::string_view bytes);
// REQUIRES nothing of `text`; returns false when it is not base64.
bool base64_decode(std::string_view text, std::string* out);

class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Every call returns the error of the last member tried when none answered (kFailedPrecondition
  // with etcd's message when etcd refused the request: its "code" in the message).
  // `revision`: read as of then (0: now); a compacted revision is an error.
  Result<RangeResult> range(std::string_view key, std::string_view range_end = {},
                            int64_t limit = 0, bool count_only = false, int64_t revision = 0);
  Result<int64_t> put(std::string_view key, std::string_view value, int64_t lease = 0);
  Result<TxnResult> txn(const std::vector<Compare>& compares, const std::vector<Operation>& success,
                        const std::vector<Operation>& failure = {});
  Result<int64_t> delete_range(std::string_view key, std::string_view range_end = {});
  Result<Lease> lease_grant(int64_t ttl_s);
  Result<Lease> lease_keep_alive(int64_t id);
  Result<void> lease_revoke(int64_t id);
  // Compacts history up to `revision`; a revision compacted already is not an error.
  Result<void> compact(int64_t revision);
  // The status of the member answering.
  Result<MemberStatus> status();

  // The member the last call went to ("host:port").
  const std::string& current_endpoint() const;

  // etcd's authentication (etcdctl auth enable), from the next connection on: each connection
  // first gets a token from /v3/auth/authenticate as `user` and sends it with every request
  // (the Authorization header). A wrong password fails each call, saying so.
  void authenticate_as(std::string user, std::string password);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace traincoord::etcd
