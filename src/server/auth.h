// Bearer tokens: an admin token for the coordinator, and a worker token per run
// (docs/SECURITY.md). Tokens are 256 random bits, kept in files with mode 0600.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "server/api.h"

namespace traincoord {

class Auth {
 public:
  // Keeps tokens in `dir` (created 0700): admin.token, and RUN.token per run. An existing file
  // is read; a missing one is generated.
  static Result<Auth> open(const std::string& dir);

  // The worker token of `run`, made (and saved) on first use: call it for every run served.
  // Fails when it cannot be saved.
  Result<std::string> worker_token(const std::string& run);
  const std::string& admin_token() const { return admin_; }
  std::string admin_token_path() const { return dir_ + "/admin.token"; }
  std::string worker_token_path(const std::string& run) const {
    return dir_ + "/" + run + ".token";
  }

  // Whether `authorization` (the header's value) may make this request: nullopt when it may,
  // else the error reply (401 without a token, 403 with the wrong one). /healthz and the
  // dashboard's static files need no token; creating and cancelling runs need the admin
  // token; everything about one run takes that run's worker token or the admin token; the
  // list of runs and /metrics need the admin token.
  std::optional<HttpReply> check(std::string_view method, std::string_view target,
                                 std::string_view authorization);

 private:
  std::string dir_;
  std::string admin_;
  std::map<std::string, std::string, std::less<>> workers_;
};

// Compares in time that depends only on the lengths, not on where the strings differ.
bool equal_in_constant_time(std::string_view a, std::string_view b);

// Reads a token file (the first line, trimmed).
Result<std::string> read_token_file(const std::string& path);

}  // namespace traincoord
