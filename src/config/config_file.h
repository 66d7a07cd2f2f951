// Run configs in TOML: the file a user writes (examples/runs/*.toml, docs/CONFIG.md).
#pragma once

#include <string>
#include <string_view>

#include "core/error.h"
#include "core/run_config.h"

namespace traincoord {

// Parses and validates a run config. `source` names the text in messages (a file path).
// Fails with kInvalidArgument naming the field: a syntax error, an unknown key, a value of the
// wrong type or out of range, or a rule of validate().
Result<RunConfig> parse_run_config(std::string_view toml, std::string_view source);

// The same from text that came over the network (POST /v1/runs/{run}/config): no file is read
// (a lengths file is refused; lengths come inline, as durable_config_text writes them).
Result<RunConfig> parse_sent_run_config(std::string_view toml, std::string_view source);

// The same from JSON: an object with the same keys and tables as the TOML file (the body of
// POST /v1/runs). Integers must be JSON integers.
Result<RunConfig> parse_run_config_json(std::string_view json, std::string_view source);

// A file's lengths (data.train_lengths / data.dev_lengths: paths relative to the folder of
// `source`) are read when it is parsed; the JSON form reads no file (give lengths.train =
// [...] inline).

// The config text to store with a run so that it needs no file again (a restart, a standby):
// `toml` with the lengths read from files appended as a [lengths] table with their checksums
// (lengths.train_xxh3, checked when the text is parsed again). `toml` itself when it has no
// lengths from files. REQUIRES: parse_run_config(toml) gave `config`.
std::string durable_config_text(std::string_view toml, const RunConfig& config);

// Reads the file at `path` and parses it.
Result<RunConfig> load_run_config(const std::string& path);

// The formats of the config text a journal keeps with a run (SavedRun::config_format). A run's
// config is stored as "toml/4" or "json/4" since the cost model's fit keeps the declared shape
// (RunConfig::declared_shape_fit); "toml/3" and "json/3" were stored before it, since the
// warm-up re-plan of cost-balanced step mode; "toml/2" and "json/2" before that (such a run
// never re-plans: its journal replays as it was answered; RunConfig::warm_up_replan), and
// "toml" and "json" before schedule.mode "auto" became the default, in which a config without
// schedule.mode meant "jobs" (and still does: a run saved then keeps its mode across the
// upgrade).
inline constexpr std::string_view kStoredToml = "toml/4";
inline constexpr std::string_view kStoredJson = "json/4";
// Parses a stored config of any of those formats (another is an error naming it).
Result<RunConfig> parse_stored_run_config(std::string_view format, std::string_view text,
                                          std::string_view source);

}  // namespace traincoord
