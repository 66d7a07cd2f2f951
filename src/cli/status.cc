// `traincoord status` and `traincoord runs`: a terminal view of a coordinator.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <rapidjson/document.h>

#include "cli/commands.h"
#include "cli/terminal_text.h"
#include "traincoord/client.h"

namespace traincoord::cli {

namespace {

// A string of the coordinator's reply, as it may be printed (terminal_text.h).
std::string text(const rapidjson::Value& v) {
  if (!v.IsString()) return "-";
  return terminal_safe(std::string_view(v.GetString(), v.GetStringLength()));
}

std::string num(const rapidjson::Value& v, const char* fmt = "%.4f") {
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

void render_run(const rapidjson::Document& r, std::ostream& out,
                std::optional<int64_t> wall_now_ms) {
  const auto& plan = r["plan"];
  const auto& progress = r["progress"];
  out << "run " << text(r["run"]) << ": " << text(r["state"]);
  if (r["reason"].GetStringLength() > 0) out << " (" << text(r["reason"]) << ")";
  out << "\n";
  out << "epochs " << plan["start_epoch"].GetInt64() << " .. " << plan["target_epoch"].GetInt64()
      << ", " << plan["train_jobs_per_epoch"].GetUint64() << " train jobs and "
      << plan["dev_jobs_per_epoch"].GetUint64() << " dev jobs per epoch, "
      << plan["batches_per_job"].GetUint64() << " batches per job\n\n";

  const auto& current = r["current"];
  if (current.IsObject()) {
    const uint64_t done = current["done"].GetUint64() + current["failed"].GetUint64();
    const uint64_t jobs = current["jobs"].GetUint64();
    out << text(current["set"]) << " epoch " << current["epoch"].GetInt64() << "  "
        << progress_bar(done, jobs, 30) << " " << done << "/" << jobs << " jobs, "
        << current["running"].GetUint64() << " running\n";
  }
  out << "run: " << progress["jobs_done"].GetUint64() << "/" << progress["jobs_planned"].GetUint64()
      << " jobs, " << num(progress["jobs_per_s"], "%.1f") << " jobs/s, ETA "
      << (progress["eta_s"].IsNumber() ? duration(progress["eta_s"].GetDouble()) : "-") << "\n\n";

  out << "epoch  train loss  dev loss\n";
  std::map<int64_t, std::pair<std::string, std::string>> losses;
  for (const auto& e : r["epochs"].GetArray()) {
    auto& row = losses[e["epoch"].GetInt64()];
    const std::string v = e["closed"].GetBool() ? num(e["loss"]) : "running";
    (std::string(e["set"].GetString()) == "train" ? row.first : row.second) = v;
  }
  for (const auto& [epoch, row] : losses) {
    char line[128];
    std::snprintf(line, sizeof line, "%5lld  %10s  %8s\n", static_cast<long long>(epoch),
                  row.first.empty() ? "-" : row.first.c_str(),
                  row.second.empty() ? "-" : row.second.c_str());
    out << line;
  }

  const auto& es = r["early_stop"];
  out << "\nearly stop: " << text(es["rule"]);
  if (es["best_epoch"].IsInt64()) {
    out << ", best epoch " << es["best_epoch"].GetInt64() << " (" << text(es["monitor"]) << " "
        << num(es["best_value"]) << ")";
  }
  if (es["stopped"].GetBool()) out << ", stopped: " << text(es["reason"]);
  out << "\n\n";

  uint64_t active = 0;
  for (const auto& w : r["workers"].GetArray()) active += w["active"].GetBool() ? 1 : 0;
  out << "workers: " << active << " active of " << r["workers"].Size() << "\n";
  out << "  name                      jobs  leases  last seen\n";
  for (const auto& w : r["workers"].GetArray()) {
    const double ago_ms = w["last_seen_ago_ms"].GetDouble();
    char seen[48];
    if (wall_now_ms) {
      std::snprintf(seen, sizeof seen, "%s", local_date(*wall_now_ms, ago_ms).c_str());
    } else {
      std::snprintf(seen, sizeof seen, "%.1f s ago", ago_ms / 1000.0);
    }
    char line[200];
    std::snprintf(line, sizeof line, "  %-24s %5llu  %6u  %s%s\n", text(w["name"]).c_str(),
                  static_cast<unsigned long long>(w["jobs_done"].GetUint64()), w["leases"].Size(),
                  seen, w["active"].GetBool() ? "" : " (left)");
    out << line;
  }
  const auto& events = r["events"].GetArray();
  if (!events.Empty()) {
    out << "\nrecent events:\n";
    const rapidjson::SizeType from = events.Size() > 5 ? events.Size() - 5 : 0;
    for (rapidjson::SizeType i = from; i < events.Size(); ++i) {
      out << "  ";
      if (wall_now_ms) out << local_date(*wall_now_ms, events[i]["ago_ms"].GetDouble()) << "  ";
      out << text(events[i]["kind"]) << ": " << text(events[i]["text"]) << "\n";
    }
  }
}

}  // namespace

void print_run_status(const std::string& status_json, std::ostream& out,
                      std::optional<int64_t> wall_now_ms) {
  rapidjson::Document d;
  d.Parse(status_json.c_str());
  render_run(d, out, wall_now_ms);
}

namespace {}  // namespace

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
  d.Parse(body->c_str());
  std::printf("%-24s %-14s %7s %14s %8s\n", "RUN", "STATE", "EPOCH", "JOBS", "WORKERS");
  for (const auto& r : d["runs"].GetArray()) {
    const std::string epoch = r["epoch"].IsInt64()
                                  ? std::to_string(r["epoch"].GetInt64()) + "/" +
                                        std::to_string(r["target_epoch"].GetInt64())
                                  : "-";
    const std::string jobs = std::to_string(r["jobs_done"].GetUint64()) + "/" +
                             std::to_string(r["jobs_planned"].GetUint64());
    std::printf("%-24s %-14s %7s %14s %8llu\n", text(r["run"]).c_str(), text(r["state"]).c_str(),
                epoch.c_str(), jobs.c_str(),
                static_cast<unsigned long long>(r["workers_active"].GetUint64()));
  }
  return 0;
}

int status(const StatusArgs& args) {
  std::string run = args.run;
  if (run.empty()) {
    auto list = client::get(args.url, "/v1/runs");
    if (!list) return report_client_error(list.error(), args.url);
    rapidjson::Document d;
    d.Parse(list->c_str());
    if (d["runs"].Size() != 1) {
      if (d["runs"].Empty()) {
        std::cout << "no runs on " << args.url << "\n";
        return 0;
      }
      std::cerr << "traincoord: " << args.url << " serves " << d["runs"].Size()
                << " runs; name one (traincoord runs lists them)\n";
      return exit_code::kUsage;
    }
    run = d["runs"][0]["run"].GetString();
  }
  while (true) {
    auto body = client::get(args.url, "/v1/runs/" + run);
    if (!body) return report_client_error(body.error(), args.url);
    if (args.json) {
      std::cout << *body << "\n";
      return 0;
    }
    rapidjson::Document d;
    d.Parse(body->c_str());
    std::ostringstream out;
    print_run_status(*body, out);
    if (args.watch) std::cout << "\x1b[H\x1b[2J";  // home, clear screen
    std::cout << out.str() << std::flush;
    if (!args.watch || std::string(d["state"].GetString()) != "running") return 0;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int64_t>(args.interval_s * 1000)));
  }
}

}  // namespace traincoord::cli
