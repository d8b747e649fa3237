// The worker's CUDA kernels. Grid-stride loops everywhere, so any launch size covers any n.
// Every kernel is deterministic: reductions use a fixed tree, and backward passes gather (each
// thread writes its own output element) instead of scattering with atomics.
#include "worker/cuda_kernels.h"
#include "worker/cuda_launch.h"

namespace ps::worker::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;
// BiasGrad: at least this many elements per block, and at most this many blocks per channel
// (so that the few channels of a conv layer still fill the GPU).
constexpr std::size_t kBiasGradSpan = 2048;
constexpr std::size_t kMaxBiasGradSplit = 64;

unsigned Blocks(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

#define PS_GRID_STRIDE(i, n)                                                                     \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x)

__global__ void FillKernel(float* x, std::size_t n, float value) {
  PS_GRID_STRIDE(i, n) { x[i] = value; }
}

__global__ void AxpyKernel(std::size_t n, float alpha, const float* x, float* y) {
  PS_GRID_STRIDE(i, n) { y[i] += alpha * x[i]; }
}

__global__ void ScaleKernel(std::size_t n, float alpha, float* x) {
  PS_GRID_STRIDE(i, n) { x[i] *= alpha; }
}

__global__ void SgdKernel(float* w, const float* g, std::size_t n, float lr, float wd) {
  PS_GRID_STRIDE(i, n) { w[i] -= lr * (g[i] + wd * w[i]); }
}

__global__ void SgdMomentumKernel(float* w, const float* g, float* mom, std::size_t n, float lr,
                                  float momentum, float wd) {
  PS_GRID_STRIDE(i, n) {
    const float m = momentum * mom[i] - lr * (g[i] + wd * w[i]);
    mom[i] = m;
    w[i] += m;
  }
}

__global__ void AddBiasKernel(float* y, const float* bias, std::size_t n, int channels,
                              int spatial) {
  PS_GRID_STRIDE(i, n) { y[i] += bias[(i / spatial) % channels]; }
}

// Block k of channels * split blocks sums part k % split of channel k / split: the elements
// t = part * blockDim + thread, + blockDim * split, ... of the channel's batch * spatial, so
// each pass of a block reads blockDim consecutive floats. A fixed-shape tree sum in shared
// memory: deterministic. With split 1 it writes dbias directly.
__global__ void BiasGradPartialKernel(const float* dy, float* out, int batch, int channels,
                                      int spatial, int split) {
  __shared__ float partial[kThreads];
  const int c = static_cast<int>(blockIdx.x) / split;
  const int part = static_cast<int>(blockIdx.x) % split;
  const std::size_t count = static_cast<std::size_t>(batch) * spatial;
  float sum = 0.0f;
  for (std::size_t t = static_cast<std::size_t>(part) * blockDim.x + threadIdx.x; t < count;
       t += static_cast<std::size_t>(blockDim.x) * split) {
    const std::size_t i = t / spatial;
    const std::size_t s = t % spatial;
    sum += dy[(i * channels + c) * spatial + s];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

// dbias[c] = the sum of channel c's split partial sums, in order.
__global__ void BiasGradFinishKernel(const float* partials, float* dbias, int channels, int split) {
  PS_GRID_STRIDE(c, static_cast<std::size_t>(channels)) {
    float sum = 0.0f;
    for (int part = 0; part < split; ++part) sum += partials[c * split + part];
    dbias[c] = sum;
  }
}

__global__ void ReluForwardKernel(const float* x, float* y, std::size_t n) {
  PS_GRID_STRIDE(i, n) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
}

__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, std::size_t n) {
  PS_GRID_STRIDE(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

// Index (within the plane) of the first maximum of window (oy, ox), row-major order.
__device__ int WindowArgmax(const float* plane, int width, int oy, int ox, int window) {
  int best = oy * window * width + ox * window;
  for (int i = 0; i < window; ++i) {
    for (int j = 0; j < window; ++j) {
      const int idx = (oy * window + i) * width + ox * window + j;
      if (plane[idx] > plane[best]) best = idx;
    }
  }
  return best;
}

__global__ void MaxPoolForwardKernel(const float* x, float* y, int planes, int height, int width,
                                     int window) {
  const int oh = height / window;
  const int ow = width / window;
  const std::size_t n = static_cast<std::size_t>(planes) * oh * ow;
  PS_GRID_STRIDE(o, n) {
    const std::size_t p = o / (oh * ow);
    const int oy = static_cast<int>(o % (oh * ow)) / ow;
    const int ox = static_cast<int>(o % ow);
    const float* plane = x + p * height * width;
    y[o] = plane[WindowArgmax(plane, width, oy, ox, window)];
  }
}

// One thread per input pixel: it receives dy if it is its window's argmax, else 0.
__global__ void MaxPoolBackwardKernel(const float* x, const float* dy, float* dx, int planes,
                                      int height, int width, int window) {
  const int oh = height / window;
  const int ow = width / window;
  const std::size_t n = static_cast<std::size_t>(planes) * height * width;
  PS_GRID_STRIDE(i, n) {
    const std::size_t p = i / (static_cast<std::size_t>(height) * width);
    const int pos = static_cast<int>(i % (static_cast<std::size_t>(height) * width));
    const int oy = pos / width / window;
    const int ox = pos % width / window;
    float v = 0.0f;
    if (oy < oh && ox < ow) {
      const float* plane = x + p * height * width;
      if (WindowArgmax(plane, width, oy, ox, window) == pos) {
        v = dy[(p * oh + oy) * ow + ox];
      }
    }
    dx[i] = v;
  }
}

__global__ void AvgPoolForwardKernel(const float* x, float* y, int planes, int height, int width,
                                     int window) {
  const int oh = height / window;
  const int ow = width / window;
  const float inv = 1.0f / static_cast<float>(window * window);
  const std::size_t n = static_cast<std::size_t>(planes) * oh * ow;
  PS_GRID_STRIDE(o, n) {
    const std::size_t p = o / (oh * ow);
    const int oy = static_cast<int>(o % (oh * ow)) / ow;
    const int ox = static_cast<int>(o % ow);
    const float* plane = x + p * height * width;
    float sum = 0.0f;
    for (int i = 0; i < window; ++i) {
      for (int j = 0; j < window; ++j) sum += plane[(oy * window + i) * width + ox * window + j];
    }
    y[o] = sum * inv;
  }
}

__global__ void AvgPoolBackwardKernel(const float* dy, float* dx, int planes, int height, int width,
                                      int window) {
  const int oh = height / window;
  const int ow = width / window;
  const float inv = 1.0f / static_cast<float>(window * window);
  const std::size_t n = static_cast<std::size_t>(planes) * height * width;
  PS_GRID_STRIDE(i, n) {
    const std::size_t p = i / (static_cast<std::size_t>(height) * width);
    const int pos = static_cast<int>(i % (static_cast<std::size_t>(height) * width));
    const int oy = pos / width / window;
    const int ox = pos % width / window;
    dx[i] = (oy < oh && ox < ow) ? dy[(p * oh + oy) * ow + ox] * inv : 0.0f;
  }
}

// One thread per element of col [rows, batch, pixels] (consecutive threads, consecutive
// output pixels: coalesced writes).
__global__ void Im2ColKernel(const float* x, float* col, int batch, ConvShape s) {
  const std::size_t cols = static_cast<std::size_t>(s.out_h) * s.out_w;
  const std::size_t image = static_cast<std::size_t>(s.channels) * s.height * s.width;
  const std::size_t n =
      static_cast<std::size_t>(s.channels) * s.kernel_h * s.kernel_w * batch * cols;
  PS_GRID_STRIDE(idx, n) {
    const std::size_t row_image = idx / cols;  // row * batch + image
    const int colpos = static_cast<int>(idx % cols);
    const int img = static_cast<int>(row_image % batch);
    const int row = static_cast<int>(row_image / batch);
    const int j = row % s.kernel_w;
    const int i = row / s.kernel_w % s.kernel_h;
    const int c = row / (s.kernel_w * s.kernel_h);
    const int oy = colpos / s.out_w;
    const int ox = colpos % s.out_w;
    const int iy = oy * s.stride_h - s.pad_h + i;
    const int ix = ox * s.stride_w - s.pad_w + j;
    const bool inside = iy >= 0 && iy < s.height && ix >= 0 && ix < s.width;
    col[idx] = inside
                   ? x[img * image + (static_cast<std::size_t>(c) * s.height + iy) * s.width + ix]
                   : 0.0f;
  }
}

// One thread per input pixel, summing every col entry that read it (gather, no atomics).
__global__ void Col2ImKernel(const float* col, float* dx, int batch, ConvShape s) {
  const std::size_t cols = static_cast<std::size_t>(s.out_h) * s.out_w;
  const std::size_t plane = static_cast<std::size_t>(s.width) * s.height;
  const std::size_t n = static_cast<std::size_t>(batch) * s.channels * plane;
  PS_GRID_STRIDE(idx, n) {
    const int x = static_cast<int>(idx % s.width);
    const int y = static_cast<int>(idx / s.width % s.height);
    const int c = static_cast<int>(idx / plane % s.channels);
    const int img = static_cast<int>(idx / (plane * s.channels));
    float sum = 0.0f;
    for (int i = 0; i < s.kernel_h; ++i) {
      const int ty = y + s.pad_h - i;  // = oy * stride_h
      if (ty < 0 || ty % s.stride_h != 0) continue;
      const int oy = ty / s.stride_h;
      if (oy >= s.out_h) continue;
      for (int j = 0; j < s.kernel_w; ++j) {
        const int tx = x + s.pad_w - j;
        if (tx < 0 || tx % s.stride_w != 0) continue;
        const int ox = tx / s.stride_w;
        if (ox >= s.out_w) continue;
        const std::size_t row = (static_cast<std::size_t>(c) * s.kernel_h + i) * s.kernel_w + j;
        sum += col[(row * batch + img) * cols + oy * s.out_w + ox];
      }
    }
    dx[idx] = sum;
  }
}

// One thread per output element, so the writes are coalesced (inner runs are the pixels of one
// image, long enough for the reads to coalesce too).
__global__ void SwapLeadingAxesKernel(const float* x, float* y, int d0, int d1, int inner) {
  const std::size_t n = static_cast<std::size_t>(d0) * d1 * inner;
  PS_GRID_STRIDE(o, n) {
    const std::size_t k = o % inner;
    const std::size_t ji = o / inner;  // j * d0 + i
    const std::size_t i = ji % d0;
    const std::size_t j = ji / d0;
    y[o] = x[(i * d1 + j) * inner + k];
  }
}

// One thread per sample: the class count is small (10).
__global__ void SoftmaxForwardKernel(const float* logits, const std::int32_t* labels, float* probs,
                                     float* loss, std::int32_t* correct, int batch, int classes) {
  PS_GRID_STRIDE(i, static_cast<std::size_t>(batch)) {
    const float* row = logits + i * classes;
    float* prob = probs + i * classes;
    int argmax = 0;
    for (int k = 1; k < classes; ++k) {
      if (row[k] > row[argmax]) argmax = k;
    }
    const float max = row[argmax];
    float sum = 0.0f;
    for (int k = 0; k < classes; ++k) {
      prob[k] = expf(row[k] - max);
      sum += prob[k];
    }
    const float inv = 1.0f / sum;
    for (int k = 0; k < classes; ++k) prob[k] *= inv;
    const int label = labels[i];
    const bool valid = label >= 0 && label < classes;
    loss[i] = valid ? logf(sum) - (row[label] - max) : 0.0f;
    correct[i] = (valid && argmax == label) ? 1 : 0;
  }
}

__global__ void SoftmaxBackwardKernel(const float* probs, const std::int32_t* labels,
                                      float* dlogits, int batch, int classes, float scale) {
  const std::size_t n = static_cast<std::size_t>(batch) * classes;
  PS_GRID_STRIDE(idx, n) {
    const std::size_t i = idx / classes;
    const int k = static_cast<int>(idx % classes);
    dlogits[idx] = scale * (probs[idx] - (k == labels[i] ? 1.0f : 0.0f));
  }
}

#undef PS_GRID_STRIDE

}  // namespace

cudaError_t Fill(float* x, std::size_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(FillKernel, Blocks(n), kThreads, stream, x, n, value);
  return cudaGetLastError();
}

cudaError_t Axpy(std::size_t n, float alpha, const float* x, float* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(AxpyKernel, Blocks(n), kThreads, stream, n, alpha, x, y);
  return cudaGetLastError();
}

cudaError_t Scale(std::size_t n, float alpha, float* x, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(ScaleKernel, Blocks(n), kThreads, stream, n, alpha, x);
  return cudaGetLastError();
}

cudaError_t SgdUpdate(float* w, const float* g, float* mom, std::size_t n, float lr, float momentum,
                      float weight_decay, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (momentum == 0.0f || mom == nullptr) {
    PS_LAUNCH(SgdKernel, Blocks(n), kThreads, stream, w, g, n, lr, weight_decay);
  } else {
    PS_LAUNCH(SgdMomentumKernel, Blocks(n), kThreads, stream, w, g, mom, n, lr, momentum,
              weight_decay);
  }
  return cudaGetLastError();
}

cudaError_t AddBias(float* y, const float* bias, int batch, int channels, int spatial,
                    cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(batch) * channels * spatial;
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(AddBiasKernel, Blocks(n), kThreads, stream, y, bias, n, channels, spatial);
  return cudaGetLastError();
}

int BiasGradSplit(int batch, int spatial) {
  const std::size_t count = static_cast<std::size_t>(batch) * spatial;
  const std::size_t split = (count + kBiasGradSpan - 1) / kBiasGradSpan;
  return static_cast<int>(split < 1 ? 1 : (split > kMaxBiasGradSplit ? kMaxBiasGradSplit : split));
}

cudaError_t BiasGrad(const float* dy, float* dbias, int batch, int channels, int spatial,
                     float* scratch, cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  const int split = BiasGradSplit(batch, spatial);
  const auto blocks = static_cast<unsigned>(channels * split);
  PS_LAUNCH_SYNCED(BiasGradPartialKernel, blocks, kThreads, stream, dy,
                   split == 1 ? dbias : scratch, batch, channels, spatial, split);
  if (split > 1) {
    PS_LAUNCH(BiasGradFinishKernel, Blocks(static_cast<std::size_t>(channels)), kThreads, stream,
              static_cast<const float*>(scratch), dbias, channels, split);
  }
  return cudaGetLastError();
}

cudaError_t ReluForward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(ReluForwardKernel, Blocks(n), kThreads, stream, x, y, n);
  return cudaGetLastError();
}

cudaError_t ReluBackward(const float* y, const float* dy, float* dx, std::size_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(ReluBackwardKernel, Blocks(n), kThreads, stream, y, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t MaxPoolForward(const float* x, float* y, int planes, int height, int width, int window,
                           cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(planes) * (height / window) * (width / window);
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(MaxPoolForwardKernel, Blocks(n), kThreads, stream, x, y, planes, height, width, window);
  return cudaGetLastError();
}

cudaError_t MaxPoolBackward(const float* x, const float* dy, float* dx, int planes, int height,
                            int width, int window, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(planes) * height * width;
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(MaxPoolBackwardKernel, Blocks(n), kThreads, stream, x, dy, dx, planes, height, width,
            window);
  return cudaGetLastError();
}

cudaError_t AvgPoolForward(const float* x, float* y, int planes, int height, int width, int window,
                           cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(planes) * (height / window) * (width / window);
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(AvgPoolForwardKernel, Blocks(n), kThreads, stream, x, y, planes, height, width, window);
  return cudaGetLastError();
}

cudaError_t AvgPoolBackward(const float* dy, float* dx, int planes, int height, int width,
                            int window, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(planes) * height * width;
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(AvgPoolBackwardKernel, Blocks(n), kThreads, stream, dy, dx, planes, height, width,
            window);
  return cudaGetLastError();
}

cudaError_t Im2Col(const float* x, float* col, int batch, const ConvShape& s, cudaStream_t stream) {
  const std::size_t n =
      static_cast<std::size_t>(s.channels) * s.kernel_h * s.kernel_w * batch * s.out_h * s.out_w;
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(Im2ColKernel, Blocks(n), kThreads, stream, x, col, batch, s);
  return cudaGetLastError();
}

cudaError_t Col2Im(const float* col, float* dx, int batch, const ConvShape& s,
                   cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(batch) * s.channels * s.height * s.width;
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(Col2ImKernel, Blocks(n), kThreads, stream, col, dx, batch, s);
  return cudaGetLastError();
}

cudaError_t SwapLeadingAxes(const float* x, float* y, int d0, int d1, int inner,
                            cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(d0) * d1 * inner;
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(SwapLeadingAxesKernel, Blocks(n), kThreads, stream, x, y, d0, d1, inner);
  return cudaGetLastError();
}

cudaError_t SoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                       float* probs, float* loss, std::int32_t* correct, int batch,
                                       int classes, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  PS_LAUNCH(SoftmaxForwardKernel, Blocks(static_cast<std::size_t>(batch)), kThreads, stream, logits,
            labels, probs, loss, correct, batch, classes);
  return cudaGetLastError();
}

cudaError_t SoftmaxCrossEntropyBackward(const float* probs, const std::int32_t* labels,
                                        float* dlogits, int batch, int classes, float scale,
                                        cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(batch) * classes;
  if (n == 0) return cudaSuccess;
  PS_LAUNCH(SoftmaxBackwardKernel, Blocks(n), kThreads, stream, probs, labels, dlogits, batch,
            classes, scale);
  return cudaGetLastError();
}

}  // namespace ps::worker::cuda
