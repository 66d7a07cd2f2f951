#include "server/restore.h"

#include <chrono>

#include "config/config_file.h"
#include "core/run_codec.h"
#include "json/json_writer.h"

namespace traincoord {

Result<RestoreReport> restore_engine(Journal& journal, Engine& engine, Api& api,
                                     ServerClock& clock) {
  const auto start = std::chrono::steady_clock::now();
  RestoreReport report;
  auto saved = journal.saved_runs();
  if (!saved) return tl::unexpected(saved.error());
  for (const SavedRun& s : *saved) {
    const std::string source = journal.describe() + " (run " + s.name + ")";
    auto config = parse_stored_run_config(s.config_format, s.config_text, source);
    if (!config) return tl::unexpected(config.error());
    if (s.snapshot) {
      auto run = RunCodec::load(std::move(*config), *s.snapshot, clock);
      if (!run) return tl::unexpected(run.error());
      engine.adopt(std::move(*run));
      report.snapshots += 1;
    } else {
      clock.replay_at(s.created_ms);  // a run without a snapshot starts as it was created
      auto run = engine.create_run(std::move(*config));
      if (!run) return tl::unexpected(run.error());
    }
    report.runs += 1;
  }
  auto replayed = journal.for_each_record([&](const Record& r) -> Result<void> {
    clock.replay_at(r.time);
    report.records += 1;
    if (r.kind == RecordKind::kExpire) {
      if (auto run = engine.find(r.run)) (*run)->expire_leases();
      return {};
    }
    // The same code path as when the request first came, which must answer as it did then:
    // otherwise the state rebuilt is not the state that was (a changed limit, a damaged log,
    // a bug), and going on would hand out wrong work. The restart stops, naming the record.
    auto result = api.handle(HttpRequest{"POST", r.target, r.body, {}});
    if (r.outcome == kOutcomeUnknown) return {};  // (written before outcomes were kept)
    const int replayed_outcome = std::holds_alternative<ParkedAcquire>(result)
                                     ? kOutcomeParked
                                     : std::get<HttpReply>(result).status;
    const auto* reply = std::get_if<HttpReply>(&result);
    if (replayed_outcome == r.outcome && (!r.reply || !reply || *r.reply == reply->body)) {
      return {};
    }
    auto name = [](int outcome) {
      return outcome == kOutcomeParked ? std::string("parked (long poll)")
                                       : "HTTP " + std::to_string(outcome);
    };
    std::string body = r.body.substr(0, 200);
    for (char& c : body) {
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    }
    if (replayed_outcome == r.outcome) {
      return failed_precondition(
          "log row " + std::to_string(r.seq) + " of run " + r.run +
          " does not replay as it "
          "was: POST " +
          r.target + " " + body + (r.body.size() > 200 ? "..." : "") + " was answered " + *r.reply +
          " when it came, but " + reply->body +
          " now. The "
          "state it would rebuild is not the state that was, so traincoord stops here");
    }
    return failed_precondition(
        "log row " + std::to_string(r.seq) + " of run " + r.run +
        " does not replay as it was: "
        "POST " +
        r.target + " " + body + (r.body.size() > 200 ? "..." : "") + " was answered " +
        name(r.outcome) + " when it came, but " + name(replayed_outcome) + " now" +
        (reply && reply->status >= 400 ? " (" + reply->body + ")" : std::string()) +
        ". The state it would rebuild is not the state that was, so traincoord stops here. "
        "Was the data dir written by another version, or changed? Run this version's "
        "`traincoord inspect` on a copy, and report it");
  });
  if (!replayed) return tl::unexpected(replayed.error());
  auto latest = journal.latest_time();
  if (!latest) return tl::unexpected(latest.error());
  report.resumed_at = *latest + 1;
  clock.go_live(report.resumed_at);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace traincoord
