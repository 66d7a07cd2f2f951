// The dashboard's static files (web/), compiled into the binary: no CDN, nothing to install.
#pragma once

#include <string_view>

namespace traincoord {

struct WebAsset {
  std::string_view path;  // the URL path, e.g. "/app.js"
  std::string_view content_type;
  std::string_view body;
};

// The asset at `path` ("/" is "/index.html"), or null.
const WebAsset* find_web_asset(std::string_view path);

}  // namespace traincoord
