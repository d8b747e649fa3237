#include "ps/cli/cli.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "ps/error.h"
#include "ps/src/log_text.h"
#include "ps/src/misspelt_settings.h"
#include "ps/src/small_file.h"
#include "ps/src/stack_room.h"
#include "ps/src/start_thread.h"
#include "ps/src/stderr_log.h"

// The cluster flags. Their gflags defaults (-1, "") only mean "not given": then the variable
// applies, else the default --help shows (ClusterFlagHelp, from ClusterConfig's defaults).
DEFINE_string(root_uri, "", "Scheduler host name or IP address");
DEFINE_int32(root_port, -1, "Scheduler port; 0 (scheduler only) picks a free port and prints it");
DEFINE_int32(num_servers, -1, "Number of servers in the job");
DEFINE_int32(num_workers, -1, "Number of workers in the job");
DEFINE_string(node_host, "", "Address this node advertises to the others");
DEFINE_string(interface, "", "Advertise this network interface's IPv4 address");
DEFINE_int32(verbose, -1, "Logging: 0 quiet, 1 connections, 2 every message");
DEFINE_double(heartbeat_interval, -1, "Seconds between heartbeats, 0 turns them off");
DEFINE_double(heartbeat_timeout, -1, "Seconds without a heartbeat before a node is dead");
DEFINE_double(register_timeout, -1, "Seconds to wait for the whole job to register");
DEFINE_bool(use_kubernetes, false, "Listen on 0.0.0.0 instead of the DMLC_PS_ROOT_URI address");
DEFINE_double(stall_timeout, -1,
              "Seconds dist_sync workers that push from other threads than the waiting one may "
              "wait for each other's pushes, none of them pushing, before the job ends; 0: only "
              "warn. Half of it (at most 60 s) is also when a collective or a dist_sync wait "
              "that lasts is logged, naming what it waits for");

namespace ps::cli {
namespace {

// The flags that override a DMLC_*/PS_* variable, in --help's order: {variable, flag}.
const std::vector<std::pair<std::string, std::string>>& ClusterFlags() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"DMLC_PS_ROOT_URI", "root_uri"},
      {"DMLC_PS_ROOT_PORT", "root_port"},
      {"DMLC_NUM_SERVER", "num_servers"},
      {"DMLC_NUM_WORKER", "num_workers"},
      {"DMLC_NODE_HOST", "node_host"},
      {"DMLC_INTERFACE", "interface"},
      {"DMLC_USE_KUBERNETES", "use_kubernetes"},
      {"PS_VERBOSE", "verbose"},
      {"PS_HEARTBEAT_INTERVAL", "heartbeat_interval"},
      {"PS_HEARTBEAT_TIMEOUT", "heartbeat_timeout"},
      {"PS_REGISTER_TIMEOUT", "register_timeout"},
      {"PS_STALL_TIMEOUT", "stall_timeout"},
  };
  return table;
}

// Environment name -> flag name.
const std::map<std::string, std::string>& FlagForVariable() {
  static const std::map<std::string, std::string> table(ClusterFlags().begin(),
                                                        ClusterFlags().end());
  return table;
}

// Flags that only the scheduler reads: left out of ps-server's --help.
bool SchedulerOnly(std::string_view flag) {
  return flag == "use_kubernetes" || flag == "stall_timeout";
}

std::string Seconds(std::chrono::milliseconds ms) {
  std::ostringstream text;
  text << static_cast<double>(ms.count()) / 1000.0;
  return text.str();
}

