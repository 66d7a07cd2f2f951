#include "config/config_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace traincoord {
namespace {

TEST(ConfigFile, ReadsEveryField) {
  auto c = parse_run_config(R"(
name = "sweep-3"
[data]
train_batches = 1000
dev_batches = 50
order = "sequential"
seed = 9
[schedule]
epochs = -3
validation_every = 2
gpus_per_worker = 4
iters_per_worker = 2
replicas_to_agg = 3
start_step = 120
seed_compat = true
overlap_epochs = true
[leases]
timeout = 2.5
max_attempts = 5
on_job_failure = "skip"
history = 100
[early_stop]
rule = "patience"
monitor = "accuracy"
mode = "max"
min_delta = 0.001
patience = 4
baseline = 0.1
stopping_threshold = 0.99
divergence_threshold = 0.01
check_finite = false
)",
                            "test.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->name, "sweep-3");
  EXPECT_EQ(c->train_batches, 1000u);
  EXPECT_EQ(c->dev_batches, 50u);
  EXPECT_EQ(c->order, BatchOrder::kSequential);
  EXPECT_EQ(c->seed, 9u);
  EXPECT_EQ(c->epochs, -3);
  EXPECT_EQ(c->validation_every, 2);
  EXPECT_EQ(c->gpus_per_worker, 4);
  EXPECT_EQ(c->iters_per_worker, 2);
  EXPECT_EQ(c->replicas_to_agg, 3);
  EXPECT_EQ(c->start_step, 120u);
  EXPECT_TRUE(c->seed_compat);
  EXPECT_TRUE(c->overlap_epochs);
  EXPECT_EQ(c->lease_timeout_ms, 2500);
  EXPECT_EQ(c->max_attempts, 5);
  EXPECT_EQ(c->on_job_failure, JobFailurePolicy::kSkip);
  EXPECT_EQ(c->lease_history, 100u);
  const PatienceRuleConfig& p = c->early_stop.patience;
  EXPECT_EQ(c->early_stop.kind, EarlyStopKind::kPatience);
  EXPECT_EQ(p.monitor, "accuracy");
  EXPECT_EQ(p.mode, MonitorMode::kMax);
  EXPECT_DOUBLE_EQ(p.min_delta, 0.001);
  EXPECT_EQ(p.patience, 4);
  EXPECT_EQ(p.baseline, 0.1);
  EXPECT_EQ(p.stopping_threshold, 0.99);
  EXPECT_EQ(p.divergence_threshold, 0.01);
  EXPECT_FALSE(p.check_finite);
}

TEST(ConfigFile, TurnsSamplesIntoBatchesRoundingUp) {
  auto c = parse_run_config(R"(
name = "s"
[data]
train_samples = 1001
dev_samples = 100
batch_size = 10
)",
                            "s.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->train_batches, 101u);
  EXPECT_EQ(c->dev_batches, 10u);
  EXPECT_EQ(c->batch_size, 10u);
}

struct Refusal {
  const char* toml;
  const char* field;
  const char* says;
};

class ConfigFileRefuses : public ::testing::TestWithParam<Refusal> {};

TEST_P(ConfigFileRefuses, NamingTheField) {
  auto c = parse_run_config(GetParam().toml, "bad.toml");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(c.error().field, GetParam().field) << c.error().message;
  EXPECT_NE(c.error().message.find(GetParam().says), std::string::npos) << c.error().message;
  EXPECT_NE(c.error().message.find("bad.toml"), std::string::npos) << c.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    BadConfigs, ConfigFileRefuses,
    ::testing::Values(
        Refusal{"name = \"x\"\n[data]\ntrain_batchez = 3\n", "data.train_batchez", "unknown key"},
        Refusal{"name = \"x\"\n", "data", "missing"},
        Refusal{"name = \"x\"\n[data]\ntrain_batches = -1\n", "data.train_batches", "between"},
        Refusal{"name = \"x\"\n[data]\ntrain_batches = \"ten\"\n", "data.train_batches", "integer"},
        Refusal{"name = \"x\"\n[data]\ntrain_samples = 10\n", "data.batch_size", "needed"},
        Refusal{"name = \"x\"\n[data]\ntrain_batches = 3\n[schedule]\nvalidation_every = 1\n",
                "data.dev_batches", "dev set"},
        Refusal{"name = \"x\"\n[data]\ntrain_batches = 3\ndev_batches = 1\n[early_stop]\nrule = "
                "\"window\"\nwindow = 1\n",
                "early_stop.window", "at least 2"},
        Refusal{"name = \"x\"\n[data]\ntrain_batches = 3\n[early_stop]\nrule = \"sometimes\"\n",
                "early_stop.rule", "one of"},
        Refusal{"name = \"x\"\n[data]\ntrain_batches = 3\n[leases]\ntimeout = 0\n",
                "leases.timeout", "between"},
        // (an integer a double cannot hold exactly: it threw bad_optional_access; fuzz_config)
        Refusal{"name = \"x\"\n[data]\ntrain_batches = 3\n[leases]\ntimeout = "
                "9223372036854775807\n",
                "leases.timeout", "between"},
        Refusal{"name = \"has space\"\n[data]\ntrain_batches = 3\n", "name", "letters"},
        Refusal{"name = \"..\"\n[data]\ntrain_batches = 3\n", "name", "must not start with '.'"},
        Refusal{"name = \".env\"\n[data]\ntrain_batches = 3\n", "name", "must not start"},
        Refusal{"name = \"caf\\u00e9\"\n[data]\ntrain_batches = 3\n", "name", "ASCII"},
        Refusal{"name = \"x\"\n[data]\ntrain_batches = 3\ndev_batches = 1\n[early_stop]\nrule = "
                "\"patience\"\nmonitor = \"acc\\u001b[2J\"\n",
                "early_stop.monitor", "U+001B"},
        Refusal{"name = \"x\"\n[data\ntrain_batches = 3\n", "", "bad.toml:2"},
        Refusal{"name = \"x\"\nepochs = 3\n[data]\ntrain_batches = 3\n", "epochs", "unknown key"}));

TEST(ConfigFile, LoadsTheShippedExample) {
  auto c = load_run_config(std::string(TRAINCOORD_SOURCE_DIR) + "/examples/runs/example.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->name, "example");
}

TEST(ConfigFile, SaysWhichFileItCannotRead) {
  auto c = load_run_config("/nonexistent/run.toml");
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("/nonexistent/run.toml"), std::string::npos);
}

}  // namespace
}  // namespace traincoord

