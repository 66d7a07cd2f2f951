#include "journal/etcd_journal.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include <zlib.h>

#include "core/run_codec.h"
#include "journal/etcd_records.h"

namespace traincoord {

using namespace etcd_records;  // NOLINT: the codec shared with the per-run journal

namespace {

constexpr size_t kMaxOps = 100;  // etcd takes at most 128 operations per txn by default

struct Head {
  int64_t term = 0, seq = 0;
  TimeMs time = 0;
};

bool parse_head(const std::string& value, Head* head) {
  int64_t time = 0;
  if (std::sscanf(value.c_str(), "%" SCNd64 " %" SCNd64 " %" SCNd64, &head->term, &head->seq,
                  &time) != 3)
    return false;
  head->time = time;
  return true;
}

std::string head_value(int64_t term, int64_t seq, TimeMs time) {
  return std::to_string(term) + " " + std::to_string(seq) + " " + std::to_string(time);
}

}  // namespace

class EtcdJournal::Batch final : public JournalBatch {
 public:
  struct Snapshot {
    std::string run;
    int64_t seq;
    TimeMs time;
    std::string state;
  };
  std::vector<SavedRun> runs;  // new runs, and replaced configs
  std::vector<Record> records;
  std::vector<Snapshot> snapshots;
  uint64_t completions = 0;

  bool empty() const override {
    return runs.empty() && records.empty() && snapshots.empty() && completions == 0;
  }
  void append(JournalBatch&& later) override {
    auto& b = static_cast<Batch&>(later);
    auto move_all = [](auto& to, auto& from) {
      to.insert(to.end(), std::make_move_iterator(from.begin()),
                std::make_move_iterator(from.end()));
      from.clear();
    };
    move_all(runs, b.runs);
    move_all(records, b.records);
    move_all(snapshots, b.snapshots);
    completions += b.completions;
    b.completions = 0;
  }
};

Result<EtcdJournalOptions> parse_etcd_url(std::string_view url) {
  const bool tls = url.substr(0, 8) == "etcds://";
  const std::string_view kScheme = tls ? "etcds://" : "etcd://";
  std::string shown(url);  // (its password hidden)
  if (const auto at = shown.find('@'); at != std::string::npos) {
    const auto colon = shown.find(':', kScheme.size());
    if (colon != std::string::npos && colon < at) shown.replace(colon + 1, at - colon - 1, "***");
  }
  auto bad = [&](const std::string& why) {
    return invalid_argument(
        "journal", "--journal " + shown + ": " + why +
                       " (expected etcd://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...][/PREFIX], or "
                       "etcds://... over TLS)");
  };
  if (url.substr(0, kScheme.size()) != kScheme) return bad("not an etcd:// URL");
  std::string_view rest = url.substr(kScheme.size());
  EtcdJournalOptions options;
  options.tls.enabled = tls;
  if (const auto at = rest.substr(0, rest.find('/')).rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    const auto colon = userinfo.find(':');
    options.user = std::string(userinfo.substr(0, colon));
    if (options.user.empty()) return bad("the user before '@' is empty");
    if (colon != std::string_view::npos) {
      options.password = std::string(userinfo.substr(colon + 1));
    } else if (const char* p = std::getenv("TRAINCOORD_ETCD_PASSWORD")) {
      options.password = p;
    } else {
      return bad("user " + options.user +
                 " has no password: give it as USER:PASSWORD@ or in $TRAINCOORD_ETCD_PASSWORD");
    }
    rest = rest.substr(at + 1);
  }
  const auto slash = rest.find('/');
  if (slash != std::string_view::npos) {
    std::string prefix(rest.substr(slash));
    while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
    if (prefix.size() <= 1) return bad("the prefix after the hosts is empty");
    options.prefix = prefix;
    rest = rest.substr(0, slash);
  }
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view host_port = rest.substr(0, comma);
    const auto colon = host_port.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == host_port.size())
      return bad("'" + std::string(host_port) + "' is not HOST:PORT");
    for (char c : host_port.substr(colon + 1)) {
      if (c < '0' || c > '9') return bad("'" + std::string(host_port) + "' has no numeric port");
    }
    options.endpoints.emplace_back(host_port);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (options.endpoints.empty()) return bad("no etcd endpoint");
  return options;
}

