// Runtime's SlowWork (ps/runtime.h): long work on the receive thread, and when to give up on it.
#include "ps/runtime.h"
#include "ps/src/log_text.h"

namespace ps {

Runtime::SlowWork Runtime::BeginSlowWork(std::string what) {
  MutexLock lock(slow_mu_);
  slow_work_ = SlowWorkState{std::move(what), RequestTracker::Clock::now()};
  return SlowWork(*this);
}

void Runtime::SlowWork::Progress() {
  MutexLock lock(runtime_.slow_mu_);
  if (runtime_.slow_work_) runtime_.slow_work_->progressed = RequestTracker::Clock::now();
}

Runtime::SlowWork::~SlowWork() {
  MutexLock lock(runtime_.slow_mu_);
  runtime_.slow_work_.reset();
  runtime_.slow_work_ended_ = RequestTracker::Clock::now();
}

std::string Runtime::StuckWork(RequestTracker::Clock::time_point now,
                               RequestTracker::Clock::time_point& reading_since) {
  MutexLock lock(slow_mu_);
  if (!slow_work_) {
    reading_since = slow_work_ended_;
    return "";
  }
  reading_since = now;
  const auto still = now - slow_work_->progressed;
  if (still < config_.heartbeat_timeout) return "";
  return slow_work_->what + " has made no progress for " +
         FormatSeconds(std::chrono::duration_cast<std::chrono::milliseconds>(still)) +
         " (PS_HEARTBEAT_TIMEOUT): the file system does not answer (a hung network mount, a "
         "failing disk?); this node gives up, as its receive thread is held there";
}

bool Runtime::AwaitSchedulerGone(std::chrono::milliseconds timeout) {
  const auto deadline = RequestTracker::Clock::now() + timeout;
  MutexLock lock(reset_mu_);
  while (!closed_peers_.contains(kSchedulerId)) {
    if (!peer_closed_.WaitUntil(reset_mu_, deadline)) return closed_peers_.contains(kSchedulerId);
  }
  return true;
}

}  // namespace ps
