// End-to-end tests of what docs/SECURITY.md promises about request framing, tokens, names and
// the data directory: the real binary on a loopback port, spoken to by raw sockets where the
// bytes on the wire are the point.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <rapidjson/document.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>

#include "core/utf8.h"
#include "server_process.h"
#include "traincoord/client.h"

namespace traincoord {
namespace {

using testing::raw_exchange;
using testing::run_command;
using testing::server_closes;
using testing::ServerProcess;
using testing::TempDir;

constexpr const char* kRun = R"(
name = "e2e"
[data]
train_batches = 4
[schedule]
epochs = 1
)";

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

class Framing : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = ServerProcess::start({"--config", dir_.write("e2e.toml", kRun), "--in-memory"});
    ASSERT_NE(server_, nullptr);
  }
  int workers() {
    auto body = client::get(server_->url(), "/v1/runs/e2e");
    EXPECT_TRUE(body) << body.error().message;
    rapidjson::Document d;
    d.Parse(body ? body->c_str() : "{}");
    return d.HasMember("workers") ? static_cast<int>(d["workers"].Size()) : -1;
  }
  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

// A request smuggled in the body of one whose framing a proxy may read differently.
const std::string kSmuggled =
    "POST /v1/runs/e2e/workers HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n"
    "{\"name\": \"smug\"}";

