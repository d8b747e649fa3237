// Runtime's SlowWork (ps/runtime.h): long work on the receive thread or in a worker's collective
// call, and when to give up on it.
#include "ps/runtime.h"
#include "ps/src/log_text.h"

namespace ps {

Runtime::SlowWork Runtime::BeginSlowWork(std::string what, SlowWorkThread thread) {
  MutexLock lock(slow_mu_);
  ++slow_work_depth_;
  slow_work_ = SlowWorkState{std::move(what), RequestTracker::Clock::now(), thread};
  return SlowWork(*this);
}

void Runtime::SlowWork::Progress() {
  MutexLock lock(runtime_.slow_mu_);
  if (runtime_.slow_work_) runtime_.slow_work_->progressed = RequestTracker::Clock::now();
}

void Runtime::SlowWork::Doing(std::string what) {
  MutexLock lock(runtime_.slow_mu_);
  const SlowWorkThread thread =
      runtime_.slow_work_ ? runtime_.slow_work_->thread : SlowWorkThread::kReceive;
  runtime_.slow_work_ = SlowWorkState{std::move(what), RequestTracker::Clock::now(), thread};
}

Runtime::SlowWork::~SlowWork() {
  MutexLock lock(runtime_.slow_mu_);
  if (--runtime_.slow_work_depth_ > 0) return;  // an outer one goes on
  runtime_.slow_work_.reset();
  runtime_.slow_work_ended_ = RequestTracker::Clock::now();
  runtime_.slow_work_changed_.NotifyAll();
}

std::string Runtime::StuckWork(RequestTracker::Clock::time_point now,
                               RequestTracker::Clock::time_point& reading_since) {
  MutexLock lock(slow_mu_);
  if (!slow_work_) {
    reading_since = slow_work_ended_;
    return "";
  }
  const bool receive = slow_work_->thread == SlowWorkThread::kReceive;
  // Only work on the receive thread keeps it from reading.
  reading_since = receive ? now : slow_work_ended_;
  // A pause of this process (SIGSTOP, a frozen machine) held the work too.
  const auto still = now - std::max(slow_work_->progressed, pause_watch_.last_pause_ended());
  if (still < config_.heartbeat_timeout) return "";
  return slow_work_->what + " has made no progress for " +
         FormatSeconds(std::chrono::duration_cast<std::chrono::milliseconds>(still)) +
         " (PS_HEARTBEAT_TIMEOUT): the file system does not answer (a hung network mount, a "
         "failing disk?); this node gives up, as " +
         (receive ? "its receive thread is held there" : "the job waits for that call");
}

void Runtime::GiveUpOnStuckWork(const std::string& why) {
  {
    MutexLock lock(slow_mu_);
    // (A work that has ended meanwhile holds no thread.)
    if (slow_work_ && slow_work_->thread == SlowWorkThread::kReceive) {
      receive_thread_stuck_.store(true);
    }
  }
  // First the news (the log may be on the same stuck file system). Not ReportFailure: its
  // answer would come to the held receive thread.
  Message notice;
  notice.meta.control = Control::kNodeFailed;
  notice.meta.request = true;
  notice.meta.recipient = kSchedulerId;
  notice.meta.error = why;  // the scheduler names this node before it
  SendToNode(notice);
  Fail(self_.Describe() + ": " + why);
}

bool Runtime::AwaitSlowWorkEnd(std::chrono::milliseconds timeout) {
  const auto deadline = RequestTracker::Clock::now() + timeout;
  MutexLock lock(slow_mu_);
  while (slow_work_depth_ > 0) {
    if (!slow_work_changed_.WaitUntil(slow_mu_, deadline)) return slow_work_depth_ == 0;
  }
  return true;
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
