#include "worker/device.h"

#include <charconv>

#include "worker/cpu_backend.h"
#include "worker/errors.h"
#if PS_WORKER_HAVE_CUDA
#include "worker/cuda_backend.h"
#endif

namespace ps::worker {

bool BuiltWithCuda() { return PS_WORKER_HAVE_CUDA != 0; }

CudaProbe ProbeCuda() {
#if PS_WORKER_HAVE_CUDA
  return ProbeCudaRuntime();
#else
  return CudaProbe{0, true, "this build has no CUDA support"};
#endif
}

namespace {

std::unique_ptr<Backend> MakeCuda([[maybe_unused]] int ordinal) {
#if PS_WORKER_HAVE_CUDA
  return MakeCudaBackend(ordinal);
#else
  throw DeviceError(
      "no CUDA device found (this build has no CUDA support: the CUDA toolkit was not found at "
      "configure time): use --device cpu");
#endif
}

}  // namespace

std::unique_ptr<Backend> CreateBackend(const std::string& device, int cuda_ordinal) {
  if (device == "cpu") return MakeCpuBackend();
  if (device == "auto") {
    const CudaProbe probe = ProbeCuda();
    if (probe.devices > 0) return MakeCuda(cuda_ordinal % probe.devices);
    if (probe.gpu_absent) return MakeCpuBackend();
    // Silently training on the CPU next to a GPU would be far slower than the user expects.
    throw DeviceError("a GPU driver is installed but CUDA cannot use it (" + probe.why +
                      "): update the NVIDIA driver, or use --device cpu");
  }
  if (device == "cuda") {
    const int count = ProbeCuda().devices;
    return MakeCuda(count > 0 ? cuda_ordinal % count : 0);  // count 0: MakeCuda explains
  }
  if (device.starts_with("cuda:")) {
    int ordinal = -1;
    const char* first = device.data() + 5;
    const char* last = device.data() + device.size();
    const auto [ptr, ec] = std::from_chars(first, last, ordinal);
    if (ec == std::errc() && ptr == last && ordinal >= 0) return MakeCuda(ordinal);
  }
  throw ConfigError("unknown --device '" + device + "': use auto, cpu, cuda or cuda:N");
}

}  // namespace ps::worker
