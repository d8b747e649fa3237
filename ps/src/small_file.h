#pragma once
// ReadSmallFile: a file the user names in a flag or a variable (a secret, a flag file), read
// with bounds: a device that never ends (/dev/zero), a FIFO nobody writes to or a huge file
// must fail with a message, never fill memory or block the program.
#include <chrono>
#include <cstddef>
#include <string>

namespace ps {

struct SmallFileLimits {
  std::size_t max_bytes = 0;  // more is an error (first_line: no line end within it)
  bool first_line = false;    // stop at the first '\n' (not returned)
  // A pipe (process substitution, `<(echo ...)`) is read until its end, or its first line,
  // within this time; zero refuses pipes (a flag file, which gflags reads a second time).
  std::chrono::milliseconds pipe_timeout{0};
};

// The file's bytes, or its first line. Throws ps::Error with the reason only (the caller names
// the file and the fix): it cannot be opened, is a directory, a device or a socket, a pipe where
// none is allowed or one that sends nothing in time, or is larger than the limit.
std::string ReadSmallFile(const std::string& path, const SmallFileLimits& limits);

}  // namespace ps
