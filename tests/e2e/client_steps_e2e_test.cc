// Step mode (docs/SEMANTICS.md, "Step mode") with the C++ client against the real binary: three
// example workers, the ranks of one group, train a step-mode run to its end, each handed only
// its own batches; every sample of every epoch is reported exactly once and every rank trains
// the same number of batches per epoch. A worker without a rank is refused its jobs
// (rank_required), a rank giving another world size than its group's (world_size_mismatch).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "server_process.h"
#include "traincoord/client.h"

#ifndef EXAMPLE_WORKER_BIN
#define EXAMPLE_WORKER_BIN "example_worker"
#endif

namespace traincoord {
namespace {

using testing::ServerProcess;
using testing::TempDir;

// 23 train samples and 5 dev samples in batches of 2, for 3 ranks: a train epoch is 3 steps of
// 2 samples per rank and a last step of 2, 2 and 1 (4 batches per rank); a dev epoch is one
// step of 2, 2 and 1.
constexpr const char* kRun = R"(
name = "steps"
[data]
train_samples = 23
dev_samples = 5
batch_size = 2
order = "shuffled"
seed = 3
[schedule]
epochs = 2
validation_every = 1
mode = "steps"
[leases]
timeout = 10
)";
constexpr uint64_t kTrainSamples = 23;
constexpr uint64_t kDevSamples = 5;
constexpr uint32_t kRanks = 3;

// Child processes started by a test, each with its stdout and stderr in a file, killed (by their
// pids) and reaped when the test ends, also when it fails.
class Processes {
 public:
  explicit Processes(std::string dir) : dir_(std::move(dir)) {}
  ~Processes() {
    for (pid_t& pid : pids_) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  }

