#include "kvstore/dist/key_layout.h"

#include <algorithm>

namespace ps {
namespace {

// splitmix64's finalizer: consecutive keys (the common case: one per layer) land on
// servers that look random, so loads come out even.
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

int KeyLayout::ServerOf(Key key) const {
  return static_cast<int>(Mix(key) % static_cast<std::uint64_t>(num_servers_));
}

std::vector<KeySlice> KeyLayout::Slices(Key key, std::size_t length,
                                        std::size_t element_bytes) const {
  if (length < bound_) return {KeySlice{ServerOf(key), 0, length}};
  const auto servers = static_cast<std::size_t>(num_servers_);
  const std::size_t chunk_elements = std::max<std::size_t>(1, chunk_bytes_ / element_bytes);
  const std::size_t pieces =
      std::max<std::size_t>(servers, (length + chunk_elements - 1) / chunk_elements);
  std::vector<KeySlice> slices;
  for (std::size_t p = 0; p < pieces; ++p) {
    const std::size_t begin = length * p / pieces;
    const std::size_t end = length * (p + 1) / pieces;
    // Start the rotation at the key's own server so many big keys do not all put their first
    // (possibly one element larger) slice on server 0.
    const int server = static_cast<int>((static_cast<std::size_t>(ServerOf(key)) + p) % servers);
    if (end > begin) slices.push_back(KeySlice{server, begin, end - begin});
  }
  return slices;
}

}  // namespace ps
