#include "server/api.h"

#include <algorithm>
#include <cassert>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <boost/container/small_vector.hpp>

#include "config/config_change.h"
#include "config/config_file.h"
#include "core/user_text.h"
#include "json/duplicate_keys.h"
#include "json/json_writer.h"
#include "server/history_view.h"
#include "server/leadership.h"
#include "server/metrics.h"
#include "server/metrics_text.h"
#include "server/status_view.h"
#include "server/wall_time.h"

namespace traincoord {

namespace {

int http_status(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return 400;
    case ErrorCode::kNotFound:
      return 404;
    case ErrorCode::kConflict:
    case ErrorCode::kFailedPrecondition:
      return 409;
  }
  return 500;
}

HttpReply ok(JsonWriter& json) { return HttpReply{200, json.take(), {}, "application/json"}; }

// A request body's document: its values and its parse stack in the Api's arena.
using BodyDocument = rapidjson::GenericDocument<rapidjson::UTF8<>, rapidjson::MemoryPoolAllocator<>,
                                                rapidjson::MemoryPoolAllocator<>>;

// The fields of a JSON object (a body, or an item of a list in it). Every field read is
// remembered, so that a field the endpoint does not know is refused by name (a typo such as
// "sample" must not be silently ignored).
class Fields {
 public:
  // `name_identity`: names (TextKind::kName strings, metric names) must also pass
  // check_name_identity (off when replaying what was accepted before that rule).
  Fields(const rapidjson::Value& object, bool name_identity)
      : object_(object), name_identity_(name_identity) {}

  bool name_identity() const { return name_identity_; }

  const rapidjson::Value* get(const char* key) {
    known_.push_back(key);
    auto it = object_.FindMember(key);
    return it == object_.MemberEnd() ? nullptr : &it->value;
  }

  bool has(const char* key) const { return object_.HasMember(key); }

  Result<uint64_t> uint(const char* key, std::optional<uint64_t> fallback = std::nullopt,
                        uint64_t max = uint64_t{1} << 53) {
    const rapidjson::Value* v = get(key);
    if (!v) {
      if (fallback) return *fallback;
      return invalid_argument(key, std::string(key) + " is required");
    }
    if (!v->IsUint64() || v->GetUint64() > max) {
      return invalid_argument(
          key, std::string(key) + " must be an integer from 0 to " + std::to_string(max));
    }
    return v->GetUint64();
  }

  // A number; null, NaN and infinities read as NaN (a non-finite loss is data, not an error).
  Result<double> number(const char* key) {
    const rapidjson::Value* v = get(key);
    if (!v) return invalid_argument(key, std::string(key) + " is required");
    if (v->IsNull()) return std::nan("");
    if (!v->IsNumber()) return invalid_argument(key, std::string(key) + " must be a number");
    return v->GetDouble();
  }

  // A string, checked as user text of `kind` (user_text.h): every string a client sends is,
  // since it may be stored and shown back.
  Result<std::string> string(const char* key, std::optional<std::string> fallback = std::nullopt,
                             size_t max_bytes = 256, TextKind kind = TextKind::kName) {
    const rapidjson::Value* v = get(key);
    if (!v) {
      if (fallback) return *fallback;
      return invalid_argument(key, std::string(key) + " is required");
    }
    if (!v->IsString()) return invalid_argument(key, std::string(key) + " must be a string");
    const std::string_view text(v->GetString(), v->GetStringLength());
    if (auto r = validate_text(key, text, max_bytes, kind); !r) return tl::unexpected(r.error());
    if (kind == TextKind::kName && name_identity_) {
      if (auto r = check_name_identity(key, text); !r) return tl::unexpected(r.error());
    }
    return std::string(text);
  }

  Result<bool> boolean(const char* key, bool fallback) {
    const rapidjson::Value* v = get(key);
    if (!v) return fallback;
    if (!v->IsBool()) return invalid_argument(key, std::string(key) + " must be true or false");
    return v->GetBool();
  }

  Result<void> no_unknown_fields() const {
    for (auto it = object_.MemberBegin(); it != object_.MemberEnd(); ++it) {
      const std::string_view name(it->name.GetString(), it->name.GetStringLength());
      if (std::find(known_.begin(), known_.end(), name) == known_.end()) {
        return invalid_argument(std::string(name),
                                "unknown field " + std::string(name) + " (see docs/API.md)");
      }
    }
    return {};
  }

