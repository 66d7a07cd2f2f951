#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs it

#include "traincoord/client.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "client/held_leases.h"
#include "client/reply.h"
#include "client/wire.h"
#include "json/json_writer.h"

namespace traincoord::client {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using std::chrono::milliseconds;

namespace {

struct Endpoint {
  std::string host;
  std::string port;
  bool tls = false;
};

Result<Endpoint> parse_url(const std::string& url) {
  std::string rest = url;
  bool tls = false;
  if (rest.rfind("http://", 0) == 0) {
    rest = rest.substr(7);
  } else if (rest.rfind("https://", 0) == 0) {
    rest = rest.substr(8);
    tls = true;
  } else if (rest.find("://") != std::string::npos) {
    return tl::unexpected(ClientError{
        0, "invalid_argument", "the url must start with http:// or https://: " + url, "url"});
  }
  if (auto slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon + 1 == rest.size()) {
    return tl::unexpected(ClientError{
        0, "invalid_argument", "the url needs a port, e.g. http://HOST:8470: " + url, "url"});
  }
  Endpoint e{rest.substr(0, colon), rest.substr(colon + 1), tls};
  if (e.host.size() >= 2 && e.host.front() == '[') e.host = e.host.substr(1, e.host.size() - 2);
  return e;
}

// A Traincoord-Term header: a positive integer of at most 19 digits, else none.
std::optional<uint64_t> parse_term(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t term = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    term = term * 10 + static_cast<uint64_t>(c - '0');
  }
  return term;
}

// The urls of Options::url (or of get()'s url): one, or a comma-separated list (spaces around
// each ignored; empty items skipped). Fails naming the first that is not http(s)://HOST:PORT.
Result<std::vector<std::string>> split_urls(const std::string& urls) {
  std::vector<std::string> out;
  size_t from = 0;
  while (from <= urls.size()) {
    size_t comma = urls.find(',', from);
    if (comma == std::string::npos) comma = urls.size();
    std::string item = urls.substr(from, comma - from);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) {
      item.erase(0, 1);
    }
    while (!item.empty() &&
           (std::isspace(static_cast<unsigned char>(item.back())) || item.back() == '/')) {
      item.pop_back();
    }
    if (!item.empty()) {
      if (auto e = parse_url(item); !e) return tl::unexpected(e.error());
      if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(std::move(item));
    }
    from = comma + 1;
  }
  if (out.empty()) {
    return tl::unexpected(ClientError{
        0, "invalid_argument",
        "no coordinator url given: http://HOST:PORT, or several separated by commas", "url"});
  }
  return out;
}

ClientError unreachable(const std::string& what) {
  return ClientError{0, std::string(codes::kUnreachable), what, {}};
}

// "30 s", "2.5 s", "250 ms": a duration as a message states it.
std::string seconds_text(milliseconds d) {
  if (d.count() < 1000) return std::to_string(d.count()) + " ms";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

std::string env_or(const std::string& value, const char* variable) {
  if (!value.empty()) return value;
  const char* v = std::getenv(variable);
  return v ? v : "";
}

// The TLS settings of one client: verify the coordinator (its CA, else the system's), and show
// a certificate of our own when there is one. Fails with the field that names the bad file.
Result<std::shared_ptr<ssl::context>> make_tls_context(std::string ca_file, std::string cert_file,
                                                       std::string key_file) {
  ca_file = env_or(ca_file, "TRAINCOORD_CA_FILE");
  cert_file = env_or(cert_file, "TRAINCOORD_CERT_FILE");
  key_file = env_or(key_file, "TRAINCOORD_KEY_FILE");
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  beast::error_code ec;
  if (!ca_file.empty()) {
    ctx->load_verify_file(ca_file, ec);
    if (ec) {
      return tl::unexpected(ClientError{
          0, "invalid_argument", "cannot use CA file " + ca_file + ": " + ec.message(), "ca_file"});
    }
  } else {
    ctx->set_default_verify_paths(ec);
  }
  ctx->set_verify_mode(ssl::verify_peer);
  if (!cert_file.empty()) {
    ctx->use_certificate_chain_file(cert_file, ec);
    if (ec) {
      return tl::unexpected(ClientError{0, "invalid_argument",
                                        "cannot use certificate " + cert_file + ": " + ec.message(),
                                        "cert_file"});
    }
    ctx->use_private_key_file(key_file.empty() ? cert_file : key_file, ssl::context::pem, ec);
    if (ec) {
      return tl::unexpected(ClientError{
          0, "invalid_argument", "cannot use key " + key_file + ": " + ec.message(), "key_file"});
    }
  }
  return ctx;
}

// A fresh id for one logical acquire: its retries (inside Worker::call) carry the same id, so
// the coordinator gives back the job a lost reply carried instead of stranding it.
uint64_t request_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          (static_cast<uint64_t>(getpid()) << 32));
  return (rng() >> 12) | 1;  // nonzero, and exact in JSON doubles (< 2^52)
}

// A group is 1 to 128 characters of A-Z a-z 0-9 . _ : / - (or empty: none).
Result<void> check_group(const std::string& group) {
  const bool fits = group.size() <= 128 && std::all_of(group.begin(), group.end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
                             c == ':' || c == '/' || c == '-';
                    });
  if (fits) return {};
  return tl::unexpected(ClientError{
      0, "invalid_argument",
      "Options::group must be 1 to 128 characters of A-Z a-z 0-9 . _ : / - (one name shared "
      "by the ranks of one start of the training job); got '" +
          group.substr(0, 160) + "'",
      "group"});
}

// Options::rank and world_size: both or neither, rank < world_size.
Result<void> check_rank(const Options& options) {
  if (options.rank.has_value() != options.world_size.has_value()) {
    const char* missing = options.rank ? "world_size" : "rank";
    return tl::unexpected(ClientError{
        0, "invalid_argument",
        std::string("Options::") + missing + " is unset: give a rank and the world size together",
        missing});
  }
  if (options.world_size && *options.world_size == 0) {
    return tl::unexpected(ClientError{
        0, "invalid_argument", "Options::world_size must be at least 1, got 0", "world_size"});
  }
  if (options.rank && *options.rank >= *options.world_size) {
    return tl::unexpected(ClientError{0, "invalid_argument",
                                      "Options::rank " + std::to_string(*options.rank) +
                                          " is not below world_size " +
                                          std::to_string(*options.world_size),
                                      "rank"});
  }
  return {};
}

