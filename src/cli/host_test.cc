#include "cli/host.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "config/config_file.h"

namespace traincoord::cli {
namespace {

TEST(HostListen, SplitsHostAndPort) {
  std::string host;
  uint16_t port = 1;
  ASSERT_TRUE(split_listen("127.0.0.1:8470", &host, &port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 8470);
  ASSERT_TRUE(split_listen("[::1]:0", &host, &port));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 0);
}

TEST(HostListen, RefusesWhatIsNotHostColonPort) {
  std::string host;
  uint16_t port = 0;
  EXPECT_FALSE(split_listen("127.0.0.1", &host, &port));
  EXPECT_FALSE(split_listen(":8470", &host, &port));
  EXPECT_FALSE(split_listen("localhost:http", &host, &port));
  EXPECT_FALSE(split_listen("localhost:65536", &host, &port));
  EXPECT_FALSE(split_listen("localhost:-1", &host, &port));
}

TEST(HostListen, KnowsLoopbackAddresses) {
  EXPECT_TRUE(is_loopback("localhost"));
  EXPECT_TRUE(is_loopback("::1"));
  EXPECT_TRUE(is_loopback("127.0.0.2"));
  EXPECT_FALSE(is_loopback("0.0.0.0"));
  EXPECT_FALSE(is_loopback("10.127.0.1"));
}

TEST(HostState, ADataDirByDefaultNamedAfterTheOnlyRun) {
  auto one = choose_state("", false, "", {"sweep"});
  ASSERT_TRUE(one);
  EXPECT_EQ(one->kind, StateChoice::Kind::kDataDir);
  EXPECT_EQ(one->where, "sweep.traincoord");
  auto several = choose_state("", false, "", {"a", "b"});
  ASSERT_TRUE(several);
  EXPECT_EQ(several->where, "traincoord-data");
  auto given = choose_state("", false, "state", {"a"});
  ASSERT_TRUE(given);
  EXPECT_EQ(given->where, "state");
}

TEST(HostState, InMemoryOrEtcdWhenAsked) {
  auto memory = choose_state("", true, "", {"a"});
  ASSERT_TRUE(memory);
  EXPECT_EQ(memory->kind, StateChoice::Kind::kMemory);
  auto etcd = choose_state("etcd://127.0.0.1:2379", false, "", {"a"});
  ASSERT_TRUE(etcd);
  EXPECT_EQ(etcd->kind, StateChoice::Kind::kEtcd);
  EXPECT_EQ(etcd->where, "etcd://127.0.0.1:2379");
}

TEST(HostState, EtcdExcludesTheOtherStates) {
  auto memory = choose_state("etcd://h:1", true, "", {"a"});
  ASSERT_FALSE(memory);
  EXPECT_EQ(memory.error(), "--in-memory and --journal exclude each other (the state is in etcd)");
  auto dir = choose_state("etcd://h:1", false, "d", {"a"});
  ASSERT_FALSE(dir);
  EXPECT_EQ(dir.error(), "--data-dir and --journal exclude each other (the state is in etcd)");
}

ConfigFile config_file(int epochs) {
  const std::string text =
      "name = \"host-test\"\n[data]\ntrain_batches = 10\n[schedule]\nepochs = " +
      std::to_string(epochs) + "\n";
  auto config = parse_run_config(text, "host-test.toml");
  EXPECT_TRUE(config) << config.error().message;
  return {"host-test.toml", text, *config};
}

// A run added to a data dir is there when the data dir is opened again; a changed config of it
// is refused.
TEST(HostState, ADataDirKeepsTheRunsAdded) {
  const std::string dir = testing::TempDir() + "/host_test_state";
  std::filesystem::remove_all(dir);
  auto refuse = [](const std::string&) { return exit_code::kFailed; };
  StoreOptions so;
  so.dir = dir;
  {
    ServerClock clock;
    Engine engine(clock);
    std::unique_ptr<Store> store;
    auto report = open_data_dir(so, engine, clock, &store);
    ASSERT_TRUE(report) << report.error();
    EXPECT_EQ(report->runs, 0u);
    ASSERT_EQ(add_runs({config_file(2)}, engine, store.get(), clock, false, refuse), 0);
    EXPECT_TRUE(engine.find("host-test"));
  }
  ServerClock clock;
  Engine engine(clock);
  std::unique_ptr<Store> store;
  auto report = open_data_dir(so, engine, clock, &store);
  ASSERT_TRUE(report) << report.error();
  EXPECT_EQ(report->runs, 1u);
  ASSERT_TRUE(engine.find("host-test"));
  EXPECT_EQ(add_runs({config_file(2)}, engine, store.get(), clock, false, refuse), 0);
  EXPECT_EQ(add_runs({config_file(3)}, engine, store.get(), clock, false, refuse),
            exit_code::kUsage);
  std::filesystem::remove_all(dir);
}

// The check that --apply-config-changes makes at a start (SQLite) and at a takeover (etcd):
// without the flag any difference is refused naming the fields; with it, schedule.epochs may be
// raised, a field that shapes the plan may not change.
TEST(HostConfigChange, TheFlagAllowsWhatAStartedRunMayChangeAndNamesTheRest) {
  ServerClock clock;
  Engine engine(clock);
  auto run = engine.create_run(config_file(2).config);
  ASSERT_TRUE(run);
  EXPECT_TRUE(check_config_change(config_file(2), **run, false).changed.empty());
  const ConfigChange no_flag = check_config_change(config_file(3), **run, false);
  EXPECT_EQ(no_flag.changed, std::vector<std::string>{"schedule.epochs"});
  EXPECT_NE(no_flag.refused.find("these fields differ: schedule.epochs"), std::string::npos)
      << no_flag.refused;
  const ConfigChange raised = check_config_change(config_file(3), **run, true);
  EXPECT_EQ(raised.changed, std::vector<std::string>{"schedule.epochs"});
  EXPECT_EQ(raised.refused, "");
  ConfigFile batches = config_file(3);
  batches.config.train_batches = 20;
  const ConfigChange fixed = check_config_change(batches, **run, true);
  EXPECT_NE(fixed.refused.find("a started run cannot change"), std::string::npos) << fixed.refused;
  EXPECT_NE(fixed.refused.find("train_batches"), std::string::npos) << fixed.refused;
}

}  // namespace
}  // namespace traincoord::cli
