// Which runs this coordinator leads (high availability, docs/HA.md "Leadership per run"), shared
// by the thread that campaigns and keeps the etcd lease alive, the engine thread (which answers
// 421 not_leader for a run it does not lead) and the commit thread (which steps a run down when
// etcd refuses its write, and sends a reply only while its run is still led by the leadership
// that produced it). Thread-safe.
//
// Each leadership of a run has a term (etcd's; 0 for a run created here until its first write
// says it) and a generation: a number of this process that grows with every leadership it
// starts, so that a reply produced under one leadership of a run is never sent under a later
// one of the same run.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "json/json_writer.h"
#include "server/metrics.h"

namespace traincoord {

class Leadership {
 public:
  explicit Leadership(std::string advertised_url) : advertised_(std::move(advertised_url)) {}
  // (Once the port is known, before anyone leads.)
  void set_advertised_url(std::string url) {
    std::lock_guard lock(mu_);
    advertised_ = std::move(url);
  }
  std::string advertised_url() const {
    std::lock_guard lock(mu_);
    return advertised_;
  }

  // Who leads one run, as this coordinator knows it.
  struct View {
    bool leading = false;
    int64_t term = 0;         // of the leader known (0: none known, or a run created here
                              // whose first write is under way)
    std::string leader;       // its advertised URL (empty: none known)
    uint64_t generation = 0;  // while leading: this leadership's (see above)
    bool known = false;       // the run exists in etcd (or is being created here)
  };
  // Until this coordinator has read etcd once, every run counts as known with no leader (421,
  // leader null: an election to the clients), never as absent (404 run_not_found, which
  // clients take as final).
  View view(std::string_view run) const {
    std::lock_guard lock(mu_);
    auto it = runs_.find(run);
    if (it != runs_.end()) return it->second.view;
    return synced_ ? View{} : View{false, 0, {}, 0, true};
  }
  // Whether this coordinator leads `run` under `generation` still.
  bool leads(std::string_view run, uint64_t generation) const {
    std::lock_guard lock(mu_);
    auto it = runs_.find(run);
    return it != runs_.end() && it->second.view.leading && it->second.view.generation == generation;
  }
  // The runs this coordinator leads.
  std::vector<std::string> led() const {
    std::lock_guard lock(mu_);
    std::vector<std::string> names;
    for (const auto& [name, r] : runs_) {
      if (r.view.leading) names.push_back(name);
    }
    return names;
  }

  // Every run this coordinator knows of (etcd's, and those created here), by name, with who
  // leads it as this coordinator knows it (GET /v1/runs in HA mode, docs/HA.md).
  std::vector<std::pair<std::string, View>> views() const {
    std::lock_guard lock(mu_);
    std::vector<std::pair<std::string, View>> all;
    for (const auto& [name, r] : runs_) {
      View v = r.view;
      if (v.leading) v.leader = advertised_;
      all.emplace_back(name, std::move(v));
    }
    return all;
  }

  // This coordinator leads `run` from now on, under `term` (0: created here, its term comes
  // with its first write: set_term). Returns the leadership's generation.
  uint64_t lead(const std::string& run, int64_t term) {
    std::lock_guard lock(mu_);
    RunState& r = runs_[run];
    r.view = {true, term, advertised_, next_generation_++, true};
    r.since = std::chrono::steady_clock::now();
    return r.view.generation;
  }
  // The first write of a run created here made it `term`: a leadership of this process begins
  // (counted with the takeovers).
  void set_term(const std::string& run, int64_t term) {
    std::lock_guard lock(mu_);
    auto it = runs_.find(run);
    if (it == runs_.end() || !it->second.view.leading || it->second.view.term != 0) return;
    it->second.view.term = term;
    takeovers_ += 1;
    last_takeover_ = std::chrono::system_clock::now();
    last_takeover_s_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.since).count();
    last_takeover_run_ = run;
  }
  // This coordinator took `run` over: it serves it `seconds` after winning its election.
  void took_over(const std::string& run, double seconds) {
    std::lock_guard lock(mu_);
    takeovers_ += 1;
    last_takeover_ = std::chrono::system_clock::now();
    last_takeover_s_ = seconds;
    last_takeover_run_ = run;
  }

