// ps-bench-gpu-staging: how fast ps-train's gradients leave the GPU. KVTrainer copies each
// parameter's gradient from device memory into one page-locked staging buffer (one copy per
// parameter, as its layer's backward ends) and pushes from there. This measures that copy,
// through the same Backend calls, against the device's peak device-to-host bandwidth (one big
// copy into page-locked memory) and against a copy into ordinary pageable memory, issued one
// copy at a time (waiting for each) and queued (one wait at the end, as KVTrainer does); and
// the local KVStore's push and pull of a tensor in the device's memory.
//
//   ps-bench-gpu-staging [--device auto|cpu|cuda|cuda:N] [--model mlp|cnn] [--repeat N]
//
// With --device cpu the same code measures memcpy, which is how the tests run it on machines
// without a GPU. docs/performance.md, "GPU figures", has the commands and the results.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "kvstore/device_memory.h"
#include "kvstore/staging_pool.h"
#include "ps/cli/cli.h"
#include "ps/kvstore.h"
#include "worker/device.h"
#include "worker/model.h"

DEFINE_string(device, "auto", "Backend: auto, cpu, cuda or cuda:N (as ps-train's --device).");
DEFINE_string(model, "mlp", "Model whose gradients are staged: mlp or cnn.");
DEFINE_int32(repeat, 20, "Timed repetitions of each measurement (the median is reported).");
DEFINE_int32(peak_mib, 256, "Size of the single copy that measures the peak bandwidth, MiB.");

