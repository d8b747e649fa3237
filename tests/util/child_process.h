#pragma once
// What the multi-process tests use to start and stop processes: ps::process::Child (shared
// with ps-bench; tools/process/child.h), plus a few test-only helpers.
#include <string>

#include "tools/process/child.h"

namespace ps::test {

// A process a test starts; stopped and reaped by its destructor, by pid.
using ChildProcess = ps::process::Child;

// A free TCP port on 127.0.0.1 at the time of the call (for tests that need a fixed one).
int FindFreePort();

// Path of a binary built into the bin directory.
std::string BinPath(const std::string& name);

// Number of threads in this process (from /proc/self/task).
int ThreadCount();

}  // namespace ps::test