  // Where a run's journal stands, as this coordinator last saw it (a standby's read, a
  // leader's write).
  struct JournalPosition {
    int64_t head_seq = 0;        // the run's last record number
    int64_t head_revision = 0;   // the etcd revision of that write
    int64_t replay_records = 0;  // records a takeover would replay at most
  };
  // What one read of etcd found of every run: its leader (empty: none) and journal position.
  // Runs this coordinator leads keep their view; runs no longer in etcd are forgotten.
  struct Seen {
    std::string run;
    std::string leader;
    int64_t term = 0;
    JournalPosition journal;
  };
  void saw(const std::vector<Seen>& runs, size_t members) {
    std::lock_guard lock(mu_);
    std::map<std::string, RunState, std::less<>> next;
    for (const Seen& s : runs) {
      RunState r;
      if (auto it = runs_.find(s.run); it != runs_.end()) r = it->second;
      // (its leader key ours while it does not lead it here: a takeover under way; an election,
      // to the clients, until it serves)
      if (!r.view.leading) {
        r.view = s.leader == advertised_ ? View{false, 0, {}, 0, true}
                                         : View{false, s.term, s.leader, 0, true};
      }
      r.journal = s.journal;
      r.seen = true;
      next[s.run] = std::move(r);
    }
    for (auto& [name, r] : runs_) {
      if (r.view.leading && !next.count(name)) next[name] = r;  // (created here, not yet seen)
    }
    runs_ = std::move(next);
    synced_ = true;
    members_ = members;
    journal_seen_ = std::chrono::steady_clock::now();
  }
  // A leader's own write of `run` reached `p`.
  void wrote(const std::string& run, JournalPosition p) {
    std::lock_guard lock(mu_);
    auto it = runs_.find(run);
    if (it == runs_.end()) return;
    it->second.journal = p;
    it->second.seen = true;
  }

