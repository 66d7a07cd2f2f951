// UTF-8 as RFC 3629 defines it (no overlong forms, no surrogates, nothing above U+10FFFF),
// header-only so that every layer that reads or writes text can check it without linking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace traincoord::utf8 {

// One decoded character: its code point and how many bytes it took, or `valid` false (then
// `length` is 1: the first byte is skipped).
struct Decoded {
  char32_t code_point = 0;
  size_t length = 1;
  bool valid = false;
};

// Decodes the character at the start of `s`. REQUIRES: `s` is not empty.
inline Decoded decode(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(0);
  if (b0 < 0x80) return {b0, 1, true};
  size_t n;
  char32_t cp;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
    cp = b0 & 0x1f;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    cp = b0 & 0x0f;
    if (b0 == 0xe0) lo = 0xa0;  // no overlong forms
    if (b0 == 0xed) hi = 0x9f;  // no surrogates
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    cp = b0 & 0x07;
    if (b0 == 0xf0) lo = 0x90;  // no overlong forms
    if (b0 == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
  } else {
    return {};
  }
  if (s.size() < n) return {};
  for (size_t i = 1; i < n; ++i) {
    const unsigned char b = byte(i);
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xbf)) return {};
    cp = (cp << 6) | (b & 0x3f);
  }
  return {cp, n, true};
}

// Whether all of `s` is valid UTF-8.
inline bool valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;  // the common case: ASCII
      continue;
    }
    const Decoded d = decode(s.substr(i));
    if (!d.valid) return false;
    i += d.length;
  }
  return true;
}

// `s` with every byte that does not start a valid character replaced by U+FFFD.
inline std::string repaired(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const Decoded d = decode(s.substr(i));
    if (d.valid) {
      out.append(s.substr(i, d.length));
    } else {
      out += "\xef\xbf\xbd";
    }
    i += d.length;
  }
  return out;
}

}  // namespace traincoord::utf8
