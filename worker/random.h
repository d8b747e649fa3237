#pragma once
// Portable, seedable randomness. std::mt19937_64's output sequence is fixed by the standard,
// but the std distributions are not, so the helpers below derive integers and floats from the
// raw output themselves: the same seed gives the same shuffle and weights with any toolchain.
#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace ps::worker {

// Mixes a seed and a stream number into a well-spread 64-bit seed (SplitMix64 finalizer).
inline std::uint64_t MixSeed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (stream + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform integer in [0, bound) by rejection (no modulo bias); bound > 0.
inline std::uint64_t UniformBelow(std::mt19937_64& rng, std::uint64_t bound) {
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  std::uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

// Uniform float in [lo, hi) from the top 24 bits of one draw.
inline float UniformFloat(std::mt19937_64& rng, float lo, float hi) {
  const float unit = static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * unit;
}

// Fisher-Yates shuffle.
template <typename T>
void Shuffle(std::span<T> values, std::mt19937_64& rng) {
  for (std::size_t i = values.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(UniformBelow(rng, i));
    std::swap(values[i - 1], values[j]);
  }
}

}  // namespace ps::worker
