#pragma once
// The CUDA backend: cuBLAS for matrix products, cuda_kernels.cu for everything else, all on one
// stream owned by the backend. Only built when the CUDA toolkit is found (PS_WORKER_HAVE_CUDA).
#include <memory>
#include <string>

#include "worker/backend.h"

namespace ps::worker {

// Number of CUDA devices the runtime sees; 0 when there is no GPU or no driver. *why, when
// given, receives the runtime's reason for 0.
int CudaDeviceCountOrZero(std::string* why);

// Throws DeviceError when the device cannot be used.
std::unique_ptr<Backend> MakeCudaBackend(int ordinal);

}  // namespace ps::worker
