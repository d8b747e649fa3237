#pragma once
// ForwardingBackend: a Backend that hands every call to another one (the CPU backend unless
// told otherwise), after BeforeCall(). Tests derive from it and override the few calls they change:
// a CPU backend dressed as a GPU, or one whose kernels are the CUDA kernels run on the host.
#include <memory>
#include <string>

#include "worker/backend.h"
#include "worker/cpu_backend.h"

namespace ps::worker::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner = MakeCpuBackend())
      : inner_(std::move(inner)) {}

  DeviceKind kind() const override { return inner_->kind(); }
  std::string Name() const override { return inner_->Name(); }
  void* Allocate(std::size_t bytes) override {
    BeforeCall();
    return inner_->Allocate(bytes);
  }
  void Free(void* p) noexcept override {
    BeforeCall();
    inner_->Free(p);
  }
  void* AllocateHost(std::size_t bytes) override {
    BeforeCall();
    return inner_->AllocateHost(bytes);
  }
  void FreeHost(void* p) noexcept override {
    BeforeCall();
    inner_->FreeHost(p);
  }
  void CopyToDevice(void* d, const void* s, std::size_t b) override {
    BeforeCall();
    inner_->CopyToDevice(d, s, b);
  }
  void CopyToHost(void* d, const void* s, std::size_t b) override {
    BeforeCall();
    inner_->CopyToHost(d, s, b);
  }
  void CopyOnDevice(void* d, const void* s, std::size_t b) override {
    BeforeCall();
    inner_->CopyOnDevice(d, s, b);
  }
  void CopyToHostAsync(void* d, const void* s, std::size_t b) override {
    BeforeCall();
    inner_->CopyToHostAsync(d, s, b);
  }
  void CopyToDeviceAsync(void* d, const void* s, std::size_t b) override {
    BeforeCall();
    inner_->CopyToDeviceAsync(d, s, b);
  }
  void Synchronize() override {
    BeforeCall();
    inner_->Synchronize();
  }
  std::unique_ptr<StreamMark> NewMark() override {
    BeforeCall();
    return inner_->NewMark();
  }
  void Fill(float* x, std::size_t n, float v) override {
    BeforeCall();
    inner_->Fill(x, n, v);
  }
  void Gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    BeforeCall();
    inner_->Gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void Axpy(std::size_t n, float a, const float* x, float* y) override {
    BeforeCall();
    inner_->Axpy(n, a, x, y);
  }
  void Scale(std::size_t n, float a, float* x) override {
    BeforeCall();
    inner_->Scale(n, a, x);
  }
  void SgdUpdate(float* w, const float* g, float* m, std::size_t n, float lr, float momentum,
                 float wd) override {
    BeforeCall();
    inner_->SgdUpdate(w, g, m, n, lr, momentum, wd);
  }
  void AddBias(float* y, const float* b, int n, int c, int s) override {
    BeforeCall();
    inner_->AddBias(y, b, n, c, s);
  }
  void BiasGrad(const float* dy, float* db, int n, int c, int s) override {
    BeforeCall();
    inner_->BiasGrad(dy, db, n, c, s);
  }
  void ReluForward(const float* x, float* y, std::size_t n) override {
    BeforeCall();
    inner_->ReluForward(x, y, n);
  }
  void ReluBackward(const float* y, const float* dy, float* dx, std::size_t n) override {
    BeforeCall();
    inner_->ReluBackward(y, dy, dx, n);
  }
  void MaxPoolForward(const float* x, float* y, int b, const PoolGeometry& g) override {
    BeforeCall();
    inner_->MaxPoolForward(x, y, b, g);
  }
  void MaxPoolBackward(const float* x, const float* dy, float* dx, int b,
                       const PoolGeometry& g) override {
    BeforeCall();
    inner_->MaxPoolBackward(x, dy, dx, b, g);
  }
  void AvgPoolForward(const float* x, float* y, int b, const PoolGeometry& g) override {
    BeforeCall();
    inner_->AvgPoolForward(x, y, b, g);
  }
  void AvgPoolBackward(const float* dy, float* dx, int b, const PoolGeometry& g) override {
    BeforeCall();
    inner_->AvgPoolBackward(dy, dx, b, g);
  }
  void Im2Col(const float* x, float* col, int batch, const ConvGeometry& g) override {
    BeforeCall();
    inner_->Im2Col(x, col, batch, g);
  }
  void Col2Im(const float* col, float* dx, int batch, const ConvGeometry& g) override {
    BeforeCall();
    inner_->Col2Im(col, dx, batch, g);
  }
  std::size_t ConvWorkspaceFloats() const override { return inner_->ConvWorkspaceFloats(); }
  void SwapLeadingAxes(const float* x, float* y, int d0, int d1, int inner) override {
    BeforeCall();
    inner_->SwapLeadingAxes(x, y, d0, d1, inner);
  }
  SoftmaxStats SoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                          float* probs, int batch, int classes) override {
    BeforeCall();
    return inner_->SoftmaxCrossEntropyForward(logits, labels, probs, batch, classes);
  }
  void SoftmaxCrossEntropyBackward(const float* probs, const std::int32_t* labels, float* d,
                                   int batch, int classes, float scale) override {
    BeforeCall();
    inner_->SoftmaxCrossEntropyBackward(probs, labels, d, batch, classes, scale);
  }

 protected:
  Backend& inner() { return *inner_; }
  // Runs first in every forwarded call: a backend that emulates a device's queue (test_trainer)
  // runs the work it deferred here, so every later call sees it done, as on a CUDA stream.
  virtual void BeforeCall() {}

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace ps::worker::testing
