#include "worker/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "worker/cuda_kernels.h"
#include "worker/errors.h"

namespace ps::worker {
namespace {

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it, so that the next call is not blamed for this one
    throw DeviceError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(err));
  }
}

void Check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw DeviceError(std::string("cuBLAS error in ") + what + ": " +
                      cublasGetStatusString(status));
  }
}

// Device memory released with cudaFree.
struct CudaFreeDeleter {
  void operator()(void* p) const { cudaFree(p); }
};
using CudaBuffer = std::unique_ptr<void, CudaFreeDeleter>;

struct CudaHostFreeDeleter {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using PinnedBuffer = std::unique_ptr<void, CudaHostFreeDeleter>;

// A CUDA event on the backend's stream. Events need no current device to be queried or
// destroyed; recording selects the backend's device first, as the backend's calls do.
class CudaMark final : public Backend::StreamMark {
 public:
  CudaMark(cudaStream_t stream, int ordinal) : stream_(stream), ordinal_(ordinal) {
    Check(cudaSetDevice(ordinal_), "cudaSetDevice");
    Check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaMark() override { cudaEventDestroy(event_); }
  CudaMark(const CudaMark&) = delete;
  CudaMark& operator=(const CudaMark&) = delete;

  void Record() override {
    Check(cudaSetDevice(ordinal_), "cudaSetDevice");
    Check(cudaEventRecord(event_, stream_), "cudaEventRecord");
  }
  bool Reached() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    Check(status, "cudaEventQuery");  // a kernel before the mark failed
    return true;
  }
  void Wait() override { Check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }

