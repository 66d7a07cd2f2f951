// libFuzzer target: the HTTP request path without sockets: raw bytes through Beast's request
// parser with the server's limits and its framing rules (request_framing.h), then every
// complete request into the API, in order (as pipelined requests are). A request whose framing
// is refused ends the connection, as in the server. Checked: a request read past the framing
// rules has a body delimited one way only, and every reply is valid UTF-8.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs it

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "config/config_file.h"
#include "core/engine.h"
#include "core/utf8.h"
#include "server/api.h"
#include "server/request_framing.h"

namespace http = boost::beast::http;
using namespace traincoord;

namespace {

// The server's check, on what the parser read of the header.
bool framing_sound(const http::request_parser<http::string_body>& parser) {
  const auto& header = parser.get();
  std::vector<std::string_view> te, host;
  for (auto [field, into] :
       {std::pair{http::field::transfer_encoding, &te}, std::pair{http::field::host, &host}}) {
    const auto [first, last] = header.equal_range(field);
    for (auto it = first; it != last; ++it)
      into->emplace_back(it->value().data(), it->value().size());
  }
  const bool sound = !framing_error({header.version(), te, host});
  if (sound && !te.empty() && !parser.chunked()) std::abort();  // `chunked` alone, not read so
  if (sound && header.version() >= 11 && host.size() != 1) std::abort();
  return sound;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ManualClock clock;
  Engine engine(clock);
  // No run: nothing would be fuzzed.
  if (!engine.create_run(*parse_run_config("name = \"f\"\n[data]\ntrain_batches = 5\n", "fuzz"))) {
    __builtin_trap();
  }
  Api api(engine, clock);
  boost::asio::const_buffer rest(data, size);
  for (int i = 0; i < 16 && rest.size() > 0; ++i) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(1 << 20);
    parser.header_limit(16 << 10);
    parser.eager(true);
    boost::beast::error_code ec;
    const size_t used = parser.put(rest, ec);
    if (parser.is_header_done() && (!ec || ec == http::error::need_more) &&
        !framing_sound(parser)) {
      return 0;  // 400, connection closed
    }
    if (ec || !parser.is_done()) {
      if (!ec && used == 0) parser.put_eof(ec);
      if (!parser.is_done()) return 0;
    }
    rest += used;
    auto req = parser.release();
    const bool has_body = req.has_content_length() || req.chunked();
    if (req.method() == http::verb::post && !has_body) return 0;  // 411, connection closed
    auto reply = api.handle({std::string(req.method_string()), std::string(req.target()),
                             std::move(req.body()), std::string(req[http::field::authorization])});
    if (auto* r = std::get_if<HttpReply>(&reply); r && !utf8::valid(r->body)) std::abort();
  }
  return 0;
}