EtcdJournal::EtcdJournal(EtcdJournalOptions options, int64_t term, int64_t lease)
    : options_(std::move(options)),
      term_(term),
      lease_(lease),
      client_(std::make_unique<etcd::Client>(etcd::ClientOptions{
          options_.endpoints, options_.timeout, std::chrono::milliseconds(5000), options_.tls})) {
  if (!options_.user.empty()) client_->authenticate_as(options_.user, options_.password);
}

EtcdJournal::~EtcdJournal() = default;

Result<std::unique_ptr<EtcdJournal>> EtcdJournal::open(EtcdJournalOptions options, int64_t term,
                                                       int64_t lease) {
  std::unique_ptr<EtcdJournal> journal(new EtcdJournal(std::move(options), term, lease));
  if (auto r = journal->load_head(); !r) return tl::unexpected(r.error());
  return journal;
}

std::string EtcdJournal::describe() const {
  std::string hosts;
  for (const auto& e : options_.endpoints) hosts += (hosts.empty() ? "" : ",") + e;
  return (options_.tls.enabled ? "etcds://" : "etcd://") +
         (options_.user.empty() ? "" : options_.user + "@") + hosts + options_.prefix;
}

std::string EtcdJournal::key(std::string_view kind, std::string_view run) const {
  std::string k = options_.prefix + "/" + std::string(kind);
  if (!run.empty()) k += "/" + escape(run);
  return k;
}

Result<void> EtcdJournal::load_head() {
  auto head = client_->range(key("head"));
  if (!head) return tl::unexpected(head.error());
  if (head->kvs.empty()) return {};
  Head h;
  if (!parse_head(head->kvs[0].value, &h))
    return failed_precondition(describe() + ": its head key holds '" +
                               head->kvs[0].value.substr(0, 80) + "', not 'TERM SEQ TIME'");
  head_revision_ = head->kvs[0].mod_revision;
  written_seq_ = h.seq;
  written_time_ = h.time;
  next_seq_ = h.seq + 1;
  published_seq_ = written_seq_;
  published_revision_ = head_revision_;
  return {};
}

Result<std::vector<SavedRun>> EtcdJournal::saved_runs() {
  auto configs = range_all(*client_, key("config") + "/");
  if (!configs) return tl::unexpected(configs.error());
  std::sort(configs->begin(), configs->end(),
            [](const auto& a, const auto& b) { return a.create_revision < b.create_revision; });
  auto snaps = range_all(*client_, key("snap") + "/");
  if (!snaps) return tl::unexpected(snaps.error());
  std::map<std::string, const etcd::KeyValue*> snap_of;
  for (const auto& kv : *snaps) snap_of[unescape(kv.key.substr(key("snap").size() + 1))] = &kv;
  std::vector<SavedRun> runs;
  for (const auto& kv : *configs) {
    SavedRun run;
    run.name = unescape(kv.key.substr(key("config").size() + 1));
    const auto a = kv.value.find('\n');
    const auto b = a == std::string::npos ? a : kv.value.find('\n', a + 1);
    if (b == std::string::npos)
      return failed_precondition(describe() + ": the config of run " + run.name + " is damaged");
    run.config_format = kv.value.substr(0, a);
    run.created_ms = std::strtoll(kv.value.c_str() + a + 1, nullptr, 10);
    run.config_text = kv.value.substr(b + 1);
    if (auto s = snap_of.find(run.name); s != snap_of.end()) {
      int64_t seq = 0, time = 0, gen = 0, chunks = 0, bytes = 0;
      if (std::sscanf(s->second->value.c_str(),
                      "%" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64, &seq, &time, &gen,
                      &chunks, &bytes) != 5)
        return failed_precondition(describe() + ": the snapshot key of run " + run.name +
                                   " is damaged");
      auto parts = range_all(*client_, key("chunk", run.name) + "/" + pad20(gen) + "/");
      if (!parts) return tl::unexpected(parts.error());
      std::string state;
      for (const auto& p : *parts) state += p.value;
      if (static_cast<int64_t>(parts->size()) != chunks ||
          static_cast<int64_t>(state.size()) != bytes)
        return failed_precondition(describe() + ": the snapshot of run " + run.name + " has " +
                                   std::to_string(parts->size()) + " chunks, " +
                                   std::to_string(state.size()) + " bytes; its key says " +
                                   std::to_string(chunks) + ", " + std::to_string(bytes));
      run.snapshot = std::move(state);
      run.snapshot_seq = seq;
    }
    last_seq_[run.name] = run.snapshot_seq;
    since_snapshot_[run.name] = 0;
    runs.push_back(std::move(run));
  }
  return runs;
}

