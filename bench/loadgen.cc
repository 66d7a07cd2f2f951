// A load generator that simulates training workers (docs/PERFORMANCE.md, bench/compare).
//
//   loadgen traincoord --url http://127.0.0.1:PORT --workers W --seconds S [--warmup S]
//   loadgen redis --port P --workers W --seconds S
//
// traincoord: creates its own run (1 batch per job, epochs that overlap, so a barrier never
// idles a worker), opens W keep-alive connections, registers a worker on each, and then runs
// the real protocol on each: acquire, then complete-and-acquire cycles (`"next": true`) with a
// loss, and a heartbeat listing the held lease when it went the interval the server asks for
// without being renewed (--heartbeats timer: every interval, whatever else). It checks
// the answers, so that a fast wrong server cannot score: no job is handed out twice while a
// worker holds it, no batch of an epoch is counted twice, every batch of every epoch that
// closed was counted once, and the server's count of completed jobs equals ours.
//
// redis: the reliable-queue pattern a user would build on Redis: jobs pushed on a list; each
// worker takes one with LMOVE jobs -> processing, and acknowledges it with HSET results (its
// loss) and LREM processing, the acknowledgement pipelined with the next LMOVE (one round trip
// a job, as traincoord's complete-and-acquire). Checked: no job taken twice.
//
// Both report job cycles per second over the measured window (after the warm-up) and latency
// percentiles of a cycle's round trip (HDR-style histogram), and with --json one JSON line.
#include <hiredis/hiredis.h>
#include <hiredis/read.h>
#include <rapidjson/document.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>

#include "answer_checker.h"
#include "json/json_writer.h"
#include "latency_histogram.h"

namespace traincoord::bench {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string url = "http://127.0.0.1:8470";
  uint16_t redis_port = 6379;
  int workers = 64;
  double seconds = 10;
  double warmup = 2;
  uint64_t train_batches = 100'000;  // per epoch of the run the generator creates
  double lease_timeout_s = 60;
  int server_pid = 0;        // > 0: sample its memory (VmRSS) before and after connecting
  double job_ms = 0;         // each worker "trains" this long on a job before completing it
  int jobs_per_request = 1;  // > 1: each request completes and takes this many ("jobs": N)
  // "needed": a heartbeat only when a held lease has gone the heartbeat interval without being
  // renewed (handed out or heartbeated), as the clients do; "timer": one every interval
  // whatever the worker did meanwhile (the clients before issue 22).
  std::string heartbeats = "needed";
  bool json = false;
};

uint64_t ns_since(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

// kB of resident memory of a process (0 if unknown).
uint64_t rss_kib(int pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  uint64_t value = 0;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> value;
      return value;
    }
    std::getline(in, key);
  }
  return 0;
}

