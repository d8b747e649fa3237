// DistKVStore's waits: WaitAll, Wait and WaitPulls, how an operation completes, and the reports
// of a wait that lasts (what it waits for, and why a dist_sync round may not be done).
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <set>
#include <thread>
#include <tuple>

#include "kvstore/call_checks.h"
#include "kvstore/dist/dist_kvstore.h"
#include "kvstore/dist/dist_kvstore_common.h"
#include "ps/src/internal.h"
#include "ps/src/log_text.h"

namespace ps {

using dist_detail::kStore;

namespace {
// Bytes on their way to the servers worth naming in a long wait's note: more than a few
// requests' headers.
constexpr std::uint64_t kNotableBytesOnTheWay = 64 * 1024;

// "key 3" or "keys 1, 3, 7", the first 8 of them and how many more.
std::string KeyList(const std::set<Key>& keys) {
  constexpr std::size_t kShown = 8;
  std::string text = keys.size() == 1 ? "key " : "keys ";
  std::size_t shown = 0;
  for (const Key key : keys) {
    if (shown == kShown) {
      text += " and " + std::to_string(keys.size() - kShown) + " more";
      break;
    }
    text += (shown++ == 0 ? "" : ", ") + std::to_string(key);
  }
  return text;
}
}  // namespace

void DistKVStore::Complete(const std::string& error, Failure failure, std::span<const Key> keys,
                           bool pulls, ErrorKind error_kind) {
  MutexLock lock(ops_mu_);
  if (!error.empty()) {
    const auto failed =
        std::make_shared<const FailedOp>(FailedOp{++failed_ops_, error, failure, error_kind});
    if (!first_failed_) first_failed_ = failed;
    for (const Key key : keys) failed_keys_.try_emplace(key, failed);
  }
  bool key_done = false;  // a key with nothing (or no pull) left in flight: a Wait may return
  for (const Key key : keys) {
    key_done = --key_ops_[key] == 0 || key_done;
    if (pulls) key_done = --key_pulls_[key] == 0 || key_done;
  }
  if (--outstanding_ == 0 || key_done) ops_done_.NotifyAll();
}

template <typename Done, typename Poll>
void DistKVStore::WaitUntil(Done done, Poll poll, std::span<const Key> keys) {
  // Waking a thread that sleeps on the condition variable costs more than a small operation's
  // whole round trip on a virtual machine (its CPU halts and needs an interrupt to come back),
  // so poll for up to PS_WAIT_SPIN_US first, yielding the CPU to runnable threads. Only while
  // waits are short: after a wait longer than the spin (big tensors, a slow round) polling
  // would only take CPU from the caller's computation, so the next wait sleeps at once.
  const auto spin = runtime_->config().wait_spin;
  const auto start = std::chrono::steady_clock::now();
  const bool waiting = !poll();
  if (waiting && spin.count() > 0 && last_wait_short_.load()) {
    const auto until = start + spin;
    while (!poll() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  }
  MutexLock lock(ops_mu_);
  // dist_sync: a wait that lasts is reported as a stall, again after twice the time, up to
  // kMaxStallReportGap apart, while it lasts (a report lost, servers that forgot it).
  Runtime::StallSchedule reports(start);
  WaitStall stall(*this, keys, false);
  // A wait that lasts is logged too, for the person watching a job that seems still.
  auto next_note = start + runtime_->config().long_wait_note();
  while (!done()) {
    if (!sync_) {
      ops_done_.Wait(ops_mu_);
      continue;
    }
    if (ops_done_.WaitUntil(ops_mu_, std::min(reports.next(), next_note)) || done()) continue;
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_note) {
      NoteLongWait(now - start, keys);
      next_note = now + ClusterConfig::kLongWaitNoteEvery;
    }
    if (now < reports.next()) continue;
    lock.Unlock();  // reporting takes other locks of this store (the ring's)
    stall.Tick();
    lock.Lock();
    reports.Reported();
  }
  stall.End();
  if (waiting) last_wait_short_.store(std::chrono::steady_clock::now() - start <= spin);
  if (std::optional<FailedOp> failed = TakeFailure(keys)) {
    lock.Unlock();
    Raise(failed->kind, failed->error, failed->failure);
  }
}

std::optional<DistKVStore::FailedOp> DistKVStore::TakeFailure(std::span<const Key> keys) {
  std::shared_ptr<const FailedOp> taken;
  if (keys.empty()) {  // WaitAll: everything kept is reported, the first failure named
    taken = first_failed_;
    for (const auto& [key, failed] : failed_keys_) {
      if (!taken || failed->number < taken->number) taken = failed;
    }
    if (!taken) return std::nullopt;
    FailedOp reported = *taken;
    std::set<std::uint64_t> others;
    std::set<Key> other_keys;
    for (const auto& [key, failed] : failed_keys_) {
      if (failed->number == taken->number) continue;
      others.insert(failed->number);
      other_keys.insert(key);
    }
    if (!others.empty()) {
      reported.error += " (and " + std::to_string(others.size()) +
                        " more operation(s) failed, on " + KeyList(other_keys) + ")";
    }
    first_failed_.reset();
    failed_keys_.clear();
    return reported;
  }
  for (const Key key : keys) {
    if (const auto it = failed_keys_.find(key); it != failed_keys_.end()) {
      taken = it->second;
      break;
    }
  }
  if (!taken) {
    // None of `keys` failed: the first failure still reaches a waiter, while the keys it
    // failed on keep it for their own waits.
    taken = std::exchange(first_failed_, nullptr);
    return taken ? std::optional<FailedOp>(*taken) : std::nullopt;
  }
  std::erase_if(failed_keys_, [&](const auto& entry) { return entry.second == taken; });
  if (first_failed_ == taken) first_failed_.reset();
  return *taken;
}

void DistKVStore::NoteLongWait(std::chrono::steady_clock::duration waited,
                               std::span<const Key> keys) const {
  const std::string call = keys.empty() ? "WaitAll"
                                        : "a wait for key " + std::to_string(keys[0]) +
                                              (keys.size() > 1 ? " and others" : "");
  // This worker's own pushes may still be on their way: then its link, not another worker,
  // is what the round waits for.
  std::uint64_t on_the_way = 0;
  std::string servers;
  for (const NodeInfo& node : runtime_->nodes()) {
    if (node.role != Role::kServer) continue;
    if (const std::uint64_t bytes = runtime_->BytesOnTheWayTo(node.id); bytes > 0) {
      on_the_way += bytes;
      servers += (servers.empty() ? "" : ", ") + std::to_string(node.rank);
    }
  }
  const std::string own =
      on_the_way < kNotableBytesOnTheWay
          ? ""
          : "; " + std::to_string(on_the_way / 1024) +
                " KiB of this worker's own messages are still on their way to server(s) " +
                servers +
                " (in its TCP send buffers, or sent and not yet acknowledged): a "
                "slow link holds the round up too";
  PS_LOG(WARNING) << "worker " << Rank() << ": " << call << " has waited "
                  << FormatSeconds(std::chrono::duration_cast<std::chrono::milliseconds>(waited))
                  << " for dist_sync rounds: a round completes once every worker pushed its "
                     "key, so a worker still computing, or one whose pushes are still on their "
                     "way, holds the others up (the job goes on once they arrive; one that "
                     "died or finished ends the wait with an error)"
                  << own;
}

DistKVStore::StallGate DistKVStore::Gate() const {
  return {runtime_->server_events_applied(), runtime_->connection_reset_count()};
}

DistKVStore::WaitStall::WaitStall(DistKVStore& store, std::span<const Key> keys, bool in_vote)
    : store_(store), keys_(keys), in_vote_(in_vote), gate_(store.Gate()) {}

void DistKVStore::WaitStall::Tick() {
  // Pushes of this worker sent again after a server death or a connection reset must be in
  // before the servers hear of the stall: it is reported only once neither changed for a gap.
  const StallGate now = store_.Gate();
  if (now == gate_) {
    if (!report_) {
      report_ = std::make_shared<StallReport>(std::this_thread::get_id());
      ++store_.stalled_waiters_;
    }
    store_.ReportStall(keys_, gate_, report_, in_vote_);
  }
  gate_ = now;
}

void DistKVStore::WaitStall::End() {
  if (!report_) return;
  --store_.stalled_waiters_;
  {
    MutexLock ended(report_->mu);
    report_->waiting = false;
    if (report_->reported) store_.runtime_->EndStall();
  }
  report_.reset();  // after its mutex is released: this may be the last reference
}

std::pair<std::uint64_t, std::uint64_t> DistKVStore::StallOfThreads() {
  MutexLock lock(stall_mu_);
  const std::uint64_t pushes = push_count_.load();
  if (threads_stall_.number == 0 || threads_stall_.push_count != pushes) {
    threads_stall_ = {++stalls_, pushes};
  }
  return {threads_stall_.number, threads_stall_.push_count};
}

void DistKVStore::ReportStall(std::span<const Key> keys, const StallGate& gate,
                              const std::shared_ptr<StallReport>& report, bool in_vote) noexcept {
  try {
    // Alone (the waiting thread is the only one that pushes, and the only one that waits
    // this long, not in a vote): this wait's own number. Else one that changes with every
    // push, shared by the waiting threads, so that their reports agree.
    const bool alone = !in_vote && OnlyCallerPushes() && stalled_waiters_.load() == 1;
    std::uint64_t number = 0;
    std::uint64_t pushes = 0;
    if (alone) {
      MutexLock lock(report->mu);
      if (report->alone_stall == 0) report->alone_stall = ++stalls_;
      number = report->alone_stall;
    } else {
      std::tie(number, pushes) = StallOfThreads();
    }
    // The keys waited for (none: WaitAll, every key), in notices of at most the slices one
    // message holds (a key named twice in one is refused), which the servers add up.
    const std::set<Key> waited(keys.begin(), keys.end());
    std::vector<kv::Request> notices(1);
    for (const Key key : waited) {
      if (notices.back().slices.size() == kv::kMaxSlicesPerMessage) notices.emplace_back();
      notices.back().slices.push_back(kv::SliceRef{key, 0, 0});
    }
    const std::vector<int> servers = LiveServerRanks();
    if (servers.empty()) return;
    const auto send = [&](kv::Request& notice, RequestTracker::Callback done) {
      notice.command = kv::kStalled;
      notice.stall = number;
      notice.membership = gate.server_events;
      std::vector<Message> messages;
      for (const int s : servers)
        messages.push_back(kv::RequestMessage(notice, runtime_->ServerId(s)));
      runtime_->Request(messages, std::move(done),
                        std::chrono::steady_clock::now() + Runtime::kMaxStallReportGap);
    };
    // Each server handles a connection's messages in order: the last notice's answers say
    // that the others arrived too.
    for (std::size_t n = 0; n + 1 < notices.size(); ++n) send(notices[n], [](RequestResult&&) {});
    // Every push this worker sent is ahead of its notices on the same connection (none was
    // sent again meanwhile: the gate held still); once every server answered, the scheduler
    // may ask them what this worker's requests wait for. The callback touches this store only
    // while the wait goes on (the store outlives every wait).
    send(notices.back(), [this, report, gate, alone, number, pushes](RequestResult&& result) {
      MutexLock lock(report->mu);
      if (!report->waiting || !result.ok() || Gate() != gate) return;
      // Alone: whether a thread other than the waiting one pushed. Else: whether a push
      // began since the number was taken. Issue records its push before it looks for a
      // stall to end, and this looks after the stall is set.
      const auto pushed = [&] {
        if (!alone) return push_count_.load() != pushes;
        return several_pushers_.load() || pusher_.load() != report->thread;
      };
      if (pushed()) return;
      runtime_->ReportStall(number, !alone);
      report->reported = true;
      if (pushed()) runtime_->EndStall();
      if (runtime_->config().verbose >= 2) {
        PS_LOG(INFO) << "worker " << Rank() << ": waits for its dist_sync rounds (stall " << number
                     << (alone ? "" : ", other threads push or wait too") << ")";
      }
    });
  } catch (const std::exception& e) {  // out of memory: the stall goes unreported
    PS_LOG(WARNING) << "worker " << Rank() << ": could not report a stall: " << e.what();
  }
}

void DistKVStore::WaitAll() {
  const auto in_call = EnterCall("WaitAll");
  const auto done = [this] { return outstanding_.load() == 0; };
  WaitUntil(done, done, {});  // the count is atomic: polled without the lock
}

void DistKVStore::WaitImpl(std::span<const Key> keys) {
  const auto in_call = EnterCall("Wait");
  WaitForKeys(keys, false);
}

void DistKVStore::WaitPullsImpl(std::span<const Key> keys) {
  const auto in_call = EnterCall("WaitPulls");
  WaitForKeys(keys, true);
}

void DistKVStore::WaitForKeys(std::span<const Key> keys, bool pulls) {
  {
    SharedLock lock(keys_mu_);
    checks::WaitedKeys(kStore, pulls ? "WaitPulls" : "Wait", keys,
                       [this](Key key)
                           PS_REQUIRES_SHARED(keys_mu_) { return keys_.contains(key); });
  }
  const auto done = [this, keys, pulls]() PS_REQUIRES(ops_mu_) {
    const std::unordered_map<Key, std::size_t>& counts = pulls ? key_pulls_ : key_ops_;
    return std::all_of(keys.begin(), keys.end(), [&counts](Key key) {
      const auto it = counts.find(key);
      return it == counts.end() || it->second == 0;
    });
  };
  WaitUntil(
      done,
      [this, &done] {
        MutexLock lock(ops_mu_);
        return done();
      },
      keys);
}

}  // namespace ps
