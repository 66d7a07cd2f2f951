// Whether this test binary (and the binaries it starts, built alike by scripts/test-sanitizers)
// runs under a sanitizer, whose runtime takes memory and file descriptors of its own: a test of
// a memory or descriptor limit says so instead of measuring the sanitizer.
#pragma once

namespace traincoord::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace traincoord::testing
