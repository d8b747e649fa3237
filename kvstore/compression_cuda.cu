// DeviceResidual: compression_kernels.cuh run on a GPU (see compression_cuda.h).
#include <cuda_runtime_api.h>

#include <string>

#include "kvstore/compression_cuda.h"
#include "kvstore/compression_kernels.cuh"
#include "ps/error.h"

namespace ps::compression::gpu {
namespace {

void Check(cudaError_t status, const char* what, int device) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it, so that the caller's next CUDA call is not blamed for it
    throw Error(std::string("gradient compression: ") + what +
                " on cuda:" + std::to_string(device) + " failed: " + cudaGetErrorString(status));
  }
}

// Makes `device` current on the calling thread when it is not (and leaves it so, as the
// store's copies do: device_memory.cc says why).
void UseDevice(int device) {
  int current = -1;
  Check(cudaGetDevice(&current), "reading the current device", device);
  if (current != device) Check(cudaSetDevice(device), "selecting the device", device);
}

std::size_t LargestEncoding(std::size_t n) {
  const std::size_t fp16 = 2 * n;
  const std::size_t one_bit = codec::kScaleBytes + (n + codec::k1BitValuesPerWord - 1) /
                                                       codec::k1BitValuesPerWord *
                                                       codec::kWordBytes;
  const std::size_t two_bit =
      (n + codec::k2BitValuesPerWord - 1) / codec::k2BitValuesPerWord * codec::kWordBytes;
  std::size_t most = fp16 > one_bit ? fp16 : one_bit;
  return most > two_bit ? most : two_bit;
}

std::size_t EncodedBytesOf(Codec codec, std::size_t n) {
  switch (codec) {
    case Codec::k2Bit:
      return (n + codec::k2BitValuesPerWord - 1) / codec::k2BitValuesPerWord * codec::kWordBytes;
    case Codec::k1Bit:
      return codec::kScaleBytes +
             (n + codec::k1BitValuesPerWord - 1) / codec::k1BitValuesPerWord * codec::kWordBytes;
    case Codec::kFp16:
      return 2 * n;
    case Codec::kNone:
      break;
  }
  return 0;
}

}  // namespace

DeviceResidual::DeviceResidual(int device, std::size_t n) : device_(device), n_(n) {
  UseDevice(device_);
  try {
    Check(cudaMalloc(reinterpret_cast<void**>(&residual_), n_ * sizeof(float)),
          "allocating the residual", device_);
    Check(cudaMemset(residual_, 0, n_ * sizeof(float)), "zeroing the residual", device_);
    Check(cudaMalloc(reinterpret_cast<void**>(&codes_), LargestEncoding(n_)),
          "allocating the codes", device_);
    Check(
        cudaMalloc(reinterpret_cast<void**>(&partials_), kernels::ScaleGroups(n_) * sizeof(double)),
        "allocating the scale's sums", device_);
  } catch (...) {
    cudaFree(partials_);
    cudaFree(codes_);
    cudaFree(residual_);
    throw;
  }
}

DeviceResidual::~DeviceResidual() {
  // Freed on its own device; a failure here (the context is gone) has nothing left to free.
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != device_) cudaSetDevice(device_);
  cudaFree(partials_);
  cudaFree(codes_);
  cudaFree(residual_);
  cudaGetLastError();
}

void DeviceResidual::Upload(const float* host) {
  UseDevice(device_);
  Check(cudaMemcpy(residual_, host, n_ * sizeof(float), cudaMemcpyHostToDevice),
        "copying the residual to the device", device_);
}

void DeviceResidual::Download(float* host) const {
  UseDevice(device_);
  Check(cudaMemcpy(host, residual_, n_ * sizeof(float), cudaMemcpyDeviceToHost),
        "copying the residual to the host", device_);
}

void DeviceResidual::Encode(Codec codec, float threshold, const float* grad, std::byte* host_out) {
  UseDevice(device_);
  Check(kernels::Encode(codec, threshold, grad, residual_, n_, codes_, partials_, nullptr),
        "launching the encoder", device_);
  // On the legacy stream, after the kernels: only the codes cross to the host.
  Check(cudaMemcpy(host_out, codes_, EncodedBytesOf(codec, n_), cudaMemcpyDeviceToHost),
        "copying the codes to the host", device_);
}

}  // namespace ps::compression::gpu
