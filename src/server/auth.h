// Bearer tokens: an admin token for the coordinator, and a worker token per run
// (docs/SECURITY.md). Tokens are 256 random bits (OpenSSL's RAND_bytes), kept in files with
// mode 0600.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <memory>

#include "core/error.h"
#include "server/api.h"
#include "store/data_dir.h"

namespace traincoord {

class Auth {
 public:
  // Keeps tokens in `dir`: the admin token in DIR/admin.token, each run's worker token in
  // DIR/runs/RUN.token, two namespaces whatever a run is called. Both folders are created 0700.
  // An existing token file is read; a missing one is generated. Fails, naming the path, when a
  // folder is not the user's (or root's) or other users may write to it (runs/ a link), or when
  // a token file is not a regular file of the user's with one link that only the user may read
  // and write (another user could have put a token they know there), or holds a token shorter
  // than kTokenChars. Files are opened through the folders' descriptors, never through a link.
  static Result<Auth> open(const std::string& dir);

  // The worker token of `run`, made (and saved) on first use: call it for every run served.
  // Fails when `run` is not a valid run name (validate_run_name) or the token cannot be saved.
  // A token file of the layout before runs/ (DIR/RUN.token, RUN not "admin") is moved to
  // DIR/runs/RUN.token, keeping the token; see notices().
  Result<std::string> worker_token(const std::string& run);
  const std::string& admin_token() const { return admin_; }
  std::string admin_token_path() const { return dir_ + "/admin.token"; }
  std::string worker_token_path(const std::string& run) const {
    return dir_ + "/runs/" + run + ".token";
  }
  const std::string& dir() const { return dir_; }

  // What the operator should be told, since the last call: token files moved from the old
  // layout, and a run named "admin" whose workers were given the admin token by that layout.
  std::vector<std::string> take_notices() { return std::move(notices_); }

  // Whether `authorization` (the header's value) may make this request: nullopt when it may,
  // else the error reply (401 without a token, 403 with the wrong one). The scheme `Bearer` is
  // matched in any case (RFC 7235). /healthz and the dashboard's static files need no token;
  // creating and cancelling runs need the admin token; everything about one run takes that
  // run's worker token or the admin token; the list of runs and /metrics need the admin token.
  std::optional<HttpReply> check(std::string_view method, std::string_view target,
                                 std::string_view authorization);
  // The same, with `endpoint` = Api::find_endpoint(method, target) already looked up.
  std::optional<HttpReply> check(const Endpoint* endpoint, std::string_view target,
                                 std::string_view authorization);

 private:
  std::string dir_;
  std::shared_ptr<DataDir> top_, runs_;  // dir_ and dir_/runs, open
  std::string admin_;
  bool old_layout_ = false;  // admin.token was there before runs/ was
  std::map<std::string, std::string, std::less<>> workers_;
  std::vector<std::string> notices_;
};

// Compares in time that depends only on the lengths, not on where the strings differ
// (CRYPTO_memcmp).
bool equal_in_constant_time(std::string_view a, std::string_view b);

// The length of the tokens traincoord makes (256 random bits in hex), and the least it accepts
// in a token file.
inline constexpr size_t kTokenChars = 64;

// `token` (read from `path`) if it is at least kTokenChars printable characters without
// spaces; else an error saying how to have a new one made.
Result<std::string> check_token(const std::string& token, const std::string& path);

// Reads a token file (the first line, trimmed).
Result<std::string> read_token_file(const std::string& path);

// The credentials of an Authorization header of the Bearer scheme (in any case, RFC 7235), or
// empty when it is not one.
std::string_view bearer_token(std::string_view authorization);

}  // namespace traincoord