std::string default_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "worker");
  return std::string(host) + "-" + std::to_string(getpid());
}

}  // namespace

// One keep-alive HTTP (or HTTPS) connection with timeouts: every operation runs on a private
// io_context for at most its timeout, so a call never blocks longer than asked.
class Connection {
 public:
  // `tls`: required (and only used) when the endpoint is https.
  Connection(Endpoint endpoint, milliseconds connect_timeout, std::string token = "",
             std::shared_ptr<ssl::context> tls = nullptr, size_t max_reply_bytes = kMaxReplyBytes)
      : endpoint_(std::move(endpoint)),
        connect_timeout_(connect_timeout),
        token_(std::move(token)),
        tls_context_(std::move(tls)),
        max_reply_bytes_(max_reply_bytes),
        tcp_(io_) {
    // Beast reads only as much as the buffer has room for: from a buffer grown to what the
    // headers needed, a large body came in ~2.4 KB reads (64 MiB took 6.4 s, 27k recvmsg calls,
    // each with an epoll_wait and a timer update). 64 KiB of room reads it in 0.1 s.
    buffer_.reserve(kReadBufferBytes);
  }

  struct Response {
    int status = 0;
    std::string reason;
    std::string location;  // the Location header (a redirect)
    std::string body;
    // High availability: the leadership that answered (Traincoord-Term; absent from a single
    // coordinator, or not a number) and its url (Traincoord-Leader).
    std::optional<uint64_t> term;
    std::string leader;
  };

  // One request: its final reply (interim 1xx replies skipped), all of it within `timeout` (a
  // deadline for the whole exchange, not for each read). Fails with "unreachable" (no complete
  // reply in time, a transport error), "tls", or "bad_reply" (a reply over max_reply_bytes, or
  // headers over 64 KiB). On a failure the connection is closed (and reopened next time).
  Result<Response> request(http::verb method, const std::string& target, const std::string& body,
                           milliseconds timeout) {
    if (!connected_) {
      if (auto r = connect(); !r) return tl::unexpected(r.error());
    }
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, endpoint_.host);
    req.set(http::field::user_agent, "traincoord-client");
    if (!token_.empty()) req.set(http::field::authorization, "Bearer " + token_);
    if (method == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
    }
    req.keep_alive(true);
    req.prepare_payload();

    const std::string what = std::string(http::to_string(method)) + " " + target;
    std::optional<http::response_parser<http::string_body>> parser;
    beast::error_code result;
    // One deadline for the write and every read: the stream's timer is a point in time, kept
    // until it is set again.
    lowest().expires_after(timeout);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    with_stream([&](auto& stream) {
      http::async_write(stream, req, [&](beast::error_code ec, size_t) { result = ec; });
      io_.restart();
      io_.run();
      // Reads replies until a final one: an interim 1xx reply is followed by another. The
      // deadline is checked between reads too: the stream's timer alone does not fire while
      // every read completes at once (bytes that never stop coming).
      while (!result) {
        parser.emplace();
        parser->header_limit(64 * 1024);
        parser->body_limit(max_reply_bytes_);
        while (!result && !parser->is_done()) {
          if (std::chrono::steady_clock::now() >= deadline) {
            result = beast::error::timeout;
            break;
          }
          http::async_read_some(stream, buffer_, *parser,
                                [&](beast::error_code ec, size_t) { result = ec; });
          io_.restart();
          io_.run();
        }
        if (result || parser->get().result_int() / 100 != 1) break;
      }
    });
    if (result) {
      close();
      if (result == http::error::body_limit || result == http::error::header_limit) {
        return tl::unexpected(ClientError{
            0,
            std::string(codes::kBadReply),
            "the reply to " + what + " from " + endpoint_.host + ":" + endpoint_.port +
                " is larger than the client reads (" +
                (result == http::error::body_limit
                     ? std::to_string(max_reply_bytes_ >> 20) + " MiB: Options::max_reply_bytes"
                     : std::string("64 KiB of headers")) +
                ")",
            {}});
      }
      if (result == beast::error::timeout) {
        return tl::unexpected(unreachable(
            "no complete reply to " + what + " from " + endpoint_.host + ":" + endpoint_.port +
            " within the request's deadline of " + seconds_text(timeout)));
      }
      // An alert from the coordinator (TLS 1.3 refuses a client certificate only after the
      // handshake): retrying will not help.
      if (result.category() == asio::error::get_ssl_category()) {
        return tl::unexpected(ClientError{0,
                                          std::string(codes::kTls),
                                          "the coordinator at " + endpoint_.host + ":" +
                                              endpoint_.port + " refused TLS: " + result.message(),
                                          {}});
      }
      return tl::unexpected(unreachable(what + " to " + endpoint_.host + ":" + endpoint_.port +
                                        " failed: " + result.message()));
    }
    auto& res = parser->get();
    if (!res.keep_alive()) close();
    Response out{static_cast<int>(res.result_int()),
                 std::string(res.reason()),
                 std::string(res[http::field::location]),
                 std::move(res.body()),
                 std::nullopt,
                 std::string(res["Traincoord-Leader"])};
    out.term = parse_term(std::string(res["Traincoord-Term"]));
    return out;
  }

  void close() {
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().close();
    tls_.reset();
    buffer_.clear();
    connected_ = false;
  }

 private:
  beast::tcp_stream& lowest() { return tls_ ? beast::get_lowest_layer(*tls_) : tcp_; }

  template <class F>
  void with_stream(F&& f) {
    if (tls_) {
      f(*tls_);
    } else {
      f(tcp_);
    }
  }

  Result<void> connect() {
    tcp::resolver resolver(io_);
    beast::error_code ec;
    const auto endpoints = resolver.resolve(endpoint_.host, endpoint_.port, ec);
    if (ec) {
      return tl::unexpected(unreachable("cannot resolve " + endpoint_.host + ": " + ec.message()));
    }
    if (endpoint_.tls) tls_.emplace(io_, *tls_context_);
    beast::error_code result;
    lowest().expires_after(connect_timeout_);
    lowest().async_connect(endpoints,
                           [&](beast::error_code e, const tcp::endpoint&) { result = e; });
    io_.restart();
    io_.run();
    if (result) {
      lowest().close();
      tls_.reset();
      return tl::unexpected(unreachable("cannot connect to " + endpoint_.host + ":" +
                                        endpoint_.port + ": " + result.message()));
    }
    lowest().socket().set_option(tcp::no_delay(true), ec);
    if (tls_) {
      if (auto r = handshake(); !r) {
        close();
        return r;
      }
    }
    connected_ = true;
    return {};
  }

  // Verifies the coordinator's certificate against the CA and the url's host (name or IP).
  Result<void> handshake() {
    const bool is_address = [&] {
      beast::error_code e;
      (void)asio::ip::make_address(endpoint_.host, e);
      return !e;
    }();
    if (!is_address) SSL_set_tlsext_host_name(tls_->native_handle(), endpoint_.host.c_str());
    tls_->set_verify_callback(ssl::host_name_verification(endpoint_.host));
    beast::error_code result;
    lowest().expires_after(connect_timeout_);
    tls_->async_handshake(ssl::stream_base::client, [&](beast::error_code e) { result = e; });
    io_.restart();
    io_.run();
    if (!result) return {};
    if (result == beast::error::timeout) {
      return tl::unexpected(unreachable("TLS handshake with " + endpoint_.host + ":" +
                                        endpoint_.port + " timed out"));
    }
    std::string why = result.message();
    if (const long v = SSL_get_verify_result(tls_->native_handle()); v != X509_V_OK) {
      why = X509_verify_cert_error_string(v);
    }
    return tl::unexpected(ClientError{
        0,
        std::string(codes::kTls),
        "TLS handshake with " + endpoint_.host + ":" + endpoint_.port + " failed: " + why,
        {}});
  }

  Endpoint endpoint_;
  milliseconds connect_timeout_;
  std::string token_;
  std::shared_ptr<ssl::context> tls_context_;
  size_t max_reply_bytes_;
  asio::io_context io_;
  beast::tcp_stream tcp_;                                    // plain HTTP
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;  // HTTPS: a fresh one per connection
  static constexpr size_t kReadBufferBytes = 64 * 1024;
  beast::flat_buffer buffer_;
  bool connected_ = false;
};

