#include "server/coordinator.h"

#include <algorithm>

#include "config/config_file.h"
#include "json/json_writer.h"
#include "server/auth.h"
#include "server/leadership.h"
#include "server/web_assets.h"

namespace traincoord {

namespace {

// Step mode: how often every parked acquire is tried whether its run changed or not.
constexpr TimeMs kSweepMs = 1000;

std::string_view path_of(std::string_view target) { return target.substr(0, target.find('?')); }

HttpReply journal_full_reply() {
  return error_reply(503, "disk_full",
                     "the coordinator's disk is full: it takes no new work until there is room "
                     "again (what it accepted is kept); retry later");
}

// Whether a request needs the runs' leader: every request about a run, and creating one.
bool needs_leader(const HttpRequest& request) {
  const std::string_view path = path_of(request.target);
  return path.rfind("/v1/runs/", 0) == 0 || (path == "/v1/runs" && request.method != "GET");
}

std::string leader_headers(const Leadership::View& view) {
  return "Traincoord-Term: " + std::to_string(view.term) + "\r\nTraincoord-Leader: " + view.leader +
         "\r\n";
}

// 421 Misdirected Request: this coordinator does not lead; where the leader is, if known
// (docs/HA.md; the clients follow `leader`, or wait `retry_after_ms` and try their other URLs).
HttpReply not_leader_reply(std::string_view run, const Leadership::View& view) {
  JsonWriter j;
  j.begin_object().key("error").begin_object();
  j.field("code", error_reason::kNotLeader);
  j.field("message", view.term > 0
                         ? "this coordinator does not lead run " + std::string(run) +
                               "; its leader is " + view.leader
                         : "this coordinator does not lead run " + std::string(run) +
                               ", and no leader of it is known now (an election is under way); "
                               "retry shortly");
  j.key("leader");
  if (view.term > 0) {
    j.value(view.leader);
  } else {
    j.null();
  }
  j.key("term");
  if (view.term > 0) {
    j.value(static_cast<long long>(view.term));
  } else {
    j.null();
  }
  j.field("retry_after_ms", 250);
  j.end_object().end_object();
  HttpReply reply{421, j.str(), {}, "application/json"};
  if (view.term > 0) reply.headers = leader_headers(view);
  return reply;
}

}  // namespace

void JournalObserver::run_created(const Run& run, std::string_view config_json, TimeMs now) {
  journal_.add_run(run.config().name, kStoredJson, config_json, now);
}

void JournalObserver::completion_accepted(const Run& run, WorkerId worker, LeaseId lease,
                                          const Completed& completed, const Completion& completion,
                                          TimeMs now) {
  journal_.add_completion({run.config().name, lease, run.workers()[worker].name,
                           set_name(completed.set), completed.epoch, completed.job, completion.loss,
                           completion.samples, &completion.metrics, now});
}

void JournalObserver::config_changed(const Run& run, std::string_view format,
                                     std::string_view text) {
  journal_.add_config(run.config().name, format, text);
}

Coordinator::Coordinator(Engine& engine, ServerClock& clock, Journal* journal,
                         CoordinatorOptions options)
    : engine_(engine),
      clock_(clock),
      journal_(journal),
      options_(options),
      observer_(journal ? std::make_unique<JournalObserver>(*journal) : nullptr),
      api_(engine, clock, options.limits),
      last_tick_(clock.now()) {
  api_.set_observer(observer_.get());
}

Coordinator::~Coordinator() = default;

Wave Coordinator::step(std::vector<Call>& calls, bool journal_full) {
  Wave wave;
  {
    std::vector<std::function<void(Coordinator&)>> posted;
    {
      std::lock_guard lock(posted_mu_);
      posted.swap(posted_);
    }
    for (auto& task : posted) task(*this);
    posted_runs_ += posted.size();
  }
  if (journal_full != clock_.frozen()) journal_full_changed(journal_full, &wave.notices);
  std::vector<std::string_view> touched;  // views into the calls' targets
  for (Call& call : calls) {
    const HttpRequest& request = call.request;
    // The endpoint table is scanned once a request: for the metrics label, the token check and
    // the handler (three scans were ~5% of a job cycle's instructions: docs/PERFORMANCE.md).
    const Endpoint* found = Api::find_endpoint(request.method, request.target);
    const std::string_view endpoint = found ? found->name : "other";
    if (options_.auth) {
      // Refused before anything happens: nothing to log, nothing changed.
      if (auto refused = options_.auth->check(found, request.target, request.authorization)) {
        outbox_.push_back({std::move(call.to), std::move(*refused), endpoint, {}, 0});
        continue;
      }
    }
    // High availability: the run this request is about (a created run: the one its body names).
    std::string about;
    if (options_.leadership && needs_leader(request)) {
      about = std::string(Api::run_of(request.target));
      if (about.empty() && endpoint == "create_run") {
        if (auto config = parse_run_config_json(request.body, "run config")) about = config->name;
      }
      const Leadership::View view = options_.leadership->view(about);
      if (!about.empty() && !view.leading &&
          (view.known || (endpoint != "create_run" && engine_.find(about)))) {
        // (a run held here but known to no leader: its create never landed in etcd, and the
        // next read of etcd forgot it; nothing of it is written, so nothing is answered)
        outbox_.push_back({std::move(call.to), not_leader_reply(about, view), endpoint, about, 0});
        continue;
      }
    }
    if (request.method == "GET" &&
        (endpoint == "metrics" || endpoint == "dashboard" || endpoint == "coordinator")) {
      outbox_.push_back({std::move(call.to), serve_get(request), endpoint, {}, 0});
      continue;
    }
    if (journal_full && request.method != "GET") {
      // Nothing new is taken while the journal has no room; what was accepted is written first
      // (the commit pipeline retries it), reads go on.
      reply(std::move(call.to), journal_full_reply(), endpoint, about);
      continue;
    }
    const TimeMs t = clock_.hold();
    auto result = api_.handle(request, found);
    clock_.release();
    const std::string_view run = Api::run_of(request.target);
    if (request.method != "GET" && !run.empty()) {
      // The journal keeps what changed state, with how it was answered; nothing of a request
      // that changed nothing (docs/DURABILITY.md).
      const auto* reply = std::get_if<HttpReply>(&result);
      switch (api_.effect()) {
        case Effect::kNone:
          break;
        case Effect::kChanged:
          // The request's canonical body, not the bytes it came in (padding is not kept).
          record(run, t, RecordKind::kRequest, request.target, api_.journal_body(),
                 reply ? reply->status : kOutcomeParked,
                 reply ? std::string_view(reply->body) : "");
          touched.push_back(run);
          break;
        case Effect::kExpiredOnly:
          record(run, t, RecordKind::kExpire, "", "", kOutcomeUnknown, "");
          touched.push_back(run);
          break;
      }
      if (api_.effect() != Effect::kNone && endpoint != "acquire" && endpoint != "complete" &&
          endpoint != "heartbeat") {
        if (auto it = parked_.find(run); it != parked_.end()) it->second.bumps += 1;
      }
    }
    if (auto* reply = std::get_if<HttpReply>(&result)) {
      if (options_.leadership && endpoint == "create_run" && reply->status == 201) {
        // Led here: its first write creates it in etcd with this coordinator as its leader (or
        // is refused if it exists elsewhere: then it steps down and the reply is not sent).
        options_.leadership->lead(about, 0);
      }
      if (options_.auth && endpoint == "create_run" && reply->status == 201) {
        // Its workers' token, made now: a run is served only with a token to give its workers.
        for (const Run* r : engine_.runs()) {
          auto token = options_.auth->worker_token(r->config().name);
          if (!token) {
            wave.notices.push_back("cannot save the worker token of run " + r->config().name +
                                   ": " + token.error().message);
            *reply = error_reply(500, "token_not_saved",
                                 "run " + r->config().name +
                                     " was created, but its worker token could not be "
                                     "saved (" +
                                     token.error().message +
                                     "); its workers can use the admin token "
                                     "until the token dir is fixed and the server restarted");
          }
        }
      }
      this->reply(std::move(call.to), std::move(*reply), endpoint, about);
    } else {
      auto& acquire = std::get<ParkedAcquire>(result);
      auto entry = parked_.find(acquire.run);
      if (entry == parked_.end()) {
        entry = parked_.emplace(acquire.run, ParkedRun{}).first;
        entry->second.swept = clock_.now();
      }
      // (It found nothing as the run is now.)
      const uint64_t seen = refresh(acquire.run, entry->second);
      entry->second.queue.push_back(Parked{std::move(acquire), std::move(call.to), endpoint, seen});
    }
  }
  const TimeMs now = clock_.now();
  // Told once the time skipped since the last notice reaches a second: a loaded machine skips
  // a few tens of milliseconds now and then, which is no news to the user.
  if (clock_.pauses() != pauses_seen_ && clock_.skipped_ms() - skipped_told_ms_ >= 1000) {
    pauses_seen_ = clock_.pauses();
    skipped_told_ms_ = clock_.skipped_ms();
    char text[160];
    std::snprintf(text, sizeof text,
                  "the coordinator did not run for a while (stopped or stalled); %.3f s in all "
                  "not counted against leases",
                  static_cast<double>(clock_.skipped_ms()) / 1000.0);
    wave.notices.emplace_back(text);
  }
  if (journal_full) {
    // No tick: leases do not expire and parked acquires do not wait (their clock stands).
  } else if (now - last_tick_ >= options_.tick_ms) {
    last_tick_ = now;
    const TimeMs t = clock_.hold();
    const std::vector<std::string> expired = api_.expire_leases();
    clock_.release();
    for (const std::string& run : expired) {
      record(run, t, RecordKind::kExpire, "", "", kOutcomeUnknown, "");
    }
    for (auto& [run, entry] : parked_) {
      // Once a second every parked acquire is tried, changed or not: what the key does not see
      // (none known) costs a wait of at most that, not a long poll's.
      const bool sweep = now - entry.swept >= kSweepMs;
      if (sweep) entry.swept = now;
      serve_parked(run, entry, now, sweep);
    }
  } else {
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (const std::string_view run : touched) {
      auto it = parked_.find(run);
      if (it != parked_.end()) serve_parked(it->first, it->second, now, false);
    }
  }
  std::erase_if(parked_, [](const auto& entry) { return entry.second.queue.empty(); });
  if (journal_) wave.writes = journal_->take(engine_, /*snapshots=*/true, clock_.now());
  wave.replies = std::move(outbox_);
  outbox_.clear();
  calls.clear();  // (only now: `touched` viewed their targets)
  return wave;
}

void Coordinator::reply(ReplyTo to, HttpReply reply, std::string_view endpoint,
                        std::string_view run) {
  uint64_t generation = 0;
  if (options_.leadership && !run.empty()) {
    const Leadership::View view = options_.leadership->view(run);
    if (view.leading) {
      generation = view.generation;
      if (view.term > 0) reply.headers = leader_headers(view);
    } else if (view.known || (endpoint != "create_run" && engine_.find(run))) {
      // Its leadership ended while this was answered (another thread stepped it down: a write
      // refused, the lease lost), or it is a parked acquire's of a run no longer led here:
      // what it says may rest on records the journal no longer writes, so it is not said. The
      // client asks again where the run is led, and is answered from what etcd holds.
      reply = not_leader_reply(run, view);
    }
  }
  outbox_.push_back({std::move(to), std::move(reply), endpoint, std::string(run), generation});
}

void Coordinator::post(std::function<void(Coordinator&)> task) {
  std::lock_guard lock(posted_mu_);
  posted_.push_back(std::move(task));
}

void Coordinator::drop_parked(std::string_view run) {
  auto it = parked_.find(run);
  if (it == parked_.end()) return;
  const Leadership::View view =
      options_.leadership ? options_.leadership->view(run) : Leadership::View{};
  for (Parked& p : it->second.queue) {
    outbox_.push_back(
        {std::move(p.to), not_leader_reply(run, view), p.endpoint, std::string(run), 0});
  }
  parked_.erase(it);
}

void Coordinator::record(std::string_view run, TimeMs t, RecordKind kind, std::string_view target,
                         std::string_view body, int outcome, std::string_view reply) {
  if (journal_ && engine_.find(run))
    journal_->add_record(run, t, kind, target, body, outcome, reply);
}

// GET /metrics and the dashboard's files: nothing to log.
HttpReply Coordinator::serve_get(const HttpRequest& request) {
  const std::string_view path = path_of(request.target);
  if (path == "/metrics") {
    std::string text = api_.metrics_text();
    text +=
        "# HELP traincoord_parked_acquires Acquires waiting for work (long polls) now.\n"
        "# TYPE traincoord_parked_acquires gauge\ntraincoord_parked_acquires " +
        std::to_string(parked()) +
        "\n# HELP traincoord_parked_retries_total Times a parked acquire was asked again "
        "(something that could answer it changed, or its wait ran out).\n"
        "# TYPE traincoord_parked_retries_total counter\ntraincoord_parked_retries_total " +
        std::to_string(parked_retries_) + "\n";
    if (transport_metrics_) transport_metrics_(text);
    if (journal_) journal_->append_metrics(text);
    if (options_.leadership) options_.leadership->append_metrics(text);
    return HttpReply{200, std::move(text), {}, "text/plain; version=0.0.4; charset=utf-8"};
  }
  if (path == "/v1/coordinator") {
    // (answered by every coordinator, leader or standby: docs/HA.md "Watching it")
    return HttpReply{200,
                     options_.leadership
                         ? options_.leadership->to_json()
                         : R"({"mode":"single","url":null,"role":"leader","leader":null,)"
                           R"("journal":null,"takeovers":0,"stepdowns":0,)"
                           R"("last_takeover_ms":null,"last_takeover_s":null})",
                     {}};
  }
  if (const WebAsset* asset = find_web_asset(path)) {
    return HttpReply{
        200, std::string(asset->body), {}, std::string(asset->content_type) + "; charset=utf-8"};
  }
  return error_reply(404, "not_found", "no endpoint at " + request.target + " (see docs/API.md)");
}

// The journal found itself short of room (or has room again): time stands still for the runs
// meanwhile, and parked acquires are answered at once (503: retry later).
void Coordinator::journal_full_changed(bool full, std::vector<std::string>* notices) {
  if (full) {
    clock_.freeze();
    notices->push_back(
        (journal_ ? "the disk holding " + journal_->describe() + " has less than " +
                        std::to_string(journal_->reserve_bytes() >> 20) + " MiB free"
                  : std::string("the journal has no room")) +
        ": taking no new work (503) until there is room; reads go on, leases do not expire");
    for (auto& [run, entry] : parked_) {
      for (Parked& p : entry.queue) reply(std::move(p.to), journal_full_reply(), p.endpoint, run);
    }
    parked_.clear();
  } else {
    clock_.thaw();
    notices->push_back("the disk has room again: taking work");
  }
}

// Asks again for a parked acquire; the retry is an acquire of its own, and journalled as one
// when it changed something (handed out jobs, or expired leases on its way): as an acquire
// without a wait, which replays to the reply it got (200; a "wait" when it found nothing).
std::optional<HttpReply> Coordinator::retry(const ParkedAcquire& parked, bool timed_out) {
  parked_retries_ += 1;
  const TimeMs t = clock_.hold();
  auto reply = api_.retry(parked, timed_out);
  clock_.release();
  if (api_.effect() == Effect::kChanged) {
    record(parked.run, t, RecordKind::kRequest, "/v1/runs/" + parked.run + "/acquire",
           "{\"worker\":" + std::to_string(parked.worker) +
               ",\"request\":" + std::to_string(parked.request) +
               (parked.max_jobs > 0 ? ",\"jobs\":" + std::to_string(parked.max_jobs) : "") + "}",
           reply ? reply->status : 200,
           !api_.retried_as_acquire().empty() ? std::string_view(api_.retried_as_acquire())
           : reply                            ? std::string_view(reply->body)
                                              : std::string_view());
  }
  return reply;
}

Coordinator::AnswerKey Coordinator::answer_key(std::string_view name, const ParkedRun& parked) {
  AnswerKey k;
  k.bumps = parked.bumps;
  k.posted = posted_runs_;
  auto run = engine_.find(name);
  if (!run || !*run) return k;
  const Run& r = **run;
  const RunCounters& c = r.counters();
  k.run = &r;
  k.events = r.event_seq();
  k.epochs = r.epochs().size();
  k.expiries = c.lease_expiries;
  k.failures = c.failure_reports;
  k.voided = c.leases_voided;
  k.restores = c.restores;
  k.jobs_failed = c.jobs_failed;
  k.cuts = c.cuts;
  k.workers = r.workers().size();
  k.generation = r.generation();
  k.group_ranks = r.group_ranks();
  k.state = static_cast<int>(r.state());
  k.mode = static_cast<int>(r.mode());
  return k;
}

uint64_t Coordinator::refresh(std::string_view run, ParkedRun& parked) {
  AnswerKey key = answer_key(run, parked);
  if (!(key == parked.key)) {
    parked.key = key;
    parked.generation += 1;
  }
  return parked.generation;
}

// Answers the parked acquires no longer admitted (their group was replaced meanwhile: a
// restore, or a new group that took the run over), wherever they wait in the queue; then the
// others in arrival order while there is an answer; then times out those whose wait has run
// out.
//
// Job mode: any worker takes any job, so nothing for the first parked acquire is nothing for
// the others either: the first is asked, and the others only while there is an answer. Step
// mode: a rank is handed only its own batches (a batch given back goes to its rank), so
// nothing for one rank says nothing of the next: each may be asked, but only once its run has
// changed in a way that could answer it (AnswerKey) since its last try — W ranks parked at an
// epoch's end are asked once each when the next epoch opens, not once each per report of the
// ranks still training (W² retries per epoch on the engine thread).
void Coordinator::serve_parked(std::string_view name, ParkedRun& parked, TimeMs now, bool sweep) {
  std::deque<Parked>& queue = parked.queue;
  if (options_.leadership && !queue.empty()) {
    // High availability: a run whose leadership ended (on another thread) is not asked: what
    // it would hand out or accept is no longer written. Its acquires are answered not_leader
    // (drop_parked, posted when the leadership ended, may come a while later).
    const Leadership::View view = options_.leadership->view(name);
    if (!view.leading) {
      for (Parked& p : queue) {
        outbox_.push_back(
            {std::move(p.to), not_leader_reply(name, view), p.endpoint, std::string(name), 0});
      }
      queue.clear();
      return;
    }
  }
  const auto run = queue.empty() ? Result<Run*>(nullptr) : engine_.find(name);
  const bool each = run && *run && (*run)->mode() == ScheduleMode::kSteps;
  if (each) refresh(name, parked);
  // Whether an acquire may have another answer than at its last try.
  const auto changed = [&](const Parked& p) {
    return !each || sweep || p.seen != parked.generation;
  };
  for (auto it = queue.begin(); it != queue.end();) {
    if (!changed(*it)) {
      ++it;
    } else if (auto refused = api_.refusal(it->acquire)) {
      reply(std::move(it->to), std::move(*refused), it->endpoint, it->acquire.run);
      it = queue.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = queue.begin(); it != queue.end();) {
    if (!changed(*it)) {
      ++it;
      continue;
    }
    auto reply = retry(it->acquire, false);
    // (A retry may change what could answer the others: a lease it expired on its way.)
    if (each && api_.effect() != Effect::kNone) refresh(name, parked);
    if (!reply) {
      if (!each) break;
      it->seen = parked.generation;
      ++it;
      continue;
    }
    this->reply(std::move(it->to), std::move(*reply), it->endpoint, it->acquire.run);
    it = queue.erase(it);
  }
  for (auto it = queue.begin(); it != queue.end();) {
    if (it->acquire.deadline <= now) {
      reply(std::move(it->to), *retry(it->acquire, true), it->endpoint, it->acquire.run);
      it = queue.erase(it);
    } else {
      ++it;
    }
  }
}

TimeMs Coordinator::next_wakeup_ms() const {
  TimeMs wake = options_.tick_ms;
  const TimeMs now = clock_.now();
  for (const auto& [run, entry] : parked_) {
    for (const Parked& p : entry.queue)
      wake = std::min(wake, std::max<TimeMs>(1, p.acquire.deadline - now));
  }
  return wake;
}

size_t Coordinator::parked() const {
  size_t n = 0;
  for (const auto& [run, entry] : parked_) n += entry.queue.size();
  return n;
}

}  // namespace traincoord
