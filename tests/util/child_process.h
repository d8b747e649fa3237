#pragma once
// ChildProcess: a process a test starts, with its stdout and stderr captured (merged) by a
// reader thread, waited for with a timeout (pidfd + poll: no sleeping), and always killed and
// reaped by its destructor, so no test leaves a process behind.
#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ps::test {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with the current environment plus `env` (overrides).
  ChildProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Exit code (0-255), or 128+signal when killed by a signal; nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  void Kill(int signal);
  bool Running();
  // Everything printed so far.
  std::string Output() const;
  // Waits until the output contains `text`; returns whether it did within `timeout`.
  bool WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) const;

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int out_fd_ = -1;
  std::optional<int> status_;
  mutable std::mutex mu_;
  mutable std::condition_variable grew_;
  std::string output_;   // GUARDED_BY(mu_)
  bool closed_ = false;  // GUARDED_BY(mu_)
  std::thread reader_;
};

// A free TCP port on 127.0.0.1 at the time of the call (for tests that need a fixed one).
int FindFreePort();

// Path of a binary built into the bin directory.
std::string BinPath(const std::string& name);

// Number of threads in this process (from /proc/self/task).
int ThreadCount();

}  // namespace ps::test
