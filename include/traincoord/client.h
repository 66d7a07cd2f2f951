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
// Guarantees: every call has a timeout; a coordinator that is down or restarting is retried
// with exponential backoff and jitter until `give_up_after`, then the call fails with a clear
// error; leases are kept alive by a background heartbeat thread. Nothing blocks forever.
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

struct Options {
  std::string url = "http://127.0.0.1:8470";  // http://HOST:PORT, or https://HOST:PORT (TLS)
  std::string run;                            // the run to work on
  std::string worker_name;                    // stable name; default HOSTNAME-PID
  std::chrono::milliseconds connect_timeout{5'000};
  std::chrono::milliseconds request_timeout{30'000};  // one request, on top of a long poll
  std::chrono::milliseconds long_poll{20'000};        // how long the server may hold an acquire
  std::chrono::milliseconds give_up_after{300'000};   // unreachable this long: the call fails
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5'000};
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
};

struct ClientError {
  int http_status = 0;  // 0: no HTTP answer (unreachable, timed out, TLS refused)
  // What a program decides on (never on `message`): the coordinator's error code (docs/API.md
  // lists them all; `codes` below names those a worker meets), or one of the client's own:
  // "unreachable" (retried until give_up_after), "tls" (the TLS handshake failed: a certificate
  // that does not verify; not retried), "bad_reply" (a reply without the fields it must have).
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
inline constexpr std::string_view kUnreachable = "unreachable";        // the client's own
inline constexpr std::string_view kTls = "tls";                        // the client's own
inline constexpr std::string_view kBadReply = "bad_reply";             // the client's own
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
  std::vector<uint64_t> batches;
};

struct Completion {
  double loss = 0;  // NaN or infinity are allowed: counted and reported, never averaged in
  uint64_t samples = 0;
  std::vector<std::pair<std::string, double>> metrics;
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

class Connection;

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
  Result<std::string> acquire(size_t jobs);  // one acquire; jobs > 0: "jobs": N
  Result<std::optional<Job>> take(const std::string& reply_json, bool nested);
  // nested: the reply of `sent` completions, with the jobs under "next".
  Result<std::vector<Job>> take_jobs(const std::string& reply_json, bool nested, size_t sent);
  Result<std::vector<Job>> take_acquired(reply::Acquired acquired);
  std::string request_name(const std::string& action) const;  // "POST /v1/runs/RUN/ACTION"
  std::string completion_body(const Job& job, const Completion& completion, bool next) const;
  void heartbeat_loop();
  void hold(uint64_t lease);  // the heartbeat thread keeps these leases alive, and only these
  void drop(uint64_t lease);

  Options options_;
  std::shared_ptr<void> tls_;  // the TLS context (https), shared with the heartbeat connection
  std::unique_ptr<Connection> connection_;
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
  // Hands back the jobs fetched ahead and not taken, sends the queued completions, stops the
  // thread. Idempotent; returns the first error the stream met.
  Result<void> close();
  // How the completions sent so far were taken, in the order they were queued.
  std::vector<Completed> outcomes() const;

 private:
  void loop();
  bool has_work() const;

  Worker& worker_;
  const size_t depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> ready_;
  std::vector<std::pair<Job, Completion>> outbox_;
  std::vector<Completed> outcomes_;
  size_t in_flight_ = 0;
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
// the error. No retries. An https:// url takes its TLS files from the environment (above).
Result<std::string> get(const std::string& url, const std::string& path,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(5'000),
                        const std::string& token = "");
// One POST of a JSON body: the body of a 200 or 201, or the error. No retries.
Result<std::string> post(const std::string& url, const std::string& path, const std::string& body,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(5'000),
                         const std::string& token = "");

// The token from $TRAINCOORD_TOKEN, or the first line of the file $TRAINCOORD_TOKEN_FILE; empty
// when neither is set.
std::string token_from_environment();

}  // namespace traincoord::client