// The coordinators a client talks to for one run (docs/API.md, "Several coordinators"): the urls
// it was given, and the leaders they named; which one it believes leads the run; the highest
// term (Traincoord-Term) it saw. Shared by the connections of a worker (its calls, its side
// calls, its heartbeats), so that what one learns the others use. Thread-safe.
class Coordinators {
 public:
  // REQUIRES: `urls` from split_urls (each parses). The TLS files are Options' (empty: the
  // environment's), used when an https url is first met.
  Coordinators(std::vector<std::string> urls, const Options& tls_files)
      : urls_(std::move(urls)), tls_files_(tls_files) {}

  size_t size() const {
    std::lock_guard lock(mu_);
    return urls_.size();
  }
  std::string url(size_t i) const {
    std::lock_guard lock(mu_);
    return urls_.at(i);
  }
  // "http://a:8470" or "http://a:8470, http://b:8470".
  std::string list() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& u : urls_) out += (out.empty() ? "" : ", ") + u;
    return out;
  }
  size_t leader() const {
    std::lock_guard lock(mu_);
    return leader_;
  }
  void set_leader(size_t i) {
    std::lock_guard lock(mu_);
    leader_ = i % urls_.size();
  }
  // Coordinator `i` failed: the next one (round robin) is tried, unless another thread moved on
  // already.
  void failed(size_t i) {
    std::lock_guard lock(mu_);
    if (leader_ == i) leader_ = (i + 1) % urls_.size();
  }
  // The index of the leader a coordinator named (added to the list when new, up to
  // kMaxNamed); nullopt when `url` is not http(s)://HOST:PORT or the list is full.
  std::optional<size_t> index_of(std::string url) {
    while (!url.empty() && url.back() == '/') url.pop_back();
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < urls_.size(); ++i) {
      if (urls_[i] == url) return i;
    }
    if (!parse_url(url) || named_ >= kMaxNamed) return std::nullopt;
    ++named_;
    urls_.push_back(std::move(url));
    return urls_.size() - 1;
  }
  // Notes the term of a reply: false when it is older than one seen (the reply is stale).
  bool note_term(std::optional<uint64_t> term) {
    if (!term) return true;
    std::lock_guard lock(mu_);
    if (*term < term_) return false;
    term_ = *term;
    return true;
  }
  uint64_t term() const {
    std::lock_guard lock(mu_);
    return term_;
  }
  // The TLS context for https urls, made on first use.
  Result<std::shared_ptr<ssl::context>> tls() {
    std::lock_guard lock(mu_);
    if (!tls_) {
      auto made = make_tls_context(tls_files_.ca_file, tls_files_.cert_file, tls_files_.key_file);
      if (!made) return tl::unexpected(made.error());
      tls_ = *made;
    }
    return tls_;
  }

 private:
  static constexpr size_t kMaxNamed = 16;  // leaders named that were not in the list
  mutable std::mutex mu_;
  std::vector<std::string> urls_;
  size_t named_ = 0;
  size_t leader_ = 0;
  uint64_t term_ = 0;
  Options tls_files_;
  std::shared_ptr<ssl::context> tls_;
};

