#pragma once
// What the ps-scheduler and ps-server mains share: the cluster flags, reading flags over the
// DMLC_* environment into a ClusterConfig, logging set-up, one-line fatal errors, and signals.
#include <csignal>
#include <functional>
#include <string>
#include <thread>

#include "ps/config.h"

namespace ps::cli {

// Parses the command line (gflags: --help, --version), sets up glog on stderr.
void Init(int* argc, char*** argv, const std::string& usage);

// The cluster configuration for `role` from the flags given on the command line, falling back
// to the environment. Throws ps::Error naming the variable (and its flag) that is wrong.
ClusterConfig ReadClusterConfig(Role role);

// Prints "PROGRAM: error: MESSAGE" on stderr and exits with status 1.
[[noreturn]] void Die(const std::string& program, const std::string& message);

// Calls `on_signal` (on its own thread, never in a signal handler) when SIGINT or SIGTERM
// arrives. Construct it before any other thread starts, so every thread inherits the mask.
class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void(int signal)> on_signal);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  std::thread thread_;
};

}  // namespace ps::cli