Result<void> EtcdJournal::for_each_record(const std::function<Result<void>(const Record&)>& fn) {
  auto runs = saved_runs();
  if (!runs) return tl::unexpected(runs.error());
  std::map<std::string, int64_t, std::less<>> covered;
  for (const SavedRun& r : *runs) covered[r.name] = r.snapshot_seq;
  auto logs = range_all(*client_, key("log") + "/");
  if (!logs) return tl::unexpected(logs.error());
  std::vector<Record> all;
  const size_t skip = key("log").size() + 1;
  for (const auto& kv : *logs) {
    const auto slash = kv.key.rfind('/');
    const std::string run = unescape(kv.key.substr(skip, slash - skip));
    auto c = covered.find(run);
    if (c == covered.end())
      return failed_precondition(describe() + ": records of run " + run + " without its config");
    std::vector<Record> records;
    std::string raw;
    if (!unpack_records(kv.value, &raw) || !decode_records(run, raw, &records))
      return failed_precondition(describe() + ": the record key " + kv.key + " is damaged");
    for (Record& r : records) {
      if (r.seq <= c->second) continue;  // covered by the run's snapshot
      all.push_back(std::move(r));
    }
  }
  std::sort(all.begin(), all.end(), [](const Record& a, const Record& b) { return a.seq < b.seq; });
  for (const Record& r : all) {
    if (r.seq > written_seq_)
      return failed_precondition(describe() + ": record " + std::to_string(r.seq) + " of run " +
                                 r.run + " is past the head (" + std::to_string(written_seq_) +
                                 ")");
    since_snapshot_[r.run] += 1;
    last_seq_[r.run] = r.seq;
    if (auto done = fn(r); !done) return done;
  }
  return {};
}

Result<TimeMs> EtcdJournal::latest_time() {
  TimeMs latest = written_time_;
  auto configs = range_all(*client_, key("config") + "/");
  if (!configs) return tl::unexpected(configs.error());
  for (const auto& kv : *configs) {
    const auto a = kv.value.find('\n');
    if (a != std::string::npos)
      latest = std::max<TimeMs>(latest, std::strtoll(kv.value.c_str() + a + 1, nullptr, 10));
  }
  return latest;
}

void EtcdJournal::add_run(const std::string& name, std::string_view format, std::string_view text,
                          TimeMs created) {
  if (!pending_) pending_ = std::make_unique<Batch>();
  pending_->runs.push_back(
      SavedRun{name, std::string(format), std::string(text), created, std::nullopt, 0});
}

void EtcdJournal::add_record(std::string_view run, TimeMs time, RecordKind kind,
                             std::string_view target, std::string_view body, int outcome,
                             std::string_view reply) {
  if (!pending_) pending_ = std::make_unique<Batch>();
  Record r;
  r.run = std::string(run);
  r.time = time;
  r.kind = kind;
  r.outcome = outcome;
  r.target = std::string(target);
  r.body = std::string(body);
  if (kind == RecordKind::kRequest && outcome != kOutcomeParked) r.reply = std::string(reply);
  pending_->records.push_back(std::move(r));
}

void EtcdJournal::add_completion(const CompletionRow&) {
  // The query views (history) come from the engine; etcd keeps only what replay needs.
  if (!pending_) pending_ = std::make_unique<Batch>();
  pending_->completions += 1;
}

std::unique_ptr<JournalBatch> EtcdJournal::take(const Engine& engine, bool snapshots, TimeMs now) {
  auto batch = pending_ ? std::move(pending_) : std::make_unique<Batch>();
  for (Record& r : batch->records) {
    r.seq = next_seq_++;
    last_seq_[r.run] = r.seq;
    since_snapshot_[r.run] += 1;
  }
  if (snapshots) {
    for (auto& [name, count] : since_snapshot_) {
      if (count < options_.snapshot_every) continue;
      auto run = engine.find(name);
      if (!run) continue;
      batch->snapshots.push_back({name, last_seq_[name], now, RunCodec::save(**run)});
      count = 0;
    }
    uint64_t most = 0;
    for (const auto& [name, count] : since_snapshot_) most = std::max(most, count);
    replay_records_ = static_cast<int64_t>(most);
  }
  return batch;
}

