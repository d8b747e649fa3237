#pragma once
// A node's ClusterConfig from DMLC_*/PS_* settings given as a map (the environment a test
// hands its processes), parsed as a process would parse its environment.
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ps/config.h"

namespace ps::test {

inline ClusterConfig ConfigFromSettings(const std::map<std::string, std::string>& settings) {
  return ClusterConfig::Parse([&](std::string_view name) -> std::optional<std::string> {
    const auto it = settings.find(std::string(name));
    if (it == settings.end()) return std::nullopt;
    return it->second;
  });
}

}  // namespace ps::test