 private:
  cudaStream_t stream_;  // the backend's; outlives the mark
  int ordinal_;
  cudaEvent_t event_ = nullptr;  // owned
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int ordinal) : ordinal_(ordinal) {
    Check(cudaSetDevice(ordinal), "cudaSetDevice");
    cudaDeviceProp prop{};
    Check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
    device_name_ = prop.name;
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    const cublasStatus_t status = cublasCreate(&cublas_);
    if (status != CUBLAS_STATUS_SUCCESS) {
      cudaStreamDestroy(stream_);
      Check(status, "cublasCreate");
    }
    try {
      Check(cublasSetStream(cublas_, stream_), "cublasSetStream");
      // Plain FP32 GEMMs (no TF32): the CPU agreement tests compare against OpenBLAS.
      Check(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    } catch (...) {
      cublasDestroy(cublas_);
      cudaStreamDestroy(stream_);
      throw;
    }
  }

  ~CudaBackend() override {
    // Scratch buffers are freed by their members after this body; cudaFree needs no stream.
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  DeviceKind kind() const override { return DeviceKind::kCUDA; }
  int ordinal() const override { return ordinal_; }
  std::string Name() const override {
    return "cuda:" + std::to_string(ordinal_) + " (" + device_name_ + ")";
  }

  void* Allocate(std::size_t bytes) override {
    Use();
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    Check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void Free(void* ptr) noexcept override {
    cudaSetDevice(ordinal_);  // unchecked: a noexcept release has nobody to tell
    if (ptr != nullptr) cudaFree(ptr);
  }
  void* AllocateHost(std::size_t bytes) override {
    Use();
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    Check(cudaMallocHost(&p, bytes), "cudaMallocHost");
    return p;
  }
  void FreeHost(void* ptr) noexcept override {
    cudaSetDevice(ordinal_);  // unchecked: a noexcept release has nobody to tell
    if (ptr != nullptr) cudaFreeHost(ptr);
  }
  // Synchronous, so the host source may be reused as soon as this returns.
  void CopyToDevice(void* dst, const void* host_src, std::size_t bytes) override {
    if (bytes == 0) return;
    CopyToDeviceAsync(dst, host_src, bytes);
    Check(cudaStreamSynchronize(stream_), "copy to device");
  }
  void CopyToHost(void* host_dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    CopyToHostAsync(host_dst, src, bytes);
    Check(cudaStreamSynchronize(stream_), "copy to host");
  }
  void CopyOnDevice(void* dst, const void* src, std::size_t bytes) override {
    Use();
    if (bytes == 0) return;
    Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "device copy");
  }
  void CopyToHostAsync(void* host_dst, const void* src, std::size_t bytes) override {
    Use();
    if (bytes == 0) return;
    Check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
  }
  void CopyToDeviceAsync(void* dst, const void* host_src, std::size_t bytes) override {
    Use();
    if (bytes == 0) return;
    Check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
  }
  void Synchronize() override {
    Use();
    Check(cudaStreamSynchronize(stream_), "synchronize");
  }
  std::unique_ptr<StreamMark> NewMark() override {
    return std::make_unique<CudaMark>(stream_, ordinal_);
  }
  void Fill(float* x, std::size_t n, float value) override {
    Use();
    Check(cuda::Fill(x, n, value, stream_), "fill");
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    Use();
    // cuBLAS is column-major: a row-major C (m x n) is a column-major C^T, and
    // C^T = op(B)^T * op(A)^T, where the stored B and A already read as their transposes.
    Check(cublasSgemm(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                      trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda, &beta,
                      c, ldc),
          "cublasSgemm");
  }
  void Axpy(std::size_t n, float alpha, const float* x, float* y) override {
    Use();
    Check(cuda::Axpy(n, alpha, x, y, stream_), "axpy");
  }
  void Scale(std::size_t n, float alpha, float* x) override {
    Use();
    Check(cuda::Scale(n, alpha, x, stream_), "scale");
  }
  void SgdUpdate(float* w, const float* g, float* mom, std::size_t n, float lr, float momentum,
                 float weight_decay) override {
    Use();
    Check(cuda::SgdUpdate(w, g, mom, n, lr, momentum, weight_decay, stream_), "sgd update");
  }

  void AddBias(float* y, const float* bias, int batch, int channels, int spatial) override {
    Use();
    Check(cuda::AddBias(y, bias, batch, channels, spatial, stream_), "add bias");
  }
  void BiasGrad(const float* dy, float* dbias, int batch, int channels, int spatial) override {
    Use();
    const auto partials = static_cast<std::size_t>(channels) * cuda::BiasGradSplit(batch, spatial);
    if (partials > bias_scratch_floats_) {
      Synchronize();  // the old buffer may still be in use by queued work
      bias_scratch_.reset(Allocate(partials * sizeof(float)));
      bias_scratch_floats_ = partials;
    }
    Check(cuda::BiasGrad(dy, dbias, batch, channels, spatial,
                         static_cast<float*>(bias_scratch_.get()), stream_),
          "bias grad");
  }
  void ReluForward(const float* x, float* y, std::size_t n) override {
    Use();
    Check(cuda::ReluForward(x, y, n, stream_), "relu forward");
  }
  void ReluBackward(const float* y, const float* dy, float* dx, std::size_t n) override {
    Use();
    Check(cuda::ReluBackward(y, dy, dx, n, stream_), "relu backward");
  }
  void MaxPoolForward(const float* x, float* y, int batch, const PoolGeometry& g) override {
    Use();
    Check(cuda::MaxPoolForward(x, y, batch * g.channels, g.height, g.width, g.window, stream_),
          "max pool forward");
  }
  void MaxPoolBackward(const float* x, const float* dy, float* dx, int batch,
                       const PoolGeometry& g) override {
    Use();
    Check(
        cuda::MaxPoolBackward(x, dy, dx, batch * g.channels, g.height, g.width, g.window, stream_),
        "max pool backward");
  }
  void AvgPoolForward(const float* x, float* y, int batch, const PoolGeometry& g) override {
    Use();
    Check(cuda::AvgPoolForward(x, y, batch * g.channels, g.height, g.width, g.window, stream_),
          "avg pool forward");
  }
  void AvgPoolBackward(const float* dy, float* dx, int batch, const PoolGeometry& g) override {
    Use();
    Check(cuda::AvgPoolBackward(dy, dx, batch * g.channels, g.height, g.width, g.window, stream_),
          "avg pool backward");
  }
  void Im2Col(const float* x, float* col, int batch, const ConvGeometry& g) override {
    Use();
    Check(cuda::Im2Col(x, col, batch, cuda::ShapeOf(g), stream_), "im2col");
  }
  void Col2Im(const float* col, float* dx, int batch, const ConvGeometry& g) override {
    Use();
    Check(cuda::Col2Im(col, dx, batch, cuda::ShapeOf(g), stream_), "col2im");
  }
  std::size_t ConvWorkspaceFloats() const override { return cuda::kConvWorkspaceFloats; }
  void SwapLeadingAxes(const float* x, float* y, int d0, int d1, int inner) override {
    Use();
    Check(cuda::SwapLeadingAxes(x, y, d0, d1, inner, stream_), "swap leading axes");
  }

  SoftmaxStats SoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                          float* probs, int batch, int classes) override {
    QueueSoftmaxCrossEntropyForward(logits, labels, probs, batch, classes);
    return TakeSoftmaxStats();
  }

  void QueueSoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                       float* probs, int batch, int classes) override {
    Use();
    if (softmax_queued_ > 0) TakeSoftmaxStats();  // one at a time: the host buffers are shared
    if (batch <= 0) return;
    ReserveSoftmaxScratch(static_cast<std::size_t>(batch));
    auto* loss = static_cast<float*>(loss_dev_.get());
    auto* correct = static_cast<std::int32_t*>(correct_dev_.get());
    Check(cuda::SoftmaxCrossEntropyForward(logits, labels, probs, loss, correct, batch, classes,
                                           stream_),
          "softmax forward");
    const auto n = static_cast<std::size_t>(batch);
    Check(
        cudaMemcpyAsync(loss_host_.get(), loss, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "softmax forward");
    Check(cudaMemcpyAsync(correct_host_.get(), correct, n * sizeof(std::int32_t),
                          cudaMemcpyDeviceToHost, stream_),
          "softmax forward");
    if (!softmax_done_) softmax_done_ = NewMark();
    softmax_done_->Record();
    softmax_queued_ = n;
  }

  SoftmaxStats TakeSoftmaxStats() override {
    if (softmax_queued_ == 0) return {};
    Use();
    softmax_done_->Wait();  // the copies only: the work queued after them goes on
    const auto* loss_host = static_cast<const float*>(loss_host_.get());
    const auto* correct_host = static_cast<const std::int32_t*>(correct_host_.get());
    // Summed on the host in sample order, like the CPU backend.
    SoftmaxStats stats;
    for (std::size_t i = 0; i < softmax_queued_; ++i) {
      stats.loss_sum += static_cast<double>(loss_host[i]);
      stats.correct += correct_host[i];
    }
    softmax_queued_ = 0;
    return stats;
  }

  void SoftmaxCrossEntropyBackward(const float* probs, const std::int32_t* labels, float* dlogits,
                                   int batch, int classes, float scale) override {
    Use();
    Check(cuda::SoftmaxCrossEntropyBackward(probs, labels, dlogits, batch, classes, scale, stream_),
          "softmax backward");
  }

 private:
  // Every call makes this backend's GPU current first: CUDA allocates and launches on the
  // calling thread's current device, which another backend, a KVStore copy or another thread
  // may have changed (cuBLAS and the stream belong to ordinal_).
  void Use() const { Check(cudaSetDevice(ordinal_), "cudaSetDevice"); }

  void ReserveSoftmaxScratch(std::size_t batch) {
    if (batch <= softmax_capacity_) return;
    Synchronize();  // the old buffers may still be in use by queued work
    loss_dev_.reset(Allocate(batch * sizeof(float)));
    correct_dev_.reset(Allocate(batch * sizeof(std::int32_t)));
    loss_host_.reset(AllocateHost(batch * sizeof(float)));
    correct_host_.reset(AllocateHost(batch * sizeof(std::int32_t)));
    softmax_capacity_ = batch;
  }

  int ordinal_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;    // owned; every call of this backend is ordered on it
  cublasHandle_t cublas_ = nullptr;  // owned; bound to stream_
  // Per-sample loss/correct scratch for SoftmaxCrossEntropyForward, grown on demand.
  std::size_t softmax_capacity_ = 0;
  CudaBuffer loss_dev_;
  CudaBuffer correct_dev_;
  PinnedBuffer loss_host_;
  PinnedBuffer correct_host_;
  // QueueSoftmaxCrossEntropyForward: samples whose loss is on its way to the host buffers
  // above (0: none), and the mark recorded after their copies.
  std::size_t softmax_queued_ = 0;
  std::unique_ptr<StreamMark> softmax_done_;
  // BiasGrad's partial sums, grown on demand.
  std::size_t bias_scratch_floats_ = 0;
  CudaBuffer bias_scratch_;
};

}  // namespace

CudaProbe ProbeCudaRuntime() {
  int driver = 0;
  cudaDriverGetVersion(&driver);  // 0: no NVIDIA driver installed
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  cudaGetLastError();  // reset the runtime's last-error state for later calls
  if (err == cudaSuccess && count > 0) return CudaProbe{count, false, ""};
  CudaProbe probe;
  probe.gpu_absent = driver == 0 || err == cudaSuccess || err == cudaErrorNoDevice;
  probe.why = err == cudaSuccess ? "the CUDA runtime reports 0 devices" : cudaGetErrorString(err);
  if (driver == 0) probe.why += "; no NVIDIA driver is installed";
  return probe;
}

std::unique_ptr<Backend> MakeCudaBackend(int ordinal) {
  const CudaProbe probe = ProbeCudaRuntime();
  const int count = probe.devices;
  if (count == 0) {
    throw DeviceError("no CUDA device found (" + probe.why + "): use --device cpu");
  }
  if (ordinal < 0 || ordinal >= count) {
    throw DeviceError("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                      std::to_string(count) + " found): use a smaller ordinal or --device cpu");
  }
  return std::make_unique<CudaBackend>(ordinal);
}

}  // namespace ps::worker