// "(TYPE; env VARIABLE; default: VALUE)" for a cluster flag, the value being what applies when
// neither the flag nor the variable is given.
std::string ClusterFlagHelp(const gflags::CommandLineFlagInfo& flag, const std::string& variable) {
  const ClusterConfig defaults;
  const std::map<std::string, std::string> fallback = {
      {"root_uri", "required"},
      {"root_port", "required"},
      {"num_servers", "required"},
      {"num_workers", "required"},
      {"node_host",
       "default: the --interface address, else the local address toward the scheduler"},
      {"interface", "default: none"},
      {"verbose", "default: " + std::to_string(defaults.verbose)},
      {"heartbeat_interval", "default: " + Seconds(defaults.heartbeat_interval)},
      {"heartbeat_timeout", "default: " + Seconds(defaults.heartbeat_timeout)},
      {"register_timeout", "default: " + Seconds(defaults.register_timeout)},
      {"stall_timeout", "default: " + Seconds(defaults.stall_timeout)},
      {"use_kubernetes", std::string("default: ") + (defaults.use_kubernetes ? "true" : "false")},
  };
  const auto it = fallback.find(flag.name);
  return "(" + flag.type + "; env " + variable + "; " +
         (it != fallback.end() ? it->second : "default: " + flag.default_value) + ")";
}

void PrintClusterFlagHelp(std::ostream& out, std::string_view usage, Role role) {
  out << usage << (usage.ends_with('\n') ? "" : "\n") << "\nflags:\n";
  for (const auto& [variable, name] : ClusterFlags()) {
    if (role != Role::kScheduler && SchedulerOnly(name)) continue;
    const auto flag = gflags::GetCommandLineFlagInfoOrDie(name.c_str());
    out << "  --" << name << " " << ClusterFlagHelp(flag, variable) << "\n      "
        << flag.description << "\n";
  }
  out << "  --flagfile=FILE[,FILE...]\n      Read flags from FILE: one --name=value per line, "
         "# comments\n"
         "  --help, --version\n\n"
         "Settings with no flag, read from the environment only: MXNET_KVSTORE_BIGARRAY_BOUND,\n"
         "PS_CHUNK_BYTES, PS_TCP_RCVBUF, PS_SERVER_WEIGHTS, PS_RANK, PS_USE_IPC, PS_USE_SHM,\n"
         "PS_SHM_MAX_SEGMENTS, PS_IO_THREADS, PS_JOB_SECRET, PS_JOB_SECRET_FILE, PS_REPLICATION,\n"
         "PS_ENCRYPT. Each is described in README.md's table of settings (installed as\n"
         "share/doc/ps/README.md, beside docs/ with the rest of the documentation).\n";
}

}  // namespace

const char* Version() { return PS_VERSION; }

