// The project's CUDA kernels (worker/cuda_kernels.cu), run on the host under
// cuda_host_emulation.h, against the CPU backend: every kernel and a whole training step of
// each model. Machines without a GPU (CI) check the kernels' indexing, grid-stride loops,
// reductions and tie rules this way; test_cuda_agreement.cc checks them on a GPU, together
// with cuBLAS and the CUDA backend's memory handling.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "tests/worker/backend_agreement.h"
#include "tests/worker/cuda_host_emulation.h"
#include "tests/worker/forwarding_backend.h"
#include "worker/cpu_backend.h"
#include "worker/cuda_kernels.h"

namespace ps::worker {
namespace {

void Check(cudaError_t status) { REQUIRE(status == cudaSuccess); }

// Host memory and GEMMs from the CPU backend; every other primitive from the CUDA kernels,
// called as CudaBackend calls them.
class EmulatedCudaBackend final : public testing::ForwardingBackend {
 public:
  std::string Name() const override { return "cuda kernels on the host"; }
  void Fill(float* x, std::size_t n, float value) override {
    Check(cuda::Fill(x, n, value, nullptr));
  }
  void Axpy(std::size_t n, float alpha, const float* x, float* y) override {
    Check(cuda::Axpy(n, alpha, x, y, nullptr));
  }
  void Scale(std::size_t n, float alpha, float* x) override {
    Check(cuda::Scale(n, alpha, x, nullptr));
  }
  void SgdUpdate(float* w, const float* g, float* mom, std::size_t n, float lr, float momentum,
                 float weight_decay) override {
    Check(cuda::SgdUpdate(w, g, mom, n, lr, momentum, weight_decay, nullptr));
  }
  void AddBias(float* y, const float* bias, int batch, int channels, int spatial) override {
    Check(cuda::AddBias(y, bias, batch, channels, spatial, nullptr));
  }
  void BiasGrad(const float* dy, float* dbias, int batch, int channels, int spatial) override {
    std::vector<float> scratch(static_cast<std::size_t>(channels) *
                               cuda::BiasGradSplit(batch, spatial));
    Check(cuda::BiasGrad(dy, dbias, batch, channels, spatial, scratch.data(), nullptr));
  }
  void ReluForward(const float* x, float* y, std::size_t n) override {
    Check(cuda::ReluForward(x, y, n, nullptr));
  }
  void ReluBackward(const float* y, const float* dy, float* dx, std::size_t n) override {
    Check(cuda::ReluBackward(y, dy, dx, n, nullptr));
  }
  void MaxPoolForward(const float* x, float* y, int batch, const PoolGeometry& g) override {
    Check(cuda::MaxPoolForward(x, y, batch * g.channels, g.height, g.width, g.window, nullptr));
  }
  void MaxPoolBackward(const float* x, const float* dy, float* dx, int batch,
                       const PoolGeometry& g) override {
    Check(
        cuda::MaxPoolBackward(x, dy, dx, batch * g.channels, g.height, g.width, g.window, nullptr));
  }
  void AvgPoolForward(const float* x, float* y, int batch, const PoolGeometry& g) override {
    Check(cuda::AvgPoolForward(x, y, batch * g.channels, g.height, g.width, g.window, nullptr));
  }
  void AvgPoolBackward(const float* dy, float* dx, int batch, const PoolGeometry& g) override {
    Check(cuda::AvgPoolBackward(dy, dx, batch * g.channels, g.height, g.width, g.window, nullptr));
  }
  void Im2Col(const float* x, float* col, int batch, const ConvGeometry& g) override {
    Check(cuda::Im2Col(x, col, batch, cuda::ShapeOf(g), nullptr));
  }
  void Col2Im(const float* col, float* dx, int batch, const ConvGeometry& g) override {
    Check(cuda::Col2Im(col, dx, batch, cuda::ShapeOf(g), nullptr));
  }
  // As CudaBackend: whole batches per convolution GEMM, so the model steps below run the
  // batched im2col, col2im and axis swap.
  std::size_t ConvWorkspaceFloats() const override { return cuda::kConvWorkspaceFloats; }
  void SwapLeadingAxes(const float* x, float* y, int d0, int d1, int inner) override {
    Check(cuda::SwapLeadingAxes(x, y, d0, d1, inner, nullptr));
  }
  // As CudaBackend: per-sample loss and correctness from the kernel, summed in sample order.
  SoftmaxStats SoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                          float* probs, int batch, int classes) override {
    std::vector<float> loss(static_cast<std::size_t>(batch));
    std::vector<std::int32_t> correct(static_cast<std::size_t>(batch));
    Check(cuda::SoftmaxCrossEntropyForward(logits, labels, probs, loss.data(), correct.data(),
                                           batch, classes, nullptr));
    SoftmaxStats stats;
    for (int i = 0; i < batch; ++i) {
      stats.loss_sum += static_cast<double>(loss[static_cast<std::size_t>(i)]);
      stats.correct += correct[static_cast<std::size_t>(i)];
    }
    return stats;
  }
  void SoftmaxCrossEntropyBackward(const float* probs, const std::int32_t* labels, float* dlogits,
                                   int batch, int classes, float scale) override {
    Check(
        cuda::SoftmaxCrossEntropyBackward(probs, labels, dlogits, batch, classes, scale, nullptr));
  }
};

// The two backends every case compares.
struct CpuAndKernels {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  EmulatedCudaBackend kernels;
};

TEST_CASE_METHOD(CpuAndKernels,
                 "cuda kernels on the host agree with cpu: fill, axpy, scale, sgd update, relu",
                 "[cuda-emulation]") {
  testing::AgreeElementwise(*cpu, kernels);
}

TEST_CASE_METHOD(CpuAndKernels,
                 "cuda kernels on the host agree with cpu: bias add and bias gradient",
                 "[cuda-emulation]") {
  testing::AgreeBias(*cpu, kernels);
}

TEST_CASE_METHOD(CpuAndKernels, "cuda kernels on the host agree with cpu: max and average pooling",
                 "[cuda-emulation]") {
  testing::AgreePooling(*cpu, kernels);
}

TEST_CASE_METHOD(CpuAndKernels, "cuda kernels on the host agree with cpu: im2col and col2im",
                 "[cuda-emulation]") {
  testing::AgreeIm2Col(*cpu, kernels);
}

TEST_CASE_METHOD(CpuAndKernels,
                 "cuda kernels on the host agree with cpu: a conv layer run in chunks of images",
                 "[cuda-emulation]") {
  testing::AgreeConvChunks(*cpu, kernels);
}

TEST_CASE_METHOD(CpuAndKernels, "cuda kernels on the host agree with cpu: softmax cross-entropy",
                 "[cuda-emulation]") {
  testing::AgreeSoftmax(*cpu, kernels);
}

TEST_CASE_METHOD(CpuAndKernels,
                 "cuda kernels on the host agree with cpu: a whole mlp and cnn training step",
                 "[cuda-emulation]") {
  testing::AgreeTrainingStep(*cpu, kernels, "mlp");
  testing::AgreeTrainingStep(*cpu, kernels, "cnn");
}

}  // namespace
}  // namespace ps::worker
