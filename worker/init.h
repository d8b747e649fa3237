#pragma once
// Deterministic weight initialization: the same seed gives the same weights on every worker,
// backend and toolchain (see random.h).
#include <cstdint>
#include <vector>

#include "worker/layers.h"

namespace ps::worker {

// The values InitParam writes, on the host. `stream` separates parameters of one model
// (the model passes the parameter's index).
std::vector<float> InitialValues(const Param& param, std::uint64_t seed, std::uint64_t stream);

// Writes InitialValues into param.value and zeroes param.grad.
void InitParam(Backend& backend, Param& param, std::uint64_t seed, std::uint64_t stream);

}  // namespace ps::worker