// A connection to each coordinator, for one thread: made on first use of each.
class Channel {
 public:
  Channel(std::shared_ptr<Coordinators> coordinators, milliseconds connect_timeout,
          std::string token, size_t max_reply_bytes)
      : coordinators_(std::move(coordinators)),
        connect_timeout_(connect_timeout),
        token_(std::move(token)),
        max_reply_bytes_(max_reply_bytes) {}

  Coordinators& coordinators() { return *coordinators_; }

  // The connection to coordinator `i`; fails when its TLS context cannot be made.
  Result<Connection*> to(size_t i) {
    if (connections_.size() <= i) connections_.resize(i + 1);
    if (!connections_[i]) {
      auto endpoint = parse_url(coordinators_->url(i));
      if (!endpoint) return tl::unexpected(endpoint.error());
      std::shared_ptr<ssl::context> tls;
      if (endpoint->tls) {
        auto made = coordinators_->tls();
        if (!made) return tl::unexpected(made.error());
        tls = *made;
      }
      connections_[i] = std::make_unique<Connection>(*endpoint, connect_timeout_, token_,
                                                     std::move(tls), max_reply_bytes_);
    }
    return connections_[i].get();
  }

 private:
  std::shared_ptr<Coordinators> coordinators_;
  milliseconds connect_timeout_;
  std::string token_;
  size_t max_reply_bytes_;
  std::vector<std::unique_ptr<Connection>> connections_;
};

struct Worker::Heartbeats {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  HeldLeases<> held;  // the leases this worker knows it holds, and when each was renewed
  std::thread thread;
};

void Worker::hold(uint64_t lease) {
  if (!heartbeats_) return;
  std::lock_guard lock(heartbeats_->mu);
  heartbeats_->held.hold(lease, std::chrono::steady_clock::now());
}

void Worker::drop(uint64_t lease) {
  if (!heartbeats_) return;
  std::lock_guard lock(heartbeats_->mu);
  heartbeats_->held.drop(lease);
}

Worker::Worker(Options options) : options_(std::move(options)) {}

Worker::~Worker() {
  if (heartbeats_) {
    {
      std::lock_guard lock(heartbeats_->mu);
      heartbeats_->stop = true;
    }
    heartbeats_->cv.notify_all();
    if (heartbeats_->thread.joinable()) heartbeats_->thread.join();
  }
}

Result<std::unique_ptr<Worker>> Worker::connect(Options options) {
  auto urls = split_urls(options.url);
  if (!urls) return tl::unexpected(urls.error());
  if (options.run.empty()) {
    return tl::unexpected(ClientError{0, "invalid_argument", "Options::run is empty", "run"});
  }
  if (auto ok = check_group(options.group); !ok) return tl::unexpected(ok.error());
  if (auto ok = check_rank(options); !ok) return tl::unexpected(ok.error());
  if (options.worker_name.empty()) options.worker_name = default_name();
  if (options.token.empty()) options.token = token_from_environment();
  auto coordinators = std::make_shared<Coordinators>(*urls, options);
  for (const auto& url : *urls) {
    if (parse_url(url)->tls) {  // a bad CA or certificate file is said at once
      if (auto tls = coordinators->tls(); !tls) return tl::unexpected(tls.error());
      break;
    }
  }
  std::unique_ptr<Worker> w(new Worker(std::move(options)));
  w->coordinators_ = std::move(coordinators);
  w->channel_ = w->make_channel();
  if (auto r = w->register_worker(); !r) return tl::unexpected(r.error());
  if (w->options_.heartbeats) {
    w->heartbeats_ = std::make_unique<Heartbeats>();
    w->heartbeats_->thread = std::thread([raw = w.get()] { raw->heartbeat_loop(); });
  }
  return w;
}

Result<void> Worker::register_worker() {
  JsonWriter j;
  j.begin_object().field("name", options_.worker_name);
  if (!options_.group.empty()) j.field("group", options_.group);
  if (options_.rank) {  // with world_size (connect checked)
    j.field("rank", static_cast<uint64_t>(*options_.rank));
    j.field("world_size", static_cast<uint64_t>(*options_.world_size));
  }
  j.end_object();
  auto reply = call("workers", j.str(), milliseconds(0));
  if (!reply) return tl::unexpected(reply.error());
  auto registered = reply::registration(*reply, request_name("workers"));
  if (!registered) return tl::unexpected(registered.error());
  id_ = registered->worker;
  {
    std::lock_guard lock(group_mu_);
    generation_ = registered->generation;
    restore_required_ = registered->restore_required;
    latest_cut_ = registered->latest_cut;
  }
  if (registered->heartbeat_interval_ms) {  // bounded by reply::registration
    heartbeat_interval_ = milliseconds(*registered->heartbeat_interval_ms);
  }
  return {};
}

std::string Worker::request_name(const std::string& action) const {
  return "POST /v1/runs/" + options_.run + "/" + action;
}