// CPU seconds (user + system) a process has used so far; pid 0: this one.
double cpu_seconds(int pid) {
  if (pid == 0) {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  }
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');  // the name may hold spaces; fields follow it
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; fields >> f; ++i) {  // field 3 is the state; 14 utime, 15 stime
    if (i == 14) utime = std::stod(f);
    if (i == 15) {
      stime = std::stod(f);
      break;
    }
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// What one measurement found; printed as text or one JSON line.
struct Report {
  std::string target;
  int workers = 0;
  double job_ms = 0;
  double seconds = 0;
  uint64_t cycles = 0;    // in the measured window: jobs completed
  uint64_t requests = 0;  // ... and the complete-and-acquire requests that carried them
  int jobs_per_request = 1;
  uint64_t heartbeats = 0;  // in the measured window
  std::string heartbeat_mode;
  uint64_t errors = 0;
  std::vector<std::string> violations;
  LatencyHistogram latency;
  // How late a thread that only sleeps 200 us at a time wakes up (as jHiccup measures): the
  // machine's own stalls (descheduling, steal time), which no server on it can beat.
  LatencyHistogram hiccups;
  // The server's memory before the workers connected, when all had registered, and at the end
  // of the measured window (every connection busy with its traffic).
  uint64_t rss_before_kib = 0, rss_connected_kib = 0, rss_end_kib = 0;
  uint64_t epochs_checked = 0;
  double server_cpu_s = 0, own_cpu_s = 0;  // CPU used in the measured window

  double per_cycle_us(double cpu_s) const {
    return cycles > 0 ? cpu_s * 1e6 / static_cast<double>(cycles) : 0;
  }

  void print(bool json) const {
    const double rate = seconds > 0 ? static_cast<double>(cycles) / seconds : 0;
    auto us = [&](double q) { return static_cast<double>(latency.quantile(q)) / 1000.0; };
    if (json) {
      JsonWriter w;
      w.begin_object();
      w.key("target").value(target).key("workers").value(workers).key("seconds").value(seconds);
      w.key("job_ms").value(job_ms);
      w.key("jobs_per_request").value(jobs_per_request);
      w.key("cycles").value(cycles).key("cycles_per_s").value(rate);
      w.key("requests_per_s").value(seconds > 0 ? static_cast<double>(requests) / seconds : 0);
      w.key("p50_us").value(us(0.5)).key("p99_us").value(us(0.99));
      w.key("p999_us").value(us(0.999)).key("max_us").value(static_cast<double>(latency.max()) /
                                                            1000.0);
      w.key("hiccup_p99_us").value(static_cast<double>(hiccups.quantile(0.99)) / 1000.0);
      w.key("hiccup_p999_us").value(static_cast<double>(hiccups.quantile(0.999)) / 1000.0);
      w.key("hiccup_max_us").value(static_cast<double>(hiccups.max()) / 1000.0);
      w.key("heartbeats").value(heartbeats).key("errors").value(errors);
      w.key("heartbeat_mode").value(heartbeat_mode);
      w.key("heartbeats_per_s").value(seconds > 0 ? static_cast<double>(heartbeats) / seconds : 0);
      w.key("server_cpu_s_per_s").value(seconds > 0 ? server_cpu_s / seconds : 0);
      w.key("epochs_checked").value(epochs_checked);
      w.key("server_cpu_us_per_cycle").value(per_cycle_us(server_cpu_s));
      w.key("loadgen_cpu_us_per_cycle").value(per_cycle_us(own_cpu_s));
      w.key("violations").value(static_cast<uint64_t>(violations.size()));
      w.key("rss_before_kib")
          .value(rss_before_kib)
          .key("rss_connected_kib")
          .value(rss_connected_kib)
          .key("rss_end_kib")
          .value(rss_end_kib);
      w.end_object();
      std::printf("%s\n", w.str().c_str());
    } else {
      std::printf("%s: %d workers (jobs of %.0f ms), %.1f s: %" PRIu64
                  " job cycles, %.0f cycles/s; latency p50 %.0f us, "
                  "p99 %.0f us, p99.9 %.0f us, max %.0f us; %" PRIu64 " heartbeats, %" PRIu64
                  " errors, %" PRIu64 " closed epochs checked, %zu violations\n",
                  target.c_str(), workers, job_ms, seconds, cycles, rate, us(0.5), us(0.99),
                  us(0.999), static_cast<double>(latency.max()) / 1000.0, heartbeats, errors,
                  epochs_checked, violations.size());
      if (jobs_per_request > 1) {
        std::printf("  %d jobs per request: %.0f requests/s; latency is a request's\n",
                    jobs_per_request, seconds > 0 ? static_cast<double>(requests) / seconds : 0);
      }
      std::printf(
          "  the machine's stalls (a sleeping thread woken late): p99 %.0f us, p99.9 %.0f us, "
          "max %.0f us\n",
          static_cast<double>(hiccups.quantile(0.99)) / 1000.0,
          static_cast<double>(hiccups.quantile(0.999)) / 1000.0,
          static_cast<double>(hiccups.max()) / 1000.0);
      std::printf(
          "  CPU per job cycle: server %.1f us, load generator %.1f us; server CPU %.3f s/s\n",
          per_cycle_us(server_cpu_s), per_cycle_us(own_cpu_s),
          seconds > 0 ? server_cpu_s / seconds : 0);
      if (!heartbeat_mode.empty()) {
        std::printf("  heartbeats (%s): %.0f/s\n", heartbeat_mode.c_str(),
                    seconds > 0 ? static_cast<double>(heartbeats) / seconds : 0);
      }
      if (rss_before_kib > 0) {
        std::printf("  server memory: %" PRIu64 " KiB before, %" PRIu64
                    " KiB with the workers connected: %.1f KiB per connection\n",
                    rss_before_kib, rss_connected_kib,
                    static_cast<double>(rss_connected_kib - rss_before_kib) / workers);
        std::printf("  ... %" PRIu64 " KiB at the end of the window: %.1f KiB per connection\n",
                    rss_end_kib, static_cast<double>(rss_end_kib - rss_before_kib) / workers);
      }
    }
    for (size_t i = 0; i < violations.size() && i < 10; ++i) {
      std::fprintf(stderr, "VIOLATION: %s\n", violations[i].c_str());
    }
  }
};

// The phases of a measurement, shared by all connections of the one I/O thread.
struct Window {
  Clock::time_point measure_from, stop;
  // From now: `warmup_s` unmeasured, then `seconds` measured.
  void begin(double warmup_s, double seconds) {
    auto s = [](double v) {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(v));
    };
    measure_from = Clock::now() + s(warmup_s);
    stop = measure_from + s(seconds);
  }
  bool measuring(Clock::time_point now) const { return now >= measure_from && now < stop; }
};

// Measures the machine's stalls over [from, to) on a thread of its own (see Report::hiccups).
class HiccupMeter {
 public:
  void start(Clock::time_point from, Clock::time_point to) {
    thread_ = std::thread([this, from, to] {
      std::this_thread::sleep_until(from);
      constexpr auto kNap = std::chrono::microseconds(200);
      for (auto t = Clock::now(); t < to; t = Clock::now()) {
        std::this_thread::sleep_for(kNap);
        const auto late = Clock::now() - t - kNap;
        histogram_.record(static_cast<uint64_t>(std::max<int64_t>(
            0, std::chrono::duration_cast<std::chrono::nanoseconds>(late).count())));
      }
    });
  }
  // After the window: joins the thread.
  LatencyHistogram finish() {
    if (thread_.joinable()) thread_.join();
    return histogram_;
  }

