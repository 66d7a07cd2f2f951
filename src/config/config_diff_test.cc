#include "config/config_diff.h"
#include "config/config_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace traincoord {
namespace {

struct Change {
  std::string field;
  std::function<void(RunConfig&)> apply;
};

// One change per field of the config file: a field that config_fields() lists must have one
// here, so that each row is shown to compare the member it names.
std::vector<Change> one_change_per_field() {
  return {
      {"data.train_batches", [](RunConfig& c) { c.train_batches += 1; }},
      {"data.dev_batches", [](RunConfig& c) { c.dev_batches += 1; }},
      {"data.batch_size", [](RunConfig& c) { c.batch_size += 1; }},
      {"data.train_samples", [](RunConfig& c) { c.train_samples += 1; }},
      {"data.dev_samples", [](RunConfig& c) { c.dev_samples += 1; }},
      {"data.order", [](RunConfig& c) { c.order = BatchOrder::kSequential; }},
      {"data.seed", [](RunConfig& c) { c.seed += 1; }},
      {"schedule.gpus_per_worker", [](RunConfig& c) { c.gpus_per_worker += 1; }},
      {"schedule.iters_per_worker", [](RunConfig& c) { c.iters_per_worker += 1; }},
      {"schedule.replicas_to_agg", [](RunConfig& c) { c.replicas_to_agg += 1; }},
      {"schedule.epochs", [](RunConfig& c) { c.epochs += 1; }},
      {"schedule.validation_every", [](RunConfig& c) { c.validation_every += 1; }},
      {"schedule.start_step", [](RunConfig& c) { c.start_step += 1; }},
      {"schedule.seed_compat", [](RunConfig& c) { c.seed_compat = !c.seed_compat; }},
      {"schedule.overlap_epochs", [](RunConfig& c) { c.overlap_epochs = !c.overlap_epochs; }},
      {"schedule.mode", [](RunConfig& c) { c.mode = ScheduleMode::kSteps; }},
      {"schedule.batch_budget", [](RunConfig& c) { c.batch_budget += 1; }},
      {"schedule.cost", [](RunConfig& c) { c.cost.c += 1; }},
      {"data.train_lengths", [](RunConfig& c) { c.train_lengths.push_back(1); }},
      {"data.dev_lengths", [](RunConfig& c) { c.dev_lengths.push_back(1); }},
      {"lengths.train_xxh3", [](RunConfig& c) { c.train_lengths_xxh64 += 1; }},
      {"lengths.dev_xxh3", [](RunConfig& c) { c.dev_lengths_xxh64 += 1; }},
      {"leases.timeout", [](RunConfig& c) { c.lease_timeout_ms += 1; }},
      {"leases.max_attempts", [](RunConfig& c) { c.max_attempts += 1; }},
      {"leases.on_job_failure", [](RunConfig& c) { c.on_job_failure = JobFailurePolicy::kSkip; }},
      {"leases.history", [](RunConfig& c) { c.lease_history += 1; }},
      {"cuts.keep", [](RunConfig& c) { c.keep_cuts += 1; }},
      {"early_stop.rule", [](RunConfig& c) { c.early_stop.kind = EarlyStopKind::kPatience; }},
      {"early_stop.window", [](RunConfig& c) { c.early_stop.window.window += 1; }},
      {"early_stop.mean_threshold", [](RunConfig& c) { c.early_stop.window.mean_threshold += 1; }},
      {"early_stop.std_threshold", [](RunConfig& c) { c.early_stop.window.std_threshold += 1; }},
      {"early_stop.monitor", [](RunConfig& c) { c.early_stop.patience.monitor = "accuracy"; }},
      {"early_stop.mode", [](RunConfig& c) { c.early_stop.patience.mode = MonitorMode::kMax; }},
      {"early_stop.min_delta", [](RunConfig& c) { c.early_stop.patience.min_delta += 1; }},
      {"early_stop.patience", [](RunConfig& c) { c.early_stop.patience.patience += 1; }},
      {"early_stop.baseline", [](RunConfig& c) { c.early_stop.patience.baseline = 0.5; }},
      {"early_stop.stopping_threshold",
       [](RunConfig& c) { c.early_stop.patience.stopping_threshold = 0.1; }},
      {"early_stop.divergence_threshold",
       [](RunConfig& c) { c.early_stop.patience.divergence_threshold = 9.0; }},
      {"early_stop.check_finite",
       [](RunConfig& c) {
         c.early_stop.patience.check_finite = !c.early_stop.patience.check_finite;
       }},
  };
}

TEST(ConfigDiff, NamesExactlyTheFieldThatDiffers) {
  const RunConfig base;
  const std::vector<Change> changes = one_change_per_field();
  ASSERT_EQ(changes.size(), config_fields().size());
  std::set<std::string> listed;
  for (const ConfigField& f : config_fields()) listed.insert(std::string(f.name));
  EXPECT_EQ(listed.size(), config_fields().size()) << "a field is listed twice";
  for (const Change& change : changes) {
    EXPECT_EQ(listed.count(change.field), 1u) << change.field << " is not in config_fields()";
    RunConfig changed = base;
    change.apply(changed);
    EXPECT_EQ(config_differences(base, changed), std::vector<std::string>{change.field});
    if (change.field == "schedule.mode") continue;  // (not symmetric: below)
    EXPECT_EQ(config_differences(changed, base), std::vector<std::string>{change.field});
  }
}

// A config that leaves schedule.mode to its default keeps the stored run's mode, whatever it is
// (one stored before "auto" existed reads as jobs); a mode given must be the stored one.
TEST(ConfigDiff, AGivenAutoModeKeepsTheStoredOneAndAGivenModeMustBeIt) {
  RunConfig stored, given;
  for (ScheduleMode s : {ScheduleMode::kJobs, ScheduleMode::kSteps, ScheduleMode::kAuto}) {
    stored.mode = s;
    given.mode = ScheduleMode::kAuto;
    EXPECT_TRUE(config_differences(stored, given).empty());
    given.mode = s;
    EXPECT_TRUE(config_differences(stored, given).empty());
  }
  stored.mode = ScheduleMode::kJobs;
  given.mode = ScheduleMode::kSteps;
  EXPECT_EQ(config_differences(stored, given), std::vector<std::string>{"schedule.mode"});
  stored.mode = ScheduleMode::kAuto;
  EXPECT_EQ(config_differences(stored, given), std::vector<std::string>{"schedule.mode"});
}

// A config stored before "auto" existed ("toml", "json") meant jobs without schedule.mode;
// stored since ("toml/2", "json/2") it means auto. Explicit modes read as written.
TEST(StoredConfig, AConfigStoredBeforeAutoWithoutAModeIsAJobModeRun) {
  const std::string toml =
      "name = \"r\"\n[data]\ntrain_samples = 8\nbatch_size = 2\n[schedule]\nvalidation_every = 0\n";
  const std::string json = R"({"name": "r", "data": {"train_samples": 8, "batch_size": 2}, )"
                           R"("schedule": {"validation_every": 0}})";
  EXPECT_EQ(parse_stored_run_config("toml", toml, "s")->mode, ScheduleMode::kJobs);
  EXPECT_EQ(parse_stored_run_config("json", json, "s")->mode, ScheduleMode::kJobs);
  EXPECT_EQ(parse_stored_run_config(kStoredToml, toml, "s")->mode, ScheduleMode::kAuto);
  EXPECT_EQ(parse_stored_run_config(kStoredJson, json, "s")->mode, ScheduleMode::kAuto);
  const std::string steps = toml + "mode = \"steps\"\n";
  EXPECT_EQ(parse_stored_run_config("toml", steps, "s")->mode, ScheduleMode::kSteps);
  auto unknown = parse_stored_run_config("yaml", toml, "s");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().field, "config_format");
}

