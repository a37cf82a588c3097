// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
//
// A member marked GUARDED_BY(mu_) may be read or written only with mu_ held; a function marked
// REQUIRES(mu_) may be called only with it held. Clang checks both at compile time under
// -Wthread-safety (tests/style/thread_safety.py runs that check in `make test`); under other
// compilers every macro expands to nothing. The lockable types are in common/mutex.h.
#pragma once

// Abseil (which gRPC includes) defines the same unprefixed names in a legacy header. Include it
// first where it exists and define ours over it, whichever of the two a file includes first;
// both expand to the same clang attributes.
#if __has_include(<absl/base/internal/thread_annotations.h>)
#include <absl/base/internal/thread_annotations.h>
#endif
#undef GUARDED_BY
#undef PT_GUARDED_BY
#undef ACQUIRED_AFTER
#undef ACQUIRED_BEFORE
#undef EXCLUSIVE_LOCKS_REQUIRED
#undef SHARED_LOCKS_REQUIRED
#undef LOCKS_EXCLUDED
#undef NO_THREAD_SAFETY_ANALYSIS

#if defined(__clang__) && !defined(SWIG)
#define SC_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define SC_THREAD_ANNOTATION_(x)
#endif

// On a data member: reads and writes need the capability (reads: held shared at least).
#define GUARDED_BY(x) SC_THREAD_ANNOTATION_(guarded_by(x))
// On a pointer member: the pointee is guarded (the pointer itself is not).
#define PT_GUARDED_BY(x) SC_THREAD_ANNOTATION_(pt_guarded_by(x))

// Lock ordering between capabilities (checked only under -Wthread-safety-beta).
#define ACQUIRED_AFTER(...) SC_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) SC_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))

// On a function: the caller must hold the capabilities (exclusively / at least shared).
#define REQUIRES(...) SC_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) SC_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#define EXCLUSIVE_LOCKS_REQUIRED(...) REQUIRES(__VA_ARGS__)
#define SHARED_LOCKS_REQUIRED(...) REQUIRES_SHARED(__VA_ARGS__)

// On a function: the caller must not hold the capabilities (the function takes them).
#define LOCKS_EXCLUDED(...) SC_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// On a function: it acquires / releases the capabilities (`this` when none is named).
#define ACQUIRE(...) SC_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) SC_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) SC_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) SC_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
// Acquires when it returns the first argument (true / false), e.g. TRY_ACQUIRE(true).
#define TRY_ACQUIRE(...) SC_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) SC_THREAD_ANNOTATION_(try_acquire_shared_capability(__VA_ARGS__))

// On a function: a run-time check that the capability is held; the analysis assumes it after.
#define ASSERT_CAPABILITY(x) SC_THREAD_ANNOTATION_(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) SC_THREAD_ANNOTATION_(assert_shared_capability(x))

// On a function: it returns a reference to the named capability (an accessor for a mutex).
#define RETURN_CAPABILITY(x) SC_THREAD_ANNOTATION_(lock_returned(x))

// On a class: its objects are capabilities ("mutex"), or RAII holders of one (scoped).
#define CAPABILITY(x) SC_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY SC_THREAD_ANNOTATION_(scoped_lockable)

// On a function: its body is not analysed. Use sparingly, with a comment saying why.
#define NO_THREAD_SAFETY_ANALYSIS SC_THREAD_ANNOTATION_(no_thread_safety_analysis)
