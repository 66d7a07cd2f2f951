// The real server under the process limits an operator (or a container) sets: a file size limit
// (RLIMIT_FSIZE) the journal reaches, and a descriptor limit (RLIMIT_NOFILE) that idle
// connections use up (docs/SECURITY.md, "Limits"). Each server runs under `prlimit`, its
// standard error into a file the test reads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../sanitizer.h"
#include "server_process.h"

namespace traincoord::testing {
namespace {

constexpr const char* kRun = R"(
name = "d"
[data]
train_batches = 4
[schedule]
epochs = 1
)";

int request(uint16_t port, const std::string& method, const std::string& path,
            const std::string& body = "", std::string* reply_body = nullptr,
            int timeout_ms = 10'000) {
  const std::string reply = raw_exchange(
      port,
      method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
          "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\n\r\n" + body,
      timeout_ms);
  if (reply.rfind("HTTP/1.1 ", 0) != 0) return 0;
  if (reply_body) {
    const auto at = reply.find("\r\n\r\n");
    *reply_body = at == std::string::npos ? "" : reply.substr(at + 4);
  }
  return std::stoi(reply.substr(9, 3));
}

// Runs the server under `prlimit LIMIT`, its standard error appended to `log`.
std::vector<std::string> limited(const std::string& limit, const std::string& log) {
  return {"sh", "-c", "exec \"$@\" 2>>\"$0\"", log, "prlimit", limit, "--"};
}

// A server on DIR/data with durability "os", `min_free_mib` of reserve, under `prlimit LIMIT`.
std::unique_ptr<ServerProcess> durable_under(TempDir& dir, const std::string& min_free_mib,
                                             const std::string& limit, const std::string& log) {
  return ServerProcess::start(
      {"--config", dir.write("d.toml", kRun), "--data-dir", dir.path() + "/data", "--durability",
       "os", "--min-free-disk", min_free_mib},
      0, TRAINCOORD_BIN, limited(limit, log));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool alive(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) == 0;
}

// CPU time (user + system) the process has used, in seconds (from /proc/PID/stat).
double cpu_seconds(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Item 5: a file size limit (RLIMIT_FSIZE) is room the journal runs out of, as a disk's:
// near it, the server takes no new work (503 disk_full), reads go on, and it says why; it
// never dies of SIGXFSZ (ignored: a write past the limit fails with EFBIG, taken as a full
// disk).
TEST(LimitsE2E, AJournalNearTheFileSizeLimitIsAFullDiskNotADeath) {
  TempDir dir;
  const std::string log = dir.path() + "/stderr";
  auto server = durable_under(dir, "4", "--fsize=6000000", log);
  ASSERT_NE(server, nullptr) << read_file(log);
  const uint16_t port = server->port();
  // Every registration is a commit (about 13 KB of the write-ahead log): the journal's files
  // grow until their room under the limit is below the reserve. Paced (the server looks at its
  // room ten times a second: a burst faster than that would pass the 4 MiB reserve and reach
  // the limit itself, which holds the replies until the limit is raised; see DURABILITY.md).
  int code = 0;
  std::string reply;
  const std::string name(100, 'n');
  for (int i = 0; i < 5000 && code != 503; ++i) {
    code = request(port, "POST", "/v1/runs/d/workers",
                   R"({"name": ")" + name + std::to_string(i) + R"("})", &reply);
    ASSERT_NE(code, 0) << "no reply after " << i
                       << " registrations; alive: " << alive(server->pid())
                       << "; it said: " << read_file(log);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(code, 503) << reply;
  EXPECT_NE(reply.find("\"disk_full\""), std::string::npos) << reply;
  EXPECT_EQ(request(port, "GET", "/v1/runs/d"), 200);  // reads go on
  EXPECT_EQ(request(port, "GET", "/healthz"), 200);
  EXPECT_EQ(request(port, "POST", "/v1/runs/d/workers", R"({"name": "late"})"), 503);
  EXPECT_TRUE(alive(server->pid()));
  const std::string said = read_file(log);
  EXPECT_NE(said.find("taking no new work"), std::string::npos) << said;
  EXPECT_NE(said.find("RLIMIT_FSIZE"), std::string::npos) << said;
  // Without --max-connections, the default fits the descriptor limit quietly.
  EXPECT_EQ(said.find("exceeds what the file descriptor limit"), std::string::npos) << said;
}

// With no reserve (--min-free-disk 0), a commit reaches the file size limit itself: its write
// fails (EFBIG, taken as a full disk) and nothing of it is kept. With durability "os" the
// engine writes a wave on its own thread (HttpServer's commit_here); a failed write goes to the
// store thread, which says so and writes it again each second while the server takes no new
// work. Its replies wait; once the limit is raised they go out, and every registration answered
// is registered, none twice.
TEST(LimitsE2E, ACommitThatReachesTheLimitIsHeldAndAnsweredOnceThereIsRoom) {
  TempDir dir;
  const std::string log = dir.path() + "/stderr";
  auto server = durable_under(dir, "0", "--fsize=3000000:unlimited", log);
  ASSERT_NE(server, nullptr) << read_file(log);
  const uint16_t port = server->port();
  const pid_t pid = server->pid();

  // Raises the limit (the soft one: the hard one is unlimited) once the server says its write
  // found no room, after holding it 1.5 s.
  std::atomic<bool> stop{false}, raised{false};
  std::thread raiser([&] {
    for (int i = 0; i < 6000 && !stop; ++i) {  // (300 s: the main loop ends it sooner)
      if (read_file(log).find("retrying each second") != std::string::npos) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        raised = run_command("prlimit --pid " + std::to_string(pid) + " --fsize=unlimited") == "";
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  struct Stop {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Stop() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } joined{stop, raiser};

  // Registrations (about 13 KB of the write-ahead log each) until the limit is met and passed.
  const std::string name(100, 'n');
  int answered = 0, refused = 0;
  for (int i = 0; i < 3000 && !raised; ++i) {
    std::string reply;
    const int code = request(port, "POST", "/v1/runs/d/workers",
                             R"({"name": ")" + name + std::to_string(i) + R"("})", &reply, 30'000);
    ASSERT_NE(code, 0) << "no reply to registration " << i << "; it said: " << read_file(log);
    if (code == 503) {
      EXPECT_NE(reply.find("\"disk_full\""), std::string::npos) << reply;
      ++refused;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    ASSERT_EQ(code, 200) << reply;
    ++answered;
  }
  stop = true;
  raiser.join();
  ASSERT_TRUE(raised) << "the write never found the limit; it said: " << read_file(log);
  EXPECT_NE(read_file(log).find("RLIMIT_FSIZE"), std::string::npos) << read_file(log);
  // Room again: new work is taken (the store thread has written the held wave).
  int code = 0;
  for (int i = 0; i < 100 && code != 200; ++i) {
    code = request(port, "POST", "/v1/runs/d/workers", R"({"name": "after"})");
    if (code != 200) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(code, 200);

  // After a restart, every registration answered is there, once: none was answered unwritten.
  server->kill(SIGKILL);
  server = ServerProcess::start({"--config", dir.path() + "/d.toml", "--data-dir",
                                 dir.path() + "/data", "--durability", "os"},
                                port);
  ASSERT_NE(server, nullptr);
  std::string status;
  ASSERT_EQ(request(port, "GET", "/v1/runs/d", "", &status), 200);
  size_t workers = 0;
  for (size_t at = status.find("\"nnnn"); at != std::string::npos;
       at = status.find("\"nnnn", at + 1)) {
    ++workers;
  }
  EXPECT_EQ(workers, static_cast<size_t>(answered)) << "refused " << refused << ": " << status;
  EXPECT_NE(status.find("\"after\""), std::string::npos);
}

// Item 5: with a low descriptor limit, idle connections use every descriptor. Accepting pauses
// (said once), instead of failing in a busy loop; the server still serves, and a fresh
// connection is answered once some close.
TEST(LimitsE2E, OutOfDescriptorsAcceptingPausesAndTheServerStillAnswers) {
  if (kSanitized) {
    // UBSan's vptr check tests memory with a pipe, which a process out of descriptors cannot
    // make: it then reports every object as invalid. The plain build runs this test.
    GTEST_SKIP() << "out of descriptors, a sanitizer's runtime fails before the server does";
  }
  TempDir dir;
  const std::string log = dir.path() + "/stderr";
  auto server = ServerProcess::start(
      {"--config", dir.write("d.toml", kRun), "--in-memory", "--idle-timeout", "60",
       "--max-connections", "1000"},  // more than the limit holds: said, and kept
      0, TRAINCOORD_BIN, limited("--nofile=64", log));
  ASSERT_NE(server, nullptr) << read_file(log);
  const uint16_t port = server->port();
  EXPECT_NE(read_file(log).find("exceeds what the file descriptor limit allows"), std::string::npos)
      << read_file(log);
  std::vector<int> idle;
  for (int i = 0; i < 120; ++i) {
    const int fd = connect_loopback(port);
    if (fd >= 0) idle.push_back(fd);
  }
  ASSERT_GT(idle.size(), 64u);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Out of descriptors now; a busy accept loop would use a whole core meanwhile.
  const double cpu_before = cpu_seconds(server->pid());
  const auto wall_before = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const double cpu = cpu_seconds(server->pid()) - cpu_before;
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_before).count();
  EXPECT_LT(cpu, 0.5 * wall) << "the server used " << cpu << " s of CPU in " << wall
                             << " s with its descriptors used up";
  const std::string said = read_file(log);
  EXPECT_NE(said.find("pausing new connections"), std::string::npos) << said;
  // Once per episode, not per try.
  EXPECT_EQ(said.find("pausing new connections"), said.rfind("pausing new connections")) << said;
  EXPECT_TRUE(alive(server->pid()));

  // Some close: the ones waiting are taken, and a fresh connection is answered.
  for (size_t i = 0; i < 80 && !idle.empty(); ++i) {
    close(idle.back());
    idle.pop_back();
  }
  int code = 0;
  for (int i = 0; i < 20 && code != 200; ++i)
    code = request(port, "GET", "/healthz", "", nullptr, 1000);
  EXPECT_EQ(code, 200);
  for (int fd : idle) close(fd);
  // Said when it accepts again.
  for (int i = 0; i < 50 && read_file(log).find("accepting connections again") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(read_file(log).find("accepting connections again"), std::string::npos)
      << read_file(log);
}

}  // namespace
}  // namespace traincoord::testing
