#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs it

#include "journal/etcd_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <optional>
#include <thread>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace traincoord::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

// The TLS context of TlsFiles; an error names the flag of the file that cannot be used.
Result<std::unique_ptr<ssl::context>> make_tls_context(const TlsFiles& tls) {
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  beast::error_code ec;
  if (!tls.ca_file.empty()) {
    ctx->load_verify_file(tls.ca_file, ec);
    if (ec)
      return invalid_argument("etcd-cacert", "--etcd-cacert " + tls.ca_file +
                                                 ": cannot use it as the CA of the etcd members (" +
                                                 ec.message() + ")");
  } else {
    ctx->set_default_verify_paths(ec);
  }
  ctx->set_verify_mode(ssl::verify_peer);
  if (!tls.cert_file.empty()) {
    ctx->use_certificate_chain_file(tls.cert_file, ec);
    if (ec)
      return invalid_argument("etcd-cert", "--etcd-cert " + tls.cert_file +
                                               ": cannot use it as the client certificate (" +
                                               ec.message() + ")");
    const std::string& key = tls.key_file.empty() ? tls.cert_file : tls.key_file;
    // (OpenSSL's message says what is wrong with the file, never what is in it)
    ctx->use_private_key_file(key, ssl::context::pem, ec);
    if (ec)
      return invalid_argument("etcd-key", "--etcd-key " + key +
                                              ": cannot use it as the key of --etcd-cert " +
                                              tls.cert_file + " (" + ec.message() + ")");
  } else if (!tls.key_file.empty()) {
    return invalid_argument(
        "etcd-key", "--etcd-key " + tls.key_file + " needs --etcd-cert (the client certificate)");
  }
  return ctx;
}

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int64_t to_int(const rapidjson::Value& v) {
  if (v.IsString()) return std::strtoll(v.GetString(), nullptr, 10);
  if (v.IsInt64()) return v.GetInt64();
  if (v.IsUint64()) return static_cast<int64_t>(v.GetUint64());
  return 0;
}

int64_t int_field(const rapidjson::Value& o, const char* name) {
  if (!o.IsObject()) return 0;
  auto it = o.FindMember(name);
  return it == o.MemberEnd() ? 0 : to_int(it->value);
}

// A uint64 of etcd's (a member ID, a term) as its decimal digits: the gateway sends them as
// strings ("" when absent).
std::string id_field(const rapidjson::Value& o, const char* name) {
  if (!o.IsObject()) return "";
  auto it = o.FindMember(name);
  if (it == o.MemberEnd()) return "";
  if (it->value.IsString()) return it->value.GetString();
  if (it->value.IsUint64()) return std::to_string(it->value.GetUint64());
  return "";
}

std::string quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }
std::string b64(std::string_view s) { return quoted(base64_encode(s)); }

std::string operation_json(const Operation& op) {
  switch (op.kind) {
    case Operation::Kind::kPut:
      return "{\"requestPut\":{\"key\":" + b64(op.key) + ",\"value\":" + b64(op.value) +
             (op.lease ? ",\"lease\":\"" + std::to_string(op.lease) + "\"" : "") + "}}";
    case Operation::Kind::kDeleteRange:
      return "{\"requestDeleteRange\":{\"key\":" + b64(op.key) +
             (op.range_end.empty() ? "" : ",\"range_end\":" + b64(op.range_end)) + "}}";
    case Operation::Kind::kRange:
      return "{\"requestRange\":{\"key\":" + b64(op.key) +
             (op.range_end.empty() ? "" : ",\"range_end\":" + b64(op.range_end)) +
             (op.limit ? ",\"limit\":\"" + std::to_string(op.limit) + "\"" : "") + "}}";
  }
  return "{}";
}