// A run stored before the warm-up re-plan ("toml/2", "json/2", and older) keeps the rule it was
// answered under: its journal replays as that build answered (found by review: else a running
// cost-balanced run upgraded mid-epoch would re-plan on replay, and the coordinator would count
// other samples for the leases than the ranks trained).
TEST(StoredConfig, AConfigStoredBeforeTheWarmUpRePlanNeverRePlans) {
  const std::string toml =
      "name = \"r\"\n[data]\ntrain_samples = 8\nbatch_size = 2\n[schedule]\nvalidation_every = 0\n";
  const std::string json = R"({"name": "r", "data": {"train_samples": 8, "batch_size": 2}, )"
                           R"("schedule": {"validation_every": 0}})";
  for (const char* old : {"toml/2", "toml"}) {
    EXPECT_FALSE(parse_stored_run_config(old, toml, "s")->warm_up_replan) << old;
  }
  for (const char* old : {"json/2", "json"}) {
    EXPECT_FALSE(parse_stored_run_config(old, json, "s")->warm_up_replan) << old;
  }
  EXPECT_EQ(parse_stored_run_config("toml/2", toml, "s")->mode, ScheduleMode::kAuto);
  EXPECT_TRUE(parse_stored_run_config(kStoredToml, toml, "s")->warm_up_replan);
  EXPECT_TRUE(parse_stored_run_config(kStoredJson, json, "s")->warm_up_replan);
  EXPECT_TRUE(parse_run_config(toml, "s")->warm_up_replan);  // a new run, or a changed config
  EXPECT_TRUE(parse_stored_run_config("toml/3", toml, "s")->warm_up_replan);
  EXPECT_TRUE(parse_stored_run_config("json/3", json, "s")->warm_up_replan);
}