 private:
  std::thread thread_;
  LatencyHistogram histogram_;
};

// ---- traincoord -----------------------------------------------------------------------------

// A minimal HTTP/1.1 client exchange on a kept-alive socket. The replies come from our own
// server (Content-Length, no chunking), so a reply is: headers up to CRLFCRLF, then
// Content-Length bytes. A load generator must spend less CPU per request than the server it
// measures, on the same two cores, which is why this is not Beast's parser (wrk, the nginx
// baseline's client, is hand-written the same way).
struct HttpExchange {
  std::string in;  // bytes read, not yet consumed
  // A whole reply at the front of `in`: its status and body; false if incomplete.
  bool take(int* status, std::string* body) {
    const size_t end = in.find("\r\n\r\n");
    if (end == std::string::npos) return false;
    size_t length = 0;
    for (size_t at = in.find("\r\n"); at < end; at = in.find("\r\n", at + 2)) {
      if (in.compare(at + 2, 15, "Content-Length:") == 0 ||
          in.compare(at + 2, 15, "content-length:") == 0) {
        length = std::stoul(in.substr(at + 17, 20));
        break;
      }
    }
    if (in.size() < end + 4 + length) return false;
    *status = std::atoi(in.c_str() + 9);
    body->assign(in, end + 4, length);
    in.erase(0, end + 4 + length);
    return true;
  }
};

