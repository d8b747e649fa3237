// KVStore tensors in GPU memory: every store type takes device pointers and returns exact
// values, through host staging (local), data frames and shared-memory slots (dist_sync).
// Labelled `cuda`. Without a GPU (or in a build without CUDA) every case says so and ctest
// reports it skipped (SKIP_REGEX on the message below).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kvstore/staging_pool.h"
#include "ps/kvstore.h"
#include "tests/kvstore/kv_cluster.h"
#include "tests/kvstore/kv_rounds.h"
#include "tests/util/gpu_or_skip.h"

#ifdef PS_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using ps::test::AllOk;
using ps::test::Env;
using ps::test::GpuOrSkip;
using ps::test::KVCluster;
using ps::test::SyncSumRounds;

#ifdef PS_TEST_CUDA

using ps::test::CheckCuda;

void HostToDevice(const ps::Tensor& device, const std::vector<float>& host) {
  CheckCuda(cudaMemcpy(device.data(), host.data(), device.bytes(), cudaMemcpyHostToDevice),
            "upload");
}

void DeviceToHost(std::vector<float>& host, const ps::Tensor& device) {
  CheckCuda(cudaMemcpy(host.data(), device.data(), device.bytes(), cudaMemcpyDeviceToHost),
            "download");
}

// Device memory for n floats on GPU 0, freed with the object.
class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t n) : n_(n) {
    CheckCuda(cudaSetDevice(0), "cudaSetDevice");
    void* ptr = nullptr;
    CheckCuda(cudaMalloc(&ptr, n * sizeof(float)), "cudaMalloc");
    ptr_ = static_cast<float*>(ptr);
  }
  ~DeviceFloats() { cudaFree(ptr_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  ps::Tensor View() const { return {ptr_, n_, ps::DType::kFloat32, ps::Device::CUDA(0)}; }
  void Upload(const std::vector<float>& host) { HostToDevice(View(), host); }
  std::vector<float> Download() const {
    std::vector<float> host(n_);
    DeviceToHost(host, View());
    return host;
  }

 private:
  std::size_t n_;
  float* ptr_ = nullptr;
};

// SyncSumRounds with every tensor the store sees in device memory.
class OnGpu final : public ps::test::Placement {
 public:
  ps::Tensor View(std::vector<float>& host) override {
    return buffers_.emplace_back(std::make_unique<DeviceFloats>(host.size()))->View();
  }
  void Upload(const std::vector<float>& host, const ps::Tensor& view) override {
    HostToDevice(view, host);
  }
  void Download(std::vector<float>& host, const ps::Tensor& view) override {
    DeviceToHost(host, view);
  }

 private:
  std::vector<std::unique_ptr<DeviceFloats>> buffers_;
};

#endif

}  // namespace

TEST_CASE("gpu tensors: the staging pool's buffers are page-locked and reused", "[kvstore][cuda]") {
  if (!GpuOrSkip()) return;
#ifdef PS_TEST_CUDA
  auto pool = ps::StagingPool::Create(4 << 20);
  const std::byte* first = nullptr;
  {
    std::shared_ptr<std::byte> buffer = pool->Get(3 << 20, ps::Device::CUDA(0));
    first = buffer.get();
    cudaPointerAttributes attributes{};
    CheckCuda(cudaPointerGetAttributes(&attributes, buffer.get()), "cudaPointerGetAttributes");
    CHECK(attributes.type == cudaMemoryTypeHost);  // page-locked, not pageable
    DeviceFloats device((3 << 20) / sizeof(float));
    device.Upload(std::vector<float>((3 << 20) / sizeof(float), 2.5f));
    CheckCuda(cudaMemcpy(buffer.get(), device.View().data(), 3 << 20, cudaMemcpyDeviceToHost),
              "download");
    CHECK(reinterpret_cast<const float*>(buffer.get())[12345] == 2.5f);
  }
  CHECK(pool->all_pinned());
  CHECK(pool->Get(4 << 20, ps::Device::CUDA(0)).get() == first);  // the same 4 MiB class
  // Above the bound: served from ordinary memory, not pinned for one use.
  std::shared_ptr<std::byte> big = pool->Get(5 << 20, ps::Device::CUDA(0));
  cudaPointerAttributes attributes{};
  CheckCuda(cudaPointerGetAttributes(&attributes, big.get()), "cudaPointerGetAttributes");
  CHECK(attributes.type == cudaMemoryTypeUnregistered);
#endif
}

TEST_CASE("gpu tensors: the local store takes device memory in every call", "[kvstore][cuda]") {
  if (!GpuOrSkip()) return;
#ifdef PS_TEST_CUDA
  constexpr std::size_t n = 300000;  // 1.2 MB
  std::vector<float> w(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = static_cast<float>(i % 5);
    g[i] = static_cast<float>(i % 3);
  }
  DeviceFloats w_dev(n), g_dev(n), out_dev(n);
  w_dev.Upload(w);
  g_dev.Upload(g);
  auto kv = ps::KVStore::Create("local");
  kv->Init(1, w_dev.View());
  std::vector<float> out(n);
  kv->Pull(1, ps::Tensor(out.data(), n));
  CHECK(out == w);

  // No optimizer: a push replaces the value.
  kv->Push(1, g_dev.View());
  kv->Pull(1, out_dev.View());
  kv->WaitAll();
  CHECK(out_dev.Download() == g);

  // SGD at rate 1: w = g - g = 0 after a PushPull of g.
  ps::OptimizerConfig sgd;
  sgd.learning_rate = 1.0f;
  kv->SetOptimizer(sgd);
  kv->PushPull(1, g_dev.View(), out_dev.View());
  kv->WaitAll();
  CHECK(out_dev.Download() == std::vector<float>(n, 0.0f));
#endif
}

TEST_CASE("gpu tensors: dist_sync sums are exact through frames and shared memory",
          "[kvstore][dist][cuda]") {
  if (!GpuOrSkip()) return;
#ifdef PS_TEST_CUDA
  const std::string use_shm = GENERATE("1", "0");
  INFO("PS_USE_SHM=" << use_shm);
  const bool use_pushpull = GENERATE(false, true);
  INFO((use_pushpull ? "PushPull" : "Push then Pull"));
  // Small keys, 80 KB keys (a slot each) and a 1.2 MB key sliced over both servers.
  const std::vector<std::size_t> sizes = {5, 20000, 300000};
  KVCluster cluster(2, 2,
                    Env{{"MXNET_KVSTORE_BIGARRAY_BOUND", "100000"},
                        {"PS_CHUNK_BYTES", "262144"},
                        {"PS_USE_SHM", use_shm}});
  const auto outcomes = cluster.RunWorkers(
      "dist_sync", [&](ps::KVStore& kv) { SyncSumRounds(kv, sizes, 5, use_pushpull, OnGpu()); });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
#endif
}
