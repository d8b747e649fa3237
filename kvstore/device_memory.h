#pragma once
// Copies between host memory and GPU memory for KVStore tensors. In a build with CUDA these
// call the CUDA runtime; without it they throw ps::Error saying so. The KVStore never sends
// from or receives into GPU memory directly: a pushed GPU tensor is copied to a host buffer
// first, a pulled value is copied from the received frame to the GPU.
#include <cstddef>

#include <ps/tensor.h>

namespace ps {

// True when this build can copy to and from GPU memory.
bool DeviceCopiesBuilt();
// host <- device (`device` names the GPU); throws ps::Error naming the CUDA error.
void CopyFromDevice(void* host, const void* device_ptr, std::size_t bytes, Device device);
// device <- host.
void CopyToDevice(void* device_ptr, const void* host, std::size_t bytes, Device device);

}  // namespace ps
