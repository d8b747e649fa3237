#pragma once
// Exceptions the worker core throws for mistakes a user can fix (a bad data file, a wrong flag,
// a device that is not there). Each message is one line that names what to change.
#include <stdexcept>
#include <string>

namespace ps::worker {

// A data file that is missing, unreadable, corrupt or truncated. path() names the file.
class DataError : public std::runtime_error {
 public:
  DataError(const std::string& path, const std::string& what)
      : std::runtime_error(what), path_(path) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A configuration the program cannot run with: unknown model or device name, a batch size
// larger than the shard, and the like.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& what) : std::runtime_error(what) {}
};

// Training that cannot go on: the loss became NaN or infinite (the learning rate is too high).
class DivergenceError : public std::runtime_error {
 public:
  explicit DivergenceError(const std::string& what) : std::runtime_error(what) {}
};

// A compute device that is missing or failed (CUDA runtime and cuBLAS errors).
class DeviceError : public std::runtime_error {
 public:
  explicit DeviceError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ps::worker
