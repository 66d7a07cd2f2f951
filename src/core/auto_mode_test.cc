// schedule.mode = "auto" (the default; docs/SEMANTICS.md, "Which mode a run takes"): a run whose
// config allows steps hands them to a synchronous group and jobs to independent workers, as the
// first worker to ask for work is one or the other; a config that cannot step hands out jobs;
// the choice is said as an event and kept by a snapshot.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/run.h"
#include "core/run_codec.h"

namespace traincoord {
namespace {

// 2 epochs of 23 train samples in batches of 2 (12 batches), a dev set of 5 samples: a config
// that allows steps, with schedule.mode left to its default.
RunConfig auto_config() {
  RunConfig c;
  c.name = "auto";
  c.batch_size = 2;
  c.train_samples = 23;
  c.train_batches = 12;
  c.dev_samples = 5;
  c.dev_batches = 3;
  c.epochs = 2;
  c.validation_every = 1;
  c.seed = 7;
  return c;
}

std::vector<const Event*> mode_events(const traincoord::Run& run) {
  std::vector<const Event*> out;
  for (const Event& e : run.events()) {
    if (e.kind == EventKind::kModeChosen) out.push_back(&e);
  }
  return out;
}

std::vector<WorkerId> join_ranks(traincoord::Run& run, const std::string& group, uint32_t w) {
  std::vector<WorkerId> ids;
  EXPECT_TRUE(run.join_group(group));
  for (uint32_t r = 0; r < w; ++r) {
    ids.push_back(run.join(group + "-rank" + std::to_string(r), group, GroupRank{r, w}));
  }
  return ids;
}

TEST(AutoMode, IsTheDefaultAndLeavesTheChoiceToTheFirstAcquire) {
  EXPECT_EQ(RunConfig{}.mode, ScheduleMode::kAuto);
  EXPECT_EQ(initial_mode(auto_config()), ScheduleMode::kAuto);
  ManualClock clock;
  traincoord::Run run(auto_config(), clock);
  EXPECT_EQ(run.mode(), ScheduleMode::kAuto);
  // Registering (a rank or not) chooses nothing: the Python Run() registers before Phases
  // knows its rank.
  const WorkerId plain = run.join("plain");
  const std::vector<WorkerId> ranks = join_ranks(run, "g", 2);
  EXPECT_EQ(run.mode(), ScheduleMode::kAuto);
  EXPECT_TRUE(mode_events(run).empty());
  EXPECT_EQ(run.workers()[plain].rank, std::nullopt);
  EXPECT_EQ(ranks.size(), 2u);
}

TEST(AutoMode, AGroupAskingFirstGetsStepsEverySampleOnceAndNoJoinIsNeeded) {
  ManualClock clock;
  traincoord::Run run(auto_config(), clock);
  const std::vector<WorkerId> ranks = join_ranks(run, "g", 3);
  std::map<std::pair<SetKind, int64_t>, std::map<uint64_t, int>> trained;
  std::map<std::pair<SetKind, int64_t>, uint64_t> steps_of_rank[3];
  for (int round = 0; round < 100 && !run.finished(); ++round) {
    for (uint32_t r = 0; r < 3; ++r) {
      auto a = run.acquire(ranks[r]);
      ASSERT_TRUE(a) << a.error().message;
      if (a->status != AcquireStatus::kJob) continue;
      ASSERT_TRUE(a->job.step_mode);
      EXPECT_EQ(a->job.rank, r);
      steps_of_rank[r][{a->job.set, a->job.epoch}] += 1;
      for (uint64_t s : a->job.samples) trained[{a->job.set, a->job.epoch}][s] += 1;
      ASSERT_TRUE(
          run.complete(ranks[r], a->job.lease, Completion{1.0, a->job.samples.size(), {}, 0}));
    }
  }
  EXPECT_EQ(run.mode(), ScheduleMode::kSteps);
  EXPECT_EQ(run.state(), RunState::kCompleted);
  ASSERT_EQ(mode_events(run).size(), 1u);
  EXPECT_NE(mode_events(run)[0]->text.find("hands out steps"), std::string::npos);
  EXPECT_NE(mode_events(run)[0]->text.find("rank 0 of 3 of group g"), std::string::npos);
  ASSERT_EQ(trained.size(), 4u);  // train and dev of 2 epochs
  for (const auto& [key, counts] : trained) {
    EXPECT_EQ(counts.size(), key.first == SetKind::kTrain ? 23u : 5u);
    for (const auto& [sample, times] : counts) EXPECT_EQ(times, 1) << "sample " << sample;
    // Every rank the same steps: nobody waits on a collective that never comes.
    EXPECT_EQ(steps_of_rank[0][key], steps_of_rank[1][key]);
    EXPECT_EQ(steps_of_rank[0][key], steps_of_rank[2][key]);
  }
  // From now on it is a step-mode run: a worker that is not a rank is refused, naming why.
  const WorkerId outsider = run.join("outsider");
  auto a = run.acquire(outsider);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().reason, error_reason::kRankRequired);
  EXPECT_NE(a.error().message.find("schedule.mode = \"auto\""), std::string::npos);
}

TEST(AutoMode, AnIndependentWorkerAskingFirstGetsJobsAndSoDoRanksAfterIt) {
  ManualClock clock;
  traincoord::Run run(auto_config(), clock);
  const WorkerId plain = run.join("plain");
  auto first = run.acquire(plain);
  ASSERT_TRUE(first && first->status == AcquireStatus::kJob);
  EXPECT_FALSE(first->job.step_mode);
  EXPECT_EQ(run.mode(), ScheduleMode::kJobs);
  ASSERT_EQ(mode_events(run).size(), 1u);
  EXPECT_NE(mode_events(run)[0]->text.find("hands out jobs"), std::string::npos);
  const std::vector<WorkerId> ranks = join_ranks(run, "g", 2);
  auto ranked = run.acquire(ranks[1]);
  ASSERT_TRUE(ranked && ranked->status == AcquireStatus::kJob);
  EXPECT_FALSE(ranked->job.step_mode);     // a job, as in job mode
  EXPECT_EQ(mode_events(run).size(), 1u);  // chosen once
}

TEST(AutoMode, AConfigThatCannotStepHandsOutJobsFromTheStart) {
  // Sizes in batches only (the original coordinator's config), several batches per job,
  // seed_compat, overlap, a start step: none can step.
  std::vector<RunConfig> configs;
  RunConfig batches_only;
  batches_only.name = "b";
  batches_only.train_batches = 12;
  batches_only.validation_every = 0;
  configs.push_back(batches_only);
  RunConfig per_job = auto_config();
  per_job.iters_per_worker = 4;
  configs.push_back(per_job);
  RunConfig compat = auto_config();
  compat.seed_compat = true;
  configs.push_back(compat);
  RunConfig overlap = auto_config();
  overlap.overlap_epochs = true;
  configs.push_back(overlap);
  for (const RunConfig& c : configs) {
    ASSERT_TRUE(validate(c)) << validate(c).error().message;
    EXPECT_EQ(initial_mode(c), ScheduleMode::kJobs);
    ManualClock clock;
    traincoord::Run run(c, clock);
    EXPECT_EQ(run.mode(), ScheduleMode::kJobs);
    const std::vector<WorkerId> ranks = join_ranks(run, "g", 2);
    auto a = run.acquire(ranks[0]);
    ASSERT_TRUE(a && a->status == AcquireStatus::kJob);
    EXPECT_FALSE(a->job.step_mode);
    EXPECT_TRUE(mode_events(run).empty());  // nothing was left to choose
  }
  // The modes given are kept; a batch budget is steps.
  RunConfig jobs = auto_config();
  jobs.mode = ScheduleMode::kJobs;
  EXPECT_EQ(initial_mode(jobs), ScheduleMode::kJobs);
  RunConfig steps = auto_config();
  steps.mode = ScheduleMode::kSteps;
  EXPECT_EQ(initial_mode(steps), ScheduleMode::kSteps);
  RunConfig budget = auto_config();
  budget.batch_size = 0;
  budget.batch_budget = 8;
  budget.train_batches = 23;  // a cost-balanced set counts samples
  budget.dev_batches = 5;
  budget.train_lengths.assign(23, 1.0);
  budget.dev_lengths.assign(5, 1.0);
  ASSERT_TRUE(validate(budget)) << validate(budget).error().message;
  EXPECT_TRUE(budget.cost_balanced());
  EXPECT_EQ(initial_mode(budget), ScheduleMode::kSteps);
  // With jobs asked for, a budget is refused, naming it.
  budget.mode = ScheduleMode::kJobs;
  ASSERT_FALSE(validate(budget));
  EXPECT_EQ(validate(budget).error().field, "schedule.batch_budget");
}

TEST(AutoMode, ASnapshotKeepsTheChoiceAndOneThatContradictsTheConfigIsRefused) {
  ManualClock clock;
  traincoord::Run pending(auto_config(), clock);
  auto reloaded = RunCodec::load(auto_config(), RunCodec::save(pending), clock);
  ASSERT_TRUE(reloaded) << reloaded.error().message;
  EXPECT_EQ((*reloaded)->mode(), ScheduleMode::kAuto);

  traincoord::Run stepping(auto_config(), clock);
  const std::vector<WorkerId> ranks = join_ranks(stepping, "g", 2);
  ASSERT_TRUE(stepping.acquire(ranks[0]));
  ASSERT_EQ(stepping.mode(), ScheduleMode::kSteps);
  const std::string bytes = RunCodec::save(stepping);
  auto back = RunCodec::load(auto_config(), bytes, clock);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ((*back)->mode(), ScheduleMode::kSteps);
  EXPECT_EQ(RunCodec::save(**back), bytes);
  // The same state under a config that says jobs: refused, not handed out as jobs.
  RunConfig jobs = auto_config();
  jobs.mode = ScheduleMode::kJobs;
  auto wrong = RunCodec::load(jobs, bytes, clock);
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.error().message.find("mode"), std::string::npos);
}

}  // namespace
}  // namespace traincoord
