#include "kvstore/device_memory.h"

#include <cstring>
#include <string>

#include "kvstore/call_checks.h"
#include "ps/error.h"

#ifdef PS_KVSTORE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ps {

#ifdef PS_KVSTORE_CUDA
namespace {

void Check(cudaError_t status, const char* what, Device device) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear it, so that the caller's next CUDA call is not blamed for it
  std::string why = cudaGetErrorString(status);
  // CUDA's words for a machine without a GPU name the driver's version, not its absence.
  if (status == cudaErrorInsufficientDriver) {
    why +=
        " (no NVIDIA driver is loaded on this machine, or one older than this build's CUDA "
        "runtime: a tensor on " +
        device.ToString() + " needs a GPU and its driver; use host memory otherwise)";
  } else if (status == cudaErrorNoDevice) {
    why += " (this machine has no GPU: a tensor on " + device.ToString() +
           " needs one; use host memory otherwise)";
  }
  throw Error(std::string(what) + " on " + device.ToString() + " failed: " + why);
}

// Makes `device` current on the calling thread when it is not already. Not restored
// afterwards: switching back would create a context on the previous device (device 0 on a
// thread that never chose one, such as the runtime's receive thread), a few hundred MB on a GPU
// the process may never use. The training backend selects its own device at every call.
void UseDevice(Device device) {
  int current = -1;
  Check(cudaGetDevice(&current), "reading the current device", device);
  if (current != device.id) Check(cudaSetDevice(device.id), "selecting the device", device);
}

}  // namespace

bool DeviceCopiesBuilt() { return true; }

void MakeDeviceCurrent(Device device) { UseDevice(device); }

void CheckDevice(Device device) {
  int count = 0;
  Check(cudaGetDeviceCount(&count), "counting the devices", device);
  if (device.id < 0 || device.id >= count) {
    throw Error(device.ToString() + " does not exist (this machine has " + std::to_string(count) +
                " GPU" + (count == 1 ? "" : "s") + ")");
  }
}

void CopyFromDevice(void* host, const void* device_ptr, std::size_t bytes, Device device) {
  UseDevice(device);
  Check(cudaMemcpy(host, device_ptr, bytes, cudaMemcpyDeviceToHost), "copying to the host", device);
}

void CopyToDevice(void* device_ptr, const void* host, std::size_t bytes, Device device) {
  UseDevice(device);
  Check(cudaMemcpy(device_ptr, host, bytes, cudaMemcpyHostToDevice), "copying to the device",
        device);
  // From pageable memory cudaMemcpy may return before the data reaches the GPU, and the
  // caller's kernels may run on a non-blocking stream that is not ordered after the legacy
  // stream: wait, so that a completed Pull means the value is in device memory.
  Check(cudaStreamSynchronize(cudaStreamLegacy), "copying to the device", device);
}

#else

bool DeviceCopiesBuilt() { return false; }

void MakeDeviceCurrent(Device device) { CheckDevice(device); }

void CheckDevice(Device device) {
  throw Error("a tensor on " + device.ToString() +
              " needs a build with CUDA (this one has none): stage it in host memory");
}

void CopyFromDevice(void*, const void*, std::size_t, Device device) { CheckDevice(device); }

void CopyToDevice(void*, const void*, std::size_t, Device device) { CheckDevice(device); }

#endif

void CopyToHost(void* host, const void* source, std::size_t bytes, Device device) {
  if (device.is_cuda()) {
    CopyFromDevice(host, source, bytes, device);
  } else if (bytes != 0) {
    std::memcpy(host, source, bytes);
  }
}

void CopyFromHost(void* target, Device device, const void* host, std::size_t bytes) {
  if (device.is_cuda()) {
    CopyToDevice(target, host, bytes, device);
  } else if (bytes != 0) {
    std::memcpy(target, host, bytes);
  }
}

HostViews StageOnHost(StagingPool& pool, std::string_view store, std::string_view op,
                      std::span<const Key> keys, std::span<const Tensor> tensors) {
  HostViews views;
  views.tensors.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.device().is_cuda()) {
      views.tensors.push_back(t);
      continue;
    }
    std::shared_ptr<std::byte>& copy = views.buffers.emplace_back();
    checks::NamingKey(store, op, keys[i], [&] {
      copy = pool.Get(t.bytes(), t.device());
      CopyFromDevice(copy.get(), t.data(), t.bytes(), t.device());
    });
    views.tensors.emplace_back(copy.get(), t.size(), t.dtype());
  }
  return views;
}

}  // namespace ps
