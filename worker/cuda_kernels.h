#pragma once
// Launchers for the worker's own CUDA kernels (cuda_kernels.cu). Each enqueues its kernel on
// `stream` and returns the launch status (cudaGetLastError); the math matches CpuBackend, and the
// geometry arguments mean what they mean in backend.h. Pointers are device memory.
#ifndef PS_CUDA_HOST_EMULATION  // (tests: cudaStream_t and cudaError_t come from the emulation)
#include <cuda_runtime.h>
#endif

#include <cstddef>
#include <cstdint>

#ifndef __CUDACC__  // ShapeOf, for the host-side callers (nvcc compiles C++17)
#include "worker/backend.h"
#endif

namespace ps::worker::cuda {

// Backend::ConvWorkspaceFloats of the CUDA backend, 64 MiB of im2col per convolution GEMM: the
// cnn's whole batch up to 107 images (one product per image left most of the GPU idle).
inline constexpr std::size_t kConvWorkspaceFloats = std::size_t{16} << 20;

cudaError_t Fill(float* x, std::size_t n, float value, cudaStream_t stream);
cudaError_t Axpy(std::size_t n, float alpha, const float* x, float* y, cudaStream_t stream);
cudaError_t Scale(std::size_t n, float alpha, float* x, cudaStream_t stream);
cudaError_t SgdUpdate(float* w, const float* g, float* mom, std::size_t n, float lr, float momentum,
                      float weight_decay, cudaStream_t stream);

cudaError_t AddBias(float* y, const float* bias, int batch, int channels, int spatial,
                    cudaStream_t stream);
// Blocks per channel BiasGrad uses; with more than one, its scratch holds channels * that
// many floats of partial sums (device memory, not read by the caller).
int BiasGradSplit(int batch, int spatial);
cudaError_t BiasGrad(const float* dy, float* dbias, int batch, int channels, int spatial,
                     float* scratch, cudaStream_t stream);
cudaError_t ReluForward(const float* x, float* y, std::size_t n, cudaStream_t stream);
cudaError_t ReluBackward(const float* y, const float* dy, float* dx, std::size_t n,
                         cudaStream_t stream);

// Pool geometry: planes = batch * channels, each height x width, window = stride.
cudaError_t MaxPoolForward(const float* x, float* y, int planes, int height, int width, int window,
                           cudaStream_t stream);
cudaError_t MaxPoolBackward(const float* x, const float* dy, float* dx, int planes, int height,
                            int width, int window, cudaStream_t stream);
cudaError_t AvgPoolForward(const float* x, float* y, int planes, int height, int width, int window,
                           cudaStream_t stream);
cudaError_t AvgPoolBackward(const float* dy, float* dx, int planes, int height, int width,
                            int window, cudaStream_t stream);

struct ConvShape {
  int channels, height, width, kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w, out_h, out_w;
};
#ifndef __CUDACC__
// The shape the conv kernels take for a backend's ConvGeometry.
inline ConvShape ShapeOf(const ConvGeometry& g) {
  return {g.channels, g.height,   g.width,    g.kernel_h,     g.kernel_w,   g.pad_h,
          g.pad_w,    g.stride_h, g.stride_w, g.out_height(), g.out_width()};
}
#endif
// `batch` images at once; col is [C*kh*kw, batch, out_h*out_w] (backend.h).
cudaError_t Im2Col(const float* x, float* col, int batch, const ConvShape& s, cudaStream_t stream);
cudaError_t Col2Im(const float* col, float* dx, int batch, const ConvShape& s, cudaStream_t stream);
// y[j, i, k] = x[i, j, k] for x laid out [d0, d1, inner].
cudaError_t SwapLeadingAxes(const float* x, float* y, int d0, int d1, int inner,
                            cudaStream_t stream);

// Writes probs, and per sample the cross-entropy loss[i] and correct[i] (0 or 1).
cudaError_t SoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                       float* probs, float* loss, std::int32_t* correct, int batch,
                                       int classes, cudaStream_t stream);
cudaError_t SoftmaxCrossEntropyBackward(const float* probs, const std::int32_t* labels,
                                        float* dlogits, int batch, int classes, float scale,
                                        cudaStream_t stream);

}  // namespace ps::worker::cuda