std::string post(const std::string& host, const std::string& target, const std::string& body) {
  return "POST " + target + " HTTP/1.1\r\nHost: " + host +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

class TraincoordLoad;

// One simulated worker on its own connection.
class SimWorker {
 public:
  SimWorker(TraincoordLoad& load, asio::io_context& io, int n)
      : load_(load), socket_(io), n_(n), random_(static_cast<uint64_t>(n) + 1) {}
  void start(const tcp::endpoint& endpoint);

 private:
  enum class Sent { kRegister, kAcquire, kComplete, kHeartbeat };
  void send(Sent what, std::string request);
  void read();
  void on_reply(int status, const std::string& body);
  void next_request();
  bool on_acquire_reply(const rapidjson::Value& reply);
  void take(const rapidjson::Value& job);

 public:
  void woken() {  // TraincoordLoad::sleep: the training time is over, or a heartbeat is due
    if (Clock::now() >= train_until_) trained_ = true;
    next_request();
  }

 private:
  std::string completions() const;
  // When the next heartbeat is due: with --heartbeats needed, an interval after the held leases
  // were last renewed (never while none is held); with timer, every interval.
  Clock::time_point heartbeat_at() const;

  TraincoordLoad& load_;
  tcp::socket socket_;
  int n_;
  HttpExchange exchange_;
  std::string out_;
  char buf_[8192];
  Sent sent_ = Sent::kRegister;
  Clock::time_point sent_at_;
  int64_t id_ = -1;
  Clock::time_point next_heartbeat_;  // "timer": the next heartbeat
  Clock::time_point renewed_at_;      // "needed": when the held leases were last renewed
  std::chrono::milliseconds heartbeat_interval_{20'000};
  Clock::time_point train_until_ = Clock::time_point::max();
  // The jobs held (up to --jobs-per-request), trained one after the other.
  struct Held {
    uint64_t lease = 0, index = 0;
    int64_t epoch = 0;
    std::vector<uint64_t> batches;
  };
  std::vector<Held> held_;
  bool trained_ = false;  // the held jobs' training time is over
  std::mt19937_64 random_;
  bool done_ = false;
};

class TraincoordLoad {
 public:
  TraincoordLoad(const Args& args) : args_(args), checker_(args.train_batches) {}

  int run() {
    const auto [host, port] = split(args_.url);
    host_ = host + ":" + port;
    run_ = "loadgen-" + std::to_string(::getpid()) + "-" + std::to_string(args_.workers);
    endpoint_ = tcp::endpoint(asio::ip::make_address(host), static_cast<uint16_t>(std::stoi(port)));
    if (!create_run()) return 1;

    report_.target = "traincoord";
    report_.job_ms = args_.job_ms;
    report_.jobs_per_request = args_.jobs_per_request;
    report_.heartbeat_mode = args_.heartbeats;
    report_.workers = args_.workers;
    report_.rss_before_kib = rss_kib(args_.server_pid);
    for (int i = 0; i < args_.workers; ++i) {
      workers_.push_back(std::make_unique<SimWorker>(*this, io_, i));
    }
    // Connect in waves of 256 so that the listen backlog never overflows.
    connect_wave(0);
    io_.run();
    report_.hiccups = hiccups_.finish();
    report_.seconds = std::chrono::duration<double>(window_.stop - window_.measure_from).count();
    report_.epochs_checked = checker_.check_closed_epochs();
    check_server_count();
    report_.violations = checker_.violations;
    report_.print(args_.json);
    return report_.violations.empty() && report_.errors == 0 ? 0 : 1;
  }

  // Called by the workers.
  const std::string& host() const { return host_; }
  const std::string& run_name() const { return run_; }
  AnswerChecker& checker() { return checker_; }
  Report& report() { return report_; }
  const Window& window() const { return window_; }
  bool stopping(Clock::time_point now) const { return started_ && now >= window_.stop; }
  void registered() {
    if (++registered_ == args_.workers) {
      report_.rss_connected_kib = rss_kib(args_.server_pid);
      window_.begin(args_.warmup, args_.seconds);
      hiccups_.start(window_.measure_from, window_.stop);
      started_ = true;
      sample_cpu(window_.measure_from, -1);
      sample_cpu(window_.stop, +1);
    }
  }
  bool started() const { return started_; }
  double job_ms() const { return args_.job_ms; }
  int jobs_per_request() const { return args_.jobs_per_request; }
  bool heartbeat_timer() const { return args_.heartbeats == "timer"; }
  // Wakes `worker` (woken()) at `at`. One timer for all workers, set to the soonest, instead
  // of a timer (and a handler allocation) per worker and job: with 1,024 workers on 100 ms
  // jobs that made the load generator the busiest process on the machine (63 us of CPU per
  // job cycle).
  void sleep(SimWorker* worker, Clock::time_point at) {
    const bool sooner = sleepers_.empty() || at < sleepers_.top().first;
    sleepers_.push({at, worker});
    if (sooner) wake_at(at);
  }
  void fail(const std::string& why) {
    report_.errors += 1;
    if (report_.errors <= 5) std::fprintf(stderr, "loadgen: %s\n", why.c_str());
  }

 private:
  static std::pair<std::string, std::string> split(std::string url) {
    if (url.rfind("http://", 0) == 0) url = url.substr(7);
    if (auto slash = url.find('/'); slash != std::string::npos) url = url.substr(0, slash);
    const auto colon = url.rfind(':');
    return {url.substr(0, colon), url.substr(colon + 1)};
  }

  // At `at`, adds sign * the CPU used so far by the server (when known) and by this process.
  void sample_cpu(Clock::time_point at, int sign) {
    auto timer = std::make_shared<asio::steady_timer>(io_, at);
    timer->async_wait([this, timer, sign](auto) {
      if (args_.server_pid > 0) report_.server_cpu_s += sign * cpu_seconds(args_.server_pid);
      if (sign > 0) report_.rss_end_kib = rss_kib(args_.server_pid);
      report_.own_cpu_s += sign * cpu_seconds(0);
    });
  }

  void connect_wave(size_t from) {
    const size_t to = std::min(workers_.size(), from + 256);
    for (size_t i = from; i < to; ++i) workers_[i]->start(endpoint_);
    if (to < workers_.size()) {
      auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(20));
      timer->async_wait([this, timer, to](auto) { connect_wave(to); });
    }
  }

  // A blocking request on a fresh connection (set-up and the final check only).
  bool exchange(const std::string& request, int* status, std::string* body) {
    asio::io_context io;
    tcp::socket s(io);
    boost::system::error_code ec;
    s.connect(endpoint_, ec);
    if (ec) {
      std::fprintf(stderr, "loadgen: cannot connect to %s: %s\n", host_.c_str(),
                   ec.message().c_str());
      return false;
    }
    asio::write(s, asio::buffer(request), ec);
    HttpExchange x;
    char buf[8192];
    while (!ec && !x.take(status, body)) {
      const size_t n = s.read_some(asio::buffer(buf), ec);
      x.in.append(buf, n);
    }
    return !ec;
  }

  bool create_run() {
    JsonWriter w;
    w.begin_object().key("name").value(run_);
    w.key("data").begin_object().key("train_batches").value(args_.train_batches).end_object();
    w.key("schedule").begin_object().key("epochs").value(1000000).key("iters_per_worker").value(1);
    w.key("overlap_epochs").value(true).end_object();
    w.key("leases").begin_object().key("timeout").value(args_.lease_timeout_s).end_object();
    w.end_object();
    int status = 0;
    std::string body;
    if (!exchange(post(host_, "/v1/runs", w.str()), &status, &body) || status != 201) {
      std::fprintf(stderr, "loadgen: cannot create run %s (HTTP %d): %s\n", run_.c_str(), status,
                   body.c_str());
      return false;
    }
    return true;
  }

  // The server's count of completed jobs must be ours (1 batch per job).
  void check_server_count() {
    int status = 0;
    std::string body;
    const std::string get =
        "GET /v1/runs/" + run_ + " HTTP/1.1\r\nHost: " + host_ + "\r\nConnection: close\r\n\r\n";
    if (!exchange(get, &status, &body) || status != 200) {
      checker_.violations.push_back("cannot read the run's status at the end");
      return;
    }
    rapidjson::Document d;
    d.Parse(body.c_str());
    uint64_t server_done = 0;
    if (!d.HasParseError() && d.HasMember("counters")) {
      server_done = d["counters"]["completions_accepted"].GetUint64();
    }
    if (server_done != checker_.total_counted()) {
      checker_.violations.push_back("the server counted " + std::to_string(server_done) +
                                    " completed jobs, the workers were told " +
                                    std::to_string(checker_.total_counted()));
    }
  }

  Args args_;
  asio::io_context io_;
  tcp::endpoint endpoint_;
  std::string host_, run_;
  AnswerChecker checker_;
  Report report_;
  Window window_;
  bool started_ = false;
  int registered_ = 0;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  HiccupMeter hiccups_;
  using Sleeper = std::pair<Clock::time_point, SimWorker*>;
  std::priority_queue<Sleeper, std::vector<Sleeper>, std::greater<>> sleepers_;
  asio::steady_timer wake_{io_};

  void wake_at(Clock::time_point at) {
    wake_.expires_at(at);  // (cancels the wait for a later one)
    wake_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;  // re-armed for a sooner sleeper
      const auto now = Clock::now();
      while (!sleepers_.empty() && sleepers_.top().first <= now) {
        SimWorker* w = sleepers_.top().second;
        sleepers_.pop();
        w->woken();
      }
      if (!sleepers_.empty()) wake_at(sleepers_.top().first);
    });
  }
};

