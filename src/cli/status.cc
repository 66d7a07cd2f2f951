// `traincoord status` and `traincoord runs`: a terminal view of a coordinator.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <rapidjson/document.h>

#include "cli/commands.h"
#include "cli/terminal_text.h"
#include "traincoord/client.h"

namespace traincoord::cli {

namespace {

using rapidjson::Value;

// Checked reads of a reply: a member that is missing, or of another type than expected, reads
// as absent ("-"), never as undefined behaviour (a coordinator of another version, a reply cut
// short). at() of a value that is not an object is absent too, so reads chain.
const Value& at(const Value& o, const char* key) {
  static const Value kAbsent;
  if (!o.IsObject()) return kAbsent;
  const auto it = o.FindMember(key);
  return it == o.MemberEnd() ? kAbsent : it->value;
}

// The items of a list; none when `v` is not one.
Value::ConstArray items(const Value& v) {
  static const Value kEmpty(rapidjson::kArrayType);
  return v.IsArray() ? v.GetArray() : kEmpty.GetArray();
}

std::optional<int64_t> int_of(const Value& v) {
  return v.IsInt64() ? std::optional<int64_t>(v.GetInt64()) : std::nullopt;
}
std::optional<uint64_t> uint_of(const Value& v) {
  return v.IsUint64() ? std::optional<uint64_t>(v.GetUint64()) : std::nullopt;
}
bool flag(const Value& v) { return v.IsBool() && v.GetBool(); }

// A whole number as printed, "-" when absent.
std::string count(const Value& v) {
  if (v.IsUint64()) return std::to_string(v.GetUint64());
  if (v.IsInt64()) return std::to_string(v.GetInt64());
  return "-";
}

// A string of the coordinator's reply, as it may be printed (terminal_text.h).
std::string text(const Value& v) {
  if (!v.IsString()) return "-";
  return terminal_safe(std::string_view(v.GetString(), v.GetStringLength()));
}

std::string num(const Value& v, const char* fmt = "%.4f") {
  if (!v.IsNumber()) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v.GetDouble());
  return buf;
}

std::string duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const long s = std::lround(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

// A time `ago_ms` before `wall_now_ms` as a local date, "2024-12-04 15:33:12".
std::string local_date(int64_t wall_now_ms, double ago_ms) {
  const time_t t = static_cast<time_t>((static_cast<double>(wall_now_ms) - ago_ms) / 1000.0);
  tm local{};
  localtime_r(&t, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &local);
  return buf;
}

// When something happened `ago` (a reply's *_ago_ms): "12.5 s ago", "0:03:20 ago", or the local
// date with `wall_now_ms`; "-" when absent.
std::string when(const Value& ago, std::optional<int64_t> wall_now_ms) {
  if (!ago.IsNumber()) return "-";
  const double ms = ago.GetDouble();
  if (wall_now_ms) return local_date(*wall_now_ms, ms);
  char buf[48];
  if (ms < 60'000) {
    std::snprintf(buf, sizeof buf, "%.1f s ago", ms / 1000.0);
  } else {
    std::snprintf(buf, sizeof buf, "%s ago", duration(ms / 1000.0).c_str());
  }
  return buf;
}

// The group and its generation, the latest checkpoint cut and the counters of cuts (docs/CLI.md).
void render_cuts(const Value& r, std::ostream& out, std::optional<int64_t> wall_now_ms) {
  const Value& group = at(r, "group");
  const Value& cuts = at(r, "cuts");
  const Value& counters = at(r, "counters");
  out << "group " << (group.IsString() ? text(group) : std::string("none")) << ", generation "
      << count(at(r, "generation")) << "\n";
  out << "cuts: " << count(at(cuts, "count")) << " kept (keeps the last " << count(at(cuts, "keep"))
      << "); latest: ";
  const Value& latest = at(cuts, "latest");
  if (latest.IsObject()) {
    out << "cut " << count(at(latest, "id"));
    if (int_of(at(latest, "epoch"))) {
      out << ", " << text(at(latest, "set")) << " epoch " << count(at(latest, "epoch"));
    }
    out << ", " << count(at(latest, "jobs_done")) << " jobs done, "
        << count(at(latest, "partial_jobs")) << " partly trained ("
        << count(at(latest, "partial_batches")) << " batches), "
        << when(at(latest, "completed_ago_ms"), wall_now_ms);
  } else {
    out << "none";
  }
  out << "\n";
  out << "cuts taken " << count(at(counters, "cuts")) << ", restores "
      << count(at(counters, "restores")) << ", jobs withdrawn "
      << count(at(counters, "jobs_withdrawn")) << ", leases voided "
      << count(at(counters, "leases_voided")) << "\n\n";
}

// Step mode (docs/API.md, the status's `steps`): one line, the current train epoch's steps (else
// the dev epoch's), what its plan was made with and predicts, and the ranks' pace. Empty for a
// run that hands out jobs.
std::string steps_line(const Value& r) {
  const Value& steps = at(r, "steps");
  if (!steps.IsObject()) return "";
  const Value* shown = nullptr;
  for (const Value& s : items(at(steps, "sets"))) {
    if (!shown || (flag(at(*shown, "closed")) && !flag(at(s, "closed")))) shown = &s;
  }
  std::string line = "steps: world size " + count(at(steps, "world_size"));
  if (shown) {
    const Value& s = *shown;
    line += "; " + text(at(s, "set")) + " epoch " + count(at(s, "epoch")) + " " +
            count(at(s, "done")) + "/" + count(at(s, "planned")) + " steps done, " +
            count(at(s, "batches_in_flight")) + " batches in flight, " +
            count(at(s, "batches_queued")) + " queued";
    if (at(s, "planned_with").IsString()) {
      line += ", planned with the " + text(at(s, "planned_with")) + " cost";
    }
    const Value& predicted = at(s, "predicted");
    if (predicted.IsObject()) {
      const Value& padding = at(predicted, "padding");
      char pad[32] = "-";
      if (padding.IsNumber()) std::snprintf(pad, sizeof pad, "%.1f%%", 100 * padding.GetDouble());
      line += " (predicted straggling " + num(at(predicted, "straggling"), "%.3f") + ", padding " +
              pad + ")";
    }
  }
  // The ranks' pace: the slowest and the fastest, in samples per second of their own time.
  double slowest = 0, fastest = 0;
  bool any = false;
  for (const Value& rank : items(at(steps, "ranks"))) {
    const Value& v = at(rank, "samples_per_s");
    if (!v.IsNumber() || !(v.GetDouble() > 0)) continue;
    slowest = any ? std::min(slowest, v.GetDouble()) : v.GetDouble();
    fastest = any ? std::max(fastest, v.GetDouble()) : v.GetDouble();
    any = true;
  }
  if (any) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "; ranks %.1f to %.1f samples/s", slowest, fastest);
    line += buf;
  }
  return line + "\n";
}