namespace {

// How a request is retried: for give_up_after since its first failure, with exponential
// backoff and full jitter from initial_backoff to max_backoff. nullopt: one round over the
// coordinators, without waiting (get(), post(), heartbeats).
struct Retry {
  std::optional<milliseconds> give_up_after;
  milliseconds initial_backoff{100};
  milliseconds max_backoff{5'000};
};

Retry retry_of(const Options& options) {
  return Retry{options.give_up_after, options.initial_backoff, options.max_backoff};
}

// not_leader answers naming a leader followed in a row before the client backs off (two
// coordinators that name each other must not make it spin).
constexpr size_t kMaxHops = 3;

// Sends one request to the coordinator believed to lead the run, and follows the protocol of
// several coordinators (docs/API.md, "Several coordinators"):
// - not_leader naming a leader: the same request there, at once (kMaxHops in a row at most);
//   naming none (an election): the next url, after its retry_after_ms;
// - no answer (a connection refused, a timeout), or an answer of an older term than one seen (a
//   deposed leader's, ignored): the next url at once, and once every url failed in a row, again
//   after a backoff;
// - 5xx: the same coordinator again, after a backoff.
// The body is the same every time: the request id in it makes the retries idempotent. Returns
// the body of a 200 or 201, else the error; giving up, its message names every url tried and
// what each answered last.
Result<std::string> with_retries(Channel& channel, const Retry& retry, http::verb method,
                                 const std::string& target, const std::string& body,
                                 milliseconds timeout) {
  Coordinators& co = channel.coordinators();
  std::optional<std::chrono::steady_clock::time_point> failing_since;
  milliseconds backoff = retry.initial_backoff;
  std::mt19937_64 rng(std::random_device{}());
  const std::string what = std::string(http::to_string(method)) + " " + target;
  std::vector<std::pair<std::string, std::string>> tried;  // each url tried, its last error
  auto note = [&](const std::string& url, const std::string& why) {
    for (auto& [u, w] : tried) {
      if (u == url) {
        w = why;
        return;
      }
    }
    tried.emplace_back(url, why);
  };
  size_t failed_in_a_row = 0, hops = 0;
  while (true) {
    const auto attempt_started = std::chrono::steady_clock::now();
    const size_t at = co.leader();
    const std::string url = co.url(at);
    auto connection = channel.to(at);
    if (!connection) return tl::unexpected(connection.error());
    auto res = (*connection)->request(method, target, body, timeout);
    ClientError error;
    std::optional<milliseconds> pause;  // what not_leader asked for; else the backoff
    bool next_url = false;              // move on to the next url without waiting
    // Only an unreachable coordinator may get better: a TLS refusal or a reply the client
    // cannot use (too large, not HTTP) is not retried.
    if (!res && res.error().code != codes::kUnreachable) return tl::unexpected(res.error());
    if (!res) {
      error = res.error();
      co.failed(at);
      next_url = true;
    } else if (const uint64_t seen = co.term(); !co.note_term(res->term)) {
      error = unreachable(url + " answered " + what + " as the leader of term " +
                          std::to_string(*res->term) + ", older than term " + std::to_string(seen) +
                          " seen: a deposed leader; its answer was ignored");
      co.failed(at);
      next_url = true;
    } else if (auto refused = reply::not_leader(res->status, res->body)) {
      error = reply::error(res->status, res->body, what, res->reason, res->location);
      std::optional<size_t> leader;
      if (!refused->leader.empty() && co.note_term(refused->term)) {
        leader = co.index_of(refused->leader);
      }
      if (leader && *leader != at) {
        co.set_leader(*leader);
        note(url, "not the leader; it named " + refused->leader);
        if (++hops <= kMaxHops) continue;
      } else {
        co.failed(at);
        pause = milliseconds(refused->retry_after_ms);
        next_url = true;
      }
    } else if (res->status < 500) {
      if (res->status == 200 || res->status == 201) return std::move(res->body);
      return tl::unexpected(reply::error(res->status, res->body, what, res->reason, res->location));
    } else {
      error = reply::error(res->status, res->body, what, res->reason, res->location);
    }
    note(url, error.message);
    const auto now = std::chrono::steady_clock::now();
    // Failing since the first failed attempt began: the time stated is the time it tried.
    if (!failing_since) failing_since = attempt_started;
    ++failed_in_a_row;
    const bool one_round_done = !retry.give_up_after && failed_in_a_row >= co.size();
    const bool too_long = retry.give_up_after && now - *failing_since >= *retry.give_up_after;
    if (one_round_done || too_long) {
      if (tried.size() > 1) {
        std::string each;
        for (const auto& [u, w] : tried) each += (each.empty() ? "" : "; ") + u + ": " + w;
        error.message = "no coordinator of " + co.list() + " answered " + what;
        if (too_long) {
          error.message +=
              " for " +
              seconds_text(std::chrono::duration_cast<milliseconds>(now - *failing_since)) +
              " (give_up_after " + seconds_text(*retry.give_up_after) + ")";
        }
        error.message += "; giving up (the last error of each: " + each + ")";
      } else if (too_long) {
        error.message =
            "the coordinator at " + url + " has not answered " + what + " for " +
            seconds_text(std::chrono::duration_cast<milliseconds>(now - *failing_since)) +
            " (give_up_after " + seconds_text(*retry.give_up_after) +
            "); giving up (last error: " + error.message + ")";
      }
      return tl::unexpected(error);
    }
    if (!retry.give_up_after) {  // one round: the next url, at once
      co.failed(at);
      continue;
    }
    if (next_url && failed_in_a_row % co.size() != 0) continue;
    hops = 0;
    if (pause) {
      std::this_thread::sleep_for(std::min(*pause, retry.max_backoff));
      continue;
    }
    const auto sleep = milliseconds(std::uniform_int_distribution<int64_t>(
        backoff.count() / 2, std::max<int64_t>(backoff.count() / 2, backoff.count()))(rng));
    std::this_thread::sleep_for(sleep);
    backoff = std::min(retry.max_backoff, backoff * 2);
  }
}

}  // namespace

std::unique_ptr<Channel> Worker::make_channel() const {
  return std::make_unique<Channel>(coordinators_, options_.connect_timeout, options_.token,
                                   options_.max_reply_bytes);
}

// POSTs to /v1/runs/RUN/ACTION over the worker's connections (with_retries).
Result<std::string> Worker::call(const std::string& action, const std::string& body,
                                 milliseconds extra_wait) {
  return with_retries(*channel_, retry_of(options_), http::verb::post,
                      "/v1/runs/" + options_.run + "/" + action, body,
                      options_.request_timeout + extra_wait);
}

Result<std::string> Worker::call_aside(const std::string& action, const std::string& body,
                                       bool get) {
  std::lock_guard lock(aside_mu_);
  if (!aside_) aside_ = make_channel();
  return with_retries(*aside_, retry_of(options_), get ? http::verb::get : http::verb::post,
                      "/v1/runs/" + options_.run + "/" + action, body, options_.request_timeout);
}

// Takes an acquire's answer: holds its jobs' leases, notes a finished run. "wait": an error with
// that code, and the caller asks again.
Result<std::vector<Job>> Worker::take_acquired(reply::Acquired acquired) {
  switch (acquired.status) {
    case reply::Acquired::Status::kJob:
      for (const Job& job : acquired.jobs) hold(job.lease);
      return std::move(acquired.jobs);
    case reply::Acquired::Status::kFinished:
      finished_ = std::move(acquired.finished);
      return std::vector<Job>();
    case reply::Acquired::Status::kWait:
      break;
  }
  return tl::unexpected(ClientError{200, "wait", "", {}});
}

// Reads an acquire reply ({"status": "job"|"wait"|"finished", ...}); nested: the acquire is the
// "next" member of a completion reply.
Result<std::optional<Job>> Worker::take(const std::string& reply, bool nested) {
  Result<reply::Acquired> acquired;
  if (nested) {
    auto done = reply::completion(reply, false, 1, true, request_name("complete"));
    if (!done) return tl::unexpected(done.error());
    last_completed_ = done->outcomes.front();
    acquired = std::move(*done->next);
  } else {
    acquired = reply::acquired(reply, false, request_name("acquire"));
    if (!acquired) return tl::unexpected(acquired.error());
  }
  auto jobs = take_acquired(std::move(*acquired));
  if (!jobs) return tl::unexpected(jobs.error());
  if (jobs->empty()) return std::optional<Job>();
  return std::optional<Job>(std::move(jobs->front()));
}

// One acquire ("jobs": N when jobs > 0): the reply. The coordinator restarted without our
// registration: register again, then ask again.
Result<std::string> Worker::acquire(size_t jobs) {
  while (true) {
    JsonWriter j;
    wire::begin_request(j, id_.load(), options_.group)
        .field("wait_ms", options_.long_poll.count())
        .field("request", request_id());
    if (jobs > 0) j.field("jobs", static_cast<uint64_t>(jobs));
    j.end_object();
    auto reply = call("acquire", j.str(), options_.long_poll);
    if (!reply && reply::unregistered(reply.error())) {
      if (auto r = register_worker(); !r) return tl::unexpected(r.error());
      continue;
    }
    return reply;
  }
}

Result<std::optional<Job>> Worker::next() {
  while (true) {
    auto reply = acquire(0);
    if (!reply) return tl::unexpected(reply.error());
    auto job = take(*reply, false);
    if (job || job.error().code != "wait") return job;
  }
}

// The body of POST .../complete; with `next`, it asks for the next job too (a fresh request id).
std::string Worker::completion_body(const Job& job, const Completion& c, bool next) const {
  JsonWriter j;
  wire::begin_request(j, id_.load(), options_.group).field("lease", job.lease);
  j.field("loss", c.loss).field("samples", c.samples);
  if (c.seconds) j.field("seconds", *c.seconds);
  if (!c.metrics.empty()) {
    j.key("metrics").begin_object();
    for (const auto& [name, value] : c.metrics) j.field(name, value);
    j.end_object();
  }
  if (next) {
    j.field("next", true).field("wait_ms", options_.long_poll.count());
    j.field("request", request_id());
  }
  j.end_object();
  return j.str();
}

Result<Completed> Worker::complete(const Job& job, const Completion& c) {
  drop(job.lease);
  auto reply = call("complete", completion_body(job, c, false), milliseconds(0));
  if (!reply) {
    if (reply::forgotten(reply.error())) {
      // The coordinator restarted without its state: it does not know this lease (or us).
      last_completed_ = {"lost", false};
      if (reply::unregistered(reply.error())) {
        if (auto r = register_worker(); !r) return tl::unexpected(r.error());
      }
      return last_completed_;
    }
    return tl::unexpected(reply.error());
  }
  auto done = reply::completion(*reply, false, 1, false, request_name("complete"));
  if (!done) return tl::unexpected(done.error());
  last_completed_ = done->outcomes.front();
  return last_completed_;
}

Result<std::optional<Job>> Worker::complete_and_next(const Job& job, const Completion& c) {
  drop(job.lease);
  auto reply = call("complete", completion_body(job, c, true), options_.long_poll);
  if (!reply) {
    if (reply::forgotten(reply.error())) {
      auto done = complete(job, c);  // registers again where needed; says "lost"
      if (!done) return tl::unexpected(done.error());
      return next();
    }
    return tl::unexpected(reply.error());
  }
  auto next_job = take(*reply, true);
  if (!next_job && next_job.error().code == "wait") return next();
  return next_job;
}

// Reads a reply that lists its jobs ("jobs": N asked); nested: under "next" of a completion
// reply of `sent` completions, whose "outcomes" go to last_outcomes_.
Result<std::vector<Job>> Worker::take_jobs(const std::string& reply, bool nested, size_t sent) {
  Result<reply::Acquired> acquired;
  if (nested) {
    auto done = reply::completion(reply, true, sent, true, request_name("complete"));
    if (!done) return tl::unexpected(done.error());
    last_outcomes_ = std::move(done->outcomes);
    acquired = std::move(*done->next);
  } else {
    acquired = reply::acquired(reply, true, request_name("acquire"));
    if (!acquired) return tl::unexpected(acquired.error());
  }
  return take_acquired(std::move(*acquired));
}

Result<std::vector<Job>> Worker::next_jobs(size_t n) {
  while (true) {
    auto reply = acquire(n);
    if (!reply) return tl::unexpected(reply.error());
    auto jobs = take_jobs(*reply, false, 0);
    if (jobs || jobs.error().code != "wait") return jobs;
  }
}

Result<std::vector<Job>> Worker::complete_and_next_jobs(
    const std::vector<std::pair<Job, Completion>>& done, size_t n) {
  if (done.empty()) return next_jobs(n);
  JsonWriter j;
  wire::begin_request(j, id_.load(), options_.group).key("completions").begin_array();
  for (const auto& [job, c] : done) {
    drop(job.lease);
    wire::write_completion(j, job, c);
  }
  j.end_array();
  j.field("next", true).field("wait_ms", options_.long_poll.count());
  j.field("request", request_id()).field("jobs", static_cast<uint64_t>(n));
  j.end_object();
  auto reply = call("complete", j.str(), options_.long_poll);
  if (!reply) {
    if (!reply::forgotten(reply.error())) return tl::unexpected(reply.error());
    // The coordinator restarted without its state: it knows none of these leases (or us).
    last_outcomes_.assign(done.size(), Completed{"lost", false});
    if (reply::unregistered(reply.error())) {
      if (auto r = register_worker(); !r) return tl::unexpected(r.error());
    }
    return next_jobs(n);
  }
  auto jobs = take_jobs(*reply, true, done.size());
  if (!jobs && jobs.error().code == "wait") return next_jobs(n);
  return jobs;
}

Result<void> Worker::fail(const Job& job, const std::string& reason) {
  drop(job.lease);
  JsonWriter j;
  wire::begin_request(j, id_.load(), options_.group).field("lease", job.lease);
  j.field("reason", reason);
  j.end_object();
  auto reply = call("fail", j.str(), milliseconds(0));
  if (!reply) return tl::unexpected(reply.error());
  return {};
}

Result<void> Worker::release(const std::vector<Job>& jobs) {
  if (jobs.empty()) return {};
  JsonWriter j;
  wire::begin_request(j, id_.load(), options_.group).key("leases").begin_array();
  for (const Job& job : jobs) {
    drop(job.lease);
    j.value(job.lease);
  }
  j.end_array().end_object();
  auto reply = call("release", j.str(), milliseconds(0));
  if (!reply) return tl::unexpected(reply.error());
  return {};
}

Result<void> Worker::leave() {
  JsonWriter j;
  wire::begin_request(j, id_.load(), options_.group).end_object();
  auto reply = call("leave", j.str(), milliseconds(0));
  if (!reply) return tl::unexpected(reply.error());
  return {};
}

Result<CutShareTaken> Worker::give_cut_share(const CutShare& share) {
  if (options_.group.empty()) {
    return tl::unexpected(ClientError{0, "invalid_argument",
                                      "a cut is taken by a group: set Options::group", "group"});
  }
  JsonWriter j;
  wire::begin_request(j, id_.load(), options_.group);
  j.field("seq", share.seq).field("rank", share.rank).field("world_size", share.world_size);
  j.key("parts").begin_array();
  for (const CutPart& part : share.parts) {
    j.begin_object().field("lease", part.lease).field("batches", part.batches);
    j.field("loss", part.loss).field("samples", part.samples);
    if (!part.metrics.empty()) {
      j.key("metrics").begin_object();
      for (const auto& [name, value] : part.metrics) j.field(name, value);
      j.end_object();
    }
    j.end_object();
  }
  j.end_array().end_object();
  auto reply = call_aside("cuts", j.str(), false);
  if (!reply) return tl::unexpected(reply.error());
  auto taken = reply::cut_share(*reply, request_name("cuts"));
  if (!taken) return tl::unexpected(taken.error());
  std::lock_guard lock(group_mu_);
  generation_ = taken->generation;
  if (taken->complete) latest_cut_ = std::max(latest_cut_.value_or(0), taken->cut);
  return taken;
}

Result<CutList> Worker::cuts() {
  auto reply = call_aside("cuts", "", true);
  if (!reply) return tl::unexpected(reply.error());
  return reply::cut_list(*reply, "GET /v1/runs/" + options_.run + "/cuts");
}

Result<Cut> Worker::cut(uint64_t id) {
  const std::string action = "cuts/" + std::to_string(id);
  auto reply = call_aside(action, "", true);
  if (!reply) return tl::unexpected(reply.error());
  return reply::cut(*reply, "GET /v1/runs/" + options_.run + "/" + action);
}

Result<Cut> Worker::wait_for_cut(uint64_t id, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  milliseconds pause(20);
  while (true) {
    auto c = cut(id);
    if (!c || c->complete) return c;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string missing;
      for (uint32_t rank = 0, listed = 0; rank < c->world_size; ++rank) {
        if (std::binary_search(c->ranks.begin(), c->ranks.end(), rank)) continue;
        if (++listed > 16) {
          missing += ", ...";
          break;
        }
        missing += (missing.empty() ? "" : ", ") + std::to_string(rank);
      }
      return tl::unexpected(ClientError{
          0,
          std::string(codes::kCutTimeout),
          "cut " + std::to_string(id) + " of group " + c->group + " is not complete after " +
              std::to_string(timeout.count()) + " ms: " + std::to_string(c->ranks.size()) +
              " of its " + std::to_string(c->world_size) +
              " ranks gave their share; missing ranks " + missing +
              " (each rank gives its share at the same step)",
          {}});
    }
    std::this_thread::sleep_for(std::min(pause, std::chrono::duration_cast<milliseconds>(
                                                    deadline - std::chrono::steady_clock::now()) +
                                                    milliseconds(1)));
    pause = std::min(pause * 2, milliseconds(500));
  }
}

