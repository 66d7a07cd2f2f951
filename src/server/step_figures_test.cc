// Step and cost figures of a step-mode run (issue 32): the status's `steps` object, the step and
// cost series of /metrics and `traincoord status`'s step line, checked against the run's own state
// (the plan it hands out, the batch times the ranks reported).
#include <gtest/gtest.h>

#include <rapidjson/document.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/cost_test_config.h"
#include "core/run.h"
#include "server/metrics_text.h"
#include "server/status_view.h"

namespace traincoord {
namespace {

using testing::cost_config;
using testing::lengths_of;

std::string status_json(const Run& run) {
  JsonWriter j;
  write_status(j, run, 0, 0, 0);
  return j.take();
}

const rapidjson::Value* set_entry(const rapidjson::Document& d, const char* set) {
  for (const rapidjson::Value& s : d["steps"]["sets"].GetArray()) {
    if (std::string(s["set"].GetString()) == set) return &s;
  }
  return nullptr;
}

// The value of the series `name{labels}` in a metrics text; NaN when absent.
double series(const std::string& text, const std::string& name_and_labels) {
  const std::string line = name_and_labels + " ";
  const size_t at = text.find("\n" + line);
  if (at == std::string::npos) return std::nan("");
  return std::stod(text.substr(at + 1 + line.size()));
}

class StepFigures : public ::testing::Test {
 protected:
  StepFigures() : run_(cost_config(), clock_) {
    for (uint32_t r = 0; r < 2; ++r) {
      EXPECT_TRUE(run_.join_group("g"));
      ranks_.push_back(run_.join("g-rank" + std::to_string(r), "g", GroupRank{r, 2}));
    }
  }
  // Rank r's batch takes 1 ms per padded length unit, rank 1 twice as long. Counts what each
  // rank reported of its train batches.
  Completion done(const Job& job) {
    const std::vector<double>& lengths =
        job.set == SetKind::kTrain ? run_.config().train_lengths : run_.config().dev_lengths;
    double longest = 0;
    for (uint64_t s : job.samples) longest = std::max(longest, lengths[s]);
    Completion c{1.0, job.samples.size(), {}};
    c.seconds = 0.001 * static_cast<double>(job.samples.size()) * longest * (job.rank + 1);
    if (job.set == SetKind::kTrain) {
      samples_[job.rank] += job.samples.size();
      seconds_[job.rank] += c.seconds;
    }
    return c;
  }
  // One step: both ranks acquire, then complete (the first `complete_only` of them, if given).
  std::vector<Job> step(size_t complete_only = 2) {
    std::vector<Job> jobs;
    for (WorkerId w : ranks_) {
      auto a = run_.acquire(w);
      EXPECT_TRUE(a && a->status == AcquireStatus::kJob);
      if (!a || a->status != AcquireStatus::kJob) return jobs;
      jobs.push_back(a->job);
    }
    for (size_t r = 0; r < complete_only; ++r) {
      EXPECT_TRUE(run_.complete(ranks_[r], jobs[r].lease, done(jobs[r])));
    }
    return jobs;
  }
  ManualClock clock_;
  traincoord::Run run_;
  std::vector<WorkerId> ranks_;
  uint64_t samples_[2] = {0, 0};
  double seconds_[2] = {0, 0};
};

TEST_F(StepFigures, TheStatusCountsTheStepsOfTheCurrentEpochAndWhatItsPlanPredicts) {
  // Train epoch 0, planned with the declared cost: one step whole, then one half done.
  step();
  const std::vector<Job> half = step(1);
  const Epoch& e0 = run_.epochs()[0];
  rapidjson::Document d;
  d.Parse(status_json(run_).c_str());
  ASSERT_TRUE(d.IsObject() && d.HasMember("steps")) << status_json(run_);
  EXPECT_EQ(d["steps"]["world_size"].GetUint64(), 2u);
  const rapidjson::Value* train = set_entry(d, "train");
  ASSERT_NE(train, nullptr);
  EXPECT_EQ((*train)["epoch"].GetInt64(), 0);
  EXPECT_EQ((*train)["planned"].GetUint64(), run_.cost_plan(e0).steps.size());
  EXPECT_EQ((*train)["done"].GetUint64(), 1u);  // the second step waits for rank 1's batch
  EXPECT_EQ((*train)["batches_in_flight"].GetUint64(), 1u);
  EXPECT_EQ((*train)["batches_queued"].GetUint64(), 0u);
  EXPECT_STREQ((*train)["planned_with"].GetString(), "declared");
  const PlanFigures f =
      predicted_figures(run_.cost_plan(e0), e0.plan_cost, run_.config().train_lengths);
  ASSERT_TRUE((*train)["predicted"].IsObject());
  EXPECT_DOUBLE_EQ((*train)["predicted"]["straggling"].GetDouble(), f.straggling);
  EXPECT_DOUBLE_EQ((*train)["predicted"]["padding"].GetDouble(), f.padding);
  EXPECT_GE(f.straggling, 1.0);
  EXPECT_LT(f.straggling, 1.5);
  EXPECT_GE(f.padding, 0.0);
  EXPECT_LT(f.padding, 0.5);
  EXPECT_EQ(set_entry(d, "dev"), nullptr);  // no dev epoch laid out yet
  // Each rank's pace: the samples it reported over its own reported seconds.
  const auto& ranks = d["steps"]["ranks"];
  ASSERT_EQ(ranks.Size(), 2u);
  for (rapidjson::SizeType r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r]["samples"].GetUint64(), samples_[r]);
    EXPECT_DOUBLE_EQ(ranks[r]["samples_per_s"].GetDouble(),
                     static_cast<double>(samples_[r]) / seconds_[r]);
    EXPECT_TRUE(ranks[r]["speed"].IsNull());  // not fitted from 3 reports
  }
  // Rank 1 finishes the step: two done.
  ASSERT_TRUE(run_.complete(ranks_[1], half[1].lease, done(half[1])));
  d.Parse(status_json(run_).c_str());
  EXPECT_EQ((*set_entry(d, "train"))["done"].GetUint64(), 2u);
  EXPECT_EQ((*set_entry(d, "train"))["batches_in_flight"].GetUint64(), 0u);
}