std::string compare_json(const Compare& c) {
  static constexpr const char* kTargets[] = {"CREATE", "MOD", "VERSION", "VALUE", "LEASE"};
  static constexpr const char* kFields[] = {"create_revision", "mod_revision", "version", "value",
                                            "lease"};
  static constexpr const char* kOps[] = {"EQUAL", "NOT_EQUAL", "GREATER", "LESS"};
  const auto t = static_cast<size_t>(c.target);
  std::string s = "{\"target\":\"" + std::string(kTargets[t]) + "\",\"result\":\"" +
                  kOps[static_cast<size_t>(c.op)] + "\",\"key\":" + b64(c.key) + ",\"" +
                  kFields[t] + "\":";
  s += c.target == Compare::Target::kValue ? b64(c.value) : quoted(std::to_string(c.number));
  return s + "}";
}

bool read_kvs(const rapidjson::Value& o, RangeResult* out) {
  out->revision = o.HasMember("header") ? int_field(o["header"], "revision") : 0;
  out->count = int_field(o, "count");
  auto it = o.FindMember("kvs");
  if (it == o.MemberEnd()) return true;
  if (!it->value.IsArray()) return false;
  for (const auto& kv : it->value.GetArray()) {
    KeyValue k;
    if (kv.HasMember("key") && kv["key"].IsString() &&
        !base64_decode(kv["key"].GetString(), &k.key))
      return false;
    if (kv.HasMember("value") && kv["value"].IsString() &&
        !base64_decode(kv["value"].GetString(), &k.value))
      return false;
    k.create_revision = int_field(kv, "create_revision");
    k.mod_revision = int_field(kv, "mod_revision");
    k.version = int_field(kv, "version");
    k.lease = int_field(kv, "lease");
    out->kvs.push_back(std::move(k));
  }
  return true;
}

}  // namespace

