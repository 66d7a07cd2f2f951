#include "journal/etcd_run_journal.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "core/run_codec.h"
#include "journal/etcd_records.h"

namespace traincoord {

using namespace etcd_records;  // NOLINT: the record codec

namespace {

constexpr size_t kMaxOps = 100;  // etcd takes at most 128 operations per txn by default
constexpr const char* kLayout = "runs 1";

std::string head_value(int64_t term, int64_t seq, TimeMs time) {
  return std::to_string(term) + " " + std::to_string(seq) + " " + std::to_string(time);
}

bool parse_head(const std::string& value, int64_t* term, int64_t* seq, TimeMs* time) {
  int64_t t = 0;
  if (std::sscanf(value.c_str(), "%" SCNd64 " %" SCNd64 " %" SCNd64, term, seq, &t) != 3)
    return false;
  *time = t;
  return true;
}

std::string make_key(const std::string& prefix, std::string_view kind, std::string_view run) {
  std::string k = prefix + "/" + std::string(kind);
  if (!run.empty()) k += "/" + escape(run);
  return k;
}

Error lost_error(const std::string& what) {
  return failed_precondition(what, error_reason::kNotLeader).value();
}

}  // namespace

// -- RunCopyJournal --

Result<void> RunCopyJournal::for_each_record(const std::function<Result<void>(const Record&)>& fn) {
  for (const Record& r : copy_.records) {
    if (auto done = fn(r); !done) return done;
  }
  return {};
}
void RunCopyJournal::add_run(const std::string&, std::string_view, std::string_view, TimeMs) {
  TC_ASSERT(false);
}
void RunCopyJournal::add_record(std::string_view, TimeMs, RecordKind, std::string_view,
                                std::string_view, int, std::string_view) {
  TC_ASSERT(false);
}
void RunCopyJournal::add_config(const std::string&, std::string_view, std::string_view) {
  TC_ASSERT(false);
}
std::unique_ptr<JournalBatch> RunCopyJournal::take(const Engine&, bool, TimeMs) {
  TC_ASSERT(false);
  return nullptr;
}
Result<void> RunCopyJournal::write(const JournalBatch&) {
  TC_ASSERT(false);
  return {};
}
Result<void> RunCopyJournal::replace_config(const Run&, std::string_view, std::string_view,
                                            TimeMs) {
  TC_ASSERT(false);
  return {};
}

// -- EtcdRunElection --

EtcdRunElection::EtcdRunElection(const EtcdJournalOptions& options, std::string advertised_url,
                                 int64_t ttl_s)
    : options_(options),
      url_(std::move(advertised_url)),
      ttl_s_(ttl_s),
      client_(std::make_unique<etcd::Client>(
          // Within a fraction of the lease's TTL: a keep-alive that cannot get through must
          // not hold the leaderships past it.
          etcd::ClientOptions{options.endpoints,
                              std::min(options.timeout, std::chrono::milliseconds(500)),
                              std::chrono::milliseconds(ttl_s * 1000 / 3), options.tls})) {
  if (!options.user.empty()) client_->authenticate_as(options.user, options.password);
}

EtcdRunElection::~EtcdRunElection() = default;

std::string EtcdRunElection::key(std::string_view kind, std::string_view run) const {
  return make_key(options_.prefix, kind, run);
}

Result<void> EtcdRunElection::join() {
  if (stale_lease_ != 0) {
    // A lease given up while etcd could not be reached: its keys go now, not after its TTL
    // (etcd renews every lease's TTL when it elects a new Raft leader).
    auto revoked = client_->lease_revoke(stale_lease_);
    if (!revoked && revoked.error().message.find("lease not found") == std::string::npos) {
      return tl::unexpected(revoked.error());  // (expired meanwhile: nothing left to revoke)
    }
    stale_lease_ = 0;
  }
  if (lease_ == 0) {
    auto granted = client_->lease_grant(ttl_s_);
    if (!granted) return tl::unexpected(granted.error());
    lease_ = granted->id;
  }
  using C = etcd::Compare;
  using Op = etcd::Operation;
  auto r = client_->txn({{C::Target::kCreate, C::Op::kEqual, key("head"), 0, {}},
                         {C::Target::kCreate, C::Op::kEqual, key("leader"), 0, {}}},
                        {{Op::Kind::kPut, key("layout"), kLayout, {}, 0, 0},
                         {Op::Kind::kPut, key("member", url_), url_, {}, lease_, 0}});
  if (!r) return tl::unexpected(r.error());
  if (!r->succeeded)
    return failed_precondition(
        "etcd prefix " + options_.prefix +
        " holds runs written by the per-process layout of an older traincoord (a " +
        options_.prefix + "/head or " + options_.prefix +
        "/leader key), which leadership per run does not read: serve them with that version, "
        "or start these runs under a new prefix (--journal etcd://.../NEW_PREFIX)");
  return {};
}

Result<RunsObservation> EtcdRunElection::observe() {
  using Op = etcd::Operation;
  const std::string leaders = key("leader") + "/", heads = key("head") + "/",
                    snaps = key("snap") + "/", members = key("member") + "/";
  auto r = client_->txn({}, {{Op::Kind::kRange, leaders, {}, etcd::prefix_end(leaders), 0, 0},
                             {Op::Kind::kRange, heads, {}, etcd::prefix_end(heads), 0, 0},
                             {Op::Kind::kRange, snaps, {}, etcd::prefix_end(snaps), 0, 0},
                             {Op::Kind::kRange, members, {}, etcd::prefix_end(members), 0, 0}});
  if (!r) return tl::unexpected(r.error());
  if (r->ranges.size() != 4)
    return failed_precondition("etcd answered a txn of 4 reads with " +
                               std::to_string(r->ranges.size()));
  std::map<std::string, RunInEtcd> runs;
  for (const etcd::KeyValue& kv : r->ranges[1].kvs) {
    RunInEtcd& run = runs[unescape(kv.key.substr(heads.size()))];
    int64_t term = 0;
    parse_head(kv.value, &term, &run.head_seq, &run.head_time);
    run.head_revision = kv.mod_revision;
    run.replay_records = run.head_seq;
  }
  for (const etcd::KeyValue& kv : r->ranges[0].kvs) {
    auto it = runs.find(unescape(kv.key.substr(leaders.size())));
    if (it == runs.end()) continue;  // (a leader key is never without its head)
    it->second.leader = kv.value;
    it->second.term = kv.create_revision;
  }
  for (const etcd::KeyValue& kv : r->ranges[2].kvs) {
    auto it = runs.find(unescape(kv.key.substr(snaps.size())));
    if (it == runs.end()) continue;
    int64_t seq = 0;  // (a snapshot is "SEQ TIME GEN CHUNKS BYTES Z")
    std::sscanf(kv.value.c_str(), "%" SCNd64, &seq);
    it->second.replay_records = std::max<int64_t>(0, it->second.head_seq - seq);
  }
  RunsObservation o;
  for (auto& [name, run] : runs) {
    run.run = name;
    o.runs.push_back(std::move(run));
  }
  o.members = static_cast<size_t>(r->ranges[3].count);
  for (const etcd::KeyValue& kv : r->ranges[3].kvs) o.member_urls.push_back(kv.value);
  return o;
}

size_t EtcdRunElection::share(const RunsObservation& seen) {
  const size_t members = std::max<size_t>(1, seen.members);
  return std::max<size_t>(1, (seen.runs.size() + members - 1) / members);
}

Result<std::optional<int64_t>> EtcdRunElection::campaign(const std::string& run) {
  if (lease_ == 0) return failed_precondition("campaign for run " + run + " before join()");
  using C = etcd::Compare;
  auto r = client_->txn({{C::Target::kCreate, C::Op::kEqual, key("leader", run), 0, {}},
                         {C::Target::kCreate, C::Op::kGreater, key("head", run), 0, {}}},
                        {{etcd::Operation::Kind::kPut, key("leader", run), url_, {}, lease_, 0}},
                        {{etcd::Operation::Kind::kRange, key("leader", run), {}, {}, 0, 0}});
  if (!r) return tl::unexpected(r.error());
  if (!r->succeeded) {
    // Sent again after a timeout, it may find its own first try applied (the key under this
    // lease, which no other coordinator holds): won, its term that key's create revision.
    // Taken for lost, the key would stay, led by no one, until this lease ends.
    if (r->ranges.size() == 1 && r->ranges[0].kvs.size() == 1 &&
        r->ranges[0].kvs[0].lease == lease_ && r->ranges[0].kvs[0].value == url_) {
      return std::optional<int64_t>(r->ranges[0].kvs[0].create_revision);
    }
    return std::optional<int64_t>();
  }
  return std::optional<int64_t>(r->revision);
}

Result<RunCopy> EtcdRunElection::read(const std::string& run) {
  const std::string where = "etcd prefix " + options_.prefix + ", run " + run;
  RunCopy copy;
  auto head = client_->range(key("head", run));
  if (!head) return tl::unexpected(head.error());
  if (head->kvs.empty()) return not_found(where + ": no such run", error_reason::kRunNotFound);
  int64_t term = 0;
  if (!parse_head(head->kvs[0].value, &term, &copy.head_seq, &copy.head_time))
    return failed_precondition(where + ": its head key holds '" + head->kvs[0].value.substr(0, 80) +
                               "', not 'TERM SEQ TIME'");
  copy.head_revision = head->kvs[0].mod_revision;
  auto config = client_->range(key("config", run));
  if (!config) return tl::unexpected(config.error());
  if (config->kvs.empty()) return failed_precondition(where + ": its config key is missing");
  SavedRun& saved = copy.saved;
  saved.name = run;
  const std::string& value = config->kvs[0].value;
  const auto a = value.find('\n');
  const auto b = a == std::string::npos ? a : value.find('\n', a + 1);
  if (b == std::string::npos) return failed_precondition(where + ": its config is damaged");
  saved.config_format = value.substr(0, a);
  saved.created_ms = std::strtoll(value.c_str() + a + 1, nullptr, 10);
  saved.config_text = value.substr(b + 1);
  auto snap = client_->range(key("snap", run));
  if (!snap) return tl::unexpected(snap.error());
  if (!snap->kvs.empty()) {
    int64_t seq = 0, time = 0, gen = 0, chunks = 0, bytes = 0;
    if (std::sscanf(snap->kvs[0].value.c_str(),
                    "%" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64, &seq, &time, &gen,
                    &chunks, &bytes) != 5)
      return failed_precondition(where + ": its snapshot key is damaged");
    // (" Z" after BYTES: the chunks hold the state deflated, as pack_records writes it)
    char packed = 0;
    std::sscanf(snap->kvs[0].value.c_str(), "%*s %*s %*s %*s %*s %c", &packed);
    auto parts = range_all(*client_, key("chunk", run) + "/" + pad20(gen) + "/");
    if (!parts) return tl::unexpected(parts.error());
    std::string state;
    for (const auto& p : *parts) state += p.value;
    if (static_cast<int64_t>(parts->size()) != chunks ||
        static_cast<int64_t>(state.size()) != bytes)
      return failed_precondition(where + ": its snapshot has " + std::to_string(parts->size()) +
                                 " chunks, " + std::to_string(state.size()) +
                                 " bytes; its key says " + std::to_string(chunks) + ", " +
                                 std::to_string(bytes));
    if (packed == 'Z') {
      std::string raw;
      if (state.empty() || state[0] != 'Z' || !unpack_records(state, &raw))
        return failed_precondition(where + ": its snapshot does not inflate");
      state = std::move(raw);
    }
    saved.snapshot = std::move(state);
    saved.snapshot_seq = seq;
  }
  auto logs = range_all(*client_, key("log", run) + "/");
  if (!logs) return tl::unexpected(logs.error());
  for (const auto& kv : *logs) {
    std::vector<Record> records;
    std::string raw;
    if (!unpack_records(kv.value, &raw) || !decode_records(run, raw, &records))
      return failed_precondition(where + ": the record key " + kv.key + " is damaged");
    for (Record& r : records) {
      if (r.seq <= saved.snapshot_seq) continue;  // covered by the snapshot
      if (r.seq > copy.head_seq)
        return failed_precondition(where + ": record " + std::to_string(r.seq) +
                                   " is past its head (" + std::to_string(copy.head_seq) + ")");
      copy.records.push_back(std::move(r));
    }
  }
  std::sort(copy.records.begin(), copy.records.end(),
            [](const Record& x, const Record& y) { return x.seq < y.seq; });
  return copy;
}

Result<bool> EtcdRunElection::keep_alive() {
  if (lease_ == 0) return false;
  auto kept = client_->lease_keep_alive(lease_);
  if (!kept) return tl::unexpected(kept.error());
  if (kept->ttl_s == 0) lease_ = 0;
  return kept->ttl_s > 0;
}

bool EtcdRunElection::resign(const std::string& run, int64_t term) {
  if (lease_ == 0) return true;
  // (unanswered: the caller tries again; the key goes with the lease meanwhile, if it ends)
  std::vector<etcd::Compare> compares{
      {etcd::Compare::Target::kLease, etcd::Compare::Op::kEqual, key("leader", run), lease_, {}}};
  // (a later leadership of the run won here meanwhile keeps its key)
  if (term > 0) {
    compares.push_back(
        {etcd::Compare::Target::kCreate, etcd::Compare::Op::kEqual, key("leader", run), term, {}});
  }
  return client_
      ->txn(compares, {{etcd::Operation::Kind::kDeleteRange, key("leader", run), {}, {}, 0, 0}})
      .has_value();
}

void EtcdRunElection::resign_all() {
  if (lease_ == 0) return;
  if (!client_->lease_revoke(lease_)) stale_lease_ = lease_;  // (revoked at the next join())
  lease_ = 0;
}

// -- EtcdRunJournal --

struct EtcdRunJournal::Lead {
  uint64_t generation = 0;
  std::atomic<int64_t> term{0};  // 0: created here, not yet written
  bool created_here = false;     // (add_run; else lead(): a takeover)
  int64_t lease = 0;
  TimeMs created_ms = 0;  // when the run was created (its config key says it again)
  // The commit thread's.
  int64_t head_revision = 0;
  int64_t written_seq = 0;
  TimeMs written_time = 0;
  int64_t next_gen = 0;
  // The engine thread's (take).
  int64_t next_seq = 1;
  uint64_t since_snapshot = 0;
  int64_t last_seq = 0;
};

class EtcdRunJournal::Batch final : public JournalBatch {
 public:
  struct Snapshot {
    int64_t seq;
    TimeMs time;
    std::string state;
  };
  // What one leadership (generation) of one run writes.
  struct Part {
    std::string run;
    uint64_t generation = 0;
    std::shared_ptr<Lead> lead;
    std::optional<SavedRun> created;  // its config, when it was created here
    std::optional<SavedRun> config;   // a replaced config
    std::vector<Record> records;
    std::optional<Snapshot> snapshot;  // the latest
  };
  std::vector<Part> parts;  // in the order taken
  uint64_t completions = 0;

