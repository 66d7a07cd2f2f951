// The framing rules a request's header must pass before its body is read (RFC 9112): where a
// request ends must be beyond doubt, or a proxy in front of the coordinator and the coordinator
// could split the same bytes into different requests (request smuggling). Pure: tested without
// sockets (request_framing_test.cc) and run by the HTTP fuzzer on what Beast parsed.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace traincoord {

// What the framing check needs of a parsed request header.
struct RequestFraming {
  unsigned version = 11;                                // 10: HTTP/1.0, 11: HTTP/1.1
  std::span<const std::string_view> transfer_encoding;  // the value of each such field line
  std::span<const std::string_view> host;               // the value of each Host field line
};

// Returns nullopt when the framing is sound, else what is wrong (the request is answered 400
// and its connection closed: the bytes after it cannot be trusted to start a request).
// Sound means:
// - Transfer-Encoding, if sent at all, is one field line whose value is exactly the one coding
//   `chunked` (any case); any other coding (`gzip, chunked`, `chunked, identity`, `identity`,
//   `xchunked`, ...) is refused, since the body would be read undecoded or not at all; and
//   HTTP/1.0 has no Transfer-Encoding (RFC 9112 §6.1).
// - An HTTP/1.1 request has exactly one Host field line, any request at most one, and its value
//   is a host[:port] (RFC 9112 §3.2).
// (Content-Length beside Transfer-Encoding, and conflicting Content-Lengths, are refused by
// Beast's parser itself.)
std::optional<std::string> framing_error(const RequestFraming& request);

}  // namespace traincoord
