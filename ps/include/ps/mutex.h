#pragma once
// Mutexes whose contracts the compiler checks: std::mutex and std::shared_mutex as Clang
// capabilities (ps/thread_annotations.h), their scoped locks, and a condition variable that
// waits on a held Mutex. A member written PS_GUARDED_BY(mu_) is then read or written only
// with mu_ held, and a function written PS_REQUIRES(mu_) only called with it held, or the
// clang build (-Wthread-safety, preset clang-thread-safety) fails.
//
// Installed with the public headers because they hold these as private members; not meant as
// an API of its own. Each type costs what the standard one it wraps costs: the locks and
// CondVar inline to the same calls std::lock_guard and std::condition_variable make.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "ps/thread_annotations.h"

namespace ps {

class CondVar;

// std::mutex, annotated. Locked through MutexLock; Lock/Unlock for what a scope cannot hold.
class PS_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() PS_ACQUIRE() { mu_.lock(); }
  void Unlock() PS_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// std::shared_mutex, annotated: one writer (ExclusiveLock) or many readers (SharedLock).
class PS_CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() PS_ACQUIRE() { mu_.lock(); }
  void Unlock() PS_RELEASE() { mu_.unlock(); }
  void LockShared() PS_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() PS_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex for its scope. Unlock() gives it up early (Lock() takes it back), for the
// stretch of a scope that must run without it.
class PS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) PS_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() PS_RELEASE() {
    if (locked_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() PS_RELEASE() {
    mu_.Unlock();
    locked_ = false;
  }
  void Lock() PS_ACQUIRE() {
    mu_.Lock();
    locked_ = true;
  }

 private:
  Mutex& mu_;
  bool locked_ = true;
};

// Holds a SharedMutex exclusively for its scope.
class PS_SCOPED_CAPABILITY ExclusiveLock {
 public:
  explicit ExclusiveLock(SharedMutex& mu) PS_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~ExclusiveLock() PS_RELEASE() { mu_.Unlock(); }
  ExclusiveLock(const ExclusiveLock&) = delete;
  ExclusiveLock& operator=(const ExclusiveLock&) = delete;

 private:
  SharedMutex& mu_;
};

// Holds a SharedMutex shared for its scope.
class PS_SCOPED_CAPABILITY SharedLock {
 public:
  explicit SharedLock(SharedMutex& mu) PS_ACQUIRE_SHARED(mu) : mu_(mu) { mu_.LockShared(); }
  ~SharedLock() PS_RELEASE() { mu_.UnlockShared(); }
  SharedLock(const SharedLock&) = delete;
  SharedLock& operator=(const SharedLock&) = delete;

 private:
  SharedMutex& mu_;
};

// std::condition_variable for a Mutex the caller holds (through a MutexLock, say). The waits
// take no predicate: the caller loops on its condition, where the analysis sees the lock, e.g.
//   MutexLock lock(mu_);
//   while (!done_) done_changed_.Wait(mu_);
// Each wait releases mu while blocked and holds it again when it returns; wakeups may be
// spurious, as with the standard one.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex& mu) PS_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  // False when it returned because `deadline` passed.
  template <class Clock, class Duration>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline)
      PS_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // False when it returned because `timeout` passed.
  template <class Rep, class Period>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout) PS_REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }
  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace ps
