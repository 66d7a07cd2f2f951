#include "config/config_change.h"

#include <algorithm>

#include "config/config_diff.h"
#include "core/plan.h"
#include "core/run_codec.h"

namespace traincoord {

namespace {

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

}  // namespace

ConfigChange check_config_change(const RunConfig& given, const Run& run, std::string_view where,
                                 bool apply) {
  ConfigChange c;
  c.changed = config_differences(run.config(), given);
  if (c.changed.empty()) return c;
  const std::string at(where);
  if (!apply) {
    c.refused = at +
                " was started with a different config; these fields differ: " + join(c.changed) +
                ". Give the run a new name to start afresh, or pass --apply-config-changes "
                "(it may change schedule.epochs, leases.timeout, leases.max_attempts, "
                "leases.on_job_failure, cuts.keep and early_stop.*)";
    return c;
  }
  std::vector<std::string> fixed;
  for (const std::string& f : c.changed) {
    if (!changeable_in_a_started_run(f)) fixed.push_back(f);
  }
  if (!fixed.empty()) {
    c.refused = at + ": a started run cannot change " + join(fixed) +
                " (they shape its plan); give the run a new name to start afresh";
  } else if (given.seed_compat &&
             std::find(c.changed.begin(), c.changed.end(), "schedule.epochs") != c.changed.end()) {
    c.refused = at +
                ": a seed_compat run keeps its schedule.epochs (the original planned "
                "what the checkpoint left into its last epoch); give the run a new name";
  } else if (const int64_t least = run.opened_train_end(); make_plan(given).end_epoch < least) {
    c.refused = at + ": schedule.epochs: the run has opened train epoch " +
                std::to_string(least - 1) + " already, so its target epoch can be " +
                std::to_string(least) + " at the least; raise it, or give the run a new name";
  }
  return c;
}

Result<std::unique_ptr<Run>> apply_config_change(const Run& run, RunConfig given, std::string how,
                                                 const Clock& clock) {
  auto updated = RunCodec::load(std::move(given), RunCodec::save(run), clock);
  if (!updated) return updated;
  (*updated)->keep_views_of(run);
  (*updated)->note_config_change(std::move(how));
  return updated;
}

}  // namespace traincoord