void render_run(const Value& r, std::ostream& out, std::optional<int64_t> wall_now_ms) {
  const Value& plan = at(r, "plan");
  const Value& progress = at(r, "progress");
  out << "run " << text(at(r, "run")) << ": " << text(at(r, "state"));
  if (const Value& reason = at(r, "reason"); reason.IsString() && reason.GetStringLength() > 0) {
    out << " (" << text(reason) << ")";
  }
  out << "\n";
  out << "epochs " << count(at(plan, "start_epoch")) << " .. " << count(at(plan, "target_epoch"))
      << ", " << count(at(plan, "train_jobs_per_epoch")) << " train jobs and "
      << count(at(plan, "dev_jobs_per_epoch")) << " dev jobs per epoch, "
      << count(at(plan, "batches_per_job")) << " batches per job";
  // How it hands out work (schedule.mode; "auto" until its first acquire chooses).
  if (const Value& mode = at(r, "mode"); mode.IsString()) {
    const std::string_view m(mode.GetString(), mode.GetStringLength());
    out << (m == "steps"  ? ", in steps (one batch per rank per step)"
            : m == "jobs" ? ", in jobs"
                          : ", steps for a group or jobs, as the first request for work says");
  }
  out << "\n\n";

  const Value& current = at(r, "current");
  if (current.IsObject()) {
    const uint64_t done =
        uint_of(at(current, "done")).value_or(0) + uint_of(at(current, "failed")).value_or(0);
    const uint64_t jobs = uint_of(at(current, "jobs")).value_or(0);
    out << text(at(current, "set")) << " epoch " << count(at(current, "epoch")) << "  "
        << progress_bar(done, jobs, 30) << " " << done << "/" << jobs << " jobs, "
        << count(at(current, "running")) << " running\n";
  }
  out << steps_line(r);
  out << "run: " << count(at(progress, "jobs_done")) << "/" << count(at(progress, "jobs_planned"))
      << " jobs, " << num(at(progress, "jobs_per_s"), "%.1f") << " jobs/s, ETA "
      << (at(progress, "eta_s").IsNumber() ? duration(at(progress, "eta_s").GetDouble()) : "-")
      << "\n\n";

  render_cuts(r, out, wall_now_ms);

  out << "epoch  train loss  dev loss\n";
  std::map<int64_t, std::pair<std::string, std::string>> losses;
  for (const Value& e : items(at(r, "epochs"))) {
    const auto epoch = int_of(at(e, "epoch"));
    if (!epoch) continue;
    auto& row = losses[*epoch];
    const std::string v = flag(at(e, "closed")) ? num(at(e, "loss")) : "running";
    (text(at(e, "set")) == "train" ? row.first : row.second) = v;
  }
  for (const auto& [epoch, row] : losses) {
    char line[128];
    std::snprintf(line, sizeof line, "%5lld  %10s  %8s\n", static_cast<long long>(epoch),
                  row.first.empty() ? "-" : row.first.c_str(),
                  row.second.empty() ? "-" : row.second.c_str());
    out << line;
  }
  if (uint_of(at(r, "epochs_from")).value_or(0) > 0) {  // (the status lists the latest epochs)
    out << "(the latest of " << count(at(r, "epochs_total")) << " epochs opened; `traincoord "
        << "history " << text(at(r, "run")) << "` lists them all)\n";
  }

  const Value& es = at(r, "early_stop");
  out << "\nearly stop: " << text(at(es, "rule"));
  if (int_of(at(es, "best_epoch"))) {
    out << ", best epoch " << count(at(es, "best_epoch")) << " (" << text(at(es, "monitor")) << " "
        << num(at(es, "best_value")) << ")";
  }
  if (flag(at(es, "stopped"))) out << ", stopped: " << text(at(es, "reason"));
  out << "\n\n";

  const auto workers = items(at(r, "workers"));
  uint64_t active = 0;
  for (const Value& w : workers) active += flag(at(w, "active")) ? 1 : 0;
  out << "workers: " << active << " active of " << workers.Size() << "\n";
  out << "  name                      jobs  leases  last seen\n";
  for (const Value& w : workers) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-24s %5s  %6u  %s%s\n", text(at(w, "name")).c_str(),
                  count(at(w, "jobs_done")).c_str(), items(at(w, "leases")).Size(),
                  when(at(w, "last_seen_ago_ms"), wall_now_ms).c_str(),
                  flag(at(w, "active")) ? "" : " (left)");
    out << line;
  }
  const auto events = items(at(r, "events"));
  if (!events.Empty()) {
    out << "\nrecent events:\n";
    const rapidjson::SizeType from = events.Size() > 5 ? events.Size() - 5 : 0;
    for (rapidjson::SizeType i = from; i < events.Size(); ++i) {
      out << "  ";
      if (wall_now_ms) out << when(at(events[i], "ago_ms"), wall_now_ms) << "  ";
      out << text(at(events[i], "kind")) << ": " << text(at(events[i], "text")) << "\n";
    }
  }
}

}  // namespace

