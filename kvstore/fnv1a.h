#pragma once
// FNV-1a, 64 bits, over bytes added in any pieces: detects a flipped or lost byte and tells
// texts apart; not a defence against a forger.
#include <cstddef>
#include <cstdint>

namespace ps {

class Fnv1a {
 public:
  void Add(const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i) hash_ = (hash_ ^ p[i]) * 1099511628211ull;
  }
  std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 14695981039346656037ull;
};

}  // namespace ps