  // Starts `argv` with `env` added to the environment; returns its number.
  size_t start(std::vector<std::string> argv, const std::vector<std::string>& env = {}) {
    const size_t i = pids_.size();
    const std::string out = path(i, "out"), err = path(i, "err");
    const pid_t pid = fork();
    if (pid == 0) {
      const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(o, 1);
      dup2(e, 2);
      for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    pids_.push_back(pid);
    statuses_.push_back(-1);
    return i;
  }

  // Waits until every process has exited, for at most `limit`; returns false (killing the rest)
  // when some did not. Once one exits other than 0, the rest are killed at once (ranks left
  // without it would wait for its batches until the limit).
  bool wait_all(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (bool running = true; running;) {
      running = false;
      bool failed = false;
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (pids_[i] <= 0) continue;
        int status = 0;
        if (waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
          statuses_[i] = status;
          pids_[i] = -1;
          failed = failed || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        } else {
          running = true;
        }
      }
      if (running && (failed || std::chrono::steady_clock::now() > deadline)) {
        for (pid_t& pid : pids_) {
          if (pid <= 0) continue;
          kill(pid, SIGKILL);
          waitpid(pid, nullptr, 0);
          pid = -1;
        }
        return false;
      }
      if (running) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
  }

  // The exit code of process `i` (-1: did not exit on its own).
  int exit_code(size_t i) const {
    return statuses_[i] >= 0 && WIFEXITED(statuses_[i]) ? WEXITSTATUS(statuses_[i]) : -1;
  }
  std::string out(size_t i) const { return read(path(i, "out")); }
  std::string err(size_t i) const { return read(path(i, "err")); }

 private:
  std::string path(size_t i, const char* what) const {
    return dir_ + "/proc" + std::to_string(i) + "." + what;
  }
  static std::string read(const std::string& file) {
    std::ifstream in(file);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string dir_;
  std::vector<pid_t> pids_;
  std::vector<int> statuses_;
};

// One batch a rank reported: a line "accepted SET EPOCH INDEX rank=R step=S/N samples=C:A,B".
struct Reported {
  std::string set;
  int64_t epoch = 0;
  uint32_t rank = 0;
  uint64_t step = 0;
  uint64_t steps = 0;
  std::vector<uint64_t> samples;
};

// The batches reported in `out`; a line that does not parse is a test failure.
std::vector<Reported> reported(const std::string& out) {
  std::vector<Reported> batches;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("accepted ", 0) != 0) continue;
    Reported b;
    std::string word, index, rank, step, samples;
    std::istringstream in(line);
    in >> word >> b.set >> b.epoch >> index >> rank >> step >> samples;
    const auto slash = step.find('/');
    const auto colon = samples.find(':');
    if (!in || rank.rfind("rank=", 0) != 0 || step.rfind("step=", 0) != 0 ||
        slash == std::string::npos || samples.rfind("samples=", 0) != 0 ||
        colon == std::string::npos) {
      ADD_FAILURE() << "not a step-mode line: " << line;
      continue;
    }
    b.rank = static_cast<uint32_t>(std::stoul(rank.substr(5)));
    b.step = std::stoull(step.substr(5, slash - 5));
    b.steps = std::stoull(step.substr(slash + 1));
    const uint64_t count = std::stoull(samples.substr(8, colon - 8));
    std::istringstream list(samples.substr(colon + 1));
    for (std::string s; std::getline(list, s, ',');) b.samples.push_back(std::stoull(s));
    EXPECT_EQ(b.samples.size(), count) << line;
    batches.push_back(std::move(b));
  }
  return batches;
}

// Checks what the ranks printed (outputs[r]: rank r's): every sample of each of the run's
// epochs (2 train, 2 dev) reported exactly once, each rank handed only its own batches, and
// every rank the same number of batches (one per step) in each epoch.
void expect_every_sample_once(const std::vector<std::string>& outputs) {
  ASSERT_EQ(outputs.size(), kRanks);
  // (set, epoch) -> each sample's count; (set, epoch, rank) -> its batches and their steps.
  std::map<std::pair<std::string, int64_t>, std::map<uint64_t, int>> samples;
  std::map<std::tuple<std::string, int64_t, uint32_t>, std::set<uint64_t>> steps_of_rank;
  std::map<std::pair<std::string, int64_t>, std::set<uint64_t>> steps_of_epoch;
  for (uint32_t r = 0; r < kRanks; ++r) {
    for (const Reported& b : reported(outputs[r])) {
      EXPECT_EQ(b.rank, r) << "rank " << r << " was handed a batch of rank " << b.rank;
      EXPECT_LT(b.step, b.steps);
      for (uint64_t s : b.samples) ++samples[{b.set, b.epoch}][s];
      EXPECT_TRUE(steps_of_rank[std::make_tuple(b.set, b.epoch, r)].insert(b.step).second)
          << "rank " << r << " reported step " << b.step << " of " << b.set << " " << b.epoch
          << " twice";
      steps_of_epoch[{b.set, b.epoch}].insert(b.steps);
    }
  }
  size_t train_epochs = 0, dev_epochs = 0;
  for (const auto& [epoch, counts] : samples) {
    const uint64_t n = epoch.first == "train" ? kTrainSamples : kDevSamples;
    (epoch.first == "train" ? train_epochs : dev_epochs)++;
    uint64_t total = 0;
    for (const auto& [sample, count] : counts) {
      EXPECT_LT(sample, n) << epoch.first << " " << epoch.second;
      EXPECT_EQ(count, 1) << "sample " << sample << " of " << epoch.first << " epoch "
                          << epoch.second << " reported " << count << " times";
      total += static_cast<uint64_t>(count);
    }
    EXPECT_EQ(total, n) << epoch.first << " epoch " << epoch.second;
    EXPECT_EQ(counts.size(), n) << epoch.first << " epoch " << epoch.second;
    // Every rank the same number of batches: all the epoch's steps, one batch each.
    ASSERT_EQ(steps_of_epoch[epoch].size(), 1u) << "the ranks disagree on the steps";
    const uint64_t steps = *steps_of_epoch[epoch].begin();
    EXPECT_EQ(steps, epoch.first == "train" ? 4u : 1u);
    for (uint32_t r = 0; r < kRanks; ++r) {
      EXPECT_EQ(steps_of_rank[std::make_tuple(epoch.first, epoch.second, r)].size(), steps)
          << "rank " << r << " in " << epoch.first << " epoch " << epoch.second;
    }
  }
  EXPECT_EQ(train_epochs, 2u);
  EXPECT_EQ(dev_epochs, 2u);
}

class ClientSteps : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string config = dir_.write("steps.toml", kRun);
    server_ = ServerProcess::start({"--config", config, "--in-memory"});
    ASSERT_NE(server_, nullptr);
  }

  client::Options options(const std::string& name) const {
    client::Options o;
    o.url = server_->url();
    o.run = "steps";
    o.worker_name = name;
    o.long_poll = std::chrono::milliseconds(2000);
    o.give_up_after = std::chrono::milliseconds(20000);
    return o;
  }

  std::vector<std::string> worker_argv(const std::string& name) const {
    return {EXAMPLE_WORKER_BIN, "--url", server_->url(),    "--run", "steps", "--name", name,
            "--job-ms",         "1",     "--give-up-after", "20"};
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

// The acceptance test of step mode with the C++ client: three ranks of one group, one given its
// rank on the command line, one in the environment as `traincoord launch` sets it, one with a
// JobStream fetching ahead.
TEST_F(ClientSteps, ThreeRanksTrainEverySampleOfEachEpochExactlyOnce) {
  Processes ranks(dir_.path());
  auto argv = worker_argv("rank0");
  for (const char* a : {"--group", "g1", "--rank", "0", "--world-size", "3"}) argv.push_back(a);
  ranks.start(argv);
  ranks.start(worker_argv("rank1"), {"TRAINCOORD_GROUP=g1", "RANK=1", "WORLD_SIZE=3"});
  argv = worker_argv("rank2");
  for (const char* a : {"--group", "g1", "--rank", "2", "--world-size", "3", "--prefetch", "2"})
    argv.push_back(a);
  ranks.start(argv);
  ASSERT_TRUE(ranks.wait_all(std::chrono::seconds(90)))
      << "the ranks did not finish, or one failed:\n"
      << ranks.err(0) << ranks.err(1) << ranks.err(2);

  for (uint32_t r = 0; r < kRanks; ++r) {
    ASSERT_EQ(ranks.exit_code(r), 0) << "rank " << r << ": " << ranks.err(r) << ranks.out(r);
    EXPECT_NE(ranks.out(r).find("finished: completed"), std::string::npos) << ranks.out(r);
  }
  expect_every_sample_once({ranks.out(0), ranks.out(1), ranks.out(2)});
}

TEST_F(ClientSteps, AWorkerWithoutARankIsRefusedItsJobs) {
  // It may register; its acquires are refused with rank_required, a 409 it can decide on.
  auto w = client::Worker::connect(options("no-rank"));
  ASSERT_TRUE(w) << w.error().message;
  auto job = (*w)->next();
  ASSERT_FALSE(job);
  EXPECT_EQ(job.error().code, client::codes::kRankRequired) << job.error().message;
  EXPECT_EQ(job.error().http_status, 409);
  auto jobs = (*w)->next_jobs(2);
  ASSERT_FALSE(jobs);
  EXPECT_EQ(jobs.error().code, client::codes::kRankRequired);
  // The example worker says so, with the code, and exits 1.
  Processes worker(dir_.path());
  worker.start(worker_argv("no-rank-example"));
  ASSERT_TRUE(worker.wait_all(std::chrono::seconds(60)));
  EXPECT_EQ(worker.exit_code(0), 1) << worker.err(0);
  EXPECT_NE(worker.err(0).find("(rank_required)"), std::string::npos) << worker.err(0);
}

TEST_F(ClientSteps, ARankGivingAnotherWorldSizeThanItsGroupIsRefused) {
  auto o = options("r0");
  o.group = "g1";
  o.rank = 0;
  o.world_size = 3;
  auto r0 = client::Worker::connect(o);
  ASSERT_TRUE(r0) << r0.error().message;
  o.worker_name = "r1";
  o.rank = 1;
  o.world_size = 2;
  auto r1 = client::Worker::connect(o);
  ASSERT_FALSE(r1);
  EXPECT_EQ(r1.error().code, client::codes::kWorldSizeMismatch) << r1.error().message;
  EXPECT_EQ(r1.error().http_status, 409);
  // With the group's world size it registers and gets its own rank's batches.
  o.world_size = 3;
  auto r1_again = client::Worker::connect(o);
  ASSERT_TRUE(r1_again) << r1_again.error().message;
  auto job = (*r1_again)->next();
  ASSERT_TRUE(job && *job) << (job ? "finished" : job.error().message);
  EXPECT_TRUE((*job)->step_mode());
  EXPECT_EQ((*job)->rank, 1u);
  EXPECT_EQ((*job)->steps, 4u);
  EXPECT_EQ((*job)->samples.size(), 2u);
  EXPECT_GT((*job)->loss_scale, 0.0);
}

// What the client checks itself, before any request: a rank and a world size go together.
TEST_F(ClientSteps, ARankWithoutAWorldSizeIsRefusedBeforeAnyRequest) {
  auto o = options("half");
  o.rank = 0;
  auto w = client::Worker::connect(o);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, "invalid_argument");
  EXPECT_EQ(w.error().field, "world_size");
  o.rank = 3;
  o.world_size = 3;
  w = client::Worker::connect(o);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().field, "rank");
}

