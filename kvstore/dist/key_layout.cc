#include "key_layout.h"

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

std::vector<KeySlice> KeyLayout::Slices(Key key, std::size_t length) const {
  if (length < bound_ || num_servers_ == 1) return {KeySlice{ServerOf(key), 0, length}};
  std::vector<KeySlice> slices;
  const auto servers = static_cast<std::size_t>(num_servers_);
  for (std::size_t s = 0; s < servers; ++s) {
    const std::size_t begin = length * s / servers;
    const std::size_t end = length * (s + 1) / servers;
    // Start the rotation at the key's own server so many big keys do not all put their
    // (one element) larger first slice on server 0.
    const int server = static_cast<int>((static_cast<std::size_t>(ServerOf(key)) + s) % servers);
    if (end > begin) slices.push_back(KeySlice{server, begin, end - begin});
  }
  return slices;
}

}  // namespace ps
