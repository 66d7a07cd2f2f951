// The coordinator's loop, without sockets or threads: a batch of calls in, a wave out — the
// journal writes the calls made, and the replies that may go out once those writes are durable.
// It owns what the server decides itself: the token check, parked (long-poll) acquires and
// their retries, the tick that expires leases, what the journal keeps of each request, and the
// stand-still while the journal is out of room. The HTTP layer (server/http_server.h) is
// transport only: it hands calls in, writes each wave (the commit pipeline) and sends its
// replies. Driven by a manual clock and an in-memory journal, it is what the server's seeded
// simulation runs (server/coordinator_simulation_test.cc).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/engine.h"
#include "journal/journal.h"
#include "server/api.h"
#include "server/server_clock.h"

namespace traincoord {

class Auth;
class Leadership;

// Feeds a journal what the API reports (created runs, accepted completions).
class JournalObserver final : public ApiObserver {
 public:
  explicit JournalObserver(Journal& journal) : journal_(journal) {}
  void run_created(const Run& run, std::string_view config_json, TimeMs now) override;
  void completion_accepted(const Run& run, WorkerId worker, LeaseId lease,
                           const Completed& completed, const Completion& completion,
                           TimeMs now) override;
  void config_changed(const Run& run, std::string_view format, std::string_view text) override;

