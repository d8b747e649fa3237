#include "worker/init.h"

#include <cmath>
#include <random>
#include <span>

#include "worker/random.h"

namespace ps::worker {

std::vector<float> InitialValues(const Param& param, std::uint64_t seed, std::uint64_t stream) {
  std::vector<float> values(param.size(), 0.0f);
  float limit = 0.0f;
  switch (param.init) {
    case InitKind::kZero:
      return values;
    case InitKind::kHeUniform:
      limit = std::sqrt(6.0f / static_cast<float>(param.fan_in));
      break;
    case InitKind::kXavierUniform:
      limit = std::sqrt(6.0f / static_cast<float>(param.fan_in + param.fan_out));
      break;
  }
  std::mt19937_64 rng(MixSeed(seed, stream));
  for (float& v : values) v = UniformFloat(rng, -limit, limit);
  return values;
}

void InitParam(Backend& backend, Param& param, std::uint64_t seed, std::uint64_t stream) {
  const std::vector<float> values = InitialValues(param, seed, stream);
  param.value.CopyFrom(std::span<const float>(values));
  backend.Fill(param.grad.data(), param.grad.size(), 0.0f);
}

}  // namespace ps::worker
