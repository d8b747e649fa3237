#pragma once
// Picks the compute backend from the --device flag.
#include <memory>
#include <string>

#include "worker/backend.h"

namespace ps::worker {

// True when this build compiled the CUDA backend (the toolkit was found at configure time).
bool BuiltWithCuda();

// Number of usable CUDA devices: 0 without CUDA support in the build, without a driver or
// without a GPU. *why, when given, receives the reason for 0.
int CudaDeviceCount(std::string* why = nullptr);

// device: "auto" (CUDA when a GPU is present, else CPU), "cpu", "cuda" or "cuda:N".
// cuda_ordinal picks the GPU for "auto" and "cuda", modulo the GPU count (ps-train passes its
// rank, spreading the workers of one machine over its GPUs). Throws ConfigError for an unknown name
// and DeviceError when CUDA is asked for but not available ("no CUDA device found: use --device
// cpu").
std::unique_ptr<Backend> CreateBackend(const std::string& device, int cuda_ordinal = 0);

}  // namespace ps::worker