  Part& part(const std::string& run, uint64_t generation, std::shared_ptr<Lead> lead) {
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      if (it->run == run && it->generation == generation) return *it;
    }
    parts.push_back(Part{run, generation, std::move(lead), {}, {}, {}, {}});
    return parts.back();
  }
  bool empty() const override { return parts.empty() && completions == 0; }
  void append(JournalBatch&& later_batch) override {
    auto& later = static_cast<Batch&>(later_batch);
    for (Part& p : later.parts) {
      Part& into = part(p.run, p.generation, p.lead);
      if (p.created) into.created = std::move(p.created);
      if (p.config) into.config = std::move(p.config);
      into.records.insert(into.records.end(), std::make_move_iterator(p.records.begin()),
                          std::make_move_iterator(p.records.end()));
      if (p.snapshot) into.snapshot = std::move(p.snapshot);
    }
    later.parts.clear();
    completions += later.completions;
    later.completions = 0;
  }
};

EtcdRunJournal::EtcdRunJournal(EtcdJournalOptions options)
    : options_(std::move(options)),
      // Writes go to etcd's Raft leader (prefer_leader): not forwarded by a follower.
      client_(std::make_unique<etcd::Client>(
          etcd::ClientOptions{options_.endpoints, options_.timeout, std::chrono::milliseconds(5000),
                              options_.tls, /*prefer_leader=*/true})) {
  if (!options_.user.empty()) client_->authenticate_as(options_.user, options_.password);
}

