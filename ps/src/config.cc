#include "ps/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "ps/error.h"
#include "ps/src/misspelt_settings.h"
#include "ps/src/small_file.h"

namespace ps {
namespace {

// PS_SERVER_WEIGHTS's largest weight once scaled: fine enough for a share of 1/1000.
constexpr double kServerWeightScale = 1000;

// PS_HEARTBEAT_TIMEOUT's least value: the scheduler checks heartbeats every 0.2 s and takes a
// gap of half the timeout between its checks for a pause of its own (PauseWatch), so a shorter
// timeout would find a pause at every check and never declare a node dead. (Both the scheduler
// and the nodes also keep that threshold at three of their ticks or more.)
constexpr double kMinHeartbeatTimeoutSeconds = 1.0;

// PS_TCP_RCVBUF's least non-zero value: a few segments; the kernel rounds smaller ones up.
constexpr int kMinTcpReceiveBuffer = 4096;

[[noreturn]] void Invalid(std::string_view name, const std::string& value,
                          std::string_view accepted) {
  throw Error(std::string(name) + "='" + value + "' is invalid: " + std::string(accepted));
}

std::optional<long long> ParseInteger(const std::string& text) {
  long long value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

int ReadInt(const SettingLookup& lookup, std::string_view name, long long min, long long max,
            std::optional<int> fallback) {
  const auto raw = lookup(name);
  if (!raw || raw->empty()) {
    if (fallback) return *fallback;
    throw Error(std::string(name) + " is not set: set it to an integer in " + std::to_string(min) +
                ".." + std::to_string(max));
  }
  const auto value = ParseInteger(*raw);
  if (!value || *value < min || *value > max) {
    Invalid(name, *raw,
            "expected an integer in " + std::to_string(min) + ".." + std::to_string(max));
  }
  return static_cast<int>(*value);
}

// A count of thousandths as a decimal with no trailing zeros: 1500 -> "1.5", 3000 -> "3".
std::string ThousandthsText(std::uint64_t thousandths) {
  std::string text = std::to_string(thousandths / 1000);
  if (const auto rest = thousandths % 1000; rest != 0) {
    std::string fraction = std::to_string(1000 + rest).substr(1);  // 3 digits
    while (fraction.back() == '0') fraction.pop_back();
    text += "." + fraction;
  }
  return text;
}

// Seconds as PS_HEARTBEAT_* are written: "2", "0.25" (milliseconds are exact in the text).
std::string SecondsText(std::chrono::milliseconds ms) {
  return ThousandthsText(static_cast<std::uint64_t>(ms.count()));
}

std::chrono::milliseconds ReadSeconds(const SettingLookup& lookup, std::string_view name,
                                      double min_seconds, std::chrono::milliseconds fallback) {
  const auto raw = lookup(name);
  if (!raw || raw->empty()) return fallback;
  // Decimal only, as the integer settings: strtod alone would take a leading blank, "0x10"
  // and "infinity".
  const bool decimal = raw->find_first_not_of("0123456789.eE+-") == std::string::npos &&
                       raw->find_first_of("0123456789.") == 0;
  char* end = nullptr;
  const double seconds = std::strtod(raw->c_str(), &end);
  if (!decimal || end != raw->c_str() + raw->size() || !std::isfinite(seconds) ||
      seconds < min_seconds || seconds > 86400.0) {
    Invalid(name, *raw,
            "expected a number of seconds in " +
                SecondsText(std::chrono::milliseconds(std::llround(min_seconds * 1000.0))) +
                "..86400");
  }
  const auto ms = std::chrono::milliseconds(static_cast<long long>(std::llround(seconds * 1000.0)));
  if (seconds > 0.0 && ms.count() == 0) {
    // Read as 0, it would mean "off" (PS_HEARTBEAT_INTERVAL, PS_STALL_TIMEOUT): not what was asked.
    Invalid(name, *raw,
            "expected 0 or at least 0.001 seconds (the resolution is a millisecond; a smaller "
            "positive value would read as 0)");
  }
  return ms;
}

// Unset or empty: `fallback`, as for every other setting.
bool ReadBool(const SettingLookup& lookup, std::string_view name, bool fallback) {
  const auto raw = lookup(name);
  if (!raw || raw->empty()) return fallback;
  if (*raw == "0" || *raw == "false") return false;
  if (*raw == "1" || *raw == "true") return true;
  Invalid(name, *raw, "expected 0, 1, true or false");
}

// Why the secret file at `path` lets other users in ("" when it does not): a regular file
// that others may read or write (a pipe, `<(...)`, is the process's own). As ssh does for a
// private key, the file is refused rather than used.
std::string SecretFileExposure(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) == 0) {
    return "";
  }
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return std::string("other users may read or write it (mode ") + mode +
         "), and with the secret join the job: chmod 600 " + path;
}

// PS_JOB_SECRET, or the first line of PS_JOB_SECRET_FILE (a file keeps the secret out of the
// environment other processes of the same user can read, and out of command lines).
std::string ReadJobSecret(const SettingLookup& lookup) {
  const auto secret = lookup("PS_JOB_SECRET");
  const auto file = lookup("PS_JOB_SECRET_FILE");
  if (secret && file) {
    throw Error("both PS_JOB_SECRET and PS_JOB_SECRET_FILE are set: set one of them");
  }
  std::string text;
  if (file) {
    const std::string fix = ": point it to a readable file whose first line is the job secret";
    std::error_code error;
    if (std::filesystem::is_directory(*file, error)) {
      throw Error("PS_JOB_SECRET_FILE='" + *file + "' is a directory" + fix);
    }
    // Bounded: /dev/zero or a huge file fails instead of filling memory; a FIFO nobody writes
    // to fails instead of blocking; a pipe (`<(echo ...)`) is read within the time.
    constexpr std::size_t kMostSecretFileBytes = 64 * 1024;
    std::string bytes;
    try {
      bytes = ReadSmallFile(
          *file, {.max_bytes = kMostSecretFileBytes, .pipe_timeout = std::chrono::seconds(10)});
    } catch (const Error& e) {
      throw Error("PS_JOB_SECRET_FILE='" + *file + "' cannot be read (" + e.what() + ")" + fix);
    }
    if (bytes.empty()) Invalid("PS_JOB_SECRET_FILE", *file, "the file is empty");
    if (const std::string exposure = SecretFileExposure(*file); !exposure.empty()) {
      throw Error("PS_JOB_SECRET_FILE='" + *file + "': " + exposure);
    }
    text = bytes.substr(0, bytes.find('\n'));
    if (text.ends_with('\r')) text.pop_back();  // a line ends before CR LF too
    if (text.empty()) Invalid("PS_JOB_SECRET_FILE", *file, "its first line is empty");
  } else if (secret) {
    text = *secret;
    if (text.empty())
      Invalid("PS_JOB_SECRET", "", "expected a non-empty secret, or leave it unset");
  }
  // ZeroMQ's PLAIN mechanism carries at most 255 bytes of password.
  constexpr std::size_t kMaxSecretBytes = 255;
  if (text.size() > kMaxSecretBytes) {
    throw Error("the job secret (PS_JOB_SECRET or PS_JOB_SECRET_FILE) has " +
                std::to_string(text.size()) + " bytes, at most " + std::to_string(kMaxSecretBytes) +
                " are allowed");
  }
  return text;
}

}  // namespace

