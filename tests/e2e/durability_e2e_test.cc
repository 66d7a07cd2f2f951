// End-to-end tests of what docs/DURABILITY.md promises about the data dir: the journal keeps
// what changed state and nothing else, one server per data dir, and a full or read-only disk
// is met with a clear refusal, never an abort. The real binary, on loopback.
//
// The disk tests give the server a small tmpfs of its own, in a mount namespace (`unshare -Urm`,
// util-linux): nothing outside the test sees it, and it goes when the server does. Where this
// machine allows no such namespace, they are skipped, saying why.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <rapidjson/document.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "server_process.h"
#include "store/sqlite.h"
#include "traincoord/client.h"

namespace traincoord {
namespace {

using testing::raw_exchange;
using testing::run_command;
using testing::ServerProcess;
using testing::TempDir;

constexpr const char* kRun = R"(
name = "d"
[data]
train_batches = 4
[schedule]
epochs = 1
[leases]
timeout = 2.0
)";

// The status code of one request (0: no answer), and its body in *body.
int request(uint16_t port, const std::string& method, const std::string& path,
            const std::string& body = "", std::string* reply_body = nullptr) {
  const std::string reply = raw_exchange(
      port,
      method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
          "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\n\r\n" + body,
      10'000);
  if (reply.rfind("HTTP/1.1 ", 0) != 0) return 0;
  if (reply_body) {
    const auto at = reply.find("\r\n\r\n");
    *reply_body = at == std::string::npos ? "" : reply.substr(at + 4);
  }
  return std::stoi(reply.substr(9, 3));
}

rapidjson::Document status_of(const ServerProcess& server) {
  rapidjson::Document d;
  auto body = client::get(server.url(), "/v1/runs/d");
  EXPECT_TRUE(body) << body.error().message;
  d.Parse(body ? body->c_str() : "{}");
  return d;
}

int64_t log_rows(const std::string& dir) {
  auto db = sqlite::Db::open(dir + "/traincoord.db", true);
  EXPECT_TRUE(db);
  return std::stoll(db->scalar("SELECT count(*) FROM log").value_or("-1"));
}

uint64_t dir_bytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

// Item 1 of issue 16, as it was found: refused requests were logged, and replayed as accepted
// under the default limits.
TEST(DurabilityE2E, ARestartDoesNotReplayRefusedRequests) {
  TempDir dir;
  const std::string config = dir.write("d.toml", kRun);
  const std::string data = dir.path() + "/data";
  const std::vector<std::string> args = {
      "--config", config, "--data-dir", data, "--durability", "os", "--max-workers-per-run", "1"};
  {
    auto server = ServerProcess::start(args);
    ASSERT_NE(server, nullptr);
    const uint16_t port = server->port();
    EXPECT_EQ(request(port, "POST", "/v1/runs/d/workers", R"({"name": "w0"})"), 200);
    EXPECT_EQ(request(port, "POST", "/v1/runs/d/workers", R"({"name": "intruder"})"), 409);
    EXPECT_EQ(request(port, "POST", "/v1/runs/d/acquire", R"({"worker": 1, "jobs": 4})"), 404);
    server->kill(SIGTERM);
  }
  auto server = ServerProcess::start(args);
  ASSERT_NE(server, nullptr);
  auto s = status_of(*server);
  ASSERT_TRUE(s.HasMember("workers"));
  ASSERT_EQ(s["workers"].Size(), 1u);
  EXPECT_STREQ(s["workers"][0]["name"].GetString(), "w0");
  EXPECT_EQ(s["workers"][0]["leases"].Size(), 0u);
}

// Item 4: a request that changed nothing writes nothing, whatever its size; a long poll writes
// once, not at every tick.
TEST(DurabilityE2E, WhatChangedNothingIsNotWritten) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  auto server = ServerProcess::start(
      {"--config", dir.write("d.toml", kRun), "--data-dir", data, "--durability", "os"});
  ASSERT_NE(server, nullptr);
  const uint16_t port = server->port();
  ASSERT_EQ(request(port, "POST", "/v1/runs/d/workers", R"({"name": "w0"})"), 200);
  ASSERT_EQ(request(port, "POST", "/v1/runs/d/workers", R"({"name": "w1"})"), 200);
  const uint64_t before = dir_bytes(data);
  const std::string pad(1'000'000, 'x');
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(request(port, "POST", "/v1/runs/d/complete",
                      R"({"worker": 9, "lease": 1, "pad": ")" + pad + "\"}"),
              404);
  }
  EXPECT_LT(dir_bytes(data), before + 1'000'000) << "20 MB of refused requests were written";

  // w0 takes every job; w1 waits 1.5 s in a long poll for one, and gets none.
  ASSERT_EQ(request(port, "POST", "/v1/runs/d/acquire", R"({"worker": 0, "jobs": 4})"), 200);
  const int64_t rows = log_rows(data);
  std::string reply;
  EXPECT_EQ(request(port, "POST", "/v1/runs/d/acquire",
                    R"({"worker": 1, "request": 7, "wait_ms": 1500})", &reply),
            200);
  EXPECT_NE(reply.find("\"wait\""), std::string::npos) << reply;
  EXPECT_LE(log_rows(data), rows + 1);  // the acquire as it came (a new request id): once
}

