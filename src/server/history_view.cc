#include "server/history_view.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>
#include <vector>

#include "server/status_view.h"
#include "server/wall_time.h"

namespace traincoord {

namespace {

// The recent completions a history lists: those numbered after `jobs_after`. A completion's
// number is its place among the run's counted completions (RecentCompletion::n; the series'
// `n`), so a poller that remembers the last it saw asks only for the newer ones.
struct RecentJobs {
  size_t begin = 0;    // index of the first listed in recent_completions()
  uint64_t total = 0;  // the number of the newest counted completion
};

RecentJobs recent_jobs(const Run& run, uint64_t jobs_after) {
  const auto& recent = run.recent_completions();
  RecentJobs r;
  r.total = run.counters().completions_accepted;
  r.begin = static_cast<size_t>(
      std::partition_point(recent.begin(), recent.end(),
                           [&](const RecentCompletion& c) { return c.n <= jobs_after; }) -
      recent.begin());
  return r;
}

// The wall-clock time (ms since the Unix epoch) of `t`, a time of the run's clock.
int64_t wall_ms(const HistoryPage& page, TimeMs now, TimeMs t) {
  return page.wall_now_ms - (now - t);
}

// "time" (ISO 8601, UTC) and "time_ms" of `t`; both null when there is none.
void write_time(JsonWriter& j, const HistoryPage& page, TimeMs now, std::optional<TimeMs> t) {
  if (!t) {
    j.key("time").null().key("time_ms").null();
    return;
  }
  const int64_t ms = wall_ms(page, now, *t);
  j.field("time", iso8601_utc(ms)).field("time_ms", ms);
}

// The name of the worker that completed `c` (empty if the run no longer lists it).
std::string_view worker_name(const Run& run, const RecentCompletion& c) {
  return c.worker < run.workers().size() ? std::string_view(run.workers()[c.worker].name)
                                         : std::string_view();
}

// The fields of one epoch of the history (JSON and JSON lines).
void write_history_epoch(JsonWriter& j, const Epoch& e, const HistoryPage& page, TimeMs now) {
  j.field("set", set_name(e.plan.set)).field("epoch", e.plan.epoch);
  j.field("closed", e.closed()).key("loss");
  if (e.closed()) {
    j.value(e.loss);
  } else {
    j.null();
  }
  j.key("metrics").begin_object();
  for (const Epoch::MetricSum& ms : e.metrics) j.field(ms.name, e.metric(ms.name, true));
  j.end_object().field("done", e.done).field("jobs", e.plan.size());
  j.key("closed_ago_ms");
  if (e.closed_at) {
    j.value(now - *e.closed_at);
  } else {
    j.null();
  }
  write_time(j, page, now, e.closed_at);
  // Its samples and how long it was open (null while open): its throughput, samples / duration_s.
  j.field("samples", e.samples).key("duration_s");
  if (const std::optional<double> d = epoch_duration_s(e)) {
    j.value(*d);
  } else {
    j.null();
  }
}

// The fields of one recent completion of the history (JSON and JSON lines).
void write_history_job(JsonWriter& j, const Run& run, const RecentCompletion& c, uint64_t n,
                       const HistoryPage& page, TimeMs now) {
  j.field("n", n).field("set", set_name(c.set)).field("epoch", c.epoch).field("job", c.job);
  j.field("loss", c.loss).field("ago_ms", now - c.time).field("worker", worker_name(run, c));
  write_time(j, page, now, c.time);
}

// One CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break.
void csv_field(std::string& out, std::string_view v) {
  if (v.find_first_of(",\"\r\n") == std::string_view::npos) {
    out += v;
    return;
  }
  out += '"';
  for (char c : v) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
}

// A number as the JSON replies write it: the shortest text that reads back the same; empty
// (JSON's null) when not finite.
std::string csv_number(double v) {
  if (!std::isfinite(v)) return "";
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  assert(ec == std::errc());
  return std::string(buf, end);
}

}  // namespace

std::string history_csv(const Run& run, const HistoryPage& page, TimeMs now) {
  const std::pair<size_t, size_t> epochs = page.epochs;
  const RecentJobs jobs = recent_jobs(run, page.jobs_after);
  std::vector<std::string> names;
  for (size_t i = epochs.first; i < epochs.second; ++i) {
    for (const Epoch::MetricSum& ms : run.epochs()[i].metrics) {
      if (std::find(names.begin(), names.end(), ms.name) == names.end()) names.push_back(ms.name);
    }
  }
  std::string out =
      "kind,set,epoch,job,closed,loss,done,jobs,ago_ms,worker,time,time_ms,samples,duration_s";
  for (const std::string& n : names) {
    out += ',';
    csv_field(out, "metric." + n);
  }
  out += "\r\n";
  for (size_t i = epochs.first; i < epochs.second; ++i) {
    const Epoch& e = run.epochs()[i];
    out += "epoch,";
    out += set_name(e.plan.set);
    out += ',' + std::to_string(e.plan.epoch) + ",," + (e.closed() ? "true" : "false") + ',';
    out += e.closed() ? csv_number(e.loss) : "";
    out += ',' + std::to_string(e.done) + ',' + std::to_string(e.plan.size()) + ',';
    if (e.closed_at) out += std::to_string(now - *e.closed_at);
    out += ",,";
    if (e.closed_at) {
      const int64_t ms = wall_ms(page, now, *e.closed_at);
      out += iso8601_utc(ms) + ',' + std::to_string(ms);
    } else {
      out += ',';
    }
    out += ',' + std::to_string(e.samples) + ',';
    if (const std::optional<double> d = epoch_duration_s(e)) out += csv_number(*d);
    for (const std::string& n : names) {
      out += ',';
      const bool has = std::any_of(e.metrics.begin(), e.metrics.end(),
                                   [&](const Epoch::MetricSum& ms) { return ms.name == n; });
      if (has) out += csv_number(e.metric(n, true));
    }
    out += "\r\n";
  }
  for (size_t i = jobs.begin; i < run.recent_completions().size(); ++i) {
    const RecentCompletion& c = run.recent_completions()[i];
    out += "job,";
    out += set_name(c.set);
    out += ',' + std::to_string(c.epoch) + ',' + std::to_string(c.job) + ",," + csv_number(c.loss) +
           ",,," + std::to_string(now - c.time) + ',';
    csv_field(out, worker_name(run, c));
    const int64_t ms = wall_ms(page, now, c.time);
    out += ',' + iso8601_utc(ms) + ',' + std::to_string(ms) + ",,";
    out.append(names.size(), ',');
    out += "\r\n";
  }
  return out;
}

std::string history_jsonl(const Run& run, const HistoryPage& page, TimeMs now) {
  const RecentJobs jobs = recent_jobs(run, page.jobs_after);
  const auto& recent = run.recent_completions();
  std::string out;
  for (size_t i = page.epochs.first; i < page.epochs.second; ++i) {
    JsonWriter j;
    j.begin_object().field("kind", "epoch");
    write_history_epoch(j, run.epochs()[i], page, now);
    out += j.end_object().take();
    out += '\n';
  }
  for (size_t i = jobs.begin; i < recent.size(); ++i) {
    JsonWriter j;
    j.begin_object().field("kind", "job");
    write_history_job(j, run, recent[i], recent[i].n, page, now);
    out += j.end_object().take();
    out += '\n';
  }
  return out;
}

void write_history(JsonWriter& j, const Run& run, const HistoryPage& page, TimeMs now) {
  const RecentJobs jobs = recent_jobs(run, page.jobs_after);
  const auto& recent = run.recent_completions();
  j.begin_object().field("run", run.config().name).field("generation", run.generation());
  j.field("epochs_total", static_cast<uint64_t>(run.epochs().size()));
  j.field("epochs_from", static_cast<uint64_t>(page.epochs.first));
  j.key("epochs").begin_array();
  for (size_t i = page.epochs.first; i < page.epochs.second; ++i) {
    j.begin_object();
    write_history_epoch(j, run.epochs()[i], page, now);
    j.end_object();
  }
  j.end_array().field("jobs_total", jobs.total).key("jobs").begin_array();
  for (size_t i = jobs.begin; i < recent.size(); ++i) {
    j.begin_object();
    write_history_job(j, run, recent[i], recent[i].n, page, now);
    j.end_object();
  }
  j.end_array().end_object();
}

void write_series(JsonWriter& j, const Run& run, uint64_t after) {
  j.begin_object();
  j.field("run", run.config().name);
  j.field("completions", run.counters().completions_accepted);
  j.field("after", after);
  j.field("dropped_names", run.series().dropped_names());
  j.key("series").begin_array();
  for (const auto& [key, series] : run.series().all()) {
    j.begin_object();
    j.field("set", set_name(key.first)).field("name", key.second);
    j.field("stride", series.stride()).field("count", series.count());
    auto point = [&](const SeriesPoint& p) {
      j.begin_array().value(p.n).value(p.epoch).value(p.value).end_array();
    };
    j.key("points").begin_array();
    for (const SeriesPoint& p : series.kept_after(after)) point(p);
    j.end_array();
    j.key("latest");  // the latest value when the stride did not keep it (else null)
    if (const std::optional<SeriesPoint> latest = series.latest_unkept()) {
      point(*latest);
    } else {
      j.null();
    }
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

std::string series_csv(const Run& run, uint64_t after) {
  std::string out = "set,name,n,epoch,value\n";
  for (const auto& [key, series] : run.series().all()) {
    std::vector<SeriesPoint> points = series.kept_after(after);
    if (auto latest = series.latest_unkept(); latest && latest->n > after)
      points.push_back(*latest);
    for (const SeriesPoint& p : points) {
      out += set_name(key.first);
      out += ',';
      csv_field(out, key.second);
      out += ',' + std::to_string(p.n) + ',' + std::to_string(p.epoch) + ',' + csv_number(p.value) +
             '\n';
    }
  }
  return out;
}

}  // namespace traincoord
