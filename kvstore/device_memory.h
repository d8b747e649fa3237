#pragma once
// Copies between host memory and GPU memory for KVStore tensors. In a build with CUDA these
// call the CUDA runtime; without it they throw ps::Error saying so. The KVStore never sends
// from or receives into GPU memory directly: a pushed GPU tensor is copied to a host buffer
// first, a pulled value is copied from the received frame to the GPU. Errors name the device
// and the step; the caller names the store, the call and the key (checks::NamingKey).
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvstore/staging_pool.h"
#include "ps/tensor.h"

namespace ps {

// True when this build can copy to and from GPU memory.
bool DeviceCopiesBuilt();
// Throws ps::Error when `device` does not exist (or the build has no CUDA). Lets a call check
// an output's device before it changes anything; changes nothing itself. The copies below make
// their tensor's device current on the calling thread when it is not (and leave it so).
void CheckDevice(Device device);
// Makes `device` (a GPU) current on the calling thread when it is not; throws ps::Error.
void MakeDeviceCurrent(Device device);
// host <- device (`device` names the GPU); throws ps::Error naming the CUDA error.
void CopyFromDevice(void* host, const void* device_ptr, std::size_t bytes, Device device);
// device <- host; returns once the data is in device memory.
void CopyToDevice(void* device_ptr, const void* host, std::size_t bytes, Device device);

// host <- `source`, which lives on `device` (a memcpy for CPU memory).
void CopyToHost(void* host, const void* source, std::size_t bytes, Device device);
// `target`, which lives on `device`, <- host (a memcpy for CPU memory).
void CopyFromHost(void* target, Device device, const void* host, std::size_t bytes);

// Host-memory views of tensors: a CPU tensor as given, a GPU tensor as a copy in a buffer
// owned here (from `pool`: page-locked). Keep this alive while the views are used.
struct HostViews {
  std::vector<Tensor> tensors;                      // one per input, same order
  std::vector<std::shared_ptr<std::byte>> buffers;  // the copies of the GPU tensors
};
// tensors[i] belongs to keys[i]; a failed copy's ps::Error names the store, op and key.
HostViews StageOnHost(StagingPool& pool, std::string_view store, std::string_view op,
                      std::span<const Key> keys, std::span<const Tensor> tensors);

}  // namespace ps
