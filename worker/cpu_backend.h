#pragma once
// The CPU backend: OpenBLAS sgemm for matrix products, straightforward loops for the rest.
// It is also the reference the CUDA kernels are tested against.
#include <memory>

#include "worker/backend.h"

namespace ps::worker {

std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace ps::worker
