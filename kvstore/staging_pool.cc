#include "kvstore/staging_pool.h"

#include <bit>
#include <cstdlib>
#include <new>

#include "kvstore/device_memory.h"

#ifdef PS_KVSTORE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ps {
namespace {

constexpr std::size_t kSmallestClass = std::size_t{64} << 10;

std::size_t SizeClass(std::size_t bytes) {
  return bytes <= kSmallestClass ? kSmallestClass : std::bit_ceil(bytes);
}

void* OrdinaryMemory(std::size_t bytes) {
  // 64-byte aligned, as pinned memory is (at least); aligned_alloc wants a multiple of it.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

std::shared_ptr<StagingPool> StagingPool::Create(std::size_t max_idle_bytes) {
  return std::shared_ptr<StagingPool>(new StagingPool(max_idle_bytes));
}

StagingPool::~StagingPool() {
  // Only idle and let-go buffers are left: each buffer handed out holds the pool.
  MutexLock lock(mu_);
  for (const auto& [order, buffer] : idle_) Free(buffer);
  for (const Buffer& buffer : to_free_) Free(buffer);
}

std::shared_ptr<std::byte> StagingPool::Get(std::size_t bytes, Device device) {
  if (device.is_cuda()) MakeDeviceCurrent(device);
  std::vector<Buffer> doomed;
  Buffer buffer;
  const std::size_t size = SizeClass(bytes);
  {
    MutexLock lock(mu_);
    doomed.swap(to_free_);
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->second.bytes == size && it->second.device == device.id) {
        buffer = it->second;
        idle_bytes_ -= size;
        idle_.erase(it);
        break;
      }
    }
  }
  for (const Buffer& old : doomed) Free(old);  // the device is current: no stray context
  if (buffer.data == nullptr) {
    if (size > max_idle_bytes_) {
      // Too large to keep: ordinary memory, freed on release (pinning per use costs more).
      buffer = Buffer{OrdinaryMemory(bytes), 0, false, device.id};
    } else {
      buffer = Allocate(size, device);
    }
  }
  return std::shared_ptr<std::byte>(
      static_cast<std::byte*>(buffer.data),
      [pool = shared_from_this(), buffer](std::byte*) { pool->Release(buffer); });
}

StagingPool::Buffer StagingPool::Allocate(std::size_t bytes, [[maybe_unused]] Device device) {
  Buffer buffer{nullptr, bytes, false, device.id};
#ifdef PS_KVSTORE_CUDA
  // Portable: page-locked for every GPU's context, whichever the tensor is on.
  if (device.is_cuda() &&
      cudaHostAlloc(&buffer.data, bytes, cudaHostAllocPortable) == cudaSuccess) {
    buffer.pinned = true;
  } else if (device.is_cuda()) {
    cudaGetLastError();  // not the caller's error: this buffer is ordinary memory instead
    buffer.data = nullptr;
  }
#endif
  if (buffer.data == nullptr) buffer.data = OrdinaryMemory(bytes);
  MutexLock lock(mu_);
  made_any_ = true;
  all_pinned_ = all_pinned_ && buffer.pinned;
  return buffer;
}

void StagingPool::Release(const Buffer& buffer) noexcept {
  if (buffer.bytes == 0) {  // not pooled, and never pinned
    std::free(buffer.data);
    return;
  }
  MutexLock lock(mu_);
  idle_.emplace(releases_++, buffer);
  idle_bytes_ += buffer.bytes;
  while (idle_bytes_ > max_idle_bytes_) {  // the oldest go first; never the one just released
    const auto oldest = idle_.begin();
    idle_bytes_ -= oldest->second.bytes;
    to_free_.push_back(oldest->second);
    idle_.erase(oldest);
  }
}

void StagingPool::Free(const Buffer& buffer) noexcept {
#ifdef PS_KVSTORE_CUDA
  if (buffer.pinned) {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != buffer.device) {
      cudaSetDevice(buffer.device);
    }
    cudaFreeHost(buffer.data);
    cudaGetLastError();  // nobody to tell: the process may be ending
    return;
  }
#endif
  std::free(buffer.data);
}

bool StagingPool::all_pinned() const {
  MutexLock lock(mu_);
  return made_any_ && all_pinned_;
}

std::size_t StagingPool::idle_bytes() const {
  MutexLock lock(mu_);
  return idle_bytes_;
}

}  // namespace ps
