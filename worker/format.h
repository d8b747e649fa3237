#pragma once
// printf-style formatting into a std::string: ps-train's log lines, JSON numbers and messages.
#include <cstdio>
#include <string>

namespace ps::worker {

template <typename... Args>
std::string Format(const char* fmt, Args... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string out(static_cast<std::size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, fmt, args...);
  return out;
}

}  // namespace ps::worker