EtcdRunJournal::~EtcdRunJournal() = default;

std::string EtcdRunJournal::key(std::string_view kind, std::string_view run) const {
  return make_key(options_.prefix, kind, run);
}

std::string EtcdRunJournal::describe() const {
  std::string hosts;
  for (const auto& e : options_.endpoints) hosts += (hosts.empty() ? "" : ",") + e;
  return (options_.tls.enabled ? "etcds://" : "etcd://") +
         (options_.user.empty() ? "" : options_.user + "@") + hosts + options_.prefix;
}

void EtcdRunJournal::set_advertised_url(std::string url) {
  std::lock_guard lock(mu_);
  url_ = std::move(url);
}

uint64_t EtcdRunJournal::lead(const std::string& run, int64_t term, int64_t lease,
                              const RunCopy& copy) {
  auto lead = std::make_shared<Lead>();
  lead->term = term;
  lead->lease = lease;
  lead->created_ms = copy.saved.created_ms;
  lead->head_revision = copy.head_revision;
  lead->written_seq = copy.head_seq;
  lead->written_time = copy.head_time;
  lead->next_seq = copy.head_seq + 1;
  lead->last_seq = copy.head_seq;
  lead->since_snapshot = copy.records.size();
  std::lock_guard lock(mu_);
  lead->generation = next_generation_++;
  led_[run] = lead;
  return lead->generation;
}

