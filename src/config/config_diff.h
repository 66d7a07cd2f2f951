// Comparing run configs: what a user changed in the config of a run that has already started.
#pragma once

#include <string>
#include <vector>

#include "core/run_config.h"

namespace traincoord {

// The fields (as named in the TOML file, e.g. "leases.timeout") whose values differ.
std::vector<std::string> config_differences(const RunConfig& a, const RunConfig& b);

// Whether a started run can take a new value of `field` (--apply-config-changes): the lease
// settings and the early-stop rule can; what shapes the plan (sizes, schedule, order) cannot.
bool changeable_in_a_started_run(const std::string& field);

}  // namespace traincoord
