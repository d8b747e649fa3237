#include "ps/src/block_pool.h"

#include <new>

namespace ps {

BlockPool::~BlockPool() {
  for (void* block : free_) ::operator delete(block);
}

void* BlockPool::Take(std::size_t bytes) {
  {
    MutexLock lock(mu_);
    if (block_bytes_ == 0) block_bytes_ = bytes;
    if (bytes == block_bytes_ && !free_.empty()) {
      void* block = free_.back();
      free_.pop_back();
      return block;
    }
  }
  return ::operator new(bytes);
}

void BlockPool::Give(void* block, std::size_t bytes) {
  {
    MutexLock lock(mu_);
    if (bytes == block_bytes_ && free_.size() < kMaxFree) {
      free_.push_back(block);
      return;
    }
  }
  ::operator delete(block);
}

}  // namespace ps
