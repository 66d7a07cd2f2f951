// `traincoord inspect`: the state of the runs in a data dir, without a server (for a user
// whose server will not start, or who wants to look at a finished run).
#include <chrono>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "core/engine.h"
#include "server/api.h"
#include "server/coordinator.h"
#include "server/restore.h"
#include "server/server_clock.h"
#include "store/store.h"

namespace traincoord::cli {

namespace {

// When the data dir was last written (milliseconds since the Unix epoch): the wall-clock time
// of the journal's latest record, near enough, which is the time the restored run's clock
// counts from. The journal keeps the coordinator's running time, not dates.
std::optional<int64_t> last_write_ms(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::optional<fs::file_time_type> latest;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const fs::file_time_type t = entry.last_write_time(ec);
    if (!ec && (!latest || t > *latest)) latest = t;
  }
  if (!latest) return std::nullopt;
  const auto wall = std::chrono::file_clock::to_sys(*latest);
  return std::chrono::duration_cast<std::chrono::milliseconds>(wall.time_since_epoch()).count();
}

}  // namespace

int inspect(const InspectArgs& args) {
  StoreOptions options;
  options.dir = args.data_dir;
  options.read_only = true;
  auto store = Store::open(options);
  if (!store) {
    std::cerr << "traincoord: " << store.error().message << "\n";
    return exit_code::kUsage;
  }
  ServerClock clock;
  Engine engine(clock);
  Api api(engine, clock, ApiLimits::none());  // replays what was accepted
  auto report = restore_engine(**store, engine, api, clock);
  if (!report) {
    std::cerr << "traincoord: " << (*store)->path() << ": " << report.error().message << "\n";
    return exit_code::kUsage;
  }
  // The completions table is not part of the runs' state (which the start checks): its
  // checksum chain is checked here, and damage is said, with the runs as they are.
  if (auto checked = (*store)->check_completions(); !checked) {
    std::cerr << "traincoord: WARNING: " << checked.error().message << "\n";
  }
  std::vector<std::string> names;
  for (const Run* run : engine.runs()) {
    if (args.run.empty() || run->config().name == args.run) names.push_back(run->config().name);
  }
  if (names.empty()) {
    std::cerr << "traincoord: " << (*store)->path()
              << (args.run.empty() ? " holds no runs" : " holds no run named " + args.run) << "\n";
    return args.run.empty() ? exit_code::kOk : exit_code::kRunNotFound;
  }
  // No server runs: "seen 2.0 s ago" would count from now, not from when the run stopped.
  const std::optional<int64_t> wall_now = last_write_ms(args.data_dir);
  if (!args.json && wall_now) {
    const time_t t = static_cast<time_t>(*wall_now / 1000);
    tm local{};
    localtime_r(&t, &local);
    char date[48];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", &local);
    std::cout << "times are local dates; the data dir was last written " << date << "\n\n";
  }
  for (size_t i = 0; i < names.size(); ++i) {
    auto reply = api.handle(HttpRequest{"GET", "/v1/runs/" + names[i], "", {}});
    const std::string& body = std::get<HttpReply>(reply).body;
    if (args.json) {
      std::cout << body << "\n";
    } else {
      if (i > 0) std::cout << "\n";
      print_run_status(body, std::cout, wall_now);
    }
  }
  return exit_code::kOk;
}

}  // namespace traincoord::cli