std::string RoleName(Role role) {
  switch (role) {
    case Role::kScheduler:
      return "scheduler";
    case Role::kServer:
      return "server";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

std::optional<Role> RoleFromName(std::string_view name) {
  for (const Role role : {Role::kScheduler, Role::kServer, Role::kWorker}) {
    if (name == RoleName(role)) return role;
  }
  return std::nullopt;
}

ClusterConfig ClusterConfig::Parse(const SettingLookup& lookup) {
  ClusterConfig config;
  const auto role = lookup("DMLC_ROLE");
  if (!role || role->empty()) {
    throw Error("DMLC_ROLE is not set: set it to scheduler, server or worker");
  }
  const std::optional<Role> parsed = RoleFromName(*role);
  if (!parsed) Invalid("DMLC_ROLE", *role, "expected scheduler, server or worker");
  config.role = *parsed;

  const auto uri = lookup("DMLC_PS_ROOT_URI");
  if (!uri || uri->empty()) {
    throw Error("DMLC_PS_ROOT_URI is not set: set it to the scheduler's host name or IP address");
  }
  config.root_uri = *uri;
  // Only the scheduler may ask for an ephemeral port; the others must be told the real one.
  const int min_port = config.role == Role::kScheduler ? 0 : 1;
  config.root_port = ReadInt(lookup, "DMLC_PS_ROOT_PORT", min_port, 65535, std::nullopt);
  config.num_servers = ReadInt(lookup, "DMLC_NUM_SERVER", 1, 65536, std::nullopt);
  config.num_workers = ReadInt(lookup, "DMLC_NUM_WORKER", 1, 65536, std::nullopt);
  config.node_host = lookup("DMLC_NODE_HOST").value_or("");
  config.interface = lookup("DMLC_INTERFACE").value_or("");
  config.verbose = ReadInt(lookup, "PS_VERBOSE", 0, 2, 0);
  config.use_kubernetes = ReadBool(lookup, "DMLC_USE_KUBERNETES", false);
  config.chunk_bytes =
      static_cast<std::size_t>(ReadInt(lookup, "PS_CHUNK_BYTES", 4096, 2147483647, 4 << 20));
  config.server_weights =
      ParseServerWeights(lookup("PS_SERVER_WEIGHTS").value_or(""), config.num_servers);
  config.tcp_receive_buffer = ReadInt(lookup, "PS_TCP_RCVBUF", 0, 1 << 30, 0);
  if (config.tcp_receive_buffer > 0 && config.tcp_receive_buffer < kMinTcpReceiveBuffer) {
    Invalid("PS_TCP_RCVBUF", std::to_string(config.tcp_receive_buffer),
            "expected 0 (the kernel's autotuning) or at least " +
                std::to_string(kMinTcpReceiveBuffer) + " bytes");
  }
  config.rank_hint = ReadInt(lookup, "PS_RANK", 0, 65535, -1);
  if (config.role != Role::kScheduler) {
    // A rank the job does not have is a mistake (a count or a rank mixed up), not a request.
    const bool server = config.role == Role::kServer;
    const int count = server ? config.num_servers : config.num_workers;
    if (config.rank_hint >= count) {
      Invalid("PS_RANK", std::to_string(config.rank_hint),
              "a job of " + std::string(server ? "DMLC_NUM_SERVER=" : "DMLC_NUM_WORKER=") +
                  std::to_string(count) + (server ? " servers" : " workers") +
                  (count == 1
                       ? " has only rank 0"
                       : " has ranks 0.." + std::to_string(count - 1) + ": ask for one of those") +
                  ", or leave PS_RANK unset");
    }
  }
  config.use_ipc = ReadBool(lookup, "PS_USE_IPC", true);
  config.use_shm = ReadBool(lookup, "PS_USE_SHM", true);
  config.shm_max_segments = ReadInt(lookup, "PS_SHM_MAX_SEGMENTS", 0, 1 << 30, 0);
  config.replication = ReadBool(lookup, "PS_REPLICATION", true);
  config.io_threads = ReadInt(lookup, "PS_IO_THREADS", 1, 16, config.io_threads);
  config.wait_spin = std::chrono::microseconds(
      ReadInt(lookup, "PS_WAIT_SPIN_US", 0, 1000000, static_cast<int>(config.wait_spin.count())));
  config.heartbeat_interval =
      ReadSeconds(lookup, "PS_HEARTBEAT_INTERVAL", 0.0, config.heartbeat_interval);
  config.heartbeat_timeout = ReadSeconds(lookup, "PS_HEARTBEAT_TIMEOUT",
                                         kMinHeartbeatTimeoutSeconds, config.heartbeat_timeout);
  config.register_timeout =
      ReadSeconds(lookup, "PS_REGISTER_TIMEOUT", 0.1, config.register_timeout);
  config.stall_timeout = ReadSeconds(lookup, "PS_STALL_TIMEOUT", 0.0, config.stall_timeout);
  config.job_secret = ReadJobSecret(lookup);
  config.encrypt = ReadBool(lookup, "PS_ENCRYPT", false);
  if (config.encrypt && config.job_secret.empty()) {
    throw Error(
        "PS_ENCRYPT=1 derives its keys from the job secret: set PS_JOB_SECRET or "
        "PS_JOB_SECRET_FILE too (tools/launch.py makes one for every job)");
  }
  config.big_array_bound = static_cast<std::size_t>(
      ReadInt(lookup, "MXNET_KVSTORE_BIGARRAY_BOUND", 1, 2147483647, 1000000));
  if (config.heartbeat_interval.count() > 0 &&
      config.heartbeat_timeout <= config.heartbeat_interval) {
    throw Error("PS_HEARTBEAT_TIMEOUT (" + std::to_string(config.heartbeat_timeout.count()) +
                " ms) must be longer than PS_HEARTBEAT_INTERVAL (" +
                std::to_string(config.heartbeat_interval.count()) + " ms)");
  }
  return config;
}

ClusterConfig ClusterConfig::FromEnvironment() {
  return internal::ParseWithMisspellings([](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

std::string ClusterConfig::SchedulerAddress() const {
  return root_uri + ":" + std::to_string(root_port);
}

namespace {

// The scaled weights as SharedSettings compares them and a refusal shows them: "equal", or in
// the variable's own terms with the largest scaled to 1 ("1,1,0.25"), exact since each scaled
// weight is a whole number of thousandths.
static_assert(kServerWeightScale == 1000, "ServerWeightsText writes thousandths");
std::string ServerWeightsText(const std::vector<std::uint32_t>& weights) {
  if (weights.empty()) return "equal";
  std::string text;
  for (const std::uint32_t weight : weights) {
    text += (text.empty() ? "" : ",") + ThousandthsText(weight);
  }
  return text;
}

}  // namespace

std::vector<std::uint32_t> ParseServerWeights(const std::string& text, int num_servers) {
  if (text.empty()) return {};
  std::vector<double> weights;
  std::string_view rest = text;
  while (true) {
    const std::string_view item = rest.substr(0, rest.find(','));
    double weight = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), weight);
    if (error != std::errc() || end != item.data() + item.size() || item.empty() ||
        !std::isfinite(weight) || weight <= 0) {
      Invalid("PS_SERVER_WEIGHTS", text,
              "expected one positive number per server rank, comma-separated (e.g. 1,1,1,0.25)");
    }
    weights.push_back(weight);
    if (item.size() == rest.size()) break;
    rest.remove_prefix(item.size() + 1);
  }
  if (weights.size() != static_cast<std::size_t>(num_servers)) {
    Invalid("PS_SERVER_WEIGHTS", text,
            "it has " + std::to_string(weights.size()) + " weights for " +
                std::to_string(num_servers) + " servers (DMLC_NUM_SERVER): give one per rank");
  }
  const double largest = *std::max_element(weights.begin(), weights.end());
  std::vector<std::uint32_t> scaled;
  for (const double weight : weights) {
    scaled.push_back(std::max<std::uint32_t>(
        1, static_cast<std::uint32_t>(std::lround(kServerWeightScale * weight / largest))));
  }
  if (std::all_of(scaled.begin(), scaled.end(), [&](auto w) { return w == scaled.front(); }))
    return {};
  return scaled;
}

namespace {

// `config` as its environment would spell it: Parse of this gives `config` back when every field
// holds a value its variable may take, and otherwise throws as Parse does, naming the variable.
SettingLookup SettingsOf(const ClusterConfig& config) {
  const auto text = [](bool on) { return std::string(on ? "1" : "0"); };
  std::vector<std::pair<std::string_view, std::string>> set = {
      {"DMLC_ROLE", RoleName(config.role)},
      {"DMLC_PS_ROOT_URI", config.root_uri},
      {"DMLC_PS_ROOT_PORT", std::to_string(config.root_port)},
      {"DMLC_NUM_SERVER", std::to_string(config.num_servers)},
      {"DMLC_NUM_WORKER", std::to_string(config.num_workers)},
      {"DMLC_NODE_HOST", config.node_host},
      {"DMLC_INTERFACE", config.interface},
      {"PS_VERBOSE", std::to_string(config.verbose)},
      {"DMLC_USE_KUBERNETES", text(config.use_kubernetes)},
      {"PS_CHUNK_BYTES", std::to_string(config.chunk_bytes)},
      {"PS_SERVER_WEIGHTS",
       config.server_weights.empty() ? "" : ServerWeightsText(config.server_weights)},
      {"PS_TCP_RCVBUF", std::to_string(config.tcp_receive_buffer)},
      {"PS_RANK", config.rank_hint < 0 ? "" : std::to_string(config.rank_hint)},
      {"PS_USE_IPC", text(config.use_ipc)},
      {"PS_USE_SHM", text(config.use_shm)},
      {"PS_SHM_MAX_SEGMENTS", std::to_string(config.shm_max_segments)},
      {"PS_REPLICATION", text(config.replication)},
      {"PS_IO_THREADS", std::to_string(config.io_threads)},
      {"PS_WAIT_SPIN_US", std::to_string(config.wait_spin.count())},
      {"PS_HEARTBEAT_INTERVAL", SecondsText(config.heartbeat_interval)},
      {"PS_HEARTBEAT_TIMEOUT", SecondsText(config.heartbeat_timeout)},
      {"PS_REGISTER_TIMEOUT", SecondsText(config.register_timeout)},
      {"PS_STALL_TIMEOUT", SecondsText(config.stall_timeout)},
      {"PS_JOB_SECRET", config.job_secret},
      {"PS_ENCRYPT", text(config.encrypt)},
      {"MXNET_KVSTORE_BIGARRAY_BOUND", std::to_string(config.big_array_bound)},
  };
  return [set = std::move(set)](std::string_view name) -> std::optional<std::string> {
    for (const auto& [variable, value] : set) {
      if (variable == name) return value.empty() ? std::nullopt : std::optional(value);
    }
    return std::nullopt;
  };
}

}  // namespace

void ClusterConfig::Validate() const {
  // A negative count or duration has no spelling Parse would take: named as such.
  if (heartbeat_interval.count() < 0 || heartbeat_timeout.count() < 0 ||
      register_timeout.count() < 0 || stall_timeout.count() < 0 || wait_spin.count() < 0) {
    throw Error(
        "invalid ClusterConfig: a duration is negative (heartbeat_interval, "
        "heartbeat_timeout, register_timeout, stall_timeout or wait_spin)");
  }
  try {
    static_cast<void>(Parse(SettingsOf(*this)));
  } catch (const Error& e) {
    throw Error(std::string("invalid ClusterConfig: ") + e.what() +
                " (each field is checked as the environment variable that config.h names beside "
                "it)");
  }
}

std::vector<ClusterConfig::SharedSetting> ClusterConfig::SharedSettings() const {
  return {
      {"DMLC_NUM_SERVER", std::to_string(num_servers)},
      {"DMLC_NUM_WORKER", std::to_string(num_workers)},
      {"PS_HEARTBEAT_INTERVAL", SecondsText(heartbeat_interval)},
      {"PS_HEARTBEAT_TIMEOUT", SecondsText(heartbeat_timeout)},
      {"PS_REPLICATION", replication ? "1" : "0"},
      {"MXNET_KVSTORE_BIGARRAY_BOUND", std::to_string(big_array_bound),
       SharedSetting::Among::kDataNodes},
      {"PS_CHUNK_BYTES", std::to_string(chunk_bytes), SharedSetting::Among::kDataNodes},
      {"PS_SERVER_WEIGHTS", ServerWeightsText(server_weights), SharedSetting::Among::kDataNodes},
      {kKVStoreTypeSetting, kvstore_type, SharedSetting::Among::kStoreWorkers},
  };
}

std::string EncodeSharedSettings(const std::vector<ClusterConfig::SharedSetting>& settings) {
  std::string text;
  for (const auto& setting : settings) {
    text.append(setting.name).append("=").append(setting.value).append("\n");
  }
  return text;
}

std::optional<std::vector<std::pair<std::string, std::string>>> ParseSharedSettings(
    std::string_view text) {
  std::vector<std::pair<std::string, std::string>> settings;
  while (!text.empty()) {
    const auto end = text.find('\n');
    if (end == std::string_view::npos) return std::nullopt;
    const std::string_view line = text.substr(0, end);
    const auto equals = line.find('=');
    if (equals == std::string_view::npos || equals == 0) return std::nullopt;
    settings.emplace_back(line.substr(0, equals), line.substr(equals + 1));
    text.remove_prefix(end + 1);
  }
  return settings;
}

}  // namespace ps
