// The C++ client, `traincoord status` and the example worker against a broken or hostile
// coordinator (tests/hostile/hostile_server.py, the fixture the Python client's tests use too):
// every misbehaviour ends in a ClientError naming the request and what happened, within the
// deadlines the client states, without a crash and without reading an unbounded reply.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../sanitizer.h"
#include "../temp_dir.h"
#include "traincoord/client.h"

#ifndef TRAINCOORD_SOURCE_DIR
#define TRAINCOORD_SOURCE_DIR "."
#endif
#ifndef TRAINCOORD_BIN
#define TRAINCOORD_BIN "traincoord"
#endif
#ifndef EXAMPLE_WORKER_BIN
#define EXAMPLE_WORKER_BIN "example_worker"
#endif

namespace traincoord::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr milliseconds kTimeout{3'000};
constexpr milliseconds kGiveUp{8'000};
// Generous: the last attempt may begin just before give_up_after and lasts one timeout.
constexpr double kWithinS = 8 + 3 * 2 + 2;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The fixture in MODE on a free loopback port, killed by its pid when this goes out of scope.
class HostileServer {
 public:
  explicit HostileServer(const std::string& mode) : log_(dir_.path() + "/server.log") {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      const std::string script =
          std::string(TRAINCOORD_SOURCE_DIR) + "/tests/hostile/hostile_server.py";
      execl("/usr/bin/python3", "python3", script.c_str(), mode.c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 200 && port_.empty(); ++i) {  // up to 10 s
      const std::string text = read_file(log_);
      if (text.rfind("port ", 0) == 0 && text.find('\n') != std::string::npos) {
        port_ = text.substr(5, text.find('\n') - 5);
      } else {
        std::this_thread::sleep_for(milliseconds(50));
      }
    }
  }
  ~HostileServer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return !port_.empty(); }
  std::string url() const { return "http://127.0.0.1:" + port_; }
  std::string log() const { return read_file(log_); }

 private:
  testing::TempDir dir_;
  std::string log_;
  pid_t pid_ = -1;
  std::string port_;
};

struct Outcome {
  ClientError error;
  bool connected = false;
  double elapsed_s = 0;
};

Options options_for(const std::string& url, bool heartbeats = false) {
  Options o;
  o.url = url;
  o.run = "r";
  o.worker_name = "w0";
  o.connect_timeout = kTimeout;
  o.request_timeout = kTimeout;
  o.give_up_after = kGiveUp;
  o.heartbeats = heartbeats;
  return o;
}

Outcome connect_to(const std::string& mode, size_t max_reply_bytes = kMaxReplyBytes) {
  HostileServer server(mode);
  EXPECT_TRUE(server.started());
  const auto start = steady_clock::now();
  Options options = options_for(server.url());
  options.max_reply_bytes = max_reply_bytes;
  auto w = Worker::connect(options);
  Outcome out;
  out.elapsed_s = std::chrono::duration<double>(steady_clock::now() - start).count();
  out.connected = w.has_value();
  if (!w) out.error = w.error();
  return out;
}

void expect_names_the_request(const Outcome& out) {
  EXPECT_FALSE(out.connected);
  EXPECT_NE(out.error.message.find("/v1/runs/r/workers"), std::string::npos) << out.error.message;
}

TEST(HostileServer, AFieldOfTheWrongTypeIsABadReplyNamingIt) {
  const Outcome out = connect_to("wrong_types");
  expect_names_the_request(out);
  EXPECT_EQ(out.error.code, codes::kBadReply);
  EXPECT_NE(out.error.message.find("heartbeat_interval_ms"), std::string::npos)
      << out.error.message;
}

TEST(HostileServer, AnErrorThatIsNotAnObjectSaysWhatCameBack) {
  const Outcome out = connect_to("error_string");
  expect_names_the_request(out);
  EXPECT_EQ(out.error.code, "http_409");
  EXPECT_NE(out.error.message.find("nope"), std::string::npos) << out.error.message;
}

TEST(HostileServer, ARedirectIsAnErrorSayingWhereItPointed) {
  const Outcome out = connect_to("redirect");
  expect_names_the_request(out);
  EXPECT_EQ(out.error.code, "http_302");
  EXPECT_NE(out.error.message.find("HTTP 302 Found, to http://127.0.0.1:9/elsewhere"),
            std::string::npos)
      << out.error.message;
}

// An announced length over the cap is refused before a byte of the body is read; an endless
// chunked body once the cap is read (a smaller cap than the default here: 64 MiB read under
// ASan on two busy cores took longer than the request's deadline, and the test would measure
// the machine, not the client).
TEST(HostileServer, AReplyOverTheCapIsRefusedNotRetried) {
  for (const auto& [mode, cap, cap_text] : {std::tuple{"huge", kMaxReplyBytes, "64 MiB"},
                                            std::tuple{"chunked", size_t{4} << 20, "4 MiB"}}) {
    const Outcome out = connect_to(mode, cap);
    expect_names_the_request(out);
    EXPECT_EQ(out.error.code, codes::kBadReply) << mode;
    EXPECT_NE(out.error.message.find(cap_text), std::string::npos) << out.error.message;
    EXPECT_LT(out.elapsed_s, kWithinS) << mode;
  }
}

// Dripped a byte every 2 s, endless "100 Continue", or no answer at all: given up after
// give_up_after, saying the deadline and the time it applied.
TEST(HostileServer, AReplyThatNeverCompletesIsGivenUpInTheTimeStated) {
  for (const char* mode : {"drip", "continue", "silent"}) {
    const Outcome out = connect_to(mode);
    expect_names_the_request(out);
    EXPECT_EQ(out.error.code, codes::kUnreachable) << mode;
    EXPECT_LT(out.elapsed_s, kWithinS) << mode << ": " << out.error.message;
    EXPECT_GE(out.elapsed_s, 8) << mode;
    EXPECT_NE(out.error.message.find("within the request's deadline of 3 s"), std::string::npos)
        << out.error.message;
    EXPECT_NE(out.error.message.find("(give_up_after 8 s)"), std::string::npos)
        << out.error.message;
    // The time it says it tried is the time it tried (not less by one timeout).
    const auto at = out.error.message.find("for ");
    ASSERT_NE(at, std::string::npos);
    EXPECT_GE(std::stod(out.error.message.substr(at + 4)), 8.0) << out.error.message;
  }
}

TEST(HostileServer, TheHeartbeatIntervalAskedForIsBoundedBelow) {
  HostileServer server("heartbeat0");
  ASSERT_TRUE(server.started());
  {
    auto w = Worker::connect(options_for(server.url(), true));
    ASSERT_TRUE(w.has_value()) << w.error().message;
    std::this_thread::sleep_for(milliseconds(2'000));
  }
  EXPECT_LE(count(server.log(), "/heartbeat"), 30u);  // 100 ms apart at least: about 20
}

// A command run to its end (killed after `limit_s`): how it ended, what it printed, its peak RSS.
struct Ran {
  int status = 0;
  std::string out;
  std::string err;
  long max_rss_kb = 0;
};

Ran run_command(std::vector<std::string> argv, double limit_s) {
  testing::TempDir dir;
  const std::string out = dir.path() + "/out", err = dir.path() + "/err";
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  Ran ran;
  rusage usage{};
  const auto deadline = steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (wait4(pid, &ran.status, WNOHANG, &usage) == 0) {
    if (steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      wait4(pid, &ran.status, 0, &usage);
      ADD_FAILURE() << argv[0] << " still ran after " << limit_s << " s";
      break;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  ran.max_rss_kb = usage.ru_maxrss;
  ran.out = read_file(out);
  ran.err = read_file(err);
  return ran;
}

// A reply nested 200,000 deep crashed `traincoord status` and the example worker (SIGSEGV).
TEST(HostileServer, ANestedReplyCrashesNeitherStatusNorTheExampleWorker) {
  HostileServer server("nested");
  ASSERT_TRUE(server.started());
  const Ran status = run_command({TRAINCOORD_BIN, "status", "r", "--url", server.url()}, 60);
  EXPECT_FALSE(WIFSIGNALED(status.status)) << "signal " << WTERMSIG(status.status);
  EXPECT_TRUE(WIFEXITED(status.status));
  const Ran worker = run_command(
      {EXAMPLE_WORKER_BIN, "--url", server.url(), "--run", "r", "--give-up-after", "8"}, 60);
  EXPECT_FALSE(WIFSIGNALED(worker.status)) << "signal " << WTERMSIG(worker.status);
  ASSERT_TRUE(WIFEXITED(worker.status));
  EXPECT_EQ(WEXITSTATUS(worker.status), 1);
  EXPECT_NE(worker.err.find("bad_reply"), std::string::npos) << worker.err;
}

// A 302 or endless "100 Continue" printed only "example_worker:" or "traincoord: URL: ".
TEST(HostileServer, TheBinariesSayWhatHappenedAndToWhichRequest) {
  {
    HostileServer server("redirect");
    ASSERT_TRUE(server.started());
    const Ran status = run_command({TRAINCOORD_BIN, "status", "r", "--url", server.url()}, 60);
    EXPECT_NE(status.err.find("GET /v1/runs/r was answered HTTP 302 Found, to "
                              "http://127.0.0.1:9/elsewhere"),
              std::string::npos)
        << status.err;
    const Ran worker = run_command({EXAMPLE_WORKER_BIN, "--url", server.url(), "--run", "r"}, 60);
    EXPECT_NE(worker.err.find("POST /v1/runs/r/workers was answered HTTP 302"), std::string::npos)
        << worker.err;
  }
  {
    HostileServer server("continue");
    ASSERT_TRUE(server.started());
    const Ran status = run_command({TRAINCOORD_BIN, "status", "r", "--url", server.url()}, 60);
    EXPECT_NE(status.err.find("no complete reply to GET /v1/runs/r"), std::string::npos)
        << status.err;
    EXPECT_NE(status.err.find("within the request's deadline of 5 s"), std::string::npos)
        << status.err;
  }
}

// An endless chunked body or a 300 MB one: refused at the cap, not read whole.
TEST(HostileServer, AHugeReplyIsNotReadIntoMemory) {
  for (const char* mode : {"huge", "chunked"}) {
    HostileServer server(mode);
    ASSERT_TRUE(server.started());
    const Ran status = run_command({TRAINCOORD_BIN, "status", "r", "--url", server.url()}, 60);
    ASSERT_TRUE(WIFEXITED(status.status)) << mode;
    EXPECT_EQ(WEXITSTATUS(status.status), 1) << mode;
    EXPECT_NE(status.err.find("larger than the client reads (64 MiB"), std::string::npos)
        << status.err;
    // The cap, and some slack. (ASan's quarantine keeps freed buffers: its RSS says nothing.)
    if (!traincoord::testing::kSanitized) {
      EXPECT_LT(status.max_rss_kb, (64 + 100) * 1024) << mode;
    }
  }
}

}  // namespace
}  // namespace traincoord::client
