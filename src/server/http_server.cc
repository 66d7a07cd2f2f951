#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs it

#include "server/http_server.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "server/coordinator.h"
#include "server/metrics.h"
#include "server/request_framing.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/container/small_vector.hpp>

namespace traincoord {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

class HttpServer::Impl {
 public:
  Impl(Engine& engine, ServerClock& clock, Journal* journal, ServerOptions options)
      : coordinator_(engine, clock, journal,
                     CoordinatorOptions{options.limits, options.auth, kTickMs, options.leadership}),
        journal_(journal),
        options_(std::move(options)) {
    coordinator_.set_transport_metrics([this](std::string& out) { server_metrics(out); });
    const int n = std::max(1, options_.io_threads);
    for (int i = 0; i < n; ++i) {
      ios_.push_back(std::make_unique<asio::io_context>(1));
      guards_.emplace_back(asio::make_work_guard(*ios_.back()));
    }
    acceptor_.emplace(*ios_[0]);
    accept_pause_.emplace(*ios_[0]);
    for (auto& io : ios_) sweepers_.push_back(std::make_unique<Sweeper>(*io));
    inline_engine_ = n == 1;
    commit_here_ =
        journal_ != nullptr && options_.leadership == nullptr && journal_->writes_are_quick();
  }

  ~Impl() {
    stop();
    // The sweepers' timers before the io_contexts they belong to (members go in reverse order
    // of declaration, which would free the contexts first).
    sweepers_.clear();
    accept_pause_.reset();
    acceptor_.reset();
  }

  void post(std::function<void(Coordinator&)> task) { coordinator_.post(std::move(task)); }

  Result<uint16_t> start() {
    if (options_.tls.enabled()) {
      auto ctx = make_tls_context(options_.tls);
      if (!ctx) return tl::unexpected(ctx.error());
      tls_ = std::move(*ctx);
    }
    beast::error_code ec;
    const auto address = asio::ip::make_address(options_.host, ec);
    if (ec) return invalid_argument("listen", "cannot parse listen address " + options_.host);
    const tcp::endpoint endpoint(address, options_.port);
    acceptor_->open(endpoint.protocol(), ec);
    if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_->bind(endpoint, ec);
    if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return invalid_argument("listen", "cannot listen on " + options_.host + ":" +
                                            std::to_string(options_.port) + ": " + ec.message());
    }
    const uint16_t port = acceptor_->local_endpoint().port();
    if (journal_) store_thread_ = std::thread([this] { store_loop(); });
    if (inline_engine_) {
      tick_.emplace(*ios_[0]);
      asio::post(*ios_[0], [this] { arm_tick(); });
    } else {
      engine_thread_ = std::thread([this] { engine_loop(); });
    }
    do_accept();
    for (auto& sweeper : sweepers_) sweep(*sweeper);
    for (auto& io : ios_) threads_.emplace_back([&io] { io->run(); });
    return port;
  }

  void wait() {
    std::unique_lock lock(stop_mu_);
    stop_cv_.wait(lock, [this] { return stop_requested_; });
  }

