#include "ps/src/small_file.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ps/error.h"
#include "ps/src/log_text.h"
#include "ps/src/scoped_fd.h"

namespace ps {

std::string ReadSmallFile(const std::string& path, const SmallFileLimits& limits) {
  // Non-blocking: opening a FIFO without a writer returns at once instead of waiting for one.
  const ScopedFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) throw Error(std::strerror(errno));
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw Error(std::strerror(errno));
  const bool pipe = S_ISFIFO(info.st_mode);
  if (S_ISDIR(info.st_mode)) throw Error("it is a directory");
  if (!S_ISREG(info.st_mode) && !(pipe && limits.pipe_timeout.count() > 0)) {
    throw Error(pipe ? "it is a pipe, not a regular file"
                     : "it is not a regular file (a device or a socket)");
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + limits.pipe_timeout;
  std::string bytes;
  char buffer[4096];
  while (true) {
    if (limits.first_line) {
      if (const std::size_t end = bytes.find('\n'); end != std::string::npos) {
        bytes.resize(end);
        return bytes;
      }
    }
    if (bytes.size() > limits.max_bytes) break;
    const std::size_t want = std::min(sizeof(buffer), limits.max_bytes + 1 - bytes.size());
    const ssize_t got = ::read(fd.get(), buffer, want);
    if (got > 0) {
      bytes.append(buffer, static_cast<std::size_t>(got));
      continue;
    }
    if (got == 0) {
      if (pipe && bytes.empty()) throw Error("the pipe was closed without sending anything");
      return bytes;  // the end (a last line without '\n' included)
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN) throw Error(std::strerror(errno));
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd wait{fd.get(), POLLIN, 0};
    if (left.count() <= 0 || ::poll(&wait, 1, static_cast<int>(left.count())) == 0) {
      throw Error("it is a pipe that sent no " + std::string(limits.first_line ? "line" : "end") +
                  " within " + FormatSeconds(limits.pipe_timeout));
    }
  }
  throw Error(limits.first_line
                  ? "no line end within its first " + std::to_string(limits.max_bytes) + " bytes"
                  : "it is larger than " + std::to_string(limits.max_bytes) + " bytes");
}

}  // namespace ps
