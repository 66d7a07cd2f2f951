// libFuzzer target: the run config parsers (TOML files, JSON bodies of POST /v1/runs). What
// either accepts has a run name that is a safe path segment and a monitor that is valid text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "config/config_file.h"
#include "core/user_text.h"

namespace {

void check(const traincoord::Result<traincoord::RunConfig>& config) {
  if (!config) return;
  if (!traincoord::validate_run_name(config->name)) std::abort();
  const std::string& monitor = config->early_stop.patience.monitor;
  if (!monitor.empty() && !traincoord::validate_text("monitor", monitor, 64)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check(traincoord::parse_run_config(text, "fuzz.toml"));
  check(traincoord::parse_run_config_json(text, "fuzz.json"));
  return 0;
}
