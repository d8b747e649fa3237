#include "ps/src/stack_room.h"

#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "ps/error.h"
#include "ps/src/glog_or_stderr.h"

namespace ps::internal {
namespace {

// The main thread's stack may grow up to the soft limit, read when it grows: raising the soft
// limit now gives the main thread room from now on. The hard limit bounds it (`ulimit -s N`
// sets both): below kLeastStackBytes the node does not start, as the main thread would
// overflow its stack inside ZeroMQ or the program (SIGSEGV, with no word of why).
std::string RaiseSoftStackLimit(int verbose) {
  rlimit limit{};
  if (getrlimit(RLIMIT_STACK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur >= kLeastStackBytes) {
    return "";
  }
  const rlim_t before = limit.rlim_cur;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < kLeastStackBytes) {
    return ("the stack limit (ulimit -s) is " + std::to_string(before / 1024) + " KiB, below the " +
            std::to_string(kLeastStackBytes / 1024) +
            " KiB a node needs: raise it (ulimit -s 8192 is the usual, in the shell that "
            "starts the node)");
  }
  limit.rlim_cur = kLeastStackBytes;
  if (setrlimit(RLIMIT_STACK, &limit) == 0 && verbose >= 1) {
    PS_LOG(INFO) << "raised the stack limit (ulimit -s) from " << before / 1024 << " KiB to "
                 << limit.rlim_cur / 1024 << " KiB";
  }
  return "";
}

// Threads created with a default attribute take their stack size from here; glibc set it from
// RLIMIT_STACK when the process started.
void RaiseDefaultThreadStack(int verbose) {
  pthread_attr_t attributes;
  if (pthread_getattr_default_np(&attributes) != 0) return;
  std::size_t size = 0;
  if (pthread_attr_getstacksize(&attributes, &size) == 0 && size < kLeastStackBytes &&
      pthread_attr_setstacksize(&attributes, kLeastStackBytes) == 0 &&
      pthread_setattr_default_np(&attributes) == 0 && verbose >= 1) {
    PS_LOG(INFO) << "raised the default thread stack from " << size / 1024 << " KiB to "
                 << kLeastStackBytes / 1024 << " KiB";
  }
  pthread_attr_destroy(&attributes);
}

}  // namespace

std::string RaiseStackRoom(int verbose) {
  std::string shortage = RaiseSoftStackLimit(verbose);
  if (shortage.empty()) RaiseDefaultThreadStack(verbose);
  return shortage;
}

void EnsureStackRoom(int verbose) {
  if (std::string shortage = RaiseStackRoom(verbose); !shortage.empty()) {
    throw Error(std::move(shortage));
  }
}

}  // namespace ps::internal
