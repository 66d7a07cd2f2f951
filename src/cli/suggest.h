// Suggestions for a misspelt word: "traincoord lanch" → "did you mean launch?".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace traincoord::cli {

// The edit distance of `a` and `b`: insertions, deletions, substitutions and swaps of two
// adjacent characters, each counting one.
size_t edit_distance(std::string_view a, std::string_view b);

// The one of `names` that `word` most likely misspells: the nearest by edit_distance, when it
// is at most a third of the name's length (at least 1, at most 3) away, or the only name that
// starts with `word`. nullopt when none is near or `word` is one of `names`.
std::optional<std::string> closest_name(std::string_view word,
                                        const std::vector<std::string>& names);

}  // namespace traincoord::cli
