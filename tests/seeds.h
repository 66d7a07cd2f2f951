// The seeds a simulation test runs: the one named by `one_var` (to replay a failure), else
// 1..N with N from `count_var` or `fallback`.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace traincoord::testing {

inline std::vector<uint64_t> seeds_from_env(const char* one_var, const char* count_var,
                                            uint64_t fallback) {
  if (const char* one = std::getenv(one_var)) return {std::strtoull(one, nullptr, 10)};
  const char* count = std::getenv(count_var);
  const uint64_t n = count ? std::strtoull(count, nullptr, 10) : fallback;
  std::vector<uint64_t> seeds;
  for (uint64_t s = 1; s <= n; ++s) seeds.push_back(s);
  return seeds;
}

}  // namespace traincoord::testing
