// Gradient compression on a real GPU: the kernels of kvstore/compression_kernels.cuh as the
// KVStore runs them (compression::gpu::DeviceResidual: residual on the GPU, only the codes
// copied back), bit for bit against the hand-worked vectors and the reference codecs; and a
// dist_sync job whose workers push GPU tensors (one from the GPU, one from the CPU, and a key
// whose pushes move between them) with the values worked out by hand. Labelled `cuda`: without
// a GPU (or in a build without CUDA) every case says so and ctest reports it skipped.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ps/kvstore.h"
#include "tests/kvstore/compression_reference.h"
#include "tests/kvstore/compression_vectors.h"
#include "tests/kvstore/kv_cluster.h"
#include "tests/kvstore/kv_rounds.h"
#include "tests/util/gpu_or_skip.h"

#ifdef PS_TEST_CUDA
#include <cuda_runtime_api.h>

#include "kvstore/compression_cuda.h"
#endif

namespace {

using ps::test::GpuOrSkip;

#ifdef PS_TEST_CUDA

using ps::test::CheckCuda;
namespace reference = ps::test::reference;
using ps::compression::Codec;
using ps::test::Bits;
using ps::test::CodecOf;
using ps::test::ExpectedEncodedBytes;

// n floats on GPU 0, freed with the object.
class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t n) : n_(n) {
    CheckCuda(cudaSetDevice(0), "cudaSetDevice");
    void* ptr = nullptr;
    CheckCuda(cudaMalloc(&ptr, n * sizeof(float) + 4), "cudaMalloc");
    ptr_ = static_cast<float*>(ptr);
  }
  ~DeviceFloats() { cudaFree(ptr_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* data() const { return ptr_; }
  ps::Tensor View() const { return {ptr_, n_, ps::DType::kFloat32, ps::Device::CUDA(0)}; }
  void Upload(const std::vector<float>& host) {
    CheckCuda(cudaMemcpy(ptr_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), "upload");
  }

 private:
  std::size_t n_;
  float* ptr_ = nullptr;
};

// One round on the GPU: the codes, and the residual as it is left on the device.
std::vector<std::uint8_t> EncodeOnGpu(ps::compression::gpu::DeviceResidual& residual, Codec codec,
                                      float threshold, const std::vector<float>& grad,
                                      std::vector<float>& residual_after) {
  DeviceFloats device(grad.size());
  device.Upload(grad);
  std::vector<std::byte> codes(ExpectedEncodedBytes(codec, grad.size()));
  residual.Encode(codec, threshold, device.data(), codes.data());
  residual_after.resize(grad.size());
  residual.Download(residual_after.data());
  std::vector<std::uint8_t> bytes(codes.size());
  std::memcpy(bytes.data(), codes.data(), codes.size());
  return bytes;
}

#endif  // PS_TEST_CUDA

}  // namespace

TEST_CASE("compression kernels on the GPU: hand-worked vectors and the reference, bit for bit",
          "[compression][cuda]") {
  if (!GpuOrSkip()) return;
#ifdef PS_TEST_CUDA
  for (const ps::test::HandVector& vector : ps::test::HandVectors()) {
    INFO(vector.type);
    ps::compression::gpu::DeviceResidual residual(0, vector.rounds.front().grad.size());
    std::vector<float> after;
    for (const ps::test::VectorRound& round : vector.rounds) {
      CHECK(EncodeOnGpu(residual, CodecOf(vector.type), vector.threshold, round.grad, after) ==
            round.codes);
      CHECK(after == round.residual);
    }
  }
  std::mt19937 random(5);
  std::uniform_real_distribution<float> plain(-2.0f, 2.0f);
  for (const char* type : {"2bit", "1bit", "fp16"}) {
    for (const std::size_t n : {1u, 17u, 1025u, 100000u, 1u << 20}) {
      INFO(type << " n " << n);
      ps::compression::gpu::DeviceResidual residual(0, n);
      std::vector<float> ref_residual(n, 0.0f), after;
      for (int round = 0; round < 3; ++round) {
        std::vector<float> grad(n);
        for (float& g : grad) g = plain(random);
        if (n > 4) grad[3] = 0.5f;
        REQUIRE(EncodeOnGpu(residual, CodecOf(type), 0.5f, grad, after) ==
                reference::EncodePush(type, 0.5f, grad, ref_residual));
        REQUIRE(Bits(after) == Bits(ref_residual));
      }
    }
  }
#endif
}

TEST_CASE("dist_sync 2bit with GPU gradients: values worked out by hand", "[compression][cuda]") {
  if (!GpuOrSkip()) return;
#ifdef PS_TEST_CUDA
  // As in test_compression_dist.cc: threshold 1, no optimizer (the value is the round's sum),
  // gradients by class i % 3: (+1, +1) -> sums 2, 2, 2; (+0.5, -0.5) -> 0, 0, 0;
  // (+0.75, +3) -> 1, 2, 2. Worker 0 pushes from the GPU, worker 1 from the CPU; key 9's pushes
  // alternate between the two on every worker (its residual follows them).
  constexpr std::size_t kN = 3000;
  const float sums[3][3] = {{2, 2, 2}, {0, 0, 0}, {1, 2, 2}};
  ps::test::KVCluster cluster(
      2, 2, {{"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"}, {"PS_CHUNK_BYTES", "4096"}});
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> zeros(kN, 0.0f), grad(kN), out(kN);
    kv.Init({8, 9}, {ps::Tensor(zeros.data(), kN), ps::Tensor(zeros.data(), kN)});
    kv.SetGradientCompression({.type = "2bit", .threshold = 1.0f});
    for (std::size_t i = 0; i < kN; ++i) {
      grad[i] = i % 3 == 0   ? 1.0f
                : i % 3 == 1 ? (kv.Rank() == 0 ? 0.5f : -0.5f)
                             : (kv.Rank() == 0 ? 0.75f : 3.0f);
    }
    DeviceFloats device(kN);
    device.Upload(grad);
    const ps::Tensor host_view(grad.data(), kN);
    for (int round = 0; round < 3; ++round) {
      kv.PushPull(8, kv.Rank() == 0 ? device.View() : host_view, ps::Tensor(out.data(), kN));
      kv.WaitAll();
      for (std::size_t i = 0; i < kN; ++i) {
        ps::test::Expect(out[i] == sums[i % 3][round], "key 8 round " + std::to_string(round));
      }
      kv.PushPull(9, round % 2 == 0 ? device.View() : host_view, ps::Tensor(out.data(), kN));
      kv.WaitAll();
      for (std::size_t i = 0; i < kN; ++i) {
        ps::test::Expect(out[i] == sums[i % 3][round], "key 9 round " + std::to_string(round));
      }
    }
  });
  CHECK(ps::test::AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
#endif
}
