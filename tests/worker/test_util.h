#pragma once
// Small helpers shared by the worker tests.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tests/util/temp_dir.h"
#include "worker/backend.h"
#include "worker/random.h"

namespace ps::worker::testing {

inline std::vector<float> RandomVector(std::size_t n, std::uint64_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937_64 rng(MixSeed(seed, 12345));
  std::vector<float> v(n);
  for (float& x : v) x = UniformFloat(rng, lo, hi);
  return v;
}

inline std::vector<std::int32_t> RandomLabels(std::size_t n, int classes, std::uint64_t seed) {
  std::mt19937_64 rng(MixSeed(seed, 777));
  std::vector<std::int32_t> v(n);
  for (auto& x : v)
    x = static_cast<std::int32_t>(UniformBelow(rng, static_cast<std::uint64_t>(classes)));
  return v;
}

template <typename T>
DeviceArray<T> Upload(Backend& backend, const std::vector<T>& host) {
  DeviceArray<T> dev(backend, host.size());
  dev.CopyFrom(std::span<const T>(host));
  return dev;
}

// Largest |a - b| relative to max(1, largest |a|): a scale-aware agreement measure.
inline double MaxScaledDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 1e-30;
  double diff = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return diff / std::max(scale, 1.0);
}

using ps::test::TempDir;

}  // namespace ps::worker::testing