void EtcdRunJournal::forget(const std::string& run, std::optional<int64_t> term) {
  std::lock_guard lock(mu_);
  auto it = led_.find(run);
  if (it == led_.end()) return;
  // (term 0: the leadership of a run created here, whose term the Leadership may not know yet
  // though its first write gave it one)
  if (term && it->second->term.load() != *term && !(*term == 0 && it->second->created_here)) {
    return;
  }
  led_.erase(it);
}

std::pair<uint64_t, int64_t> EtcdRunJournal::leadership_of(std::string_view run) const {
  std::lock_guard lock(mu_);
  auto it = led_.find(run);
  if (it == led_.end()) return {0, 0};
  return {it->second->generation, it->second->term.load()};
}

std::vector<std::string> EtcdRunJournal::runs() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, lead] : led_) names.push_back(name);
  return names;
}

std::vector<Journal::LostRun> EtcdRunJournal::take_lost() {
  std::lock_guard lock(mu_);
  return std::exchange(lost_, {});
}

std::vector<std::pair<std::string, int64_t>> EtcdRunJournal::take_won() {
  std::lock_guard lock(mu_);
  return std::exchange(won_, {});
}

void EtcdRunJournal::add_run(const std::string& name, std::string_view format,
                             std::string_view text, TimeMs created) {
  auto lead = std::make_shared<Lead>();
  lead->lease = lease_for_new_.load();
  lead->created_ms = created;
  lead->created_here = true;
  {
    std::lock_guard lock(mu_);
    lead->generation = next_generation_++;
    led_[name] = lead;
  }
  if (!pending_) pending_ = std::make_unique<Batch>();
  pending_->part(name, lead->generation, lead).created =
      SavedRun{name, std::string(format), std::string(text), created, std::nullopt, 0};
}