Result<Restored> Worker::restore(uint64_t id) { return restore_to(id); }

Result<Restored> Worker::start_fresh() { return restore_to(std::nullopt); }

Result<Restored> Worker::restore_to(std::optional<uint64_t> id) {
  if (options_.group.empty()) {
    return tl::unexpected(ClientError{0, "invalid_argument",
                                      "a restore is made by a group: set Options::group", "group"});
  }
  JsonWriter j;
  j.begin_object().field("group", options_.group);
  if (id) {
    j.field("cut", *id);
  } else {
    j.field("fresh", true);
  }
  j.end_object();
  auto reply = call_aside("restore", j.str(), false);
  if (!reply) return tl::unexpected(reply.error());
  auto restored = reply::restored(*reply, request_name("restore"));
  if (!restored) return tl::unexpected(restored.error());
  if (restored->restored && heartbeats_) {
    std::lock_guard lock(heartbeats_->mu);
    heartbeats_->held.clear();  // every lease out is void
  }
  std::lock_guard lock(group_mu_);
  generation_ = restored->generation;
  restore_required_ = false;
  return restored;
}

uint64_t Worker::generation() const {
  std::lock_guard lock(group_mu_);
  return generation_;
}

bool Worker::restore_required() const {
  std::lock_guard lock(group_mu_);
  return restore_required_;
}

