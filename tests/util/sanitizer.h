#pragma once
// Whether this test binary is built with a sanitizer (the asan and tsan presets, PS_SANITIZE):
// its processes then run several times slower and reserve terabytes of address space for
// shadow memory, so an RLIMIT_AS cap cannot hold them.
namespace ps::test {

#if defined(__has_feature)
#define PS_TEST_HAS_FEATURE(x) __has_feature(x)
#else
#define PS_TEST_HAS_FEATURE(x) 0
#endif

#if defined(__SANITIZE_THREAD__) || PS_TEST_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

#if defined(__SANITIZE_ADDRESS__) || PS_TEST_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

#undef PS_TEST_HAS_FEATURE

inline constexpr bool kSanitizer = kThreadSanitizer || kAddressSanitizer;

}  // namespace ps::test
