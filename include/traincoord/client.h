// traincoord's C++ client: what a C++ training program links to take jobs from a coordinator.
//
//   traincoord::client::Options options;
//   options.url = "http://10.0.0.1:8470";
//   options.run = "digits";
//   auto worker = traincoord::client::Worker::connect(options);   // registers
//   if (!worker) { std::cerr << worker.error().message; return 1; }
//   auto job = (*worker)->next();
//   while (job && *job) {
//     double loss = train((*job)->batches);
//     job = (*worker)->complete_and_next(**job, {.loss = loss, .samples = 32});
//   }
//   // job has no value: an error; *job == nullopt: the run is finished ((*worker)->finished()).
//
// Checkpoint cuts (docs/SEMANTICS.md, "Checkpoint cuts"): the ranks of one start of a training
// job share a group (Options::group). When the trainer saves a checkpoint, every rank gives its
// share of a cut (give_cut_share: the jobs it holds partly trained), and the checkpoint records
// the cut's id once it is complete (wait_for_cut). A restarted group registers under a new group
// and, when the run has cuts (restore_required()), restores the cut its checkpoint holds
// (restore) or goes on from the ledger as it is (start_fresh) before it asks for jobs.
//
// Step mode (docs/SEMANTICS.md, "Step mode"): each rank of a synchronous group sets its group,
// rank and world_size (rank_from_environment() takes them as `traincoord launch` sets them);
// each job is then one batch of one step (Job::step_mode()), its samples listed in
// Job::samples: scale the batch's mean loss by Job::loss_scale before backward().
//
// Guarantees: every call has a timeout; a coordinator that is down or restarting is retried
// with exponential backoff and jitter until `give_up_after` (with several coordinators, each in
// turn, following the leader), then the call fails with a clear error naming every url tried;
// leases are kept alive by a background heartbeat thread. Nothing blocks forever.
//
// Against a broken or hostile server: each request gets its whole reply within its timeout (a
// total deadline, however slowly the bytes come, interim "100 Continue" replies included), and
// reads at most Options::max_reply_bytes of it; replies are parsed without recursion (any
// depth); the heartbeat interval the coordinator asks for is kept within
// [kHeartbeatIntervalMin, kHeartbeatIntervalMax]. Every failure is a ClientError whose message
// names the request (or the url) and what happened.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

