// What `traincoord status` prints of a run's status reply: the group, the latest checkpoint cut
// and the counters of cuts; and a reply that lacks fields (or holds others) prints "-" for
// them instead of crashing.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "cli/commands.h"

namespace traincoord::cli {
namespace {

std::string rendered(const std::string& json, std::optional<int64_t> wall_now_ms = std::nullopt) {
  std::ostringstream out;
  print_run_status(json, out, wall_now_ms);
  return out.str();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const std::string kStatus = R"({
  "run": "r", "state": "running", "reason": "",
  "plan": {"start_epoch": 0, "target_epoch": 3, "train_jobs_per_epoch": 4,
           "dev_jobs_per_epoch": 1, "batches_per_job": 3},
  "progress": {"jobs_planned": 15, "jobs_done": 6, "jobs_per_s": 1.5, "eta_s": 6.0},
  "current": {"set": "train", "epoch": 1, "jobs": 4, "done": 1, "failed": 0, "running": 2},
  "epochs": [{"set": "train", "epoch": 0, "closed": true, "loss": 0.5},
             {"set": "train", "epoch": 1, "closed": false, "loss": null}],
  "early_stop": {"rule": "none", "monitor": "dev_loss", "best_epoch": null, "stopped": false},
  "workers": [{"id": 0, "name": "w", "active": true, "jobs_done": 6, "leases": [9],
               "last_seen_ago_ms": 1200}],
  "counters": {"cuts": 3, "restores": 1, "jobs_withdrawn": 4, "leases_voided": 2},
  "generation": 2, "group": "job/1",
  "cuts": {"count": 2, "keep": 5,
           "latest": {"id": 3, "group": "job/1", "seq": 1, "generation": 2, "complete": true,
                      "world_size": 2, "ranks": [0, 1], "created_ago_ms": 95000,
                      "completed_ago_ms": 90000, "state": "running", "epoch": 1,
                      "set": "train", "jobs_done": 5, "partial_jobs": 2,
                      "partial_batches": 3}},
  "events": [{"seq": 1, "ago_ms": 95000, "kind": "cut_taken", "text": "cut 3 of group job/1"}]
})";

TEST(Status, ShowsTheGroupTheLatestCutAndTheCountersOfCuts) {
  const std::string out = rendered(kStatus);
  EXPECT_TRUE(contains(out, "group job/1, generation 2\n")) << out;
  EXPECT_TRUE(contains(out,
                       "cuts: 2 kept (keeps the last 5); latest: cut 3, train epoch 1, 5 jobs "
                       "done, 2 partly trained (3 batches), 0:01:30 ago\n"))
      << out;
  EXPECT_TRUE(contains(out, "cuts taken 3, restores 1, jobs withdrawn 4, leases voided 2\n"))
      << out;
  EXPECT_TRUE(contains(out, "train epoch 1")) << out;
  EXPECT_TRUE(contains(out, "1.2 s ago")) << out;
  EXPECT_TRUE(contains(out, "cut_taken: cut 3 of group job/1")) << out;
}

TEST(Status, ARunWithoutCutsOrGroupSaysSo) {
  std::string json = kStatus;
  json.replace(json.find(R"("generation": 2, "group": "job/1")"),
               std::string(R"("generation": 2, "group": "job/1")").size(),
               R"("generation": 0, "group": null)");
  const auto latest = json.find(R"("latest": {)");
  json.replace(latest, json.find("}},", latest) + 1 - latest, R"("latest": null)");
  const std::string out = rendered(json);
  EXPECT_TRUE(contains(out, "group none, generation 0\n")) << out;
  EXPECT_TRUE(contains(out, "latest: none\n")) << out;
}

// Read from a data dir (inspect): the cut's time is a local date, not "ago".
TEST(Status, ACutsTimeIsADateWhenReadFromADataDir) {
  const std::string out = rendered(kStatus, int64_t{1'700'000'000'000});
  EXPECT_FALSE(contains(out, " ago")) << out;
  EXPECT_TRUE(contains(out, "(3 batches), 20")) << out;  // 2023-11-...
}

TEST(Status, AReplyWithoutTheNewFieldsShowsThemAbsent) {
  // A coordinator from before cuts: no generation, group, cuts or their counters.
  std::string json = kStatus;
  json.replace(json.find(R"(  "counters")"),
               json.find(R"(  "events")") - json.find(R"(  "counters")"), "");
  const std::string out = rendered(json);
  EXPECT_TRUE(contains(out, "group none, generation -\n")) << out;
  EXPECT_TRUE(contains(out, "cuts: - kept (keeps the last -); latest: none\n")) << out;
  EXPECT_TRUE(contains(out, "cuts taken -, restores -, jobs withdrawn -, leases voided -\n"))
      << out;
}

TEST(Status, AReplyWithMissingOrOddFieldsNeverCrashes) {
  for (const std::string json :
       {"{}", "[]", "null", "not json", R"({"run": 7, "plan": [], "progress": "x"})",
        R"({"current": {"set": 1}, "epochs": [1, {"epoch": "a"}, {"epoch": 2}],
            "workers": [null, {"leases": 3}], "events": [{}, 4],
            "cuts": {"latest": {"epoch": "x", "completed_ago_ms": "y"}},
            "early_stop": {"best_epoch": 3, "stopped": true}})",
        R"({"cuts": {"count": -1, "latest": []}, "counters": [], "group": 5,
            "generation": 1.5})"}) {
    const std::string out = rendered(json);
    EXPECT_FALSE(out.empty()) << json;
  }
  const std::string partial = rendered(R"({"run": "r", "state": "running",
      "cuts": {"latest": {"id": 4, "complete": true}}})");
  EXPECT_TRUE(contains(partial, "latest: cut 4, - jobs done, - partly trained (- batches), -\n"))
      << partial;
}