std::shared_ptr<EtcdRunJournal::Lead> EtcdRunJournal::lead_of(std::string_view run) const {
  std::lock_guard lock(mu_);
  auto it = led_.find(run);
  return it == led_.end() ? nullptr : it->second;
}

void EtcdRunJournal::add_record(std::string_view run, TimeMs time, RecordKind kind,
                                std::string_view target, std::string_view body, int outcome,
                                std::string_view reply) {
  const std::shared_ptr<Lead> lead = lead_of(run);
  if (!lead) return;  // not led here (any more): never written
  if (!pending_) pending_ = std::make_unique<Batch>();
  Record r;
  r.run = std::string(run);
  r.time = time;
  r.kind = kind;
  r.outcome = outcome;
  r.target = std::string(target);
  r.body = std::string(body);
  if (kind == RecordKind::kRequest && outcome != kOutcomeParked) r.reply = std::string(reply);
  pending_->part(r.run, lead->generation, lead).records.push_back(std::move(r));
}

void EtcdRunJournal::add_completion(const CompletionRow&) {
  // The query views (history) come from the engine; etcd keeps only what replay needs.
  if (!pending_) pending_ = std::make_unique<Batch>();
  pending_->completions += 1;
}

void EtcdRunJournal::add_config(const std::string& run, std::string_view format,
                                std::string_view text) {
  const std::shared_ptr<Lead> lead = lead_of(run);
  if (!lead) return;  // not led here (any more): never written
  if (!pending_) pending_ = std::make_unique<Batch>();
  pending_->part(run, lead->generation, lead).config =
      SavedRun{run, std::string(format), std::string(text), lead->created_ms, std::nullopt, 0};
}

std::unique_ptr<JournalBatch> EtcdRunJournal::take(const Engine& engine, bool snapshots,
                                                   TimeMs now) {
  auto batch = pending_ ? std::move(pending_) : std::make_unique<Batch>();
  for (Batch::Part& part : batch->parts) {
    Lead& lead = *part.lead;
    for (Record& r : part.records) {
      r.seq = lead.next_seq++;
      lead.last_seq = r.seq;
      lead.since_snapshot += 1;
    }
    // A changed config goes with a snapshot of the run under it (one txn: the config key, the
    // snapshot's key, the head), so no leader replays records of the old config under the new.
    if (part.config && !part.snapshot) {
      if (auto run = engine.find(part.run)) {
        part.snapshot = Batch::Snapshot{lead.last_seq, now, RunCodec::save(**run)};
        lead.since_snapshot = 0;
      }
    }
  }
  if (snapshots) {
    std::vector<std::pair<std::string, std::shared_ptr<Lead>>> led;
    {
      std::lock_guard lock(mu_);
      for (const auto& [name, lead] : led_) led.emplace_back(name, lead);
    }
    for (auto& [name, lead] : led) {
      if (lead->since_snapshot < options_.snapshot_every) continue;
      auto run = engine.find(name);
      if (!run) continue;
      batch->part(name, lead->generation, lead).snapshot =
          Batch::Snapshot{lead->last_seq, now, RunCodec::save(**run)};
      lead->since_snapshot = 0;
    }
  }
  return batch;
}

