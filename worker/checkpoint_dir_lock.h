#pragma once
// CheckpointDirLock: one ps-train job at a time per --checkpoint-dir. Two jobs given the same
// directory would write their epochs over each other's, both saying "checkpoint saved", and a
// later --resume would go on from the other job's model. Rank 0 holds an flock on
// DIR/.ps-train.lock for the job's life; the kernel drops it when the process ends, however
// it ends, so a killed job leaves no stale lock. The file names the holder (pid and host) for
// the refusal message.
#include <string>

namespace ps::worker {

class CheckpointDirLock {
 public:
  // Takes the lock on `dir` (which must exist), or throws ConfigError naming the job that holds
  // it and the fix.
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  // Why the directory is not locked though the job goes on (a file system without locks);
  // "" when it is locked.
  const std::string& warning() const { return warning_; }

 private:
  int fd_ = -1;
  std::string warning_;
};

inline constexpr const char* kCheckpointLockName = ".ps-train.lock";

}  // namespace ps::worker