TEST_F(StepFigures, OnceFittedTheNextEpochShowsTheFittedModelAndTheSlowRank) {
  // Train epoch 0 and its dev epoch whole; then the first step of train epoch 1.
  for (int i = 0; i < 200 && run_.epochs().size() < 3; ++i) step();
  ASSERT_EQ(run_.epochs().size(), 3u);
  step(1);  // rank 0 reports, rank 1 holds its batch
  const Epoch& e1 = run_.epochs()[2];
  ASSERT_EQ(e1.plan.set, SetKind::kTrain);
  rapidjson::Document d;
  d.Parse(status_json(run_).c_str());
  const rapidjson::Value* train = set_entry(d, "train");
  ASSERT_NE(train, nullptr);
  EXPECT_EQ((*train)["epoch"].GetInt64(), 1);
  EXPECT_STREQ((*train)["planned_with"].GetString(), "fitted");
  EXPECT_EQ((*train)["done"].GetUint64(), 0u);
  const rapidjson::Value* dev = set_entry(d, "dev");
  ASSERT_NE(dev, nullptr);
  EXPECT_TRUE((*dev)["closed"].GetBool());
  EXPECT_EQ((*dev)["done"].GetUint64(), (*dev)["planned"].GetUint64());
  EXPECT_TRUE((*dev)["predicted"].IsNull());  // a closed epoch's plan is not rebuilt
  EXPECT_NEAR(d["steps"]["ranks"][1]["speed"].GetDouble(), 2.0, 0.05);
  // Train epoch 0's plan, as its epoch row says: re-planned (or not) after the warm-up.
  {
    JsonWriter j;
    write_status(j, run_, 0, 10, 0);
    rapidjson::Document all;
    all.Parse(j.take().c_str());
    ASSERT_TRUE(all.IsObject() && all["epochs"].IsArray() && all["epochs"].Size() == 3u);
    const Epoch& e0 = run_.epochs()[0];
    const rapidjson::Value& with = all["epochs"][0]["planned_with"];
    ASSERT_TRUE(with.IsObject());
    if (e0.replanned_after > 0) {
      EXPECT_STREQ(with["source"].GetString(), "fitted");
      EXPECT_EQ(with["replanned_after"].GetUint64(), e0.replanned_after);
      EXPECT_EQ(with["first_model"].GetString(), e0.first_cost.describe());
      EXPECT_EQ(with["model"].GetString(), e0.plan_cost.describe());
    } else {
      EXPECT_FALSE(with.HasMember("replanned_after"));
    }
    EXPECT_GT(e0.replanned_after, 0u) << "this run's epoch 0 is long enough for the re-plan";
  }

  // The same figures in /metrics.
  const traincoord::Run* runs[] = {&run_};
  const std::string text = metrics_text(runs, 0, 64);
  const std::string l = "{run=\"costs\",set=\"train\"";
  EXPECT_EQ(series(text, "traincoord_run_steps" + l + ",state=\"planned\"}"),
            static_cast<double>(run_.cost_plan(e1).steps.size()));
  EXPECT_EQ(series(text, "traincoord_run_steps" + l + ",state=\"done\"}"), 0);
  EXPECT_EQ(series(text, "traincoord_run_step_batches" + l + ",state=\"in_flight\"}"), 1);
  EXPECT_EQ(series(text, "traincoord_run_step_planned_with_fitted" + l + "}"), 1);
  // (The dev epoch opened after train epoch 0 had fitted the model: planned with it too.)
  EXPECT_EQ(series(text, "traincoord_run_step_planned_with_fitted{run=\"costs\",set=\"dev\"}"), 1);
  EXPECT_NEAR(
      series(text, "traincoord_run_step_predicted_straggling" + l + "}"),
      predicted_figures(run_.cost_plan(e1), e1.plan_cost, run_.config().train_lengths).straggling,
      1e-9);
  EXPECT_EQ(series(text, "traincoord_run_cost_model_fitted{run=\"costs\"}"), 1);
  EXPECT_EQ(series(text, "traincoord_run_cost_model_reports{run=\"costs\"}"),
            static_cast<double>(run_.cost_model()->reports()));
  EXPECT_NEAR(series(text, "traincoord_run_rank_speed{run=\"costs\",rank=\"1\"}"), 2.0, 0.05);
  EXPECT_NEAR(series(text, "traincoord_run_rank_samples_per_second{run=\"costs\",rank=\"0\"}"),
              static_cast<double>(samples_[0]) / seconds_[0], 1e-6 * samples_[0] / seconds_[0]);
  // Capped ranks: the others are one rank="_other" series.
  const std::string capped = metrics_text(runs, 0, 1);
  EXPECT_TRUE(std::isnan(series(capped, "traincoord_run_rank_speed{run=\"costs\",rank=\"1\"}")));
  EXPECT_NEAR(series(capped, "traincoord_run_rank_speed{run=\"costs\",rank=\"_other\"}"), 2.0,
              0.05);
  // Workers are capped the same way (their jobs summed into worker="_other").
  ASSERT_EQ(run_.workers().size(), 2u);
  EXPECT_EQ(series(capped, "traincoord_worker_jobs_done_total{run=\"costs\",worker=\"" +
                               run_.workers()[0].name + "\"}"),
            static_cast<double>(run_.workers()[0].jobs_done));
  EXPECT_EQ(series(capped, "traincoord_worker_jobs_done_total{run=\"costs\",worker=\"_other\"}"),
            static_cast<double>(run_.workers()[1].jobs_done));
  EXPECT_GT(run_.workers()[1].jobs_done, 0u);

  // And `traincoord status` prints them on one line.
  std::ostringstream out;
  cli::print_run_status(status_json(run_), out);
  const std::string printed = out.str();
  const std::string expected = "steps: world size 2; train epoch 1 0/" +
                               std::to_string(run_.cost_plan(e1).steps.size()) +
                               " steps done, 1 batches in flight, 0 queued, planned with the "
                               "fitted cost (predicted straggling ";
  EXPECT_NE(printed.find(expected), std::string::npos) << printed;
  EXPECT_NE(printed.find(" samples/s\n"), std::string::npos) << printed;
}

TEST(StepFiguresJobMode, ARunThatHandsOutJobsHasNoStepFigures) {
  ManualClock clock;
  RunConfig c;
  c.name = "jobs";
  c.train_batches = 10;
  c.epochs = 1;
  c.validation_every = 0;
  traincoord::Run run(c, clock);
  const traincoord::Run* runs[] = {&run};
  EXPECT_EQ(metrics_text(runs, 0, 64).find("traincoord_run_steps"), std::string::npos);
  JsonWriter j;
  write_status(j, run, 0, 0, 0);
  rapidjson::Document d;
  d.Parse(j.str().c_str());
  EXPECT_FALSE(d.HasMember("steps"));
  std::ostringstream out;
  cli::print_run_status(j.str(), out);
  EXPECT_EQ(out.str().find("steps:"), std::string::npos);
}

}  // namespace
}  // namespace traincoord
