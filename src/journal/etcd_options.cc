#include "journal/etcd_options.h"

#include <cstdlib>

namespace traincoord {

Result<EtcdJournalOptions> parse_etcd_url(std::string_view url) {
  const bool tls = url.substr(0, 8) == "etcds://";
  const std::string_view kScheme = tls ? "etcds://" : "etcd://";
  std::string shown(url);  // (its password hidden)
  if (const auto at = shown.find('@'); at != std::string::npos) {
    const auto colon = shown.find(':', kScheme.size());
    if (colon != std::string::npos && colon < at) shown.replace(colon + 1, at - colon - 1, "***");
  }
  auto bad = [&](const std::string& why) {
    return invalid_argument(
        "journal", "--journal " + shown + ": " + why +
                       " (expected etcd://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...][/PREFIX], or "
                       "etcds://... over TLS)");
  };
  if (url.substr(0, kScheme.size()) != kScheme) return bad("not an etcd:// URL");
  std::string_view rest = url.substr(kScheme.size());
  EtcdJournalOptions options;
  options.tls.enabled = tls;
  if (const auto at = rest.substr(0, rest.find('/')).rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    const auto colon = userinfo.find(':');
    options.user = std::string(userinfo.substr(0, colon));
    if (options.user.empty()) return bad("the user before '@' is empty");
    if (colon != std::string_view::npos) {
      options.password = std::string(userinfo.substr(colon + 1));
    } else if (const char* p = std::getenv("TRAINCOORD_ETCD_PASSWORD")) {
      options.password = p;
    } else {
      return bad("user " + options.user +
                 " has no password: give it as USER:PASSWORD@ or in $TRAINCOORD_ETCD_PASSWORD");
    }
    rest = rest.substr(at + 1);
  }
  const auto slash = rest.find('/');
  if (slash != std::string_view::npos) {
    std::string prefix(rest.substr(slash));
    while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
    if (prefix.size() <= 1) return bad("the prefix after the hosts is empty");
    options.prefix = prefix;
    rest = rest.substr(0, slash);
  }
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view host_port = rest.substr(0, comma);
    const auto colon = host_port.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == host_port.size())
      return bad("'" + std::string(host_port) + "' is not HOST:PORT");
    for (char c : host_port.substr(colon + 1)) {
      if (c < '0' || c > '9') return bad("'" + std::string(host_port) + "' has no numeric port");
    }
    options.endpoints.emplace_back(host_port);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (options.endpoints.empty()) return bad("no etcd endpoint");
  return options;
}

}  // namespace traincoord