void print_run_status(const std::string& status_json, std::ostream& out,
                      std::optional<int64_t> wall_now_ms) {
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(status_json.c_str());  // any depth, no recursion
  if (d.HasParseError() || !d.IsObject()) {
    out << "the run's status is not a JSON object: " << terminal_safe(status_json.substr(0, 200))
        << "\n";
    return;
  }
  render_run(d, out, wall_now_ms);
}

// High availability (docs/HA.md "Watching it"): one line per coordinator of GET /v1/coordinator.
// Leadership is per run (docs/HA.md): which runs this coordinator leads and who leads the others,
// as it last read etcd; the first 8, then how many more.
static std::string runs_led_line(const Value& runs) {
  if (!runs.IsArray() || runs.Empty()) return "";
  constexpr rapidjson::SizeType kShown = 8;
  std::string line = "    runs:";
  for (rapidjson::SizeType i = 0; i < runs.Size() && i < kShown; ++i) {
    const Value& r = runs[i];
    line += (i == 0 ? " " : "; ") + text(at(r, "run"));
    if (text(at(r, "role")) == "leader") {
      line += " led here";
    } else if (at(r, "leader").IsString()) {
      line += " led by " + text(at(r, "leader"));
    } else {
      line += " no leader known";
    }
    line += " (term " + count(at(r, "term")) + ", head " + count(at(r, "head_seq")) + ")";
  }
  if (runs.Size() > kShown) line += "; and " + std::to_string(runs.Size() - kShown) + " more";
  return line + "\n";
}

