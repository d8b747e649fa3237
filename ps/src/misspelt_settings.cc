#include "ps/src/misspelt_settings.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>

#include "ps/error.h"
#include "ps/src/glog_or_stderr.h"

namespace ps::internal {
namespace {

// Every variable a process of this project reads at run time: the settings compared against,
// and the launcher's, the tools' and the tests' own, which are no misspelling of them.
constexpr std::array<std::string_view, 28> kSettings = {
    "DMLC_ROLE",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "DMLC_NUM_SERVER",
    "DMLC_NUM_WORKER",
    "DMLC_NODE_HOST",
    "DMLC_INTERFACE",
    "DMLC_USE_KUBERNETES",
    "MXNET_KVSTORE_BIGARRAY_BOUND",
    "PS_VERBOSE",
    "PS_CHUNK_BYTES",
    "PS_SERVER_WEIGHTS",
    "PS_HEARTBEAT_INTERVAL",
    "PS_HEARTBEAT_TIMEOUT",
    "PS_REGISTER_TIMEOUT",
    "PS_STALL_TIMEOUT",
    "PS_TCP_RCVBUF",
    "PS_USE_SHM",
    "PS_USE_IPC",
    "PS_REPLICATION",
    "PS_JOB_SECRET",
    "PS_JOB_SECRET_FILE",
    "PS_ENCRYPT",
    "PS_RANK",
    "PS_LOCAL_RANK",
    "PS_IO_THREADS",
    "PS_SHM_MAX_SEGMENTS",
    "PS_WAIT_SPIN_US",
};
constexpr std::array<std::string_view, 5> kOtherNames = {
    "PS_BIN_DIR", "PS_FAILOVER_RUNS", "PS_FAILOVER_MARK", "PS_BUILD_JOBS", "PS_PYTHON_DIR",
};
// Compared without them, so that a setting given another of our prefixes is caught.
constexpr std::array<std::string_view, 2> kPrefixes = {"DMLC_", "PS_"};

bool Known(std::string_view name) {
  return std::find(kSettings.begin(), kSettings.end(), name) != kSettings.end() ||
         std::find(kOtherNames.begin(), kOtherNames.end(), name) != kOtherNames.end();
}

std::string_view Stem(std::string_view name) {
  for (const std::string_view prefix : kPrefixes) {
    if (name.starts_with(prefix)) return name.substr(prefix.size());
  }
  return name;
}

bool OurPrefix(std::string_view name) {
  return name.starts_with("DMLC_") || name.starts_with("PS_") || name.starts_with("MXNET_KVSTORE_");
}

// Edits (insert, delete, replace, swap of neighbours) from a to b, counted up to `limit` + 1.
std::size_t Distance(std::string_view a, std::string_view b, std::size_t limit) {
  const std::size_t longer = std::max(a.size(), b.size());
  if (longer - std::min(a.size(), b.size()) > limit) return limit + 1;
  // Three rows of the optimal-string-alignment table.
  std::vector<std::size_t> before(b.size() + 1), previous(b.size() + 1), row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      row[j] = std::min({previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        row[j] = std::min(row[j], before[j - 2] + 1);
      }
    }
    before.swap(previous);
    previous.swap(row);
  }
  return std::min(previous[b.size()], limit + 1);
}

}  // namespace

std::vector<MisspeltSetting> MisspeltSettings(const std::vector<std::string>& names) {
  std::vector<MisspeltSetting> misspelt;
  for (const std::string& name : names) {
    if (!OurPrefix(name) || Known(name)) continue;
    const std::string_view stem = Stem(name);
    // Short stems differ from each other by a letter or two anyway (PS_RANK, PS_USE_SHM).
    const std::size_t limit = stem.size() >= 8 ? 2 : 1;
    std::string_view best;
    std::size_t best_distance = limit + 1;
    for (const std::string_view setting : kSettings) {
      const std::size_t distance = Distance(stem, Stem(setting), limit);
      if (distance < best_distance) {
        best = setting;
        best_distance = distance;
      }
    }
    if (!best.empty()) misspelt.push_back({name, std::string(best)});
  }
  return misspelt;
}

std::vector<std::string> EnvironmentNames() {
  std::vector<std::string> names;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    names.emplace_back(text.substr(0, text.find('=')));
  }
  return names;
}

std::string MisspellingWarning(const MisspeltSetting& misspelt) {
  const bool meant_set = std::getenv(misspelt.meant.c_str()) != nullptr;
  return misspelt.set + " is set, but nothing reads it: a misspelling of " + misspelt.meant +
         "? (" + misspelt.meant + (meant_set ? " is set too)" : " is not set)");
}

std::string WithMisspellingHint(const std::string& error,
                                const std::vector<MisspeltSetting>& misspelt) {
  for (const MisspeltSetting& entry : misspelt) {
    if (error.starts_with(entry.meant + " ")) {
      return error + "; " + entry.set + " is set: a misspelling of " + entry.meant + "?";
    }
  }
  return error;
}

ClusterConfig ParseWithMisspellings(const SettingLookup& lookup,
                                    const std::function<std::string(const std::string&)>& explain) {
  const std::vector<MisspeltSetting> misspelt = MisspeltSettings(EnvironmentNames());
  for (const MisspeltSetting& entry : misspelt) PS_LOG(WARNING) << MisspellingWarning(entry);
  try {
    return ClusterConfig::Parse(lookup);
  } catch (const Error& e) {
    throw Error(WithMisspellingHint(explain ? explain(e.what()) : e.what(), misspelt));
  }
}

}  // namespace ps::internal