TEST_F(Framing, ATransferEncodingOtherThanChunkedIs400AndTheConnectionIsClosed) {
  for (const char* te :
       {"chunked, identity", "xchunked", "identity", "gzip, chunked", "chunked;x=1", "gzip"}) {
    // The body is a whole request for a reader that sees no body, and a chunked body (holding
    // valid JSON) for one that decodes `chunked` wherever it is listed.
    const std::string request = std::string("POST /v1/runs/e2e/workers HTTP/1.1\r\nHost: x\r\n") +
                                "Transfer-Encoding: " + te + "\r\n\r\n" + kSmuggled;
    const std::string reply = raw_exchange(server_->port(), request, 5000);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << te << ": " << reply;
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << te << ": " << reply;
    EXPECT_NE(reply.find("\"code\":\"bad_request\""), std::string::npos) << te << ": " << reply;
    EXPECT_EQ(count(reply, "HTTP/1.1 "), 1u) << te << ": a second request was read: " << reply;
  }
  const std::string gzip_chunked =
      "POST /v1/runs/e2e/workers HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
      "e\r\n{\"name\": \"gz\"}\r\n0\r\n\r\n";
  EXPECT_EQ(raw_exchange(server_->port(), gzip_chunked, 5000).rfind("HTTP/1.1 400", 0), 0u);
  const std::string http10 =
      "POST /v1/runs/e2e/workers HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
      "e\r\n{\"name\": \"10\"}\r\n0\r\n\r\n";
  EXPECT_EQ(raw_exchange(server_->port(), http10, 5000).rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(workers(), 0);  // nothing was registered, smuggled or decoded wrongly

  // Plain `chunked` is still read (and the connection kept).
  const std::string chunked =
      "POST /v1/runs/e2e/workers HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "e\r\n{\"name\": \"ok\"}\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string both = raw_exchange(server_->port(), chunked, 1000);
  EXPECT_EQ(both.rfind("HTTP/1.1 200", 0), 0u) << both;
  EXPECT_EQ(count(both, "HTTP/1.1 200"), 2u) << both;
  EXPECT_EQ(workers(), 1);
}

TEST_F(Framing, APostWithoutALengthIs411AndItsConnectionIsClosed) {
  const std::string reply = raw_exchange(
      server_->port(), "POST /v1/runs/e2e/workers HTTP/1.1\r\nHost: x\r\n\r\n" + kSmuggled, 5000);
  EXPECT_EQ(reply.rfind("HTTP/1.1 411", 0), 0u) << reply;
  EXPECT_EQ(count(reply, "HTTP/1.1 "), 1u) << reply;
  EXPECT_EQ(workers(), 0);
}

TEST_F(Framing, AnHttp11RequestNeedsExactlyOneHost) {
  std::string reply = raw_exchange(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n", 5000);
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  EXPECT_NE(reply.find("Host"), std::string::npos) << reply;
  EXPECT_TRUE(server_closes(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n", 5000));
  reply =
      raw_exchange(server_->port(), "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 5000);
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  // HTTP/1.0 may leave it out.
  reply = raw_exchange(server_->port(), "GET /healthz HTTP/1.0\r\n\r\n", 5000);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
}

class Tokens : public ::testing::Test {
 protected:
  // GET or POST with an Authorization header as given; returns the status.
  int status_of(const std::string& method, const std::string& path, const std::string& auth,
                const std::string& body = "") {
    std::string request = method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
    if (!auth.empty()) request += "Authorization: " + auth + "\r\n";
    if (method == "POST") request += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    const std::string reply = raw_exchange(server_->port(), request + "\r\n" + body, 5000);
    return reply.size() > 12 ? std::stoi(reply.substr(9, 3)) : -1;
  }
  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(Tokens, ARunNamedAdminGetsAWorkerTokenOfItsOwnThatCannotAdminister) {
  std::string run = kRun;
  run.replace(run.find("\"e2e\""), 5, "\"admin\"");
  const std::string tokens = dir_.path() + "/tokens";
  server_ = ServerProcess::start(
      {"--config", dir_.write("admin.toml", run), "--in-memory", "--auth", "--token-dir", tokens});
  ASSERT_NE(server_, nullptr);
  EXPECT_NE(server_->output().find(tokens + "/runs/RUN.token"), std::string::npos)
      << server_->output();
  const std::string admin = first_line(tokens + "/admin.token");
  const std::string worker = first_line(tokens + "/runs/admin.token");
  ASSERT_FALSE(admin.empty());
  ASSERT_FALSE(worker.empty());
  EXPECT_NE(worker, admin);
  EXPECT_EQ(status_of("POST", "/v1/runs/admin/workers", "Bearer " + worker, R"({"name": "w"})"),
            200);
  EXPECT_EQ(status_of("GET", "/metrics", "Bearer " + worker), 403);
  EXPECT_EQ(status_of("POST", "/v1/runs/admin/cancel", "Bearer " + worker, "{}"), 403);
  EXPECT_EQ(status_of("POST", "/v1/runs", "Bearer " + worker,
                      R"({"name": "x", "data": {"train_batches": 1}})"),
            403);
  EXPECT_EQ(status_of("GET", "/metrics", "Bearer " + admin), 200);
  // The scheme is case-insensitive (RFC 7235).
  EXPECT_EQ(status_of("GET", "/metrics", "bearer " + admin), 200);
  EXPECT_EQ(status_of("GET", "/metrics", "BEARER " + admin), 200);
  EXPECT_EQ(status_of("GET", "/metrics", "Basic " + admin), 401);
}

TEST_F(Tokens, TheDataDirWhichHoldsTheTokensIsCreatedPrivate) {
  const std::string data = dir_.path() + "/new/data";
  server_ = ServerProcess::start(
      {"--config", dir_.write("e2e.toml", kRun), "--data-dir", data, "--auth"});
  ASSERT_NE(server_, nullptr);
  struct stat st {};
  ASSERT_EQ(stat(data.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((data + "/admin.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((data + "/runs/e2e.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(Tokens, AnOldLayoutsRunTokenFileIsMovedAndKeepsWorking) {
  const std::string tokens = dir_.path() + "/tokens";
  ASSERT_EQ(mkdir(tokens.c_str(), 0700), 0);
  std::ofstream(tokens + "/admin.token")
      << "the-admin-token-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n";
  std::ofstream(tokens + "/e2e.token")
      << "the-worker-token-wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww\n";
  chmod((tokens + "/admin.token").c_str(), 0600);
  chmod((tokens + "/e2e.token").c_str(), 0600);
  server_ = ServerProcess::start(
      {"--config", dir_.write("e2e.toml", kRun), "--in-memory", "--auth", "--token-dir", tokens});
  ASSERT_NE(server_, nullptr);
  EXPECT_NE(server_->output().find("moved run e2e's worker token file"), std::string::npos)
      << server_->output();
  EXPECT_EQ(first_line(tokens + "/runs/e2e.token"),
            "the-worker-token-wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww");
  EXPECT_EQ(status_of("POST", "/v1/runs/e2e/workers",
                      "Bearer the-worker-token-wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww",
                      R"({"name": "w"})"),
            200);
}

// Issue 31, item 18: a token file holding less than a token of the length traincoord makes
// (one character, say) is refused, saying how to have a new one made.
TEST_F(Tokens, AShortTokenInATokenFileIsRefused) {
  const std::string tokens = dir_.path() + "/tokens";
  ASSERT_EQ(mkdir(tokens.c_str(), 0700), 0);
  std::ofstream(tokens + "/admin.token") << "x\n";
  chmod((tokens + "/admin.token").c_str(), 0600);
  int status = 0;
  const std::string said =
      run_command(std::string("timeout 20 ") + TRAINCOORD_BIN + " serve --config " +
                      dir_.write("e2e.toml", kRun) + " --in-memory --auth --token-dir " + tokens +
                      " --listen 127.0.0.1:0 2>&1",
                  &status);
  EXPECT_NE(status, 0) << said;
  EXPECT_NE(said.find(tokens + "/admin.token holds a token of 1 characters"), std::string::npos)
      << said;
  EXPECT_NE(said.find("rm " + tokens + "/admin.token"), std::string::npos) << said;
  EXPECT_EQ(said.find("listening"), std::string::npos) << said;
}

class Names : public Framing {};

TEST_F(Names, InvalidTextInANameIs400NamingTheFieldAndEveryReplyStaysValidUtf8) {
  for (const std::string& name : {std::string("w\xff\xfe"), std::string("\\u001b]0;x\\u0007"),
                                  std::string("a\\u202eb"), std::string(200, 'n')}) {
    const std::string body = "{\"name\": \"" + name + "\"}";
    const std::string reply = raw_exchange(
        server_->port(),
        "POST /v1/runs/e2e/workers HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
            std::to_string(body.size()) + "\r\n\r\n" + body,
        5000);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
    EXPECT_NE(reply.find("\"code\":\"invalid_argument\""), std::string::npos) << reply;
    EXPECT_NE(reply.find("\"field\":\"name\""), std::string::npos) << reply;
    EXPECT_TRUE(utf8::valid(reply)) << reply;
  }
  EXPECT_EQ(workers(), 0);
  auto status = client::get(server_->url(), "/v1/runs/e2e");
  ASSERT_TRUE(status);
  EXPECT_TRUE(utf8::valid(*status));
  auto metrics = client::get(server_->url(), "/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_TRUE(utf8::valid(*metrics));
}

TEST_F(Names, DuplicateKeysAre400NamingTheKeyAndNothingIsCounted) {
  ASSERT_TRUE(client::post(server_->url(), "/v1/runs/e2e/workers", R"({"name": "w"})"));
  ASSERT_TRUE(client::post(server_->url(), "/v1/runs/e2e/acquire", R"({"worker": 0})"));
  auto refused =
      client::post(server_->url(), "/v1/runs/e2e/complete",
                   R"({"worker": 0, "lease": 1, "loss": 1, "metrics": {"acc": 1, "acc": 0}})");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().http_status, 400);
  EXPECT_NE(refused.error().message.find("metrics.acc"), std::string::npos)
      << refused.error().message;
  auto status = client::get(server_->url(), "/v1/runs/e2e");
  ASSERT_TRUE(status);
  rapidjson::Document d;
  d.Parse(status->c_str());
  EXPECT_EQ(d["progress"]["jobs_done"].GetUint64(), 0u);
}

// A coordinator that answers every request with `body` (as one holding data stored before
// names were checked would): for what `traincoord status` prints of it.
class CannedCoordinator {
 public:
  explicit CannedCoordinator(std::string body) : body_(std::move(body)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(fd_, 8);
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (true) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;  // closed: the test is over
        std::string request;
        char buf[4096];
        while (request.find("\r\n\r\n") == std::string::npos) {
          const ssize_t n = recv(c, buf, sizeof buf, 0);
          if (n <= 0) break;
          request.append(buf, static_cast<size_t>(n));
        }
        const std::string reply =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            "Content-Length: " +
            std::to_string(body_.size()) + "\r\n\r\n" + body_;
        send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
        close(c);
      }
    });
  }
  ~CannedCoordinator() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string body_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

TEST(StatusCommand, PrintsStoredTextWithoutAnythingATerminalWouldActOn) {
  // ESC ] 0 ; ... BEL sets the window title; ESC [ 2 J clears the screen; U+009B is CSI.
  const std::string evil = R"(\u001b]0;owned\u0007\u001b[2J\u009b31m\u202egnp.exe)";
  const std::string body = R"({"run":"e2e","state":"running","reason":")" + evil +
                           R"(","plan":{"start_epoch":0,"target_epoch":1,"train_jobs_per_epoch":1,
    "dev_jobs_per_epoch":0,"batches_per_job":1},"progress":{"jobs_done":0,"jobs_planned":1,
    "jobs_per_s":0,"eta_s":null},"current":null,"epochs":[],"early_stop":{"rule":"none",
    "monitor":"loss","best_epoch":null,"best_value":0,"stopped":false,"reason":""},
    "workers":[{"name":")" +
                           evil + "\xff" + R"(","active":true,"jobs_done":0,"leases":[],
    "last_seen_ago_ms":0}],"events":[{"kind":"joined","text":")" +
                           evil + R"("}]})";
  CannedCoordinator coordinator(body);
  int code = -1;
  const std::string out =
      run_command(std::string(TRAINCOORD_BIN) + " status e2e --url " + coordinator.url(), &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("run e2e: running"), std::string::npos) << out;
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  EXPECT_EQ(out.find('\x07'), std::string::npos) << out;
  EXPECT_EQ(out.find("\xc2\x9b"), std::string::npos) << out;
  EXPECT_EQ(out.find("\xe2\x80\xae"), std::string::npos) << out;
  EXPECT_NE(out.find("\\x1b]0;owned\\x07\\x1b[2J\\u{009b}31m\\u{202e}gnp.exe"), std::string::npos)
      << out;
  EXPECT_TRUE(utf8::valid(out)) << out;
}

}  // namespace
}  // namespace traincoord
