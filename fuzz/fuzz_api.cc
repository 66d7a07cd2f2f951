// libFuzzer target: every JSON request body of the API, against a live run. The first byte
// picks the endpoint; the rest is the body. Nothing may crash, hang or break an invariant; every
// reply (and /metrics) is valid UTF-8, and every worker name the API accepted is valid user
// text (user_text.h), whatever the body held.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "config/config_file.h"
#include "core/engine.h"
#include "core/user_text.h"
#include "core/utf8.h"
#include "server/api.h"

using namespace traincoord;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ManualClock clock;
  static Engine* engine = nullptr;
  static Api* api = nullptr;
  static int requests = 0;
  if (engine == nullptr || ++requests % 5000 == 0) {  // a fresh run now and then
    delete api;
    delete engine;
    engine = new Engine(clock);
    auto config = parse_run_config(
        "name = \"f\"\n[data]\ntrain_batches = 7\ndev_batches = 3\n[schedule]\nepochs = 3\n"
        "[leases]\ntimeout = 0.05\nmax_attempts = 2\non_job_failure = \"skip\"\n"
        "[early_stop]\nrule = \"patience\"\npatience = 1\n",
        "fuzz");
    if (!engine->create_run(*config)) __builtin_trap();  // no run: nothing would be fuzzed
    api = new Api(*engine, clock);
    (void)api->handle({"POST", "/v1/runs/f/workers", R"({"name": "w"})", ""});
  }
  if (size == 0) return 0;
  // Every endpoint of the table (server/api.h), at the run "f"; a new one is fuzzed unasked.
  static const std::vector<std::string> kTargets = [] {
    std::vector<std::string> targets;
    for (const Endpoint& e : Api::endpoints()) {
      std::string path(e.path);
      if (auto at = path.find("{run}"); at != std::string::npos) path.replace(at, 5, "f");
      targets.push_back(path);
    }
    return targets;
  }();
  const size_t pick = data[0] % kTargets.size();
  const std::string method = (data[0] & 0x80) ? "GET" : "POST";
  clock.advance(data[0] & 0x0f);
  auto reply = api->handle(
      {method, kTargets[pick], std::string(reinterpret_cast<const char*>(data + 1), size - 1), ""});
  if (auto* r = std::get_if<HttpReply>(&reply); r && !utf8::valid(r->body)) std::abort();
  if (Api::endpoints()[pick].name == "workers") {  // a registration: what it stored is valid
    for (const Run* run : engine->runs()) {
      for (const WorkerInfo& w : run->workers()) {
        if (!validate_text("name", w.name, 128)) std::abort();
      }
    }
  }
  if ((data[0] & 0x70) == 0x70 && !utf8::valid(api->metrics_text())) std::abort();
  return 0;
}
