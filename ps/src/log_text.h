#pragma once
// The text of the log lines and errors the runtime and the scheduler show users: durations as
// users write them, and which repeats of a problem get a log line.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <string_view>

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

// Text a peer sent, fit for one log line: bytes outside printable ASCII as \xNN (so that a
// hostile or corrupt message cannot forge lines or send terminal escapes), at most `max_chars`
// of them, then "...".
inline std::string PrintableText(std::string_view text, std::size_t max_chars = 300) {
  std::string out;
  for (const char c : text.substr(0, max_chars)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && byte != '\\') {
      out += c;
      continue;
    }
    char escaped[5];
    std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
    out += escaped;
  }
  if (text.size() > max_chars) out += "...";
  return out;
}

// What an exception that ends a process or a node says: its own text, but for one whose text
// names no cause a user can act on (std::bad_alloc's "std::bad_alloc").
inline std::string ExceptionText(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return "out of memory (" + std::string(e.what()) +
           "): give the process more memory (ulimit -v, its cgroup's memory.max, the "
           "machine's own), or spread the job's keys over more servers";
  }
  return e.what();
}

}  // namespace ps
