#include "worker/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "ps/src/scoped_fd.h"

namespace ps::worker {
namespace {

// Throws naming `path` and errno's reason, after removing `temporary` (errno read first).
[[noreturn]] void Fail(const std::string& path, const std::string& temporary) {
  const int error = errno;
  ::unlink(temporary.c_str());
  throw std::runtime_error("cannot write " + path + ": " + std::strerror(error));
}

}  // namespace

void WriteFileDurably(const std::string& path, std::string_view text) {
  const std::string temporary = path + ".tmp";
  {
    ScopedFd file(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (file.get() < 0) Fail(temporary, temporary);
    for (std::size_t done = 0; done < text.size();) {
      const ssize_t written = ::write(file.get(), text.data() + done, text.size() - done);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) Fail(temporary, temporary);
      done += static_cast<std::size_t>(written);
    }
    if (::fsync(file.get()) != 0 || ::close(file.release()) != 0) Fail(temporary, temporary);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) Fail(path, temporary);
  // The rename lasts only once the directory is on disk too.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  ScopedFd directory(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (directory.get() >= 0) ::fsync(directory.get());
}

}  // namespace ps::worker
