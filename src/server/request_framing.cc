#include "server/request_framing.h"

namespace traincoord {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    if (x != b[i]) return false;
  }
  return true;
}

// host[:port] as RFC 3986 spells a uri-host (reg-name, IPv4, or an IP literal in brackets):
// unreserved, sub-delims, '%' for escapes, ':' and the brackets. Empty is allowed (a target
// without an authority).
bool plausible_host(std::string_view v) {
  for (char c : v) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::string_view("-._~!$&'()*+,;=%:[]").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::optional<std::string> framing_error(const RequestFraming& request) {
  if (!request.transfer_encoding.empty()) {
    if (request.version < 11) {
      return "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 section 6.1); send "
             "Content-Length";
    }
    if (request.transfer_encoding.size() > 1) {
      return "Transfer-Encoding sent more than once; send it once, as 'chunked'";
    }
    if (!iequals(trim(request.transfer_encoding.front()), "chunked")) {
      return "a Transfer-Encoding other than exactly 'chunked' is not supported: send "
             "Content-Length, or 'Transfer-Encoding: chunked' alone";
    }
  }
  if (request.host.size() > 1) return "Host sent more than once";
  if (request.host.empty() && request.version >= 11) {
    return "an HTTP/1.1 request needs a Host header (RFC 9112 section 3.2)";
  }
  if (!request.host.empty() && !plausible_host(trim(request.host.front()))) {
    return "the Host header is not a host[:port]";
  }
  return std::nullopt;
}

}  // namespace traincoord