namespace traincoord {
namespace {

TEST(ConfigJson, AcceptsTheSameTreeAsToml) {
  auto c = parse_run_config_json(
      R"({"name": "j", "data": {"train_batches": 10, "dev_batches": 2},
          "schedule": {"epochs": 3}, "leases": {"timeout": 1.5},
          "early_stop": {"rule": "window", "window": 3}})",
      "request");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->name, "j");
  EXPECT_EQ(c->train_batches, 10u);
  EXPECT_EQ(c->epochs, 3);
  EXPECT_EQ(c->lease_timeout_ms, 1500);
  EXPECT_EQ(c->early_stop.window.window, 3);
}

TEST(ConfigJson, RefusesWhatTomlRefusesNamingTheField) {
  auto c = parse_run_config_json(R"({"name": "j", "data": {"train_batches": 1.5}})", "request");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().field, "data.train_batches");
  auto unknown =
      parse_run_config_json(R"({"name": "j", "data": {"train_batches": 1}, "x": 1})", "request");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().field, "x");
  auto bad = parse_run_config_json("{not json", "request");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("invalid JSON"), std::string::npos);
  EXPECT_FALSE(parse_run_config_json("[1]", "request"));
}

TEST(ConfigJson, BytesBeforeOrANulInsideTheTextAreRefused) {
  const std::string good = R"({"name": "j", "data": {"train_batches": 2}})";
  ASSERT_TRUE(parse_run_config_json(good, "request"));
  for (const std::string prefix : {"\xEF", "\xBB", "\xBF", "\xEF\xBB\xBF"}) {
    EXPECT_FALSE(parse_run_config_json(prefix + good, "request")) << prefix.size();
  }
  auto nul = parse_run_config_json(good + std::string(1, '\0') + "x", "request");
  ASSERT_FALSE(nul);
  EXPECT_NE(nul.error().message.find("NUL"), std::string::npos) << nul.error().message;
}

}  // namespace
}  // namespace traincoord

namespace traincoord {
namespace {

TEST(ConfigJson, AHugeFloatWhereAnIntegerGoesIsAnErrorNotAConversion) {
  auto c = parse_run_config_json(R"({"name": "j", "data": {"train_batches": 1e110}})", "request");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().field, "data.train_batches");
  EXPECT_NE(c.error().message.find("integer"), std::string::npos);
}

TEST(EnumNames, EachNameParsesBackToItsValueAndNothingElseParses) {
  for (BatchOrder v : {BatchOrder::kSequential, BatchOrder::kShuffled}) {
    EXPECT_EQ(parse_batch_order(batch_order_name(v)), v);
  }
  for (JobFailurePolicy v : {JobFailurePolicy::kFailRun, JobFailurePolicy::kSkip}) {
    EXPECT_EQ(parse_job_failure_policy(job_failure_policy_name(v)), v);
  }
  for (EarlyStopKind v : {EarlyStopKind::kNone, EarlyStopKind::kWindow, EarlyStopKind::kPatience}) {
    EXPECT_EQ(parse_early_stop_kind(early_stop_kind_name(v)), v);
  }
  for (MonitorMode v : {MonitorMode::kMin, MonitorMode::kMax}) {
    EXPECT_EQ(parse_monitor_mode(monitor_mode_name(v)), v);
  }
  EXPECT_EQ(batch_order_name(BatchOrder::kSequential), "sequential");
  EXPECT_EQ(job_failure_policy_name(JobFailurePolicy::kFailRun), "fail_run");
  EXPECT_EQ(early_stop_kind_name(EarlyStopKind::kPatience), "patience");
  EXPECT_EQ(monitor_mode_name(MonitorMode::kMax), "max");
  EXPECT_FALSE(parse_batch_order("Shuffled"));
  EXPECT_FALSE(parse_early_stop_kind(""));
  EXPECT_FALSE(parse_job_failure_policy("skip "));
}

TEST(EnumNames, TheConfigFileOffersTheNamesOfTheTable) {
  auto c = parse_run_config("name = \"r\"\n[data]\ntrain_batches = 4\norder = \"random\"\n", "t");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().field, "data.order");
  EXPECT_NE(c.error().message.find("must be one of \"sequential\", \"shuffled\""),
            std::string::npos)
      << c.error().message;
}

}  // namespace
}  // namespace traincoord
