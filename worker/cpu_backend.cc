#include "worker/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

namespace ps::worker {
namespace {

constexpr std::size_t kAlignment = 64;  // cache line; also what AVX-512 loads like

void* AlignedAlloc(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // aligned_alloc wants a size that is a multiple of the alignment.
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

// Index of the first maximum of a window (row-major) within one channel plane.
std::size_t WindowArgmax(const float* plane, int width, int oy, int ox, int window) {
  std::size_t best = static_cast<std::size_t>(oy * window) * width + ox * window;
  for (int i = 0; i < window; ++i) {
    for (int j = 0; j < window; ++j) {
      const std::size_t idx = static_cast<std::size_t>(oy * window + i) * width + ox * window + j;
      if (plane[idx] > plane[best]) best = idx;
    }
  }
  return best;
}

// The CPU computes every call before it returns: a mark is always reached.
class ReachedMark final : public Backend::StreamMark {
 public:
  void Record() override {}
  bool Reached() override { return true; }
  void Wait() override {}
};

class CpuBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCPU; }
  std::string Name() const override { return "cpu"; }

  void* Allocate(std::size_t bytes) override { return AlignedAlloc(bytes); }
  void Free(void* ptr) noexcept override { std::free(ptr); }
  void* AllocateHost(std::size_t bytes) override { return AlignedAlloc(bytes); }
  void FreeHost(void* ptr) noexcept override { std::free(ptr); }
  void CopyToDevice(void* dst, const void* host_src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
  }
  void CopyToHost(void* host_dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(host_dst, src, bytes);
  }
  void CopyOnDevice(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void CopyToHostAsync(void* host_dst, const void* src, std::size_t bytes) override {
    CopyToHost(host_dst, src, bytes);
  }
  void CopyToDeviceAsync(void* dst, const void* host_src, std::size_t bytes) override {
    CopyToDevice(dst, host_src, bytes);
  }
  void Synchronize() override {}
  std::unique_ptr<StreamMark> NewMark() override { return std::make_unique<ReachedMark>(); }
  void Fill(float* x, std::size_t n, float value) override { std::fill(x, x + n, value); }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  void Axpy(std::size_t n, float alpha, const float* x, float* y) override {
    for (std::size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }

  void Scale(std::size_t n, float alpha, float* x) override {
    for (std::size_t i = 0; i < n; ++i) x[i] *= alpha;
  }

  void SgdUpdate(float* w, const float* g, float* mom, std::size_t n, float lr, float momentum,
                 float weight_decay) override {
    if (momentum == 0.0f || mom == nullptr) {
      for (std::size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + weight_decay * w[i]);
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      mom[i] = momentum * mom[i] - lr * (g[i] + weight_decay * w[i]);
      w[i] += mom[i];
    }
  }

  void AddBias(float* y, const float* bias, int batch, int channels, int spatial) override {
    for (int i = 0; i < batch; ++i) {
      for (int c = 0; c < channels; ++c) {
        float* row = y + (static_cast<std::size_t>(i) * channels + c) * spatial;
        const float b = bias[c];
        for (int s = 0; s < spatial; ++s) row[s] += b;
      }
    }
  }

  void BiasGrad(const float* dy, float* dbias, int batch, int channels, int spatial) override {
    for (int c = 0; c < channels; ++c) {
      double sum = 0.0;  // double: the CUDA kernel's tree sum and this agree to float precision
      for (int i = 0; i < batch; ++i) {
        const float* row = dy + (static_cast<std::size_t>(i) * channels + c) * spatial;
        for (int s = 0; s < spatial; ++s) sum += row[s];
      }
      dbias[c] = static_cast<float>(sum);
    }
  }

  void ReluForward(const float* x, float* y, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }

  void ReluBackward(const float* y, const float* dy, float* dx, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }

  void MaxPoolForward(const float* x, float* y, int batch, const PoolGeometry& g) override {
    const int oh = g.out_height();
    const int ow = g.out_width();
    for (int p = 0; p < batch * g.channels; ++p) {
      const float* plane = x + static_cast<std::size_t>(p) * g.height * g.width;
      float* out = y + static_cast<std::size_t>(p) * oh * ow;
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          out[oy * ow + ox] = plane[WindowArgmax(plane, g.width, oy, ox, g.window)];
        }
      }
    }
  }

