#pragma once
// What the ps-scheduler and ps-server mains share: the cluster flags, reading flags over the
// DMLC_* environment into a ClusterConfig, logging set-up, one-line fatal errors, and signals.
#include <csignal>
#include <exception>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>

#include "ps/config.h"

namespace ps::cli {

// Parses the command line (gflags: --help, --version), sets up glog on stderr. --help lists
// the cluster flags `role` reads, each with its variable and its real default. An argument that
// is not a flag is a one-line error (exit 1). Ignores SIGPIPE: a role whose output reader went
// away goes on, its output dropped.
void Init(int* argc, char*** argv, const std::string& usage, Role role);

// The project's version ("0.1.0"), as --version prints it.
const char* Version();

// --help, -help, -h or --helpfull.
bool IsHelpFlag(std::string_view arg);
// How a program spells its flags: as defined (--num_servers), or with dashes (--batch-size)
// for a program that accepts those.
enum class FlagSpelling { kAsDefined, kDashes };
// Prints `usage` and the flags defined in source files whose name ends with `flag_file`:
// a program's own flags, not the dozens its libraries (glog) define. Flags whose description
// starts with "Internal" are left out.
void PrintFlagHelp(std::ostream& out, std::string_view usage, std::string_view flag_file,
                   FlagSpelling spelling);
// When argv holds a help flag: PrintFlagHelp on stdout, and true (the caller exits 0).
bool PrintHelpIfAsked(int argc, char* const* argv, std::string_view usage,
                      std::string_view flag_file, FlagSpelling spelling);
// A tool's command line (flags spelled with dashes): with a help flag, PrintHelpIfAsked and
// true (the caller exits 0); otherwise gflags parses and removes the flags (--version prints
// Version()), and false. An argument that is not a flag is a one-line error (exit 1).
bool HelpOrParseFlags(int* argc, char*** argv, const std::string& usage,
                      std::string_view flag_file);

// gflags parses and removes the flags (--version prints Version()). A flag it does not know, a
// flag without its value, or a value that does not fit the flag's type is a one-line error
// naming it (exit 1) rather than gflags' own message. What is left is for the caller.
void ParseFlags(int* argc, char*** argv);

// The cluster configuration for `role` from the flags given on the command line, falling back
// to the environment. Throws ps::Error naming the variable (and its flag) that is wrong.
// DMLC_ROLE is ignored (the command decides), with a warning when it names no role.
ClusterConfig ReadClusterConfig(Role role);

// Prints "PROGRAM: error: MESSAGE" on stderr and exits with status 1.
[[noreturn]] void Die(const std::string& program, const std::string& message);

// Die for an exception that ended a role's main: ps::Error's text, or what a standard one
// means for the user (std::bad_alloc: out of memory, and which limits to look at).
[[noreturn]] void DieOf(const std::string& program, const std::exception& e);

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
