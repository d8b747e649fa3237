#pragma once
// Child: a process a tool or test starts (scheduler, server, worker, echo peer, mpirun), with its
// stdout and stderr captured (merged) by a reader thread. Every wait is bounded (pidfd + poll,
// condition variables with deadlines: no sleeping), and the destructor stops and reaps the
// process by its pid, so no case leaves a process behind. Children also get SIGKILL from the
// kernel if the starting process dies (PR_SET_PDEATHSIG). Used by ps-bench and by every
// multi-process test.
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ps/mutex.h"
#include "ps/thread_annotations.h"

namespace ps::process {

using Env = std::map<std::string, std::string>;

class Child {
 public:
  // Starts argv[0] (a path) with the current environment plus `env` (overrides); `name` is
  // used in messages ("server 1"). Throws std::runtime_error when it cannot fork.
  Child(std::string name, const std::vector<std::string>& argv, const Env& env);
  // The same, named after the program's file name.
  Child(const std::vector<std::string>& argv, const Env& env);
  // Stop(), then joins the reader.
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }

  // Exit code (0-255), or 128+signal when killed by a signal; nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  // Sends `signal` (no-op once reaped).
  void Kill(int signal);
  // SIGTERM, up to `grace` for it to exit, then SIGKILL; reaps it. No-op once reaped.
  void Stop(std::chrono::milliseconds grace = std::chrono::seconds(3));

  // Everything printed so far.
  std::string Output() const;
  // The last `lines` lines printed (for error messages).
  std::string Tail(int lines = 15) const;
  // Waits until `done(output)` holds; returns false when `timeout` passes first or the
  // process closed its output without `done` holding.
  bool WaitForOutput(const std::function<bool(const std::string&)>& done,
                     std::chrono::milliseconds timeout) const;
  // Waits until the output contains `text`.
  bool WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) const;

 private:
  std::string name_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int out_fd_ = -1;
  int cancel_fd_ = -1;  // a write here makes the reader stop
  std::optional<int> status_;
  mutable Mutex mu_;
  mutable CondVar grew_;
  std::string output_ PS_GUARDED_BY(mu_);
  bool closed_ PS_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

// Directory of the running executable (from /proc/self/exe).
std::string SelfDirectory();
// Path of the running executable.
std::string SelfPath();
// First `name` found in the colon-separated PATH, or "" when none.
std::string FindInPath(const std::string& name);

}  // namespace ps::process
