#include "core/user_text.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <utf8proc.h>

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

Result<void> check_name_identity(std::string_view field, std::string_view text) {
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return {};
  const std::string f(field);
  size_t i = 0;
  while (i < text.size()) {
    const utf8::Decoded d = utf8::decode(text.substr(i));
    if (!d.valid)
      return invalid_argument(f, f + " is not valid UTF-8 (at byte " + std::to_string(i) + ")");
    if (utf8proc_get_property(static_cast<utf8proc_int32_t>(d.code_point))->ignorable) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(d.code_point));
      return invalid_argument(f, f + " holds the invisible (default-ignorable) character " + hex +
                                     " (at byte " + std::to_string(i) +
                                     "): two names that look alike must be the same name; "
                                     "remove it");
    }
    i += d.length;
  }
  // utf8proc_map allocates the normalised copy with malloc.
  utf8proc_uint8_t* nfc = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &nfc,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(nfc, &std::free);
  if (n < 0) return invalid_argument(f, f + " is not valid Unicode: " + utf8proc_errmsg(n));
  const std::string_view normal(reinterpret_cast<const char*>(nfc), static_cast<size_t>(n));
  if (normal != text) {
    return invalid_argument(f, f + " is not in Unicode normalization form C (NFC): send \"" +
                                   std::string(normal) +
                                   "\" as its composed form (Python: "
                                   "unicodedata.normalize(\"NFC\", name))");
  }
  return {};
}

}  // namespace traincoord