  void stop() {
    {
      std::lock_guard lock(stop_mu_);
      if (stopped_) return;
      stopped_ = stop_requested_ = true;
    }
    stop_cv_.notify_all();
    {
      std::lock_guard lock(queue_mu_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    if (engine_thread_.joinable()) engine_thread_.join();
    asio::post(*ios_[0], [this] {
      beast::error_code ignored;
      acceptor_->close(ignored);
    });
    for (auto& g : guards_) g.reset();
    for (auto& io : ios_) io->stop();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    // Last: the store thread writes what the engine handed it (nothing more comes now).
    {
      std::lock_guard lock(store_mu_);
      store_stopping_ = true;
    }
    store_cv_.notify_all();
    if (store_thread_.joinable()) store_thread_.join();
  }

  // From any I/O thread: hands a request to the engine. With one I/O thread the engine runs on
  // it (as Redis runs its state on its one event loop): the request waits in `pending_` until
  // the handlers of the sockets that are ready now have run, and then the whole wave is
  // answered and committed at once. Measured (bench/loadgen, 64 workers, 2 cores): the hop to
  // a separate engine thread and back cost ~8 µs of server CPU per request (44 vs 36 µs then;
  // docs/PERFORMANCE.md).
  void submit(Call call) {
    if (inline_engine_) {
      pending_.push_back(std::move(call));
      if (!flush_posted_) {
        flush_posted_ = true;
        asio::post(*ios_[0], [this] {
          flush_posted_ = false;
          std::vector<Call> batch;
          batch.swap(pending_);
          process(batch);
          arm_tick();
        });
      }
      return;
    }
    {
      std::lock_guard lock(queue_mu_);
      if (stopping_) return;
      queue_.push_back(std::move(call));
    }
    queue_cv_.notify_one();
  }

  const ServerOptions& options() const { return options_; }

 private:
  template <class Stream>
  class Session;

  // What the sweeper needs of a connection, whatever its stream.
  class Deadlined {
   public:
    virtual ~Deadlined() = default;
    // Closes the connection if its deadline has passed.
    virtual void expire_if_due(std::chrono::steady_clock::time_point now) = 0;
  };

  // Per I/O thread: its connections' deadlines, checked twice a second by one timer, instead
  // of a timer re-armed on every read and write of every connection (Beast's tcp_stream).
  // Measured: see docs/PERFORMANCE.md. A timeout fires within half a second of its time.
  struct Sweeper {
    explicit Sweeper(asio::io_context& io) : timer(io) {}
    asio::steady_timer timer;
    std::vector<std::weak_ptr<Deadlined>> sessions;  // this thread's only
  };

  void sweep(Sweeper& sweeper) {
    sweeper.timer.expires_after(std::chrono::milliseconds(500));
    sweeper.timer.async_wait([this, &sweeper](beast::error_code ec) {
      if (ec) return;
      const auto now = std::chrono::steady_clock::now();
      std::erase_if(sweeper.sessions, [now](std::weak_ptr<Deadlined>& w) {
        auto session = w.lock();
        if (!session) return true;
        session->expire_if_due(now);
        return false;
      });
      sweep(sweeper);
    });
  }

  void do_accept();
  // With a file size limit (RLIMIT_FSIZE), says that the journal's room counts it too: the
  // disk may have room while the journal's files can grow no more.
  static void say_file_size_limit() {
    rlimit fsize{};
    if (getrlimit(RLIMIT_FSIZE, &fsize) != 0 || fsize.rlim_cur == RLIM_INFINITY) return;
    std::fprintf(stderr,
                 "traincoord: the journal's room counts the file size limit of this process "
                 "too (RLIMIT_FSIZE: %llu bytes; ulimit -f, or prlimit --pid %d --fsize=... "
                 "to raise it now)\n",
                 static_cast<unsigned long long>(fsize.rlim_cur), static_cast<int>(getpid()));
  }
  static bool out_of_descriptors(const beast::error_code& ec);
  void pause_accepting(const beast::error_code& ec);

  // TLS 1.2 or newer with OpenSSL's default ciphers; with a client CA, a client without a
  // certificate it signed fails the handshake.
  static Result<ssl::context> make_tls_context(const TlsOptions& tls) {
    ssl::context ctx(ssl::context::tls_server);
    ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                    ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                    ssl::context::single_dh_use);
    beast::error_code ec;
    ctx.use_certificate_chain_file(tls.cert_file, ec);
    if (ec) {
      return invalid_argument("tls_cert",
                              "cannot use TLS certificate " + tls.cert_file + ": " + ec.message());
    }
    if (tls.key_file.empty()) return invalid_argument("tls_key", "a TLS certificate needs its key");
    ctx.use_private_key_file(tls.key_file, ssl::context::pem, ec);
    if ((ec &&
         ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH) ||
        (!ec && SSL_CTX_check_private_key(ctx.native_handle()) != 1)) {
      return invalid_argument("tls_key", "the TLS key " + tls.key_file +
                                             " does not match the certificate " + tls.cert_file);
    }
    if (ec) {
      return invalid_argument("tls_key",
                              "cannot use TLS key " + tls.key_file + ": " + ec.message());
    }
    if (!tls.client_ca_file.empty()) {
      ctx.load_verify_file(tls.client_ca_file, ec);
      if (ec) {
        return invalid_argument("tls_client_ca",
                                "cannot use client CA " + tls.client_ca_file + ": " + ec.message());
      }
      ctx.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
    return ctx;
  }

  // The transport's series of GET /metrics (the coordinator adds its own and the journal's).
  void server_metrics(std::string& out) {
    std::lock_guard lock(metrics_mu_);
    out +=
        "# HELP traincoord_http_requests_total Requests answered, by endpoint and status.\n"
        "# TYPE traincoord_http_requests_total counter\n";
    for (const auto& [key, count] : requests_) {
      out += "traincoord_http_requests_total{endpoint=\"" + std::string(key.first) +
             "\",status=\"" + std::to_string(key.second) + "\"} " + std::to_string(count) + "\n";
    }
    out +=
        "# HELP traincoord_http_request_duration_seconds From a request's arrival to its "
        "reply (after the commit it waits for).\n"
        "# TYPE traincoord_http_request_duration_seconds histogram\n";
    request_latency_.write(out, "traincoord_http_request_duration_seconds", "");
    out +=
        "# HELP traincoord_http_connections Open client connections.\n"
        "# TYPE traincoord_http_connections gauge\ntraincoord_http_connections " +
        std::to_string(connections_.load()) + "\n";
    if (tls_) {
      out +=
          "# HELP traincoord_tls_handshake_failures_total Connections dropped in the TLS "
          "handshake (no or a wrong client certificate, plain HTTP sent to the TLS port, ...).\n"
          "# TYPE traincoord_tls_handshake_failures_total counter\n"
          "traincoord_tls_handshake_failures_total " +
          std::to_string(tls_failures_.load()) + "\n";
    }
    out +=
        "# HELP traincoord_store_commit_duration_seconds Durable commits (group commit).\n"
        "# TYPE traincoord_store_commit_duration_seconds histogram\n";
    commit_latency_.write(out, "traincoord_store_commit_duration_seconds", "");
    out +=
        "# HELP traincoord_store_commit_batch_requests Requests answered per commit.\n"
        "# TYPE traincoord_store_commit_batch_requests histogram\n";
    commit_batch_.write(out, "traincoord_store_commit_batch_requests", "");
  }

  // The engine thread: takes every queued request at once, answers them in order, gives the
  // parked acquires of the runs those requests touched another try, makes the batch durable in
  // one commit (group commit), and only then sends the replies.
  void engine_loop() {
    std::vector<Call> batch;
    while (true) {
      {
        std::unique_lock lock(queue_mu_);
        queue_cv_.wait_for(lock, std::chrono::milliseconds(coordinator_.next_wakeup_ms()),
                           [this] { return !queue_.empty() || stopping_; });
        if (stopping_) return;
        batch.swap(queue_);
      }
      process(batch);
    }
  }

  // The inline engine's clock: wakes the I/O thread for lease expiries and long-poll deadlines
  // when no request does. Re-armed only when the next deadline moved earlier.
  void arm_tick() {
    const auto at =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(coordinator_.next_wakeup_ms());
    if (tick_armed_ && tick_->expiry() <= at) return;
    tick_armed_ = true;
    tick_->expires_at(at);
    tick_->async_wait([this](beast::error_code ec) {
      if (ec) return;  // re-armed earlier, or stopping
      tick_armed_ = false;
      std::vector<Call> none;
      process(none);
      arm_tick();
    });
  }

  // Answers a batch of requests (see engine_loop) and runs the tick when it is due; the wave's
  // replies go out once its writes are durable.
  void process(std::vector<Call>& batch) {
    Wave wave = coordinator_.step(batch, disk_full_.load(std::memory_order_relaxed));
    for (const std::string& notice : wave.notices) {
      std::fprintf(stderr, "traincoord: %s\n", notice.c_str());
    }
    if (journal_) {
      // Nothing is answered before it is durable: the engine writes the wave itself and then
      // sends its replies (commit_here: durability "os", nothing else in hand), or the
      // replies go with the wave's writes to the store thread, which sends them once the
      // writes are committed; meanwhile the engine answers the next wave (pipelined; see
      // store_loop).
      if (!wave.empty() && !commit_here(wave)) {
        {
          std::lock_guard lock(store_mu_);
          store_queue_.push_back(std::move(wave));
        }
        store_cv_.notify_one();
      }
    } else {
      send(wave.replies);
    }
  }

  // Writes a wave on the engine's own thread and sends its replies, when the journal's writes
  // are quick (durability "os": no sync, no network) and the store thread has nothing in hand
  // (nothing taken before this wave is unwritten, so the order of writes holds). Handing a
  // wave to the store thread costs two wake-ups per commit (the store thread's, then the I/O
  // thread's for the replies): on 2 shared cores, context switches that cost more than the
  // write itself (docs/PERFORMANCE.md, "Durable at the speed of memory"). While the store
  // thread writes, waves still queue for it (group commit across waves). Returns false, having
  // done nothing, when the wave must go to the store thread.
  bool commit_here(Wave& wave) {
    if (!commit_here_) return false;
    {
      std::lock_guard lock(store_mu_);
      if (store_busy_ || !store_queue_.empty() || disk_full_.load()) return false;
      store_busy_ = true;
    }
    check_room();
    const auto start = std::chrono::steady_clock::now();
    const auto r = wave.writes ? journal_->write(*wave.writes) : Result<void>{};
    if (!r && !journal_->last_write_was_full()) stop_on_failed_write(r.error().message);
    if (r && wave.writes && !wave.writes->empty()) observe_commit(start, wave.replies.size());
    {
      std::lock_guard lock(store_mu_);
      store_busy_ = false;
      if (!r) {
        // No room even in the reserve: nothing was written. The store thread writes it again
        // (says so, and takes no new work) each second until there is room, and the waves
        // after it queue behind it.
        store_queue_.push_front(std::move(wave));
      }
    }
    if (!r) {
      store_cv_.notify_one();
    } else {
      send(wave.replies);
    }
    return true;
  }

  // The free space, at most ten times a second (a statvfs costs ~1 us): below the reserve, the
  // engine takes no new work until there is room again (see process()). By the holder of
  // store_busy_ only.
  void check_room() {
    const auto now = std::chrono::steady_clock::now();
    if (now - room_checked_ < std::chrono::milliseconds(100) && !disk_full_.load()) return;
    room_checked_ = now;
    const bool low = journal_->low_on_room();
    if (low && !disk_full_.load()) say_file_size_limit();
    disk_full_.store(low);  // (the engine sees it within a tick, 50 ms)
  }

  // A failed commit (an fsync error above all) cannot be retried safely: stop, and let the
  // restart recover from what is on disk.
  [[noreturn]] void stop_on_failed_write(const std::string& why) {
    std::fprintf(stderr, "traincoord: cannot write %s: %s; stopping\n",
                 journal_->describe().c_str(), why.c_str());
    std::abort();
  }

  void observe_commit(std::chrono::steady_clock::time_point start, size_t requests) {
    std::lock_guard lock(metrics_mu_);
    commit_latency_.observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    commit_batch_.observe(static_cast<double>(requests));
  }

  // The store thread has written what it took: the engine may write the next wave itself.
  void done_writing() {
    std::lock_guard lock(store_mu_);
    store_busy_ = false;
  }

  // Sends replies (from the engine thread, or the store thread once they are durable).
  void send(std::vector<Outgoing>& replies) {
    const auto sent = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(metrics_mu_);
      for (const Outgoing& o : replies) {
        requests_[{o.endpoint, o.reply.status}] += 1;
        request_latency_.observe(std::chrono::duration<double>(sent - o.to.received).count());
      }
    }
    for (Outgoing& o : replies) o.to.respond(std::move(o.reply));  // (posted to the connection)
  }

  // The store thread: writes the waves the engine handed it, in order, all those waiting in one
  // transaction (group commit across waves), then sends their replies. With SQLite's work off
  // the engine's thread, the engine answers the next wave while this one is written: measured
  // with bench/loadgen (64 workers, one job per request), 19-23k -> 30-33k job cycles/s with
  // durability "os", 19-21k -> 28k with "fsync" (docs/PERFORMANCE.md).
  void store_loop() {
    std::deque<Wave> work;
    while (true) {
      {
        std::unique_lock lock(store_mu_);
        auto ready = [this] { return !store_queue_.empty() || store_stopping_; };
        if (disk_full_.load() || commit_here_) {
          // Nothing comes while the disk is full but reads: look for room every second. (When
          // the engine writes, its own look may have found the disk full while this thread
          // slept: it looks again each second too.)
          store_cv_.wait_for(lock, std::chrono::seconds(1), ready);
        } else {
          store_cv_.wait(lock, ready);
        }
        if (store_queue_.empty() && store_stopping_) return;  // everything handed over is written
        if (store_queue_.empty() && !disk_full_.load()) continue;  // (a second, nothing to do)
        work.swap(store_queue_);
        store_busy_ = true;
      }
      check_room();
      // All waiting waves in one write: the first wave's batch takes the others'.
      std::unique_ptr<JournalBatch> all;
      size_t requests = 0;
      for (Wave& w : work) {
        if (!all) {
          all = std::move(w.writes);
        } else if (w.writes) {
          all->append(std::move(*w.writes));
        }
        requests += w.replies.size();
      }
      const auto start = std::chrono::steady_clock::now();
      if (Leadership* leadership = options_.leadership) {
        // High availability, leadership per run (docs/HA.md): each run's part of the batch is
        // written in txns of its own, fenced on that run's leadership; a run whose write was
        // refused (another coordinator leads it), or in doubt (etcd did not answer), steps down
        // alone: its replies are dropped, never sent, and the other runs' go out. A reply goes
        // out only while the leadership it was produced under lasts.
        if (all) (void)journal_->write(*all);
        if (all && !all->empty()) observe_commit(start, requests);
        for (auto& [run, term] : journal_->take_won_runs()) leadership->set_term(run, term);
        for (const Journal::LostRun& lost : journal_->take_lost_runs()) {
          if (leadership->step_down(lost.run, lost.why, lost.term)) {
            std::fprintf(stderr, "traincoord: stepping down from run %s: %s\n", lost.run.c_str(),
                         lost.why.c_str());
          }
        }
        for (Wave& w : work) {
          std::vector<Outgoing> sendable;
          for (Outgoing& o : w.replies) {
            if (o.generation == 0 && !o.run.empty() && o.reply.status < 300) {
              // (a run's success produced under no leadership of it here: nothing says its
              // records were written; Coordinator::reply makes none, and none goes out)
              dropped_ += 1;
              continue;
            }
            if (o.generation != 0) {
              if (!leadership->leads(o.run, o.generation)) {
                dropped_ += 1;
                continue;
              }
              const Leadership::View view = leadership->view(o.run);
              if (view.term > 0) {
                o.reply.headers = "Traincoord-Term: " + std::to_string(view.term) +
                                  "\r\nTraincoord-Leader: " + view.leader + "\r\n";
              }
            }
            sendable.push_back(std::move(o));
          }
          send(sendable);
        }
        work.clear();
        done_writing();
        continue;
      }
      while (!options_.leadership) {
        auto r = all ? journal_->write(*all) : Result<void>{};
        if (r) break;
        if (!journal_->last_write_was_full()) stop_on_failed_write(r.error().message);
        // No space even in the reserve (something else filled the disk): nothing of the batch
        // was written, and its replies wait. Take no new work, and write it again each second
        // until there is room (or the server stops: then they were never answered).
        if (!disk_full_.exchange(true)) {
          std::fprintf(stderr,
                       "traincoord: cannot write %s: the disk is full (%s); taking no new work, "
                       "retrying each second\n",
                       journal_->describe().c_str(), r.error().message.c_str());
        }
        std::unique_lock lock(store_mu_);
        if (store_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return store_stopping_; })) {
          return;
        }
      }
      if (all && !all->empty()) observe_commit(start, requests);
      if (inline_engine_) {
        // One hand-off to the I/O thread per commit, not one per reply: each reply's post from
        // this thread took the I/O context's lock (and competed with the I/O thread for it);
        // from the I/O thread itself, posting to its own context (concurrency hint 1) takes no
        // lock. The replies go out in order, in one handler.
        std::vector<Outgoing> replies;
        for (Wave& w : work) {
          if (replies.empty()) {
            replies = std::move(w.replies);
          } else {
            std::move(w.replies.begin(), w.replies.end(), std::back_inserter(replies));
          }
        }
        if (!replies.empty()) {
          asio::post(*ios_[0], [this, replies = std::move(replies)]() mutable { send(replies); });
        }
      } else {
        for (Wave& w : work) send(w.replies);
      }
      work.clear();
      done_writing();
    }
  }

 public:
  std::atomic<int64_t> connections_{0};
  std::atomic<uint64_t> tls_failures_{0};

 private:
  std::atomic<uint64_t> dropped_{0};  // replies never sent: their leadership ended (HA)

  // Guarded by metrics_mu_ (replies are sent by the engine thread, or by the store thread).
  std::mutex metrics_mu_;
  // Keyed by the endpoint's name, a literal from Api::endpoint_of: no string made per request.
  std::map<std::pair<std::string_view, int>, uint64_t> requests_;
  Histogram request_latency_{{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                              0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram commit_latency_{
      {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}};
  Histogram commit_batch_{{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096}};

  Coordinator coordinator_;  // engine thread only
  Journal* journal_;
  ServerOptions options_;

  std::vector<std::unique_ptr<Sweeper>> sweepers_;  // one per I/O thread; outlives ios_'s handlers
  std::vector<std::unique_ptr<asio::io_context>> ios_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
  std::optional<tcp::acceptor> acceptor_;
  // Accepting paused for want of descriptors (pause_accepting): the timer, and since when.
  static constexpr std::chrono::milliseconds kAcceptPause{100};
  std::optional<asio::steady_timer> accept_pause_;
  std::optional<std::chrono::steady_clock::time_point> accept_paused_since_;
  std::optional<ssl::context> tls_;
  size_t next_io_ = 0;
  std::vector<std::thread> threads_;
  std::thread engine_thread_;

  static constexpr TimeMs kTickMs = 50;  // lease expiries and long-poll deadlines, this often

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::vector<Call> queue_;
  bool stopping_ = false;

  // One I/O thread: the engine runs on it (see submit); these are that thread's only.
  bool inline_engine_ = false;
  std::vector<Call> pending_;
  bool flush_posted_ = false;
  std::optional<asio::steady_timer> tick_;
  bool tick_armed_ = false;

  // The store thread (durable modes): waves waiting to be written, with their replies.
  std::mutex store_mu_;
  std::condition_variable store_cv_;
  // Set by the thread that writes (check_room) when the disk's free space is below the reserve
  // (or, by the store thread, when a write found it full); the engine then takes no new work
  // (503) and its clock stands.
  std::atomic<bool> disk_full_{false};
  std::deque<Wave> store_queue_;
  bool store_stopping_ = false;
  // Whether a thread is writing (the store thread, or the engine in commit_here): the engine
  // writes a wave itself only when nothing is in hand or queued. Guarded by store_mu_.
  bool store_busy_ = false;
  // Whether the engine may write a wave itself (see commit_here): set once, at construction.
  bool commit_here_ = false;
  // When the free space was last looked at: by the thread that holds store_busy_.
  std::chrono::steady_clock::time_point room_checked_{};
  std::thread store_thread_;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
  bool stopped_ = false;
};

// One connection: read a request, hand it to the engine, write the reply, read the next. The
// next request is read only after the reply is written, so pipelined requests (already in the
// buffer) are answered in order.
// Stream is tcp::socket (plain HTTP) or beast::ssl_stream over one (TLS: the handshake comes
// first, within the read timeout). Timeouts are deadlines the I/O thread's Sweeper checks: set
// while a read or write is pending, none while the request is with the engine (a long poll).
template <class Stream>
class HttpServer::Impl::Session : public Deadlined,
                                  public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;
  using TimePoint = std::chrono::steady_clock::time_point;

 public:
  template <class... Args>
  Session(Impl& server, Sweeper& sweeper, Args&&... args)
      : stream_(std::forward<Args>(args)...), server_(server), sweeper_(sweeper) {
    server_.connections_ += 1;
  }
  ~Session() override { server_.connections_ -= 1; }

  void expire_if_due(TimePoint now) override {
    if (now < deadline_) return;
    deadline_ = TimePoint::max();
    handshaken_ = false;  // no close_notify to a peer that stopped answering
    drop();               // the pending read or write ends with operation_aborted
  }

  // On the connection's own I/O thread.
  void start() {
    sweeper_.sessions.push_back(this->weak_from_this());
    if constexpr (kTls) {
      deadline_in(server_.options().read_timeout_s);
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec) {
                                  self->server_.tls_failures_ += 1;
                                  self->drop();
                                  return;
                                }
                                self->handshaken_ = true;
                                self->read();
                              });
    } else {
      // Non-blocking: a write is tried at once before waiting; a read waits for the socket
      // first, and reads without blocking (read_ready).
      beast::error_code ignored;
      stream_.non_blocking(true, ignored);
      read();
    }
  }

 private:
  // Waits (up to the idle timeout) for a request's first byte, then gives the whole request
  // the read timeout: a client that trickles bytes (slowloris) cannot hold the connection.
  void read() {
    if (buffer_.size() > 0) {
      begin_request();
      parse();
      return;
    }
    deadline_in(server_.options().idle_timeout_s);
    read_more(true);
  }

  void begin_request() {
    parser_.emplace();
    framing_checked_ = false;
    parser_->eager(true);
    parser_->body_limit(server_.options().max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(server_.options().max_header_bytes));
    deadline_in(server_.options().read_timeout_s);
  }

  void deadline_in(int seconds) {
    deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  }

  // One read of what the socket has; `first`: the request's first bytes (the idle timeout
  // ran until now; from here on the read timeout does). The request is parsed from our buffer
  // with the parser's put(), not with http::async_read: one read and one handler a request
  // instead of Beast's composed operations. With the reply written by hand (below), measured:
  // server CPU per request 27–36 → 21–26 µs (bench/loadgen, docs/PERFORMANCE.md).
  void read_more(bool first) {
    if constexpr (!kTls) {
      if (buffer_.size() == 0) {
        if (buffer_.capacity() != 0) buffer_.shrink_to_fit();  // (freed: nothing kept in it)
        read_ready(first);
        return;
      }
    }
    stream_.async_read_some(buffer_.prepare(4096), [self = this->shared_from_this(), first](
                                                       beast::error_code ec, size_t n) {
      if (ec) {
        self->close();  // closed, reset, timed out, or TLS truncated: nothing to answer
        return;
      }
      self->buffer_.commit(n);
      if (first) self->begin_request();
      self->parse();
    });
  }

  // Plain HTTP: what the socket has is read into the I/O thread's buffer and parsed from there,
  // and only bytes the parser leaves (a header cut short, the start of a pipelined request) are
  // copied into the connection's own buffer_. So a connection waiting for its next request, or
  // for the engine's answer, holds no buffer: that was 4 KiB of the 5.4 KiB a connection cost
  // (docs/PERFORMANCE.md, "Many workers"). It waits for the socket to become readable, then
  // reads. The wait comes first: it is called mostly when everything the socket had was read
  // (a reply just written, or a request cut short), where a read first would nearly always
  // find nothing — a system call per request for nothing. Where bytes may be there already (a
  // new connection, a read that filled the scratch buffer, a request sent while the one before
  // it was held), nothing is missed either: Asio re-arms a wait with epoll_ctl(EPOLL_CTL_MOD),
  // which reports bytes already there (ServerE2E.ARequestSentWhileTheOneBeforeItIsHeldIsAnswered).
  void read_ready(bool first) {
    stream_.async_wait(tcp::socket::wait_read,
                       [self = this->shared_from_this(), first](beast::error_code waited) {
                         if (waited) {
                           self->close();  // closed, or timed out (the sweeper dropped it)
                           return;
                         }
                         self->read_now(first);
                       });
  }

  void read_now(bool first) {
    static thread_local std::array<char, 64 << 10> scratch;
    beast::error_code ec;
    const size_t n = stream_.read_some(asio::buffer(scratch), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      read_ready(first);  // (woken with nothing to read)
      return;
    }
    if (ec) {
      close();  // closed or reset: nothing to answer
      return;
    }
    if (first) begin_request();
    asio::const_buffer rest(scratch.data(), n);
    while (rest.size() > 0 && !parser_->is_done()) {
      const size_t used = parser_->put(rest, ec);
      rest += used;
      if ((!ec || ec == http::error::need_more) && framing_due() && !framing_sound()) return;
      if (ec == http::error::need_more || (!ec && used == 0)) {
        if (used == 0) break;  // a header cut short: kept below until the rest comes
        continue;
      }
      if (ec) {
        on_read(ec);
        return;
      }
    }
    if (rest.size() > 0) buffer_.commit(asio::buffer_copy(buffer_.prepare(rest.size()), rest));
    parse();  // the request when it is whole; else reads on
  }

  void parse() {
    beast::error_code ec;
    while (!parser_->is_done()) {
      // (put() takes nothing from an empty buffer, without saying need_more)
      const size_t used = buffer_.size() > 0 ? parser_->put(buffer_.data(), ec) : 0;
      buffer_.consume(used);
      if ((!ec || ec == http::error::need_more) && framing_due() && !framing_sound()) return;
      if (ec == http::error::need_more || (!ec && used == 0)) {
        read_more(false);
        return;
      }
      if (ec) break;
    }
    on_read(ec);
  }

  // Whether the request's header is read and its framing not yet checked.
  bool framing_due() const { return !framing_checked_ && parser_->is_header_done(); }

  // Checks the framing of a request whose header is read (request_framing.h), once. When it is
  // not sound, answers 400 and closes (returns false): the bytes after it are not a request.
  bool framing_sound() {
    framing_checked_ = true;
    const auto& header = parser_->get();
    boost::container::small_vector<std::string_view, 2> te, host;
    for (const auto& [field, into] :
         {std::pair{http::field::transfer_encoding, &te}, std::pair{http::field::host, &host}}) {
      const auto [first, last] = header.equal_range(field);
      for (auto it = first; it != last; ++it) {
        into->emplace_back(it->value().data(), it->value().size());
      }
    }
    auto why = framing_error(
        {header.version(), std::span(te.data(), te.size()), std::span(host.data(), host.size())});
    if (!why) return true;
    fail(error_reply(400, "bad_request", "malformed HTTP request: " + *why));
    return false;
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
        ec == asio::error::eof || ec == ssl::error::stream_truncated) {
      close();
      return;
    }
    if (ec == http::error::body_limit) {
      fail(error_reply(413, "payload_too_large",
                       "the body is larger than " +
                           std::to_string(server_.options().max_body_bytes) + " bytes"));
      return;
    }
    if (ec == http::error::header_limit) {
      fail(error_reply(431, "headers_too_large", "the request headers are too large"));
      return;
    }
    if (ec) {
      fail(error_reply(400, "bad_request", "malformed HTTP request: " + ec.message()));
      return;
    }
    if (framing_due() && !framing_sound()) return;
    http::request<http::string_body> req = parser_->release();
    keep_alive_ = req.keep_alive() && ++requests_ < server_.options().max_requests_per_connection;
    const bool has_body = req.has_content_length() || req.chunked();
    if (req.method() == http::verb::post && !has_body) {
      // Closed after: had the client sent a body anyway, its bytes would read as a request.
      fail(error_reply(411, "length_required", "a POST needs a Content-Length header"));
      return;
    }
    Call call;
    call.to.received = std::chrono::steady_clock::now();
    call.request.method = std::string(req.method_string());
    call.request.target = std::string(req.target());
    call.request.body = std::move(req.body());
    call.request.authorization = std::string(req[http::field::authorization]);
    call.to.respond = [self = this->shared_from_this()](HttpReply reply) {
      asio::post(self->stream_.get_executor(),
                 [self, reply = std::move(reply)]() mutable { self->write(std::move(reply)); });
    };
    deadline_ = TimePoint::max();  // with the engine: a long poll may take its time
    server_.submit(std::move(call));
  }

  // Answers a request that could not be read, then closes: the stream is out of step.
  void fail(HttpReply reply) {
    keep_alive_ = false;
    write(std::move(reply));
  }

  // The reply in one buffer and one write. Written by hand, not with Beast's serializer: the
  // header set is fixed and small, and the serializer's buffer sequences were a visible part of
  // the profile (see read_more for the figure).
  void write(HttpReply reply) {
    // Plain HTTP: written into the I/O thread's buffer and sent at once without blocking; only
    // what the socket would not take now is copied into out_ and written when it can be. So a
    // connection between replies keeps no reply buffer.
    static thread_local std::string scratch;
    std::string& out_ = kTls ? this->out_ : scratch;
    const auto status = static_cast<http::status>(reply.status);
    out_.clear();
    out_ += "HTTP/1.1 ";
    out_ += std::to_string(reply.status);
    out_ += ' ';
    const beast::string_view reason = http::obsolete_reason(status);
    out_.append(reason.data(), reason.size());
    out_ += "\r\nServer: traincoord\r\n";
    out_ += reply.headers;
    out_ += "Content-Type: ";
    out_ += reply.content_type;
    if (!reply.allow.empty()) out_ += "\r\nAllow: " + reply.allow;
    if (reply.status == 401) out_ += "\r\nWWW-Authenticate: Bearer";
    if (!keep_alive_) out_ += "\r\nConnection: close";
    out_ += "\r\nContent-Length: ";
    out_ += std::to_string(reply.body.size());
    out_ += "\r\n\r\n";
    out_ += reply.body;
    deadline_in(server_.options().read_timeout_s);  // a client that does not read its reply
    if constexpr (!kTls) {
      beast::error_code ec;
      size_t sent = stream_.write_some(asio::buffer(out_), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) {
        ec = {};
        sent = 0;
      }
      if (ec) {
        close();
        return;
      }
      if (sent == out_.size()) {
        written();
        return;
      }
      this->out_.assign(out_, sent);
    }
    asio::async_write(stream_, asio::buffer(this->out_),
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) {
                          self->close();
                          return;
                        }
                        if constexpr (!kTls) std::string().swap(self->out_);  // (freed)
                        self->written();
                      });
  }

  void written() {
    if (!keep_alive_) {
      close();
    } else {
      read();
    }
  }

  auto& lowest() { return beast::get_lowest_layer(stream_); }

 public:
  auto executor() { return lowest().get_executor(); }

 private:
  // TLS says close_notify first (for at most a second); then the socket is shut.
  void close() {
    if constexpr (kTls) {
      if (handshaken_) {
        handshaken_ = false;
        deadline_in(1);
        stream_.async_shutdown(
            [self = this->shared_from_this()](beast::error_code) { self->drop(); });
        return;
      }
    }
    drop();
  }

  void drop() {
    beast::error_code ignored;
    lowest().shutdown(tcp::socket::shutdown_send, ignored);
    lowest().close(ignored);
  }

  Stream stream_;
  Impl& server_;
  Sweeper& sweeper_;
  TimePoint deadline_ = TimePoint::max();
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string out_;  // the reply being written (plain HTTP: what the socket did not take at once)
  bool keep_alive_ = true;
  bool handshaken_ = false;
  bool framing_checked_ = false;  // of the request being read
  uint64_t requests_ = 0;
};

