// A changed config for a run that has started: which fields differ, whether the run may take
// them, and the run under the new config. One rule for every way a change arrives: a config
// file at a start (--apply-config-changes, the SQLite journal), at a takeover (etcd), and the
// live admin call (POST /v1/runs/{run}/config, docs/API.md).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/run.h"
#include "core/run_config.h"

namespace traincoord {

struct ConfigChange {
  std::vector<std::string> changed;  // the fields that differ (none: nothing to do)
  std::string refused;               // why they are not applied (empty: they may be)
};

// `given` for the started `run` (`where` names it in messages: "run x (x.toml)"). Without
// `apply`, any difference is refused, naming the fields and the flag; with it, a field that
// shapes the plan (changeable_in_a_started_run), schedule.epochs of a seed_compat run, and a
// target epoch below those the run has opened are refused.
ConfigChange check_config_change(const RunConfig& given, const Run& run, std::string_view where,
                                 bool apply);

// `run` under `given`, its state carried over (RunCodec) and what it shows too (its recent
// events and completions), with a `config_changed` event saying `how` ("changed by
// --apply-config-changes: schedule.epochs"). REQUIRES: check_config_change allowed it.
Result<std::unique_ptr<Run>> apply_config_change(const Run& run, RunConfig given, std::string how,
                                                 const Clock& clock);

}  // namespace traincoord