std::string coordinator_line(const std::string& url, const std::string& json) {
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(json.c_str());
  std::string line = "  " + terminal_safe(url) + "  ";
  if (d.HasParseError() || !d.IsObject()) return line + "answered no JSON object\n";
  const bool leading = text(at(d, "role")) == "leader";
  line += leading ? "leader " : text(at(d, "role"));
  const Value& leader = at(d, "leader");
  if (leading) {
    line += " term " + count(at(leader, "term"));
  } else if (leader.IsObject()) {
    line += " following " + text(at(leader, "url")) + " (term " + count(at(leader, "term")) + ")";
  } else {
    line += " no leader known (an election is due)";
  }
  const Value& journal = at(d, "journal");
  if (journal.IsObject()) {
    line += "; journal head " + count(at(journal, "head_seq")) + " (etcd revision " +
            count(at(journal, "head_revision")) + ")";
    const Value& ago = at(journal, "seen_ms_ago");
    if (!leading && ago.IsNumber()) {
      char buf[48];
      std::snprintf(buf, sizeof buf, " read %.1f s ago", ago.GetDouble() / 1000.0);
      line += buf;
    }
    line += ", a takeover replays <= " + count(at(journal, "replay_records")) + " records";
  }
  line += "; takeovers " + count(at(d, "takeovers"));
  const Value& last = at(d, "last_takeover_ms");
  if (last.IsInt64()) {
    line += " (last " + local_date(last.GetInt64(), 0) + ", serving " +
            num(at(d, "last_takeover_s"), "%.2f") + " s after winning)";
  }
  return line + "\n" + runs_led_line(at(d, "runs"));
}