Clock::time_point SimWorker::heartbeat_at() const {
  if (load_.heartbeat_timer()) return next_heartbeat_;
  return held_.empty() ? Clock::time_point::max() : renewed_at_ + heartbeat_interval_;
}

void SimWorker::start(const tcp::endpoint& endpoint) {
  socket_.async_connect(endpoint, [this](boost::system::error_code ec) {
    if (ec) {
      load_.fail("connect: " + ec.message());
      return;
    }
    socket_.set_option(tcp::no_delay(true));
    send(Sent::kRegister, post(load_.host(), "/v1/runs/" + load_.run_name() + "/workers",
                               "{\"name\":\"lg-" + std::to_string(n_) + "\"}"));
    read();
  });
}

void SimWorker::send(Sent what, std::string request) {
  sent_ = what;
  out_ = std::move(request);
  sent_at_ = Clock::now();
  asio::async_write(socket_, asio::buffer(out_), [this](boost::system::error_code ec, size_t) {
    if (ec) load_.fail("write: " + ec.message());
  });
}

void SimWorker::read() {
  socket_.async_read_some(asio::buffer(buf_), [this](boost::system::error_code ec, size_t n) {
    if (ec) {
      if (!done_) load_.fail("read: " + ec.message());
      return;
    }
    exchange_.in.append(buf_, n);
    int status = 0;
    std::string body;
    while (exchange_.take(&status, &body)) on_reply(status, body);
    if (!done_) read();
  });
}

void SimWorker::on_reply(int status, const std::string& body) {
  const auto now = Clock::now();
  const uint64_t took = ns_since(sent_at_);
  rapidjson::Document d;
  d.Parse(body.c_str());
  if (status != 200 && status != 201) {
    load_.fail("HTTP " + std::to_string(status) + ": " + body);
    done_ = true;
    socket_.close();
    return;
  }
  switch (sent_) {
    case Sent::kRegister:
      id_ = d["worker"].GetInt64();
      heartbeat_interval_ = std::chrono::milliseconds(d["heartbeat_interval_ms"].GetInt64());
      next_heartbeat_ = now + heartbeat_interval_;
      load_.registered();
      break;
    case Sent::kHeartbeat:
      if (load_.window().measuring(now)) load_.report().heartbeats += 1;
      break;
    case Sent::kAcquire:
      if (!on_acquire_reply(d)) return;
      break;
    case Sent::kComplete: {
      if (load_.window().measuring(sent_at_)) {
        load_.report().cycles += held_.size();
        load_.report().requests += 1;
        load_.report().latency.record(took);
      }
      const bool listed = load_.jobs_per_request() > 1;
      for (size_t i = 0; i < held_.size(); ++i) {
        const Held& h = held_[i];
        load_.checker().released(h.epoch, h.index);
        const std::string outcome =
            listed ? d["outcomes"][static_cast<rapidjson::SizeType>(i)]["outcome"].GetString()
                   : d["outcome"].GetString();
        if (outcome == "accepted") {
          for (uint64_t b : h.batches) load_.checker().counted(h.epoch, b);
        } else {
          load_.fail("completion of lease " + std::to_string(h.lease) + ": " + outcome);
        }
      }
      held_.clear();
      if (d.HasMember("next") && !on_acquire_reply(d["next"])) return;
      break;
    }
  }
  next_request();
}

// Takes a job (or learns there is none); false when this worker is done.
bool SimWorker::on_acquire_reply(const rapidjson::Value& reply) {
  const std::string state = reply["status"].GetString();
  if (state == "job") {
    if (load_.jobs_per_request() > 1) {
      for (const auto& job : reply["jobs"].GetArray()) take(job);
    } else {
      take(reply["job"]);
    }
    trained_ = load_.job_ms() <= 0;
    train_until_ = Clock::time_point::max();
    // As the clients: renewed when the reply came (the lease's deadline was set when the
    // server answered, between the request's send and now; see client/held_leases.h).
    renewed_at_ = Clock::now();
    return true;
  }
  if (state == "finished") {
    load_.fail("the run finished: " + std::string(reply["reason"].GetString()));
    done_ = true;
    socket_.close();
    return false;
  }
  return true;  // wait: ask again (long-polled)
}

