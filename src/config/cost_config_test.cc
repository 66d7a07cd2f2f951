// Cost-balanced step mode in the config (docs/CONFIG.md, "Cost-balanced steps"): lengths read
// from files beside the config, stored with the run inline with their checksum, checked again
// when the stored text is read; the JSON form takes lengths inline only.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/config_file.h"
#include "core/step_plan.h"

namespace traincoord {
namespace {

const char* kToml = R"(name = "speech"
[data]
train_samples = 5
dev_samples = 2
train_lengths = "lengths/train.txt"
dev_lengths = "lengths/dev.txt"
seed = 3
[schedule]
mode = "steps"
epochs = 2
batch_budget = 40.0
cost_c = 0.01
)";

class CostConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("traincoord-cost-config-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "lengths");
    write("lengths/train.txt", "# seconds\n1.5\n2\n 3.25 # a comment\n\n10\n0.5\n");
    write("lengths/dev.txt", "4\n5\n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::string path() const { return (dir_ / "run.toml").string(); }
  std::filesystem::path dir_;
};

TEST_F(CostConfig, ReadsTheLengthsFilesBesideTheConfigAndTheBudgetAndCost) {
  auto c = parse_run_config(kToml, path());
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE(c->cost_balanced());
  EXPECT_EQ(c->train_lengths, (std::vector<double>{1.5, 2, 3.25, 10, 0.5}));
  EXPECT_EQ(c->dev_lengths, (std::vector<double>{4, 5}));
  EXPECT_EQ(c->train_lengths_xxh64, lengths_checksum(c->train_lengths));
  EXPECT_EQ(c->batch_budget, 40);
  EXPECT_EQ(c->cost.describe(), "a 0 + b 1 + c 0.01");  // a and b as defaults
  EXPECT_EQ(c->batch_size, 0u);
  EXPECT_EQ(c->train_batches, 5u);  // (at most one batch per sample; planned per epoch)
}

TEST_F(CostConfig, TheStoredTextHoldsTheLengthsAndNeedsNoFile) {
  auto c = parse_run_config(kToml, path());
  ASSERT_TRUE(c) << c.error().message;
  const std::string stored = durable_config_text(kToml, *c);
  EXPECT_NE(stored.find("[lengths]"), std::string::npos);
  std::filesystem::remove_all(dir_ / "lengths");  // a restart on another machine
  auto again = parse_run_config(stored, "the journal (run speech)");
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->train_lengths, c->train_lengths);
  EXPECT_EQ(again->dev_lengths, c->dev_lengths);
  EXPECT_EQ(durable_config_text(stored, *again), stored);  // once only
  // A damaged length is found by its checksum, named.
  std::string damaged = stored;
  const size_t at = damaged.find("3.25");
  ASSERT_NE(at, std::string::npos);
  damaged.replace(at, 4, "3.26");
  auto refused = parse_run_config(damaged, "the journal (run speech)");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().field, "lengths.train_xxh3");
  EXPECT_NE(refused.error().message.find("damaged"), std::string::npos);
}

TEST_F(CostConfig, RefusesNamingTheField) {
  auto field_of = [&](const std::string& text) {
    auto r = parse_run_config(text, path());
    return r ? std::string("(accepted)") : r.error().field;
  };
  auto replaced = [](std::string text, const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  EXPECT_EQ(field_of(kToml), "(accepted)");
  EXPECT_EQ(field_of(replaced(kToml, "train_samples = 5", "train_samples = 6")),
            "data.train_lengths");  // 5 lengths for 6 samples
  EXPECT_EQ(field_of(replaced(kToml, "lengths/train.txt", "nowhere.txt")), "data.train_lengths");
  write("lengths/bad.txt", "1\nx\n");
  auto bad = parse_run_config(replaced(kToml, "lengths/train.txt", "lengths/bad.txt"), path());
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().field, "data.train_lengths");
  EXPECT_NE(bad.error().message.find("bad.txt:2"), std::string::npos) << bad.error().message;
  EXPECT_EQ(field_of(replaced(kToml, "batch_budget = 40.0", "batch_budget = -1.0")),
            "schedule.batch_budget");
  EXPECT_EQ(field_of(replaced(kToml, "seed = 3", "seed = 3\nbatch_size = 2")), "data.batch_size");
  EXPECT_EQ(field_of(replaced(kToml, "cost_c = 0.01", "cost_c = 0.01\ncost_a = -1.0")),
            "schedule.cost_b");  // (the cost's coefficients are checked together)
  EXPECT_EQ(field_of(replaced(kToml, "mode = \"steps\"", "mode = \"jobs\"")),
            "schedule.batch_budget");
}

TEST(CostConfigJson, TakesLengthsInlineAndReadsNoFile) {
  const std::string inline_json = R"({"name": "s", "data": {"train_samples": 3},
    "schedule": {"mode": "steps", "validation_every": 0, "batch_budget": 10},
    "lengths": {"train": [1, 2.5, 3]}})";
  auto c = parse_run_config_json(inline_json, "run config");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->train_lengths, (std::vector<double>{1, 2.5, 3}));
  auto file = parse_run_config_json(R"({"name": "s", "data": {"train_samples": 3,
    "train_lengths": "/etc/passwd"}, "schedule": {"mode": "steps", "validation_every": 0,
    "batch_budget": 10}})",
                                    "run config");
  ASSERT_FALSE(file);
  EXPECT_EQ(file.error().field, "data.train_lengths");
  auto words = parse_run_config_json(R"({"name": "s", "data": {"train_samples": 1},
    "schedule": {"mode": "steps", "batch_budget": 10}, "lengths": {"train": ["x"]}})",
                                     "run config");
  ASSERT_FALSE(words);
  EXPECT_EQ(words.error().field, "lengths.train");
}

}  // namespace
}  // namespace traincoord
