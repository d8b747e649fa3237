#pragma once
// Settings misspelt in the environment. A variable of ours that is set under a wrong name is
// never read, and its default applies without a word: PS_HEARTBEAT_TIMOUT=1 runs with the 20 s
// timeout, PS_NUM_SERVER=2 leaves DMLC_NUM_SERVER unset. Every process of a role reads its
// settings from the environment once (ClusterConfig::FromEnvironment, the CLIs), and says so.
#include <functional>
#include <string>
#include <vector>

#include "ps/config.h"

namespace ps::internal {

struct MisspeltSetting {
  std::string set;    // the variable set, which nothing reads: "PS_HEARTBEAT_TIMOUT"
  std::string meant;  // the one it is close to: "PS_HEARTBEAT_TIMEOUT"
};

// The names among `names` (the environment's) that no part of ps reads but that are one or two
// letters from a setting's name, or that give a setting's name with another of our prefixes
// (PS_NUM_SERVER for DMLC_NUM_SERVER).
std::vector<MisspeltSetting> MisspeltSettings(const std::vector<std::string>& names);

// The names of the variables set in this process's environment.
std::vector<std::string> EnvironmentNames();

// "PS_HEARTBEAT_TIMOUT is set, but nothing reads it: a misspelling of PS_HEARTBEAT_TIMEOUT?
// (that one is unset, so its default applies)"
std::string MisspellingWarning(const MisspeltSetting& misspelt);

// `error` (a setting's error, "DMLC_NUM_SERVER is not set: ...") with a word on the misspelt
// variable that was meant as that setting, if one is set; else `error` as it is.
std::string WithMisspellingHint(const std::string& error,
                                const std::vector<MisspeltSetting>& misspelt);

// ClusterConfig::Parse(lookup), after a warning for each misspelt variable of the environment
// (FromEnvironment, and the CLIs with their flags). Its error goes through `explain` (the CLIs
// name the flag), then gets the misspelling's hint.
ClusterConfig ParseWithMisspellings(
    const SettingLookup& lookup,
    const std::function<std::string(const std::string&)>& explain = nullptr);

}  // namespace ps::internal