namespace traincoord::client {

namespace reply {
struct Acquired;  // src/client/reply.h
}

// The largest reply the client reads by default (Options::max_reply_bytes, and get()/post()).
inline constexpr size_t kMaxReplyBytes = size_t{64} << 20;  // 64 MiB
// The bounds of the heartbeat interval a coordinator may ask for (heartbeat_interval_ms).
inline constexpr std::chrono::milliseconds kHeartbeatIntervalMin{100};
inline constexpr std::chrono::milliseconds kHeartbeatIntervalMax{60'000};

struct Options {
  // http://HOST:PORT, or https://HOST:PORT (TLS). Several coordinators (high availability,
  // docs/API.md "Several coordinators"): their urls separated by commas, e.g. the value of
  // $TRAINCOORD_URL that `traincoord launch` sets. The client finds the one that leads the run
  // (a coordinator that does not answers not_leader, naming the leader), follows it when the
  // leadership moves, tries the next url when one does not answer, and ignores the answers of a
  // deposed leader (an older Traincoord-Term than one seen); every retry of a request carries
  // the same request id, so a completion whose reply was lost is answered as a duplicate.
  std::string url = "http://127.0.0.1:8470";
  std::string run;          // the run to work on
  std::string worker_name;  // stable name; default HOSTNAME-PID
  std::chrono::milliseconds connect_timeout{5'000};
  // One request, on top of a long poll: its whole reply must come within it.
  std::chrono::milliseconds request_timeout{30'000};
  std::chrono::milliseconds long_poll{20'000};       // how long the server may hold an acquire
  std::chrono::milliseconds give_up_after{300'000};  // unreachable this long: the call fails
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5'000};
  // A reply larger than this is refused (bad_reply) without being read whole.
  size_t max_reply_bytes = kMaxReplyBytes;
  bool heartbeats = true;  // extend leases from a background thread
  // The bearer token (a run's worker token), when the coordinator needs one. Empty: taken
  // from $TRAINCOORD_TOKEN, or read from the file $TRAINCOORD_TOKEN_FILE, if set.
  std::string token;
  // TLS (an https:// url). ca_file: the PEM bundle that signed the coordinator's certificate
  // (default: $TRAINCOORD_CA_FILE, else the system's CAs); the certificate must name the url's
  // host. cert_file and key_file: this worker's certificate, for a coordinator that asks for
  // one (default: $TRAINCOORD_CERT_FILE and $TRAINCOORD_KEY_FILE).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // The group: one start of a training job, the same string on every rank of it, another on
  // each restart (1 to 128 characters of A-Z a-z 0-9 . _ : / -). Sent with the registration
  // and every request of the worker; the coordinator then refuses the requests of a group that
  // was replaced (stale_generation). Empty: ungrouped (independent workers, never fenced).
  std::string group;
  // Step mode (docs/SEMANTICS.md, "Step mode"): this process's rank in its group and the
  // group's world size, both or neither (rank < world_size), sent with the registration. A
  // step-mode run hands a worker only its own rank's batches, and refuses the acquires of a
  // worker registered without them (rank_required). Unset: not a rank (a run in job mode
  // ignores them). rank_from_environment() fills them as `traincoord launch` says.
  std::optional<uint32_t> rank;
  std::optional<uint32_t> world_size;
};

struct ClientError {
  int http_status = 0;  // 0: no HTTP answer (unreachable, timed out, TLS refused)
  // What a program decides on (never on `message`): the coordinator's error code (docs/API.md
  // lists them all; `codes` below names those a worker meets), or one of the client's own:
  // "unreachable" (retried until give_up_after), "tls" (the TLS handshake failed: a certificate
  // that does not verify; not retried), "bad_reply" (a reply without the fields it must have,
  // with one of another type, not JSON, or larger than max_reply_bytes; not retried), or
  // "http_STATUS" (a reply without the coordinator's error object: a redirect, a proxy).
  std::string code;
  std::string message;
  std::string field;  // for invalid_argument: the offending field
};

// The codes of ClientError that a program acts on (docs/API.md says when and what to do).
namespace codes {
inline constexpr std::string_view kRunNotFound = "run_not_found";  // 404: no such run
inline constexpr std::string_view kWorkerNotRegistered = "worker_not_registered";  // 404
inline constexpr std::string_view kLeaseUnknown = "lease_unknown";     // 404: never issued
inline constexpr std::string_view kLeaseNotYours = "lease_not_yours";  // 409
// Groups and checkpoint cuts:
// 409: this worker's group was replaced by a newer one; nothing it sends counts: stop.
inline constexpr std::string_view kStaleGeneration = "stale_generation";
// 409: a new group of a run that has cuts: restore() or start_fresh() before asking for jobs.
inline constexpr std::string_view kRestoreRequired = "restore_required";
inline constexpr std::string_view kLeaseNotHeld = "lease_not_held";       // 409: a cut part's lease
inline constexpr std::string_view kCutMismatch = "cut_mismatch";          // 409: another world_size
inline constexpr std::string_view kCutNotFound = "cut_not_found";         // 404
inline constexpr std::string_view kCutIncomplete = "cut_incomplete";      // 409: restore of one
inline constexpr std::string_view kRestoreConflict = "restore_conflict";  // 409: see restore()
inline constexpr std::string_view kRunCancelled = "run_cancelled";        // 409: see restore()
// The rendezvous of launch agents (docs/LAUNCH.md): 409 another agent holds this node's name;
// 409 the rendezvous holds as many nodes as it takes; 409 --nnodes/--settle/--node-timeout differ.
inline constexpr std::string_view kNodeSecretMismatch = "node_secret_mismatch";
inline constexpr std::string_view kRendezvousFull = "rendezvous_full";
inline constexpr std::string_view kRendezvousSettingsConflict = "rendezvous_settings_conflict";
// 409: a request names another group than the one its worker registered with.
inline constexpr std::string_view kGroupMismatch = "group_mismatch";
// Step mode (docs/SEMANTICS.md, "Step mode"): 409 an acquire of a worker registered without
// its rank and world size (set Options::rank and world_size); 409 a rank gave another
// world_size than the ranks of its group before it (a group of another size is a new group).
inline constexpr std::string_view kRankRequired = "rank_required";
inline constexpr std::string_view kWorldSizeMismatch = "world_size_mismatch";
// 421: high availability (several coordinators): this one does not lead the run. Both clients
// follow it on their own (to the leader it names, else the next url); a program meets it only
// when no coordinator led the run within give_up_after.
inline constexpr std::string_view kNotLeader = "not_leader";
inline constexpr std::string_view kCutTimeout = "cut_timeout";   // the client's own: wait_for_cut
inline constexpr std::string_view kUnreachable = "unreachable";  // the client's own
inline constexpr std::string_view kTls = "tls";                  // the client's own
inline constexpr std::string_view kBadReply = "bad_reply";       // the client's own
}  // namespace codes

template <typename T>
using Result = tl::expected<T, ClientError>;

struct Job {
  uint64_t lease = 0;
  uint32_t attempt = 1;
  std::string set;  // "train" or "dev"
  int64_t epoch = 0;
  uint64_t index = 0;
  uint64_t jobs_in_epoch = 0;
  std::vector<uint64_t> batches;  // empty in step mode: the batch is `samples`
  // Step mode (docs/SEMANTICS.md, "Step mode"): one batch of one rank. step_mode() says
  // whether the job is one; the fields below are set only then.
  uint32_t rank = 0;              // the rank it belongs to: this worker's
  uint64_t step = 0;              // 0 <= step < steps, of its epoch
  uint64_t steps = 0;             // the steps of its epoch: every rank the same
  double loss_scale = 1;          // multiply the batch's mean loss by it before backward()
  std::vector<uint64_t> samples;  // the batch: sample indices (empty: take part, zero grad)
  bool step_mode() const { return steps > 0; }
};

struct Completion {
  double loss = 0;  // NaN or infinity are allowed: counted and reported, never averaged in
  uint64_t samples = 0;
  std::vector<std::pair<std::string, double>> metrics;
  // The batch's own compute time in seconds (0 … 1e9; not the wait in the step's all-reduce):
  // a cost-balanced step-mode run fits its cost model per rank from it (docs/CONFIG.md,
  // "Cost-balanced steps"); other runs ignore it. Unset: not sent.
  std::optional<double> seconds;
};

// How a completion was taken: "accepted" (counted), "duplicate", "superseded", "given_up",
// "job_failed", "stale" (not counted; see docs/SEMANTICS.md), or "lost" (the coordinator
// restarted without its state and no longer knows the lease; the job will be handed out again).
struct Completed {
  std::string outcome;
  bool counted = false;
};

struct Finished {
  std::string state;  // "completed", "early_stopped", "cancelled", "failed"
  std::string reason;
};

// A job this rank holds and trained part of, when it gives its share of a cut: the first
// `batches` of the job's batches (1 <= batches < job.batches.size()) are in the model, with the
// sample-weighted mean loss, sample count and metrics of those batches (as a completion of them
// would carry them). A job trained whole is completed before the share, not listed; a job
// fetched and not started is not listed either.
struct CutPart {
  uint64_t lease = 0;  // Job::lease
  uint64_t batches = 0;
  double loss = 0;  // NaN or infinity: none finite (sent as null)
  uint64_t samples = 0;
  std::vector<std::pair<std::string, double>> metrics;
};

// One rank's share of its group's seq-th cut.
struct CutShare {
  uint64_t seq = 0;  // this rank's seq-th cut in this group, from 1: every rank counts alike
  uint32_t rank = 0;
  uint32_t world_size = 1;  // the ranks of the group: the cut is complete once each gave its share
  std::vector<CutPart> parts;
};

// The coordinator's answer to a share: the cut it belongs to and the ranks that gave theirs.
struct CutShareTaken {
  uint64_t cut = 0;
  bool complete = false;
  std::vector<uint32_t> ranks;
  uint32_t world_size = 0;
  uint64_t generation = 0;
};

// A checkpoint cut as the coordinator keeps it (GET /v1/runs/RUN/cuts/ID).
struct Cut {
  uint64_t id = 0;
  std::string group;
  uint64_t seq = 0;
  uint64_t generation = 0;
  bool complete = false;
  uint32_t world_size = 0;
  std::vector<uint32_t> ranks;  // the ranks that gave their share, sorted
  std::chrono::milliseconds created_ago{0};
  std::optional<std::chrono::milliseconds> completed_ago;  // set once complete
  // Set once complete: the run as of the cut.
  std::string state;             // the run's state then ("running", "early_stopped", ...)
  std::optional<int64_t> epoch;  // the epoch in progress then (absent before the first one)
  std::string set;               // its set, "train" or "dev" (empty without an epoch)
  uint64_t jobs_done = 0;        // jobs completed whole
  uint64_t partial_jobs = 0;     // jobs partly trained (their trained batches kept)
  uint64_t partial_batches = 0;  // the trained batches of those
};

// The cuts a run keeps (GET /v1/runs/RUN/cuts): its last `keep` complete ones, and the
// incomplete ones of its current group, oldest first.
struct CutList {
  uint64_t keep = 0;
  uint64_t generation = 0;
  std::string group;  // the run's current group; empty: none yet
  std::vector<Cut> cuts;
};

// The answer to a restore (or a fresh start).
struct Restored {
  bool restored = false;        // false: the group had restored the same already (another rank)
  std::optional<uint64_t> cut;  // nullopt: a fresh start from the ledger as it is
  uint64_t generation = 0;
  uint64_t withdrawn_jobs = 0;  // completed jobs reopened (their losses withdrawn)
  uint64_t leases_voided = 0;
  std::string state;  // the run's state after it ("running" for a run that runs again)
};

class Channel;
class Coordinators;

class Worker {
 public:
  // Registers with the run. Fails when the coordinator stays unreachable for give_up_after,
  // or at once when it refuses (unknown run: 404).
  static Result<std::unique_ptr<Worker>> connect(Options options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The next job: waits (long-polling, never busy-looping) while the run has none right now.
  // Returns nullopt when the run is finished; finished() then says how.
  Result<std::optional<Job>> next();
  // Completes `job` and returns the next one, in one round trip.
  Result<std::optional<Job>> complete_and_next(const Job& job, const Completion& completion);
  // Completes `job` only.
  Result<Completed> complete(const Job& job, const Completion& completion);
  // Several jobs per request (docs/API.md), for small jobs: up to `n` (1 to 64) jobs at once,
  // waiting as next() does; empty when the run is finished.
  Result<std::vector<Job>> next_jobs(size_t n);
  // Completes `done` (all or nothing) and returns up to `n` next jobs, in one round trip;
  // last_outcomes() then says how each completion was taken, in order.
  Result<std::vector<Job>> complete_and_next_jobs(
      const std::vector<std::pair<Job, Completion>>& done, size_t n);
  // Gives the job back as failed (it counts as a failed attempt).
  Result<void> fail(const Job& job, const std::string& reason);
  // Hands jobs back untouched (not a failed attempt): another worker trains them, and a later
  // completion of theirs is not counted.
  Result<void> release(const std::vector<Job>& jobs);
  // Leaves the run: held jobs go back at once. The destructor does not leave.
  Result<void> leave();

  // ---- checkpoint cuts (REQUIRES: Options::group set, except for cuts() and cut()) ----
  // The methods below go over a connection of their own: they may be called while a JobStream
  // of this worker is open (give its share through JobStream::give_cut_share, which sends the
  // queued completions first).
  //
  // Gives this rank's share of a cut. Complete jobs first: a job trained whole and not
  // completed is open again at the cut (trained twice after a restore). Giving the same share
  // again is harmless. Fails with lease_not_held (a part's lease expired or was handed back),
  // cut_mismatch (another rank gave another world_size for this seq), invalid_argument (a
  // part's batches out of range, rank >= world_size), stale_generation, restore_required.
  Result<CutShareTaken> give_cut_share(const CutShare& share);
  // Waits (polling) until cut `id` is complete, for at most `timeout`; fails with cut_timeout
  // naming the ranks that did not give their share, or cut_not_found.
  Result<Cut> wait_for_cut(uint64_t id, std::chrono::milliseconds timeout);
  // The run's cuts, and one of them (cut_not_found when the run does not keep it).
  Result<CutList> cuts();
  Result<Cut> cut(uint64_t id);
  // This worker's group takes the run over from cut `id`: jobs completed after the cut are
  // reopened (their losses withdrawn), its partly trained jobs keep their trained batches,
  // epochs and early-stop decisions after it are undone, and every lease out is void. Every
  // rank may call it: after the first, the same restore answers restored = false. Call it
  // before asking for jobs. Fails with cut_not_found, cut_incomplete, stale_generation,
  // restore_conflict (the group is already current and restored something else, or took the
  // run over without a restore), run_cancelled.
  Result<Restored> restore(uint64_t id);
  // The same, going on from the ledger as it is (nothing withdrawn).
  Result<Restored> start_fresh();

  // What the coordinator said of the group: its generation (+ 1 for every group that took the
  // run over), whether this group must restore before asking for jobs, and the run's latest
  // complete cut. Updated by registrations, shares and restores.
  uint64_t generation() const;
  bool restore_required() const;
  std::optional<uint64_t> latest_cut() const;
  const std::string& group() const { return options_.group; }

  const std::optional<Finished>& finished() const { return finished_; }
  // How the last completion was taken.
  const Completed& last_completed() const { return last_completed_; }
  // How the completions of the last complete_and_next_jobs() were taken.
  const std::vector<Completed>& last_outcomes() const { return last_outcomes_; }
  uint32_t id() const { return id_; }
  const std::string& name() const { return options_.worker_name; }

 private:
  friend class JobStream;
  explicit Worker(Options options);
  Result<void> register_worker();
  Result<std::string> call(const std::string& action, const std::string& body,
                           std::chrono::milliseconds extra_wait);
  // A request over the side connection (the cut methods): POST `body` to .../ACTION, or GET it
  // when `get`; retried as call() does.
  Result<std::string> call_aside(const std::string& action, const std::string& body, bool get);
  Result<Restored> restore_to(std::optional<uint64_t> id);
  Result<std::string> acquire(size_t jobs);  // one acquire; jobs > 0: "jobs": N
  Result<std::optional<Job>> take(const std::string& reply_json, bool nested);
  // nested: the reply of `sent` completions, with the jobs under "next".
  Result<std::vector<Job>> take_jobs(const std::string& reply_json, bool nested, size_t sent);
  Result<std::vector<Job>> take_acquired(reply::Acquired acquired);
  std::string request_name(const std::string& action) const;  // "POST /v1/runs/RUN/ACTION"
  std::string completion_body(const Job& job, const Completion& completion, bool next) const;
  std::unique_ptr<Channel> make_channel() const;  // connections to the coordinators
  void heartbeat_loop();
  void hold(uint64_t lease);  // the heartbeat thread keeps these leases alive, and only these
  void drop(uint64_t lease);

  Options options_;
  // The coordinators (Options::url), which one leads and the latest term: shared by the
  // connections of the calls, of the side calls and of the heartbeats.
  std::shared_ptr<Coordinators> coordinators_;
  std::unique_ptr<Channel> channel_;
  std::mutex aside_mu_;  // the side connections (the cut methods), made on first use
  std::unique_ptr<Channel> aside_;
  mutable std::mutex group_mu_;  // what the coordinator said of the group
  uint64_t generation_ = 0;
  bool restore_required_ = false;
  std::optional<uint64_t> latest_cut_;
  std::atomic<uint32_t> id_{0};  // read by the heartbeat thread; changes when re-registering
  std::chrono::milliseconds heartbeat_interval_{10'000};
  std::optional<Finished> finished_;
  Completed last_completed_;
  std::vector<Completed> last_outcomes_;
  struct Heartbeats;
  std::unique_ptr<Heartbeats> heartbeats_;
};

// A job loop that does not wait for the coordinator between jobs: a thread of its own keeps up
// to `depth` jobs fetched ahead (each a held lease, heartbeated) and sends completions behind,
// together with the request for the next jobs. It long-polls only when the caller waits and no
// completion is queued, so an epoch barrier waiting on this worker's own completions never
// stalls. While a stream is open, use its worker only through it.
//
//   traincoord::client::JobStream stream(**worker);
//   for (auto job = stream.next(); job && *job; job = stream.next()) {
//     stream.complete(**job, {.loss = train((*job)->batches), .samples = 32});  // returns at once
//   }
//   stream.close();  // hands back what was fetched ahead, sends what is queued
struct StreamState;  // client/stream_round.h: what the stream knows under its lock

class JobStream {
 public:
  // REQUIRES: 1 <= depth <= 64; `worker` outlives the stream.
  explicit JobStream(Worker& worker, size_t depth = 2);
  ~JobStream();  // close()
  JobStream(const JobStream&) = delete;
  JobStream& operator=(const JobStream&) = delete;

  // The next job: one fetched ahead, else waits (long-polling) for one. nullopt when the run
  // is finished (the worker's finished() says how). An error of the background thread (a
  // completion refused, the coordinator unreachable for give_up_after) is returned here.
  Result<std::optional<Job>> next();
  // Queues the job's completion and returns at once.
  void complete(const Job& job, const Completion& completion);
  // Sends the queued completions and returns once the coordinator answered them (the first
  // error the stream met, if any).
  Result<void> flush();
  // flush(), then the worker's give_cut_share(share): the jobs completed through the stream
  // are counted before the cut.
  Result<CutShareTaken> give_cut_share(const CutShare& share);
  // Hands back the jobs fetched ahead and not taken, sends the queued completions, stops the
  // thread. Idempotent; returns the first error the stream met.
  Result<void> close();
  // How the completions sent so far were taken, in the order they were queued.
  std::vector<Completed> outcomes() const;

 private:
  void loop();
  StreamState state() const;  // REQUIRES: mu_ held
  bool has_work() const;

  Worker& worker_;
  const size_t depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> ready_;
  std::vector<std::pair<Job, Completion>> outbox_;
  std::vector<Completed> outcomes_;
  size_t sending_ = 0;    // completions taken from outbox_ whose request has not returned
  bool dry_ = false;      // the last acquire found no job right now
  bool waiting_ = false;  // the caller waits in next()
  bool finished_ = false;
  bool closing_ = false;
  bool closed_ = false;
  std::optional<ClientError> error_;
  std::thread thread_;
};

// Which samples make up a batch: batch b of an epoch holds the samples at positions
// [b * batch_size, (b + 1) * batch_size) of the epoch's sample order, a keyed permutation
// computed on demand (O(1) memory). The same numbers as the Python client's
// traincoord.order.SampleOrder (docs/PYTHON.md, "Sample order").
class SampleOrder {
 public:
  enum class Shuffle {
    kEpoch,  // a fresh permutation every epoch (DistributedSampler.set_epoch)
    kFixed,  // one permutation for the whole run: batch membership never changes
    kNone,   // the data set's own order (length-bucketed data: sort it, then batch it)
  };
  // `set`: "train" or "dev". `seed`: the run's data.seed, so that every worker agrees.
  SampleOrder(uint64_t samples, uint64_t batch_size, uint64_t seed, const std::string& set,
              Shuffle shuffle = Shuffle::kEpoch);
  uint64_t batches() const;
  // The samples of batch `batch` of epoch `epoch`. REQUIRES: batch < batches().
  std::vector<uint64_t> batch(int64_t epoch, uint64_t batch) const;
  // The samples of every batch of `job`, in its order.
  std::vector<std::vector<uint64_t>> samples_of(const Job& job) const;

 private:
  std::shared_ptr<const void> order_;  // the core's SampleOrder
};

// One GET against a coordinator (for tools such as `traincoord status`): the body of a 200, or
// the error. No retries, except that with several urls (comma-separated) it goes to the leader
// (a not_leader answer naming it is followed; one that does not answer: the next url), once
// round the list at most; the error then names every url and what each answered. An https:// url
// takes its TLS files from the environment (above). `timeout` bounds the connection and,
// separately, the whole reply; a reply over `max_reply_bytes` is a bad_reply.
Result<std::string> get(const std::string& url, const std::string& path,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(5'000),
                        const std::string& token = "", size_t max_reply_bytes = kMaxReplyBytes);
// One POST of a JSON body: the body of a 200 or 201, or the error. No retries.
Result<std::string> post(const std::string& url, const std::string& path, const std::string& body,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(5'000),
                         const std::string& token = "", size_t max_reply_bytes = kMaxReplyBytes);

// Fills what `traincoord launch` says of this rank into `options` where unset: group from
// $TRAINCOORD_GROUP, and, when a group is then set, rank and world_size from $RANK and
// $WORLD_SIZE (both or neither). Fails with invalid_argument naming the variable when one is
// not a number, or only one of the two is set.
Result<void> rank_from_environment(Options& options);

// The token from $TRAINCOORD_TOKEN, or the first line of the file $TRAINCOORD_TOKEN_FILE; empty
// when neither is set.
std::string token_from_environment();

}  // namespace traincoord::client