Result<void> check_tls_files(const TlsFiles& tls) {
  if (!tls.enabled) return {};
  auto ctx = make_tls_context(tls);
  if (!ctx) return tl::unexpected(ctx.error());
  return {};
}

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = static_cast<uint8_t>(in[i]) << 16 | static_cast<uint8_t>(in[i + 1]) << 8 |
                       static_cast<uint8_t>(in[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = static_cast<uint8_t>(in[i]) << 16 | static_cast<uint8_t>(in[i + 1]) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

bool base64_decode(std::string_view text, std::string* out) {
  out->clear();
  if (text.size() % 4 != 0) return false;
  out->reserve(text.size() / 4 * 3);
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    int v[4];
    for (int j = 0; j < 4 - pad; ++j) {
      v[j] = value(text[i + j]);
      if (v[j] < 0) return false;
    }
    if (pad == 1 && text[i + 2] == '=') return false;
    const uint32_t n = v[0] << 18 | v[1] << 12 | (pad < 2 ? v[2] << 6 : 0) | (pad < 1 ? v[3] : 0);
    out->push_back(static_cast<char>(n >> 16));
    if (pad < 2) out->push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) out->push_back(static_cast<char>(n & 0xff));
  }
  return true;
}

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {
    TC_ASSERT(!options_.endpoints.empty());
    if (options_.tls.enabled) {
      auto ctx = make_tls_context(options_.tls);
      if (ctx) {
        tls_context_ = std::move(*ctx);
      } else {
        tls_error_ = ctx.error().message;  // (each call says it)
      }
    }
  }

  // POSTs `body` to `path` at the current member, failing over to the others. Returns the
  // parsed reply, or why no member answered / what etcd refused.
  Result<rapidjson::Document> call(const std::string& path, const std::string& body) {
    Error last{ErrorCode::kFailedPrecondition, "no etcd endpoint", "", {}};
    if (!tls_error_.empty()) {
      last.message = tls_error_;
      return tl::unexpected(last);
    }
    if (options_.prefer_leader && find_leader_ && options_.endpoints.size() > 1) {
      find_leader_ = false;
      go_to_leader();
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.give_up_after;
    for (size_t attempt = 0;; ++attempt) {
      if (attempt > 0) {
        if (std::chrono::steady_clock::now() >= deadline) break;
        find_leader_ = true;  // (once a member answers again)
        current_ = (current_ + 1) % options_.endpoints.size();
        disconnect();
        // After a round of every member, a pause (a leader election, a restart).
        if (attempt % options_.endpoints.size() == 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      std::string reply;
      int status = 0;
      const std::string& endpoint = options_.endpoints[current_];
      if (auto why = exchange(endpoint, path, body, &reply, &status)) {
        last.message = "etcd at " + endpoint + ": " + *why;
        disconnect();
        continue;
      }
      rapidjson::Document doc;
      doc.Parse(reply.data(), reply.size());
      if (doc.HasParseError() || !doc.IsObject()) {
        last.message = "etcd at " + endpoint + " answered " + path + " with HTTP " +
                       std::to_string(status) + " and no JSON object: " + reply.substr(0, 200);
        disconnect();
        continue;
      }
      // A streamed call (keep-alive) wraps its reply in "result", or its error in "error".
      if (doc.HasMember("result") && doc["result"].IsObject()) {
        rapidjson::Document inner;
        inner.CopyFrom(doc["result"], inner.GetAllocator());
        doc.Swap(inner);
      } else if (doc.HasMember("error") && doc["error"].IsObject()) {
        rapidjson::Document inner;
        inner.CopyFrom(doc["error"], inner.GetAllocator());
        doc.Swap(inner);
      }
      if (doc.HasMember("code") && int_field(doc, "code") != 0) {
        const int64_t code = int_field(doc, "code");
        const std::string message = doc.HasMember("message") && doc["message"].IsString()
                                        ? doc["message"].GetString()
                                        : reply.substr(0, 200);
        last.message = "etcd at " + endpoint + " refused " + path + ": " + message + " (code " +
                       std::to_string(code) + ")";
        // Unavailable (no leader, stopping) or a deadline: another member may answer. An auth
        // token that expired (or another member's): a new connection gets a new one.
        if (code == 14 || code == 4 || message.find("no leader") != std::string::npos ||
            message.find("timed out") != std::string::npos ||
            message.find("invalid auth token") != std::string::npos) {
          disconnect();
          continue;
        }
        last_code_ = code;
        return tl::unexpected(last);
      }
      if (options_.prefer_leader && doc.HasMember("header")) {
        const std::string term = id_field(doc["header"], "raft_term");
        if (!term.empty() && term != raft_term_) {
          find_leader_ = find_leader_ || !raft_term_.empty();  // (a new election since)
          raft_term_ = term;
        }
      }
      return doc;
    }
    last_code_ = -1;
    return tl::unexpected(last);
  }

  // Moves to the member that leads etcd's Raft, if one of the endpoints: asks the current
  // member which member leads and where each member answers its clients. On any failure,
  // stays where it is (the calls fail over as ever).
  void go_to_leader() {
    const std::string& endpoint = options_.endpoints[current_];
    std::string reply;
    int status = 0;
    rapidjson::Document st, members;
    if (exchange(endpoint, "/v3/maintenance/status", "{}", &reply, &status) || status != 200) {
      disconnect();
      return;
    }
    st.Parse(reply.data(), reply.size());
    if (exchange(endpoint, "/v3/cluster/member/list", "{}", &reply, &status) || status != 200) {
      disconnect();
      return;
    }
    members.Parse(reply.data(), reply.size());
    if (st.HasParseError() || !st.IsObject() || members.HasParseError() || !members.IsObject() ||
        !members.HasMember("members") || !members["members"].IsArray())
      return;
    const std::string leader = id_field(st, "leader");
    if (st.HasMember("header")) raft_term_ = id_field(st["header"], "raft_term");
    for (const auto& m : members["members"].GetArray()) {
      if (leader.empty() || id_field(m, "ID") != leader || !m.HasMember("clientURLs") ||
          !m["clientURLs"].IsArray())
        continue;
      for (const auto& url : m["clientURLs"].GetArray()) {
        if (!url.IsString()) continue;
        std::string hostport = url.GetString();
        if (const auto scheme = hostport.find("://"); scheme != std::string::npos)
          hostport = hostport.substr(scheme + 3);
        while (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
        for (size_t i = 0; i < options_.endpoints.size(); ++i) {
          if (options_.endpoints[i] != hostport) continue;
          if (i != current_) {
            disconnect();
            current_ = i;
          }
          return;
        }
      }
    }
  }

  int64_t last_code() const { return last_code_; }
  void authenticate_as(std::string user, std::string password) {
    user_ = std::move(user);
    password_ = std::move(password);
    disconnect();
  }
  const std::string& current_endpoint() const { return options_.endpoints[current_]; }

 private:
  // Returns why the exchange failed, or nothing.
  std::optional<std::string> exchange(const std::string& endpoint, const std::string& path,
                                      const std::string& body, std::string* reply, int* status) {
    beast::error_code ec;
    if (!connected()) {
      const auto colon = endpoint.rfind(':');
      if (colon == std::string::npos) return "not HOST:PORT";
      const std::string host = endpoint.substr(0, colon);
      tcp::resolver resolver(io_);
      auto found = resolver.resolve(host, endpoint.substr(colon + 1), ec);
      if (ec) return "cannot resolve: " + ec.message();
      if (tls_context_) {
        tls_stream_.emplace(io_, *tls_context_);
      } else {
        stream_.emplace(io_);
      }
      lowest().expires_after(options_.timeout);
      lowest().async_connect(found, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
      run();
      if (ec) return "cannot connect: " + ec.message();
      lowest().socket().set_option(tcp::no_delay(true), ec);
      if (tls_stream_) {
        if (auto why = handshake(host)) return why;
      }
      token_.clear();
      if (!user_.empty()) {
        // A token per connection: etcd's simple tokens are only good on the member that gave
        // them.
        rapidjson::StringBuffer out;
        rapidjson::Writer<rapidjson::StringBuffer> w(out);
        w.StartObject();
        w.Key("name");
        w.String(user_.c_str(), static_cast<rapidjson::SizeType>(user_.size()));
        w.Key("password");
        w.String(password_.c_str(), static_cast<rapidjson::SizeType>(password_.size()));
        w.EndObject();
        std::string answer;
        int answered = 0;
        if (auto why = send_receive(endpoint, "/v3/auth/authenticate", out.GetString(), &answer,
                                    &answered))
          return why;
        rapidjson::Document doc;
        doc.Parse(answer.data(), answer.size());
        if (doc.HasParseError() || !doc.IsObject() || !doc.HasMember("token") ||
            !doc["token"].IsString())
          return "authentication as " + user_ + " failed (HTTP " + std::to_string(answered) +
                 "): " + answer.substr(0, 200);
        token_ = doc["token"].GetString();
      }
    }
    return send_receive(endpoint, path, body, reply, status);
  }

  std::optional<std::string> send_receive(const std::string& endpoint, const std::string& path,
                                          const std::string& body, std::string* reply,
                                          int* status) {
    beast::error_code ec;
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, endpoint);
    req.set(http::field::content_type, "application/json");
    if (!token_.empty()) req.set(http::field::authorization, token_);
    req.body() = body;
    req.prepare_payload();
    lowest().expires_after(options_.timeout);
    on_stream(
        [&](auto& s) { http::async_write(s, req, [&](beast::error_code e, size_t) { ec = e; }); });
    run();
    if (ec) return "cannot send: " + ec.message();
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    buffer_.clear();
    on_stream([&](auto& s) {
      http::async_read(s, buffer_, parser, [&](beast::error_code e, size_t) { ec = e; });
    });
    run();
    if (ec && ec.category() == asio::error::get_ssl_category())
      return "TLS: the member ended the connection: " + ec.message() +
             (options_.tls.cert_file.empty()
                  ? " (does it require a client certificate? --etcd-cert, --etcd-key)"
                  : " (is --etcd-cert " + options_.tls.cert_file +
                        " signed by the CA of its --trusted-ca-file?)");
    if (ec)
      return ec == beast::error::timeout
                 ? "no answer within " + std::to_string(options_.timeout.count()) + " ms"
                 : "cannot read the reply: " + ec.message();
    auto res = parser.release();
    *status = static_cast<int>(res.result_int());
    *reply = std::move(res.body());
    if (!res.keep_alive()) disconnect();
    return std::nullopt;
  }

  // Verifies the member's certificate against the CA and the endpoint's host (a name or an IP
  // address). Returns why the handshake failed, or nothing.
  std::optional<std::string> handshake(const std::string& host) {
    beast::error_code ec;
    (void)asio::ip::make_address(host, ec);
    if (ec) SSL_set_tlsext_host_name(tls_stream_->native_handle(), host.c_str());  // (a name)
    tls_stream_->set_verify_callback(ssl::host_name_verification(host));
    lowest().expires_after(options_.timeout);
    tls_stream_->async_handshake(ssl::stream_base::client, [&](beast::error_code e) { ec = e; });
    run();
    if (!ec) return std::nullopt;
    if (ec == beast::error::timeout)
      return "TLS handshake: no answer within " + std::to_string(options_.timeout.count()) + " ms";
    std::string why = ec.message();
    if (const long v = SSL_get_verify_result(tls_stream_->native_handle()); v != X509_V_OK) {
      why = std::string("its certificate is not trusted: ") + X509_verify_cert_error_string(v) +
            (options_.tls.ca_file.empty()
                 ? " (checked against the system's CAs; give the CA "
                   "that signed it with --etcd-cacert)"
                 : " (checked against --etcd-cacert " + options_.tls.ca_file + ")");
    }
    return "TLS handshake failed: " + why;
  }

  bool connected() const { return stream_ || tls_stream_; }
  beast::tcp_stream& lowest() {
    return tls_stream_ ? beast::get_lowest_layer(*tls_stream_) : *stream_;
  }
  template <class F>
  void on_stream(F&& f) {
    if (tls_stream_) {
      f(*tls_stream_);
    } else {
      f(*stream_);
    }
  }

  void run() {
    io_.restart();
    io_.run();
  }

  void disconnect() {
    if (!connected()) return;
    beast::error_code ignored;
    lowest().socket().close(ignored);  // (no TLS close_notify: the member does not need it)
    stream_.reset();
    tls_stream_.reset();
  }

  ClientOptions options_;
  asio::io_context io_;
  std::unique_ptr<ssl::context> tls_context_;  // HTTPS (options_.tls); none: plain HTTP
  std::string tls_error_;                      // why options_.tls cannot be used, if so
  std::optional<beast::tcp_stream> stream_;    // the connection (plain HTTP)...
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_stream_;  // ...or this one (HTTPS)
  beast::flat_buffer buffer_;
  std::string user_, password_;  // etcd auth (none: empty user)
  std::string token_;            // of the current connection (etcd auth), if any
  size_t current_ = 0;
  int64_t last_code_ = 0;
  bool find_leader_ = true;  // (prefer_leader) look up the Raft leader before the next call
  std::string raft_term_;    // (prefer_leader) the Raft term of the last reply
};

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Client::~Client() = default;
void Client::authenticate_as(std::string user, std::string password) {
  impl_->authenticate_as(std::move(user), std::move(password));
}

const std::string& Client::current_endpoint() const { return impl_->current_endpoint(); }

Result<RangeResult> Client::range(std::string_view key, std::string_view range_end, int64_t limit,
                                  bool count_only, int64_t revision) {
  std::string body = "{\"key\":" + b64(key);
  if (!range_end.empty()) body += ",\"range_end\":" + b64(range_end);
  if (limit) body += ",\"limit\":\"" + std::to_string(limit) + "\"";
  if (count_only) body += ",\"count_only\":true";
  if (revision) body += ",\"revision\":\"" + std::to_string(revision) + "\"";
  body += "}";
  auto doc = impl_->call("/v3/kv/range", body);
  if (!doc) return tl::unexpected(doc.error());
  RangeResult out;
  if (!read_kvs(*doc, &out)) return failed_precondition("etcd sent a range that is not base64");
  return out;
}

Result<int64_t> Client::put(std::string_view key, std::string_view value, int64_t lease) {
  auto doc = impl_->call("/v3/kv/put",
                         "{\"key\":" + b64(key) + ",\"value\":" + b64(value) +
                             (lease ? ",\"lease\":\"" + std::to_string(lease) + "\"" : "") + "}");
  if (!doc) return tl::unexpected(doc.error());
  return int_field((*doc)["header"], "revision");
}

Result<TxnResult> Client::txn(const std::vector<Compare>& compares,
                              const std::vector<Operation>& success,
                              const std::vector<Operation>& failure) {
  std::string body = "{\"compare\":[";
  for (size_t i = 0; i < compares.size(); ++i) body += (i ? "," : "") + compare_json(compares[i]);
  body += "],\"success\":[";
  for (size_t i = 0; i < success.size(); ++i) body += (i ? "," : "") + operation_json(success[i]);
  body += "],\"failure\":[";
  for (size_t i = 0; i < failure.size(); ++i) body += (i ? "," : "") + operation_json(failure[i]);
  body += "]}";
  auto doc = impl_->call("/v3/kv/txn", body);
  if (!doc) return tl::unexpected(doc.error());
  TxnResult out;
  out.succeeded =
      doc->HasMember("succeeded") && (*doc)["succeeded"].IsBool() && (*doc)["succeeded"].GetBool();
  out.revision = doc->HasMember("header") ? int_field((*doc)["header"], "revision") : 0;
  if (doc->HasMember("responses") && (*doc)["responses"].IsArray()) {
    for (const auto& r : (*doc)["responses"].GetArray()) {
      if (!r.IsObject() || !r.HasMember("response_range")) continue;
      RangeResult range;
      if (!read_kvs(r["response_range"], &range))
        return failed_precondition("etcd sent a range that is not base64");
      out.ranges.push_back(std::move(range));
    }
  }
  return out;
}

Result<int64_t> Client::delete_range(std::string_view key, std::string_view range_end) {
  auto doc = impl_->call(
      "/v3/kv/deleterange",
      "{\"key\":" + b64(key) + (range_end.empty() ? "" : ",\"range_end\":" + b64(range_end)) + "}");
  if (!doc) return tl::unexpected(doc.error());
  return int_field(*doc, "deleted");
}

Result<Lease> Client::lease_grant(int64_t ttl_s) {
  auto doc = impl_->call("/v3/lease/grant", "{\"TTL\":\"" + std::to_string(ttl_s) + "\"}");
  if (!doc) return tl::unexpected(doc.error());
  return Lease{int_field(*doc, "ID"), int_field(*doc, "TTL")};
}

Result<Lease> Client::lease_keep_alive(int64_t id) {
  auto doc = impl_->call("/v3/lease/keepalive", "{\"ID\":\"" + std::to_string(id) + "\"}");
  if (!doc) return tl::unexpected(doc.error());
  return Lease{id, int_field(*doc, "TTL")};
}

Result<void> Client::lease_revoke(int64_t id) {
  auto doc = impl_->call("/v3/lease/revoke", "{\"ID\":\"" + std::to_string(id) + "\"}");
  if (!doc) return tl::unexpected(doc.error());
  return {};
}

Result<void> Client::compact(int64_t revision) {
  auto doc =
      impl_->call("/v3/kv/compaction", "{\"revision\":\"" + std::to_string(revision) + "\"}");
  if (!doc && doc.error().message.find("compacted") == std::string::npos)
    return tl::unexpected(doc.error());
  return {};
}

Result<MemberStatus> Client::status() {
  auto doc = impl_->call("/v3/maintenance/status", "{}");
  if (!doc) return tl::unexpected(doc.error());
  MemberStatus s;
  s.revision = doc->HasMember("header") ? int_field((*doc)["header"], "revision") : 0;
  s.db_size = int_field(*doc, "dbSize");
  s.db_size_in_use = int_field(*doc, "dbSizeInUse");
  if (doc->HasMember("version") && (*doc)["version"].IsString())
    s.version = (*doc)["version"].GetString();
  if (doc->HasMember("header")) s.member_id = id_field((*doc)["header"], "member_id");
  s.leader = id_field(*doc, "leader");
  return s;
}

}  // namespace traincoord::etcd
