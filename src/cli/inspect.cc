// `traincoord inspect`: the state of the runs in a data dir, without a server (for a user
// whose server will not start, or who wants to look at a finished run).
#include <iostream>

#include "cli/commands.h"
#include "core/engine.h"
#include "server/api.h"
#include "server/coordinator.h"
#include "server/restore.h"
#include "server/server_clock.h"
#include "store/store.h"

namespace traincoord::cli {

int inspect(const InspectArgs& args) {
  StoreOptions options;
  options.dir = args.data_dir;
  options.read_only = true;
  auto store = Store::open(options);
  if (!store) {
    std::cerr << "traincoord: " << store.error().message << "\n";
    return 2;
  }
  ServerClock clock;
  Engine engine(clock);
  Api api(engine, clock, ApiLimits::none());  // replays what was accepted
  auto report = restore_engine(**store, engine, api, clock);
  if (!report) {
    std::cerr << "traincoord: " << (*store)->path() << ": " << report.error().message << "\n";
    return 2;
  }
  std::vector<std::string> names;
  for (const Run* run : engine.runs()) {
    if (args.run.empty() || run->config().name == args.run) names.push_back(run->config().name);
  }
  if (names.empty()) {
    std::cerr << "traincoord: " << (*store)->path()
              << (args.run.empty() ? " holds no runs" : " holds no run named " + args.run) << "\n";
    return args.run.empty() ? 0 : 3;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    auto reply = api.handle(HttpRequest{"GET", "/v1/runs/" + names[i], "", {}});
    const std::string& body = std::get<HttpReply>(reply).body;
    if (args.json) {
      std::cout << body << "\n";
    } else {
      if (i > 0) std::cout << "\n";
      print_run_status(body, std::cout);
    }
  }
  return 0;
}

}  // namespace traincoord::cli