// The coordinators' lines when `urls` name coordinators in HA mode (or several): empty with
// one coordinator alone.
static std::string coordinators_text(const std::string& urls) {
  std::vector<std::string> list;
  for (size_t from = 0; from <= urls.size();) {
    size_t comma = urls.find(',', from);
    if (comma == std::string::npos) comma = urls.size();
    if (comma > from) list.push_back(urls.substr(from, comma - from));
    from = comma + 1;
  }
  std::string out;
  bool ha = false;
  for (const std::string& url : list) {
    auto body = client::get(url, "/v1/coordinator");
    if (!body) {
      out += "  " + terminal_safe(url) + "  " + terminal_safe(body.error().message) + "\n";
      continue;
    }
    ha = ha || body->find("\"mode\":\"ha\"") != std::string::npos;
    out += coordinator_line(url, *body);
  }
  return ha || list.size() > 1 ? "coordinators:\n" + out + "\n" : std::string();
}

int report_client_error(const client::ClientError& e, const std::string& url) {
  std::cerr << "traincoord: " << terminal_safe(url) << ": " << terminal_safe(e.message) << "\n";
  return e.code == client::codes::kRunNotFound ? exit_code::kRunNotFound : exit_code::kFailed;
}

int runs(const StatusArgs& args) {
  auto body = client::get(args.url, "/v1/runs");
  if (!body) return report_client_error(body.error(), args.url);
  if (args.json) {
    std::cout << *body << "\n";
    return 0;
  }
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(body->c_str());  // any depth, no recursion
  std::printf("%-24s %-14s %7s %14s %8s\n", "RUN", "STATE", "EPOCH", "JOBS", "WORKERS");
  for (const Value& r : items(at(d, "runs"))) {
    if (at(r, "led_here").IsFalse()) {  // HA: another coordinator leads it (docs/HA.md)
      const std::string leader =
          at(r, "leader").IsString() ? "led by " + text(at(r, "leader")) : "no leader yet";
      std::printf("%-24s %s\n", text(at(r, "run")).c_str(), leader.c_str());
      continue;
    }
    const std::string epoch =
        int_of(at(r, "epoch")) ? count(at(r, "epoch")) + "/" + count(at(r, "target_epoch")) : "-";
    const std::string jobs = count(at(r, "jobs_done")) + "/" + count(at(r, "jobs_planned"));
    std::printf("%-24s %-14s %7s %14s %8s\n", text(at(r, "run")).c_str(),
                text(at(r, "state")).c_str(), epoch.c_str(), jobs.c_str(),
                count(at(r, "workers_active")).c_str());
  }
  return 0;
}

int status(const StatusArgs& args) {
  std::string run = args.run;
  if (run.empty()) {
    auto list = client::get(args.url, "/v1/runs");
    if (!list) return report_client_error(list.error(), args.url);
    rapidjson::Document d;
    d.Parse<rapidjson::kParseIterativeFlag>(list->c_str());  // any depth, no recursion
    const auto listed = items(at(d, "runs"));
    if (listed.Size() != 1) {
      if (listed.Empty()) {
        std::cout << "no runs on " << args.url << "\n";
        return 0;
      }
      std::cerr << "traincoord: " << args.url << " serves " << listed.Size()
                << " runs; name one (traincoord runs lists them)\n";
      return exit_code::kUsage;
    }
    const Value& name = at(listed[0], "run");
    if (!name.IsString()) {
      std::cerr << "traincoord: " << args.url << " lists a run without a name\n";
      return exit_code::kFailed;
    }
    run = name.GetString();
  }
  while (true) {
    auto body = client::get(args.url, "/v1/runs/" + run);
    if (!body) return report_client_error(body.error(), args.url);
    if (args.json) {
      std::cout << *body << "\n";
      return 0;
    }
    rapidjson::Document d;
    d.Parse<rapidjson::kParseIterativeFlag>(body->c_str());  // any depth, no recursion
    std::ostringstream out;
    out << coordinators_text(args.url);
    print_run_status(*body, out);
    if (args.watch) std::cout << "\x1b[H\x1b[2J";  // home, clear screen
    std::cout << out.str() << std::flush;
    if (!args.watch || text(at(d, "state")) != "running") return 0;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int64_t>(args.interval_s * 1000)));
  }
}

}  // namespace traincoord::cli