std::optional<uint64_t> Worker::latest_cut() const {
  std::lock_guard lock(group_mu_);
  return latest_cut_;
}

// Heartbeats go over connections of their own, so they are never stuck behind a long poll. Each
// follows the leader as a call does, within one round over the coordinators (a not_leader naming
// the leader is followed at once), so that leases stay alive across a failover. A heartbeat goes
// out only when a held lease has gone the interval without being renewed (HeldLeases): a worker
// whose jobs take less than the interval gets every lease fresh and sends none.
void Worker::heartbeat_loop() {
  auto channel = make_channel();
  const std::string target = "/v1/runs/" + options_.run + "/heartbeat";
  std::unique_lock lock(heartbeats_->mu);
  for (;;) {
    // Looks again at least every interval (a lease held meanwhile is due an interval after).
    const auto now = std::chrono::steady_clock::now();
    const auto due = heartbeats_->held.due(heartbeat_interval_).value_or(now + heartbeat_interval_);
    if (heartbeats_->cv.wait_until(lock, due, [this] { return heartbeats_->stop; })) break;
    const auto at = std::chrono::steady_clock::now();
    if (heartbeats_->held.due(heartbeat_interval_).value_or(at + heartbeat_interval_) > at) {
      continue;  // nothing held, or renewed since (a lease dropped, another held)
    }
    JsonWriter j;
    wire::begin_request(j, id_.load(), options_.group).key("leases").begin_array();
    for (uint64_t lease : heartbeats_->held.renew_all(at)) j.value(lease);
    j.end_array().end_object();
    lock.unlock();
    // A failed heartbeat is not fatal: the next one may reach the coordinator in time.
    (void)with_retries(*channel, Retry{std::nullopt}, http::verb::post, target, j.str(),
                       std::min(heartbeat_interval_, options_.request_timeout));
    lock.lock();
  }
}

