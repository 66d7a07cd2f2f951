// Errors as values: every expected failure of the core is an Error inside a Result.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <tl/expected.hpp>

namespace traincoord {

// What kind of failure; the network layer maps each to an HTTP status.
enum class ErrorCode {
  kInvalidArgument,     // bad input: a config field or request field (HTTP 400)
  kNotFound,            // unknown run, worker, job or lease (HTTP 404)
  kConflict,            // e.g. a lease that belongs to another worker (HTTP 409)
  kFailedPrecondition,  // the run is in a state that does not allow the call (HTTP 409)
};

std::string_view error_code_name(ErrorCode code);

// The specific codes a program acts on (docs/API.md has the table: the HTTP status, when, what a
// client should do). They go out as the JSON error's "code"; an error without one goes out under
// the generic name of its ErrorCode. Stable: a client matches them, so a code is never renamed.
namespace error_reason {
inline constexpr std::string_view kRunNotFound = "run_not_found";                  // kNotFound
inline constexpr std::string_view kRunExists = "run_exists";                       // kConflict
inline constexpr std::string_view kWorkerNotRegistered = "worker_not_registered";  // kNotFound
inline constexpr std::string_view kLeaseUnknown = "lease_unknown";                 // kNotFound
inline constexpr std::string_view kLeaseNotYours = "lease_not_yours";              // kConflict
inline constexpr std::string_view kEpochNotStarted = "epoch_not_started";  // kFailedPrecondition
// Checkpoint cuts and groups (docs/SEMANTICS.md, "Checkpoint cuts").
inline constexpr std::string_view kStaleGeneration = "stale_generation";  // kFailedPrecondition
inline constexpr std::string_view kRestoreRequired = "restore_required";  // kFailedPrecondition
inline constexpr std::string_view kLeaseNotHeld = "lease_not_held";       // kConflict
inline constexpr std::string_view kCutMismatch = "cut_mismatch";          // kConflict
inline constexpr std::string_view kCutNotFound = "cut_not_found";         // kNotFound
inline constexpr std::string_view kCutIncomplete = "cut_incomplete";      // kFailedPrecondition
inline constexpr std::string_view kRestoreConflict = "restore_conflict";  // kConflict
inline constexpr std::string_view kRunCancelled = "run_cancelled";        // kFailedPrecondition
// The rendezvous of launch agents (docs/LAUNCH.md).
inline constexpr std::string_view kNodeSecretMismatch = "node_secret_mismatch";  // kConflict
inline constexpr std::string_view kRendezvousFull = "rendezvous_full";           // kConflict
inline constexpr std::string_view kRendezvousSettingsConflict =
    "rendezvous_settings_conflict";                                   // kConflict
inline constexpr std::string_view kGroupMismatch = "group_mismatch";  // kConflict
// Step mode (docs/SEMANTICS.md, "Step mode").
inline constexpr std::string_view kWorldSizeMismatch = "world_size_mismatch";  // kConflict
inline constexpr std::string_view kRankRequired = "rank_required";  // kFailedPrecondition
// High availability (docs/HA.md): this coordinator does not lead the run (HTTP 421).
inline constexpr std::string_view kNotLeader = "not_leader";  // kFailedPrecondition
}  // namespace error_reason

struct Error {
  ErrorCode code;
  std::string message;  // says what was wrong and what to do
  std::string field;    // for kInvalidArgument: the offending field, if any
  // The specific code a program acts on (a constant of error_reason: static storage); empty
  // for errors no program reacts to.
  std::string_view reason = {};
};

// The code a program sees for `error`: its reason, else error_code_name(error.code).
std::string_view error_name(const Error& error);

// A value or the Error that says why there is none. [[nodiscard]]: a call whose Result is
// dropped is a compiler warning, so no failure goes unnoticed. Where dropping one is right,
// cast it to (void) and say why. Everything of tl::expected works on it (`return value;`,
// `return invalid_argument(...);`, `if (!r) r.error()`, `*r`, `r->`).
template <typename T>
class [[nodiscard]] Result : public tl::expected<T, Error> {
 public:
  using Base = tl::expected<T, Error>;
  using Base::Base;
  Result() = default;
  // From what tl::expected's own members (map, and_then, ...) return.
  Result(const Base& other) : Base(other) {}        // NOLINT(google-explicit-constructor)
  Result(Base&& other) : Base(std::move(other)) {}  // NOLINT(google-explicit-constructor)
};

inline tl::unexpected<Error> invalid_argument(std::string field, std::string message) {
  return tl::unexpected(Error{ErrorCode::kInvalidArgument, std::move(message), std::move(field)});
}
// `reason`: a constant of error_reason, or empty (see Error::reason).
inline tl::unexpected<Error> not_found(std::string message, std::string_view reason = {}) {
  return tl::unexpected(Error{ErrorCode::kNotFound, std::move(message), {}, reason});
}
inline tl::unexpected<Error> conflict(std::string message, std::string_view reason = {}) {
  return tl::unexpected(Error{ErrorCode::kConflict, std::move(message), {}, reason});
}
inline tl::unexpected<Error> failed_precondition(std::string message,
                                                 std::string_view reason = {}) {
  return tl::unexpected(Error{ErrorCode::kFailedPrecondition, std::move(message), {}, reason});
}

}  // namespace traincoord

// Invariants: a broken one stops the program loudly, in every build type.
#define TC_ASSERT(cond)                                                     \
  do {                                                                      \
    if (!(cond)) ::traincoord::assertion_failed(#cond, __FILE__, __LINE__); \
  } while (0)

namespace traincoord {
[[noreturn]] void assertion_failed(const char* expr, const char* file, int line);
}  // namespace traincoord