// `traincoord launch` starts the three ranks with TRAINCOORD_GROUP, RANK and WORLD_SIZE set; the
// example worker takes them from there.
TEST(ClientStepsLaunch, TheExampleWorkerTrainsAStepModeRunUnderLaunch) {
  TempDir dir;
  const std::string config = dir.write("steps.toml", kRun);
  Processes launch(dir.path());
  launch.start({TRAINCOORD_BIN, "launch", "--config", config, "--in-memory", "--listen",
                "127.0.0.1:0", "--workers", "3", "--", EXAMPLE_WORKER_BIN, "--job-ms", "1",
                "--give-up-after", "20"});
  ASSERT_TRUE(launch.wait_all(std::chrono::seconds(90))) << "launch did not finish:\n"
                                                         << launch.err(0);
  ASSERT_EQ(launch.exit_code(0), 0) << launch.err(0) << launch.out(0);
  // Each rank's lines come out prefixed "[rankN]: ".
  std::vector<std::string> outputs(kRanks);
  std::istringstream lines(launch.out(0));
  for (std::string line; std::getline(lines, line);) {
    const auto colon = line.find("]: ");
    if (line.rfind("[rank", 0) != 0 || colon == std::string::npos) continue;
    const uint32_t rank = static_cast<uint32_t>(std::stoul(line.substr(5, colon - 5)));
    ASSERT_LT(rank, kRanks) << line;
    outputs[rank] += line.substr(colon + 3) + "\n";
  }
  for (uint32_t r = 0; r < kRanks; ++r) {
    EXPECT_NE(outputs[r].find("finished: completed"), std::string::npos)
        << "rank " << r << ":\n"
        << launch.out(0) << launch.err(0);
  }
  expect_every_sample_once(outputs);
}

