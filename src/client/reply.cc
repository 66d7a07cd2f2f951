#include "client/reply.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include <rapidjson/document.h>

#include "client/rendezvous.h"

namespace traincoord::client::reply {

namespace {

using rapidjson::Value;

// Reads the fields of one reply, remembering the first one that is missing or of another type.
// After that every read returns a placeholder, and the caller returns error() instead: the
// values read are used only when ok().
class Reader {
 public:
  explicit Reader(std::string_view what) : what_(what) {}

  bool ok() const { return !problem_; }
  ClientError error() const {
    return ClientError{200, std::string(codes::kBadReply), *problem_, {}};
  }
  void fail(const std::string& why) {
    if (!problem_) {
      problem_ = "the reply to " + what_ + " " + why +
                 " (is the coordinator of another version than this client?)";
    }
  }

  // The document's top object, or null (and the error) when `body` is not a JSON object.
  const Value* top(rapidjson::Document& d, const std::string& body) {
    parse(d, body);
    if (d.HasParseError() || !d.IsObject()) {
      fail("is not a JSON object: " + body.substr(0, 200));
      return nullptr;
    }
    return &d;
  }

  const Value* object(const Value& o, const std::string& path, const char* key) {
    return get(o, path, key, &Value::IsObject, "an object");
  }
  const Value* array(const Value& o, const std::string& path, const char* key) {
    return get(o, path, key, &Value::IsArray, "an array");
  }
  std::string string(const Value& o, const std::string& path, const char* key) {
    const Value* v = get(o, path, key, &Value::IsString, "a string");
    return v ? std::string(v->GetString(), v->GetStringLength()) : std::string();
  }
  bool boolean(const Value& o, const std::string& path, const char* key) {
    const Value* v = get(o, path, key, &Value::IsBool, "true or false");
    return v && v->GetBool();
  }
  uint64_t uint64(const Value& o, const std::string& path, const char* key) {
    const Value* v = get(o, path, key, &Value::IsUint64, "an unsigned integer");
    return v ? v->GetUint64() : 0;
  }
  uint32_t uint32(const Value& o, const std::string& path, const char* key) {
    const Value* v = get(o, path, key, &Value::IsUint, "an unsigned 32-bit integer");
    return v ? v->GetUint() : 0;
  }
  int64_t int64(const Value& o, const std::string& path, const char* key) {
    const Value* v = get(o, path, key, &Value::IsInt64, "an integer");
    return v ? v->GetInt64() : 0;
  }
  double number(const Value& o, const std::string& path, const char* key) {
    const Value* v = get(o, path, key, &Value::IsNumber, "a number");
    return v ? v->GetDouble() : 0;
  }
  bool has(const Value& o, const char* key) const { return o.HasMember(key); }
  // Absent or null: nullopt.
  std::optional<uint64_t> nullable_uint64(const Value& o, const std::string& path,
                                          const char* key) {
    const auto it = o.FindMember(key);
    if (it == o.MemberEnd() || it->value.IsNull()) return std::nullopt;
    return uint64(o, path, key);
  }
  // A list of unsigned 32-bit integers.
  std::vector<uint32_t> uint32s(const Value& o, const std::string& path, const char* key) {
    std::vector<uint32_t> out;
    if (const Value* list = array(o, path, key)) {
      for (const Value& v : list->GetArray()) {
        if (!v.IsUint()) {
          fail("has field '" + join(path, key) +
               "' that holds a value that is not an unsigned "
               "32-bit integer");
          break;
        }
        out.push_back(v.GetUint());
      }
    }
    return out;
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

 private:
  const Value* get(const Value& o, const std::string& path, const char* key,
                   bool (Value::*is)() const, const char* expected) {
    if (!ok()) return nullptr;
    const auto it = o.FindMember(key);
    if (it == o.MemberEnd()) {
      fail("lacks field '" + join(path, key) + "'");
      return nullptr;
    }
    if (!(it->value.*is)()) {
      fail("has field '" + join(path, key) + "' that is not " + expected);
      return nullptr;
    }
    return &it->value;
  }

  std::string what_;
  std::optional<std::string> problem_;
};

Job read_job(Reader& r, const Value& v, const std::string& path) {
  Job job;
  job.lease = r.uint64(v, path, "lease");
  job.attempt = r.uint32(v, path, "attempt");
  job.set = r.string(v, path, "set");
  job.epoch = r.int64(v, path, "epoch");
  job.index = r.uint64(v, path, "index");
  job.jobs_in_epoch = r.uint64(v, path, "jobs_in_epoch");
  if (const Value* batches = r.array(v, path, "batches")) {
    for (const Value& b : batches->GetArray()) {
      if (!b.IsUint64()) {
        r.fail("has field '" + Reader::join(path, "batches") + "' that holds a non-batch number");
        break;
      }
      job.batches.push_back(b.GetUint64());
    }
  }
  // Step mode: the job is one rank's batch of one step, its samples listed. All of these or
  // none (a job-mode job).
  static constexpr const char* kStepFields[] = {"rank", "step", "steps", "loss_scale", "samples"};
  if (r.ok() && std::any_of(std::begin(kStepFields), std::end(kStepFields),
                            [&](const char* key) { return r.has(v, key); })) {
    job.rank = r.uint32(v, path, "rank");
    job.step = r.uint64(v, path, "step");
    job.steps = r.uint64(v, path, "steps");
    job.loss_scale = r.number(v, path, "loss_scale");
    if (const Value* samples = r.array(v, path, "samples")) {
      job.samples.reserve(samples->Size());
      for (const Value& s : samples->GetArray()) {
        if (!s.IsUint64()) {
          r.fail("has field '" + Reader::join(path, "samples") +
                 "' that holds a value that is not a sample index");
          break;
        }
        job.samples.push_back(s.GetUint64());
      }
    }
    if (r.ok() && job.step >= job.steps) {
      r.fail("has field '" + Reader::join(path, "step") + "' " + std::to_string(job.step) +
             " not below its 'steps' " + std::to_string(job.steps));
    }
    if (r.ok() && !(std::isfinite(job.loss_scale) && job.loss_scale >= 0)) {
      r.fail("has field '" + Reader::join(path, "loss_scale") +
             "' that is not a finite number of at least 0");
    }
  }
  return job;
}

// Each item of a list of objects `key` of `o`, given to `read` with its path ("jobs[2]").
template <typename F>
void each_object(Reader& r, const Value& o, const std::string& path, const char* key, F&& read) {
  const Value* list = r.array(o, path, key);
  if (list == nullptr) return;
  size_t i = 0;
  for (const Value& item : list->GetArray()) {
    const std::string where = Reader::join(path, key) + "[" + std::to_string(i++) + "]";
    if (!item.IsObject()) {
      r.fail("has field '" + where + "' that is not an object");
      return;
    }
    read(item, where);
    if (!r.ok()) return;
  }
}

Acquired read_acquired(Reader& r, const Value& a, const std::string& path, bool listed) {
  Acquired out;
  const std::string status = r.string(a, path, "status");
  if (!r.ok()) return out;
  if (status == "job") {
    out.status = Acquired::Status::kJob;
    if (listed) {
      each_object(r, a, path, "jobs", [&](const Value& v, const std::string& where) {
        out.jobs.push_back(read_job(r, v, where));
      });
      if (r.ok() && out.jobs.empty()) {
        r.fail("has status 'job' but an empty '" + Reader::join(path, "jobs") + "'");
      }
    } else if (const Value* job = r.object(a, path, "job")) {
      out.jobs.push_back(read_job(r, *job, Reader::join(path, "job")));
    }
  } else if (status == "finished") {
    out.status = Acquired::Status::kFinished;
    out.finished.state = r.string(a, path, "state");
    out.finished.reason = r.string(a, path, "reason");
  } else if (status == "wait") {
    out.status = Acquired::Status::kWait;
  } else {
    r.fail("has field '" + Reader::join(path, "status") + "' with the unknown value '" +
           status.substr(0, 64) + "'");
  }
  return out;
}

Completed read_completed(Reader& r, const Value& o, const std::string& path) {
  Completed c;
  c.outcome = r.string(o, path, "outcome");
  c.counted = r.boolean(o, path, "counted");
  return c;
}

Cut read_cut(Reader& r, const Value& v, const std::string& path) {
  Cut c;
  c.id = r.uint64(v, path, "id");
  c.group = r.string(v, path, "group");
  c.seq = r.uint64(v, path, "seq");
  c.generation = r.uint64(v, path, "generation");
  c.complete = r.boolean(v, path, "complete");
  c.world_size = r.uint32(v, path, "world_size");
  c.ranks = r.uint32s(v, path, "ranks");
  c.created_ago = std::chrono::milliseconds(r.int64(v, path, "created_ago_ms"));
  if (const auto ago = r.nullable_uint64(v, path, "completed_ago_ms")) {
    c.completed_ago = std::chrono::milliseconds(*ago);
  }
  if (r.ok() && c.complete) {
    c.state = r.string(v, path, "state");
    if (r.has(v, "epoch")) {
      c.epoch = r.int64(v, path, "epoch");
      c.set = r.string(v, path, "set");
    }
    c.jobs_done = r.uint64(v, path, "jobs_done");
    c.partial_jobs = r.uint64(v, path, "partial_jobs");
    c.partial_batches = r.uint64(v, path, "partial_batches");
  }
  return c;
}

}  // namespace

Result<Registration> registration(const std::string& body, std::string_view what) {
  Reader r(what);
  rapidjson::Document d;
  const Value* top = r.top(d, body);
  Registration out;
  if (top != nullptr) {
    out.worker = r.uint32(*top, "", "worker");
    if (r.has(*top, "heartbeat_interval_ms")) {
      // Bounded both ways: 0 must not make a busy loop of heartbeats.
      out.heartbeat_interval_ms =
          std::clamp<int64_t>(r.int64(*top, "", "heartbeat_interval_ms"),
                              kHeartbeatIntervalMin.count(), kHeartbeatIntervalMax.count());
    }
    if (r.has(*top, "generation")) out.generation = r.uint64(*top, "", "generation");
    if (r.has(*top, "group_state")) {
      const std::string state = r.string(*top, "", "group_state");
      if (r.ok() && state != "current" && state != "restore_required") {
        r.fail("has field 'group_state' with the unknown value '" + state.substr(0, 64) + "'");
      }
      out.restore_required = state == "restore_required";
    }
    out.latest_cut = r.nullable_uint64(*top, "", "latest_cut");
  }
  if (!r.ok()) return tl::unexpected(r.error());
  return out;
}

Result<Acquired> acquired(const std::string& body, bool listed, std::string_view what) {
  Reader r(what);
  rapidjson::Document d;
  const Value* top = r.top(d, body);
  Acquired out;
  if (top != nullptr) out = read_acquired(r, *top, "", listed);
  if (!r.ok()) return tl::unexpected(r.error());
  return out;
}

Result<CompletionReply> completion(const std::string& body, bool listed, size_t sent, bool next,
                                   std::string_view what) {
  Reader r(what);
  rapidjson::Document d;
  const Value* top = r.top(d, body);
  CompletionReply out;
  if (top != nullptr) {
    if (listed) {
      each_object(r, *top, "", "outcomes", [&](const Value& o, const std::string& where) {
        out.outcomes.push_back(read_completed(r, o, where));
      });
      if (r.ok() && out.outcomes.size() != sent) {
        r.fail("has " + std::to_string(out.outcomes.size()) + " outcomes for " +
               std::to_string(sent) + " completions");
      }
    } else {
      out.outcomes.push_back(read_completed(r, *top, ""));
    }
    if (next) {
      if (const Value* a = r.object(*top, "", "next"))
        out.next = read_acquired(r, *a, "next", listed);
    }
  }
  if (!r.ok()) return tl::unexpected(r.error());
  return out;
}

Result<CutShareTaken> cut_share(const std::string& body, std::string_view what) {
  Reader r(what);
  rapidjson::Document d;
  const Value* top = r.top(d, body);
  CutShareTaken out;
  if (top != nullptr) {
    out.cut = r.uint64(*top, "", "cut");
    out.complete = r.boolean(*top, "", "complete");
    out.ranks = r.uint32s(*top, "", "ranks");
    out.world_size = r.uint32(*top, "", "world_size");
    out.generation = r.uint64(*top, "", "generation");
  }
  if (!r.ok()) return tl::unexpected(r.error());
  return out;
}

Result<Cut> cut(const std::string& body, std::string_view what) {
  Reader r(what);
  rapidjson::Document d;
  const Value* top = r.top(d, body);
  Cut out;
  if (top != nullptr) out = read_cut(r, *top, "");
  if (!r.ok()) return tl::unexpected(r.error());
  return out;
}

Result<CutList> cut_list(const std::string& body, std::string_view what) {
  Reader r(what);
  rapidjson::Document d;
  const Value* top = r.top(d, body);
  CutList out;
  if (top != nullptr) {
    out.keep = r.uint64(*top, "", "keep");
    out.generation = r.uint64(*top, "", "generation");
    const auto group = top->FindMember("group");
    if (group == top->MemberEnd() || !group->value.IsNull())
      out.group = r.string(*top, "", "group");
    each_object(r, *top, "", "cuts", [&](const Value& v, const std::string& where) {
      out.cuts.push_back(read_cut(r, v, where));
    });
  }
  if (!r.ok()) return tl::unexpected(r.error());
  return out;
}

Result<Restored> restored(const std::string& body, std::string_view what) {
  Reader r(what);
  rapidjson::Document d;
  const Value* top = r.top(d, body);
  Restored out;
  if (top != nullptr) {
    out.restored = r.boolean(*top, "", "restored");
    out.cut = r.nullable_uint64(*top, "", "cut");
    out.generation = r.uint64(*top, "", "generation");
    out.withdrawn_jobs = r.uint64(*top, "", "withdrawn_jobs");
    out.leases_voided = r.uint64(*top, "", "leases_voided");
    out.state = r.string(*top, "", "state");
  }
  if (!r.ok()) return tl::unexpected(r.error());
  return out;
}

namespace {

// The enumerator of `E` (from 0 to `last`) whose name (`name_of`) is field `key`'s value;
// `what` names the kind in the message when none is.
template <typename E, typename NameOf>
E named(Reader& r, const Value& top, const char* key, E last, NameOf name_of, const char* what) {
  const std::string name = r.string(top, "", key);
  std::string known;
  for (int i = 0; i <= static_cast<int>(last); ++i) {
    const E e = static_cast<E>(i);
    if (name == name_of(e)) return e;
    known += (known.empty() ? "" : ", ") + std::string(name_of(e));
  }
  r.fail("has field '" + std::string(key) + "' that is '" + name + "', not " + what +
         " this client knows (" + known + ")");
  return E{};
}

// A running node's layout (the fields the coordinator writes only then), checked to hold
// together.
void read_layout(Reader& r, const Value& top, Assignment& out) {
  out.node_rank = r.uint32(top, "", "node_rank");
  out.nnodes = r.uint32(top, "", "nnodes");
  out.world_size = r.uint32(top, "", "world_size");
  out.rank_offset = r.uint32(top, "", "rank_offset");
  out.master_addr = r.string(top, "", "master_addr");
  const uint64_t port = r.uint64(top, "", "master_port");
  out.group = r.string(top, "", "group");
  if (!r.ok()) return;
  if (out.node_rank >= out.nnodes) {
    r.fail("has node_rank " + std::to_string(out.node_rank) + ", not below nnodes " +
           std::to_string(out.nnodes));
  } else if (out.rank_offset >= out.world_size) {
    r.fail("has rank_offset " + std::to_string(out.rank_offset) + ", not below world_size " +
           std::to_string(out.world_size));
  } else if (port > 65535) {
    r.fail("has field 'master_port' that is " + std::to_string(port) + ", not a port");
  } else if (out.master_addr.empty() || out.group.empty()) {
    r.fail(std::string("has an empty field '") + (out.group.empty() ? "group" : "master_addr") +
           "'");
  }
  out.master_port = static_cast<uint16_t>(port);
}

}  // namespace

Result<Assignment> assignment(const std::string& body, std::string_view what) {
  Reader r(what);
  rapidjson::Document d;
  const Value* top = r.top(d, body);
  Assignment out;
  if (top != nullptr) {
    out.state = named(r, *top, "state", NodeState::kRestart, node_state_name, "a node state");
    out.round = r.uint64(*top, "", "round");
    out.restart_count = r.uint64(*top, "", "restart_count");
    out.run_state = named(r, *top, "run_state", RunState::kFailed, run_state_name, "a run state");
    if (r.ok() && out.state == NodeState::kRunning) read_layout(r, *top, out);
    if (r.ok() && out.state == NodeState::kRestart) out.why = r.string(*top, "", "why");
  }
  if (!r.ok()) return tl::unexpected(r.error());
  return out;
}

Result<void> left(const std::string& body, std::string_view what) {
  Reader r(what);
  rapidjson::Document d;
  const Value* top = r.top(d, body);
  if (top != nullptr && !r.boolean(*top, "", "left") && r.ok()) r.fail("says 'left': false");
  if (!r.ok()) return tl::unexpected(r.error());
  return {};
}

void parse(rapidjson::Document& d, const std::string& body) {
  d.Parse<rapidjson::kParseIterativeFlag>(body.data(), body.size());
}

ClientError error(int status, const std::string& body, std::string_view what,
                  std::string_view reason, std::string_view location) {
  ClientError e{status, "http_" + std::to_string(status), "", {}};
  rapidjson::Document d;
  parse(d, body);
  const Value* err = nullptr;
  if (!d.HasParseError() && d.IsObject()) {
    // (HasMember, not FindMember != MemberEnd: rapidjson 1.1's iterator comparisons are
    // ambiguous in C++20, clang says)
    if (d.HasMember("error") && d["error"].IsObject()) err = &d["error"];
  }
  auto text = [&](const char* key, std::string* out) {
    if (err == nullptr) return;
    const auto it = err->FindMember(key);
    if (it != err->MemberEnd() && it->value.IsString() && it->value.GetStringLength() > 0) {
      *out = std::string(it->value.GetString(), it->value.GetStringLength());
    }
  };
  text("code", &e.code);
  text("message", &e.message);
  text("field", &e.field);
  if (e.message.empty()) {
    e.message = std::string(what) + " was answered HTTP " + std::to_string(status);
    if (!reason.empty()) e.message += " " + std::string(reason.substr(0, 64));
    if (!location.empty()) {
      e.message += ", to " + std::string(location.substr(0, 200)) +
                   " (the client follows no redirects: give the coordinator's own url)";
    }
    if (!body.empty()) e.message += ": " + body.substr(0, 200);
  }
  return e;
}

std::optional<NotLeader> not_leader(int status, const std::string& body) {
  if (status != 421) return std::nullopt;
  rapidjson::Document d;
  parse(d, body);
  if (d.HasParseError() || !d.IsObject()) return std::nullopt;
  if (!d.HasMember("error") || !d["error"].IsObject()) return std::nullopt;
  const Value& e = d["error"];
  const auto code = e.FindMember("code");
  if (code == e.MemberEnd() || !code->value.IsString() ||
      std::string_view(code->value.GetString(), code->value.GetStringLength()) !=
          codes::kNotLeader) {
    return std::nullopt;
  }
  NotLeader out;
  if (const auto it = e.FindMember("leader"); it != e.MemberEnd() && it->value.IsString()) {
    out.leader.assign(it->value.GetString(), it->value.GetStringLength());
  }
  if (const auto it = e.FindMember("term"); it != e.MemberEnd() && it->value.IsUint64()) {
    out.term = it->value.GetUint64();
  }
  if (const auto it = e.FindMember("retry_after_ms"); it != e.MemberEnd() && it->value.IsInt64()) {
    out.retry_after_ms = std::clamp<int64_t>(it->value.GetInt64(), 0, 10'000);
  }
  return out;
}

bool unregistered(const ClientError& e) { return e.code == codes::kWorkerNotRegistered; }

bool forgotten(const ClientError& e) {
  return e.code == codes::kWorkerNotRegistered || e.code == codes::kLeaseUnknown;
}

}  // namespace traincoord::client::reply