namespace {

using Clock = std::chrono::steady_clock;
using ps::worker::Backend;

// Median seconds of `repeat` runs of `body` (after one untimed warm-up run).
template <class Body>
double MedianSeconds(int repeat, Body body) {
  body();
  std::vector<double> seconds;
  for (int i = 0; i < repeat; ++i) {
    const auto start = Clock::now();
    body();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

double Gbps(std::size_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }

// The peak: one big device-to-host copy into page-locked memory; and the same copy into
// ordinary pageable memory. Returns the peak, GB/s.
double MeasurePeak(Backend& backend, const std::byte* big, std::vector<std::byte>& pageable) {
  const std::size_t bytes = pageable.size();
  ps::worker::HostArray<std::byte> pinned(backend, bytes);
  const double peak = Gbps(
      bytes, MedianSeconds(FLAGS_repeat, [&] { backend.CopyToHost(pinned.data(), big, bytes); }));
  const double paged = Gbps(
      bytes, MedianSeconds(FLAGS_repeat, [&] { backend.CopyToHost(pageable.data(), big, bytes); }));
  std::printf("gpu-staging: peak: one %d MiB copy to page-locked memory: %.2f GB/s\n",
              FLAGS_peak_mib, peak);
  std::printf("gpu-staging: one %d MiB copy to pageable memory: %.2f GB/s (%.2fx peak)\n",
              FLAGS_peak_mib, paged, paged / peak);
  return peak;
}

// KVTrainer's staging: each parameter's gradient into its place in one pinned buffer, one
// copy at a time, then queued as KVTrainer queues them (every copy issued, one wait at the end).
void MeasureTrainerStaging(Backend& backend, ps::worker::Model& model, double peak) {
  std::size_t total = 0;
  for (const auto* p : model.params()) total += p->size();
  ps::worker::HostArray<float> staging(backend, total);
  const double staged = MedianSeconds(FLAGS_repeat, [&] {
    std::size_t offset = 0;
    for (auto* p : model.params()) {
      backend.CopyToHost(staging.data() + offset, p->grad.data(), p->size() * sizeof(float));
      offset += p->size();
    }
  });
  const std::size_t staged_bytes = total * sizeof(float);
  std::printf(
      "gpu-staging: %s gradients: %zu copies, %.2f MiB into one page-locked buffer: %.3f ms, "
      "%.2f GB/s (%.2fx peak)\n",
      FLAGS_model.c_str(), model.params().size(), staged_bytes / 1048576.0, staged * 1e3,
      Gbps(staged_bytes, staged), Gbps(staged_bytes, staged) / peak);
  const auto mark = backend.NewMark();
  const double queued = MedianSeconds(FLAGS_repeat, [&] {
    std::size_t offset = 0;
    for (auto* p : model.params()) {
      backend.CopyToHostAsync(staging.data() + offset, p->grad.data(), p->size() * sizeof(float));
      offset += p->size();
    }
    mark->Record();
    mark->Wait();
  });
  std::printf(
      "gpu-staging: %s gradients, copies queued, one wait: %.3f ms, %.2f GB/s (%.2fx peak)\n",
      FLAGS_model.c_str(), queued * 1e3, Gbps(staged_bytes, queued),
      Gbps(staged_bytes, queued) / peak);
}

// The KVStore's own staging of a pushed tensor in the backend's memory, through its own copy
// function: into a buffer of its StagingPool (page-locked where it can), and, as before the
// pool, into ordinary memory.
void MeasureStoreStaging(const std::byte* big, std::vector<std::byte>& pageable,
                         const ps::Device& device, double peak) {
  const std::size_t bytes = pageable.size();
  const auto pool = ps::StagingPool::Create();
  // Taken once and reused, as the store's pool keeps its buffers: the steady state.
  const std::shared_ptr<std::byte> pooled = pool->Get(bytes, device);
  const double store_pinned =
      Gbps(bytes,
           MedianSeconds(FLAGS_repeat, [&] { ps::CopyToHost(pooled.get(), big, bytes, device); }));
  const double store_paged = Gbps(bytes, MedianSeconds(FLAGS_repeat, [&] {
                                    ps::CopyToHost(pageable.data(), big, bytes, device);
                                  }));
  std::printf(
      "gpu-staging: KVStore staging of a %d MiB tensor: %.2f GB/s (%.2fx peak) into its pool's "
      "buffers (page-locked: %s), %.2f GB/s into ordinary memory\n",
      FLAGS_peak_mib, store_pinned, store_pinned / peak, pool->all_pinned() ? "yes" : "no",
      store_paged);
}

// End to end: the tensor pushed to a local store (staged, then copied into the stored value)
// and pulled back.
void MeasureLocalStore(std::byte* big, std::vector<std::byte>& pageable, const ps::Device& device,
                       double peak) {
  const std::size_t bytes = pageable.size();
  const std::size_t floats = bytes / sizeof(float);
  const ps::Tensor on_device(big, floats, ps::DType::kFloat32, device);
  std::unique_ptr<ps::KVStore> kv = ps::KVStore::Create("local");
  kv->Init(0, ps::Tensor(reinterpret_cast<float*>(pageable.data()), floats));
  const double push = MedianSeconds(FLAGS_repeat, [&] {
    kv->Push(0, on_device);
    kv->WaitAll();
  });
  const double pull = MedianSeconds(FLAGS_repeat, [&] {
    kv->Pull(0, on_device);
    kv->WaitAll();
  });
  std::printf("gpu-staging: local KVStore push of a %d MiB %s tensor: %.2f GB/s (%.2fx peak)\n",
              FLAGS_peak_mib, device.ToString().c_str(), Gbps(bytes, push),
              Gbps(bytes, push) / peak);
  std::printf("gpu-staging: local KVStore pull into a %d MiB %s tensor: %.2f GB/s\n",
              FLAGS_peak_mib, device.ToString().c_str(), Gbps(bytes, pull));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "ps-bench-gpu-staging: device-to-host gradient staging bandwidth of ps-train against the "
      "peak.\nusage: ps-bench-gpu-staging [--device auto|cpu|cuda|cuda:N] [--model mlp|cnn] "
      "[--repeat N]";
  if (ps::cli::HelpOrParseFlags(&argc, &argv, usage, "gpu_staging_bench.cc")) return 0;
  if (FLAGS_repeat < 1 || FLAGS_peak_mib < 1) {
    std::fprintf(stderr, "ps-bench-gpu-staging: error: --repeat and --peak-mib must be >= 1\n");
    return 2;
  }
  try {
    std::unique_ptr<Backend> backend = ps::worker::CreateBackend(FLAGS_device);
    auto model = ps::worker::BuildModel(FLAGS_model, *backend, 64);
    std::printf("gpu-staging: device %s, model %s, median of %d\n", backend->Name().c_str(),
                FLAGS_model.c_str(), FLAGS_repeat);
    const std::size_t peak_bytes = static_cast<std::size_t>(FLAGS_peak_mib) << 20;
    ps::worker::DeviceArray<std::byte> big(*backend, peak_bytes);
    backend->Fill(reinterpret_cast<float*>(big.data()), peak_bytes / sizeof(float), 1.0f);
    std::vector<std::byte> pageable(peak_bytes);
    const double peak = MeasurePeak(*backend, big.data(), pageable);
    MeasureTrainerStaging(*backend, *model, peak);
    const ps::Device device = backend->kind() == ps::worker::DeviceKind::kCUDA
                                  ? ps::Device::CUDA(backend->ordinal())
                                  : ps::Device::CPU();
    MeasureStoreStaging(big.data(), pageable, device, peak);
    MeasureLocalStore(big.data(), pageable, device, peak);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps-bench-gpu-staging: error: %s\n", e.what());
    return 1;
  }
}
