#pragma once
// Starting one of a node's threads. A process out of threads or of memory for a stack gets a
// ps::Error that says so and names the limits, where std::thread throws std::system_error
// ("Resource temporarily unavailable"), which no caller expects: it ended such processes in
// std::terminate.
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "ps/error.h"

namespace ps::internal {

inline std::string CannotStartThread(const std::string& what, const std::system_error& e) {
  return "cannot start " + what + " thread: " + e.code().message() +
         ": the process reached its limit on threads (ulimit -u, or its cgroup's pids.max) or "
         "has no memory left for a thread's stack (ulimit -v, a memory cgroup)";
}

// `Thread(body)`, or a ps::Error naming `what` ("the receive", "the log writer").
template <class Thread = std::jthread, class Body>
Thread StartThread(const std::string& what, Body&& body) {
  try {
    return Thread(std::forward<Body>(body));
  } catch (const std::system_error& e) {
    throw Error(CannotStartThread(what, e));
  }
}

}  // namespace ps::internal
