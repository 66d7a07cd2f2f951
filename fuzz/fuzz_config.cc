// libFuzzer target: the run config parsers (TOML files, JSON bodies of POST /v1/runs).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)traincoord::parse_run_config(text, "fuzz.toml");
  (void)traincoord::parse_run_config_json(text, "fuzz.json");
  return 0;
}