Result<void> EtcdRunJournal::create(Lead& lead, const std::string& run, const SavedRun& config) {
  std::string url;
  {
    std::lock_guard lock(mu_);
    url = url_;
  }
  using C = etcd::Compare;
  using Op = etcd::Operation;
  const std::string leader = key("leader", run), head = key("head", run);
  auto r = client_->txn(
      {{C::Target::kCreate, C::Op::kEqual, leader, 0, {}},
       {C::Target::kCreate, C::Op::kEqual, head, 0, {}}},
      {{Op::Kind::kPut, leader, url, {}, lead.lease, 0},
       {Op::Kind::kPut,
        key("config", run),
        config.config_format + "\n" + std::to_string(config.created_ms) + "\n" + config.config_text,
        {},
        0,
        0},
       {Op::Kind::kPut, head, head_value(0, 0, config.created_ms), {}, 0, 0}},
      {{Op::Kind::kRange, leader, {}, {}, 0, 0}, {Op::Kind::kRange, head, {}, {}, 0, 0}});
  if (!r) return tl::unexpected(r.error());
  txns_ += 1;
  if (r->succeeded) {
    lead.term = r->revision;
    lead.head_revision = r->revision;
  } else {
    // Sent again after a timeout, it may find its own first try applied.
    const bool ours = r->ranges.size() == 2 && r->ranges[0].kvs.size() == 1 &&
                      r->ranges[0].kvs[0].lease == lead.lease && r->ranges[1].kvs.size() == 1 &&
                      r->ranges[1].kvs[0].mod_revision == r->ranges[0].kvs[0].create_revision;
    if (!ours) {
      refused_ += 1;
      return tl::unexpected(lost_error("run " + run + " exists in " + describe() + " already" +
                                       (r->ranges.size() == 2 && r->ranges[0].kvs.size() == 1
                                            ? " (led by " + r->ranges[0].kvs[0].value + ")"
                                            : std::string()) +
                                       "; this coordinator does not lead it"));
    }
    lead.term = r->ranges[0].kvs[0].create_revision;
    lead.head_revision = r->ranges[1].kvs[0].mod_revision;
  }
  lead.written_time = config.created_ms;
  std::lock_guard lock(mu_);
  won_.emplace_back(run, lead.term.load());
  return {};
}

Result<void> EtcdRunJournal::write_chunks(Lead& lead, const std::string& run,
                                          const std::string& state, int64_t gen) {
  // Under a generation of their own, conditioned on the leadership only: until the snapshot's
  // key names the generation, they are not read (and the next snapshot deletes them).
  const std::string base = key("chunk", run) + "/" + pad20(gen) + "/";
  const std::string leader = key("leader", run);
  size_t at = 0, index = 0;
  do {
    std::vector<etcd::Operation> ops;
    size_t bytes = 0;
    do {
      const size_t n = std::min(options_.chunk_bytes, state.size() - at);
      char name[16];
      std::snprintf(name, sizeof name, "%06zu", index++);
      ops.push_back({etcd::Operation::Kind::kPut, base + name, state.substr(at, n), {}, 0, 0});
      at += n;
      bytes += n;
    } while (at < state.size() && bytes + options_.chunk_bytes <= options_.txn_bytes &&
             ops.size() < kMaxOps);
    auto r = client_->txn(
        {{etcd::Compare::Target::kCreate, etcd::Compare::Op::kEqual, leader, lead.term, {}},
         {etcd::Compare::Target::kLease, etcd::Compare::Op::kEqual, leader, lead.lease, {}}},
        ops);
    if (!r) return tl::unexpected(r.error());
    txns_ += 1;
    if (!r->succeeded) {
      refused_ += 1;
      return tl::unexpected(lost_error("the leadership of run " + run + " (term " +
                                       std::to_string(lead.term.load()) +
                                       ") has ended; nothing more is written under it"));
    }
  } while (at < state.size());
  return {};
}

Result<void> EtcdRunJournal::fenced_txn(Lead& lead, const std::string& run,
                                        std::vector<etcd::Operation> ops, int64_t seq,
                                        TimeMs time) {
  const std::string leader = key("leader", run), head = key("head", run);
  const std::string value = head_value(lead.term, seq, time);
  ops.push_back({etcd::Operation::Kind::kPut, head, value, {}, 0, 0});
  auto r = client_->txn(
      {{etcd::Compare::Target::kCreate, etcd::Compare::Op::kEqual, leader, lead.term, {}},
       {etcd::Compare::Target::kLease, etcd::Compare::Op::kEqual, leader, lead.lease, {}},
       {etcd::Compare::Target::kMod, etcd::Compare::Op::kEqual, head, lead.head_revision, {}}},
      ops,
      {{etcd::Operation::Kind::kRange, leader, {}, {}, 0, 0},
       {etcd::Operation::Kind::kRange, head, {}, {}, 0, 0}});
  if (!r) return tl::unexpected(r.error());
  txns_ += 1;
  if (r->succeeded) {
    lead.head_revision = r->revision;
  } else {
    // A txn sent again to another member after a timeout may find its own first try applied.
    const bool ours = r->ranges.size() == 2 && r->ranges[0].kvs.size() == 1 &&
                      r->ranges[0].kvs[0].create_revision == lead.term &&
                      r->ranges[1].kvs.size() == 1 && r->ranges[1].kvs[0].value == value;
    if (!ours) {
      refused_ += 1;
      const std::string who = r->ranges.size() == 2 && r->ranges[0].kvs.size() == 1
                                  ? "the coordinator at " + r->ranges[0].kvs[0].value +
                                        " leads it since revision " +
                                        std::to_string(r->ranges[0].kvs[0].create_revision)
                                  : std::string("no coordinator leads it now");
      return tl::unexpected(lost_error("the leadership of run " + run + " (term " +
                                       std::to_string(lead.term.load()) + ") has ended (" + who +
                                       "); this write was refused and nothing of it written"));
    }
    lead.head_revision = r->ranges[1].kvs[0].mod_revision;
  }
  lead.written_seq = seq;
  lead.written_time = time;
  last_revision_ = std::max(last_revision_, lead.head_revision);
  return {};
}

