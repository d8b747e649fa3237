#include "device_memory.h"

#include <string>

#include <ps/error.h>

#ifdef PS_KVSTORE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ps {

#ifdef PS_KVSTORE_CUDA
namespace {

void Check(cudaError_t status, const char* what, Device device) {
  if (status != cudaSuccess) {
    throw Error(std::string("KVStore: ") + what + " on " + device.ToString() +
                " failed: " + cudaGetErrorString(status));
  }
}

}  // namespace

bool DeviceCopiesBuilt() { return true; }

void CopyFromDevice(void* host, const void* device_ptr, std::size_t bytes, Device device) {
  Check(cudaSetDevice(device.id), "selecting the device", device);
  Check(cudaMemcpy(host, device_ptr, bytes, cudaMemcpyDeviceToHost), "copying to the host", device);
}

void CopyToDevice(void* device_ptr, const void* host, std::size_t bytes, Device device) {
  Check(cudaSetDevice(device.id), "selecting the device", device);
  Check(cudaMemcpy(device_ptr, host, bytes, cudaMemcpyHostToDevice), "copying to the device",
        device);
}

#else

bool DeviceCopiesBuilt() { return false; }

void CopyFromDevice(void*, const void*, std::size_t, Device device) {
  throw Error("KVStore: a tensor on " + device.ToString() +
              " needs a build with CUDA (this one has none): stage it in host memory");
}

void CopyToDevice(void*, const void*, std::size_t, Device device) {
  throw Error("KVStore: a tensor on " + device.ToString() +
              " needs a build with CUDA (this one has none): stage it in host memory");
}

#endif

}  // namespace ps
