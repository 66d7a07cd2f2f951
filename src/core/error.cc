#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace traincoord {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kConflict:
      return "conflict";
    case ErrorCode::kFailedPrecondition:
      return "failed_precondition";
  }
  return "unknown";
}

std::string_view error_name(const Error& error) {
  return error.reason.empty() ? error_code_name(error.code) : error.reason;
}

void assertion_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "traincoord: invariant broken: %s (%s:%d)\n", expr, file, line);
  std::abort();
}

}  // namespace traincoord