  void MaxPoolBackward(const float* x, const float* dy, float* dx, int batch,
                       const PoolGeometry& g) override {
    const int oh = g.out_height();
    const int ow = g.out_width();
    const std::size_t plane_size = static_cast<std::size_t>(g.height) * g.width;
    std::fill(dx, dx + batch * g.channels * plane_size, 0.0f);
    for (int p = 0; p < batch * g.channels; ++p) {
      const float* plane = x + p * plane_size;
      const float* dout = dy + static_cast<std::size_t>(p) * oh * ow;
      float* din = dx + p * plane_size;
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          din[WindowArgmax(plane, g.width, oy, ox, g.window)] = dout[oy * ow + ox];
        }
      }
    }
  }

  void AvgPoolForward(const float* x, float* y, int batch, const PoolGeometry& g) override {
    const int oh = g.out_height();
    const int ow = g.out_width();
    const float inv = 1.0f / static_cast<float>(g.window * g.window);
    for (int p = 0; p < batch * g.channels; ++p) {
      const float* plane = x + static_cast<std::size_t>(p) * g.height * g.width;
      float* out = y + static_cast<std::size_t>(p) * oh * ow;
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          float sum = 0.0f;
          for (int i = 0; i < g.window; ++i) {
            for (int j = 0; j < g.window; ++j) {
              sum += plane[(oy * g.window + i) * g.width + ox * g.window + j];
            }
          }
          out[oy * ow + ox] = sum * inv;
        }
      }
    }
  }

  void AvgPoolBackward(const float* dy, float* dx, int batch, const PoolGeometry& g) override {
    const int oh = g.out_height();
    const int ow = g.out_width();
    const float inv = 1.0f / static_cast<float>(g.window * g.window);
    const std::size_t plane_size = static_cast<std::size_t>(g.height) * g.width;
    std::fill(dx, dx + batch * g.channels * plane_size, 0.0f);
    for (int p = 0; p < batch * g.channels; ++p) {
      const float* dout = dy + static_cast<std::size_t>(p) * oh * ow;
      float* din = dx + p * plane_size;
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          const float v = dout[oy * ow + ox] * inv;
          for (int i = 0; i < g.window; ++i) {
            for (int j = 0; j < g.window; ++j) {
              din[(oy * g.window + i) * g.width + ox * g.window + j] = v;
            }
          }
        }
      }
    }
  }

  void Im2Col(const float* x, float* col, int batch, const ConvGeometry& g) override {
    const int oh = g.out_height();
    const int ow = g.out_width();
    const std::size_t image = static_cast<std::size_t>(g.channels) * g.height * g.width;
    const std::size_t pixels = static_cast<std::size_t>(oh) * ow;
    for (int c = 0; c < g.channels; ++c) {
      for (int i = 0; i < g.kernel_h; ++i) {
        for (int j = 0; j < g.kernel_w; ++j) {
          const int row = (c * g.kernel_h + i) * g.kernel_w + j;
          for (int n = 0; n < batch; ++n) {
            const float* plane = x + n * image + static_cast<std::size_t>(c) * g.height * g.width;
            float* out = col + (static_cast<std::size_t>(row) * batch + n) * pixels;
            for (int oy = 0; oy < oh; ++oy) {
              const int iy = oy * g.stride_h - g.pad_h + i;
              for (int ox = 0; ox < ow; ++ox) {
                const int ix = ox * g.stride_w - g.pad_w + j;
                const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
                out[oy * ow + ox] =
                    inside ? plane[static_cast<std::size_t>(iy) * g.width + ix] : 0.0f;
              }
            }
          }
        }
      }
    }
  }

  void Col2Im(const float* col, float* dx, int batch, const ConvGeometry& g) override {
    const int oh = g.out_height();
    const int ow = g.out_width();
    const std::size_t image = static_cast<std::size_t>(g.channels) * g.height * g.width;
    const std::size_t pixels = static_cast<std::size_t>(oh) * ow;
    std::fill(dx, dx + batch * image, 0.0f);
    for (int c = 0; c < g.channels; ++c) {
      for (int i = 0; i < g.kernel_h; ++i) {
        for (int j = 0; j < g.kernel_w; ++j) {
          const int row = (c * g.kernel_h + i) * g.kernel_w + j;
          for (int n = 0; n < batch; ++n) {
            float* plane = dx + n * image + static_cast<std::size_t>(c) * g.height * g.width;
            const float* in = col + (static_cast<std::size_t>(row) * batch + n) * pixels;
            for (int oy = 0; oy < oh; ++oy) {
              const int iy = oy * g.stride_h - g.pad_h + i;
              if (iy < 0 || iy >= g.height) continue;
              for (int ox = 0; ox < ow; ++ox) {
                const int ix = ox * g.stride_w - g.pad_w + j;
                if (ix < 0 || ix >= g.width) continue;
                plane[static_cast<std::size_t>(iy) * g.width + ix] += in[oy * ow + ox];
              }
            }
          }
        }
      }
    }
  }

  // One image per GEMM: its col matrix stays in the caches between im2col and the GEMM that
  // reads it. Measured on the cnn: a whole batch per GEMM (20 MB of col for its second layer)
  // made a step 10-40% slower, 1 MiB chunks 2-7%.
  std::size_t ConvWorkspaceFloats() const override { return 1; }

  void SwapLeadingAxes(const float* x, float* y, int d0, int d1, int inner) override {
    const auto row = static_cast<std::size_t>(inner);
    for (int i = 0; i < d0; ++i) {
      for (int j = 0; j < d1; ++j) {
        std::memcpy(y + (static_cast<std::size_t>(j) * d0 + i) * row,
                    x + (static_cast<std::size_t>(i) * d1 + j) * row, row * sizeof(float));
      }
    }
  }

  SoftmaxStats SoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                          float* probs, int batch, int classes) override {
    SoftmaxStats stats;
    for (int i = 0; i < batch; ++i) {
      const float* row = logits + static_cast<std::size_t>(i) * classes;
      float* prob = probs + static_cast<std::size_t>(i) * classes;
      int argmax = 0;
      for (int k = 1; k < classes; ++k) {
        if (row[k] > row[argmax]) argmax = k;
      }
      const float max = row[argmax];
      float sum = 0.0f;
      for (int k = 0; k < classes; ++k) {
        prob[k] = std::exp(row[k] - max);
        sum += prob[k];
      }
      const float inv = 1.0f / sum;
      for (int k = 0; k < classes; ++k) prob[k] *= inv;
      const int label = labels[i];
      assert(label >= 0 && label < classes);
      // -log p[label] = log(sum) - (logit[label] - max), without the log(0) of a tiny p.
      stats.loss_sum += static_cast<double>(std::log(sum) - (row[label] - max));
      if (argmax == label) ++stats.correct;
    }
    return stats;
  }

  void SoftmaxCrossEntropyBackward(const float* probs, const std::int32_t* labels, float* dlogits,
                                   int batch, int classes, float scale) override {
    for (int i = 0; i < batch; ++i) {
      const float* prob = probs + static_cast<std::size_t>(i) * classes;
      float* d = dlogits + static_cast<std::size_t>(i) * classes;
      for (int k = 0; k < classes; ++k) {
        d[k] = scale * (prob[k] - (k == labels[i] ? 1.0f : 0.0f));
      }
    }
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace ps::worker