void SimWorker::take(const rapidjson::Value& job) {
  Held h;
  h.lease = job["lease"].GetUint64();
  h.epoch = job["epoch"].GetInt64();
  h.index = job["index"].GetUint64();
  for (const auto& b : job["batches"].GetArray()) h.batches.push_back(b.GetUint64());
  load_.checker().handed(h.epoch, h.index, h.lease);
  held_.push_back(std::move(h));
}

// The completion fields of the held jobs: one lease, or a "completions" list.
std::string SimWorker::completions() const {
  if (load_.jobs_per_request() <= 1) {
    return "\"lease\":" + std::to_string(held_.front().lease) + ",\"loss\":0.5,\"samples\":32";
  }
  std::string list = "\"completions\":[";
  for (const Held& h : held_) {
    if (list.back() != '[') list += ',';
    list += "{\"lease\":" + std::to_string(h.lease) + ",\"loss\":0.5,\"samples\":32}";
  }
  return list + "]";
}

void SimWorker::next_request() {
  const auto now = Clock::now();
  if (!load_.started()) {
    // Everyone registers first; then all start together. Poll until then.
    auto timer =
        std::make_shared<asio::steady_timer>(socket_.get_executor(), std::chrono::milliseconds(10));
    timer->async_wait([this, timer](auto) { next_request(); });
    return;
  }
  const std::string run = "/v1/runs/" + load_.run_name();
  if (now >= heartbeat_at()) {
    next_heartbeat_ = now + heartbeat_interval_;
    renewed_at_ = now;
    std::string body = "{\"worker\":" + std::to_string(id_) + ",\"leases\":[";
    for (const Held& h : held_) {
      if (body.back() != '[') body += ',';
      body += std::to_string(h.lease);
    }
    body += "]}";
    send(Sent::kHeartbeat, post(load_.host(), run + "/heartbeat", body));
    return;
  }
  if (load_.stopping(now)) {
    // Hand the held job back complete, ask for no next one, and stop.
    if (!held_.empty()) {
      send(Sent::kComplete, post(load_.host(), run + "/complete",
                                 "{\"worker\":" + std::to_string(id_) + "," + completions() + "}"));
      return;
    }
    done_ = true;
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    return;
  }
  if (!held_.empty() && !trained_) {
    if (train_until_ == Clock::time_point::max()) {
      // Uniform in [0.5, 1.5] x --job-ms per job: real jobs vary, and workers that all started
      // together drift apart instead of arriving in lockstep waves.
      double ms = 0;
      for (size_t i = 0; i < held_.size(); ++i) {
        ms += load_.job_ms() * std::uniform_real_distribution<double>(0.5, 1.5)(random_);
      }
      train_until_ = now + std::chrono::microseconds(static_cast<int64_t>(ms * 1000));
    }
    // Woken for a heartbeat due while it trains (a job longer than the interval), then again.
    load_.sleep(this, std::min(train_until_, heartbeat_at()));
    return;
  }
  const std::string jobs = load_.jobs_per_request() > 1
                               ? ",\"jobs\":" + std::to_string(load_.jobs_per_request())
                               : std::string();
  if (held_.empty()) {
    send(Sent::kAcquire,
         post(load_.host(), run + "/acquire",
              "{\"worker\":" + std::to_string(id_) + ",\"wait_ms\":1000" + jobs + "}"));
    return;
  }
  send(Sent::kComplete, post(load_.host(), run + "/complete",
                             "{\"worker\":" + std::to_string(id_) + "," + completions() +
                                 ",\"next\":true,\"wait_ms\":1000" + jobs + "}"));
}

// ---- Redis ----------------------------------------------------------------------------------

// RESP commands made and replies parsed by hiredis (its format and reader functions); the
// sockets are ours, so that all connections run on one thread as the other targets do.
std::string resp(const std::vector<std::string>& words) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& w : words) {
    argv.push_back(w.data());
    lens.push_back(w.size());
  }
  char* out = nullptr;
  const long long n =
      redisFormatCommandArgv(&out, static_cast<int>(argv.size()), argv.data(), lens.data());
  std::string s(out, static_cast<size_t>(n));
  redisFreeCommand(out);
  return s;
}

class RedisLoad;

class RedisClient {
 public:
  RedisClient(RedisLoad& load, asio::io_context& io) : load_(load), socket_(io) {
    reader_ = redisReaderCreate();
  }
  ~RedisClient() { redisReaderFree(reader_); }
  void start(const tcp::endpoint& endpoint);

 private:
  void cycle();
  void read();
  void on_replies();

