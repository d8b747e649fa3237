#pragma once
// GpuOrSkip(): whether a GPU test case can run (and CheckCuda for its CUDA calls), for the test
// files labelled `cuda` (built with PS_TEST_CUDA where CUDA is found). Without a GPU, or in a build
// without CUDA, the case says "no CUDA device: skipped", which those tests' SKIP_REGEX reports to
// ctest as skipped. A machine with a driver that CUDA cannot use (too old for the runtime) fails:
// skipping would hide it. The same rule as the worker's ProbeCuda (worker/device.h), which the
// kvstore tests cannot link. Include after <catch2/catch.hpp>.
#ifdef PS_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ps::test {

inline bool GpuOrSkip() {
#ifdef PS_TEST_CUDA
  int driver = 0;
  cudaDriverGetVersion(&driver);  // 0: no NVIDIA driver installed
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return true;
  if (driver != 0 && status != cudaSuccess && status != cudaErrorNoDevice) {
    FAIL("a GPU driver is installed but CUDA cannot use it: " << cudaGetErrorString(status));
  }
  WARN("no CUDA device: skipped ("
       << (status != cudaSuccess ? cudaGetErrorString(status) : "no device") << ")");
#else
  WARN("no CUDA device: skipped (this build has no CUDA)");
#endif
  return false;
}

#ifdef PS_TEST_CUDA
// Fails the test case, naming `what`, when a CUDA call failed.
inline void CheckCuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) FAIL(what << ": " << cudaGetErrorString(status));
}
#endif

}  // namespace ps::test
