#pragma once
// The CUDA kernels that encode a gradient where it lives, on its GPU, with its residual there
// too: only the codes are copied to the host (compression_cuda.cu). Each kernel follows the
// per-element rules of compression_codec.h, as the CPU loops of compression.cc do, so both
// produce the same bytes and residuals. The scale of 1bit is summed in the same fixed order as
// on the CPU: one thread per group of kScaleGroup values, then one thread over the groups.
//
// Compiled by nvcc (compression_cuda.cu) and, for machines without a GPU, on the host under
// tests/worker/cuda_host_emulation.h (define PS_CUDA_HOST_EMULATION and include that first):
// tests/worker/test_compression_kernels.cc checks the very same kernel bodies there.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvstore/compression_codec.h"

#ifdef PS_CUDA_HOST_EMULATION
#define PS_COMPRESSION_LAUNCH(kernel, blocks, threads, stream, ...) \
  ::ps::cuda_emulation::Launch((blocks), (threads), (stream), kernel, __VA_ARGS__)
#else
#define PS_COMPRESSION_LAUNCH(kernel, blocks, threads, stream, ...) \
  kernel<<<(blocks), (threads), 0, (stream)>>>(__VA_ARGS__)
#endif

#define PS_COMPRESSION_GRID_STRIDE(i, n)                                                         \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x)

namespace ps::compression::kernels {

constexpr unsigned kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

inline unsigned Blocks(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// Doubles of scratch the 1bit encoder needs for n values (one per group).
inline std::size_t ScaleGroups(std::size_t n) {
  return (n + codec::kScaleGroup - 1) / codec::kScaleGroup;
}

// One thread per output byte (4 values); the padding of the last word is written as zero.
__global__ void Encode2BitKernel(const float* grad, float* residual, std::size_t n, float threshold,
                                 std::uint8_t* out, std::size_t out_bytes) {
  PS_COMPRESSION_GRID_STRIDE(b, out_bytes) {
    unsigned byte = 0;
    for (std::size_t i = 4 * b; i < 4 * b + 4 && i < n; ++i) {
      float rest;
      const unsigned code = codec::TwoBitCode(residual[i] + grad[i], threshold, &rest);
      residual[i] = rest;
      byte |= code << codec::TwoBitShift(i);
    }
    out[b] = static_cast<std::uint8_t>(byte);
  }
}

// 1bit, step 1: one thread per group sums the magnitudes of residual + gradient, in order.
__global__ void ScalePartialsKernel(const float* grad, const float* residual, std::size_t n,
                                    double* partials, std::size_t groups) {
  PS_COMPRESSION_GRID_STRIDE(g, groups) {
    const std::size_t begin = g * codec::kScaleGroup;
    const std::size_t end = begin + codec::kScaleGroup < n ? begin + codec::kScaleGroup : n;
    double sum = 0.0;
    for (std::size_t i = begin; i < end; ++i) sum += codec::Magnitude(residual[i] + grad[i]);
    partials[g] = sum;
  }
}

// 1bit, step 2: one thread adds the groups' sums in order and writes the scale (out[0..3]).
__global__ void ScaleKernel(const double* partials, std::size_t groups, std::size_t n,
                            std::uint8_t* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0.0;
  for (std::size_t g = 0; g < groups; ++g) total += partials[g];
  const float scale = codec::OneBitScale(total, n);
  std::memcpy(out, &scale, sizeof(scale));
}

// 1bit, step 3: one thread per output byte (8 values): the signs, and the residuals.
__global__ void Encode1BitKernel(const float* grad, float* residual, std::size_t n,
                                 std::uint8_t* out, std::size_t bit_bytes) {
  float scale;
  std::memcpy(&scale, out, sizeof(scale));
  std::uint8_t* bits = out + codec::kScaleBytes;
  PS_COMPRESSION_GRID_STRIDE(b, bit_bytes) {
    unsigned byte = 0;
    for (std::size_t i = 8 * b; i < 8 * b + 8 && i < n; ++i) {
      const float acc = residual[i] + grad[i];
      const bool positive = codec::OneBitPositive(acc);
      residual[i] = acc - (positive ? scale : -scale);
      byte |= (positive ? 1u : 0u) << codec::OneBitShift(i);
    }
    bits[b] = static_cast<std::uint8_t>(byte);
  }
}

__global__ void EncodeFp16Kernel(const float* grad, float* residual, std::size_t n,
                                 std::uint8_t* out) {
  PS_COMPRESSION_GRID_STRIDE(i, n) {
    const float acc = residual[i] + grad[i];
    const std::uint16_t h = codec::FloatToHalf(acc);
    residual[i] = acc - codec::HalfToFloat(h);
    std::memcpy(out + 2 * i, &h, sizeof(h));
  }
}

// Encodes n gradients with their residual into out (EncodedBytes(codec, n) bytes), all in
// device memory; `partials` holds ScaleGroups(n) doubles (1bit only). Kernels are queued on
// `stream`; returns the launch status.
inline cudaError_t Encode(Codec codec, float threshold, const float* grad, float* residual,
                          std::size_t n, std::uint8_t* out, double* partials, cudaStream_t stream) {
  switch (codec) {
    case Codec::k2Bit: {
      const std::size_t bytes =
          (n + codec::k2BitValuesPerWord - 1) / codec::k2BitValuesPerWord * codec::kWordBytes;
      PS_COMPRESSION_LAUNCH(Encode2BitKernel, Blocks(bytes), kThreads, stream, grad, residual, n,
                            threshold, out, bytes);
      break;
    }
    case Codec::k1Bit: {
      const std::size_t groups = ScaleGroups(n);
      const std::size_t bytes =
          (n + codec::k1BitValuesPerWord - 1) / codec::k1BitValuesPerWord * codec::kWordBytes;
      PS_COMPRESSION_LAUNCH(ScalePartialsKernel, Blocks(groups), kThreads, stream, grad, residual,
                            n, partials, groups);
      PS_COMPRESSION_LAUNCH(ScaleKernel, 1u, 1u, stream, static_cast<const double*>(partials),
                            groups, n, out);
      PS_COMPRESSION_LAUNCH(Encode1BitKernel, Blocks(bytes), kThreads, stream, grad, residual, n,
                            out, bytes);
      break;
    }
    case Codec::kFp16:
      PS_COMPRESSION_LAUNCH(EncodeFp16Kernel, Blocks(n), kThreads, stream, grad, residual, n, out);
      break;
    case Codec::kNone:
      break;
  }
  return cudaGetLastError();
}

}  // namespace ps::compression::kernels
