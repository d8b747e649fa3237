#pragma once
// The compute backend: every numeric primitive the models need, written once per device.
// CpuBackend (OpenBLAS + plain loops) and CudaBackend (cuBLAS + the kernels in cuda_kernels.cu)
// implement it, so layer and model code is device-independent.
//
// Pointers passed to the math calls are in the backend's device memory (host memory for the
// CPU backend). Calls are ordered: each one sees the results of the previous ones. CUDA calls
// are asynchronous with respect to the host; Synchronize() waits for all of them, and every call
// that returns a value to the host (CopyToHost, SoftmaxCrossEntropyForward, TakeSoftmaxStats)
// waits for what it needs.
// Tensors are row-major; images are NCHW.
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ps::worker {

enum class DeviceKind { kCPU, kCUDA };

// One image's convolution geometry (input channels x height x width, square or not kernel).
struct ConvGeometry {
  int channels = 0;
  int height = 0;
  int width = 0;
  int kernel_h = 0;
  int kernel_w = 0;
  int pad_h = 0;
  int pad_w = 0;
  int stride_h = 1;
  int stride_w = 1;

  int out_height() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  int out_width() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
  // Rows and columns of the im2col matrix: (channels * kh * kw) x (out_h * out_w).
  int col_rows() const { return channels * kernel_h * kernel_w; }
  int col_cols() const { return out_height() * out_width(); }
};

// Non-overlapping pooling: window x window, stride = window. Trailing rows/columns that do not
// fill a window are ignored (their gradient is zero).
struct PoolGeometry {
  int channels = 0;
  int height = 0;
  int width = 0;
  int window = 2;

  int out_height() const { return height / window; }
  int out_width() const { return width / window; }
};

struct SoftmaxStats {
  double loss_sum = 0.0;  // sum over the batch of -log softmax(logits)[label]
  int correct = 0;        // samples whose argmax (first maximum) equals the label
};

class Backend {
 public:
  Backend() = default;
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual DeviceKind kind() const = 0;
  // The GPU a CUDA backend computes on (-1 on the CPU).
  virtual int ordinal() const { return -1; }
  // "cpu" or e.g. "cuda:0 (NVIDIA H200)".
  virtual std::string Name() const = 0;

  // ---- memory ----
  // Device memory, uninitialized. Free(nullptr) is a no-op.
  virtual void* Allocate(std::size_t bytes) = 0;
  virtual void Free(void* ptr) noexcept = 0;
  // Host memory usable as a DMA staging buffer (page-locked under CUDA).
  virtual void* AllocateHost(std::size_t bytes) = 0;
  virtual void FreeHost(void* ptr) noexcept = 0;
  virtual void CopyToDevice(void* dst, const void* host_src, std::size_t bytes) = 0;
  // Waits for pending work, then copies.
  virtual void CopyToHost(void* host_dst, const void* src, std::size_t bytes) = 0;
  // The ranges must not overlap (cudaMemcpyAsync does not allow it).
  virtual void CopyOnDevice(void* dst, const void* src, std::size_t bytes) = 0;
  // Asynchronous copies, ordered with this backend's other calls (the CPU backend copies at
  // once). The host memory must come from AllocateHost, and stay untouched (CopyToHostAsync's
  // destination) or unchanged (CopyToDeviceAsync's source) until a StreamMark recorded after the
  // copy is reached, or Synchronize returns.
  virtual void CopyToHostAsync(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void CopyToDeviceAsync(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void Synchronize() = 0;
  // A mark in the order of this backend's calls (a CUDA event): lets the host wait for the
  // calls made before it, not for every call queued since.
  class StreamMark {
   public:
    virtual ~StreamMark() = default;
    // Marks every call made on the backend so far (again, for a mark recorded before).
    virtual void Record() = 0;
    // Whether the marked calls have all finished, without waiting.
    virtual bool Reached() = 0;
    // Waits until they have.
    virtual void Wait() = 0;
  };
  // A new mark, reached until it is first recorded. It must not outlive the backend.
  virtual std::unique_ptr<StreamMark> NewMark() = 0;
  virtual void Fill(float* x, std::size_t n, float value) = 0;

  // ---- dense algebra ----
  // C = alpha * op(A) * op(B) + beta * C, row-major; op(A) is m x k, op(B) is k x n, C is m x n.
  // lda/ldb/ldc are the row strides of A, B, C as stored.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) = 0;
  // y += alpha * x
  virtual void Axpy(std::size_t n, float alpha, const float* x, float* y) = 0;
  // x *= alpha
  virtual void Scale(std::size_t n, float alpha, float* x) = 0;
  // SGD step with weight decay and momentum (MXNet's sgd_mom_update):
  //   g' = g + wd * w;  mom = momentum * mom - lr * g';  w += mom.
  // With momentum == 0, mom may be null and the step is w -= lr * g'.
  virtual void SgdUpdate(float* w, const float* g, float* mom, std::size_t n, float lr,
                         float momentum, float weight_decay) = 0;

  // ---- layers ----
  // y[i, c, s] += bias[c] for y laid out [batch, channels, spatial]; dense layers use spatial 1.
  virtual void AddBias(float* y, const float* bias, int batch, int channels, int spatial) = 0;
  // dbias[c] = sum over i, s of dy[i, c, s] (overwrites dbias).
  virtual void BiasGrad(const float* dy, float* dbias, int batch, int channels, int spatial) = 0;
  virtual void ReluForward(const float* x, float* y, std::size_t n) = 0;
  // dx = y > 0 ? dy : 0, with y the forward output. dx may alias dy.
  virtual void ReluBackward(const float* y, const float* dy, float* dx, std::size_t n) = 0;
  // Max over each window; ties go to the first maximum in row-major window order.
  virtual void MaxPoolForward(const float* x, float* y, int batch, const PoolGeometry& g) = 0;
  // dx = dy routed to each window's (recomputed) argmax, 0 elsewhere (overwrites dx).
  virtual void MaxPoolBackward(const float* x, const float* dy, float* dx, int batch,
                               const PoolGeometry& g) = 0;
  virtual void AvgPoolForward(const float* x, float* y, int batch, const PoolGeometry& g) = 0;
  // dx = dy / window^2 spread over each window, 0 outside any window (overwrites dx).
  virtual void AvgPoolBackward(const float* dy, float* dx, int batch, const PoolGeometry& g) = 0;
  // `batch` images x [batch, C, H, W] to col [C*kh*kw, batch, out_h*out_w], so that one GEMM
  // convolves them all: element (row, n, p) with row = (c*kh + i)*kw + j and p = oy*out_w + ox
  // holds x[n, c, oy*sh - ph + i, ox*sw - pw + j], or 0 outside the image.
  virtual void Im2Col(const float* x, float* col, int batch, const ConvGeometry& g) = 0;
  // The adjoint of Im2Col: dx = sum of the col entries that read each pixel (overwrites dx).
  virtual void Col2Im(const float* col, float* dx, int batch, const ConvGeometry& g) = 0;
  // How many floats of im2col workspace a convolution should use per chunk of images: a GPU
  // wants whole batches (few large GEMMs), a CPU a chunk that stays in its caches.
  virtual std::size_t ConvWorkspaceFloats() const = 0;
  // y[j, i, k] = x[i, j, k] for x laid out [d0, d1, inner]: turns a convolution's
  // [filters, batch, pixels] GEMM result into [batch, filters, pixels] activations and back.
  // x and y must not overlap.
  virtual void SwapLeadingAxes(const float* x, float* y, int d0, int d1, int inner) = 0;
  // probs = softmax(logits) row by row ([batch, classes]); returns the summed cross-entropy
  // against labels and the number of correct argmax predictions. Synchronizes.
  virtual SoftmaxStats SoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                                  float* probs, int batch, int classes) = 0;
  // dlogits = scale * (probs - onehot(labels)).
  virtual void SoftmaxCrossEntropyBackward(const float* probs, const std::int32_t* labels,
                                           float* dlogits, int batch, int classes, float scale) = 0;
  // SoftmaxCrossEntropyForward without waiting: probs are written in call order, and the
  // statistics come from the next TakeSoftmaxStats, which waits for the device up to this call
  // only (a training step queues the loss, issues the backward pass, then takes the loss while
  // the device runs it). One queued at a time. By default computed at once.
  virtual void QueueSoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                               float* probs, int batch, int classes) {
    queued_softmax_ = SoftmaxCrossEntropyForward(logits, labels, probs, batch, classes);
  }
  virtual SoftmaxStats TakeSoftmaxStats() { return std::exchange(queued_softmax_, {}); }

 private:
  SoftmaxStats queued_softmax_;  // the default QueueSoftmaxCrossEntropyForward's result
};

// Where a BackendArray lives: the backend's device memory, or its host staging memory
// (Backend::AllocateHost: pinned under CUDA).
enum class MemoryKind { kDevice, kHost };

// Owns `size` elements of T in one of a backend's memories. Move-only. The backend is not owned
// and must outlive the array.
template <typename T, MemoryKind kKind>
class BackendArray {
 public:
  BackendArray() = default;
  BackendArray(Backend& backend, std::size_t size)
      : backend_(&backend), data_(size == 0 ? nullptr : Allocate(backend, size)), size_(size) {}
  ~BackendArray() { Reset(); }
  BackendArray(BackendArray&& other) noexcept
      : backend_(std::exchange(other.backend_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  BackendArray& operator=(BackendArray&& other) noexcept {
    if (this != &other) {
      Reset();
      backend_ = std::exchange(other.backend_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  BackendArray(const BackendArray&) = delete;
  BackendArray& operator=(const BackendArray&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }

  // Host memory is directly addressable.
  std::span<T> span() requires(kKind == MemoryKind::kHost) { return {data_, size_}; }
  // Copies host values into device memory; values.size() must not exceed size().
  void CopyFrom(std::span<const T> values) requires(kKind == MemoryKind::kDevice) {
    assert(values.size() <= size_);
    if (!values.empty()) backend_->CopyToDevice(data_, values.data(), values.size_bytes());
  }
  std::vector<T> ToHost() const requires(kKind == MemoryKind::kDevice) {
    std::vector<T> out(size_);
    if (size_ > 0) backend_->CopyToHost(out.data(), data_, bytes());
    return out;
  }

 private:
  static T* Allocate(Backend& backend, std::size_t size) {
    void* memory = kKind == MemoryKind::kDevice ? backend.Allocate(size * sizeof(T))
                                                : backend.AllocateHost(size * sizeof(T));
    return static_cast<T*>(memory);
  }
  void Reset() noexcept {
    if (backend_ != nullptr) {
      if constexpr (kKind == MemoryKind::kDevice) {
        backend_->Free(data_);
      } else {
        backend_->FreeHost(data_);
      }
    }
    data_ = nullptr;
    size_ = 0;
  }

  Backend* backend_ = nullptr;  // not owned
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

template <typename T>
using DeviceArray = BackendArray<T, MemoryKind::kDevice>;
template <typename T>
using HostArray = BackendArray<T, MemoryKind::kHost>;

}  // namespace ps::worker