// A run stored before the cost model's fit kept the declared shape ("toml/3", "json/3", and
// older) keeps the fit it was answered under: the fit decides the plans of the epochs laid out
// after it, so a replay under the new fit would plan other batches than the ranks were handed.
TEST(StoredConfig, AConfigStoredBeforeTheDeclaredShapeFitKeepsTheOldFit) {
  const std::string toml =
      "name = \"r\"\n[data]\ntrain_samples = 8\nbatch_size = 2\n[schedule]\nvalidation_every = 0\n";
  const std::string json = R"({"name": "r", "data": {"train_samples": 8, "batch_size": 2}, )"
                           R"("schedule": {"validation_every": 0}})";
  for (const char* old : {"toml/3", "toml/2", "toml"}) {
    EXPECT_FALSE(parse_stored_run_config(old, toml, "s")->declared_shape_fit) << old;
  }
  for (const char* old : {"json/3", "json/2", "json"}) {
    EXPECT_FALSE(parse_stored_run_config(old, json, "s")->declared_shape_fit) << old;
  }
  EXPECT_TRUE(parse_stored_run_config(kStoredToml, toml, "s")->declared_shape_fit);
  EXPECT_TRUE(parse_stored_run_config(kStoredJson, json, "s")->declared_shape_fit);
  EXPECT_TRUE(parse_run_config(toml, "s")->declared_shape_fit);
  EXPECT_EQ(kStoredToml, "toml/4");
  EXPECT_EQ(kStoredJson, "json/4");
}

TEST(ConfigDiff, EqualConfigsDifferInNothingNotEvenTheirName) {
  RunConfig a, b;
  b.name = "another";
  EXPECT_TRUE(config_differences(a, b).empty());
  a.early_stop.patience.baseline = std::nan("");
  b.early_stop.patience.baseline = std::nan("");
  a.early_stop.window.mean_threshold = b.early_stop.window.mean_threshold = std::nan("");
  EXPECT_TRUE(config_differences(a, b).empty());  // NaN equals NaN: nothing the user changed
}

TEST(ConfigDiff, AStartedRunTakesNewLeaseSettingsEarlyStopAndEpochsButKeepsItsPlan) {
  for (const char* field :
       {"leases.timeout", "leases.max_attempts", "leases.on_job_failure", "early_stop.rule",
        "early_stop.window", "early_stop.patience", "early_stop.check_finite", "schedule.epochs"}) {
    EXPECT_TRUE(changeable_in_a_started_run(field)) << field;
  }
  for (const char* field :
       {"data.train_batches", "data.order", "data.seed", "schedule.validation_every",
        "schedule.start_step", "leases.history", "name", "nonsense"}) {
    EXPECT_FALSE(changeable_in_a_started_run(field)) << field;
  }
}

}  // namespace
}  // namespace traincoord