bool IsHelpFlag(std::string_view arg) {
  // gflags' own variants too (--helpshort, --helpmatch=S, ...): they would list glog's flags,
  // or nothing at all, where ours show the program's.
  if (!arg.starts_with('-')) return false;
  arg.remove_prefix(arg.starts_with("--") ? 2 : 1);
  arg = arg.substr(0, arg.find('='));
  for (const std::string_view name :
       {"h", "help", "helpfull", "helpshort", "helpxml", "helppackage", "helpon", "helpmatch"}) {
    if (arg == name) return true;
  }
  return false;
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

namespace {

std::string ProgramName(const char* argv0) {
  const std::string path(argv0);
  return path.substr(path.rfind('/') + 1);
}

// gflags has removed the flags: what is left is a mistake (a value without its --name=).
void RejectArguments(int argc, char* const* argv) {
  if (argc <= 1) return;
  Die(ProgramName(argv[0]), "unexpected argument '" + std::string(argv[1]) +
                                "': every setting is a flag (--name=value) or its environment "
                                "variable; see --help");
}

// The flags a --flagfile may nest, at most: a file that names itself fails instead of looping.
constexpr int kMaxFlagfileDepth = 8;

// A word gflags reads as a yes/no value.
bool IsYesNoWord(std::string_view word) {
  for (const std::string_view yes_no :
       {"true", "false", "yes", "no", "1", "0", "t", "f", "y", "n"}) {
    if (word.size() == yes_no.size() &&
        std::equal(word.begin(), word.end(), yes_no.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        })) {
      return true;
    }
  }
  return false;
}

// Checks a command line's flags, and the flag files they name, before gflags sees them: gflags
// would print its own "ERROR: ..." line and exit, or take a flag file's unknown flags in
// silence. A flag's value is set as gflags will set it (the same values in the same order).
class FlagChecker {
 public:
  explicit FlagChecker(const char* argv0) : invocation_(argv0), program_(ProgramName(argv0)) {}

  void CheckCommandLine(int argc, char* const* argv) const {
    for (int i = 1; i < argc; ++i) {
      std::string_view arg = argv[i];
      if (arg == "--") break;                         // gflags stops there too
      if (arg.size() < 2 || arg[0] != '-') continue;  // an argument (RejectArguments')
      arg.remove_prefix(arg[1] == '-' ? 2 : 1);
      if (CheckFlag(arg, i + 1 < argc ? argv[i + 1] : nullptr, "", 0)) ++i;
    }
  }

 private:
  // One flag, `arg` without its dashes ("name", "name=value"); `next` is the argument after
  // it (nullptr: none, as in a flag file, one flag per line). Returns whether it took `next`
  // as its value. `where` says where it came from ("" for the command line).
  bool CheckFlag(std::string_view arg, const char* next, const std::string& where,
                 int depth) const {
    const std::size_t equals = arg.find('=');
    const std::string name(arg.substr(0, equals));
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      // --noNAME turns the bool flag NAME off.
      if (name.starts_with("no") && gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) &&
          info.type == "bool") {
        const std::string flag = name.substr(2);
        if (equals == std::string_view::npos) {
          if (next != nullptr && IsYesNoWord(next)) {
            Die(program_, "--" + name + " " + next + where +
                              ": a negated yes/no flag takes no value: write --" + flag +
                              "=false (or --" + name + ") or --" + flag + "=true");
          }
          return false;
        }
        Die(program_, "--" + std::string(arg) + where +
                          ": a negated yes/no flag takes no value: write --" + flag +
                          "=false (or --no" + flag + ") to turn it off, --" + flag +
                          "=true to turn it on");
      }
      Die(program_,
          "unknown flag --" + name + where + ": see --help for the flags " + program_ + " takes");
    }
    std::string value;
    bool took_next = false;
    if (equals != std::string_view::npos) {
      value = arg.substr(equals + 1);
    } else if (info.type == "bool") {
      // gflags would leave "--resume false" as an argument, refused without naming the flag.
      if (next != nullptr && IsYesNoWord(next)) {
        Die(program_, "--" + name + " " + next + where +
                          ": a yes/no flag takes its value after '=', not as the next "
                          "argument: write --" +
                          name + "=" + next);
      }
      return false;
    } else if (next != nullptr) {
      value = next;  // --name value
      took_next = true;
    } else {
      Die(program_, "flag --" + name + where + " needs a value (--" + name + "=VALUE)");
    }
    if (name == "flagfile") {
      CheckFlagfiles(value, depth + 1);
      return took_next;
    }
    // An empty answer means the value does not fit the type.
    if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty()) {
      Die(program_, "invalid value '" + value + "' for --" + name + " (" + info.type + ")" + where +
                        ": see --help");
    }
    return took_next;
  }

  // --flagfile's value: files separated by commas, as gflags reads it (empty: none).
  void CheckFlagfiles(std::string_view paths, int depth) const {
    while (!paths.empty()) {
      const std::string_view path = paths.substr(0, paths.find(','));
      if (!path.empty()) CheckFlagfile(std::string(path), depth);
      paths.remove_prefix(std::min(paths.size(), path.size() + 1));
    }
  }

  // A flag file as gflags reads it: lines without their leading blanks; empty and # lines
  // skipped; a line of program names (globs, separated by spaces) makes the flags after it,
  // up to the next such line, apply only to those programs; every other line one flag.
  void CheckFlagfile(const std::string& path, int depth) const {
    if (depth > kMaxFlagfileDepth) {
      Die(program_, "--flagfile " + path + ": flag files nest more than " +
                        std::to_string(kMaxFlagfileDepth) + " deep (does one name itself?)");
    }
    std::istringstream text(ReadFlagfile(path));
    bool in_programs = false;  // the last line read named programs
    bool relevant = true;      // the flags read now apply to this program
    std::string line;
    for (int number = 1; std::getline(text, line); ++number) {
      const std::size_t begin = line.find_first_not_of(" \t\r\v\f");
      if (begin == std::string::npos || line[begin] == '#') continue;
      const std::string_view content = std::string_view(line).substr(begin);
      const std::string where = " (line " + std::to_string(number) + " of " + path + ")";
      if (content[0] != '-') {
        // No program's name holds '=': a flag without its dashes, which gflags would take
        // for names that match no program, skipping every flag after it.
        if (content.find('=') != std::string_view::npos) {
          Die(program_, "'" + std::string(content) + "'" + where +
                            " is not a flag (--name=value) nor a line of program names");
        }
        if (!in_programs) relevant = false;
        in_programs = true;
        relevant = relevant || NamesThisProgram(content);
        continue;
      }
      in_programs = false;
      if (!relevant) continue;  // gflags skips it too
      const std::size_t last = content.find_last_not_of(" \t\r\v\f");
      if (last + 1 != content.size()) {
        Die(program_, "'" + std::string(content.substr(0, last + 1)) + "'" + where +
                          " ends in a space, a tab or a carriage return (a Windows line end?), "
                          "which gflags would keep in the flag: remove it");
      }
      if (content.size() < 2 || content == "--") {
        Die(program_, "'" + std::string(content) + "'" + where +
                          " is not a flag: a flag file holds one --name=value per line");
      }
      std::string_view arg = content.substr(content[1] == '-' ? 2 : 1);
      if (const std::size_t space = arg.substr(0, arg.find('=')).find_first_of(" \t");
          space != std::string_view::npos) {
        Die(program_, "'" + std::string(content) + "'" + where +
                          " is not one flag: a flag file holds one --name=value per line");
      }
      CheckFlag(arg, nullptr, where, depth);
    }
  }

  // Bounded, and a regular file only: gflags reads it again after this check, so a pipe's
  // flags would be gone by then; a device (/dev/zero) or a FIFO must not fill memory or block.
  std::string ReadFlagfile(const std::string& path) const {
    constexpr std::size_t kMostFlagfileBytes = 1 << 20;
    if (std::error_code error; std::filesystem::is_directory(path, error)) {
      Die(program_, "--flagfile " + path +
                        " is a directory: give a file of --name=value lines, one per line");
    }
    try {
      return ReadSmallFile(path, {.max_bytes = kMostFlagfileBytes});
    } catch (const Error& e) {
      Die(program_, "cannot read --flagfile " + path + ": " + e.what() +
                        ": give a file of --name=value lines, one per line");
    }
  }

  // Whether a program-names line (globs separated by spaces) names this program, by the path
  // it was started with or its file name, as gflags matches them.
  bool NamesThisProgram(std::string_view globs) const {
    std::istringstream words{std::string(globs)};
    std::string glob;
    while (words >> glob) {
      if (glob == invocation_ || glob == program_ ||
          ::fnmatch(glob.c_str(), invocation_.c_str(), FNM_PATHNAME) == 0 ||
          ::fnmatch(glob.c_str(), program_.c_str(), FNM_PATHNAME) == 0) {
        return true;
      }
    }
    return false;
  }

  std::string invocation_;  // argv[0]
  std::string program_;     // its file name
};

}  // namespace