  RedisLoad& load_;
  tcp::socket socket_;
  redisReader* reader_;
  std::string out_;
  char buf_[8192];
  size_t acking_ = 0, taking_ = 0;  // what the request in flight does: jobs acked, taken
  size_t replies_ = 0;              // its replies read so far
  std::vector<std::string> jobs_;   // the jobs held
  Clock::time_point sent_at_;
  bool done_ = false;
};

class RedisLoad {
 public:
  explicit RedisLoad(const Args& args) : args_(args) {}

  int run() {
    endpoint_ = tcp::endpoint(asio::ip::make_address("127.0.0.1"), args_.redis_port);
    // Enough jobs for the whole measurement, each the size of a traincoord job reply.
    const uint64_t jobs = 4'000'000;
    if (!preload(jobs)) return 1;
    report_.target = "redis";
    report_.workers = args_.workers;
    report_.jobs_per_request = args_.jobs_per_request;
    for (int i = 0; i < args_.workers; ++i) {
      clients_.push_back(std::make_unique<RedisClient>(*this, io_));
    }
    window_.begin(args_.warmup, args_.seconds);
    hiccups_.start(window_.measure_from, window_.stop);
    for (auto& c : clients_) c->start(endpoint_);
    asio::steady_timer from(io_, window_.measure_from), to(io_, window_.stop);
    from.async_wait([this](auto) {
      report_.own_cpu_s -= cpu_seconds(0);
      if (args_.server_pid > 0) report_.server_cpu_s -= cpu_seconds(args_.server_pid);
    });
    to.async_wait([this](auto) {
      report_.own_cpu_s += cpu_seconds(0);
      if (args_.server_pid > 0) report_.server_cpu_s += cpu_seconds(args_.server_pid);
    });
    io_.run();
    report_.hiccups = hiccups_.finish();
    report_.seconds = args_.seconds;
    report_.print(args_.json);
    return report_.violations.empty() && report_.errors == 0 ? 0 : 1;
  }

  Report& report() { return report_; }
  size_t jobs_per_request() const { return static_cast<size_t>(args_.jobs_per_request); }
  const Window& window() const { return window_; }
  // A job taken: it must not have been taken before.
  void took(const std::string& job) {
    if (!taken_.insert(job).second) report_.violations.push_back("job " + job + " taken twice");
  }
  void fail(const std::string& why) {
    report_.errors += 1;
    if (report_.errors <= 5) std::fprintf(stderr, "loadgen: %s\n", why.c_str());
  }
  // The job payload: as long as a traincoord job reply.
  static std::string payload(uint64_t i) {
    std::string p = "{\"lease\":" + std::to_string(i) +
                    ",\"attempt\":1,\"set\":\"train\",\"epoch\":0,\"index\":" + std::to_string(i) +
                    ",\"jobs_in_epoch\":100000,\"batches\":[" + std::to_string(i) +
                    "],\"lease_expires_in_ms\":60000}";
    return p;
  }

 private:
  bool preload(uint64_t jobs) {
    asio::io_context io;
    tcp::socket s(io);
    boost::system::error_code ec;
    s.connect(endpoint_, ec);
    if (ec) {
      std::fprintf(stderr, "loadgen: cannot connect to redis on port %u: %s\n", args_.redis_port,
                   ec.message().c_str());
      return false;
    }
    std::string batch = resp({"DEL", "jobs", "processing", "results"});
    int replies = 1;
    auto flush = [&] {
      asio::write(s, asio::buffer(batch), ec);
      batch.clear();
      redisReader* r = redisReaderCreate();
      char buf[65536];
      while (!ec && replies > 0) {
        const size_t n = s.read_some(asio::buffer(buf), ec);
        redisReaderFeed(r, buf, n);
        void* reply = nullptr;
        while (replies > 0 && redisReaderGetReply(r, &reply) == REDIS_OK && reply) {
          freeReplyObject(reply);
          replies -= 1;
        }
      }
      redisReaderFree(r);
    };
    for (uint64_t i = 0; i < jobs && !ec; i += 1000) {
      std::vector<std::string> words = {"RPUSH", "jobs"};
      for (uint64_t j = i; j < std::min(jobs, i + 1000); ++j) words.push_back(payload(j));
      batch += resp(words);
      replies += 1;
      if (replies >= 50) flush();
    }
    if (!ec) flush();
    return !ec;
  }

  Args args_;
  asio::io_context io_;
  tcp::endpoint endpoint_;
  Report report_;
  HiccupMeter hiccups_;
  Window window_;
  std::unordered_set<std::string> taken_;
  std::vector<std::unique_ptr<RedisClient>> clients_;
};

void RedisClient::start(const tcp::endpoint& endpoint) {
  socket_.async_connect(endpoint, [this](boost::system::error_code ec) {
    if (ec) {
      load_.fail("connect: " + ec.message());
      return;
    }
    socket_.set_option(tcp::no_delay(true));
    cycle();
    read();
  });
}