// Item 3: a second server on a data dir in use is refused at once, naming the first.
TEST(DurabilityE2E, ASecondServerOnTheSameDataDirIsRefused) {
  TempDir dir;
  const std::string config = dir.write("d.toml", kRun);
  const std::string data = dir.path() + "/data";
  auto server = ServerProcess::start({"--config", config, "--data-dir", data});
  ASSERT_NE(server, nullptr);
  int status = 0;
  const std::string said =
      run_command(std::string("timeout 20 ") + TRAINCOORD_BIN + " serve --config " + config +
                      " --data-dir " + data + " --listen 127.0.0.1:0 2>&1",
                  &status);
  EXPECT_NE(status, 0) << said;
  EXPECT_NE(said.find("is in use by another traincoord process (pid " +
                      std::to_string(server->pid()) + ")"),
            std::string::npos)
      << said;
  // The first goes on undisturbed, and `inspect` may read the data dir meanwhile.
  EXPECT_EQ(request(server->port(), "POST", "/v1/runs/d/workers", R"({"name": "w0"})"), 200);
  const std::string inspected =
      run_command(std::string(TRAINCOORD_BIN) + " inspect --data-dir " + data + " 2>&1", &status);
  EXPECT_EQ(status, 0) << inspected;
}

// Item 5, as it was found: the -wal file deleted (here after a kill -9; under a running server
// it is the same once the server dies) loses the commits it held; the next start says so.
TEST(DurabilityE2E, LostCommitsAreReportedAtTheNextStart) {
  TempDir dir;
  const std::string config = dir.write("d.toml", kRun);
  const std::string data = dir.path() + "/data";
  const std::vector<std::string> args = {"--config", config, "--data-dir", data};
  const std::vector<std::string> with_stderr = {"sh", "-c", "exec \"$@\" 2>&1", "sh"};
  {
    auto server = ServerProcess::start(args);
    ASSERT_NE(server, nullptr);
    const uint16_t port = server->port();
    ASSERT_EQ(request(port, "POST", "/v1/runs/d/workers", R"({"name": "w0"})"), 200);
    for (int lease = 1; lease <= 4; ++lease) {
      ASSERT_EQ(request(port, "POST", "/v1/runs/d/acquire", R"({"worker": 0})"), 200);
      ASSERT_EQ(request(port, "POST", "/v1/runs/d/complete",
                        R"({"worker": 0, "lease": )" + std::to_string(lease) +
                            R"(, "loss": 1, "samples": 1})"),
                200);
    }
    server->kill(SIGKILL);  // (a few commits: far from the WAL's first checkpoint)
  }
  std::filesystem::remove(data + "/traincoord.db-wal");
  std::filesystem::remove(data + "/traincoord.db-shm");
  {
    auto server = ServerProcess::start(args, 0, TRAINCOORD_BIN, with_stderr);
    ASSERT_NE(server, nullptr);
    EXPECT_NE(server->output().find("lost commits"), std::string::npos) << server->output();
    server->kill(SIGTERM);
  }
  auto server = ServerProcess::start(args, 0, TRAINCOORD_BIN, with_stderr);  // said once
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->output().find("lost commits"), std::string::npos) << server->output();
}

