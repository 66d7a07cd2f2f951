// libFuzzer target: every JSON request body of the API, against a live run. The first byte
// picks the endpoint; the rest is the body. Nothing may crash, hang or break an invariant.
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config_file.h"
#include "core/engine.h"
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
    (void)engine->create_run(*config);
    api = new Api(*engine, clock);
    (void)api->handle({"POST", "/v1/runs/f/workers", R"({"name": "w"})", ""});
  }
  if (size == 0) return 0;
  static const char* kTargets[] = {
      "/v1/runs/f/acquire", "/v1/runs/f/complete", "/v1/runs/f/heartbeat",  "/v1/runs/f/fail",
      "/v1/runs/f/leave",   "/v1/runs/f/workers",  "/v1/runs/f/next_index", "/v1/runs/f/cancel",
      "/v1/runs",           "/v1/runs/f",          "/v1/runs/f/history",    "/healthz"};
  const size_t pick = data[0] % (sizeof kTargets / sizeof kTargets[0]);
  const std::string method = (data[0] & 0x80) ? "GET" : "POST";
  clock.advance(data[0] & 0x0f);
  (void)api->handle(
      {method, kTargets[pick], std::string(reinterpret_cast<const char*>(data + 1), size - 1), ""});
  if ((data[0] & 0x70) == 0x70) (void)api->metrics_text();
  return 0;
}
