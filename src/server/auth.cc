#include "server/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/rand.h>

#include "core/run_config.h"

namespace traincoord {

namespace {

Result<std::string> random_token() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    char why[256];
    ERR_error_string_n(ERR_get_error(), why, sizeof why);
    return failed_precondition(std::string("cannot make a token: OpenSSL's random generator ") +
                               "failed (" + why + "); check that the system can seed it");
  }
  std::string hex;
  char buf[3];
  for (unsigned char b : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    hex += buf;
  }
  return hex;
}

// Makes the token dir `dir` (0700) if it is missing, or `name` in it (runs/). Refuses one that
// is not the user's or root's, or that others may write to: they could put a token file of
// their own in it, or a link the server would write a token through (DataDir::open). runs/
// must be a directory in it, not a link to one elsewhere.
Result<DataDir> secure_dir(const std::string& dir, const DataDir* parent = nullptr,
                           const char* name = nullptr) {
  const int made = parent ? ::mkdirat(parent->fd(), name, 0700) : ::mkdir(dir.c_str(), 0700);
  if (made != 0 && errno != EEXIST) {
    return failed_precondition("cannot create token dir " + dir + ": " + std::strerror(errno));
  }
  if (parent) {
    struct stat st {};
    if (::fstatat(parent->fd(), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) {
      return failed_precondition("token dir " + dir +
                                 " is not a directory (a link is not followed): remove it (rm " +
                                 dir + "); a new one is made at the next start");
    }
  }
  return DataDir::open(dir, /*read_only=*/false, "token dir");
}

// Reads the token `name` in `dir` (refusing a link, a file others could have written or may
// read, or a token shorter than those traincoord makes), or makes one and writes it there with
// mode 0600.
Result<std::string> load_or_make(const DataDir& dir, const std::string& name) {
  const std::string path = dir.path_of(name);
  if (dir.exists(name)) {
    auto fd = dir.open_file(name, O_RDONLY);
    if (!fd) return tl::unexpected(fd.error());
    struct stat st {};
    const bool stat_ok = ::fstat(*fd, &st) == 0;
    if (!stat_ok || (st.st_mode & 077) != 0) {
      ::close(*fd);
      return failed_precondition("token file " + path + " (mode " + mode_text(st.st_mode) +
                                 ") may be read or written by other users: chmod 600 " + path +
                                 " (and replace the token if they may have read it)");
    }
    std::string text(4096, '\0');
    const ssize_t n = ::pread(*fd, text.data(), text.size(), 0);
    ::close(*fd);
    if (n < 0) return failed_precondition("cannot read token file " + path);
    text.resize(static_cast<size_t>(n));
    std::string token = text.substr(0, text.find('\n'));
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
    return check_token(token, path);
  }
  auto token = random_token();
  if (!token) return token;
  auto fd = dir.open_file(name, O_WRONLY | O_CREAT | O_EXCL);
  if (!fd) return tl::unexpected(fd.error());
  const std::string line = *token + "\n";
  const bool ok = ::write(*fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(*fd);
  if (!ok) return failed_precondition("cannot write token file " + path);
  return token;
}

bool iequals_ascii(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

}  // namespace

Result<std::string> check_token(const std::string& token, const std::string& path) {
  bool printable = true;
  for (unsigned char c : token) printable = printable && c > ' ' && c < 0x7F;
  if (token.size() < kTokenChars || !printable) {
    return failed_precondition(
        "token file " + path + " holds " +
        (printable ? "a token of " + std::to_string(token.size()) + " characters"
                   : std::string("a token with spaces or control characters")) +
        "; a token must be at least " + std::to_string(kTokenChars) +
        " printable characters (the 256 random bits in hex that traincoord makes): remove the "
        "file (rm " +
        path + ") and restart to have a new one made, or put such a token in it");
  }
  return token;
}

std::string_view bearer_token(std::string_view header) {
  // credentials = auth-scheme [ 1*SP token68 ]; the scheme is case-insensitive (RFC 7235 2.1).
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size() ||
      !iequals_ascii(header.substr(0, kScheme.size()), kScheme) || header[kScheme.size()] != ' ') {
    return {};
  }
  std::string_view token = header.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
  return token;
}

bool equal_in_constant_time(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
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
  Auth auth;
  auth.dir_ = dir;
  auto top = secure_dir(dir);
  if (!top) return tl::unexpected(top.error());
  auth.top_ = std::make_shared<DataDir>(std::move(*top));
  const bool had_admin = auth.top_->exists("admin.token");
  const bool had_runs = auth.top_->exists("runs");
  auth.old_layout_ = had_admin && !had_runs;
  auto runs = secure_dir(dir + "/runs", auth.top_.get(), "runs");
  if (!runs) return tl::unexpected(runs.error());
  auth.runs_ = std::make_shared<DataDir>(std::move(*runs));
  auto admin = load_or_make(*auth.top_, "admin.token");
  if (!admin) return tl::unexpected(admin.error());
  auth.admin_ = *admin;
  return auth;
}

Result<std::string> Auth::worker_token(const std::string& run) {
  auto it = workers_.find(run);
  if (it != workers_.end()) return it->second;
  // The name becomes part of a path: only names that cannot leave runs/ (validate_run_name).
  if (auto r = validate_run_name(run, "run"); !r) return tl::unexpected(r.error());
  const std::string path = worker_token_path(run);
  const std::string name = run + ".token";
  struct stat st {};
  if (!runs_->exists(name)) {
    const std::string old_path = dir_ + "/" + run + ".token";
    if (run == "admin") {
      // DIR/admin.token was this run's worker token as well as the admin token.
      if (old_layout_) {
        notices_.push_back(
            "run admin gets a worker token of its own in " + path +
            "; before, its workers were handed the admin token (" + admin_token_path() +
            "): if they are not all trusted with it, delete that file and restart to replace it");
      }
    } else if (::fstatat(top_->fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (::renameat(top_->fd(), name.c_str(), runs_->fd(), name.c_str()) != 0) {
        return failed_precondition("cannot move token file " + old_path + " to " + path + ": " +
                                   std::strerror(errno));
      }
      notices_.push_back("moved run " + run + "'s worker token file " + old_path + " to " + path +
                         " (the token is unchanged; point TRAINCOORD_TOKEN_FILE there)");
    }
  }
  auto token = load_or_make(*runs_, name);
  if (!token) return token;
  workers_.emplace(run, *token);
  return token;
}

std::optional<HttpReply> Auth::check(std::string_view method, std::string_view target,
                                     std::string_view authorization) {
  return check(Api::find_endpoint(method, target), target, authorization);
}

std::optional<HttpReply> Auth::check(const Endpoint* endpoint, std::string_view target,
                                     std::string_view authorization) {
  // Who may call it is the endpoint table's to say. A request no row takes (a 404 or 405 then)
  // needs the token of the run it names, else the admin token.
  const Access access = endpoint                      ? endpoint->access
                        : Api::run_of(target).empty() ? Access::kAdmin
                                                      : Access::kRun;
  if (access == Access::kAnyone) return std::nullopt;
  const std::string_view token = bearer_token(authorization);
  if (token.empty()) {
    return error_reply(401, "unauthorized",
                       "this coordinator needs a token: send 'Authorization: Bearer TOKEN' "
                       "(a run's worker token, or the admin token)");
  }
  if (equal_in_constant_time(token, admin_)) return std::nullopt;
  const std::string_view run = Api::run_of(target);
  const bool admin_only = access == Access::kAdmin || run.empty();
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
