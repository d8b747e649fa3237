#pragma once
// The stack room a node's threads need. `ulimit -s` (RLIMIT_STACK) bounds the main thread's
// stack and, through glibc, sizes the default stack of every thread created afterwards:
// ZeroMQ's I/O and reaper threads and the node's own. Under `ulimit -s 32` ZeroMQ's threads
// overflowed their 32 KiB while resolving their first symbol, and the node died of SIGSEGV
// before it could say anything.
#include <string>

namespace ps::internal {

// The least stack a thread of this process gets (1 MiB; glibc's default is the 8 MiB of a
// usual `ulimit -s`): far more than the node's threads use, and only a reservation of address
// space until touched.
inline constexpr unsigned long kLeastStackBytes = 1UL << 20;

// Raises this process's default thread stack (pthread_setattr_default_np) and its soft stack
// limit to kLeastStackBytes where they are lower, logging what it raised at verbose >= 1.
// Call before the threads are started: it changes the default of threads created after it.
// Process-wide, like the limit it corrects. Returns "" or, when the hard limit is below
// kLeastStackBytes, the error naming `ulimit -s`: under a limit of a few KiB even throwing it
// overflows the stack (the unwinder's frames), so a program's first call reports it without
// an exception.
std::string RaiseStackRoom(int verbose);

// RaiseStackRoom, throwing ps::Error with the shortage it returns.
void EnsureStackRoom(int verbose);

}  // namespace ps::internal