Result<void> EtcdJournal::write_snapshot_chunks(const std::string& run, const std::string& state,
                                                int64_t gen) {
  // Chunks under a generation of their own, in txns conditioned on the leadership only: until
  // the snapshot's key names the generation, they are not read (and the next snapshot deletes
  // them, were this leadership to end before it).
  const std::string base = key("chunk", run) + "/" + pad20(gen) + "/";
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
    const std::string leader = key("leader");
    auto r = client_->txn(
        {{etcd::Compare::Target::kCreate, etcd::Compare::Op::kEqual, leader, term_, {}},
         {etcd::Compare::Target::kLease, etcd::Compare::Op::kEqual, leader, lease_, {}}},
        ops);
    if (!r) return tl::unexpected(r.error());
    txns_ += 1;
    if (!r->succeeded) {
      refused_ += 1;
      return failed_precondition(describe() + ": the leadership of term " + std::to_string(term_) +
                                     " has ended (another coordinator leads, or this one's "
                                     "lease expired); nothing more is written under it",
                                 error_reason::kNotLeader);
    }
  } while (at < state.size());
  return {};
}

Result<void> EtcdJournal::fenced_txn(std::vector<etcd::Operation> ops, int64_t seq, TimeMs time) {
  const std::string leader = key("leader"), head = key("head");
  const std::string value = head_value(term_, seq, time);
  ops.push_back({etcd::Operation::Kind::kPut, head, value, {}, 0, 0});
  auto r = client_->txn(
      {{etcd::Compare::Target::kCreate, etcd::Compare::Op::kEqual, leader, term_, {}},
       {etcd::Compare::Target::kLease, etcd::Compare::Op::kEqual, leader, lease_, {}},
       {etcd::Compare::Target::kMod, etcd::Compare::Op::kEqual, head, head_revision_, {}}},
      ops,
      {{etcd::Operation::Kind::kRange, leader, {}, {}, 0, 0},
       {etcd::Operation::Kind::kRange, head, {}, {}, 0, 0}});
  if (!r) return tl::unexpected(r.error());
  txns_ += 1;
  if (r->succeeded) {
    head_revision_ = r->revision;
  } else {
    // A txn sent again to another member after a timeout may find its own first try applied:
    // the head then says what it would have written, under our leadership.
    const bool ours = r->ranges.size() == 2 && r->ranges[0].kvs.size() == 1 &&
                      r->ranges[0].kvs[0].create_revision == term_ &&
                      r->ranges[1].kvs.size() == 1 && r->ranges[1].kvs[0].value == value;
    if (!ours) {
      refused_ += 1;
      const std::string who = r->ranges.size() == 2 && r->ranges[0].kvs.size() == 1
                                  ? "the coordinator at " + r->ranges[0].kvs[0].value +
                                        " leads since revision " +
                                        std::to_string(r->ranges[0].kvs[0].create_revision)
                                  : std::string("no coordinator leads now");
      return failed_precondition(describe() + ": the leadership of term " + std::to_string(term_) +
                                     " has ended (" + who +
                                     "); this write was refused and nothing of it written",
                                 error_reason::kNotLeader);
    }
    head_revision_ = r->ranges[1].kvs[0].mod_revision;
  }
  written_seq_ = seq;
  written_time_ = time;
  published_seq_ = seq;
  published_revision_ = head_revision_;
  return {};
}

