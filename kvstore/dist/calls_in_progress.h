#pragma once
// The threads inside a store's calls, counted so that its destructor can make them return
// before it frees what they use. A store destroyed while another thread of the program was in
// Barrier (or Init, SetOptimizer, a checkpoint) freed the condition variable that thread slept
// on, and the process hung for ever in pthread_cond_destroy.
#include <chrono>
#include <string>
#include <string_view>

#include "ps/error.h"
#include "ps/mutex.h"
#include "ps/thread_annotations.h"

namespace ps {

class CallsInProgress {
 public:
  // Held by the thread making a call, for the call's length. Throws ps::Error once the store is
  // closing (Close), naming `store` and `op` ("dist kvstore", "Push"). Allocates nothing
  // otherwise: every Push and Pull makes one (bench.alloc_per_op counts them).
  class Call {
   public:
    Call(CallsInProgress& calls, std::string_view store, std::string_view op) : calls_(calls) {
      MutexLock lock(calls_.mu_);
      if (calls_.closing_) {
        throw Error(std::string(store) + ": " + std::string(op) +
                    " on a KVStore that is being destroyed");
      }
      ++calls_.active_;
    }
    // The last thing the calling thread does with the store: once it unlocks, the closing
    // thread may free everything.
    ~Call() {
      MutexLock lock(calls_.mu_);
      if (--calls_.active_ == 0 && calls_.closing_) calls_.none_.NotifyAll();
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    CallsInProgress& calls_;
  };

  // From now on every call throws; returns how many are in progress now.
  int Close() {
    MutexLock lock(mu_);
    closing_ = true;
    return active_;
  }

  // After Close: waits until no call is in progress, or until `deadline`; returns whether none
  // is.
  bool AwaitNone(std::chrono::steady_clock::time_point deadline) {
    MutexLock lock(mu_);
    while (active_ > 0) {
      if (!none_.WaitUntil(mu_, deadline)) return active_ == 0;
    }
    return true;
  }

 private:
  Mutex mu_;
  CondVar none_;  // notified when the last call leaves a closing store
  int active_ PS_GUARDED_BY(mu_) = 0;
  bool closing_ PS_GUARDED_BY(mu_) = false;
};

}  // namespace ps
