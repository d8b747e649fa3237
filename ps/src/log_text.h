#pragma once
// The text of the log lines and errors the runtime and the scheduler show users: durations as
// users write them, and which repeats of a problem get a log line.
#include <chrono>
#include <cstdint>
#include <string>

namespace ps {

// "1.5 s", "20 s": a duration as users wrote it in PS_*_TIMEOUT.
inline std::string FormatSeconds(std::chrono::milliseconds ms) {
  const auto tenths = ms.count() / 100;
  return std::to_string(tenths / 10) + (tenths % 10 ? "." + std::to_string(tenths % 10) : "") +
         " s";
}

// Whether the count-th occurrence (from 1) of a repeated problem gets a log line: the first
// ten, then every 1000th, so that a peer sending bad messages in a loop cannot flood the log.
inline bool LogOccurrence(std::uint64_t count) { return count <= 10 || count % 1000 == 0; }

}  // namespace ps
