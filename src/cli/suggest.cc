#include "cli/suggest.h"

#include <algorithm>

namespace traincoord::cli {

size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment: three rows of the dynamic programme suffice.
  std::vector<size_t> before(b.size() + 1), previous(b.size() + 1), row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      row[j] = std::min({previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        row[j] = std::min(row[j], before[j - 2] + 1);
      }
    }
    std::swap(before, previous);
    std::swap(previous, row);
  }
  return previous[b.size()];
}

std::optional<std::string> closest_name(std::string_view word,
                                        const std::vector<std::string>& names) {
  if (word.empty() || std::find(names.begin(), names.end(), word) != names.end()) {
    return std::nullopt;
  }
  std::optional<std::string> best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& name : names) {
    const size_t d = edit_distance(word, name);
    const size_t allowed = std::clamp<size_t>(name.size() / 3, 1, 3);
    if (d <= allowed && d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  if (best) return best;
  std::optional<std::string> prefixed;
  for (const std::string& name : names) {
    if (name.starts_with(word)) {
      if (prefixed) return std::nullopt;  // ambiguous
      prefixed = name;
    }
  }
  return prefixed;
}

}  // namespace traincoord::cli