Result<void> EtcdRunJournal::write(const JournalBatch& taken) {
  const auto& batch = static_cast<const Batch&>(taken);
  std::string failures;
  bool wrote = false;
  for (const Batch::Part& part : batch.parts) {
    Lead& lead = *part.lead;
    {
      std::lock_guard lock(mu_);
      auto it = led_.find(part.run);
      if (it == led_.end() || it->second->generation != part.generation) continue;  // not led
    }
    auto written = [&]() -> Result<void> {
      if (part.created) {
        if (auto r = create(lead, part.run, *part.created); !r) return r;
      }
      std::optional<int64_t> gen;
      // The snapshot deflated (zlib's fastest level, as the records): a run's state is mostly
      // numbers much alike, and each byte costs etcd a Raft round's share and each member's WAL.
      std::string stored;
      if (part.snapshot) {
        gen = lead.term.load() * 1'000'000 + lead.next_gen++;
        stored = pack_records(part.snapshot->state);
        if (auto r = write_chunks(lead, part.run, stored, *gen); !r) return r;
        snapshot_bytes_ += stored.size();
        snapshots_ += 1;
      }
      std::vector<etcd::Operation> ops;
      size_t bytes = 0;
      int64_t seq = lead.written_seq;
      TimeMs time = lead.written_time;
      auto flush = [&]() -> Result<void> {
        if (ops.empty()) return {};
        auto r = fenced_txn(lead, part.run, std::move(ops), seq, time);
        ops.clear();
        bytes = 0;
        return r;
      };
      auto add = [&](etcd::Operation op) -> Result<void> {
        const size_t size = op.key.size() + op.value.size();
        if (!ops.empty() && (ops.size() + 1 >= kMaxOps || bytes + size > options_.txn_bytes)) {
          if (auto r = flush(); !r) return r;
        }
        bytes += size;
        ops.push_back(std::move(op));
        return {};
      };
      // Ops that must land in one txn (a changed config and the snapshot under it): after what
      // is gathered, in a txn of their own when they would not fit beside it.
      auto add_together = [&](std::vector<etcd::Operation> together) -> Result<void> {
        size_t size = 0;
        for (const etcd::Operation& op : together) size += op.key.size() + op.value.size();
        if (!ops.empty() &&
            (ops.size() + together.size() >= kMaxOps || bytes + size > options_.txn_bytes)) {
          if (auto r = flush(); !r) return r;
        }
        bytes += size;
        for (etcd::Operation& op : together) ops.push_back(std::move(op));
        return {};
      };
      std::optional<etcd::Operation> config;
      if (part.config) {
        const SavedRun& c = *part.config;
        config = etcd::Operation{
            etcd::Operation::Kind::kPut,
            key("config", part.run),
            c.config_format + "\n" + std::to_string(c.created_ms) + "\n" + c.config_text,
            {},
            0,
            0};
        // (without a snapshot, which take() always adds unless the run is gone: alone)
        if (!part.snapshot) {
          if (auto r = add_together({std::move(*config)}); !r) return r;
        }
      }
      // The records (those the snapshot of this batch covers are not written: etcd refuses a
      // txn that writes a key and deletes it).
      std::string value;
      int64_t last = 0;
      auto put_log = [&]() -> Result<void> {
        if (value.empty()) return {};
        std::string packed = pack_records(value);
        record_bytes_ += packed.size();
        auto r = add({etcd::Operation::Kind::kPut,
                      key("log", part.run) + "/" + pad20(last),
                      std::move(packed),
                      {},
                      0,
                      0});
        value.clear();
        return r;
      };
      for (const Record& rec : part.records) {
        TC_ASSERT(rec.seq > seq);  // written in the order taken
        seq = rec.seq;
        time = std::max(time, rec.time);
        if (part.snapshot && rec.seq <= part.snapshot->seq) continue;
        encode_record(rec, &value);
        last = rec.seq;
        if (value.size() >= options_.txn_bytes / 2) {
          if (auto r = put_log(); !r) return r;
        }
      }
      if (auto r = put_log(); !r) return r;
      if (part.snapshot) {
        const auto& snap = *part.snapshot;
        time = std::max(time, snap.time);
        const std::string chunks = key("chunk", part.run) + "/";
        const size_t count =
            stored.empty() ? 1 : (stored.size() + options_.chunk_bytes - 1) / options_.chunk_bytes;
        char meta[128];
        std::snprintf(meta, sizeof meta, "%" PRId64 " %" PRId64 " %" PRId64 " %zu %zu Z", snap.seq,
                      static_cast<int64_t>(snap.time), *gen, count, stored.size());
        // The snapshot's head, and a changed config with it: one txn, so that no leader ever
        // reads the new config over the old snapshot and log (or the reverse).
        std::vector<etcd::Operation> together;
        if (config) together.push_back(std::move(*config));
        together.push_back({etcd::Operation::Kind::kPut, key("snap", part.run), meta, {}, 0, 0});
        together.push_back({etcd::Operation::Kind::kDeleteRange,
                            key("log", part.run) + "/",
                            {},
                            key("log", part.run) + "/" + pad20(snap.seq + 1),
                            0,
                            0});
        together.push_back(
            {etcd::Operation::Kind::kDeleteRange, chunks, {}, chunks + pad20(*gen), 0, 0});
        if (auto r = add_together(std::move(together)); !r) return r;
      }
      return flush();
    }();
    if (written) {
      wrote = true;
      continue;
    }
    // This run's leadership is over (refused), or in doubt (etcd did not answer): either way
    // nothing more is written or answered under it.
    // (Reported only when it is still the leadership led here: one forgotten or replaced
    // meanwhile ended already, and its failure, late, must not end a later one of the run.)
    std::lock_guard lock(mu_);
    auto it = led_.find(part.run);
    if (it != led_.end() && it->second->generation == part.generation) {
      led_.erase(it);
      lost_.push_back({part.run, written.error().message, lead.term.load()});
    }
    failures += (failures.empty() ? "" : "; ") + written.error().message;
  }
  if (wrote) {
    writes_ += 1;
    if (++since_compaction_ >= options_.compact_every && last_revision_ > 0) {
      since_compaction_ = 0;
      // Bounded history: nothing reads an older revision. A failed compaction costs only room.
      if (client_->compact(last_revision_)) compactions_ += 1;
    }
  }
  if (!failures.empty()) return tl::unexpected(lost_error(failures));
  return {};
}

