#pragma once
// Small text helpers for messages the runtime and the scheduler show users.
#include <chrono>
#include <string>

namespace ps {

// "1.5 s", "20 s": a duration as users wrote it in PS_*_TIMEOUT.
inline std::string FormatSeconds(std::chrono::milliseconds ms) {
  const auto tenths = ms.count() / 100;
  return std::to_string(tenths / 10) + (tenths % 10 ? "." + std::to_string(tenths % 10) : "") +
         " s";
}

}  // namespace ps