 private:
  const rapidjson::Value& object_;
  bool name_identity_;
  // The keys read: literals, a handful per endpoint, so a short list scanned beats a set of
  // strings (which cost an allocation per field per request on the hot path); kept inline.
  boost::container::small_vector<std::string_view, 16> known_;
};

#define TC_TRY_ASSIGN(var, expr)                               \
  auto var##_result = (expr);                                  \
  if (!var##_result) return error_reply(var##_result.error()); \
  auto var = std::move(*var##_result)

#define TC_TRY_REPLY(expr)                                     \
  do {                                                         \
    if (auto r_ = (expr); !r_) return error_reply(r_.error()); \
  } while (0)

constexpr size_t kMaxMetrics = 32;
constexpr size_t kMaxGroupBytes = 128;

Result<Completion> read_completion(Fields& body) {
  Completion c;
  auto loss = body.number("loss");
  if (!loss) return tl::unexpected(loss.error());
  c.loss = *loss;
  auto samples = body.uint("samples", uint64_t{0});
  if (!samples) return tl::unexpected(samples.error());
  c.samples = *samples;
  // The batch's time (step mode: what the cost model is fitted from; ignored otherwise).
  if (const rapidjson::Value* seconds = body.get("seconds")) {
    if (!seconds->IsNumber() || !std::isfinite(seconds->GetDouble()) || seconds->GetDouble() < 0 ||
        seconds->GetDouble() > 1e9) {
      return invalid_argument("seconds",
                              "seconds (the batch's time) must be a number from 0 to 1e9");
    }
    c.seconds = seconds->GetDouble();
  }
  if (const rapidjson::Value* m = body.get("metrics")) {
    if (!m->IsObject()) return invalid_argument("metrics", "metrics must be an object of numbers");
    if (m->MemberCount() > kMaxMetrics) {
      return invalid_argument("metrics", "at most " + std::to_string(kMaxMetrics) + " metrics");
    }
    for (auto it = m->MemberBegin(); it != m->MemberEnd(); ++it) {
      const std::string name(it->name.GetString(), it->name.GetStringLength());
      if (auto r = validate_text("metric name", name, 64); !r) {
        return invalid_argument("metrics", r.error().message);
      }
      if (body.name_identity()) {
        if (auto r = check_name_identity("metric name", name); !r) {
          return invalid_argument("metrics", r.error().message);
        }
      }
      if (!it->value.IsNumber() && !it->value.IsNull()) {
        return invalid_argument("metrics." + name, "metric " + name + " must be a number");
      }
      c.metrics.push_back({name, it->value.IsNull() ? std::nan("") : it->value.GetDouble()});
    }
  }
  return c;
}

// Jobs one request may take ("jobs") or complete ("completions").
constexpr uint64_t kMaxJobsPerRequest = 64;

using LeaseCompletion = std::pair<LeaseId, Completion>;

// "completions": [{"lease": L, "loss": X, "samples": N, "metrics": {...}}, ...], each item
// checked as the single form is; an error names the item ("completions[2].loss").
Result<std::vector<LeaseCompletion>> read_completions(Fields& body) {
  const rapidjson::Value* list = body.get("completions");
  if (!list->IsArray() || list->Empty() || list->Size() > kMaxJobsPerRequest) {
    return invalid_argument(
        "completions", "completions must be a list of 1 to " + std::to_string(kMaxJobsPerRequest) +
                           " objects {\"lease\": L, \"loss\": X, \"samples\": N}");
  }
  std::vector<LeaseCompletion> items;
  items.reserve(list->Size());
  for (rapidjson::SizeType i = 0; i < list->Size(); ++i) {
    const rapidjson::Value& item = (*list)[i];
    const std::string where = "completions[" + std::to_string(i) + "]";
    if (!item.IsObject()) return invalid_argument(where, where + " must be an object");
    Fields fields(item, body.name_identity());
    auto lease = fields.uint("lease");
    Result<Completion> completion = Completion{};
    if (lease) completion = read_completion(fields);
    Result<void> unknown = completion ? fields.no_unknown_fields() : Result<void>{};
    for (const Error* e :
         {lease ? nullptr : &lease.error(), completion ? nullptr : &completion.error(),
          unknown ? nullptr : &unknown.error()}) {
      if (e) return invalid_argument(where + "." + e->field, where + ": " + e->message);
    }
    items.emplace_back(*lease, std::move(*completion));
  }
  return items;
}

// "jobs": N (1 to 64): hand out up to N jobs, listed under "jobs". 0: not asked (one, "job").
Result<uint64_t> read_jobs(Fields& body) {
  if (!body.has("jobs")) return uint64_t{0};
  auto jobs = body.uint("jobs", std::nullopt, kMaxJobsPerRequest);
  if (jobs && *jobs == 0) {
    return invalid_argument(
        "jobs", "jobs must be an integer from 1 to " + std::to_string(kMaxJobsPerRequest));
  }
  return jobs;
}

void write_job(JsonWriter& j, const Run& run, const Job& job, TimeMs now) {
  std::vector<uint64_t> batches;
  if (!job.step_mode) {
    batches.reserve(job.positions.count);
    run.batches_of(job, &batches);
  }
  j.begin_object();
  j.field("lease", job.lease);
  j.field("attempt", job.attempt);
  j.field("set", set_name(job.set));
  j.field("epoch", job.epoch);
  j.field("index", job.index);
  j.field("jobs_in_epoch", job.jobs_in_epoch);
  j.key("batches").begin_array();
  for (uint64_t b : batches) j.value(b);
  j.end_array();
  if (job.step_mode) {  // (its batch is the samples listed, not a batch of the set)
    j.field("rank", static_cast<uint64_t>(job.rank));
    j.field("step", job.step);
    j.field("steps", job.steps);
    j.field("loss_scale", job.loss_scale);
    j.key("samples").begin_array();
    for (uint64_t s : job.samples) j.value(s);
    j.end_array();
  }
  j.field("lease_expires_in_ms", job.deadline - now);
  j.end_object();
}

// `listed`: the acquire asked for "jobs": N, and the reply lists them under "jobs".
void write_acquired(JsonWriter& j, const Run& run, const Acquired& a, TimeMs now, bool listed) {
  j.begin_object();
  j.field("epochs_opened", static_cast<uint64_t>(run.epochs().size()));
  switch (a.status) {
    case AcquireStatus::kJob:
      j.field("status", "job");
      if (run.warming_up(a.job) || std::any_of(a.more.begin(), a.more.end(), [&](const Job& more) {
            return run.warming_up(more);
          })) {
        j.field("warming_up", true);
      }
      if (listed) {
        j.key("jobs").begin_array();
        write_job(j, run, a.job, now);
        for (const Job& more : a.more) write_job(j, run, more, now);
        j.end_array();
      } else {
        j.key("job");
        write_job(j, run, a.job, now);
      }
      break;
    case AcquireStatus::kWait: {
      j.field("status", "wait");
      j.field("retry_after_ms", a.retry_after_ms);
      // The oldest epoch still open (its last jobs held by other workers), or null.
      const Epoch* open = nullptr;
      for (auto it = run.epochs().rbegin(); it != run.epochs().rend(); ++it) {
        if (!it->closed()) {
          open = &*it;
        } else if (open != nullptr) {
          break;
        }
      }
      j.key("open");
      if (open != nullptr) {
        j.begin_object().field("set", set_name(open->plan.set)).field("epoch", open->plan.epoch);
        j.end_object();
      } else {
        j.null();
      }
      break;
    }
    case AcquireStatus::kFinished:
      j.field("status", "finished");
      j.field("state", run_state_name(run.state()));
      j.field("reason", run.state_reason());
      break;
  }
  j.end_object();
}

void write_completed(JsonWriter& j, const Completed& c) {
  j.field("outcome", completion_outcome_name(c.outcome));
  j.field("counted", c.counted());
}

void write_outcomes(JsonWriter& j, const std::vector<Completed>& outcomes) {
  j.key("outcomes").begin_array();
  for (const Completed& c : outcomes) {
    j.begin_object();
    write_completed(j, c);
    j.end_object();
  }
  j.end_array();
}

// The reply to an acquire, or to a complete with "next" (its outcomes first, the acquire under
// "next"); `shape` says which, and whether jobs are listed.
HttpReply acquired_reply(const Run& run, const ParkedAcquire& shape, const Acquired& a,
                         TimeMs now) {
  JsonWriter j;
  const bool listed = shape.max_jobs > 0;
  if (shape.completed || shape.outcomes) {
    j.begin_object();
    if (shape.completed) {
      write_completed(j, *shape.completed);
    } else {
      write_outcomes(j, *shape.outcomes);
    }
    j.key("next");
    write_acquired(j, run, a, now, listed);
    j.end_object();
  } else {
    write_acquired(j, run, a, now, listed);
  }
  return ok(j);
}

// Splits "/v1/runs/a/acquire?x=1" into {"v1", "runs", "a", "acquire"}.
// Kept inline: it runs three times a request (route, endpoint_of, run_of), and a growing
// std::vector was a third of the server's mallocs (perf, a uprobe on malloc).
using PathParts = boost::container::small_vector<std::string_view, 8>;

PathParts split_path(std::string_view target) {
  if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
  PathParts parts;
  size_t start = 0;
  while (start <= target.size()) {
    size_t end = target.find('/', start);
    if (end == std::string_view::npos) end = target.size();
    if (end > start) parts.push_back(target.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

HttpReply method_not_allowed(std::string_view allow, std::string_view method) {
  HttpReply r =
      error_reply(405, "method_not_allowed",
                  std::string(method) + " is not allowed here; use " + std::string(allow));
  r.allow = std::string(allow);
  return r;
}

Result<WorkerId> worker_field(Fields& body, const Run& run) {
  auto w = body.uint("worker", std::nullopt, UINT32_MAX);
  if (!w) return tl::unexpected(w.error());
  if (*w >= run.workers().size()) {
    return not_found("worker " + std::to_string(*w) + " has not registered with run " +
                         run.config().name + " (register again: POST /v1/runs/" +
                         run.config().name + "/workers)",
                     error_reason::kWorkerNotRegistered);
  }
  return static_cast<WorkerId>(*w);
}

}  // namespace

HttpReply error_reply(int status, std::string_view code, std::string_view message,
                      std::string_view field) {
  JsonWriter j;
  j.begin_object().key("error").begin_object();
  j.field("code", code).field("message", message);
  if (!field.empty()) j.field("field", field);
  j.end_object().end_object();
  return HttpReply{status, j.str(), {}, "application/json"};
}

HttpReply error_reply(const Error& e) {
  return error_reply(http_status(e.code), error_name(e), e.message, e.field);
}

std::vector<std::string> Api::expire_leases() {
  std::vector<std::string> expired;
  for (const Run* run : engine_.runs()) {
    Run* r = *engine_.find(run->config().name);
    const uint64_t before = r->counters().lease_expiries;
    r->expire_leases();
    if (r->counters().lease_expiries != before) expired.push_back(r->config().name);
  }
  return expired;
}

Result<Completed> Api::complete(Run& run, WorkerId worker, LeaseId lease,
                                const Completion& completion) {
  auto done = run.complete(worker, lease, completion);
  if (done && done->counted() && observer_) {
    observer_->completion_accepted(run, worker, lease, *done, completion, clock_.now());
  }
  return done;
}

// The memory request bodies are parsed into, reused for every request of this Api (which one
// thread drives): RapidJSON's default document takes a 64 KiB chunk and a parse stack from
// malloc for every request, and frees them after.
struct Api::ParseArena {
  char buffer[32 * 1024];
  rapidjson::MemoryPoolAllocator<> pool{buffer, sizeof buffer};
  rapidjson::StringBuffer journal_buffer;  // the canonical body (reused: no allocation once grown)
};

Api::Api(Engine& engine, const Clock& clock, ApiLimits limits)
    : engine_(engine), clock_(clock), limits_(limits), arena_(std::make_unique<ParseArena>()) {}
Api::~Api() = default;

Result<std::vector<Completed>> Api::complete_all(Run& run, WorkerId worker,
                                                 const std::vector<LeaseCompletion>& items) {
  // All or nothing: a list with a lease that would be refused changes nothing (complete() on
  // that lease gives the refusal, with the counters a single refused completion bumps).
  if (items.size() > 1) {
    for (const auto& [lease, completion] : items) {
      if (!run.check_completion(worker, lease)) {
        auto refused = run.complete(worker, lease, completion);
        TC_ASSERT(!refused);
        return tl::unexpected(refused.error());
      }
    }
  }
  std::vector<Completed> outcomes;
  outcomes.reserve(items.size());
  for (const auto& [lease, completion] : items) {
    auto done = complete(run, worker, lease, completion);
    if (!done) return tl::unexpected(done.error());
    outcomes.push_back(*done);
  }
  return outcomes;
}

std::variant<HttpReply, ParkedAcquire> Api::handle(const HttpRequest& request) {
  return handle(request, find_endpoint(request.method, request.target));
}

std::variant<HttpReply, ParkedAcquire> Api::handle(const HttpRequest& request,
                                                   const Endpoint* endpoint) {
  effect_ = Effect::kNone;
  changed_nothing_ = false;
  journal_body_.clear();
  const std::string_view name = run_of(request.target);
  if (request.method != "POST" || name.empty()) return route(request, endpoint);
  auto before = engine_.find(name);
  const uint64_t events = before ? (*before)->event_seq() : 0;
  auto result = route(request, endpoint);
  auto after = engine_.find(name);
  if (!after) return result;  // (no run: nothing changed)
  const bool evented = (*after)->event_seq() != events || !before;
  const auto* reply = std::get_if<HttpReply>(&result);
  const bool accepted = !reply || (reply->status >= 200 && reply->status < 300);
  if (accepted && !(changed_nothing_ && !evented)) {
    effect_ = Effect::kChanged;
  } else if (evented) {
    effect_ = accepted ? Effect::kChanged : Effect::kExpiredOnly;
  }
  return result;
}

std::string Api::metrics_text() const {
  return traincoord::metrics_text(engine_.runs(), clock_.now(), kWorkersPerRunInMetrics);
}

std::string_view Api::run_of(std::string_view target) {
  const auto parts = split_path(target);
  if (parts.size() >= 3 && parts[0] == "v1" && parts[1] == "runs") return parts[2];
  return {};
}

std::optional<HttpReply> Api::refusal(const ParkedAcquire& parked) const {
  auto run = engine_.find(parked.run);
  if (!run) return error_reply(run.error());
  if (parked.worker >= (*run)->workers().size()) return std::nullopt;  // (acquire() says why)
  if (auto admitted = (*run)->admit(parked.worker, parked.group); !admitted) {
    return error_reply(admitted.error());
  }
  return std::nullopt;
}

std::optional<HttpReply> Api::retry(const ParkedAcquire& parked, bool timed_out) {
  effect_ = Effect::kNone;
  retried_as_acquire_.clear();
  // The same admission as a request that came now: a worker whose group was replaced while it
  // waited gets what it would get asking again (stale_generation), and no work.
  if (auto refused = refusal(parked)) return refused;
  auto run = engine_.find(parked.run);
  if (!run) return error_reply(run.error());
  const uint64_t events = (*run)->event_seq();
  const WorkerInfo* w =
      parked.worker < (*run)->workers().size() ? &(*run)->workers()[parked.worker] : nullptr;
  const bool same_request = w && parked.request == w->last_request && w->last_request_lease == 0;
  auto a = (*run)->acquire(parked.worker, parked.request,
                           static_cast<uint32_t>(std::max<uint64_t>(parked.max_jobs, 1)));
  effect_ = Effect::kNone;
  if (!a) return error_reply(a.error());
  // A retry that found nothing changed nothing, unless something happened on the way (a lease
  // expired, an epoch opened) or its request id is new to the worker.
  const bool idle = a->status != AcquireStatus::kJob && (parked.request == 0 || same_request);
  if (!idle || (*run)->event_seq() != events) effect_ = Effect::kChanged;
  const bool epoch_opened = (*run)->epochs().size() != parked.epochs_opened;
  if (a->status == AcquireStatus::kWait && !timed_out && !epoch_opened) return std::nullopt;
  HttpReply reply = acquired_reply(**run, parked, *a, clock_.now());
  retried_as_acquire_.clear();
  if (effect_ == Effect::kChanged && (parked.completed || parked.outcomes)) {
    // The journal keeps this retry as a plain acquire (its completions were kept with the
    // request that parked): what that acquire answers is the reply without the outcomes.
    ParkedAcquire plain = parked;
    plain.completed.reset();
    plain.outcomes.reset();
    retried_as_acquire_ = acquired_reply(**run, plain, *a, clock_.now()).body;
  }
  return reply;
}

// One request as its handler sees it: the run its path names (run paths), its body's fields
// (POSTs to a run), and the time.
struct Api::Request {
  Api& api;
  const HttpRequest& http;
  TimeMs now;
  Run* run = nullptr;
  Fields* body = nullptr;
  std::string group;  // grouped endpoints: the group the request names (empty: none)

  using Reply = std::variant<HttpReply, ParkedAcquire>;
  static Reply healthz(Request& r);
  static Reply list_runs(Request& r);
  static Reply create_run(Request& r);
  static Reply status(Request& r);
  static Reply history(Request& r);
  static Reply series(Request& r);
  static Reply epochs(Request& r);
  static Reply cancel(Request& r);
  static Reply change_config(Request& r);
  static Reply register_worker(Request& r);
  static Reply next_index(Request& r);
  static Reply leave(Request& r);
  static Reply heartbeat(Request& r);
  static Reply release(Request& r);
  static Reply fail(Request& r);
  static Reply acquire(Request& r);
  static Reply complete(Request& r);
  static Reply acquire_or_complete(Request& r, bool complete);
  static Reply cut(Request& r);
  static Reply list_cuts(Request& r);
  static Reply cut_info(Request& r);
  static Reply restore(Request& r);
  static Reply node_join(Request& r);
  static Reply node_poll(Request& r);
  static Reply node_fail(Request& r);
  static Reply node_leave(Request& r);
  static Reply nodes(Request& r);
};

namespace {

// Every endpoint, once: routing, the metrics label, who may call it (server/auth.cc) and the
// fuzzer (fuzz/fuzz_api.cc) read this table; docs/API.md documents each row. GET /metrics has
// no handler here: the coordinator serves it (server/coordinator.cc), as the dashboard's files.
// `{run}` stands for a run's name.
constexpr Endpoint kEndpoints[] = {
    {"healthz", "GET", "/healthz", Access::kAnyone, &Api::Request::healthz},
    {"metrics", "GET", "/metrics", Access::kAdmin, nullptr},
    // High availability (docs/HA.md): who leads, this coordinator's role, the journal's lag.
    {"coordinator", "GET", "/v1/coordinator", Access::kAdmin, nullptr},
    {"runs", "GET", "/v1/runs", Access::kAdmin, &Api::Request::list_runs},
    {"create_run", "POST", "/v1/runs", Access::kAdmin, &Api::Request::create_run},
    {"status", "GET", "/v1/runs/{run}", Access::kRun, &Api::Request::status},
    {"history", "GET", "/v1/runs/{run}/history", Access::kRun, &Api::Request::history},
    {"series", "GET", "/v1/runs/{run}/series", Access::kRun, &Api::Request::series},
    {"epochs", "GET", "/v1/runs/{run}/epochs", Access::kRun, &Api::Request::epochs},
    {"cancel", "POST", "/v1/runs/{run}/cancel", Access::kAdmin, &Api::Request::cancel},
    {"change_config", "POST", "/v1/runs/{run}/config", Access::kAdmin,
     &Api::Request::change_config},
    {"workers", "POST", "/v1/runs/{run}/workers", Access::kRun, &Api::Request::register_worker},
    {"heartbeat", "POST", "/v1/runs/{run}/heartbeat", Access::kRun, &Api::Request::heartbeat, true},
    {"leave", "POST", "/v1/runs/{run}/leave", Access::kRun, &Api::Request::leave, true},
    {"acquire", "POST", "/v1/runs/{run}/acquire", Access::kRun, &Api::Request::acquire, true},
    {"complete", "POST", "/v1/runs/{run}/complete", Access::kRun, &Api::Request::complete, true},
    {"fail", "POST", "/v1/runs/{run}/fail", Access::kRun, &Api::Request::fail, true},
    {"release", "POST", "/v1/runs/{run}/release", Access::kRun, &Api::Request::release, true},
    {"cut", "POST", "/v1/runs/{run}/cuts", Access::kRun, &Api::Request::cut, true},
    {"cuts", "GET", "/v1/runs/{run}/cuts", Access::kRun, &Api::Request::list_cuts},
    {"cut_info", "GET", "/v1/runs/{run}/cuts/{cut}", Access::kRun, &Api::Request::cut_info},
    {"restore", "POST", "/v1/runs/{run}/restore", Access::kRun, &Api::Request::restore},
    {"node_join", "POST", "/v1/runs/{run}/nodes/join", Access::kRun, &Api::Request::node_join},
    {"node_poll", "POST", "/v1/runs/{run}/nodes/poll", Access::kRun, &Api::Request::node_poll},
    {"node_fail", "POST", "/v1/runs/{run}/nodes/fail", Access::kRun, &Api::Request::node_fail},
    {"node_leave", "POST", "/v1/runs/{run}/nodes/leave", Access::kRun, &Api::Request::node_leave},
    {"nodes", "GET", "/v1/runs/{run}/nodes", Access::kRun, &Api::Request::nodes},
    {"next_index", "POST", "/v1/runs/{run}/next_index", Access::kRun, &Api::Request::next_index},
};

// The dashboard's files: a GET of "/" or of any one-segment path no row names.
constexpr Endpoint kDashboard = {"dashboard", "GET", "/{file}", Access::kAnyone, nullptr};

// Whether `pattern`'s segments match `parts` ("{...}" matches any one segment).
bool path_matches(std::string_view pattern, const PathParts& parts) {
  size_t i = 0;
  size_t start = 1;  // (after the leading '/')
  while (start <= pattern.size()) {
    size_t end = pattern.find('/', start);
    if (end == std::string_view::npos) end = pattern.size();
    const std::string_view segment = pattern.substr(start, end - start);
    if (i >= parts.size() || (segment.front() != '{' && segment != parts[i])) return false;
    ++i;
    start = end + 1;
  }
  return i == parts.size();
}

HttpReply no_endpoint(const HttpRequest& req) {
  return error_reply(404, "not_found", "no endpoint at " + req.target + " (see docs/API.md)");
}

}  // namespace

std::span<const Endpoint> Api::endpoints() { return kEndpoints; }

const Endpoint* Api::find_endpoint(std::string_view method, std::string_view target,
                                   std::string* allow) {
  const auto parts = split_path(target);
  const Endpoint* found = nullptr;
  for (const Endpoint& e : kEndpoints) {
    if (!path_matches(e.path, parts)) continue;
    if (e.method == method) {
      found = &e;
      if (!allow) return found;
    }
    if (allow) {
      if (!allow->empty()) *allow += ", ";
      *allow += e.method;
    }
  }
  if (found) return found;
  const bool path_known = allow && !allow->empty();
  if (parts.size() <= 1 && method == "GET" && !path_known) return &kDashboard;
  return nullptr;
}

std::string_view Api::endpoint_of(std::string_view method, std::string_view target) {
  const Endpoint* e = find_endpoint(method, target);
  return e ? e->name : "other";
}

namespace {

// The canonical record of a request: its body without the whitespace between tokens, strings
// re-escaped, and each number as the client wrote it (its lexeme: replay parses the same text
// the live request was parsed from, so a loss comes back to its last bit, which writing the
// parsed double back does not promise with RapidJSON's fast parser). What the journal keeps of
// a request is then bounded by what the request may change, not by how many bytes it was sent
// in (1 MiB of padding around a heartbeat journals as the heartbeat's few bytes): unknown
// fields are refused, every string is bounded, and so is every number's length (below).
class CanonicalWriter
    : public rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                               rapidjson::CrtAllocator, rapidjson::kWriteNanAndInfFlag> {
 public:
  CanonicalWriter(rapidjson::StringBuffer& out, size_t max_number_chars)
      : Writer(out), max_number_chars_(max_number_chars) {}
  // (Hides Writer::RawNumber, which would write the lexeme as a string.)
  bool RawNumber(const char* text, rapidjson::SizeType length, bool /*copy*/) {
    if (length > max_number_chars_) {
      too_long_ = length;
      return false;
    }
    return RawValue(text, length, rapidjson::kNumberType);
  }
  size_t too_long() const { return too_long_; }

 private:
  size_t max_number_chars_;
  size_t too_long_ = 0;
};

// The SAX events of one parse, to the document the handlers read and to the canonical writer
// at once: a request body is parsed once, not once for its fields and again for the journal
// (a second full parse was ~1 us of a job cycle's server CPU; docs/PERFORMANCE.md). A number
// reaches the writer as its lexeme, the text the reader has just consumed (the stream is read
// in place: `in` is where the number ended), so the record is the same text as a parse with
// kParseNumbersAsStringsFlag wrote before. A number too long for the record stops the writer,
// not the parse: a body that is not JSON is still refused as such first.
template <class Document>
class ParseTee {
 public:
  ParseTee(Document& doc, CanonicalWriter& writer, const std::string& text,
           const rapidjson::MemoryStream& in)
      : doc_(doc), writer_(writer), text_(text), in_(in) {}

  bool Null() {
    return write([&] { return writer_.Null(); }) && doc_.Null();
  }
  bool Bool(bool b) {
    return write([&] { return writer_.Bool(b); }) && doc_.Bool(b);
  }
  bool Int(int i) { return number() && doc_.Int(i); }
  bool Uint(unsigned u) { return number() && doc_.Uint(u); }
  bool Int64(int64_t i) { return number() && doc_.Int64(i); }
  bool Uint64(uint64_t u) { return number() && doc_.Uint64(u); }
  bool Double(double d) { return number() && doc_.Double(d); }
  bool RawNumber(const char* str, rapidjson::SizeType length, bool copy) {
    return number() && doc_.RawNumber(str, length, copy);  // (not reached: no such flag)
  }
  bool String(const char* str, rapidjson::SizeType length, bool copy) {
    return write([&] { return writer_.String(str, length, copy); }) &&
           doc_.String(str, length, copy);
  }
  bool Key(const char* str, rapidjson::SizeType length, bool copy) {
    return write([&] { return writer_.Key(str, length, copy); }) && doc_.Key(str, length, copy);
  }
  bool StartObject() {
    return write([&] { return writer_.StartObject(); }) && doc_.StartObject();
  }
  bool EndObject(rapidjson::SizeType members) {
    return write([&] { return writer_.EndObject(members); }) && doc_.EndObject(members);
  }
  bool StartArray() {
    return write([&] { return writer_.StartArray(); }) && doc_.StartArray();
  }
  bool EndArray(rapidjson::SizeType elements) {
    return write([&] { return writer_.EndArray(elements); }) && doc_.EndArray(elements);
  }

 private:
  template <class F>
  bool write(F f) {
    if (writing_ && !f()) writing_ = false;
    return true;
  }
  // The lexeme of the number just read: it ends where the stream is, and starts after the
  // separator before it (digits, sign, point, exponent; letters of NaN and Infinity).
  bool number() {
    const size_t end = in_.Tell();
    size_t start = end;
    while (start > 0) {
      const char c = text_[start - 1];
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '+' && c != '.') break;
      --start;
    }
    return write([&] {
      return writer_.RawNumber(text_.data() + start, static_cast<rapidjson::SizeType>(end - start),
                               false);
    });
  }

  Document& doc_;
  CanonicalWriter& writer_;
  const std::string& text_;
  const rapidjson::MemoryStream& in_;
  bool writing_ = true;
};

// Parses a JSON request body into `doc`, and writes its canonical record (CanonicalWriter) into
// `out`, in one pass; refuses what parse_body refuses, and a number longer than
// `max_number_chars`.
Result<void> parse_body_and_record(const std::string& text, BodyDocument& doc,
                                   rapidjson::StringBuffer& out,
                                   rapidjson::MemoryPoolAllocator<>& pool,
                                   size_t max_number_chars) {
  out.Clear();
  if (text.empty()) {
    doc.SetObject();
    out.Put('{');
    out.Put('}');
    return {};
  }
  // A NUL is never valid JSON text (inside a string it must be escaped as \u0000).
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    return invalid_argument("", "the body holds a NUL byte at offset " + std::to_string(nul) +
                                    ": send the JSON text alone");
  }
  // RapidJSON stops at a NUL byte, so "{...}\0anything" would parse as "{...}" (above). NaN and
  // Infinity are accepted: Python's json module writes them for a diverged loss. Read from a
  // plain MemoryStream: Parse(data, size) wraps it in an EncodedInputStream, which skips a byte
  // order mark, and also a lone 0xEF, 0xBB or 0xBF byte ("\xEF{}" parsed as "{}": found by
  // fuzz_api). The reader takes it by reference (no local copy), so the tee sees where it is.
  rapidjson::MemoryStream stream(text.data(), text.size());
  CanonicalWriter writer(out, max_number_chars);
  rapidjson::GenericReader<rapidjson::UTF8<>, rapidjson::UTF8<>, rapidjson::MemoryPoolAllocator<>>
      reader(&pool);
  auto generate = [&](BodyDocument& handler) {
    ParseTee<BodyDocument> tee(handler, writer, text, stream);
    return !reader
                .Parse<rapidjson::kParseNanAndInfFlag | rapidjson::kParseIterativeFlag>(stream, tee)
                .IsError();
  };
  doc.Populate(generate);
  if (reader.HasParseError()) {
    return invalid_argument(
        "", "the body is not valid JSON: " +
                std::string(rapidjson::GetParseError_En(reader.GetParseErrorCode())) +
                " at offset " + std::to_string(reader.GetErrorOffset()));
  }
  if (!doc.IsObject()) return invalid_argument("", "the body must be a JSON object");
  if (auto key = find_duplicate_key(doc)) {
    return invalid_argument(*key, "the body has the key " + *key + " twice; send each key once");
  }
  if (writer.too_long() > 0) {
    return invalid_argument("", "the body holds a number of " + std::to_string(writer.too_long()) +
                                    " characters; at most " + std::to_string(max_number_chars) +
                                    " (17 significant digits are exact for any double)");
  }
  return {};
}

}  // namespace

std::variant<HttpReply, ParkedAcquire> Api::route(const HttpRequest& req,
                                                  const Endpoint* endpoint) {
  std::string allow;  // the methods the path allows, when it is an endpoint's
  // `endpoint` came from the first row that matches; only a request no row takes scans them
  // all, for the methods its path allows (the whole scan every request was ~5% of a job
  // cycle's instructions: docs/PERFORMANCE.md).
  if (!endpoint || endpoint == &kDashboard)
    endpoint = find_endpoint(req.method, req.target, &allow);
  if (endpoint ? !endpoint->handler : allow.empty()) return no_endpoint(req);
  Request r{*this, req, clock_.now(), nullptr, nullptr, {}};
  if (const std::string_view run = run_of(req.target); !run.empty()) {
    auto found = engine_.find(run);  // (an unknown run is a 404 whatever the method)
    if (!found) return error_reply(found.error());
    r.run = *found;
  }
  if (!endpoint) return method_not_allowed(allow, req.method);
  if (!r.run || endpoint->method != "POST") return endpoint->handler(r);
  // Parsed into memory reused for every request (see ParseArena).
  arena_->pool.Clear();
  BodyDocument doc(&arena_->pool, 1024, &arena_->pool);
  TC_TRY_REPLY(parse_body_and_record(req.body, doc, arena_->journal_buffer, arena_->pool,
                                     limits_.max_number_chars));
  Fields body(doc, limits_.name_identity);
  r.body = &body;
  if (endpoint->grouped) {
    TC_TRY_ASSIGN(group, body.string("group", std::string(), kMaxGroupBytes));
    // Judged by the group its worker registered with (Run::admit); a request without a worker
    // the run knows is judged by the group it names, and its handler says what is wrong.
    auto worker = body.uint("worker", std::nullopt, UINT32_MAX);
    if (worker && *worker < r.run->workers().size()) {
      TC_TRY_REPLY(r.run->admit(static_cast<WorkerId>(*worker), group));
    } else {
      TC_TRY_REPLY(r.run->admit(group));
    }
    r.group = std::move(group);
  }
  auto result = endpoint->handler(r);
  const auto* reply = std::get_if<HttpReply>(&result);
  if (!reply || (reply->status >= 200 && reply->status < 300)) {
    journal_body_.assign(arena_->journal_buffer.GetString(), arena_->journal_buffer.GetSize());
  }
  return result;
}

Api::Request::Reply Api::Request::healthz(Request& r) {
  JsonWriter j;
  j.begin_object().field("status", "ok").field("runs", r.api.engine_.runs().size()).end_object();
  return ok(j);
}

namespace {

// GET /v1/runs of a coordinator among several (docs/HA.md "Leadership per run"): every run of
// the prefix, with its leader ("leader", null: none known), "term" and "led_here"; only a run
// led here has its summary (this coordinator serves it; what it kept of another is stale).
HttpReply ha_runs_list(const Leadership& leadership, const Engine& engine, TimeMs now) {
  std::map<std::string, std::optional<Leadership::View>, std::less<>> runs;
  for (auto& [name, view] : leadership.views()) runs[name] = std::move(view);
  for (const Run* run : engine.runs()) runs.try_emplace(run->config().name, std::nullopt);
  std::string out = R"({"runs":[)";
  for (const auto& [name, view] : runs) {
    const bool led = view && view->leading && engine.find(name);
    JsonWriter ha;
    ha.begin_object();
    if (!led) ha.field("run", name);
    ha.key("leader");
    if (view && !view->leader.empty()) {
      ha.value(view->leader);
    } else {
      ha.null();
    }
    ha.key("term").value(static_cast<long long>(view ? view->term : 0));
    ha.field("led_here", led);
    ha.end_object();
    if (out.back() != '[') out += ',';
    if (led) {
      JsonWriter summary;
      write_run_summary(summary, **engine.find(name), now);
      std::string s = summary.take();
      s.pop_back();  // (its closing brace: the leadership's fields go on in the same object)
      out += s + "," + ha.str().substr(1);
    } else {
      out += ha.str();
    }
  }
  out += "]}";
  return HttpReply{200, std::move(out), {}, "application/json"};
}

}  // namespace

Api::Request::Reply Api::Request::list_runs(Request& r) {
  if (r.api.leadership_) return ha_runs_list(*r.api.leadership_, r.api.engine_, r.now);
  JsonWriter j;
  j.begin_object().key("runs").begin_array();
  for (const Run* run : r.api.engine_.runs()) write_run_summary(j, *run, r.now);
  j.end_array().end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::create_run(Request& r) {
  if (r.api.engine_.runs().size() >= r.api.limits_.max_runs) {
    return error_reply(409, "limit",
                       "this coordinator holds " + std::to_string(r.api.limits_.max_runs) +
                           " runs, its limit (--max-runs)");
  }
  auto config = parse_run_config_json(r.http.body, "run config");
  if (!config) return error_reply(config.error());
  auto run = r.api.engine_.create_run(std::move(*config));
  if (!run) return error_reply(run.error());
  if (r.api.observer_) r.api.observer_->run_created(**run, r.http.body, r.now);
  JsonWriter j;
  write_run_summary(j, **run, r.now);
  HttpReply reply = ok(j);
  reply.status = 201;
  return reply;
}

namespace {

// The value of `name` in the query string of `target` ("/x?format=csv&b=1"), undecoded; nullopt
// when the query does not name it.
std::optional<std::string_view> query_param(std::string_view target, std::string_view name) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return std::nullopt;
  std::string_view query = target.substr(q + 1);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      return eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    }
    if (amp == std::string_view::npos) break;
    query = query.substr(amp + 1);
  }
  return std::nullopt;
}

// The query parameter `name` of `target` as a whole number from 0 to `max`; `fallback` when the
// query does not name it. A 400 invalid_argument naming the parameter otherwise.
Result<uint64_t> query_uint(std::string_view target, std::string_view name, uint64_t fallback,
                            uint64_t max) {
  const std::optional<std::string_view> text = query_param(target, name);
  if (!text) return fallback;
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (text->empty() || ec != std::errc() || end != text->data() + text->size() || v > max) {
    return invalid_argument(std::string(name),
                            "?" + std::string(name) + "= must be a whole number" +
                                (max == UINT64_MAX ? std::string(" (0 or more)")
                                                   : " from 0 to " + std::to_string(max)));
  }
  return v;
}

// The positions `from` .. `from + limit` of `count` epochs, clipped to those there are.
std::pair<size_t, size_t> epoch_range(size_t count, uint64_t from, uint64_t limit) {
  const size_t begin = static_cast<size_t>(std::min<uint64_t>(from, count));
  return {begin, begin + static_cast<size_t>(std::min<uint64_t>(limit, count - begin))};
}

}  // namespace

Api::Request::Reply Api::Request::status(Request& r) {
  // No expire_leases() here: a GET changes nothing, so that replaying the log of POSTs
  // rebuilds the state exactly. The server's tick expires leases (and logs that it did).
  TC_TRY_ASSIGN(shown, query_uint(r.http.target, "epochs", kEpochsShown, kMaxEpochsShown));
  JsonWriter j;
  write_status(j, *r.run, r.now, shown, wall_now(r.api.wall_));
  return ok(j);
}

Api::Request::Reply Api::Request::epochs(Request& r) {
  TC_TRY_ASSIGN(from, query_uint(r.http.target, "from", 0, UINT64_MAX));
  TC_TRY_ASSIGN(limit, query_uint(r.http.target, "limit", kMaxEpochsShown, kMaxEpochsShown));
  JsonWriter j;
  write_epochs_page(j, *r.run, epoch_range(r.run->epochs().size(), from, limit), r.now,
                    wall_now(r.api.wall_));
  return ok(j);
}

Api::Request::Reply Api::Request::history(Request& r) {
  const std::string_view format = query_param(r.http.target, "format").value_or("json");
  if (format != "json" && format != "csv" && format != "jsonl") {
    return error_reply(
        400, "invalid_argument",
        "format must be json, csv or jsonl, not \"" + std::string(format.substr(0, 32)) + "\"",
        "format");
  }
  // Without these, the whole history (an export); with them, a page of epochs and the
  // completions newer than one the caller saw (docs/API.md).
  TC_TRY_ASSIGN(from, query_uint(r.http.target, "from", 0, UINT64_MAX));
  TC_TRY_ASSIGN(limit, query_uint(r.http.target, "limit", UINT64_MAX, UINT64_MAX));
  TC_TRY_ASSIGN(jobs_after, query_uint(r.http.target, "jobs_after", 0, UINT64_MAX));
  const Run& run = *r.run;
  const HistoryPage page{epoch_range(run.epochs().size(), from, limit), jobs_after,
                         wall_now(r.api.wall_)};
  if (format == "csv") {
    return HttpReply{200, history_csv(run, page, r.now), {}, "text/csv; charset=utf-8"};
  }
  if (format == "jsonl") {
    return HttpReply{200, history_jsonl(run, page, r.now), {}, "application/x-ndjson"};
  }
  JsonWriter j;
  write_history(j, run, page, r.now);
  return ok(j);
}

Api::Request::Reply Api::Request::series(Request& r) {
  const std::string_view format = query_param(r.http.target, "format").value_or("json");
  if (format != "json" && format != "csv") {
    return error_reply(
        400, "invalid_argument",
        "format must be json or csv, not \"" + std::string(format.substr(0, 32)) + "\"", "format");
  }
  TC_TRY_ASSIGN(after, query_uint(r.http.target, "after", 0, UINT64_MAX));
  if (format == "csv") {
    return HttpReply{200, series_csv(*r.run, after), {}, "text/csv; charset=utf-8"};
  }
  JsonWriter j;
  write_series(j, *r.run, after);
  return ok(j);
}

Api::Request::Reply Api::Request::cancel(Request& r) {
  TC_TRY_ASSIGN(reason, r.body->string("reason", std::string("cancelled through the API"), 256,
                                       TextKind::kMessage));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  r.run->cancel(reason);
  JsonWriter j;
  write_run_summary(j, *r.run, r.now);
  return ok(j);
}

namespace {

// The most levels a run config nests (tables, and the arrays of [lengths]), with room to spare.
constexpr size_t kMaxConfigDepth = 8;

// How deeply `v` nests (a scalar: 0), measured without recursion.
size_t nesting_depth(const rapidjson::Value& v) {
  size_t deepest = 0;
  std::vector<std::pair<const rapidjson::Value*, size_t>> open{{&v, 0}};
  while (!open.empty()) {
    auto [at, depth] = open.back();
    open.pop_back();
    deepest = std::max(deepest, depth);
    if (deepest > kMaxConfigDepth) return deepest;
    if (at->IsObject()) {
      for (const auto& m : at->GetObject()) open.emplace_back(&m.value, depth + 1);
    } else if (at->IsArray()) {
      for (const auto& item : at->GetArray()) open.emplace_back(&item, depth + 1);
    }
  }
  return deepest;
}

}  // namespace

// A started run's config replaced by a new one (docs/API.md "Changing a started run's
// config"), with the rules of --apply-config-changes (config/config_change.h): the run is saved
// and loaded under it, as at a restart with the flag, and the journal writes the new config with
// a snapshot of the run under it (Journal::add_config).
Api::Request::Reply Api::Request::change_config(Request& r) {
  const rapidjson::Value* toml = r.body->get("toml");
  const rapidjson::Value* object = r.body->get("config");
  TC_TRY_ASSIGN(dry_run, r.body->boolean("dry_run", false));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  if ((toml == nullptr) == (object == nullptr)) {
    return error_reply(400, "invalid_argument",
                       "give the run's new config once: as \"toml\", the text of its config "
                       "file, or as \"config\", a JSON object as POST /v1/runs takes",
                       toml ? "config" : "toml");
  }
  std::string text;
  std::string_view format;
  Result<RunConfig> given;
  if (toml) {
    if (!toml->IsString()) {
      return error_reply(400, "invalid_argument", "toml must be a string: a run config's text",
                         "toml");
    }
    text.assign(toml->GetString(), toml->GetStringLength());
    format = kStoredToml;
    given = parse_sent_run_config(text, "toml");
  } else {
    if (!object->IsObject()) {
      return error_reply(400, "invalid_argument", "config must be a JSON object: a run config",
                         "config");
    }
    // (measured without recursion before Accept, which recurses: a body may nest any depth)
    if (nesting_depth(*object) > kMaxConfigDepth) {
      return error_reply(400, "invalid_argument",
                         "config: nested too deeply for a run config (at most " +
                             std::to_string(kMaxConfigDepth) + " levels)",
                         "config");
    }
    rapidjson::StringBuffer out;
    rapidjson::Writer<rapidjson::StringBuffer> writer(out);
    object->Accept(writer);
    text.assign(out.GetString(), out.GetSize());
    format = kStoredJson;
    given = parse_run_config_json(text, "config");
  }
  if (!given) return error_reply(given.error());
  const std::string name = r.run->config().name;
  if (given->name != name) {
    return error_reply(400, "invalid_argument",
                       "name: this config is of run " + given->name + ", not of run " + name,
                       "name");
  }
  const ConfigChange check = check_config_change(*given, *r.run, "run " + name, true);
  if (!check.refused.empty()) return error_reply(409, "config_change_refused", check.refused);
  std::string fields;
  for (const std::string& f : check.changed) fields += (fields.empty() ? "" : ", ") + f;
  const bool apply = !dry_run && !check.changed.empty();
  r.api.changed_nothing_ = !apply;  // (a dry run or no change: nothing to journal)
  if (apply) {
    TC_TRY_ASSIGN(updated, apply_config_change(*r.run, std::move(*given),
                                               "changed through the API: " + fields, r.api.clock_));
    r.api.engine_.adopt(std::move(updated));
    r.run = *r.api.engine_.find(name);
    if (r.api.observer_) r.api.observer_->config_changed(*r.run, format, text);
  }
  JsonWriter j;
  j.begin_object().field("run", name).key("changed").begin_array();
  for (const std::string& f : check.changed) j.value(f);
  j.end_array().field("applied", apply);
  j.key("summary");
  write_run_summary(j, *r.run, r.now);
  j.end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::register_worker(Request& r) {
  TC_TRY_ASSIGN(name, r.body->string("name", std::nullopt, 128));
  TC_TRY_ASSIGN(group, r.body->string("group", std::string(), kMaxGroupBytes));
  // A rank of a synchronous group: both or neither.
  std::optional<GroupRank> rank;
  if (r.body->has("rank") || r.body->has("world_size")) {
    if (!r.body->has("world_size")) {
      return error_reply(400, "invalid_argument", "world_size: give it with rank", "world_size");
    }
    if (!r.body->has("rank")) {
      return error_reply(400, "invalid_argument", "rank: give it with world_size", "rank");
    }
    TC_TRY_ASSIGN(rank_value, r.body->uint("rank", uint64_t{0}, UINT32_MAX));
    TC_TRY_ASSIGN(world_size, r.body->uint("world_size", uint64_t{1}, UINT32_MAX));
    rank = GroupRank{static_cast<uint32_t>(rank_value), static_cast<uint32_t>(world_size)};
  }
  TC_TRY_REPLY(r.body->no_unknown_fields());
  TC_TRY_REPLY(r.run->check_rank(name, group, rank));
  if (!r.run->has_worker(name) && r.run->workers().size() >= r.api.limits_.max_workers_per_run) {
    return error_reply(409, "limit",
                       "run " + r.run->config().name + " has " +
                           std::to_string(r.api.limits_.max_workers_per_run) +
                           " workers, its limit (--max-workers-per-run)");
  }
  // A worker that registered with a group and registers again naming none is still of that
  // group (Run::join keeps it): refused if the group was replaced, as its other requests are.
  if (group.empty()) {
    if (auto known = r.run->worker_id(name)) TC_TRY_REPLY(r.run->admit(*known, group));
  }
  // The group first: a refused one (stale) registers nothing.
  TC_TRY_ASSIGN(group_state, r.run->join_group(group));
  const WorkerId id = r.run->join(name, group, rank);
  JsonWriter j;
  j.begin_object();
  j.field("worker", id).field("name", name).field("run", r.run->config().name);
  j.field("lease_timeout_ms", r.run->config().lease_timeout_ms);
  j.field("heartbeat_interval_ms", std::max<TimeMs>(1, r.run->config().lease_timeout_ms / 3));
  j.field("generation", r.run->generation());
  j.field("mode", schedule_mode_name(r.run->mode()));  // "auto": the first acquire chooses
  if (!group.empty()) {
    j.field("group", group);
    j.field("group_state", group_state == GroupState::kCurrent ? "current" : "restore_required");
  }
  j.key("latest_cut");
  if (const Cut* latest = r.run->latest_cut()) {
    j.value(latest->id);
  } else {
    j.null();
  }
  j.end_object();
  return ok(j);
}

namespace {

// "parts": [{"lease": L, "batches": K, "loss": X, "samples": N, "metrics": {...}}, ...].
Result<std::vector<CutPart>> read_cut_parts(Fields& body) {
  std::vector<CutPart> parts;
  const rapidjson::Value* list = body.get("parts");
  if (list == nullptr) return parts;
  if (!list->IsArray() || list->Size() > kMaxJobsPerRequest) {
    return invalid_argument("parts", "parts must be a list of at most " +
                                         std::to_string(kMaxJobsPerRequest) +
                                         " objects {\"lease\": L, \"batches\": K, \"loss\": X, "
                                         "\"samples\": N}");
  }
  for (rapidjson::SizeType i = 0; i < list->Size(); ++i) {
    const rapidjson::Value& item = (*list)[i];
    const std::string where = "parts[" + std::to_string(i) + "]";
    if (!item.IsObject()) return invalid_argument(where, where + " must be an object");
    Fields fields(item, body.name_identity());
    CutPart part;
    auto lease = fields.uint("lease");
    auto batches = lease ? fields.uint("batches") : Result<uint64_t>(uint64_t{0});
    Result<Completion> completion = Completion{};
    if (lease && batches) completion = read_completion(fields);
    Result<void> unknown = completion ? fields.no_unknown_fields() : Result<void>{};
    for (const Error* e :
         {lease ? nullptr : &lease.error(), batches ? nullptr : &batches.error(),
          completion ? nullptr : &completion.error(), unknown ? nullptr : &unknown.error()}) {
      if (e) return invalid_argument(where + "." + e->field, where + ": " + e->message);
    }
    parts.push_back(CutPart{*lease, *batches, std::move(*completion)});
  }
  return parts;
}

}  // namespace

Api::Request::Reply Api::Request::cut(Request& r) {
  TC_TRY_ASSIGN(worker, worker_field(*r.body, *r.run));
  TC_TRY_ASSIGN(seq, r.body->uint("seq"));
  TC_TRY_ASSIGN(rank, r.body->uint("rank", uint64_t{0}, UINT32_MAX));
  TC_TRY_ASSIGN(world_size, r.body->uint("world_size", uint64_t{1}, UINT32_MAX));
  TC_TRY_ASSIGN(parts, read_cut_parts(*r.body));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  TC_TRY_ASSIGN(share, r.run->cut(worker, r.group, seq, static_cast<uint32_t>(rank),
                                  static_cast<uint32_t>(world_size), parts));
  JsonWriter j;
  j.begin_object();
  j.field("cut", share.cut).field("complete", share.complete);
  j.key("ranks").begin_array();
  for (uint32_t v : share.ranks) j.value(static_cast<uint64_t>(v));
  j.end_array();
  j.field("world_size", static_cast<uint64_t>(share.world_size));
  j.field("generation", r.run->generation());
  j.end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::list_cuts(Request& r) {
  JsonWriter j;
  j.begin_object();
  j.field("keep", static_cast<uint64_t>(r.run->config().keep_cuts));
  j.field("generation", r.run->generation());
  j.key("group");
  if (r.run->group().empty()) {
    j.null();
  } else {
    j.value(r.run->group());
  }
  j.key("cuts").begin_array();
  for (const Cut& c : r.run->cuts()) write_cut(j, c, r.now);
  j.end_array();
  j.end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::cut_info(Request& r) {
  const auto parts = split_path(r.http.target);
  const std::string_view text = parts.size() == 5 ? parts[4] : std::string_view();
  uint64_t id = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    return error_reply(400, "invalid_argument", "a cut is named by its number (GET .../cuts/N)",
                       "cut");
  }
  const Cut* c = r.run->find_cut(id);
  if (c == nullptr) {
    return error_reply(not_found("run " + r.run->config().name + " has no cut " +
                                     std::to_string(id) + " (GET .../cuts lists those it keeps)",
                                 error_reason::kCutNotFound)
                           .value());
  }
  JsonWriter j;
  write_cut(j, *c, r.now);
  return ok(j);
}

namespace {

// A node's standing in the rendezvous, as join and poll answer it.
HttpReply assignment_reply(const Run& run, const NodeAssignment& a) {
  JsonWriter j;
  j.begin_object();
  j.field("state", node_state_name(a.state));
  j.field("round", a.round);
  j.field("restart_count", a.restart_count);
  j.field("run_state", run_state_name(run.state()));
  if (a.state == NodeState::kRunning) {
    j.field("node_rank", static_cast<uint64_t>(a.node_rank));
    j.field("nnodes", static_cast<uint64_t>(a.nnodes));
    j.field("world_size", static_cast<uint64_t>(a.world_size));
    j.field("rank_offset", static_cast<uint64_t>(a.rank_offset));
    j.field("master_addr", a.master_addr);
    j.field("master_port", static_cast<uint64_t>(a.master_port));
    // The group its ranks carry (TRAINCOORD_GROUP): one per round.
    j.field("group", "rdzv-r" + std::to_string(a.round));
  }
  if (a.state == NodeState::kRestart) j.field("why", a.why);
  j.end_object();
  return HttpReply{200, j.str(), {}, "application/json"};
}

}  // namespace

// Every request for a node carries the secret its agent joined with (core/rendezvous.h).
Api::Request::Reply Api::Request::node_join(Request& r) {
  NodeJoin join;
  TC_TRY_ASSIGN(node, r.body->string("node", std::nullopt, 128));
  TC_TRY_ASSIGN(secret, r.body->string("secret", std::nullopt, kMaxNodeSecretBytes));
  TC_TRY_ASSIGN(addr, r.body->string("addr", std::string("127.0.0.1"), 253));
  TC_TRY_ASSIGN(nproc, r.body->uint("nproc", uint64_t{1}, 1024));
  TC_TRY_ASSIGN(master_port, r.body->uint("master_port", uint64_t{0}, 65535));
  TC_TRY_ASSIGN(min_nodes, r.body->uint("min_nodes", uint64_t{1}, kMaxRendezvousNodes));
  TC_TRY_ASSIGN(max_nodes, r.body->uint("max_nodes", uint64_t{1}, kMaxRendezvousNodes));
  TC_TRY_ASSIGN(settle_ms,
                r.body->uint("settle_ms", uint64_t{0}, static_cast<uint64_t>(kMaxSettleMs)));
  TC_TRY_ASSIGN(timeout_ms, r.body->uint("node_timeout_ms", uint64_t{15'000},
                                         static_cast<uint64_t>(kMaxNodeTimeoutMs)));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  join.node = node;
  join.secret = secret;
  join.addr = addr;
  join.nproc = static_cast<uint32_t>(nproc);
  join.master_port = static_cast<uint16_t>(master_port);
  join.min_nodes = static_cast<uint32_t>(min_nodes);
  join.max_nodes = static_cast<uint32_t>(max_nodes);
  join.settle_ms = static_cast<TimeMs>(settle_ms);
  join.node_timeout_ms = static_cast<TimeMs>(timeout_ms);
  TC_TRY_ASSIGN(assignment, r.run->rendezvous().join(join, r.now));
  return assignment_reply(*r.run, assignment);
}

Api::Request::Reply Api::Request::node_poll(Request& r) {
  TC_TRY_ASSIGN(node, r.body->string("node", std::nullopt, 128));
  TC_TRY_ASSIGN(secret, r.body->string("secret", std::nullopt, kMaxNodeSecretBytes));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  TC_TRY_ASSIGN(assignment, r.run->rendezvous().poll(node, secret, r.now));
  return assignment_reply(*r.run, assignment);
}

Api::Request::Reply Api::Request::node_fail(Request& r) {
  TC_TRY_ASSIGN(node, r.body->string("node", std::nullopt, 128));
  TC_TRY_ASSIGN(secret, r.body->string("secret", std::nullopt, kMaxNodeSecretBytes));
  TC_TRY_ASSIGN(round, r.body->uint("round"));
  TC_TRY_ASSIGN(why, r.body->string("why", std::string("a rank failed"), 512, TextKind::kMessage));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  TC_TRY_REPLY(r.run->rendezvous().fail(node, secret, round, why, r.now));
  TC_TRY_ASSIGN(assignment, r.run->rendezvous().poll(node, secret, r.now));
  return assignment_reply(*r.run, assignment);
}

Api::Request::Reply Api::Request::node_leave(Request& r) {
  TC_TRY_ASSIGN(node, r.body->string("node", std::nullopt, 128));
  TC_TRY_ASSIGN(secret, r.body->string("secret", std::nullopt, kMaxNodeSecretBytes));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  TC_TRY_REPLY(r.run->rendezvous().leave(node, secret, r.now));
  JsonWriter j;
  j.begin_object().field("left", true).end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::nodes(Request& r) {
  JsonWriter j;
  write_rendezvous(j, r.run->rendezvous(), r.now);
  return ok(j);
}

Api::Request::Reply Api::Request::restore(Request& r) {
  TC_TRY_ASSIGN(group, r.body->string("group", std::nullopt, kMaxGroupBytes));
  TC_TRY_ASSIGN(fresh, r.body->boolean("fresh", false));
  std::optional<uint64_t> cut;
  if (r.body->has("cut")) {
    TC_TRY_ASSIGN(id, r.body->uint("cut"));
    cut = id;
  }
  TC_TRY_REPLY(r.body->no_unknown_fields());
  if (fresh == cut.has_value()) {
    return error_reply(400, "invalid_argument",
                       "name the cut to restore (\"cut\": N) or go on from the ledger as it is "
                       "(\"fresh\": true), one of the two",
                       "cut");
  }
  TC_TRY_ASSIGN(restored, r.run->restore(group, cut));
  JsonWriter j;
  j.begin_object();
  j.field("restored", restored.restored);
  j.key("cut");
  if (restored.cut) {
    j.value(*restored.cut);
  } else {
    j.null();
  }
  j.field("generation", restored.generation);
  j.field("withdrawn_jobs", restored.withdrawn_jobs);
  j.field("leases_voided", restored.leases_voided);
  j.field("state", run_state_name(r.run->state()));
  j.end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::next_index(Request& r) {
  TC_TRY_ASSIGN(set, r.body->string("set"));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  if (set != "train" && set != "dev") {
    return error_reply(400, "invalid_argument", "set must be \"train\" or \"dev\"", "set");
  }
  TC_TRY_ASSIGN(index, r.run->next_index(set == "train" ? SetKind::kTrain : SetKind::kDev));
  JsonWriter j;
  j.begin_object().field("set", set).field("epoch", index.epoch).field("position", index.position);
  j.key("batch");
  if (index.batch) {
    j.value(*index.batch);
  } else {
    j.null();
  }
  j.end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::leave(Request& r) {
  TC_TRY_ASSIGN(worker, worker_field(*r.body, *r.run));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  TC_TRY_REPLY(r.run->leave(worker));
  JsonWriter j;
  j.begin_object().field("left", true).end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::heartbeat(Request& r) {
  TC_TRY_ASSIGN(worker, worker_field(*r.body, *r.run));
  std::optional<std::vector<LeaseId>> only;
  if (const rapidjson::Value* listed = r.body->get("leases")) {
    if (!listed->IsArray() || listed->Size() > 1024) {
      return error_reply(400, "invalid_argument",
                         "leases must be an array of at most 1024 lease ids", "leases");
    }
    only.emplace();
    for (const auto& l : listed->GetArray()) {
      if (!l.IsUint64()) {
        return error_reply(400, "invalid_argument", "leases must hold lease ids", "leases");
      }
      only->push_back(l.GetUint64());
    }
  }
  TC_TRY_REPLY(r.body->no_unknown_fields());
  TC_TRY_ASSIGN(leases, r.run->heartbeat(worker, only ? &*only : nullptr));
  JsonWriter j;
  j.begin_object().key("leases").begin_array();
  for (LeaseId l : leases) j.value(l);
  j.end_array();
  j.field("lease_timeout_ms", r.run->config().lease_timeout_ms);
  j.field("state", run_state_name(r.run->state()));
  j.end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::release(Request& r) {
  TC_TRY_ASSIGN(worker, worker_field(*r.body, *r.run));
  const rapidjson::Value* listed = r.body->get("leases");
  if (listed == nullptr || !listed->IsArray() || listed->Size() > 1024) {
    return error_reply(400, "invalid_argument", "leases must be an array of at most 1024 lease ids",
                       "leases");
  }
  std::vector<LeaseId> leases;
  for (const auto& l : listed->GetArray()) {
    if (!l.IsUint64()) {
      return error_reply(400, "invalid_argument", "leases must hold lease ids", "leases");
    }
    leases.push_back(l.GetUint64());
  }
  TC_TRY_REPLY(r.body->no_unknown_fields());
  TC_TRY_ASSIGN(released, r.run->release(worker, leases));
  JsonWriter j;
  j.begin_object().field("released", released).end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::fail(Request& r) {
  TC_TRY_ASSIGN(worker, worker_field(*r.body, *r.run));
  TC_TRY_ASSIGN(lease, r.body->uint("lease"));
  TC_TRY_ASSIGN(reason,
                r.body->string("reason", std::string("no reason given"), 1024, TextKind::kMessage));
  TC_TRY_REPLY(r.body->no_unknown_fields());
  TC_TRY_REPLY(r.run->fail(worker, lease, reason));
  JsonWriter j;
  j.begin_object().field("failed", true).end_object();
  return ok(j);
}

Api::Request::Reply Api::Request::acquire(Request& r) { return acquire_or_complete(r, false); }

Api::Request::Reply Api::Request::complete(Request& r) { return acquire_or_complete(r, true); }

// acquire, and complete (with "next": true, complete + acquire); "jobs": N for several at once.
Api::Request::Reply Api::Request::acquire_or_complete(Request& r, bool complete) {
  TC_TRY_ASSIGN(worker, worker_field(*r.body, *r.run));
  ParkedAcquire acquiring;
  acquiring.run = r.run->config().name;
  acquiring.worker = worker;
  acquiring.group = r.group;
  if (complete) {
    std::vector<LeaseCompletion> items;
    const bool listed = r.body->has("completions");
    if (listed) {
      for (const char* single : {"lease", "loss", "samples", "metrics", "seconds"}) {
        if (r.body->has(single)) {
          return error_reply(400, "invalid_argument",
                             std::string(single) +
                                 " goes in each item of completions, not "
                                 "beside the list",
                             single);
        }
      }
      TC_TRY_ASSIGN(list, read_completions(*r.body));
      items = std::move(list);
    } else {
      TC_TRY_ASSIGN(lease, r.body->uint("lease"));
      TC_TRY_ASSIGN(completion, read_completion(*r.body));
      items.emplace_back(lease, std::move(completion));
    }
    TC_TRY_ASSIGN(next, r.body->boolean("next", false));
    if (!next) {
      if (r.body->has("jobs")) {
        return error_reply(400, "invalid_argument", "jobs needs \"next\": true", "jobs");
      }
      TC_TRY_REPLY(r.body->no_unknown_fields());
      TC_TRY_ASSIGN(outcomes, r.api.complete_all(*r.run, worker, items));
      JsonWriter j;
      j.begin_object();
      if (listed) {
        write_outcomes(j, outcomes);
      } else {
        write_completed(j, outcomes.front());
      }
      j.end_object();
      return ok(j);
    }
    TC_TRY_ASSIGN(wait_ms, r.body->uint("wait_ms", uint64_t{0}, kMaxWaitMs));
    TC_TRY_ASSIGN(request, r.body->uint("request", uint64_t{0}, UINT64_MAX));
    TC_TRY_ASSIGN(jobs, read_jobs(*r.body));
    TC_TRY_REPLY(r.body->no_unknown_fields());
    TC_TRY_ASSIGN(outcomes, r.api.complete_all(*r.run, worker, items));
    if (listed) {
      acquiring.outcomes = std::move(outcomes);
    } else {
      acquiring.completed = outcomes.front();
    }
    acquiring.deadline = r.now + static_cast<TimeMs>(wait_ms);
    acquiring.request = request;
    acquiring.max_jobs = jobs;
  } else {
    TC_TRY_ASSIGN(wait_ms, r.body->uint("wait_ms", uint64_t{0}, kMaxWaitMs));
    TC_TRY_ASSIGN(request, r.body->uint("request", uint64_t{0}, UINT64_MAX));
    TC_TRY_ASSIGN(jobs, read_jobs(*r.body));
    // How many epochs the worker knows were opened (the status's "epochs_total"):
    // when more were, a wait is answered at once instead of parked (docs/API.md).
    TC_TRY_ASSIGN(known, r.body->uint("epochs_opened", UINT64_MAX, UINT64_MAX));
    TC_TRY_REPLY(r.body->no_unknown_fields());
    acquiring.deadline = r.now + static_cast<TimeMs>(wait_ms);
    acquiring.request = request;
    acquiring.max_jobs = jobs;
    acquiring.epochs_opened = known == UINT64_MAX ? r.run->epochs().size() : known;
  }
  const WorkerInfo& info = r.run->workers()[worker];
  const bool same_request = acquiring.request == 0 || (acquiring.request == info.last_request &&
                                                       info.last_request_lease == 0);
  TC_TRY_ASSIGN(a,
                r.run->acquire(worker, acquiring.request,
                               static_cast<uint32_t>(std::max<uint64_t>(acquiring.max_jobs, 1))));
  // A plain acquire that found nothing changed nothing but its worker's "last seen" (which
  // the journal does not keep), unless an event says otherwise (see handle()).
  r.api.changed_nothing_ = !complete && a.status != AcquireStatus::kJob && same_request;
  if (a.status == AcquireStatus::kWait && acquiring.deadline > r.now) {
    if (complete) acquiring.epochs_opened = r.run->epochs().size();
    if (acquiring.epochs_opened == r.run->epochs().size()) return acquiring;
  }
  return acquired_reply(*r.run, acquiring, a, r.now);
}

}  // namespace traincoord
