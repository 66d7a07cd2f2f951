// The traincoord binary's conventions, run as a user runs it: suggestions for misspelt
// subcommands and options, one table of exit codes (docs/CLI.md), an example in every
// subcommand's --help, `history` as CSV and JSON lines, and `inspect` showing dates.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <ctime>
#include <regex>
#include <sstream>
#include <string>

#include "server_process.h"
#include "traincoord/client.h"

namespace traincoord {
namespace {

using testing::run_command;
using testing::ServerProcess;
using testing::TempDir;

constexpr const char* kRun = R"(
name = "cli"
[data]
train_batches = 4
dev_batches = 2
order = "sequential"
[schedule]
epochs = 1
)";

// The binary run with `args` (a shell line), its stdout and stderr together, and its status.
std::pair<int, std::string> traincoord(const std::string& args) {
  int status = -1;
  const std::string out = run_command(std::string(TRAINCOORD_BIN) + " " + args + " 2>&1", &status);
  return {status, out};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Cli, AMisspeltSubcommandIsAUsageErrorThatSuggestsTheRightOne) {
  auto [status, out] = traincoord("lanch --workers 2 --config run.toml -- true");
  EXPECT_EQ(status, 2) << out;
  EXPECT_TRUE(contains(out, "unknown command 'lanch'; did you mean launch?")) << out;
  auto [far, far_out] = traincoord("frobnicate");
  EXPECT_EQ(far, 2) << far_out;
  EXPECT_TRUE(contains(far_out, "the commands are: simulate serve status runs history launch"))
      << far_out;
}

TEST(Cli, AMisspeltOptionIsAUsageErrorThatSuggestsTheRightOne) {
  auto [status, out] = traincoord("launch --worker 2 --config run.toml -- true");
  EXPECT_EQ(status, 2) << out;
  EXPECT_TRUE(contains(out, "launch: unknown option --worker; did you mean --workers?")) << out;
}

TEST(Cli, EveryArgumentErrorExitsTwo) {
  for (const std::string args : {"", "status --interval 0", "simulate", "simulate --config",
                                 "history", "history r --format xml", "serve --durability maybe",
                                 "launch --workers 0 --config x", "inspect --data-dir"}) {
    auto [status, out] = traincoord(args);
    EXPECT_EQ(status, 2) << "traincoord " << args << ": " << out;
    EXPECT_TRUE(contains(out, "traincoord: ")) << out;
  }
}

TEST(Cli, HelpOfEverySubcommandEndsWithAnExampleAndExitsZero) {
  for (const std::string sub :
       {"simulate", "serve", "status", "runs", "history", "launch", "inspect", "apply-config"}) {
    auto [status, out] = traincoord(sub + " --help");
    EXPECT_EQ(status, 0) << sub;
    const size_t at = out.find("Example");
    ASSERT_NE(at, std::string::npos) << sub << ": " << out;
    EXPECT_TRUE(contains(out.substr(at), "traincoord " + sub + " ")) << out;
  }
  auto [status, out] = traincoord("--help");
  EXPECT_EQ(status, 0);
  EXPECT_TRUE(contains(out, "Exit status: 0 ok, 1 failed")) << out;
}

TEST(Cli, ExitCodesOfTheTable) {
  auto [unreachable, out1] = traincoord("history cli --url http://127.0.0.1:1");
  EXPECT_EQ(unreachable, 1) << out1;
  TempDir dir;
  auto server = ServerProcess::start({"--config", dir.write("cli.toml", kRun), "--in-memory"});
  ASSERT_NE(server, nullptr);
  auto [missing, out3] = traincoord("history nope --url " + server->url());
  EXPECT_EQ(missing, 3) << out3;
  EXPECT_TRUE(contains(out3, "nope")) << out3;
}

// One worker trains until the run hands out nothing more; returns the jobs it completed.
int train_to_the_end(const std::string& url, const std::string& worker) {
  int done = 0;
  for (int i = 0; i < 100; ++i) {
    auto got = client::post(url, "/v1/runs/cli/acquire", R"({"worker": )" + worker + "}");
    if (!got) return -1;
    rapidjson::Document d;
    d.Parse(got->c_str());
    if (std::string(d["status"].GetString()) != "job") return done;
    const uint64_t lease = d["job"]["lease"].GetUint64();
    if (!client::post(url, "/v1/runs/cli/complete",
                      R"({"worker": )" + worker + R"(, "lease": )" + std::to_string(lease) +
                          R"(, "loss": 0.5, "samples": 1})")) {
      return -1;
    }
    done += 1;
  }
  return done;
}

// `traincoord apply-config` (issue 34: "train 10 more epochs" without a restart): a completed
// run raised from 1 to 3 epochs while its coordinator serves it trains the epochs added, each
// job once; the change outlives a kill -9 (its data dir holds the new config), and a change a
// started run cannot take is refused, naming the field, changing nothing.
TEST(Cli, ApplyConfigRaisesTheEpochsOfAServedRunAndTheChangeOutlivesAKill) {
  TempDir dir;
  const std::string file = dir.write("cli.toml", kRun);
  const std::vector<std::string> args = {"--config", file, "--data-dir", dir.path() + "/data"};
  auto server = ServerProcess::start(args);
  ASSERT_NE(server, nullptr);
  std::string url = server->url();
  ASSERT_TRUE(client::post(url, "/v1/runs/cli/workers", R"({"name": "a"})"));
  EXPECT_EQ(train_to_the_end(url, "0"), 6);  // epoch 0: 4 train and 2 dev jobs
  std::string more = kRun;
  more.replace(more.find("epochs = 1"), 10, "epochs = 3");
  dir.write("cli.toml", more);
  auto [dry, dry_out] = traincoord("apply-config " + file + " --url " + url + " --dry-run");
  EXPECT_EQ(dry, 0) << dry_out;
  EXPECT_TRUE(contains(dry_out, "run cli: would change schedule.epochs")) << dry_out;
  auto [applied, out] = traincoord("apply-config " + file + " --url " + url);
  EXPECT_EQ(applied, 0) << out;
  EXPECT_TRUE(contains(out, "applied the changed schedule.epochs to run cli")) << out;
  auto [again, again_out] = traincoord("apply-config " + file + " --url " + url);
  EXPECT_EQ(again, 0) << again_out;
  EXPECT_TRUE(contains(again_out, "nothing to change")) << again_out;
  std::string fixed = more;
  fixed.replace(fixed.find("train_batches = 4"), 17, "train_batches = 8");
  const std::string fixed_file = dir.write("fixed.toml", fixed);
  auto [refused, refused_out] = traincoord("apply-config " + fixed_file + " --url " + url);
  EXPECT_EQ(refused, 2) << refused_out;
  EXPECT_TRUE(contains(refused_out, "cannot change data.train_batches")) << refused_out;
  // One job of epoch 1, then the coordinator is killed and started again on the changed file
  // (no --apply-config-changes: it is the run's config now).
  auto held = client::post(url, "/v1/runs/cli/acquire", R"({"worker": 0})");
  ASSERT_TRUE(held);
  rapidjson::Document d;
  d.Parse(held->c_str());
  ASSERT_STREQ(d["status"].GetString(), "job") << *held;
  const std::string lease = std::to_string(d["job"]["lease"].GetUint64());
  server->kill(SIGKILL);
  server = ServerProcess::start(args);
  ASSERT_NE(server, nullptr);
  url = server->url();
  auto status = client::get(url, "/v1/runs/cli");
  ASSERT_TRUE(status);
  d.Parse(status->c_str());
  EXPECT_EQ(d["plan"]["target_epoch"].GetInt64(), 3) << *status;
  EXPECT_STREQ(d["state"].GetString(), "running") << *status;
  // Epochs 1 and 2, each job once (the lease held at the kill runs out, and its job is handed
  // out again: leases.timeout is the default 30 s, so it is released by hand here).
  ASSERT_TRUE(
      client::post(url, "/v1/runs/cli/release", R"({"worker": 0, "leases": [)" + lease + "]}"));
  EXPECT_EQ(train_to_the_end(url, "0"), 12);
  status = client::get(url, "/v1/runs/cli");
  ASSERT_TRUE(status);
  d.Parse(status->c_str());
  EXPECT_STREQ(d["state"].GetString(), "completed") << *status;
}

// Four train jobs with losses 1..4 and an accuracy each: the CSV has their epoch and each job.
TEST(Cli, HistoryPrintsCsvAndJsonLines) {
  TempDir dir;
  auto server = ServerProcess::start({"--config", dir.write("cli.toml", kRun), "--in-memory"});
  ASSERT_NE(server, nullptr);
  const std::string url = server->url();
  ASSERT_TRUE(client::post(url, "/v1/runs/cli/workers", R"({"name": "a"})"));
  for (int lease = 1; lease <= 4; ++lease) {
    ASSERT_TRUE(client::post(url, "/v1/runs/cli/acquire", R"({"worker": 0})"));
    ASSERT_TRUE(client::post(url, "/v1/runs/cli/complete",
                             R"({"worker": 0, "lease": )" + std::to_string(lease) +
                                 R"(, "loss": )" + std::to_string(lease) +
                                 R"(, "samples": 1, "metrics": {"accuracy": 0.75}})"));
  }
  int status = -1;
  const std::string csv =
      run_command(std::string(TRAINCOORD_BIN) + " history cli --url " + url, &status);
  EXPECT_EQ(status, 0);
  std::istringstream lines(csv);
  std::vector<std::string> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), 1u + 2u + 4u) << csv;
  EXPECT_EQ(
      rows[0],
      "kind,set,epoch,job,closed,loss,done,jobs,ago_ms,worker,time,time_ms,samples,duration_s,"
      "metric.accuracy\r");
  EXPECT_TRUE(rows[1].starts_with("epoch,train,0,,true,2.5,4,4,")) << rows[1];
  // Its 4 samples, and how long it was open.
  EXPECT_TRUE(std::regex_search(rows[1], std::regex(R"(,4,\d+(\.\d+)?(e-?\d+)?,0\.75\r$)")))
      << rows[1];
  EXPECT_TRUE(rows[2].starts_with("epoch,dev,0,,false,,0,2,,")) << rows[2];
  EXPECT_TRUE(rows[6].starts_with("job,train,0,3,,4,,,")) << rows[6];
  // Each job row names its worker and its date: ISO 8601 UTC, and ms since the Unix epoch,
  // within the minutes this test ran.
  std::smatch m;
  ASSERT_TRUE(std::regex_match(
      rows[6], m,
      std::regex(
          R"(job,train,0,3,,4,,,\d+,a,(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z),(\d+),,,\r)")))
      << rows[6];
  const int64_t unix_ms = std::stoll(m[2]);
  const int64_t now_ms = static_cast<int64_t>(std::time(nullptr)) * 1000;
  EXPECT_LE(unix_ms, now_ms + 2'000) << rows[6];
  EXPECT_GE(unix_ms, now_ms - 600'000) << rows[6];
  const std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char iso[32];
  std::strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%S", &utc);
  EXPECT_EQ(m[1].str().substr(0, 19), iso) << "time and time_ms say the same instant";

  const std::string jsonl = run_command(
      std::string(TRAINCOORD_BIN) + " history cli --format jsonl --url " + url, &status);
  EXPECT_EQ(status, 0);
  std::istringstream jl(jsonl);
  int n = 0;
  for (std::string line; std::getline(jl, line); ++n) {
    rapidjson::Document d;
    d.Parse(line.c_str());
    ASSERT_FALSE(d.HasParseError()) << line;
    EXPECT_STREQ(d["kind"].GetString(), n < 2 ? "epoch" : "job") << line;
    if (n == 0) {
      EXPECT_DOUBLE_EQ(d["metrics"]["accuracy"].GetDouble(), 0.75);
      EXPECT_EQ(d["samples"].GetUint64(), 4u) << line;
      EXPECT_TRUE(d["duration_s"].IsNumber() && d["duration_s"].GetDouble() >= 0) << line;
    }
    if (n == 1) {
      EXPECT_TRUE(d["duration_s"].IsNull()) << "dev 0 is open: " << line;
    }
    if (n >= 2) {
      EXPECT_STREQ(d["worker"].GetString(), "a") << line;
      EXPECT_TRUE(d["time"].IsString() && d["time_ms"].IsInt64()) << line;
    }
  }
  EXPECT_EQ(n, 6);
}

// A stopped run read from its data dir: workers and events carry dates, not "s ago".
TEST(Cli, InspectShowsDatesForAStoppedRun) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  {
    auto server =
        ServerProcess::start({"--config", dir.write("cli.toml", kRun), "--data-dir", data});
    ASSERT_NE(server, nullptr);
    ASSERT_TRUE(client::post(server->url(), "/v1/runs/cli/workers", R"({"name": "w-a"})"));
    ASSERT_TRUE(client::post(server->url(), "/v1/runs/cli/acquire", R"({"worker": 0})"));
  }
  const std::time_t now = std::time(nullptr);
  auto [status, out] = traincoord("inspect --data-dir " + data);
  EXPECT_EQ(status, 0) << out;
  EXPECT_FALSE(contains(out, "s ago")) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex(R"(w-a +\d+ +\d+ +(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d))")))
      << out;
  std::tm seen{};
  seen.tm_year = std::stoi(m[1]) - 1900;
  seen.tm_mon = std::stoi(m[2]) - 1;
  seen.tm_mday = std::stoi(m[3]);
  seen.tm_hour = std::stoi(m[4]);
  seen.tm_min = std::stoi(m[5]);
  seen.tm_sec = std::stoi(m[6]);
  seen.tm_isdst = -1;
  const double age = std::difftime(now, std::mktime(&seen));
  EXPECT_GE(age, -2) << out;
  EXPECT_LT(age, 120) << "the worker was seen within the test: " << out;
  EXPECT_TRUE(contains(out, "the data dir was last written")) << out;
  auto [missing, out2] = traincoord("inspect --data-dir " + data + " nope");
  EXPECT_EQ(missing, 3) << out2;
}

}  // namespace
}  // namespace traincoord
