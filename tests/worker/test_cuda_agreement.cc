// CPU against CUDA: every kernel and a whole training step of each model must agree.
// Labelled `cuda`. Without a GPU (or in a build without CUDA) every case says so and passes:
// ctest shows these tests as skipped (SKIP_REGULAR_EXPRESSION on the message below). A GPU
// the driver cannot serve fails every case.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "tests/worker/backend_agreement.h"
#include "worker/cpu_backend.h"
#include "worker/device.h"

namespace ps::worker {
namespace {

struct BackendPair {
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Backend> cuda;
};

// Both backends, or nothing (after a WARN) when there is no GPU to compare with. A GPU that
// CUDA cannot use (a driver too old for the runtime) fails instead: skipping would hide it.
std::unique_ptr<BackendPair> CudaPairOrSkip() {
  const CudaProbe probe = ProbeCuda();
  if (probe.devices == 0) {
    if (!probe.gpu_absent) FAIL("a GPU driver is installed but CUDA cannot use it: " << probe.why);
    WARN("no CUDA device: skipped (" << probe.why << ")");
    return nullptr;
  }
  auto pair = std::make_unique<BackendPair>();
  pair->cpu = MakeCpuBackend();
  pair->cuda = CreateBackend("cuda");
  WARN("comparing cpu with " << pair->cuda->Name());  // WARN: an INFO would end with this scope
  return pair;
}

TEST_CASE("cuda agrees with cpu: gemm", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::AgreeGemm(*p->cpu, *p->cuda);
}

TEST_CASE("cuda agrees with cpu: fill, axpy, scale, sgd update, relu", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::AgreeElementwise(*p->cpu, *p->cuda);
}

TEST_CASE("cuda agrees with cpu: bias add and bias gradient", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::AgreeBias(*p->cpu, *p->cuda);
}

TEST_CASE("cuda agrees with cpu: max and average pooling", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::AgreePooling(*p->cpu, *p->cuda);
}

TEST_CASE("cuda agrees with cpu: im2col and col2im", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::AgreeIm2Col(*p->cpu, *p->cuda);
}

TEST_CASE("cuda agrees with cpu: a conv layer run in chunks of images", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::AgreeConvChunks(*p->cpu, *p->cuda);
}

TEST_CASE("cuda queued copies and stream marks", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::CheckQueuedCopies(*p->cuda);
}

TEST_CASE("cuda agrees with cpu: softmax cross-entropy", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::AgreeSoftmax(*p->cpu, *p->cuda);
}

TEST_CASE("cuda agrees with cpu: a whole mlp training step", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::AgreeTrainingStep(*p->cpu, *p->cuda, "mlp");
}

TEST_CASE("cuda agrees with cpu: a whole cnn training step", "[cuda]") {
  if (auto p = CudaPairOrSkip()) testing::AgreeTrainingStep(*p->cpu, *p->cuda, "cnn");
}

TEST_CASE("cuda pinned staging buffers round-trip through device memory", "[cuda]") {
  auto p = CudaPairOrSkip();
  if (!p) return;
  Backend& cuda = *p->cuda;
  HostArray<float> staging(cuda, 1000);
  for (std::size_t i = 0; i < staging.size(); ++i) staging.data()[i] = static_cast<float>(i);
  DeviceArray<float> dev(cuda, 1000);
  cuda.CopyToDevice(dev.data(), staging.data(), 1000 * sizeof(float));
  cuda.Scale(1000, 2.0f, dev.data());
  cuda.CopyToHost(staging.data(), dev.data(), 1000 * sizeof(float));
  CHECK(staging.data()[999] == 1998.0f);
}

}  // namespace
}  // namespace ps::worker