// Acknowledge the jobs held (each its result, then off the processing list) and take the next
// ones, in one round trip: all commands pipelined in one write (with --jobs-per-request K, K
// LMOVEs, as a user batching a Redis queue would).
void RedisClient::cycle() {
  const auto now = Clock::now();
  out_.clear();
  acking_ = jobs_.size();
  taking_ = now < load_.window().stop ? load_.jobs_per_request() : 0;
  for (const std::string& job : jobs_) {
    out_ += resp({"HSET", "results", job, "0.5"});
    out_ += resp({"LREM", "processing", "1", job});
  }
  for (size_t i = 0; i < taking_; ++i)
    out_ += resp({"LMOVE", "jobs", "processing", "LEFT", "RIGHT"});
  if (out_.empty()) {
    done_ = true;
    socket_.close();
    return;
  }
  replies_ = 0;
  sent_at_ = now;
  asio::async_write(socket_, asio::buffer(out_), [this](boost::system::error_code ec, size_t) {
    if (ec) load_.fail("write: " + ec.message());
  });
}

void RedisClient::read() {
  socket_.async_read_some(asio::buffer(buf_), [this](boost::system::error_code ec, size_t n) {
    if (ec) {
      if (!done_) load_.fail("read: " + ec.message());
      return;
    }
    redisReaderFeed(reader_, buf_, n);
    on_replies();
    if (!done_) read();
  });
}

// Replies come in the order of the commands: HSET and LREM per job acknowledged, then LMOVEs.
void RedisClient::on_replies() {
  const size_t expected = 2 * acking_ + taking_;
  void* raw = nullptr;
  while (replies_ < expected && redisReaderGetReply(reader_, &raw) == REDIS_OK && raw) {
    auto* reply = static_cast<redisReply*>(raw);
    if (reply->type == REDIS_REPLY_ERROR) load_.fail(std::string("redis: ") + reply->str);
    if (replies_ < 2 * acking_ && replies_ % 2 == 1 &&
        (reply->type != REDIS_REPLY_INTEGER || reply->integer != 1)) {
      load_.fail("job " + jobs_[replies_ / 2] + " was not on the processing list");
    }
    if (replies_ == 2 * acking_) jobs_.clear();  // acknowledged; the LMOVE replies follow
    if (replies_ >= 2 * acking_) {
      if (reply->type == REDIS_REPLY_STRING) {
        jobs_.emplace_back(reply->str, reply->len);
        load_.took(jobs_.back());
      } else {
        load_.fail("the job list ran dry");
      }
    }
    freeReplyObject(reply);
    replies_ += 1;
  }
  if (replies_ < expected) return;
  if (taking_ == 0) jobs_.clear();
  if (acking_ > 0 && load_.window().measuring(sent_at_)) {
    load_.report().cycles += acking_;
    load_.report().requests += 1;
    load_.report().latency.record(ns_since(sent_at_));
  }
  cycle();
}

}  // namespace
}  // namespace traincoord::bench

int main(int argc, char** argv) {
  using namespace traincoord::bench;
  CLI::App app{"traincoord's load generator: simulated workers against traincoord or Redis"};
  app.require_subcommand(1);
  Args args;
  auto common = [&](CLI::App* c) {
    c->add_option("--workers", args.workers, "simulated workers (connections)")
        ->check(CLI::Range(1, 200000));
    c->add_option("--seconds", args.seconds, "measured seconds")->check(CLI::Range(0.1, 3600.0));
    c->add_option("--warmup", args.warmup, "seconds before measuring")
        ->check(CLI::Range(0.0, 600.0));
    c->add_flag("--json", args.json, "one JSON line");
  };
  CLI::App* tc = app.add_subcommand("traincoord", "against a traincoord coordinator");
  tc->add_option("--url", args.url, "the coordinator (http://HOST:PORT)");
  tc->add_option("--train-batches", args.train_batches, "batches per epoch of the run");
  tc->add_option("--lease-timeout", args.lease_timeout_s, "seconds of a lease");
  tc->add_option("--server-pid", args.server_pid, "sample this process's memory and CPU");
  tc->add_option("--job-ms", args.job_ms,
                 "milliseconds each worker trains on a job before completing it (0: none)");
  tc->add_option("--jobs-per-request", args.jobs_per_request,
                 "jobs each request completes and takes (\"jobs\": N, \"completions\")")
      ->check(CLI::Range(1, 64));
  tc->add_option("--heartbeats", args.heartbeats,
                 "needed: a heartbeat only when a held lease went the interval unrenewed (as the "
                 "clients); timer: one every interval (the clients before issue 22)")
      ->check(CLI::IsMember({"needed", "timer"}));
  common(tc);
  CLI::App* rd = app.add_subcommand("redis", "against Redis, as a reliable job queue");
  rd->add_option("--port", args.redis_port, "Redis on 127.0.0.1:PORT");
  rd->add_option("--server-pid", args.server_pid, "sample this process's CPU");
  rd->add_option("--jobs-per-request", args.jobs_per_request,
                 "jobs each round trip acknowledges and takes (pipelined commands)")
      ->check(CLI::Range(1, 64));
  common(rd);
  CLI11_PARSE(app, argc, argv);

  // Many connections need many descriptors: raise the soft limit to the hard one.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
  if (tc->parsed()) return TraincoordLoad(args).run();
  return RedisLoad(args).run();
}
