// Test fixture: a real etcd cluster (Debian's etcd-server) of 1 or 3 members on loopback, on
// free ports, with its data dirs in a temporary folder. Every member is stopped by its PID when
// the cluster goes out of scope (also when the test fails), and the folder removed.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "temp_dir.h"

namespace traincoord::testing {

// HTTPS for the members' client port (the peers talk plain HTTP among themselves): their
// certificate and key, and with `client_ca`, --client-cert-auth (clients must show a
// certificate that CA signed).
struct EtcdTls {
  std::string cert, key, client_ca;
};

class EtcdCluster {
 public:
  // Starts `members` members and waits (at most 20 s) until each answers /health. started()
  // says whether they did; the reason is printed when not. With `tls`, the client port speaks
  // HTTPS only, and /health is read from a plain metrics port.
  explicit EtcdCluster(int members = 3, std::string binary = "etcd",
                       std::optional<EtcdTls> tls = std::nullopt)
      : binary_(std::move(binary)), tls_(std::move(tls)) {
    for (int i = 0; i < members; ++i) {
      Member m;
      m.name = "m" + std::to_string(i);
      m.client_port = free_port();
      m.peer_port = free_port();
      m.health_port = tls_ ? free_port() : m.client_port;
      m.dir = dir_.path() + "/" + m.name;
      members_.push_back(m);
    }
    for (const Member& m : members_) {
      initial_ += (initial_.empty() ? "" : ",") + m.name +
                  "=http://127.0.0.1:" + std::to_string(m.peer_port);
    }
    for (size_t i = 0; i < members_.size(); ++i) launch(i);
    started_ = true;
    for (size_t i = 0; i < members_.size(); ++i) started_ = started_ && wait_healthy(i);
  }
  ~EtcdCluster() {
    for (size_t i = 0; i < members_.size(); ++i) kill(i);
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  bool started() const { return started_; }
  size_t size() const { return members_.size(); }
  // "127.0.0.1:P1,127.0.0.1:P2,...": what --journal etcd://... takes.
  std::string endpoints() const {
    std::string s;
    for (const Member& m : members_) s += (s.empty() ? "" : ",") + endpoint(m);
    return s;
  }
  std::string endpoint(size_t i) const { return endpoint(members_[i]); }
  uint16_t client_port(size_t i) const { return members_[i].client_port; }
  pid_t pid(size_t i) const { return members_[i].pid; }
  const std::string& dir() const { return dir_.path(); }

  // Kills member `i` with SIGKILL and reaps it. Idempotent.
  void kill(size_t i) {
    Member& m = members_[i];
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGCONT);  // (a stopped member dies as well)
    ::kill(m.pid, SIGKILL);
    int status = 0;
    waitpid(m.pid, &status, 0);
    m.pid = -1;
  }
  // Pauses member `i` (SIGSTOP) / lets it go on (SIGCONT).
  // Returns once the kernel shows it stopped (state T; at most ~2 s): kill() only queues the
  // signal, and on a loaded machine a thread of it could still answer a request sent right
  // after (seen once: EtcdClient.FailsOverToAnotherMemberWhenOneIsKilledOrPaused).
  void stop(size_t i) {
    if (members_[i].pid <= 0) return;
    ::kill(members_[i].pid, SIGSTOP);
    const std::string stat = "/proc/" + std::to_string(members_[i].pid) + "/stat";
    for (int tries = 0; tries < 200; ++tries) {
      std::ifstream in(stat);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t paren = text.rfind(')');
      if (paren == std::string::npos || paren + 2 >= text.size()) return;  // (gone)
      if (text[paren + 2] == 'T' || text[paren + 2] == 't') return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  void resume(size_t i) {
    if (members_[i].pid > 0) ::kill(members_[i].pid, SIGCONT);
  }
  // Starts a killed member again on its data dir; returns whether it answers /health.
  bool restart(size_t i) {
    if (members_[i].pid > 0) return true;
    launch(i);
    return wait_healthy(i);
  }

  // Starts killed members again together (one alone cannot be healthy while a majority is
  // gone); returns whether each answers /health.
  bool restart(const std::vector<size_t>& members) {
    for (size_t i : members) {
      if (members_[i].pid <= 0) launch(i);
    }
    bool healthy = true;
    for (size_t i : members) healthy = wait_healthy(i) && healthy;
    return healthy;
  }

  // A plain HTTP exchange with member `i` (its JSON gateway; not with TLS): the reply's body, or
  // "" on failure.
  std::string post(size_t i, const std::string& path, const std::string& json) const {
    return exchange(members_[i].client_port,
                    "POST " + path +
                        " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        "Connection: close\r\nContent-Length: " +
                        std::to_string(json.size()) + "\r\n\r\n" + json);
  }

 private:
  struct Member {
    std::string name, dir;
    uint16_t client_port = 0, peer_port = 0;
    uint16_t health_port = 0;  // the client port, or (TLS) a plain metrics port
    pid_t pid = -1;
  };

  static std::string endpoint(const Member& m) {
    return "127.0.0.1:" + std::to_string(m.client_port);
  }

  // A port nothing listens on now (the kernel's pick for port 0). Another process could take
  // it before etcd binds it; then the member fails to start and the test says so.
  static uint16_t free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return ntohs(addr.sin_port);
  }

  void launch(size_t i) {
    Member& m = members_[i];
    const std::string client =
        (tls_ ? "https" : "http") + std::string("://127.0.0.1:") + std::to_string(m.client_port);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
    std::vector<std::string> argv = {binary_,
                                     "--name=" + m.name,
                                     "--data-dir=" + m.dir,
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=" + initial_,
                                     "--initial-cluster-state=new",
                                     "--initial-cluster-token=traincoord-test",
                                     "--logger=zap",
                                     "--log-outputs=" + dir_.path() + "/" + m.name + ".log"};
    if (tls_) {
      argv.push_back("--cert-file=" + tls_->cert);
      argv.push_back("--key-file=" + tls_->key);
      argv.push_back("--listen-metrics-urls=http://127.0.0.1:" + std::to_string(m.health_port));
      if (!tls_->client_ca.empty()) {
        argv.push_back("--client-cert-auth");
        argv.push_back("--trusted-ca-file=" + tls_->client_ca);
      }
    }
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execvp(cargv[0], cargv.data());
      _exit(127);
    }
    m.pid = pid;
  }

  bool wait_healthy(size_t i) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(members_[i].pid, &status, WNOHANG) == members_[i].pid) {
        std::fprintf(stderr, "etcd member %s exited (see %s/%s.log)\n", members_[i].name.c_str(),
                     dir_.path().c_str(), members_[i].name.c_str());
        return false;
      }
      const std::string health =
          exchange(members_[i].health_port,
                   "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
      if (health.find("\"health\":\"true\"") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::fprintf(stderr, "etcd member %s did not become healthy in 20 s\n",
                 members_[i].name.c_str());
    return false;
  }

  // Sends `request` and returns the body of the reply (everything after the header), or "".
  static std::string exchange(uint16_t port, const std::string& request) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd);
      return "";
    }
    send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string reply;
    while (true) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 2000) <= 0) break;
      char buf[4096];
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    const auto body = reply.find("\r\n\r\n");
    return body == std::string::npos ? "" : reply.substr(body + 4);
  }

  std::string binary_;
  std::optional<EtcdTls> tls_;
  TempDir dir_;
  std::vector<Member> members_;
  std::string initial_;
  bool started_ = false;
};

}  // namespace traincoord::testing