void ParseFlags(int* argc, char*** argv) {
  FlagChecker(**argv).CheckCommandLine(*argc, *argv);
  gflags::ParseCommandLineFlags(argc, argv, true);
}

bool HelpOrParseFlags(int* argc, char*** argv, const std::string& usage,
                      std::string_view flag_file) {
  if (PrintHelpIfAsked(*argc, *argv, usage, flag_file, FlagSpelling::kDashes)) return true;
  gflags::SetVersionString(Version());
  gflags::SetUsageMessage(usage);
  ParseFlags(argc, argv);
  RejectArguments(*argc, *argv);
  return false;
}

void Init(int* argc, char*** argv, const std::string& usage, Role role) {
  if (std::any_of(*argv + 1, *argv + *argc, IsHelpFlag)) {
    PrintClusterFlagHelp(std::cout, ProgramName((*argv)[0]) + ": " + usage, role);
    std::exit(0);
  }
  // A role owns its process: a reader of its output that goes away (`| grep -m1 listening`)
  // must not kill it with SIGPIPE. Its writes then fail (EPIPE) and are dropped; ZeroMQ's
  // sockets never raise the signal.
  ::signal(SIGPIPE, SIG_IGN);
  // Nor may a file grown past RLIMIT_FSIZE (ulimit -f) kill it with SIGXFSZ: the write fails
  // (EFBIG) and is reported like a full disk.
  ::signal(SIGXFSZ, SIG_IGN);
  // First of the work, while the main thread still has room to say why it cannot go on.
  if (const std::string shortage = internal::RaiseStackRoom(0); !shortage.empty()) {
    Die(ProgramName((*argv)[0]), shortage);
  }
  gflags::SetVersionString(Version());
  gflags::SetUsageMessage(usage);
  ParseFlags(argc, argv);
  RejectArguments(*argc, *argv);
  // A flag of another role's would be taken and ignored: its --help does not list it.
  for (const auto& [variable, name] : ClusterFlags()) {
    if (role == Role::kScheduler || !SchedulerOnly(name) ||
        gflags::GetCommandLineFlagInfoOrDie(name.c_str()).is_default) {
      continue;
    }
    Die(ProgramName((*argv)[0]), "--" + name + " is read by ps-scheduler only (" + variable +
                                     "); a " + RoleName(role) + " would ignore it: drop it");
  }
  internal::SetUpLogging((*argv)[0]);
}

