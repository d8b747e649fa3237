#include "cli.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <vector>

#include "ps/error.h"

DEFINE_string(root_uri, "", "Scheduler host name or IP address (env DMLC_PS_ROOT_URI)");
DEFINE_int32(root_port, -1,
             "Scheduler port (env DMLC_PS_ROOT_PORT); 0 lets the scheduler pick a free port");
DEFINE_int32(num_servers, -1, "Number of servers in the job (env DMLC_NUM_SERVER)");
DEFINE_int32(num_workers, -1, "Number of workers in the job (env DMLC_NUM_WORKER)");
DEFINE_string(node_host, "", "Address this node advertises (env DMLC_NODE_HOST)");
DEFINE_string(interface, "", "Advertise this network interface's address (env DMLC_INTERFACE)");
DEFINE_int32(verbose, -1, "Logging: 0 quiet, 1 connections, 2 every message (env PS_VERBOSE)");
DEFINE_double(
    heartbeat_interval, -1,
    "Seconds between heartbeats, 0 turns them off (env PS_HEARTBEAT_INTERVAL, default 2)");
DEFINE_double(heartbeat_timeout, -1,
              "Seconds without heartbeat before a node is dead (env PS_HEARTBEAT_TIMEOUT, "
              "default 20)");
DEFINE_double(register_timeout, -1,
              "Seconds to wait for the job to register (env PS_REGISTER_TIMEOUT, default 60)");
DEFINE_bool(use_kubernetes, false, "The scheduler listens on 0.0.0.0 (env DMLC_USE_KUBERNETES=1)");

namespace ps::cli {
namespace {

// Environment name -> flag name, for the flags that override a DMLC_*/PS_* variable.
const std::map<std::string, std::string>& FlagForVariable() {
  static const std::map<std::string, std::string> table = {
      {"DMLC_PS_ROOT_URI", "root_uri"},
      {"DMLC_PS_ROOT_PORT", "root_port"},
      {"DMLC_NUM_SERVER", "num_servers"},
      {"DMLC_NUM_WORKER", "num_workers"},
      {"DMLC_NODE_HOST", "node_host"},
      {"DMLC_INTERFACE", "interface"},
      {"PS_VERBOSE", "verbose"},
      {"PS_HEARTBEAT_INTERVAL", "heartbeat_interval"},
      {"PS_HEARTBEAT_TIMEOUT", "heartbeat_timeout"},
      {"PS_REGISTER_TIMEOUT", "register_timeout"},
      {"DMLC_USE_KUBERNETES", "use_kubernetes"},
  };
  return table;
}

}  // namespace

bool IsHelpFlag(std::string_view arg) {
  return arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpfull";
}

void PrintFlagHelp(std::ostream& out, std::string_view usage, std::string_view flag_file,
                   FlagSpelling spelling) {
  out << usage << (usage.ends_with('\n') ? "" : "\n") << "\nflags:\n";
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  for (const auto& flag : flags) {
    if (!flag.filename.ends_with(flag_file) || flag.description.starts_with("Internal")) continue;
    std::string name = flag.name;
    if (spelling == FlagSpelling::kDashes) std::replace(name.begin(), name.end(), '_', '-');
    std::string value = flag.default_value.empty() ? "\"\"" : flag.default_value;
    if (flag.type == "double") {
      std::ostringstream shortest;  // 0.05, not 0.050000000000000003
      shortest << std::stod(flag.default_value);
      value = shortest.str();
    }
    out << "  --" << name << " (" << flag.type << ", default: " << value << ")\n      "
        << flag.description << "\n";
  }
}

bool PrintHelpIfAsked(int argc, char* const* argv, std::string_view usage,
                      std::string_view flag_file, FlagSpelling spelling) {
  if (std::none_of(argv + 1, argv + argc, IsHelpFlag)) return false;
  PrintFlagHelp(std::cout, usage, flag_file, spelling);
  return true;
}

bool HelpOrParseFlags(int* argc, char*** argv, const std::string& usage,
                      std::string_view flag_file) {
  if (PrintHelpIfAsked(*argc, *argv, usage, flag_file, FlagSpelling::kDashes)) return true;
  gflags::SetUsageMessage(usage);
  gflags::ParseCommandLineFlags(argc, argv, true);
  return false;
}

void Init(int* argc, char*** argv, const std::string& usage) {
  const std::string program = std::string((*argv)[0]);
  if (PrintHelpIfAsked(*argc, *argv, program.substr(program.rfind('/') + 1) + ": " + usage,
                       "cli.cc", FlagSpelling::kAsDefined)) {
    std::exit(0);
  }
  gflags::SetVersionString(PS_VERSION);
  gflags::SetUsageMessage(usage);
  gflags::ParseCommandLineFlags(argc, argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging((*argv)[0]);
}

ClusterConfig ReadClusterConfig(Role role) {
  const std::string role_name = RoleName(role);
  try {
    return ClusterConfig::Parse([&](std::string_view name) -> std::optional<std::string> {
      if (name == "DMLC_ROLE") return role_name;  // the command decides its role
      const auto flag = FlagForVariable().find(std::string(name));
      if (flag != FlagForVariable().end()) {
        const auto info = gflags::GetCommandLineFlagInfoOrDie(flag->second.c_str());
        if (!info.is_default)
          return info.type == "bool" ? (info.current_value == "true" ? "1" : "0")
                                     : info.current_value;
      }
      const char* value = std::getenv(std::string(name).c_str());
      if (value == nullptr) return std::nullopt;
      return std::string(value);
    });
  } catch (const Error& e) {
    std::string hint;
    for (const auto& [variable, flag] : FlagForVariable()) {
      if (std::string(e.what()).starts_with(variable)) hint = " (or the flag --" + flag + ")";
    }
    throw Error(e.what() + hint);
  }
}

void Die(const std::string& program, const std::string& message) {
  std::fprintf(stderr, "%s: error: %s\n", program.c_str(), message.c_str());
  std::fflush(stderr);
  std::exit(1);
}

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);  // our own wake-up at destruction
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([set, on_signal = std::move(on_signal)] {
    while (true) {
      int signal = 0;
      if (sigwait(&set, &signal) != 0 || signal == SIGUSR1) return;
      on_signal(signal);
    }
  });
}

SignalWatcher::~SignalWatcher() {
  pthread_kill(thread_.native_handle(), SIGUSR1);
  thread_.join();
}

}  // namespace ps::cli