// The status lists the latest epochs of a long run: the table says the others exist.
TEST(Status, ALongRunsTableSaysItShowsTheLatestEpochs) {
  EXPECT_FALSE(contains(rendered(kStatus), "epochs opened"));
  const std::string out = rendered(R"({"run": "r", "epochs_total": 20000, "epochs_from": 19998,
      "epochs": [{"set": "train", "epoch": 9999, "closed": true, "loss": 0.5},
                 {"set": "dev", "epoch": 9999, "closed": false, "loss": null}]})");
  EXPECT_TRUE(contains(out, " 9999      0.5000   running\n")) << out;
  EXPECT_TRUE(contains(out,
                       "(the latest of 20000 epochs opened; `traincoord history r` lists "
                       "them all)\n"))
      << out;
}

// Leadership per run (docs/HA.md): a coordinator's line says which runs it leads and who leads
// the others; a reply without `runs` (a single coordinator) adds nothing.
TEST(CoordinatorLine, SaysWhichRunsItLeadsAndWhoLeadsTheOthers) {
  const std::string json = R"({"mode": "ha", "url": "http://a:1", "role": "leader",
    "leader": {"url": "http://a:1", "term": 12}, "journal": null, "takeovers": 1,
    "runs": [{"run": "x", "role": "leader", "leader": "http://a:1", "term": 12, "head_seq": 40},
             {"run": "y", "role": "standby", "leader": "http://b:2", "term": 9, "head_seq": 7},
             {"run": "z", "role": "standby", "leader": null, "term": null, "head_seq": 0}]})";
  const std::string line = coordinator_line("http://a:1", json);
  EXPECT_TRUE(contains(line, "http://a:1  leader  term 12")) << line;
  EXPECT_TRUE(contains(line,
                       "\n    runs: x led here (term 12, head 40); y led by http://b:2 "
                       "(term 9, head 7); z no leader known (term -, head 0)\n"))
      << line;
  const std::string single = coordinator_line(
      "http://a:1", R"({"mode": "single", "role": "leader", "leader": null, "takeovers": 0})");
  EXPECT_FALSE(contains(single, "runs:")) << single;
}

}  // namespace
}  // namespace traincoord::cli
