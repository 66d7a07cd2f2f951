// Whether this test binary (and the binaries it starts, built alike by scripts/test-sanitizers)
// runs under a sanitizer, whose runtime takes memory and file descriptors of its own: a test of
// a memory or descriptor limit says so instead of measuring the sanitizer.
#pragma once

namespace traincoord::testing {

// g++ defines __SANITIZE_*__; clang (the ASan build's compiler, scripts/configure-asan) says it
// through __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TRAINCOORD_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TRAINCOORD_TEST_SANITIZED 1
#endif
#endif

#ifdef TRAINCOORD_TEST_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace traincoord::testing
