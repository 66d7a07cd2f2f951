// The HTTP/JSON API of the coordinator, without the network: a request (method, target, body)
// in, a reply (status, JSON body) out. It runs on the engine's thread, owns no socket, and is
// tested directly (api_test.cc). docs/API.md documents every endpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/clock.h"
#include "core/engine.h"
#include "core/run.h"

namespace traincoord {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, e.g. "/v1/runs/a/acquire"
  std::string body;
  std::string authorization;  // the Authorization header, if any (checked by the server)
};

struct HttpReply {
  int status = 200;
  std::string body;   // JSON
  std::string allow;  // for 405: the methods the path allows
  std::string content_type = "application/json";
  std::string headers = {};  // more header lines, each "Name: value\r\n" (the HA leader's term)
};

// An acquire that found nothing to hand out and may wait (long-poll): the server parks it and
// asks again (Api::retry) when something changes or its deadline passes.
struct ParkedAcquire {
  std::string run;
  WorkerId worker = 0;
  std::string group;  // the group the request named (empty: none); see Run::admit
  TimeMs deadline = 0;
  std::optional<Completed> completed;  // when it came with a completion (complete + next) ...
  std::optional<std::vector<Completed>> outcomes;  // ... or with a list of completions
  uint64_t request = 0;                            // the acquire's idempotency id (0: none)
  uint64_t max_jobs = 0;  // "jobs": up to this many, listed (0: not asked; one, as "job")
  // Epochs the run had opened when it was parked: when another opens (with no job for this
  // worker, or it would have one), the acquire is answered "wait" at once, naming the open
  // epoch, so that a worker can enter an epoch the others hold every job of (docs/API.md).
  size_t epochs_opened = 0;
};

// Who may call an endpoint when the coordinator checks tokens (docs/SECURITY.md).
enum class Access {
  kAnyone,  // no token (health, the dashboard's files)
  kRun,     // the run's worker token, or the admin token
  kAdmin,   // the admin token only
};

struct Endpoint;

// What the durable store wants to hear from the API, beyond the log of requests.
class Leadership;  // (server/leadership.h)

class ApiObserver {
 public:
  virtual ~ApiObserver() = default;
  // A run was created through POST /v1/runs, from this JSON config.
  virtual void run_created(const Run& run, std::string_view config_json, TimeMs now) = 0;
  // A completion was accepted (counted).
  virtual void completion_accepted(const Run& run, WorkerId worker, LeaseId lease,
                                   const Completed& completed, const Completion& completion,
                                   TimeMs now) = 0;
  // A run's config was replaced through POST /v1/runs/{run}/config (`run` is the run under
  // it), by this text of this stored format (config/config_file.h).
  virtual void config_changed(const Run& run, std::string_view format, std::string_view text) = 0;
};

// Limits on what clients may make the coordinator hold (docs/SECURITY.md).
struct ApiLimits {
  size_t max_runs = 1000;
  size_t max_workers_per_run = 100'000;
  // Names that identify (workers, groups, nodes, metrics) must be in NFC without invisible
  // characters (check_name_identity, core/user_text.h).
  bool name_identity = true;
  // The longest number a request body may hold, in characters (padding such as 0.5000...0 is
  // refused: the journal keeps each number as it was written).
  size_t max_number_chars = 64;
  // None: for replaying a journal, whose records were accepted under the limits (and the name
  // and number rules) of their day.
  static ApiLimits none() { return {SIZE_MAX, SIZE_MAX, false, SIZE_MAX}; }
};

// What a request (or a parked acquire's retry) did to the state of its run, which says what
// the journal must keep of it (docs/DURABILITY.md): nothing, when it changed nothing (refused,
// or an acquire that found nothing and did nothing else); the request itself, when it changed
// something; only "leases expired at this time", when a refused request expired leases on its
// way (every call first expires what is due) and did nothing else.
enum class Effect { kNone, kChanged, kExpiredOnly };

class Api {
 public:
  // The longest a client may ask an acquire to wait.
  static constexpr TimeMs kMaxWaitMs = 60'000;

  // REQUIRES: `engine` and `clock` outlive the Api; `clock` is the engine's clock.
  Api(Engine& engine, const Clock& clock, ApiLimits limits = {});
  ~Api();
  Api(const Api&) = delete;
  Api& operator=(const Api&) = delete;

  // Handles one request: a reply, or an acquire to park. `endpoint`, where the caller looked it
  // up already: find_endpoint(request.method, request.target) (the table is then scanned once
  // a request, not once for the metrics label and again here).
  std::variant<HttpReply, ParkedAcquire> handle(const HttpRequest& request);
  std::variant<HttpReply, ParkedAcquire> handle(const HttpRequest& request,
                                                const Endpoint* endpoint);

