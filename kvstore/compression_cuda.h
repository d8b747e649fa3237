#pragma once
// Gradient compression on a GPU: a push's residual kept in device memory beside the gradient,
// and the CUDA kernels of compression_kernels.cuh that encode one into the other, so that only
// the codes cross to the host. Built only with CUDA (PS_KVSTORE_CUDA); C++17, for nvcc.
//
// Threads: a DeviceResidual is used by one thread at a time (its owner's lock). The kernels run
// on the legacy default stream, like the store's copies (so a gradient its producer's stream
// finished, as the KVStore's buffer rule asks, is complete); Encode returns once the codes
// are in host memory.
#include <cstddef>
#include <cstdint>

#include "kvstore/compression_codec.h"

namespace ps::compression::gpu {

class DeviceResidual {
 public:
  // A zeroed residual of n floats on GPU `device`, with the encoder's scratch. Throws ps::Error
  // naming CUDA's reason (no memory, no such device).
  DeviceResidual(int device, std::size_t n);
  ~DeviceResidual();
  DeviceResidual(const DeviceResidual&) = delete;
  DeviceResidual& operator=(const DeviceResidual&) = delete;

  int device() const { return device_; }
  // The residual from / to host memory (n floats): when pushes move between a GPU and the CPU.
  void Upload(const float* host);
  void Download(float* host) const;
  // Encodes n gradients at `grad` (device memory of this GPU) with the residual, and copies the
  // EncodedBytes(codec, n) bytes of codes to `host_out`. Throws ps::Error.
  void Encode(Codec codec, float threshold, const float* grad, std::byte* host_out);

 private:
  int device_;
  std::size_t n_;
  float* residual_ = nullptr;
  std::uint8_t* codes_ = nullptr;  // the largest encoding of n values
  double* partials_ = nullptr;     // 1bit's per-group sums
};

}  // namespace ps::compression::gpu
