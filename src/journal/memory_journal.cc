#include "journal/memory_journal.h"

#include <algorithm>

#include "core/run_codec.h"

namespace traincoord {

class MemoryJournal::Batch final : public JournalBatch {
 public:
  struct Snapshot {
    std::string run;
    int64_t seq;
    TimeMs time;
    std::string state;
  };
  std::vector<SavedRun> runs;
  std::vector<Record> records;
  std::vector<Snapshot> snapshots;
  std::vector<SavedRun> configs;  // replaced (name, format, text), each with a snapshot
  uint64_t completions = 0;

  bool empty() const override {
    return runs.empty() && records.empty() && snapshots.empty() && configs.empty() &&
           completions == 0;
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
    move_all(configs, b.configs);
    completions += b.completions;
    b.completions = 0;
  }
};

MemoryJournal::MemoryJournal(uint64_t snapshot_every) : snapshot_every_(snapshot_every) {}
MemoryJournal::~MemoryJournal() = default;

Result<std::vector<SavedRun>> MemoryJournal::saved_runs() {
  std::vector<SavedRun> runs;
  for (const std::string& name : order_) runs.push_back(saved_.find(name)->second.run);
  return runs;
}

Result<void> MemoryJournal::for_each_record(const std::function<Result<void>(const Record&)>& fn) {
  // In the order written: by sequence number across runs.
  std::vector<const Record*> all;
  for (const auto& [name, s] : saved_) {
    for (const Record& r : s.records) all.push_back(&r);
  }
  std::sort(all.begin(), all.end(),
            [](const Record* a, const Record* b) { return a->seq < b->seq; });
  for (const Record* r : all) {
    if (auto done = fn(*r); !done) return done;
  }
  return {};
}

Result<TimeMs> MemoryJournal::latest_time() {
  TimeMs latest = 0;
  for (const auto& [name, s] : saved_) {
    latest = std::max(latest, s.run.created_ms);
    for (const Record& r : s.records) latest = std::max(latest, r.time);
  }
  return std::max(latest, snapshot_time_);
}

void MemoryJournal::add_run(const std::string& name, std::string_view format, std::string_view text,
                            TimeMs created) {
  if (!pending_) pending_ = std::make_unique<Batch>();
  pending_->runs.push_back(
      SavedRun{name, std::string(format), std::string(text), created, std::nullopt, 0});
}

void MemoryJournal::add_record(std::string_view run, TimeMs time, RecordKind kind,
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

void MemoryJournal::add_completion(const CompletionRow&) {
  if (!pending_) pending_ = std::make_unique<Batch>();
  pending_->completions += 1;
}

void MemoryJournal::add_config(const std::string& run, std::string_view format,
                               std::string_view text) {
  if (!pending_) pending_ = std::make_unique<Batch>();
  pending_->configs.push_back(
      SavedRun{run, std::string(format), std::string(text), 0, std::nullopt, 0});
}

std::unique_ptr<JournalBatch> MemoryJournal::take(const Engine& engine, bool snapshots,
                                                  TimeMs now) {
  auto batch = pending_ ? std::move(pending_) : std::make_unique<Batch>();
  for (Record& r : batch->records) {
    r.seq = next_seq_++;
    last_seq_[r.run] = r.seq;
    since_snapshot_[r.run] += 1;
  }
  for (const SavedRun& config : batch->configs) {
    if (auto run = engine.find(config.name)) {
      batch->snapshots.push_back({config.name, last_seq_[config.name], now, RunCodec::save(**run)});
      since_snapshot_[config.name] = 0;
    }
  }
  if (snapshots) {
    for (auto& [name, count] : since_snapshot_) {
      if (count < snapshot_every_) continue;
      auto run = engine.find(name);
      if (!run) continue;
      batch->snapshots.push_back({name, last_seq_[name], now, RunCodec::save(**run)});
      count = 0;
    }
  }
  return batch;
}

Result<void> MemoryJournal::write(const JournalBatch& taken) {
  const auto& batch = static_cast<const Batch&>(taken);
  last_write_full_ = false;
  if (full_ && !batch.empty()) {
    last_write_full_ = true;
    return failed_precondition("the in-memory journal is full (a test said so)");
  }
  for (const SavedRun& run : batch.runs) {
    TC_ASSERT(!saved_.contains(run.name));
    saved_[run.name].run = run;
    order_.push_back(run.name);
  }
  for (const Record& r : batch.records) {
    TC_ASSERT(r.seq > written_seq_);  // written in the order taken
    written_seq_ = r.seq;
    auto it = saved_.find(r.run);
    TC_ASSERT(it != saved_.end());
    it->second.records.push_back(r);
  }
  for (const SavedRun& config : batch.configs) {
    auto it = saved_.find(config.name);
    TC_ASSERT(it != saved_.end());
    it->second.run.config_format = config.config_format;
    it->second.run.config_text = config.config_text;
  }
  for (const Batch::Snapshot& snap : batch.snapshots) {
    Saved& s = saved_.find(snap.run)->second;
    s.run.snapshot = snap.state;
    s.run.snapshot_seq = snap.seq;
    std::erase_if(s.records, [&](const Record& r) { return r.seq <= snap.seq; });
    snapshot_time_ = std::max(snapshot_time_, snap.time);
  }
  records_written_ += batch.records.size();
  completions_written_ += batch.completions;
  snapshots_written_ += batch.snapshots.size();
  writes_ += 1;
  return {};
}

Result<void> MemoryJournal::replace_config(const Run& run, std::string_view format,
                                           std::string_view text, TimeMs now) {
  auto it = saved_.find(run.config().name);
  if (it == saved_.end()) return not_found("run " + run.config().name + " is not in the journal");
  it->second.run.config_format = std::string(format);
  it->second.run.config_text = std::string(text);
  Batch batch;
  batch.snapshots.push_back(
      {run.config().name, last_seq_[run.config().name], now, RunCodec::save(run)});
  since_snapshot_[run.config().name] = 0;
  return write(batch);
}

void MemoryJournal::crash() {
  pending_.reset();
  // What was taken and not written is lost: the numbers go on from what was written (a gap in
  // numbering would be harmless, but the store would not make one either).
  next_seq_ = written_seq_ + 1;
  since_snapshot_.clear();
  last_seq_.clear();
  for (auto& [name, s] : saved_) {
    since_snapshot_[name] = s.records.size();
    last_seq_[name] = s.records.empty() ? s.run.snapshot_seq : s.records.back().seq;
  }
}

}  // namespace traincoord