  // Ends this coordinator's leadership of `run` (a write refused, the lease lost): from now on
  // nothing of it is answered under that leadership. With `term`, only the leadership of that
  // term (a write's failure may come back after a later leadership of the run began here: it
  // ends the one it was written under, which has ended already, not the later one). Returns
  // false when it did not lead it (under `term`). Whoever also drops the run from the journal
  // does so after this (see take_ended): never is a record dropped while its reply may go out.
  bool step_down(const std::string& run, const std::string& why,
                 std::optional<int64_t> term = std::nullopt) {
    {
      std::lock_guard lock(mu_);
      auto it = runs_.find(run);
      if (it == runs_.end() || !it->second.view.leading) return false;
      if (term && it->second.view.term != *term) return false;
      ended_.emplace_back(run, it->second.view.term);
      it->second.view = {false, 0, {}, 0, true};
      stepdowns_ += 1;
      why_ += (why_.empty() ? "" : "; ") + why;
      changed_ += 1;
    }
    cv_.notify_all();
    return true;
  }
  // The leaderships ended since the last call (run, term), in order; taken once, by the thread
  // that then drops each from the journal and resigns its leader key (serve), so that none is
  // missed however soon after it began it ended.
  std::vector<std::pair<std::string, int64_t>> take_ended() {
    std::lock_guard lock(mu_);
    return std::exchange(ended_, {});
  }
  // Ends every leadership of this coordinator at once (one that begins later is not ended).
  // Returns the runs it led, with the term of each.
  std::vector<std::pair<std::string, int64_t>> step_down_all(const std::string& why) {
    std::vector<std::pair<std::string, int64_t>> ended;
    {
      std::lock_guard lock(mu_);
      for (auto& [name, r] : runs_) {
        if (!r.view.leading) continue;
        ended.emplace_back(name, r.view.term);
        ended_.emplace_back(name, r.view.term);
        r.view = {false, 0, {}, 0, true};
        stepdowns_ += 1;
      }
      if (ended.empty()) return ended;
      why_ += (why_.empty() ? "" : "; ") + why;
      changed_ += 1;
    }
    cv_.notify_all();
    return ended;
  }
  // A leadership won in etcd (its leader key ours, of `term`) that this coordinator could not
  // begin (the run would not load): handed to take_ended, so its key is resigned.
  void abandon(const std::string& run, int64_t term) {
    {
      std::lock_guard lock(mu_);
      ended_.emplace_back(run, term);
      changed_ += 1;
    }
    cv_.notify_all();
  }
  // The process is asked to stop (a signal).
  void request_stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      changed_ += 1;
    }
    cv_.notify_all();
  }
  bool stop_requested() const {
    std::lock_guard lock(mu_);
    return stop_;
  }
  // Waits at most `for_at_most` for a step-down or a stop (returns at once if one came since
  // `*seen`, which it updates). Returns why runs stepped down since, empty otherwise.
  std::string wait(uint64_t* seen, std::chrono::milliseconds for_at_most) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, for_at_most, [&] { return changed_ != *seen; });
    *seen = changed_;
    std::string why = std::move(why_);
    why_.clear();
    return why;
  }

  // The body of GET /v1/coordinator (docs/API.md, docs/HA.md "Watching it"): per run in "runs";
  // the fields of the per-process layout summarise them ("role": leader while it leads a run;
  // "leader": this coordinator then, else the leader of the first run known; "journal": the
  // runs' head_seq summed, their newest revision, the most records a takeover replays).
  std::string to_json() const {
    std::lock_guard lock(mu_);
    JsonWriter j;
    j.begin_object();
    j.field("mode", "ha");
    j.field("url", advertised_);
    bool leading = false;
    int64_t top_term = 0;
    const View* first_known = nullptr;
    JournalPosition sum;
    bool any_seen = false;
    for (const auto& [name, r] : runs_) {
      if (r.view.leading) {
        leading = true;
        top_term = std::max(top_term, r.view.term);
      } else if (!first_known && r.view.term > 0) {
        first_known = &r.view;
      }
      if (r.seen) {
        any_seen = true;
        sum.head_seq += r.journal.head_seq;
        sum.head_revision = std::max(sum.head_revision, r.journal.head_revision);
        sum.replay_records = std::max(sum.replay_records, r.journal.replay_records);
      }
    }
    j.field("role", leading ? "leader" : "standby");
    j.key("leader");
    if (leading) {
      j.begin_object().field("url", advertised_);
      j.key("term").value(static_cast<long long>(top_term));
      j.end_object();
    } else if (first_known) {
      j.begin_object().field("url", first_known->leader);
      j.key("term").value(static_cast<long long>(first_known->term));
      j.end_object();
    } else {
      j.null();
    }
    j.key("journal");
    if (journal_seen_ || any_seen) {
      j.begin_object();
      j.key("head_seq").value(static_cast<long long>(sum.head_seq));
      j.key("head_revision").value(static_cast<long long>(sum.head_revision));
      j.key("replay_records").value(static_cast<long long>(sum.replay_records));
      j.key("seen_ms_ago")
          .value(static_cast<long long>(journal_seen_ ? ms_since(*journal_seen_) : 0));
      j.end_object();
    } else {
      j.null();
    }
    j.key("members").value(static_cast<long long>(members_));
    j.key("runs").begin_array();
    for (const auto& [name, r] : runs_) {
      j.begin_object().field("run", name);
      j.field("role", r.view.leading ? "leader" : "standby");
      j.key("leader");
      if (r.view.leading || r.view.term > 0) {
        j.value(r.view.leading ? advertised_ : r.view.leader);
      } else {
        j.null();
      }
      j.key("term").value(static_cast<long long>(r.view.term));
      j.key("head_seq").value(static_cast<long long>(r.journal.head_seq));
      j.key("head_revision").value(static_cast<long long>(r.journal.head_revision));
      j.key("replay_records").value(static_cast<long long>(r.journal.replay_records));
      j.end_object();
    }
    j.end_array();
    j.key("takeovers").value(static_cast<long long>(takeovers_));
    j.key("stepdowns").value(static_cast<long long>(stepdowns_));
    j.key("last_takeover_ms");
    if (takeovers_ > 0) {
      j.value(static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(last_takeover_.time_since_epoch())
              .count()));
    } else {
      j.null();
    }
    j.key("last_takeover_s");
    if (takeovers_ > 0) {
      j.value(last_takeover_s_);
    } else {
      j.null();
    }
    j.key("last_takeover_run");
    if (takeovers_ > 0) {
      j.value(last_takeover_run_);
    } else {
      j.null();
    }
    j.end_object();
    return j.str();
  }

  // Its series of GET /metrics (docs/OBSERVABILITY.md, docs/HA.md).
  void append_metrics(std::string& out) const {
    std::lock_guard lock(mu_);
    auto gauge = [&](const char* name, const char* help, const std::string& value,
                     const char* type = "gauge") {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
             name + " " + value + "\n";
    };
    size_t led = 0;
    int64_t top_term = 0;
    std::string leader;
    JournalPosition sum;
    for (const auto& [name, r] : runs_) {
      if (r.view.leading) {
        led += 1;
        top_term = std::max(top_term, r.view.term);
      } else if (leader.empty() && r.view.term > 0) {
        leader = r.view.leader;
        if (led == 0) top_term = std::max(top_term, r.view.term);
      }
      sum.head_seq += r.journal.head_seq;
      sum.head_revision = std::max(sum.head_revision, r.journal.head_revision);
      sum.replay_records = std::max(sum.replay_records, r.journal.replay_records);
    }
    if (led > 0) leader = advertised_;
    gauge("traincoord_ha_leading", "1 while this coordinator leads a run, 0 while it leads none.",
          led > 0 ? "1" : "0");
    gauge("traincoord_ha_runs_led", "The runs this coordinator leads.", std::to_string(led));
    gauge("traincoord_ha_members", "The live coordinators of the prefix, as last seen.",
          std::to_string(members_));
    gauge("traincoord_ha_leader_term",
          "The highest term this coordinator leads under (or of the leader known; 0: none).",
          std::to_string(top_term));
    out +=
        "# HELP traincoord_ha_leader_info The leader known (its advertised url) and this "
        "coordinator's.\n# TYPE traincoord_ha_leader_info gauge\ntraincoord_ha_leader_info{"
        "leader=\"" +
        prometheus_escape(leader) + "\",self=\"" + prometheus_escape(advertised_) + "\"} 1\n";
    out +=
        "# HELP traincoord_ha_run_leader_info Who leads each run (its leader's url; empty: none "
        "known) and whether it is this coordinator.\n# TYPE traincoord_ha_run_leader_info gauge\n";
    for (const auto& [name, r] : runs_) {
      out += "traincoord_ha_run_leader_info{run=\"" + prometheus_escape(name) + "\",leader=\"" +
             prometheus_escape(r.view.leading ? advertised_ : r.view.leader) + "\",self=\"" +
             prometheus_escape(advertised_) + "\"} " + (r.view.leading ? "1" : "0") + "\n";
    }
    out += "# HELP traincoord_ha_run_term The term of each run's leader known (0: none).\n" +
           std::string("# TYPE traincoord_ha_run_term gauge\n");
    for (const auto& [name, r] : runs_) {
      out += "traincoord_ha_run_term{run=\"" + prometheus_escape(name) + "\"} " +
             std::to_string(r.view.term) + "\n";
    }
    if (journal_seen_) {
      gauge("traincoord_ha_journal_head_seq",
            "The runs' last record numbers in etcd, summed, as this coordinator last saw them.",
            std::to_string(sum.head_seq));
      gauge("traincoord_ha_journal_head_revision", "The etcd revision of the newest write.",
            std::to_string(sum.head_revision));
      gauge("traincoord_ha_journal_replay_records",
            "Records a takeover of a run would replay at most (since its snapshot).",
            std::to_string(sum.replay_records));
      gauge("traincoord_ha_journal_seen_age_seconds",
            "Seconds since this coordinator last read the runs' heads.",
            prometheus_number(static_cast<double>(ms_since(*journal_seen_)) / 1000.0));
    }
    gauge("traincoord_ha_takeovers_total", "Runs this process took over.",
          std::to_string(takeovers_), "counter");
    gauge("traincoord_ha_stepdowns_total",
          "Leaderships of runs this process ended (a write refused, the lease lost).",
          std::to_string(stepdowns_), "counter");
    if (takeovers_ > 0) {
      gauge("traincoord_ha_last_takeover_timestamp_seconds",
            "When this process last took a run over (Unix time).",
            prometheus_number(
                std::chrono::duration<double>(last_takeover_.time_since_epoch()).count()));
      gauge("traincoord_ha_last_takeover_seconds",
            "Seconds from winning a run's election to serving it, at the last takeover.",
            prometheus_number(last_takeover_s_));
    }
  }

 private:
  struct RunState {
    View view;
    JournalPosition journal;
    bool seen = false;
    std::chrono::steady_clock::time_point since{};  // when this process's leadership began
  };
  static int64_t ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t)
        .count();
  }

  std::string advertised_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, RunState, std::less<>> runs_;
  uint64_t next_generation_ = 1;
  size_t members_ = 0;
  bool synced_ = false;  // etcd read once (saw)
  std::string why_;
  std::vector<std::pair<std::string, int64_t>> ended_;  // (take_ended)
  bool stop_ = false;
  uint64_t changed_ = 0;
  std::optional<std::chrono::steady_clock::time_point> journal_seen_;
  uint64_t takeovers_ = 0, stepdowns_ = 0;
  std::chrono::system_clock::time_point last_takeover_{};
  double last_takeover_s_ = 0;
  std::string last_takeover_run_;
};

}  // namespace traincoord
