// Enums named by a table: an array of names in the order of the enum's values (0, 1, ...), kept
// next to the enum, so that naming a value and parsing a name read the same list.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

#include "core/error.h"

namespace traincoord {

// The name of `value` in `names`. REQUIRES: `value` is one of the enum's values (a value outside
// the table is a broken invariant and stops the program).
template <typename Enum, size_t N>
std::string_view enum_name(const std::array<std::string_view, N>& names, Enum value) {
  const auto i = static_cast<size_t>(value);
  TC_ASSERT(i < N);
  return names[i];
}

// The value named `name` in `names`, or nullopt when it names none.
template <typename Enum, size_t N>
std::optional<Enum> parse_enum(const std::array<std::string_view, N>& names,
                               std::string_view name) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<Enum>(i);
  }
  return std::nullopt;
}

}  // namespace traincoord
