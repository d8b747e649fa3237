#pragma once
// Picks the compute backend from the --device flag.
#include <memory>
#include <string>

#include "worker/backend.h"

namespace ps::worker {

// True when this build compiled the CUDA backend (the toolkit was found at configure time).
bool BuiltWithCuda();

// What the CUDA runtime offers this process.
struct CudaProbe {
  int devices = 0;  // usable GPUs
  // True when there is no GPU to use at all: no CUDA in the build, no NVIDIA driver installed,
  // or no device. False with devices == 0: a driver is there but CUDA cannot use it (too old
  // for this runtime, a broken install): an error to report, not a CPU-only machine.
  bool gpu_absent = true;
  std::string why;  // why devices == 0
};
CudaProbe ProbeCuda();

// device: "auto" (CUDA when a GPU is present, else CPU; a GPU CUDA cannot use is a
// DeviceError), "cpu", "cuda" or "cuda:N".
// cuda_ordinal picks the GPU for "auto" and "cuda", modulo the GPU count (ps-train passes its
// index on its machine, PS_LOCAL_RANK, else its rank, spreading a machine's workers over its
// GPUs). Throws ConfigError for an unknown name
// and DeviceError when CUDA is asked for but not available ("no CUDA device found: use --device
// cpu").
std::unique_ptr<Backend> CreateBackend(const std::string& device, int cuda_ordinal = 0);

}  // namespace ps::worker
