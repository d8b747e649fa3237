#include "worker/checkpoint_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "ps/src/log_text.h"
#include "worker/errors.h"

namespace ps::worker {
namespace {

std::string ThisHost() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "this host";
  return name;
}

// What the holder wrote into the lock file ("pid 123 on host h"), or "" when unreadable.
std::string Holder(int fd) {
  char text[200] = {};
  const ssize_t got = ::pread(fd, text, sizeof(text) - 1, 0);
  if (got <= 0) return "";
  std::string holder(text, static_cast<std::size_t>(got));
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
  return PrintableText(holder, 120);
}

}  // namespace

CheckpointDirLock::CheckpointDirLock(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kCheckpointLockName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw ConfigError("--checkpoint-dir " + dir +
                      ": cannot write into it: " + std::strerror(errno));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == ENOSYS || error == ENOLCK || error == EOPNOTSUPP) {
      // A file system without locks (Lustre without -o flock, NFS without its lock service):
      // checkpoints still work there; only the guard against a second job is gone.
      warning_ = "--checkpoint-dir " + dir + ": its file system takes no locks (" +
                 std::strerror(error) + "), so nothing keeps a second job from using it: give " +
                 "each job a directory of its own";
      return;
    }
    const std::string holder = Holder(fd_);
    ::close(fd_);
    fd_ = -1;
    if (error == EWOULDBLOCK) {
      throw ConfigError("--checkpoint-dir " + dir + " is in use by another ps-train job (" +
                        (holder.empty() ? std::string("it holds ") : holder + " holds ") + path +
                        "): two jobs would write their checkpoints over each other's; give "
                        "each job a directory of its own");
    }
    throw ConfigError("--checkpoint-dir " + dir + ": cannot lock " + path + ": " +
                      std::strerror(error));
  }
  const std::string holder = "pid " + std::to_string(::getpid()) + " on host " + ThisHost() + "\n";
  // Best effort: the lock is what keeps other jobs out, the text only names the holder.
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd_, holder.data(), holder.size(), 0);
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace ps::worker