ClusterConfig ReadClusterConfig(Role role) {
  const std::string role_name = RoleName(role);
  // Another role is ignored quietly (a worker's environment, inherited); a value that is no
  // role at all is a mistake worth a word.
  if (const char* set = std::getenv("DMLC_ROLE"); set != nullptr && !RoleFromName(set)) {
    LOG(WARNING) << "DMLC_ROLE=" << set << " is not a role (scheduler, server or worker) and "
                 << "is ignored: ps-" << role_name << " runs the " << role_name << " role";
  }
  const auto with_flag = [role](const std::string& error) {
    for (const auto& [variable, flag] : FlagForVariable()) {
      if (!error.starts_with(variable)) continue;
      // The job's roles share one environment: each checks the scheduler's settings too.
      return error + (role == Role::kScheduler || !SchedulerOnly(flag)
                          ? " (or the flag --" + flag + ")"
                          : " (a setting of ps-scheduler's, which every role checks)");
    }
    return error;
  };
  return internal::ParseWithMisspellings(
      [&](std::string_view name) -> std::optional<std::string> {
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
      },
      with_flag);
}

void Die(const std::string& program, const std::string& message) {
  internal::FlushStderrLog();  // the log lines before it, then the last word
  std::fprintf(stderr, "%s: error: %s\n", program.c_str(), message.c_str());
  std::fflush(stderr);
  std::exit(1);
}

void DieOf(const std::string& program, const std::exception& e) { Die(program, ExceptionText(e)); }

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);  // our own wake-up at destruction
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ =
      internal::StartThread<std::thread>("the signal", [set, on_signal = std::move(on_signal)] {
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
