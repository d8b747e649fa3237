#pragma once
// Clang thread-safety annotations: lock contracts written at the member and the function and
// checked by the compiler (clang's -Wthread-safety; the CMake option PS_THREAD_SAFETY_ANALYSIS
// and the preset clang-thread-safety turn it on, docs/testing.md). Other compilers see nothing.
// The names carry the PS_ prefix so that a user's own macros of the same kind cannot clash:
// this header is installed with the public headers, which annotate their private members.
//
//   PS_GUARDED_BY(mu)             a member read and written only with mu held
//   PS_PT_GUARDED_BY(mu)          what a pointer member points to, the same
//   PS_REQUIRES(mu)               a function called with mu held (exclusively)
//   PS_REQUIRES_SHARED(mu)        a function called with mu held, shared at least
//   PS_EXCLUDES(mu)               a function called without mu (it takes mu itself)
//   PS_CAPABILITY(name)           a lock type (ps::Mutex)
//   PS_SCOPED_CAPABILITY          an RAII type that holds one (ps::MutexLock)
//   PS_ACQUIRE, PS_RELEASE        what a lock type's functions do to it (_SHARED: shared)
//   PS_NO_THREAD_SAFETY_ANALYSIS  a function the analysis cannot follow (say why)
//
// ps/mutex.h has the annotated mutexes and locks these apply to.

#if defined(__clang__)
#define PS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PS_THREAD_ANNOTATION(x)
#endif

#define PS_CAPABILITY(name) PS_THREAD_ANNOTATION(capability(name))
#define PS_SCOPED_CAPABILITY PS_THREAD_ANNOTATION(scoped_lockable)
#define PS_GUARDED_BY(mu) PS_THREAD_ANNOTATION(guarded_by(mu))
#define PS_PT_GUARDED_BY(mu) PS_THREAD_ANNOTATION(pt_guarded_by(mu))
#define PS_REQUIRES(...) PS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define PS_REQUIRES_SHARED(...) PS_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define PS_ACQUIRE(...) PS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define PS_ACQUIRE_SHARED(...) PS_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define PS_RELEASE(...) PS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define PS_RELEASE_SHARED(...) PS_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define PS_EXCLUDES(...) PS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define PS_NO_THREAD_SAFETY_ANALYSIS PS_THREAD_ANNOTATION(no_thread_safety_analysis)
