#include "core/user_text.h"

#include <cstdio>
#include <string>

#include "core/utf8.h"

namespace traincoord {

bool forbidden_in_text(char32_t c, TextKind kind) {
  if (kind == TextKind::kMessage && (c == '\t' || c == '\n')) return false;
  return c < 0x20 || (c >= 0x7f && c <= 0x9f) || c == 0x2028 || c == 0x2029 || c == 0x061c ||
         c == 0x200e || c == 0x200f || (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

Result<void> validate_text(std::string_view field, std::string_view text, size_t max_bytes,
                           TextKind kind) {
  const std::string f(field);
  if (kind == TextKind::kName && text.empty()) return invalid_argument(f, f + " must not be empty");
  if (text.size() > max_bytes) {
    return invalid_argument(f,
                            f + " is longer than " + std::to_string(max_bytes) + " bytes (UTF-8)");
  }
  size_t i = 0;
  while (i < text.size()) {
    const utf8::Decoded d = utf8::decode(text.substr(i));
    if (!d.valid) {
      return invalid_argument(
          f, f + " is not valid UTF-8 (at byte " + std::to_string(i) + "): send it as UTF-8");
    }
    if (forbidden_in_text(d.code_point, kind)) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(d.code_point));
      return invalid_argument(
          f, f + " holds the control or formatting character " + hex + " (at byte " +
                 std::to_string(i) + ")" +
                 (kind == TextKind::kName ? "; a name is printable text"
                                          : "; only tab and newline are allowed"));
    }
    i += d.length;
  }
  return {};
}

}  // namespace traincoord