Result<void> EtcdRunJournal::replace_config(const Run& run, std::string_view format,
                                            std::string_view text, TimeMs now) {
  const std::string& name = run.config().name;
  std::shared_ptr<Lead> lead;
  {
    std::lock_guard lock(mu_);
    auto it = led_.find(name);
    if (it == led_.end())
      return tl::unexpected(lost_error("this coordinator does not lead run " + name));
    lead = it->second;
  }
  Batch batch;
  Batch::Part& part = batch.part(name, lead->generation, lead);
  part.config = SavedRun{name, std::string(format), std::string(text), now, std::nullopt, 0};
  part.snapshot = Batch::Snapshot{lead->last_seq, now, RunCodec::save(run)};
  lead->since_snapshot = 0;
  return write(batch);
}

void EtcdRunJournal::append_metrics(std::string& out) const {
  out +=
      "# HELP traincoord_etcd_writes_total Journal writes to etcd (each one or a few txns).\n"
      "# TYPE traincoord_etcd_writes_total counter\ntraincoord_etcd_writes_total " +
      std::to_string(writes_.load()) +
      "\n# HELP traincoord_etcd_txns_total Fenced etcd transactions sent.\n"
      "# TYPE traincoord_etcd_txns_total counter\ntraincoord_etcd_txns_total " +
      std::to_string(txns_.load()) +
      "\n# HELP traincoord_etcd_refused_total Writes etcd refused (a run's leadership lost).\n"
      "# TYPE traincoord_etcd_refused_total counter\ntraincoord_etcd_refused_total " +
      std::to_string(refused_.load()) +
      "\n# HELP traincoord_etcd_compactions_total Compactions of etcd's history.\n"
      "# TYPE traincoord_etcd_compactions_total counter\ntraincoord_etcd_compactions_total " +
      std::to_string(compactions_.load()) +
      "\n# HELP traincoord_etcd_record_bytes_total Bytes of records put in etcd (deflated).\n"
      "# TYPE traincoord_etcd_record_bytes_total counter\ntraincoord_etcd_record_bytes_total " +
      std::to_string(record_bytes_.load()) +
      "\n# HELP traincoord_etcd_snapshot_bytes_total Bytes of snapshots put in etcd "
      "(deflated).\n"
      "# TYPE traincoord_etcd_snapshot_bytes_total counter\n"
      "traincoord_etcd_snapshot_bytes_total " +
      std::to_string(snapshot_bytes_.load()) +
      "\n# HELP traincoord_etcd_snapshots_total Snapshots written to etcd.\n"
      "# TYPE traincoord_etcd_snapshots_total counter\ntraincoord_etcd_snapshots_total " +
      std::to_string(snapshots_.load()) + "\n";
}

}  // namespace traincoord