void HttpServer::Impl::do_accept() {
  const size_t which = next_io_++ % ios_.size();
  acceptor_->async_accept(*ios_[which], [this, which](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_->is_open()) return;
    if (out_of_descriptors(ec)) {
      // The connection waits in the listen backlog; accepting again at once would fail again
      // at once (a busy loop that starves every connection open). Pause until some close.
      pause_accepting(ec);
      return;
    }
    if (!ec && accept_paused_since_) {
      std::fprintf(
          stderr,
          "traincoord: accepting connections again (paused %.1f s for want of file "
          "descriptors)\n",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *accept_paused_since_)
              .count());
      accept_paused_since_.reset();
    }
    if (!ec) {
      if (static_cast<size_t>(connections_.load()) >= options_.max_connections) {
        socket.close(ec);  // over --max-connections: refused at once, costs nothing
      } else {
        socket.set_option(tcp::no_delay(true), ec);
        Sweeper& sweeper = *sweepers_[which];
        // Started on the connection's own I/O thread: from there on only it touches the
        // session and that thread's sweeper.
        auto start = [](auto session) {
          auto executor = session->executor();
          asio::post(executor, [session = std::move(session)] { session->start(); });
        };
        if (tls_) {
          using TlsSession = Session<beast::ssl_stream<tcp::socket>>;
          start(std::make_shared<TlsSession>(*this, sweeper, std::move(socket), *tls_));
        } else {
          start(std::make_shared<Session<tcp::socket>>(*this, sweeper, std::move(socket)));
        }
      }
    }
    do_accept();
  });
}

