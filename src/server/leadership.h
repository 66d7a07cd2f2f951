// Whether this coordinator leads its runs (high availability, docs/HA.md), shared by the thread
// that campaigns and keeps the etcd lease alive, the engine thread (which answers 421
// not_leader while it does not lead) and the commit thread (which steps down when etcd refuses
// a write). Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

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

  struct View {
    bool leading = false;
    int64_t term = 0;    // of the leader known (0: none known: an election is due)
    std::string leader;  // its advertised URL
  };
  View view() const {
    std::lock_guard lock(mu_);
    return view_;
  }
  std::string advertised_url() const {
    std::lock_guard lock(mu_);
    return advertised_;
  }

  // This coordinator leads, from `term` on.
  void lead(int64_t term) {
    std::lock_guard lock(mu_);
    view_ = {true, term, advertised_};
  }

  // What GET /v1/coordinator and /metrics say of it (docs/HA.md "Watching it").
  struct JournalPosition {
    int64_t head_seq = 0;        // the last record number written
    int64_t head_revision = 0;   // the etcd revision of that write
    int64_t replay_records = 0;  // records a takeover would replay at most
  };
  // The journal's head as this coordinator last saw it: a standby's read, a leader's write.
  void saw_journal(JournalPosition p) {
    std::lock_guard lock(mu_);
    journal_ = p;
    journal_seen_ = std::chrono::steady_clock::now();
  }
  // This coordinator took the runs over: it serves them `seconds` after winning the election.
  void took_over(double seconds) {
    std::lock_guard lock(mu_);
    takeovers_ += 1;
    last_takeover_ = std::chrono::system_clock::now();
    last_takeover_s_ = seconds;
  }

  // The body of GET /v1/coordinator (docs/API.md).
  std::string to_json() const {
    std::lock_guard lock(mu_);
    JsonWriter j;
    j.begin_object();
    j.field("mode", "ha");
    j.field("url", advertised_);
    j.field("role", view_.leading ? "leader" : "standby");
    j.key("leader");
    if (view_.term > 0) {
      j.begin_object().field("url", view_.leader);
      j.key("term").value(static_cast<long long>(view_.term));
      j.end_object();
    } else {
      j.null();
    }
    j.key("journal");
    if (journal_seen_) {
      j.begin_object();
      j.key("head_seq").value(static_cast<long long>(journal_.head_seq));
      j.key("head_revision").value(static_cast<long long>(journal_.head_revision));
      j.key("replay_records").value(static_cast<long long>(journal_.replay_records));
      j.key("seen_ms_ago").value(static_cast<long long>(ms_since(*journal_seen_)));
      j.end_object();
    } else {
      j.null();
    }
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
    gauge("traincoord_ha_leading", "1 while this coordinator leads its runs, 0 while it stands by.",
          view_.leading ? "1" : "0");
    gauge("traincoord_ha_leader_term", "The term of the leader known (0: none known).",
          std::to_string(view_.term));
    out +=
        "# HELP traincoord_ha_leader_info The leader known (its advertised url) and this "
        "coordinator's.\n# TYPE traincoord_ha_leader_info gauge\ntraincoord_ha_leader_info{"
        "leader=\"" +
        prometheus_escape(view_.leader) + "\",self=\"" + prometheus_escape(advertised_) + "\"} 1\n";
    if (journal_seen_) {
      gauge("traincoord_ha_journal_head_seq",
            "The last record number of the journal in etcd, as this coordinator last saw it.",
            std::to_string(journal_.head_seq));
      gauge("traincoord_ha_journal_head_revision", "The etcd revision of that write.",
            std::to_string(journal_.head_revision));
      gauge("traincoord_ha_journal_replay_records",
            "Records a takeover would replay at most (since the oldest run snapshot).",
            std::to_string(journal_.replay_records));
      gauge("traincoord_ha_journal_seen_age_seconds",
            "Seconds since this coordinator last saw the journal's head.",
            prometheus_number(static_cast<double>(ms_since(*journal_seen_)) / 1000.0));
    }
    gauge("traincoord_ha_takeovers_total", "Times this process took the runs over.",
          std::to_string(takeovers_), "counter");
    gauge("traincoord_ha_stepdowns_total",
          "Times this process stepped down (a write refused, the lease lost).",
          std::to_string(stepdowns_), "counter");
    if (takeovers_ > 0) {
      gauge("traincoord_ha_last_takeover_timestamp_seconds",
            "When this process last took the runs over (Unix time).",
            prometheus_number(
                std::chrono::duration<double>(last_takeover_.time_since_epoch()).count()));
      gauge("traincoord_ha_last_takeover_seconds",
            "Seconds from winning the election to serving, at the last takeover.",
            prometheus_number(last_takeover_s_));
    }
  }
  // Another leads (`term` 0: no one known). Ignored while this one leads: only step_down ends that.
  void follow(int64_t term, std::string leader) {
    std::lock_guard lock(mu_);
    if (view_.leading) return;
    view_ = {false, term, std::move(leader)};
  }
  // Ends this coordinator's leadership (a write refused, the lease lost): from now on nothing is
  // written or answered under it. Returns false when it did not lead.
  bool step_down(const std::string& why) {
    {
      std::lock_guard lock(mu_);
      if (!view_.leading) return false;
      view_ = {false, 0, {}};
      why_ = why;
      stepdowns_ += 1;
      changed_ += 1;
    }
    cv_.notify_all();
    return true;
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
  // `*seen`, which it updates). Returns why it stepped down, empty otherwise.
  std::string wait(uint64_t* seen, std::chrono::milliseconds for_at_most) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, for_at_most, [&] { return changed_ != *seen; });
    *seen = changed_;
    std::string why = std::move(why_);
    why_.clear();
    return why;
  }

 private:
  static int64_t ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t)
        .count();
  }

  std::string advertised_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  View view_;
  std::string why_;
  bool stop_ = false;
  uint64_t changed_ = 0;
  JournalPosition journal_;
  std::optional<std::chrono::steady_clock::time_point> journal_seen_;
  uint64_t takeovers_ = 0, stepdowns_ = 0;
  std::chrono::system_clock::time_point last_takeover_{};
  double last_takeover_s_ = 0;
};

}  // namespace traincoord