Result<void> EtcdJournal::write(const JournalBatch& taken) {
  const auto& batch = static_cast<const Batch&>(taken);
  if (batch.runs.empty() && batch.records.empty() && batch.snapshots.empty()) return {};
  // The latest snapshot of each run in the batch (an appended batch may hold two).
  std::map<std::string, const Batch::Snapshot*, std::less<>> latest_snapshot;
  for (const auto& s : batch.snapshots) latest_snapshot[s.run] = &s;
  std::map<std::string, int64_t, std::less<>> gen_of;
  for (const auto& [run, snap] : latest_snapshot) {
    const int64_t gen = term_ * 1'000'000 + next_gen_++;
    if (auto r = write_snapshot_chunks(run, snap->state, gen); !r) return r;
    gen_of[run] = gen;
  }

  std::vector<etcd::Operation> ops;
  size_t bytes = 0;
  int64_t seq = written_seq_;
  TimeMs time = written_time_;
  auto flush = [&]() -> Result<void> {
    if (ops.empty()) return {};
    auto r = fenced_txn(std::move(ops), seq, time);
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

  for (const SavedRun& run : batch.runs) {
    if (auto r =
            add({etcd::Operation::Kind::kPut,
                 key("config", run.name),
                 run.config_format + "\n" + std::to_string(run.created_ms) + "\n" + run.config_text,
                 {},
                 0,
                 0});
        !r)
      return r;
    time = std::max(time, run.created_ms);
  }
  // Records, a run's together in one key (or a few, when they are many), in the order taken.
  // Those a snapshot of this batch covers are not written (etcd refuses a txn that writes a key
  // and deletes it).
  std::map<std::string, std::string, std::less<>> values;
  std::map<std::string, int64_t, std::less<>> last;
  auto put_log = [&](const std::string& run) -> Result<void> {
    auto v = values.find(run);
    if (v == values.end() || v->second.empty()) return {};
    auto r = add({etcd::Operation::Kind::kPut,
                  key("log", run) + "/" + pad20(last[run]),
                  pack_records(v->second),
                  {},
                  0,
                  0});
    v->second.clear();
    return r;
  };
  for (const Record& rec : batch.records) {
    TC_ASSERT(rec.seq > seq);  // written in the order taken
    seq = rec.seq;
    time = std::max(time, rec.time);
    if (auto s = latest_snapshot.find(rec.run);
        s != latest_snapshot.end() && rec.seq <= s->second->seq)
      continue;
    std::string& value = values[rec.run];
    encode_record(rec, &value);
    last[rec.run] = rec.seq;
    if (value.size() >= options_.txn_bytes / 2) {
      if (auto r = put_log(rec.run); !r) return r;
    }
  }
  for (auto& [run, value] : values) {
    if (auto r = put_log(run); !r) return r;
  }
  for (const auto& [run, snap] : latest_snapshot) {
    time = std::max(time, snap->time);
    const std::string chunks = key("chunk", run) + "/";
    const int64_t gen = gen_of[run];
    const size_t count = snap->state.empty() ? 1
                                             : (snap->state.size() + options_.chunk_bytes - 1) /
                                                   options_.chunk_bytes;
    char meta[128];
    std::snprintf(meta, sizeof meta, "%" PRId64 " %" PRId64 " %" PRId64 " %zu %zu", snap->seq,
                  static_cast<int64_t>(snap->time), gen, count, snap->state.size());
    if (auto r = add({etcd::Operation::Kind::kPut, key("snap", run), meta, {}, 0, 0}); !r) return r;
    // What it covers: the records up to its seq, the chunks of older snapshots.
    if (auto r = add({etcd::Operation::Kind::kDeleteRange,
                      key("log", run) + "/",
                      {},
                      key("log", run) + "/" + pad20(snap->seq + 1),
                      0,
                      0});
        !r)
      return r;
    if (auto r = add({etcd::Operation::Kind::kDeleteRange, chunks, {}, chunks + pad20(gen), 0, 0});
        !r)
      return r;
  }
  if (auto r = flush(); !r) return r;
  writes_ += 1;
  if (++since_compaction_ >= options_.compact_every) {
    since_compaction_ = 0;
    // Bounded history: nothing reads an older revision (takeovers read the latest). A failed
    // compaction costs only room; the next one catches up.
    if (client_->compact(head_revision_)) compactions_ += 1;
  }
  return {};
}

Result<void> EtcdJournal::replace_config(const Run& run, std::string_view format,
                                         std::string_view text, TimeMs now) {
  const std::string& name = run.config().name;
  Batch batch;
  batch.runs.push_back(
      SavedRun{name, std::string(format), std::string(text), now, std::nullopt, 0});
  batch.snapshots.push_back({name, last_seq_[name], now, RunCodec::save(run)});
  since_snapshot_[name] = 0;
  return write(batch);
}

void EtcdJournal::append_metrics(std::string& out) const {
  out +=
      "# HELP traincoord_etcd_writes_total Journal writes to etcd (each one or a few txns).\n"
      "# TYPE traincoord_etcd_writes_total counter\ntraincoord_etcd_writes_total " +
      std::to_string(writes_.load()) +
      "\n# HELP traincoord_etcd_txns_total Fenced etcd transactions sent.\n"
      "# TYPE traincoord_etcd_txns_total counter\ntraincoord_etcd_txns_total " +
      std::to_string(txns_.load()) +
      "\n# HELP traincoord_etcd_refused_total Writes etcd refused (leadership lost).\n"
      "# TYPE traincoord_etcd_refused_total counter\ntraincoord_etcd_refused_total " +
      std::to_string(refused_.load()) +
      "\n# HELP traincoord_etcd_compactions_total Compactions of etcd's history.\n"
      "# TYPE traincoord_etcd_compactions_total counter\ntraincoord_etcd_compactions_total " +
      std::to_string(compactions_.load()) + "\n";
}

}  // namespace traincoord