 private:
  Journal& journal_;
};

// Where a reply goes: the transport's business; the coordinator only carries it along.
struct ReplyTo {
  std::function<void(HttpReply)> respond;
  std::chrono::steady_clock::time_point received{};  // for the latency histogram
};

// A request, and the way back to its caller.
struct Call {
  HttpRequest request;
  ReplyTo to;
};

// A reply, and where it goes.
struct Outgoing {
  ReplyTo to;
  HttpReply reply;
  std::string_view endpoint;  // a literal from the endpoint table (metrics label)
  // High availability: the run it is about, and the generation of this coordinator's leadership
  // of that run it was produced under (0: not a leader's reply, e.g. 421 not_leader: sent as it
  // is). The commit thread sends it only while that leadership lasts (server/leadership.h).
  std::string run;
  uint64_t generation = 0;
};

// What one step produced. `replies` may be sent only once `writes` is written (and must be
// sent in order); `writes` is null without a journal (nothing to write: send at once).
struct Wave {
  std::unique_ptr<JournalBatch> writes;
  std::vector<Outgoing> replies;
  // What the operator should hear of (a pause of the process, the journal out of room).
  std::vector<std::string> notices;
  bool empty() const { return (!writes || writes->empty()) && replies.empty(); }
};

struct CoordinatorOptions {
  ApiLimits limits;
  Auth* auth = nullptr;  // null: no tokens needed; else checked before anything else
  TimeMs tick_ms = 50;   // lease expiries and long-poll deadlines, this often
  // High availability (docs/HA.md): null: this coordinator alone serves its runs. Else leadership
  // is per run: every request about a run it does not lead (and POST /v1/runs of a run that
  // exists elsewhere) is answered 421 not_leader naming that run's leader; a reply about a run
  // it leads carries Traincoord-Term and Traincoord-Leader and the leadership's generation
  // (Outgoing); a run created here is led here (Leadership::lead).
  Leadership* leadership = nullptr;
};

class Coordinator {
 public:
  // REQUIRES: `engine`, `clock` (the engine's clock) and `journal` (null: none, the state
  // lives in memory only) outlive the coordinator, and only its caller's thread touches them.
  Coordinator(Engine& engine, ServerClock& clock, Journal* journal, CoordinatorOptions options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Answers `calls` in order at the clock's time (each request at an instant of its own), gives
  // the parked acquires of the runs they touched another try, runs the tick when it is due,
  // and takes the journal's writes. `journal_full`: the journal is short of room (the commit
  // pipeline says so): no new work is taken (503 disk_full), GETs are answered, and the runs'
  // time stands still until it has room again. Leaves `calls` empty.
  Wave step(std::vector<Call>& calls, bool journal_full = false);

  // How long until step() is needed with no calls (the tick, or a long poll's deadline):
  // at least 1 ms, at most the tick.
  TimeMs next_wakeup_ms() const;
  // Acquires waiting for work (long polls).
  size_t parked() const;
  // How many times a parked acquire was asked again (Api::retry), in all: its timeout's
  // answer included (GET /metrics: traincoord_parked_retries_total).
  uint64_t parked_retries() const { return parked_retries_; }

  // Adds the transport's own series to GET /metrics (called on this thread, in step()).
  void set_transport_metrics(std::function<void(std::string&)> append) {
    transport_metrics_ = std::move(append);
  }

  Api& api() { return api_; }

  // High availability: runs `task` on this coordinator's thread at the start of the next step()
  // (any thread may post; the engine thread steps at least every tick). How a run taken over
  // joins the engine while it serves the others.
  void post(std::function<void(Coordinator&)> task);
  Engine& engine() { return engine_; }
  ServerClock& clock() { return clock_; }
  // Answers the parked acquires of `run` 421 not_leader (its leadership here ended, or a new
  // one starts: they belong to the old one).
  void drop_parked(std::string_view run);

 private:
  struct Parked {
    ParkedAcquire acquire;
    ReplyTo to;
    std::string_view endpoint;
    // Step mode: the answer generation of its run (ParkedRun::generation) as of its last try,
    // which found nothing.
    uint64_t seen = 0;
  };
  // What of a run could answer a parked acquire of it, as the coordinator sees it: a parked
  // acquire is asked again only once this has changed since its last try (step mode; see
  // serve_parked). Reports alone (acquire, complete, heartbeat) change none of it unless they
  // open or close an epoch, end the run or expire a lease on their way (each an event), which
  // is what lets W ranks parked at an epoch's end wait without W retries per report.
  struct AnswerKey {
    const Run* run = nullptr;
    uint64_t events = 0;    // Run::event_seq(): epochs opened and closed, leases expired, ...
    uint64_t epochs = 0;    // epochs opened (a parked acquire is answered "wait" when one opens)
    uint64_t expiries = 0;  // batches given back, to their rank: by a lease running out, ...
    uint64_t failures = 0;  // ... a failure report, ...
    uint64_t voided = 0;    // ... or a group taking the run over
    uint64_t restores = 0;
    uint64_t jobs_failed = 0;
    uint64_t cuts = 0;
    uint64_t workers = 0;
    uint64_t generation = 0;  // the group's (admission)
    uint64_t group_ranks = 0;
    uint64_t bumps = 0;   // ParkedRun::bumps
    uint64_t posted = 0;  // posted_runs_
    int state = 0;
    int mode = 0;
    bool operator==(const AnswerKey&) const = default;
  };
  // The parked acquires of one run.
  struct ParkedRun {
    std::deque<Parked> queue;
    // Requests that changed the run other than acquire, complete and heartbeat (a release, a
    // leave, a registration, a restore, a config change, a cut, ...): each may give a rank its
    // batch back or change who is admitted, so each counts as a change whatever it did.
    uint64_t bumps = 0;
    AnswerKey key;            // as of `generation`
    uint64_t generation = 0;  // + 1 whenever the key is seen changed
    TimeMs swept = 0;         // when every parked acquire was last tried, changed or not
  };

  HttpReply serve_get(const HttpRequest& request);
  void record(std::string_view run, TimeMs t, RecordKind kind, std::string_view target,
              std::string_view body, int outcome, std::string_view reply);
  std::optional<HttpReply> retry(const ParkedAcquire& parked, bool timed_out);
  AnswerKey answer_key(std::string_view run, const ParkedRun& parked);
  // The run's answer generation, advanced first if its key changed since it was last taken.
  uint64_t refresh(std::string_view run, ParkedRun& parked);
  // `sweep`: every parked acquire of the run is tried, changed or not.
  void serve_parked(std::string_view run, ParkedRun& parked, TimeMs now, bool sweep);
  void journal_full_changed(bool full, std::vector<std::string>* notices);

  Engine& engine_;
  ServerClock& clock_;
  Journal* journal_;
  CoordinatorOptions options_;
  std::unique_ptr<JournalObserver> observer_;
  Api api_;
  // Queues a reply, stamped with its run's leadership (HA).
  void reply(ReplyTo to, HttpReply reply, std::string_view endpoint, std::string_view run);

  std::vector<Outgoing> outbox_;
  std::mutex posted_mu_;
  std::vector<std::function<void(Coordinator&)>> posted_;
  std::map<std::string, ParkedRun, std::less<>> parked_;
  uint64_t posted_runs_ = 0;  // posted tasks run (HA: a run taken over replaces its Run)
  std::function<void(std::string&)> transport_metrics_;
  TimeMs last_tick_;
  uint64_t parked_retries_ = 0;
  uint64_t pauses_seen_ = 0;    // clock_.pauses() when last told
  TimeMs skipped_told_ms_ = 0;  // clock_.skipped_ms() when last told
};

}  // namespace traincoord
