#include "server/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace traincoord {

namespace {

Result<std::string> random_token() {
  unsigned char bytes[32];
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes)) {
    return failed_precondition("cannot read /dev/urandom to make a token");
  }
  std::string hex;
  char buf[3];
  for (unsigned char b : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    hex += buf;
  }
  return hex;
}

// Reads the token at `path`, or makes one and writes it there with mode 0600.
Result<std::string> load_or_make(const std::string& path) {
  if (access(path.c_str(), F_OK) == 0) return read_token_file(path);
  auto token = random_token();
  if (!token) return token;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return failed_precondition("cannot create token file " + path);
  const std::string line = *token + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) return failed_precondition("cannot write token file " + path);
  return token;
}

std::string_view bearer(std::string_view header) {
  constexpr std::string_view kPrefix = "Bearer ";
  if (header.size() <= kPrefix.size() || header.substr(0, kPrefix.size()) != kPrefix) return {};
  return header.substr(kPrefix.size());
}

}  // namespace

bool equal_in_constant_time(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  if (!in || !std::getline(in, token)) return failed_precondition("cannot read token file " + path);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) return failed_precondition("token file " + path + " is empty");
  return token;
}

Result<Auth> Auth::open(const std::string& dir) {
  ::mkdir(dir.c_str(), 0700);
  Auth auth;
  auth.dir_ = dir;
  auto admin = load_or_make(auth.admin_token_path());
  if (!admin) return tl::unexpected(admin.error());
  auth.admin_ = *admin;
  return auth;
}

Result<std::string> Auth::worker_token(const std::string& run) {
  auto it = workers_.find(run);
  if (it != workers_.end()) return it->second;
  auto token = load_or_make(worker_token_path(run));
  if (!token) return token;
  workers_.emplace(run, *token);
  return token;
}

std::optional<HttpReply> Auth::check(std::string_view method, std::string_view target,
                                     std::string_view authorization) {
  const std::string_view endpoint = Api::endpoint_of(method, target);
  if (endpoint == "healthz" || (endpoint == "dashboard" && method == "GET")) return std::nullopt;
  const std::string_view token = bearer(authorization);
  if (token.empty()) {
    return error_reply(401, "unauthorized",
                       "this coordinator needs a token: send 'Authorization: Bearer TOKEN' "
                       "(a run's worker token, or the admin token)");
  }
  if (equal_in_constant_time(token, admin_)) return std::nullopt;
  const std::string_view run = Api::run_of(target);
  const bool admin_only = run.empty() || endpoint == "cancel";
  if (!admin_only) {
    // Only runs served have a token: a request cannot make one appear.
    auto it = workers_.find(run);
    if (it != workers_.end() && equal_in_constant_time(token, it->second)) return std::nullopt;
  }
  return error_reply(403, "forbidden",
                     admin_only ? "this needs the admin token"
                                : "this token is not run " + std::string(run) +
                                      "'s worker token nor the admin token");
}

}  // namespace traincoord
