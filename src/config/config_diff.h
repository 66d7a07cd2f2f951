// Comparing run configs: what a user changed in the config of a run that has already started.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/run_config.h"

namespace traincoord {

// One field of RunConfig as the config file names it. config_fields() lists every field but the
// run's name (which identifies the run and so never differs): a static_assert in
// config_diff.cc stops the build when RunConfig gains a field the table does not list.
struct ConfigField {
  std::string_view name;  // as in the TOML file, e.g. "leases.timeout"
  bool changeable;        // whether a started run can take a new value (--apply-config-changes)
  bool (*same)(const RunConfig& a, const RunConfig& b);  // NaN equals NaN
};
std::span<const ConfigField> config_fields();

// The fields (as named in the TOML file, e.g. "leases.timeout") whose values differ between a
// run's `stored` config and a `given` one, in the order of config_fields(). (Not symmetric in
// one field: a given schedule.mode "auto", the default, matches any stored mode.)
std::vector<std::string> config_differences(const RunConfig& stored, const RunConfig& given);

// Whether a started run can take a new value of `field` (--apply-config-changes): the lease
// settings, the early-stop rule and schedule.epochs can (the epochs raised, or lowered to those
// opened already: RunCodec::load checks); what shapes the plan (sizes, order) cannot.
// False for a name that is not one of config_fields().
bool changeable_in_a_started_run(const std::string& field);

}  // namespace traincoord
