// libFuzzer target: the HTTP request path without sockets: raw bytes through Beast's request
// parser with the server's limits, then every complete request into the API, in order (as
// pipelined requests are).
#include <utility>  // before Asio (STACK.md)

#include <cstddef>
#include <cstdint>
#include <string>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "config/config_file.h"
#include "core/engine.h"
#include "server/api.h"

namespace http = boost::beast::http;
using namespace traincoord;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ManualClock clock;
  Engine engine(clock);
  (void)engine.create_run(*parse_run_config("name = \"f\"\n[data]\ntrain_batches = 5\n", "fuzz"));
  Api api(engine, clock);
  boost::asio::const_buffer rest(data, size);
  for (int i = 0; i < 16 && rest.size() > 0; ++i) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(1 << 20);
    parser.header_limit(16 << 10);
    parser.eager(true);
    boost::beast::error_code ec;
    const size_t used = parser.put(rest, ec);
    if (ec || !parser.is_done()) {
      if (!ec && used == 0) parser.put_eof(ec);
      if (!parser.is_done()) return 0;
    }
    rest += used;
    auto req = parser.release();
    (void)api.handle({std::string(req.method_string()), std::string(req.target()),
                      std::move(req.body()), std::string(req[http::field::authorization])});
  }
  return 0;
}