namespace {

// The coordinators of `urls` for the run `path` is about ("" for the paths of no run), kept for
// the process: the tools (get(), post(): `traincoord status`, `launch`) then go straight to the
// leader they found last time, and ignore the answers of an older term than one they saw.
Result<std::shared_ptr<Coordinators>> coordinators_for(const std::string& urls,
                                                       const std::string& path) {
  auto list = split_urls(urls);
  if (!list) return tl::unexpected(list.error());
  std::string run;
  if (path.rfind("/v1/runs/", 0) == 0) {
    run = path.substr(9);
    run = run.substr(0, run.find_first_of("/?"));
  }
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Coordinators>> known;
  std::lock_guard lock(mu);
  if (known.size() > 256) known.clear();  // a tool is not a server: a few runs at most
  auto& co = known[urls + "\n" + run];
  if (!co) co = std::make_shared<Coordinators>(*list, Options{});
  return co;
}

Result<std::string> once(http::verb method, const std::string& url, const std::string& path,
                         const std::string& body, milliseconds timeout, const std::string& token,
                         size_t max_reply_bytes) {
  auto coordinators = coordinators_for(url, path);
  if (!coordinators) return tl::unexpected(coordinators.error());
  Channel channel(*coordinators, timeout, token.empty() ? token_from_environment() : token,
                  max_reply_bytes);
  return with_retries(channel, Retry{std::nullopt}, method, path, body, timeout);
}

}  // namespace

Result<std::string> get(const std::string& url, const std::string& path, milliseconds timeout,
                        const std::string& token, size_t max_reply_bytes) {
  return once(http::verb::get, url, path, "", timeout, token, max_reply_bytes);
}

Result<std::string> post(const std::string& url, const std::string& path, const std::string& body,
                         milliseconds timeout, const std::string& token, size_t max_reply_bytes) {
  return once(http::verb::post, url, path, body, timeout, token, max_reply_bytes);
}

std::string token_from_environment() {
  if (const char* t = std::getenv("TRAINCOORD_TOKEN"); t && *t) return t;
  if (const char* f = std::getenv("TRAINCOORD_TOKEN_FILE"); f && *f) {
    std::ifstream in(f);
    std::string token;
    std::getline(in, token);
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
    return token;
  }
  return "";
}

Result<void> rank_from_environment(Options& options) {
  if (options.group.empty()) {
    if (const char* g = std::getenv("TRAINCOORD_GROUP"); g && *g) options.group = g;
  }
  if (options.group.empty() || options.rank || options.world_size) return {};
  const char* rank = std::getenv("RANK");
  const char* world_size = std::getenv("WORLD_SIZE");
  const bool has_rank = rank && *rank;
  const bool has_world_size = world_size && *world_size;
  if (!has_rank && !has_world_size) return {};
  if (has_rank != has_world_size) {
    const char* missing = has_rank ? "WORLD_SIZE" : "RANK";
    return tl::unexpected(ClientError{0, "invalid_argument",
                                      std::string("$") + missing + " is unset while $" +
                                          (has_rank ? "RANK" : "WORLD_SIZE") +
                                          " is set: a rank needs both",
                                      has_rank ? "world_size" : "rank"});
  }
  auto number = [](const char* name, const char* text, const char* field) -> Result<uint32_t> {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' ||
        !std::isdigit(static_cast<unsigned char>(*text)) || v > UINT32_MAX) {
      return tl::unexpected(ClientError{0, "invalid_argument",
                                        std::string("$") + name +
                                            " must be a whole number below 2^32, got '" +
                                            std::string(text).substr(0, 64) + "'",
                                        field});
    }
    return static_cast<uint32_t>(v);
  };
  auto r = number("RANK", rank, "rank");
  if (!r) return tl::unexpected(r.error());
  auto w = number("WORLD_SIZE", world_size, "world_size");
  if (!w) return tl::unexpected(w.error());
  options.rank = *r;
  options.world_size = *w;
  return {};
}

}  // namespace traincoord::client