  // Asks again for a parked acquire. Returns the reply when there is one now (a job, the run
  // finished, or `timed_out`: then a "wait" with a retry hint); nullopt to keep waiting.
  // A parked acquire passes the same admission as a request that comes now (Run::admit: the
  // group its worker registered with, and the one it named): refused, it is answered with the
  // refusal (stale_generation when a restore or a new group replaced its group meanwhile) and
  // nothing changes.
  std::optional<HttpReply> retry(const ParkedAcquire& parked, bool timed_out);
  // The refusal a parked acquire would get now from retry() (nullopt: still admitted).
  // Changes nothing.
  std::optional<HttpReply> refusal(const ParkedAcquire& parked) const;

  // What the last handle() or retry() did to its run's state (see Effect).
  Effect effect() const { return effect_; }
  // After a handle() whose effect() is kChanged: what the journal keeps of the request's body,
  // its canonical form (compact JSON of the parsed values; see api.cc). Empty for a request
  // that was not accepted.
  const std::string& journal_body() const { return journal_body_; }
  // After a retry() that changed state and answered a parked complete + next: the reply that
  // retry would have had as a plain acquire, which is how the journal keeps it. Else empty.
  const std::string& retried_as_acquire() const { return retried_as_acquire_; }

  // The run a request target addresses ("/v1/runs/NAME/..."), or empty.
  static std::string_view run_of(std::string_view target);
  // Every endpoint, one row each: what routing, auth, the metrics labels and the fuzzer read.
  static std::span<const Endpoint> endpoints();
  // The endpoint a request is for: a row of endpoints(), the dashboard's files (a GET of "/" or
  // of one segment no row names), or null. With `allow`, also the methods the path's rows
  // allow (", "-separated; empty when no row has that path).
  static const Endpoint* find_endpoint(std::string_view method, std::string_view target,
                                       std::string* allow = nullptr);
  // The endpoint's name, a low-cardinality metrics label ("acquire", "status", ...; "other").
  static std::string_view endpoint_of(std::string_view method, std::string_view target);

  // A request as its handler sees it (api.cc).
  struct Request;

  // The per-run and per-worker series of GET /metrics, in the Prometheus text format (docs/
  // OBSERVABILITY.md). At most kWorkersPerRunInMetrics workers of a run get their own series.
  std::string metrics_text() const;
  static constexpr size_t kWorkersPerRunInMetrics = 200;

  // Expires the leases of every run whose deadline has passed; returns the runs where one did.
  std::vector<std::string> expire_leases();

  // Tells `observer` (null: nobody) of created runs and accepted completions.
  void set_observer(ApiObserver* observer) { observer_ = observer; }
  // The wall clock the replies' dates are read from (null: the system's; a test's manual one).
  // REQUIRES: `wall` outlives the Api.
  void set_wall_clock(const Clock* wall) { wall_ = wall; }

  // High availability (docs/HA.md "Leadership per run"): who leads each run, which GET /v1/runs
  // lists (null: one coordinator alone). REQUIRES: `leadership` outlives the Api.
  void set_leadership(const Leadership* leadership) { leadership_ = leadership; }

  Engine& engine() { return engine_; }

 private:
  std::variant<HttpReply, ParkedAcquire> route(const HttpRequest& request,
                                               const Endpoint* endpoint);

  Result<Completed> complete(Run& run, WorkerId worker, LeaseId lease,
                             const Completion& completion);
  // Several completions, all or nothing: none is applied when one would be refused.
  Result<std::vector<Completed>> complete_all(
      Run& run, WorkerId worker, const std::vector<std::pair<LeaseId, Completion>>& items);

  Engine& engine_;
  const Clock& clock_;
  ApiObserver* observer_ = nullptr;
  const Clock* wall_ = nullptr;             // (set_wall_clock)
  const Leadership* leadership_ = nullptr;  // (set_leadership)
  ApiLimits limits_;
  Effect effect_ = Effect::kNone;
  std::string journal_body_;
  std::string retried_as_acquire_;
  // Set by a request that changed nothing though it was answered 2xx (an acquire that found
  // nothing and left its worker's request bookkeeping as it was; a config change that was a dry
  // run or no change): unless an event was emitted on the way, the journal keeps nothing of it.
  bool changed_nothing_ = false;
  struct ParseArena;
  std::unique_ptr<ParseArena> arena_;  // request bodies are parsed into it (api.cc)
};

// One endpoint: its name (the metrics label), method, path ("{run}": a run's name), who may
// call it, and its handler (null: the coordinator serves it, as GET /metrics).
struct Endpoint {
  std::string_view name;
  std::string_view method;
  std::string_view path;
  Access access;
  std::variant<HttpReply, ParkedAcquire> (*handler)(Api::Request&);
  // A worker's request that may name its group ("group"): served only for the run's current
  // group (or none), else refused stale_generation / restore_required (docs/SEMANTICS.md).
  bool grouped = false;
};

// The JSON error body {"error": {"code", "message", "field"?}} with its HTTP status.
HttpReply error_reply(int status, std::string_view code, std::string_view message,
                      std::string_view field = {});
HttpReply error_reply(const Error& error);

}  // namespace traincoord