// `traincoord launch` says the group, rank and world size in the environment.
TEST(ClientStepsEnvironment, TheRankIsTakenFromTheEnvironmentWhenAGroupIsSet) {
  struct Restore {
    ~Restore() {
      unsetenv("TRAINCOORD_GROUP");
      unsetenv("RANK");
      unsetenv("WORLD_SIZE");
    }
  } restore;
  client::Options o;
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "4", 1);
  ASSERT_TRUE(client::rank_from_environment(o));
  EXPECT_FALSE(o.rank) << "no group: RANK is not ours (torchrun without traincoord)";
  setenv("TRAINCOORD_GROUP", "launch-1", 1);
  ASSERT_TRUE(client::rank_from_environment(o));
  EXPECT_EQ(o.group, "launch-1");
  EXPECT_EQ(o.rank, 2u);
  EXPECT_EQ(o.world_size, 4u);
  client::Options given;  // what the program set stays
  given.group = "mine";
  given.rank = 0;
  given.world_size = 1;
  ASSERT_TRUE(client::rank_from_environment(given));
  EXPECT_EQ(given.group, "mine");
  EXPECT_EQ(given.rank, 0u);
  setenv("WORLD_SIZE", "four", 1);
  client::Options bad;
  auto r = client::rank_from_environment(bad);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "world_size");
  EXPECT_NE(r.error().message.find("$WORLD_SIZE"), std::string::npos) << r.error().message;
  unsetenv("WORLD_SIZE");
  client::Options half;
  r = client::rank_from_environment(half);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "world_size");
}

// Cost-balanced step mode (docs/CONFIG.md, "Cost-balanced steps") with the C++ client: each
// completion carries its batch's own time (Completion::seconds), rank 1's twice rank 0's for the
// same padded batch, and the coordinator fits its cost model from them: status shows it fitted,
// rank 1 the slower. Every train sample is trained once per epoch.
constexpr const char* kCostRun = R"(
name = "costed"
[data]
train_samples = 60
dev_samples = 6
train_lengths = "train.txt"
dev_lengths = "dev.txt"
seed = 5
[schedule]
mode = "steps"
epochs = 2
batch_budget = 40.0
[leases]
timeout = 10
)";

