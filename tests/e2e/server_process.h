// Test helpers: the real traincoord binary as a child process on a free loopback port, stopped
// when the helper goes out of scope (also when the test fails), and a temporary folder.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "../temp_dir.h"

#ifndef TRAINCOORD_BIN
#define TRAINCOORD_BIN "traincoord"
#endif

namespace traincoord::testing {

class ServerProcess {
 public:
  // Starts `traincoord serve ARGS --listen 127.0.0.1:PORT` (PORT 0: any free port) and waits
  // until it says where it listens. Returns null (after printing why) when it does not start.
  // `wrapper`: a command that runs the server (e.g. in a namespace of its own; it must exec
  // it, so that the pid is the server's).
  static std::unique_ptr<ServerProcess> start(const std::vector<std::string>& args,
                                              uint16_t port = 0,
                                              const std::string& binary = TRAINCOORD_BIN,
                                              const std::vector<std::string>& wrapper = {}) {
    int out[2];
    if (pipe(out) != 0) return nullptr;
    std::vector<std::string> argv = wrapper;
    argv.push_back(binary);
    argv.push_back("serve");
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--listen");
    argv.push_back("127.0.0.1:" + std::to_string(port));
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(out[1], 1);
      close(out[0]);
      close(out[1]);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execvp(cargv[0], cargv.data());
      _exit(127);
    }
    close(out[1]);
    std::unique_ptr<ServerProcess> server(new ServerProcess(pid, out[0]));
    if (!server->wait_for_port()) return nullptr;
    return server;
  }

  ~ServerProcess() { kill(SIGKILL); }

  // Sends `sig` and reaps the process. Idempotent.
  void kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  // Sends `sig` (SIGSTOP, SIGCONT, ...) and leaves the process be.
  void signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // https:// when the server said it serves TLS.
  std::string url() const {
    return (tls_ ? "https" : "http") + std::string("://127.0.0.1:") + std::to_string(port_);
  }
  const std::string& output() const { return output_; }
  // What it has written to stdout since it started, waiting at most `ms` for more.
  const std::string& read_output(int ms = 100) {
    while (fd_ >= 0) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, ms) <= 0) break;
      char buf[4096];
      const ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      output_.append(buf, static_cast<size_t>(n));
    }
    return output_;
  }

 private:
  ServerProcess(pid_t pid, int fd) : pid_(pid), fd_(fd) {}

  bool wait_for_port() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    const std::string marker = "://127.0.0.1:";
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      output_.append(buf, static_cast<size_t>(n));
      const auto said = output_.find("listening on http");
      const auto at = said == std::string::npos ? said : output_.find(marker, said);
      if (at != std::string::npos && output_.find('\n', at) != std::string::npos) {
        tls_ = output_.compare(said, 23, "listening on https://12") == 0;
        port_ = static_cast<uint16_t>(std::stoi(output_.substr(at + marker.size())));
        return true;
      }
    }
    std::fprintf(stderr, "traincoord serve did not start; it said:\n%s\n", output_.c_str());
    return false;
  }

  pid_t pid_;
  int fd_;
  uint16_t port_ = 0;
  bool tls_ = false;
  std::string output_;
};

// A TCP connection to 127.0.0.1:port: its descriptor (the caller closes it), or -1.
inline int connect_loopback(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends all of `bytes` on the connection `fd`; false if it failed first.
inline bool send_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Sends raw bytes to 127.0.0.1:port and returns everything read until the server closes or
// `timeout_ms` passes without data.
inline std::string raw_exchange(uint16_t port, const std::string& bytes, int timeout_ms = 2000) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "";
  send_all(fd, bytes);
  std::string reply;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) break;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return reply;
}

// Runs a command and returns its standard output (and its exit status in *status).
inline std::string run_command(const std::string& command, int* status = nullptr) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int s = pclose(p);
  if (status) *status = WIFEXITED(s) ? WEXITSTATUS(s) : -1;
  return out;
}

}  // namespace traincoord::testing

namespace traincoord::testing {

// Opens a connection to 127.0.0.1:port, sends `bytes`, and returns true when the server closes
// it within `within_ms` (reading and dropping whatever it answers).
inline bool server_closes(uint16_t port, const std::string& bytes, int within_ms,
                          int* fd_out = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return true;
  }
  if (!bytes.empty()) send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(within_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      close(fd);
      return true;
    }
  }
  if (fd_out) {
    *fd_out = fd;
  } else {
    close(fd);
  }
  return false;
}

}  // namespace traincoord::testing