bool HttpServer::Impl::out_of_descriptors(const beast::error_code& ec) {
  return ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space ||
         ec == asio::error::no_memory ||
         (ec.category() == asio::error::get_system_category() && ec.value() == ENFILE);
}

// Out of file descriptors (EMFILE, ENFILE) or kernel memory: accepting waits kAcceptPause
// before it tries again, so that the connections open are still served (and the idle ones
// time out and free theirs). Said once per episode, not per try.
void HttpServer::Impl::pause_accepting(const beast::error_code& ec) {
  if (!accept_paused_since_) {
    accept_paused_since_ = std::chrono::steady_clock::now();
    rlimit nofile{};
    const bool known = getrlimit(RLIMIT_NOFILE, &nofile) == 0;
    std::fprintf(stderr,
                 "traincoord: cannot accept a connection: %s (%lld connections open, file "
                 "descriptor limit %s); pausing new connections, trying again every %lld ms until "
                 "some close (raise the limit: ulimit -n, LimitNOFILE=; or lower "
                 "--max-connections, --idle-timeout)\n",
                 ec.message().c_str(), static_cast<long long>(connections_.load()),
                 known && nofile.rlim_cur != RLIM_INFINITY
                     ? std::to_string(static_cast<unsigned long long>(nofile.rlim_cur)).c_str()
                     : "unknown",
                 static_cast<long long>(kAcceptPause.count()));
  }
  accept_pause_->expires_after(kAcceptPause);
  accept_pause_->async_wait([this](beast::error_code waited) {
    if (waited || !acceptor_->is_open()) return;
    do_accept();
  });
}

HttpServer::HttpServer(Engine& engine, ServerClock& clock, Journal* journal, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, clock, journal, std::move(options))) {}
HttpServer::~HttpServer() = default;
Result<uint16_t> HttpServer::start() { return impl_->start(); }
void HttpServer::wait() { impl_->wait(); }
void HttpServer::stop() { impl_->stop(); }
void HttpServer::post(std::function<void(Coordinator&)> task) { impl_->post(std::move(task)); }

}  // namespace traincoord