// Whether this machine lets the test mount a tmpfs in a namespace of its own.
bool can_mount_tmpfs(std::string* why) {
  TempDir probe;
  int status = 0;
  *why = run_command(
      "unshare -Urm sh -c 'mount -t tmpfs -o size=1m tmpfs " + probe.path() + "' 2>&1", &status);
  return status == 0;
}

std::vector<std::string> on_tmpfs(const std::string& dir, const std::string& options) {
  return {"unshare",
          "-Urm",
          "sh",
          "-c",
          "mount -t tmpfs -o " + options + " tmpfs \"$0\" && exec \"$@\"",
          dir};
}

// Item 4: on a disk below the reserve, the server takes no new work (503, code disk_full),
// keeps answering reads, lets no lease expire, and takes work again once there is room.
TEST(DurabilityE2E, AFullDiskRefusesNewWorkAndKeepsWhatWasAccepted) {
  std::string why;
  if (!can_mount_tmpfs(&why)) GTEST_SKIP() << "no tmpfs in a namespace here: " << why;
  TempDir dir;
  const std::string disk = dir.path() + "/disk";
  std::filesystem::create_directory(disk);
  auto server = ServerProcess::start({"--config", dir.write("d.toml", kRun), "--data-dir", disk,
                                      "--durability", "os", "--min-free-disk", "4"},
                                     0, TRAINCOORD_BIN, on_tmpfs(disk, "size=16m,mode=0700"));
  ASSERT_NE(server, nullptr);
  const uint16_t port = server->port();
  ASSERT_EQ(request(port, "POST", "/v1/runs/d/workers", R"({"name": "w0"})"), 200);
  std::string reply;
  ASSERT_EQ(request(port, "POST", "/v1/runs/d/acquire", R"({"worker": 0})", &reply), 200);
  ASSERT_NE(reply.find("\"lease\":1"), std::string::npos) << reply;

  // Something else fills the disk (the server's tmpfs, seen through its /proc root).
  const std::string filler = "/proc/" + std::to_string(server->pid()) + "/root" + disk + "/filler";
  {
    std::ofstream out(filler, std::ios::binary);
    ASSERT_TRUE(out) << filler;
    const std::string mib(1 << 20, 'f');
    for (int i = 0; i < 13 && out; ++i) out << mib;
  }
  int code = 0;
  for (int i = 0; i < 100 && code != 503; ++i) {
    code = request(port, "POST", "/v1/runs/d/heartbeat", R"({"worker": 0})", &reply);
    if (code != 503) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(code, 503) << reply;
  EXPECT_NE(reply.find("\"disk_full\""), std::string::npos) << reply;
  EXPECT_EQ(request(port, "GET", "/v1/runs/d"), 200);  // reads go on
  EXPECT_EQ(request(port, "POST", "/v1/runs/d/workers", R"({"name": "w1"})"), 503);
  // Longer than the lease timeout (2 s): the worker could not report, so its lease stands.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(request(port, "GET", "/v1/runs/d"), 200);

  std::filesystem::remove(filler);
  for (int i = 0; i < 100 && code == 503; ++i) {
    code = request(port, "POST", "/v1/runs/d/complete",
                   R"({"worker": 0, "lease": 1, "loss": 0.5, "samples": 1})", &reply);
    if (code == 503) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(code, 200) << reply;
  EXPECT_NE(reply.find("\"counted\":true"), std::string::npos) << reply;
  auto s = status_of(*server);
  ASSERT_TRUE(s.HasMember("counters")) << reply;
  EXPECT_EQ(s["counters"]["lease_expiries"].GetUint64(), 0u);
}

// Item 4: a start on a full disk, or a read-only one, is refused with a message that says so,
// before it says "listening".
TEST(DurabilityE2E, AStartOnAFullOrReadOnlyDiskIsRefused) {
  std::string why;
  if (!can_mount_tmpfs(&why)) GTEST_SKIP() << "no tmpfs in a namespace here: " << why;
  TempDir dir;
  const std::string config = dir.write("d.toml", kRun);
  const std::string disk = dir.path() + "/disk";
  std::filesystem::create_directory(disk);
  int status = 0;
  std::string said =
      run_command("unshare -Urm sh -c 'mount -t tmpfs -o size=8m,mode=0700 tmpfs " + disk +
                      " && head -c 7000000 "
                      "/dev/zero > " +
                      disk + "/filler && exec " + TRAINCOORD_BIN + " serve --config " + config +
                      " --data-dir " + disk + " --listen 127.0.0.1:0' 2>&1",
                  &status);
  EXPECT_NE(status, 0) << said;
  EXPECT_NE(said.find("is full or nearly"), std::string::npos) << said;
  EXPECT_EQ(said.find("listening"), std::string::npos) << said;

  // A data dir written before, then mounted read-only.
  const std::string data = dir.path() + "/data";
  {
    auto server = ServerProcess::start({"--config", config, "--data-dir", data});
    ASSERT_NE(server, nullptr);
    server->kill(SIGTERM);
  }
  said = run_command("unshare -Urm sh -c 'mount --bind " + data + " " + data +
                         " && mount -o remount,bind,ro " + data + " && exec " + TRAINCOORD_BIN +
                         " serve --config " + config + " --data-dir " + data +
                         " --listen 127.0.0.1:0' 2>&1",
                     &status);
  EXPECT_NE(status, 0) << said;
  EXPECT_NE(said.find("cannot write in data dir"), std::string::npos) << said;
  EXPECT_EQ(said.find("listening"), std::string::npos) << said;
}

// ---- Issue 31 ----

std::string text_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Item 2: the lock is held on the data dir itself: with its lock file deleted under a running
// server, a second one on the same dir is still refused, naming the first; the first goes on.
TEST(DurabilityE2E, ADeletedLockFileLetsNoSecondServerIn) {
  TempDir dir;
  const std::string config = dir.write("d.toml", kRun);
  const std::string data = dir.path() + "/data";
  auto server = ServerProcess::start({"--config", config, "--data-dir", data});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(std::filesystem::remove(data + "/traincoord.lock"));
  int status = 0;
  const std::string said =
      run_command(std::string("timeout 20 ") + TRAINCOORD_BIN + " serve --config " + config +
                      " --data-dir " + data + " --listen 127.0.0.1:0 2>&1",
                  &status);
  EXPECT_NE(status, 0) << said;
  EXPECT_NE(said.find("is in use by another traincoord process (pid " +
                      std::to_string(server->pid()) + ")"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("listening"), std::string::npos) << said;
  EXPECT_EQ(request(server->port(), "POST", "/v1/runs/d/workers", R"({"name": "w0"})"), 200);
  EXPECT_EQ(request(server->port(), "POST", "/v1/runs/d/acquire", R"({"worker": 0})"), 200);
}

// Item 1: a link planted for any file the server opens in its data dir or its token dir makes
// the start refused, naming the file; the file the link points to is not touched.
TEST(DurabilityE2E, ALinkPlantedForAnyFileOfTheDataOrTokenDirIsRefused) {
  TempDir dir;
  const std::string config = dir.write("d.toml", kRun);
  const std::string data = dir.path() + "/data";
  const std::string tokens = dir.path() + "/tokens";
  const std::vector<std::string> args = {"--config", config,        "--data-dir", data,
                                         "--auth",   "--token-dir", tokens};
  {
    auto server = ServerProcess::start(args);
    ASSERT_NE(server, nullptr);
    server->kill(SIGTERM);
  }
  std::string command = std::string("timeout 20 ") + TRAINCOORD_BIN + " serve";
  for (const std::string& a : args) command += " " + a;
  command += " --listen 127.0.0.1:0 2>&1";
  for (const std::string& file :
       {data + "/traincoord.head", data + "/traincoord.lock", data + "/traincoord.db",
        data + "/traincoord.db-wal", data + "/traincoord.db-shm", data + "/traincoord.db-journal",
        tokens + "/admin.token", tokens + "/runs/d.token"}) {
    SCOPED_TRACE(file);
    const std::string target = dir.path() + "/outside";
    std::ofstream(target) << "known content";
    const std::string kept = dir.path() + "/kept";
    const bool existed = std::filesystem::exists(file);
    if (existed) std::filesystem::rename(file, kept);
    std::filesystem::create_symlink(target, file);
    int status = 0;
    const std::string said = run_command(command, &status);
    EXPECT_NE(status, 0) << said;
    EXPECT_NE(said.find(file + " is a symbolic link"), std::string::npos) << said;
    EXPECT_EQ(said.find("listening"), std::string::npos) << said;
    EXPECT_EQ(text_of(target), "known content");
    std::filesystem::remove(file);
    if (existed) std::filesystem::rename(kept, file);
  }
  // Everything back in place: it starts.
  auto server = ServerProcess::start(args);
  ASSERT_NE(server, nullptr);
}

// Item 1: a data dir others may write to is refused, saying its mode and the chmod to run.
TEST(DurabilityE2E, ADataDirOthersMayWriteIsRefused) {
  TempDir dir;
  const std::string config = dir.write("d.toml", kRun);
  const std::string data = dir.path() + "/data";
  std::filesystem::create_directory(data);
  ASSERT_EQ(chmod(data.c_str(), 01777), 0);
  int status = 0;
  const std::string said =
      run_command(std::string("timeout 20 ") + TRAINCOORD_BIN + " serve --config " + config +
                      " --data-dir " + data + " --listen 127.0.0.1:0 2>&1",
                  &status);
  EXPECT_NE(status, 0) << said;
  EXPECT_NE(said.find("(mode 1777)"), std::string::npos) << said;
  EXPECT_NE(said.find("chmod 700 " + data), std::string::npos) << said;
}

// Item 6: inspect reads a data dir on a read-only file system, and never calls a healthy
// database corrupt nor advises moving it away.
TEST(DurabilityE2E, InspectReadsADataDirOnAReadOnlyFileSystem) {
  std::string why;
  if (!can_mount_tmpfs(&why)) GTEST_SKIP() << "no mount namespace here: " << why;
  TempDir dir;
  const std::string config = dir.write("d.toml", kRun);
  const std::string data = dir.path() + "/data";
  const std::string inspect_ro = "unshare -Urm sh -c 'mount --bind " + data + " " + data +
                                 " && mount -o remount,bind,ro " + data + " && exec " +
                                 TRAINCOORD_BIN + " inspect --data-dir " + data + "' 2>&1";
  {
    auto server = ServerProcess::start({"--config", config, "--data-dir", data});
    ASSERT_NE(server, nullptr);
    ASSERT_EQ(request(server->port(), "POST", "/v1/runs/d/workers", R"({"name": "w0"})"), 200);
    server->kill(SIGTERM);  // stopped cleanly: no -wal file left
  }
  int status = 0;
  std::string said = run_command(inspect_ro, &status);
  EXPECT_EQ(status, 0) << said;
  EXPECT_NE(said.find("d"), std::string::npos) << said;
  EXPECT_EQ(said.find("corrupt"), std::string::npos) << said;
  EXPECT_EQ(said.find("move the file away"), std::string::npos) << said;
  {
    auto server = ServerProcess::start({"--config", config, "--data-dir", data});
    ASSERT_NE(server, nullptr);
    ASSERT_EQ(request(server->port(), "POST", "/v1/runs/d/workers", R"({"name": "w1"})"), 200);
    server->kill(SIGKILL);  // commits left in the -wal file
  }
  std::filesystem::remove(data + "/traincoord.db-shm");
  said = run_command(inspect_ro, &status);
  // Read if SQLite can; else said as it is: a read-only file system, not damage.
  if (status != 0) {
    EXPECT_NE(said.find("read-only file system"), std::string::npos) << said;
    EXPECT_NE(said.find("not known to be damaged"), std::string::npos) << said;
  }
  EXPECT_EQ(said.find("corrupt"), std::string::npos) << said;
  EXPECT_EQ(said.find("move the file away"), std::string::npos) << said;
}

}  // namespace
}  // namespace traincoord
