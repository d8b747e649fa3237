#pragma once
// The CUDA backend: cuBLAS for matrix products, cuda_kernels.cu for everything else, all on one
// stream owned by the backend. Only built when the CUDA toolkit is found (PS_WORKER_HAVE_CUDA).
#include <memory>
#include <string>

#include "worker/backend.h"
#include "worker/device.h"

namespace ps::worker {

// ProbeCuda (device.h) in a build with CUDA.
CudaProbe ProbeCudaRuntime();

// Throws DeviceError when the device cannot be used.
std::unique_ptr<Backend> MakeCudaBackend(int ordinal);

}  // namespace ps::worker
