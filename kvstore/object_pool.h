#pragma once
// ObjectPool<T>: objects taken and given back instead of made and destroyed, so the memory
// their members hold (vectors, strings) serves the next user: what a message's bookkeeping
// allocates once is reused by every later message. Take() allocates only when every object
// is in use; Give() never allocates. Thread-safe. Objects live as long as the pool; a taker
// resets what it needs (the pool does not know what "empty" means for T).
#include <memory>
#include <vector>

#include "ps/mutex.h"
#include "ps/thread_annotations.h"

namespace ps {

template <class T>
class ObjectPool {
 public:
  T& Take() {
    MutexLock lock(mu_);
    if (spare_.empty()) {
      all_.push_back(std::make_unique<T>());
      spare_.reserve(all_.size());
      spare_.push_back(all_.back().get());
    }
    T* item = spare_.back();
    spare_.pop_back();
    return *item;
  }
  void Give(T& item) {
    MutexLock lock(mu_);
    spare_.push_back(&item);
  }

 private:
  Mutex mu_;
  std::vector<std::unique_ptr<T>> all_ PS_GUARDED_BY(mu_);  // every object, in use or not
  std::vector<T*> spare_ PS_GUARDED_BY(mu_);                // the ones not in use
};

}  // namespace ps
