#pragma once
// StagingPool: host buffers for GPU tensors on their way to the network. A copy from device
// memory into pageable memory goes through the driver's own page-locked bounce buffer, at a
// fraction of the bus's speed; into page-locked (pinned) memory it is one DMA. Pinning is a
// slow call (about a millisecond per megabyte, and it synchronizes the device), so buffers are
// kept and handed out again, by size class (powers of two from 64 KiB), up to max_idle_bytes of
// idle ones; past that the least recently released go. A request larger than that bound gets
// ordinary memory, not pooled: pinning it again for every use would cost more than it saves.
//
// Thread-safety and threads: Get and the release of a buffer may run on any thread. A buffer
// returns to the pool when its last owner lets go, which may be a ZeroMQ I/O thread after the
// frame went out, after the store that made the pool is gone: every buffer holds its pool
// alive. Releasing never calls CUDA: buffers the pool lets go are freed by the next Get, on a
// thread that has just made their GPU current, or by the pool's destructor, which makes each
// one's GPU current first (a CUDA call on a thread without a current GPU would start a context
// on GPU 0, hundreds of MB, in a process that may use another). In a build without CUDA, or
// where pinning fails (a container's locked-memory limit), buffers are ordinary memory.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "ps/mutex.h"
#include "ps/tensor.h"
#include "ps/thread_annotations.h"

namespace ps {

class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  static constexpr std::size_t kDefaultMaxIdleBytes = std::size_t{256} << 20;

  static std::shared_ptr<StagingPool> Create(std::size_t max_idle_bytes = kDefaultMaxIdleBytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A buffer of at least `bytes` bytes (uninitialized) for copies from `device`, page-locked
  // where this build can. Makes `device` current on the calling thread (as the copies do).
  std::shared_ptr<std::byte> Get(std::size_t bytes, Device device);
  // Whether every buffer this pool made was page-locked (false without CUDA).
  bool all_pinned() const;
  // Bytes of released buffers held for reuse (tests).
  std::size_t idle_bytes() const;

 private:
  struct Buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    bool pinned = false;
    int device = 0;  // the GPU it was pinned for: current when it is freed
  };

  explicit StagingPool(std::size_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}
  Buffer Allocate(std::size_t bytes, Device device);
  void Release(const Buffer& buffer) noexcept;
  static void Free(const Buffer& buffer) noexcept;

  const std::size_t max_idle_bytes_;
  mutable Mutex mu_;
  // Released buffers by the order of their release (the oldest first out when over the bound).
  std::map<std::uint64_t, Buffer> idle_ PS_GUARDED_BY(mu_);
  std::uint64_t releases_ PS_GUARDED_BY(mu_) = 0;
  std::size_t idle_bytes_ PS_GUARDED_BY(mu_) = 0;
  std::vector<Buffer> to_free_ PS_GUARDED_BY(mu_);  // let go, freed by the next Get
  bool all_pinned_ PS_GUARDED_BY(mu_) = true;
  bool made_any_ PS_GUARDED_BY(mu_) = false;
};

}  // namespace ps
