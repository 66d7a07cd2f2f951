#include "cli/terminal_text.h"

#include <cstdio>

#include "core/error.h"
#include "core/user_text.h"
#include "core/utf8.h"

namespace traincoord::cli {

std::string terminal_safe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  size_t i = 0;
  while (i < text.size()) {
    const utf8::Decoded d = utf8::decode(text.substr(i));
    if (!d.valid || (d.code_point < 0x80 && forbidden_in_text(d.code_point, TextKind::kName))) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(text[i]));
      out += buf;
    } else if (forbidden_in_text(d.code_point, TextKind::kName)) {
      std::snprintf(buf, sizeof buf, "\\u{%04x}", static_cast<unsigned>(d.code_point));
      out += buf;
    } else if (d.code_point == '\\') {
      out += "\\\\";
    } else {
      out.append(text.substr(i, d.length));
    }
    i += d.length;
  }
  return out;
}

std::string progress_bar(uint64_t done, uint64_t total, int width) {
  TC_ASSERT(width >= 0);
  // long double: width * done in integers could overflow; job counts (at most 2^50) and the
  // width fit its 64-bit mantissa, so the quotient rounds down exactly as integer division does.
  const int filled = total == 0 || done >= total
                         ? width
                         : static_cast<int>(static_cast<long double>(done) * width /
                                            static_cast<long double>(total));
  return "[" + std::string(static_cast<size_t>(filled), '#') +
         std::string(static_cast<size_t>(width - filled), '.') + "]";
}

}  // namespace traincoord::cli