double train_length(uint64_t sample) { return 1.0 + static_cast<double>((sample * 7) % 13); }

// The number after `key` in `json` (a flat search: the test's own status reply).
double number_after(const std::string& json, const std::string& key) {
  const size_t at = json.find(key);
  if (at == std::string::npos) return -1;
  return std::strtod(json.c_str() + at + key.size(), nullptr);
}

TEST(ClientStepsCostBalanced, CompletionsCarryTheirSecondsAndTheModelIsFittedFromThem) {
  TempDir dir;
  std::string train, dev;
  for (uint64_t i = 0; i < 60; ++i) train += std::to_string(train_length(i)) + "\n";
  for (int i = 0; i < 6; ++i) dev += std::to_string(1 + i) + "\n";
  dir.write("train.txt", train);
  dir.write("dev.txt", dev);
  const std::string config = dir.write("costed.toml", kCostRun);
  auto server = ServerProcess::start({"--config", config, "--in-memory"});
  ASSERT_NE(server, nullptr);
  std::vector<std::map<int64_t, std::vector<uint64_t>>> trained(2);  // per rank: epoch -> samples
  std::vector<std::string> errors(2);
  auto rank = [&](uint32_t r) {
    client::Options o;
    o.url = server->url();
    o.run = "costed";
    o.worker_name = "r" + std::to_string(r);
    o.group = "g1";
    o.rank = r;
    o.world_size = 2;
    o.long_poll = std::chrono::milliseconds(2000);
    o.give_up_after = std::chrono::milliseconds(20000);
    auto w = client::Worker::connect(o);
    if (!w) {
      errors[r] = w.error().message;
      return;
    }
    auto job = (*w)->next();
    while (job && *job) {
      const client::Job& j = **job;
      // The padded batch's time (n · longest, 1 ms a unit), rank 1 twice as slow: reported,
      // not slept.
      double longest = 0;
      for (uint64_t s : j.samples) longest = std::max(longest, train_length(s));
      const double seconds = 0.001 * static_cast<double>(j.samples.size()) * longest * (1.0 + r);
      if (j.set == "train") {
        auto& mine = trained[r][j.epoch];
        mine.insert(mine.end(), j.samples.begin(), j.samples.end());
      }
      job = (*w)->complete_and_next(j,
                                    {.loss = 1.0, .samples = j.samples.size(), .seconds = seconds});
    }
    if (!job) errors[r] = job.error().message;
  };
  std::thread r0(rank, 0), r1(rank, 1);
  r0.join();
  r1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  for (int64_t epoch : {0, 1}) {
    std::vector<uint64_t> all = trained[0][epoch];
    all.insert(all.end(), trained[1][epoch].begin(), trained[1][epoch].end());
    std::sort(all.begin(), all.end());
    std::vector<uint64_t> each(60);
    for (uint64_t i = 0; i < 60; ++i) each[i] = i;
    EXPECT_EQ(all, each) << "train epoch " << epoch;
  }
  auto status = client::get(server->url(), "/v1/runs/costed");
  ASSERT_TRUE(status) << status.error().message;
  EXPECT_NE(status->find("\"state\":\"completed\""), std::string::npos) << *status;
  const size_t model = status->find("\"cost_model\":{");
  ASSERT_NE(model, std::string::npos) << *status;
  const std::string cost_model = status->substr(model, status->find('}', model) - model);
  EXPECT_NE(cost_model.find("\"fitted\":true"), std::string::npos) << cost_model;
  EXPECT_GT(number_after(cost_model, "\"reports\":"), 8) << cost_model;
  // The speeds: [1, ~2] (rank 0 the fastest, rank 1 twice as slow).
  const size_t speeds = cost_model.find("\"speeds\":[");
  ASSERT_NE(speeds, std::string::npos) << cost_model;
  const char* at = cost_model.c_str() + speeds + 10;
  char* end = nullptr;
  const double s0 = std::strtod(at, &end);
  const double s1 = std::strtod(end + 1, nullptr);
  EXPECT_DOUBLE_EQ(s0, 1.0) << cost_model;
  EXPECT_NEAR(s1, 2.0, 0.2) << cost_model;
}

}  // namespace
}  // namespace traincoord
