// Helpers of the HA tests (tests/etcd/): one HTTP request at a time to a coordinator, on a
// connection of its own, for the tests to see every status and header as it was sent; a worker
// process of the C++ client.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "e2e/server_process.h"

namespace traincoord::testing {

struct Reply {
  int status = 0;  // 0: no answer (refused, closed, timed out)
  std::string headers, body;
};

inline uint16_t port_of(const std::string& url) {
  return static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
}

// One request on a connection of its own, answered within `timeout_ms` or not at all.
inline Reply http(const std::string& url, const std::string& method, const std::string& target,
                  const std::string& body = "", int timeout_ms = 3000) {
  const int fd = testing::connect_loopback(port_of(url));
  if (fd < 0) return {};
  const std::string request = method + " " + target +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                              "Content-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string raw;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[8192];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  Reply r;
  const auto end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return {};
  r.status = std::stoi(raw.substr(9, 3));
  r.headers = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  return r;
}

inline std::string header(const Reply& r, const std::string& name) {
  const auto at = r.headers.find("\r\n" + name + ": ");
  if (at == std::string::npos) return "";
  const auto from = at + name.size() + 4;
  return r.headers.substr(from, r.headers.find("\r\n", from) - from);
}

// A worker process of the C++ client (examples/cpp_worker), its output in a file; killed by its
// PID when it goes out of scope.
class WorkerProcess {
 public:
  WorkerProcess(const std::vector<std::string>& args, const std::string& out) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<std::string> argv = args;
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
  }
  ~WorkerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Its exit status once it has exited, waiting at most `seconds` (0: only looks); -1: still
  // running (it is killed by its PID when it goes out of scope). Asked again once it exited,
  // the same status.
  int wait(int seconds) {
    for (int i = 0; pid_ > 0; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (i >= seconds * 20) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace traincoord::testing
