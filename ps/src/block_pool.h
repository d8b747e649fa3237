#pragma once
// BlockPool: recycles equal-sized heap blocks through a free list, so that an object made and
// dropped once per message (the reference-counted holder of a received ZeroMQ frame) costs no
// malloc in steady state. Blocks may be given back on any thread (the last reference to a
// frame can drop on a ZeroMQ I/O thread or a caller's), hence the mutex. Allocators share the
// pool (shared_ptr), so it lives as long as the last block it handed out.
#include <cstddef>
#include <memory>
#include <vector>

#include "ps/mutex.h"
#include "ps/thread_annotations.h"

namespace ps {

class BlockPool {
 public:
  BlockPool() = default;
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of `bytes` (suitably aligned for any object); pooled when `bytes` is the size the
  // pool serves (fixed by its first request), plain operator new otherwise.
  void* Take(std::size_t bytes);
  void Give(void* block, std::size_t bytes);

 private:
  // Free blocks kept at most: more than this, after a burst, go back to the heap.
  static constexpr std::size_t kMaxFree = 4096;
  Mutex mu_;
  std::size_t block_bytes_ PS_GUARDED_BY(mu_) = 0;
  std::vector<void*> free_ PS_GUARDED_BY(mu_);
};

// A standard allocator drawing from a shared BlockPool (std::allocate_shared's control blocks).
template <class T>
class PoolAllocator {
 public:
  using value_type = T;
  explicit PoolAllocator(std::shared_ptr<BlockPool> pool) : pool_(std::move(pool)) {}
  template <class U>
  PoolAllocator(const PoolAllocator<U>& other) : pool_(other.pool()) {}  // NOLINT: rebinding

  T* allocate(std::size_t n) { return static_cast<T*>(pool_->Take(n * sizeof(T))); }
  void deallocate(T* block, std::size_t n) { pool_->Give(block, n * sizeof(T)); }
  const std::shared_ptr<BlockPool>& pool() const { return pool_; }

  template <class U>
  bool operator==(const PoolAllocator<U>& other) const {
    return pool_ == other.pool();
  }

 private:
  std::shared_ptr<BlockPool> pool_;
};

}  // namespace ps
