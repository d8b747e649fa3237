#include "kvstore/dist/dist_kvstore.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory_resource>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_set>

#include "kvstore/call_checks.h"
#include "kvstore/checkpoint.h"
#include "kvstore/device_memory.h"
#include "kvstore/optimizer.h"
#include "ps/src/internal.h"
#include "ps/src/log_text.h"

namespace ps {
namespace {

constexpr std::string_view kStore = "dist kvstore";
// The failure of a call whose server died: with replication a collective runs again on the
// live servers (RunOverLiveServers); anywhere else it is an Error like any other.
class ServerLost : public Error {
 public:
  using Error::Error;
};
// The failure of a request in flight on a connection that was reset: with replication a
// collective runs again (RunOverLiveServers), however the reset and the retry interleave.
class ConnectionReset : public Error {
 public:
  using Error::Error;
};
// What a failed request of `result` says, if its error is `result`'s own.
DistKVStore::Failure FailureOf(const RequestResult& result, const std::string& error) {
  if (result.ok() || error != result.error) return DistKVStore::Failure::kOther;
  if (result.peer_died()) return DistKVStore::Failure::kServerLost;
  return result.peer_reset ? DistKVStore::Failure::kConnectionReset : DistKVStore::Failure::kOther;
}
// Throws `error` as the exception its failure calls for (RunOverLiveServers tells them apart),
// else as the one of `kind`.
[[noreturn]] void ThrowFailure(DistKVStore::Failure failure, const std::string& error,
                               ErrorKind kind = ErrorKind::kOther) {
  switch (failure) {
    case DistKVStore::Failure::kServerLost:
      throw ServerLost(error);
    case DistKVStore::Failure::kConnectionReset:
      throw ConnectionReset(error);
    case DistKVStore::Failure::kOther:
      break;
  }
  ThrowError(kind, error);
}
// A pulled value that could not be copied into the caller's memory (a GPU copy, a compressed
// pull's decoding): the reply does not say for which key.
std::string PulledValueError(const Error& e) {
  return std::string(kStore) + ": a pulled value: " + e.what();
}

// Stack bytes for one Issue call's bookkeeping: a few hundred bytes per message it builds.
constexpr std::size_t kIssueScratchBytes = 8192;

// A collective call as every worker states it (Runtime::Agree compares the texts): short enough
// for a barrier message, and naming the first keys so that a disagreement reads plainly.
std::string Bounded(std::string call) {
  constexpr std::size_t kMaxCallChars = 400;
  if (call.size() <= kMaxCallChars) return call;
  // FNV-1a over the whole text: calls that differ past the cut still differ.
  std::uint64_t hash = 14695981039346656037ull;
  for (const char c : call) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  char digest[17];
  std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(hash));
  call.resize(kMaxCallChars);
  return call + "... (fingerprint " + digest + ")";
}

// In key order: workers that declare the same keys in another order make the same call.
std::string DescribeInit(std::span<const Key> keys, std::span<const Tensor> values) {
  std::vector<std::size_t> order(keys.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [keys](auto a, auto b) { return keys[a] < keys[b]; });
  std::string call = "Init";
  for (const std::size_t i : order) {
    call += (call.size() == 4 ? " key " : ", key ") + std::to_string(keys[i]) + " (" +
            std::to_string(values[i].size()) + " x " + DTypeName(values[i].dtype()) + ")";
  }
  return Bounded(std::move(call));
}

std::string DescribeOptimizer(const OptimizerConfig& config) {
  char text[512];
  const LRSchedule& s = config.schedule;
  std::snprintf(text, sizeof(text),
                "%s lr=%.9g momentum=%.9g wd=%.9g rescale=%.9g clip=%.9g beta1=%.9g beta2=%.9g "
                "epsilon=%.9g rho=%.9g schedule=%s step=%llu factor=%.9g stop=%.9g max_update=%llu "
                "final=%.9g warmup=%llu from=%.9g steps=",
                config.name.c_str(), config.learning_rate, config.momentum, config.weight_decay,
                config.rescale_grad, config.clip_gradient, config.beta1, config.beta2,
                config.epsilon, config.rho, s.type.empty() ? "constant" : s.type.c_str(),
                static_cast<unsigned long long>(s.step), s.factor, s.stop_factor_lr,
                static_cast<unsigned long long>(s.max_update), s.final_lr,
                static_cast<unsigned long long>(s.warmup_steps), s.warmup_begin_lr);
  std::string call = text;
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    call += (i == 0 ? "" : ",") + std::to_string(s.steps[i]);
  }
  return Bounded(std::move(call));
}

// `dir` as the servers, which run in directories of their own, must get it: a relative one
// from this worker's working directory.
std::string CheckpointDir(const std::string& dir) {
  if (dir.empty()) return dir;
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(dir, error);
  return error ? dir : absolute.lexically_normal().string();
}

}  // namespace

DistKVStore::DistKVStore(std::unique_ptr<Runtime> runtime, bool sync)
    : runtime_(std::move(runtime)),
      sync_(sync),
      replicated_(runtime_->config().replicated()),
      layout_(runtime_->num_servers(), runtime_->config().big_array_bound,
              runtime_->config().chunk_bytes, runtime_->config().server_weights),
      ring_(runtime_->num_servers(), replicated_, runtime_->config().server_weights) {
  for (int s = 0; s < runtime_->num_servers(); ++s) {
    shm_servers_.push_back(runtime_->config().use_shm && runtime_->SameHost(runtime_->ServerId(s)));
  }
}

DistKVStore::~DistKVStore() {
  try {
    WaitAll();
  } catch (const Error& e) {
    PS_LOG(ERROR) << "worker " << Rank() << ": an operation failed before shutdown: " << e.what();
  }
  // Destroyed while an exception unwinds: this worker failed, and the job must not end as a
  // success (or wait for a heartbeat timeout).
  ReportFinished(
      std::uncaught_exceptions() > 0 ? "its program left the KVStore through an exception" : "");
}

void DistKVStore::ReportFailure(const std::string& why) {
  ReportFinished(why.empty() ? "no reason given" : why);
}

void DistKVStore::RefuseAfterFailure(std::string_view op) const {
  if (!finished_.load()) return;
  throw Error(std::string(kStore) + ": " + std::string(op) + " after this worker called " +
              "ReportFailure: the job has ended, so nothing more reaches the other nodes");
}

void DistKVStore::ReportFinished(const std::string& failure) {
  if (finished_.exchange(true)) return;
  try {
    runtime_->FinishWorker(failure);
  } catch (const Error& e) {
    PS_LOG(ERROR) << "worker " << Rank() << ": " << e.what();
  }
}

void DistKVStore::Complete(const std::string& error, Failure failure, std::span<const Key> keys,
                           bool pulls, ErrorKind error_kind) {
  MutexLock lock(ops_mu_);
  if (!error.empty() && first_error_.empty()) {
    first_error_ = error;
    first_failure_ = failure;
    first_error_kind_ = error_kind;
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
  if (!first_error_.empty()) {
    const std::string error = std::move(first_error_);
    first_error_.clear();
    ThrowFailure(first_failure_, error, first_error_kind_);
  }
}

void DistKVStore::NoteLongWait(std::chrono::steady_clock::duration waited,
                               std::span<const Key> keys) const {
  const std::string call = keys.empty() ? "WaitAll"
                                        : "a wait for key " + std::to_string(keys[0]) +
                                              (keys.size() > 1 ? " and others" : "");
  PS_LOG(WARNING) << "worker " << Rank() << ": " << call << " has waited "
                  << FormatSeconds(std::chrono::duration_cast<std::chrono::milliseconds>(waited))
                  << " for dist_sync rounds: a round completes once every worker pushed its "
                     "key, so a worker still computing holds the others up (the job goes on "
                     "once it pushes; one that died or finished ends the wait with an error)";
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
  const auto done = [this] { return outstanding_.load() == 0; };
  WaitUntil(done, done, {});  // the count is atomic: polled without the lock
}

void DistKVStore::WaitImpl(std::span<const Key> keys) { WaitForKeys(keys, false); }

void DistKVStore::WaitPullsImpl(std::span<const Key> keys) { WaitForKeys(keys, true); }

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

DistKVStore::OneCollective::OneCollective(std::atomic<bool>& running, std::string_view op)
    : running_(running) {
  if (running_.exchange(true)) {
    throw Error(std::string(kStore) + ": " + std::string(op) +
                " was called while another thread of this worker is in a collective call: the "
                "workers' collective calls pair up in order, so call Init, SetOptimizer, "
                "SetGradientCompression, Barrier and the checkpoint calls from one thread");
  }
}

DistKVStore::OneCollective::~OneCollective() { running_.store(false); }

void DistKVStore::Barrier() {
  RefuseAfterFailure("Barrier");
  const OneCollective one(collective_running_, "Barrier");
  try {
    AgreeAmongWorkers("Barrier", "");
  } catch (const Error& e) {
    ThrowError(e.kind(), std::string(kStore) + ": Barrier failed on every worker: " + e.what());
  }
}

void DistKVStore::RunOverLiveServers(std::string_view op, const std::function<void()>& work) {
  WaitAll();  // an earlier operation's error fails the call, never to be hidden by a retry
  // Each pass follows a server death or join (both bounded in number), or one of at most
  // kMaxResetRetries connection resets, so this ends.
  int reset_retries = 0;
  for (;;) {
    const std::size_t deaths = runtime_->dead_count();
    const std::size_t events = runtime_->server_event_count();
    const std::uint64_t resets = runtime_->connection_reset_count();
    try {
      work();
      WaitAll();
    } catch (const ServerLost& e) {
      const std::size_t live = LiveServerRanks().size();
      if (!replicated_ || live == 0 || runtime_->dead_count() == deaths) throw;
      PS_LOG(WARNING) << "worker " << Rank() << ": " << op << " failed as a server died ("
                      << e.what() << "); running it again on the " << live << " live servers";
      continue;
    } catch (const Error& e) {
      // A reset of this request's connection, or of another meanwhile, may have lost a request
      // or its answer: each collective is safe to run twice.
      const bool reset = dynamic_cast<const ConnectionReset*>(&e) != nullptr ||
                         runtime_->connection_reset_count() != resets;
      if (replicated_ && reset && reset_retries++ < kMaxResetRetries) {
        PS_LOG(WARNING) << "worker " << Rank() << ": " << op << " failed as a connection was "
                        << "reset (" << e.what() << "); running it again";
        continue;
      }
      // Another failure while servers died or joined may be theirs (a server that took a
      // dead one's rank and holds nothing yet): once more, on the servers as they are now.
      if (!replicated_ ||
          (runtime_->dead_count() == deaths && runtime_->server_event_count() == events)) {
        throw;
      }
      PS_LOG(WARNING) << "worker " << Rank() << ": " << op << " failed while servers died or "
                      << "joined (" << e.what() << "); running it again on the "
                      << LiveServerRanks().size() << " live servers";
      continue;
    }
    // A server that joined meanwhile may have missed the call: it runs again on every live
    // server (each collective is safe to run twice).
    const auto since = runtime_->ServerEvents(events);
    if (!std::any_of(since.begin(), since.end(), [](const auto& event) { return event.joined; })) {
      return;
    }
    PS_LOG(WARNING) << "worker " << Rank() << ": a server joined during " << op
                    << "; running it again on the " << LiveServerRanks().size() << " live servers";
  }
}

void DistKVStore::AgreeAmongWorkers(const std::string& call, const std::string& failure,
                                    ErrorKind failure_kind) {
  std::string why = failure;
  if (why.empty() && sync_ && OnlyCallerPushes()) {
    why = AnnounceCollective(call);
    runtime_->Agree(kWorkerGroup, call, why);
    return;
  }
  ++collectives_entered_;  // every worker counts it, failed or not
  if (!sync_ || !why.empty()) {
    runtime_->Agree(kWorkerGroup, call, why, {}, failure_kind);
    return;
  }
  // Unannounced, the servers cannot tell that a round waits for this worker's push while it
  // votes: a vote that lasts is reported as a stall of several threads, for the scheduler to
  // suspect a deadlock with a worker whose wait needs that push (deadlock_watch.h).
  WaitStall stall(*this, {}, true);  // ends with the vote, thrown or not
  runtime_->Agree(kWorkerGroup, call, why, [&stall] { stall.Tick(); });
}

bool DistKVStore::OnlyCallerPushes() const {
  const std::thread::id first = pusher_.load();
  return !several_pushers_.load() &&
         (first == std::thread::id{} || first == std::this_thread::get_id());
}

std::string DistKVStore::AnnounceCollective(const std::string& call) {
  struct Answers {
    Mutex mu;
    CondVar arrived;
    std::size_t remaining PS_GUARDED_BY(mu) = 0;
    std::string refusal PS_GUARDED_BY(mu);
  } answers;
  kv::Request request;
  request.command = kv::kCollective;
  request.call = call;
  // A server that knows of a death or join this worker has not heard of yet may get pushes of
  // this worker sent again after the announcement: it does not check this collective.
  request.membership = runtime_->server_events_applied();
  const std::vector<int> servers = LiveServerRanks();
  {
    MutexLock lock(answers.mu);
    answers.remaining = servers.size();
  }
  {
    // Pushes are stamped and sent under seq_mu_ too: every push sent before this announcement
    // is ahead of it on its connection and carries the count without this collective; every
    // push sent after it (another thread's, while this one votes) carries the count with it,
    // that is, counts as after the collective.
    MutexLock numbering(seq_mu_);
    request.collectives = collectives_entered_.load();
    for (const int s : servers) {
      Message message = kv::RequestMessage(request, runtime_->ServerId(s));
      runtime_->Request(std::span<Message>(&message, 1), [&answers](RequestResult&& result) {
        MutexLock lock(answers.mu);
        // A server lost meanwhile fails the collective on its own; a refusal names the round.
        if (!result.ok() && result.lost_peer == kNoNode && answers.refusal.empty()) {
          answers.refusal = result.error;
        }
        if (--answers.remaining == 0) answers.arrived.NotifyAll();
      });
    }
    ++collectives_entered_;
  }
  MutexLock lock(answers.mu);
  while (answers.remaining > 0) answers.arrived.Wait(answers.mu);
  return answers.refusal;
}

void DistKVStore::Collective(std::string_view op, const std::string& call,
                             const std::string& local_error, const std::function<void()>& work,
                             const std::function<void()>& undo) {
  RefuseAfterFailure(op);
  const OneCollective one(collective_running_, op);
  const auto failed_everywhere = [&](const Error& e) {
    // A worker whose own checks failed throws its own words; the others learn who and why.
    if (!local_error.empty()) throw Error(local_error);
    ThrowError(e.kind(), std::string(kStore) + ": " + std::string(op) +
                             " failed on every worker: " + e.what());
  };
  try {
    AgreeAmongWorkers(call, local_error);
  } catch (const Error& e) {
    failed_everywhere(e);
  }
  std::string error;
  ErrorKind error_kind = ErrorKind::kOther;
  if (Rank() == 0) {
    try {
      RunOverLiveServers(op, work);
    } catch (const Error& e) {
      error = e.what();
      error_kind = e.kind();
      try {
        if (undo) undo();
      } catch (const std::exception& undo_error) {  // the outcome vote must still happen
        PS_LOG(WARNING) << "worker 0: could not undo the failed " << op << ": "
                        << undo_error.what();
      }
    }
  }
  try {
    AgreeAmongWorkers(call + " (outcome)", error, error_kind);
  } catch (const Error& e) {
    failed_everywhere(e);
  }
}

void DistKVStore::SaveCheckpoint(const std::string& given) {
  const std::string dir = CheckpointDir(given);
  std::string local_error;
  try {
    if (dir.empty()) throw Error(std::string(kStore) + ": SaveCheckpoint: the directory is empty");
    WaitAll();  // this worker's pushes are part of what is saved
  } catch (const Error& e) {
    local_error = e.what();
  }
  Collective("SaveCheckpoint", "SaveCheckpoint " + Bounded(dir), local_error, [&] {
    // One file per live server (each writes the slices it serves).
    checkpoint::Manifest manifest;
    const std::vector<int> live = LiveServerRanks();
    manifest.servers = static_cast<int>(live.size());
    kv::Request request;
    request.command = kv::kSave;
    request.path = dir;
    request.dead_servers = DeadServerRanks();
    request.membership = runtime_->server_event_count();  // read after: at least as far
    std::uint64_t saved = 0;                              // slices in the files
    for (const int s : live) {
      const RequestResult result =
          runtime_->RequestAndWait(kv::RequestMessage(request, runtime_->ServerId(s)));
      if (!result.ok()) {
        ThrowFailure(FailureOf(result, result.error), result.error, result.error_kind);
      }
      const auto& reply = result.responses.at(0);
      if (reply.data.size() != 1 || reply.data[0].count() != 3 ||
          reply.data[0].dtype() != DType::kUInt64) {
        throw Error("malformed checkpoint reply from " + runtime_->Describe(runtime_->ServerId(s)));
      }
      const auto summary = reply.data[0].as<std::uint64_t>();
      manifest.files.push_back(
          {checkpoint::DataFileName(s, runtime_->num_servers()), summary[0], summary[1]});
      saved += summary[2];
    }
    // Every slice once, or no MANIFEST: the last good checkpoint stays the one to load.
    if (const std::uint64_t slices = SliceCount(); saved != slices) {
      throw Error("SaveCheckpoint: the live servers hold " + std::to_string(saved) + " of the " +
                  std::to_string(slices) +
                  " key slices (the others died with the servers that held them); " + dir +
                  " keeps its previous checkpoint, if it had one");
    }
    // The commit point; the files of an earlier checkpoint there that it does not list go.
    // The other workers wait for it: a file system that stops answering ends the job (at
    // PS_HEARTBEAT_TIMEOUT) instead of holding them all.
    std::vector<std::string> removed;
    {
      Runtime::SlowWork work =
          runtime_->BeginSlowWork("saving the checkpoint manifest " + dir +
                                      "/MANIFEST (and removing the files it replaces)",
                                  Runtime::SlowWorkThread::kCaller);
      removed = checkpoint::WriteManifest(dir, manifest, [&work] { work.Progress(); });
      for (std::string& name :
           checkpoint::RemoveStaleResidualFiles(dir, NumWorkers(), [&work] { work.Progress(); })) {
        removed.push_back(std::move(name));
      }
    }
    for (const std::string& name : removed) {
      PS_LOG(INFO) << "worker 0: removed " << dir << "/" << name
                   << ", an earlier checkpoint's file that the new MANIFEST does not list";
    }
  });
  SaveResiduals(dir);
}

void DistKVStore::LoadCheckpoint(const std::string& given) {
  // Worker 0 reads the manifest and hands it to the servers, which read their data files.
  const std::string dir = CheckpointDir(given);
  std::string local_error;
  try {
    if (dir.empty()) throw Error(std::string(kStore) + ": LoadCheckpoint: the directory is empty");
    WaitAll();
  } catch (const Error& e) {
    local_error = e.what();
  }
  Collective("LoadCheckpoint", "LoadCheckpoint " + Bounded(dir), local_error, [&] {
    kv::Request request;
    request.command = kv::kLoad;
    request.path = dir;
    {
      const Runtime::SlowWork work = runtime_->BeginSlowWork(
          "reading the checkpoint manifest " + dir + "/MANIFEST", Runtime::SlowWorkThread::kCaller);
      request.manifest = checkpoint::ReadManifestText(dir);
    }
    request.dead_servers = DeadServerRanks();
    // Read after the dead ranks: servers hold the request until they know as much.
    request.membership = runtime_->server_event_count();
    checkpoint::Manifest::Parse(request.manifest, dir + "/MANIFEST");  // fails here, not 4 times
    // Every server reads and checks its slices first; none changes one unless all of them
    // can (a key missing from the checkpoint fails the load with the model as it was).
    SendToLiveServers(request);
    request.manifest.clear();  // the later steps use what each server staged
    try {
      WaitAll();
    } catch (const Error&) {
      request.load_step = kv::LoadStep::kDiscard;
      SendToLiveServers(request);
      try {
        WaitAll();
      } catch (const Error& e) {  // a server that lost it frees it with the next load
        PS_LOG(WARNING) << "worker 0: could not have every server drop the checkpoint it read: "
                        << e.what();
      }
      throw;
    }
    request.load_step = kv::LoadStep::kApply;
    SendToLiveServers(request);
    try {
      WaitAll();
    } catch (const ServerLost&) {
      throw;
    } catch (const ConnectionReset&) {
      throw;  // RunOverLiveServers runs it again as it is
    } catch (const Error&) {
      // A server that heard of a death or a join since it read its slices refuses to apply
      // them, where the others may have applied theirs. Once this worker hears of it too,
      // RunOverLiveServers runs the load again on the servers as they are: every key is
      // loaded anew.
      if (replicated_) {
        runtime_->AwaitServerEventsBeyond(request.membership, runtime_->config().heartbeat_timeout);
      }
      throw;
    }
  });
  LoadResiduals(dir);
}

void DistKVStore::SetOptimizer(const OptimizerConfig& config) {
  std::string local_error;
  try {
    ValidateOptimizerConfig(config);
  } catch (const Error& e) {
    local_error = std::string(kStore) + ": SetOptimizer: " + e.what();
  }
  Collective("SetOptimizer", "SetOptimizer " + DescribeOptimizer(config), local_error, [&] {
    kv::Request request;
    request.command = kv::kSetOptimizer;
    request.optimizer = config;
    SendToLiveServers(request);
  });
  optimizer_set_ = true;
}

void DistKVStore::SetGradientCompression(const GradientCompression& config) {
  std::string local_error;
  compression::Settings settings;
  try {
    settings = compression::Parse(config);
    if (pushed_.load()) {
      throw Error(
          "SetGradientCompression: this worker already pushed: set the compression before the "
          "first Push of any key (the residuals start with it, as in MXNet)");
    }
  } catch (const Error& e) {
    local_error = std::string(kStore) + ": " + e.what();
  }
  const std::string call = "SetGradientCompression " + compression::Describe(config);
  Collective("SetGradientCompression", Bounded(call), local_error, [&] {
    kv::Request request;
    request.command = kv::kSetCompression;
    request.compression = config;
    SendToLiveServers(request);
  });
  // Every worker and every server has the setting: the keys there so far get their state. The
  // same setting again keeps it (residuals a LoadCheckpoint restored included).
  ExclusiveLock lock(keys_mu_);
  if (settings == compression_) return;
  if (residuals_loaded_) {
    PS_LOG(WARNING) << "worker " << Rank() << ": SetGradientCompression "
                    << compression::Describe(config)
                    << " drops the push residuals LoadCheckpoint restored: set the compression "
                       "before LoadCheckpoint";
    residuals_loaded_ = false;
  }
  compression_ = settings;
  for (auto& [key, info] : keys_) {
    info.compression.clear();
    AttachCompression(info);
  }
}

void DistKVStore::AttachCompression(KeyInfo& info) {
  const bool on = compression_.push != compression::Codec::kNone ||
                  compression_.pull != compression::Codec::kNone;
  if (!on || info.dtype != DType::kFloat32) return;
  info.compression.clear();
  for (const KeySlice& slice : info.slices) {
    info.compression.push_back(std::make_unique<SliceCompression>(compression_, slice.length));
  }
}

TrafficStats DistKVStore::Traffic() const {
  return TrafficStats{runtime_->bytes_sent(), runtime_->bytes_received()};
}

void DistKVStore::InitImpl(std::span<const Key> keys, std::span<const Tensor> values) {
  // Every worker runs the same checks; what one finds, all learn (Collective), so a key is
  // either initialized on every worker or on none.
  std::string local_error;
  try {
    checks::Counts(kStore, "Init", keys.size(), values.size());
    SharedLock lock(keys_mu_);
    std::unordered_set<Key> seen;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto it = keys_.find(keys[i]);
      checks::InitKey(kStore, keys[i], values[i],
                      checks::DeclaredBy(it == keys_.end() ? nullptr : &it->second),
                      !seen.insert(keys[i]).second);
    }
  } catch (const Error& e) {
    local_error = e.what();
  }
  const std::string call =
      local_error.empty() ? DescribeInit(keys, values) : std::string("Init (failed its checks)");
  // The keys are this worker's only once every worker agreed on them; a failure after that
  // leaves them free again.
  bool declared = false;
  const auto declare = [&] {
    declared = true;
    ExclusiveLock lock(keys_mu_);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      KeyInfo& info = keys_[keys[i]] =
          KeyInfo{values[i].dtype(),
                  values[i].size(),
                  layout_.Slices(keys[i], values[i].size(), DTypeSize(values[i].dtype())),
                  {},
                  {},
                  {}};
      info.pushes.assign(info.slices.size(), 0);
      AttachCompression(info);
    }
  };
  try {
    Collective(
        "Init", call, local_error,
        [&] {
          if (!declared) {  // not when it runs again after a server died
            declare();
            AttachSlots(keys);
          }
          Issue(kv::kInit, keys, values, {}, 0);
        },
        [&] {
          if (declared) Forget(keys);  // a server that took its part gives it back
        });
  } catch (const Error&) {
    if (declared) {  // rank 0, whose Init failed after every worker agreed on it
      ExclusiveLock lock(keys_mu_);
      for (const Key key : keys) keys_.erase(key);
    }
    throw;
  }
  if (Rank() != 0) {
    declare();
    AttachSlots(keys);
  }
}
void DistKVStore::Forget(std::span<const Key> keys) {
  std::map<int, kv::Request> per_server;
  {
    SharedLock lock(keys_mu_);
    for (const Key key : keys) {
      const KeyInfo& info = keys_.at(key);
      for (const KeySlice& slice : info.slices) {
        kv::Request& request = per_server[OwnerRank(slice.server_rank)];
        request.command = kv::kForget;
        request.slices.push_back(kv::SliceRef{key, slice.offset, info.size});
        if (replicated_) request.homes.push_back(slice.server_rank);
      }
    }
  }
  for (const auto& [server, request] : per_server) {
    const int node = runtime_->ServerId(server);
    const std::string error = runtime_->RequestAndWait(kv::RequestMessage(request, node)).error;
    if (!error.empty()) {
      PS_LOG(WARNING) << "worker " << Rank() << ": could not undo a failed Init on "
                      << runtime_->Describe(node) << ": " << error;
    }
  }
}

void DistKVStore::AttachSlots(std::span<const Key> keys) {
  // Per same-host server: every new slice big enough for a slot, and its size.
  struct Wanted {
    Key key;
    std::size_t slice;  // index into KeyInfo::slices
    std::size_t bytes;
  };
  std::map<int, std::vector<Wanted>> wanted;
  {
    SharedLock lock(keys_mu_);
    for (const Key key : keys) {
      const KeyInfo& info = keys_.at(key);
      for (std::size_t j = 0; j < info.slices.size(); ++j) {
        const KeySlice& slice = info.slices[j];
        const std::size_t bytes = slice.length * DTypeSize(info.dtype);
        if (shm_servers_[slice.server_rank] && bytes >= kShmMinBytes &&
            SharesSlotsWith(slice.server_rank)) {
          wanted[slice.server_rank].push_back({key, j, bytes});
        }
      }
    }
  }
  for (const auto& [server, slices] : wanted) {
    std::vector<std::size_t> sizes;
    for (const Wanted& w : slices) sizes.push_back(w.bytes);
    const int node = runtime_->ServerId(server);
    std::string error;
    ShmSlots::NewSegment segment;
    try {
      segment = shm_.Create(sizes);
    } catch (const Error& e) {
      error = e.what();
    }
    kv::Request request;
    request.command = kv::kShmAttach;
    if (error.empty()) {
      request.segment_id = segment.id;
      request.segment = segment.descriptor;
      // The tracker always answers: a reply, a dead server or the request deadline.
      error = runtime_->RequestAndWait(kv::RequestMessage(request, node)).error;
      if (!error.empty()) shm_.Abandon(segment);
    }
    if (error.empty()) {
      // The slices' replica maps the segment too, when it shares this host, so that a server
      // forwards a round's sum (or a push) by naming the worker's slot instead of copying it
      // into a slot of its own. Before Attached: that closes the descriptor's fd.
      if (const int mirror = SlotMirror(server); mirror != kNoNode) {
        const std::string why = runtime_->RequestAndWait(kv::RequestMessage(request, mirror)).error;
        if (why.empty()) {
          for (ShmSlot* slot : segment.slots) slot->set_mirror(mirror);
        } else if (runtime_->config().verbose >= 1) {
          PS_LOG(INFO) << "worker " << Rank() << ": " << runtime_->Describe(mirror)
                       << " does not map the slots of " << runtime_->Describe(node)
                       << " (its updates are copied for it): " << why;
        }
      }
    }
    if (!error.empty()) {
      // Frames still work: only the same-host shortcut is lost.
      PS_LOG(WARNING) << "worker " << Rank() << ": values for " << runtime_->Describe(node)
                      << " travel over the socket, not shared memory: " << error
                      << " (PS_USE_SHM=0 skips this attempt)";
      shm_servers_[server] = false;
      continue;
    }
    shm_.Attached(segment);
    ExclusiveLock lock(keys_mu_);
    for (std::size_t n = 0; n < slices.size(); ++n) {
      KeyInfo& info = keys_.at(slices[n].key);
      info.slots.resize(info.slices.size(), nullptr);
      info.slots[slices[n].slice] = segment.slots[n];
    }
  }
}

void DistKVStore::PushImpl(std::span<const Key> keys, std::span<const Tensor> grads, int priority) {
  Issue(kv::kPush, keys, grads, {}, priority);
}

void DistKVStore::PullImpl(std::span<const Key> keys, std::span<const Tensor> outs, int priority) {
  Issue(kv::kPull, keys, {}, outs, priority);
}

void DistKVStore::PushPullImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                               std::span<const Tensor> outs, int priority) {
  Issue(kv::kPushPull, keys, grads, outs, priority);
}

DistKVStore::DraftsTaken::~DraftsTaken() {
  for (Draft* draft : taken_) {
    draft->msg.data.clear();
    pool_.Give(*draft);
  }
}

DistKVStore::Draft& DistKVStore::DraftsTaken::Take() {
  Draft& draft = pool_.Take();
  taken_.push_back(&draft);
  draft.request.slices.clear();  // its frames were cleared when it was given back
  draft.request.shm.clear();
  draft.request.pulls.clear();
  draft.request.homes.clear();
  draft.request.seqs.clear();
  return draft;
}

void DistKVStore::ReleaseUnsent(Plan& plan, std::size_t from_wave) {
  for (auto& [server, queue] : plan) {
    for (std::size_t w = from_wave; w < queue.size(); ++w) {
      for (ShmSlot* slot : queue[w].slots) slot->Release();
    }
  }
}

void DistKVStore::Issue(kv::Command command, std::span<const Key> keys,
                        std::span<const Tensor> sends, std::span<const Tensor> outs, int priority) {
  const Call call{command,
                  keys,
                  sends,
                  outs,
                  priority,
                  kv::CommandName(command),
                  command != kv::kPull,
                  command == kv::kPull || command == kv::kPushPull};
  RefuseAfterFailure(call.op);
  const bool pushing = call.sending && command != kv::kInit;
  // The call's own bookkeeping lives in a buffer on this stack; only calls too big for it
  // (hundreds of keys) reach the heap. What outlives the call (frames, destinations) does not.
  alignas(std::max_align_t) std::byte scratch[kIssueScratchBytes];
  std::pmr::monotonic_buffer_resource arena(scratch, sizeof(scratch));
  Plan plan(&arena);
  // The checks "local" runs too (kvstore/call_checks.h), key by key below. An Init's keys were
  // checked by InitImpl on every worker and declared since: they pass as a push.
  checks::Operation check(kStore,
                          command == kv::kPull       ? checks::Op::kPull
                          : command == kv::kPushPull ? checks::Op::kPushPull
                                                     : checks::Op::kPush,
                          keys, sends, outs, optimizer_set_ && command != kv::kInit, &arena);
  if (pushing && !sync_ && !optimizer_set_) {
    throw Error(checks::Where(kStore, call.op, keys.empty() ? 0 : keys[0]) +
                "dist_async applies every push at once, so it needs an optimizer: call "
                "SetOptimizer before the first Push");
  }
  DraftsTaken drafts(drafts_, &arena);
  try {
    SharedLock lock(keys_mu_);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto it = keys_.find(keys[i]);
      // Throws for an unknown key: `it` is valid below.
      check.CheckKey(i, checks::DeclaredBy(it == keys_.end() ? nullptr : &it->second));
      PlanKey(call, i, it->second, plan, drafts);
    }
    if (pushing && !keys.empty()) {  // an empty push sends nothing
      pushed_.store(true);
      std::thread::id first{};
      const std::thread::id me = std::this_thread::get_id();
      if (!pusher_.compare_exchange_strong(first, me) && first != me) several_pushers_.store(true);
      // The thread in a reported stall cannot push: another one does, so that stall no longer
      // says this worker pushes nothing until its wait ends (ReportStall checks the other way).
      CountPush();
    }
  } catch (...) {
    ReleaseUnsent(plan, 0);
    throw;
  }
  if (!pushing) {
    SendPlan(call, plan);
    return;
  }
  // Again once sent, failed or not: a stall numbered while the push was on its way (its
  // notice maybe ahead of the push on a connection) no longer holds either.
  try {
    SendPlan(call, plan);
  } catch (...) {
    CountPush();
    throw;
  }
  CountPush();
}

void DistKVStore::CountPush() {
  push_count_.fetch_add(1);
  if (runtime_->stalled()) runtime_->EndStall();
}

void DistKVStore::PlanKey(const Call& call, std::size_t i, const KeyInfo& info, Plan& plan,
                          DraftsTaken& drafts) {
  const Key key = call.keys[i];
  const std::size_t element = DTypeSize(info.dtype);
  const std::size_t chunk_bytes = layout_.chunk_bytes();
  const Tensor* send = call.sending ? &call.sends[i] : nullptr;
  const auto* user_send = send != nullptr ? static_cast<const std::byte*>(send->data()) : nullptr;
  SendSource source{user_send, borrowed_, false};
  // Compressed slices travel as frames: the point is what crosses the link.
  const bool compressed = call.command != kv::kInit && !info.compression.empty();
  for (std::size_t j = 0; j < info.slices.size(); ++j) {
    const KeySlice& slice = info.slices[j];
    const int owner = OwnerRank(slice.server_rank);
    std::pmr::vector<Outgoing>& queue = plan[owner];
    const std::size_t slice_bytes = slice.length * element;
    if (queue.empty() || queue.back().request.slices.size() >= kv::kMaxSlicesPerMessage ||
        (queue.back().bytes > 0 && queue.back().bytes + slice_bytes > chunk_bytes)) {
      queue.emplace_back(plan.get_allocator().resource(), drafts.Take());
    }
    Outgoing& target = queue.back();
    // A slot is shared with the slice's home server only.
    ShmSlot* slot = call.command != kv::kInit && !compressed && !info.slots.empty() &&
                            owner == slice.server_rank && SharesSlotsWith(owner)
                        ? info.slots[j]
                        : nullptr;
    if (slot != nullptr && !slot->TryAcquire()) slot = nullptr;  // in use: frames
    if (slot != nullptr) {
      target.slots.push_back(slot);
      target.request.shm.push_back(kv::ShmRef{
          static_cast<std::uint32_t>(target.request.slices.size()), slot->segment(), slot->offset(),
          slot->bytes(), kNoNode, call.sending ? slot->mirror() : kNoNode});
    }
    target.bytes += slice_bytes;
    target.request.slices.push_back(kv::SliceRef{key, slice.offset, info.size});
    if (replicated_) {
      target.request.homes.push_back(slice.server_rank);
      if (call.command != kv::kInit) target.counters.push_back(&info.pushes[j]);
      SliceOrigin origin{slot, nullptr, Device{}};
      if (slot != nullptr && send != nullptr) {
        origin.source = user_send + slice.offset * element;
        origin.device = send->device();
      }
      target.origins.push_back(origin);
    }
    kv::PullState pull;
    if (call.receiving && compression_.pull != compression::Codec::kNone) {
      // Every slice of the message gets a state; 0 pulls an uncompressed key in full.
      if (compressed) pull = info.compression[j]->NextPull();
      target.request.pulls.push_back(pull);
    }
    if (send != nullptr) {
      PlanSliceValue(call, i, info, j, compressed, slot, source, target);
    }
    if (call.receiving) {
      auto* base = static_cast<std::byte*>(call.outs[i].data());
      target.destinations.push_back({base + slice.offset * element, slice_bytes,
                                     call.outs[i].device(), slot,
                                     pull.next != 0 ? info.compression[j].get() : nullptr, pull});
    }
  }
}

void DistKVStore::PlanSliceValue(const Call& call, std::size_t i, const KeyInfo& info,
                                 std::size_t j, bool compressed, ShmSlot* slot, SendSource& source,
                                 Outgoing& target) {
  const Key key = call.keys[i];
  const Tensor& send = call.sends[i];
  const KeySlice& slice = info.slices[j];
  const std::size_t element = DTypeSize(info.dtype);
  const auto* user_send = static_cast<const std::byte*>(send.data());
  if (compressed && compression_.push != compression::Codec::kNone) {
    target.encodes.push_back({target.frames.size(), info.compression[j].get(),
                              reinterpret_cast<const float*>(user_send) + slice.offset,
                              send.device(), key});
    target.frames.emplace_back();  // filled by SendPlan
  } else if (slot != nullptr) {
    target.frames.emplace_back(nullptr, nullptr, 0, info.dtype);  // the value is in shm
    const std::byte* from = user_send + slice.offset * element;
    if (send.device().is_cuda()) {
      // A GPU copy can fail: do it now, before any message of this call is sent.
      checks::NamingKey(kStore, call.op, key,
                        [&] { CopyFromDevice(slot->data(), from, slot->bytes(), send.device()); });
    } else {
      target.copies.push_back({slot, from});
    }
  } else {
    if (send.device().is_cuda() && !source.staged) {
      std::shared_ptr<std::byte> host;
      checks::NamingKey(kStore, call.op, key, [&] {
        host = staging_->Get(send.bytes(), send.device());
        CopyFromDevice(host.get(), send.data(), send.bytes(), send.device());
      });
      source.base = host.get();
      source.owner = std::move(host);
      source.staged = true;
    }
    target.frames.emplace_back(source.owner, source.base + slice.offset * element,
                               slice.length * element, info.dtype);
  }
}

void DistKVStore::SendPlan(const Call& call, Plan& plan) {
  std::pmr::memory_resource* arena = plan.get_allocator().resource();
  std::size_t waves = 0;
  for (const auto& [server, queue] : plan) waves = std::max(waves, queue.size());
  std::pmr::vector<Message> messages(arena);
  std::pmr::vector<Draft*> sent(arena);             // per message of the wave: its draft
  std::pmr::vector<std::uint64_t*> counted(arena);  // the push counters this wave advanced
  const bool pushing = call.command == kv::kPush || call.command == kv::kPushPull;
  MutexLock numbering(seq_mu_);
  for (std::size_t wave = 0; wave < waves; ++wave) {
    messages.clear();
    sent.clear();
    counted.clear();
    Inflight& inflight = NewInflight(plan.size());
    try {
      for (auto& [server, queue] : plan) {
        if (wave >= queue.size()) continue;
        Outgoing& target = queue[wave];
        for (const SlotCopy& copy : target.copies) {
          std::memcpy(copy.slot->data(), copy.source, copy.slot->bytes());
        }
        // Every key passed its checks, so the residuals may change now: each slice is encoded
        // just before its message goes, while the servers work on the previous wave (a GPU
        // gradient on its GPU; only the codes are copied).
        for (const Encode& encode : target.encodes) {
          checks::NamingKey(kStore, call.op, encode.key, [&] {
            target.frames[encode.frame] = encode.state->EncodePush(encode.grad, encode.device);
          });
        }
        target.request.command = call.command;
        target.request.sync = sync_;
        target.request.collectives = collectives_entered_.load();
        // Push numbers: a push's own, a pull's count of the pushes before it.
        for (std::uint64_t* counter : target.counters) {
          target.request.seqs.push_back(*counter);
          if (pushing) {
            ++*counter;
            counted.push_back(counter);
          }
        }
        Message& msg = target.draft->msg;
        kv::FillRequestMessage(target.request, runtime_->ServerId(server), msg);
        msg.meta.priority = call.priority;
        if (replicated_ && call.command != kv::kInit) {
          inflight.reroutable = true;
          const std::size_t m = messages.size();
          inflight.requests[m] = target.request;
          inflight.frames[m] = msg.data;
          inflight.origins[m].assign(target.origins.begin(), target.origins.end());
        }
        inflight.destinations[messages.size()].assign(target.destinations.begin(),
                                                      target.destinations.end());
        inflight.slots.insert(inflight.slots.end(), target.slots.begin(), target.slots.end());
        for (const kv::SliceRef& slice : target.request.slices) inflight.keys.push_back(slice.key);
        inflight.pulls = call.receiving;
        // Lent to the request (which sends it and leaves it whole), then given back below.
        messages.push_back(std::move(msg));
        sent.push_back(target.draft);
      }
    } catch (...) {
      for (std::uint64_t* counter : counted) --*counter;  // none of this wave was sent
      inflights_.Give(inflight);
      ReleaseUnsent(plan, wave);
      throw;
    }
    Track(messages, inflight);
    for (std::size_t m = 0; m < messages.size(); ++m) sent[m]->msg = std::move(messages[m]);
  }
}

DistKVStore::Inflight& DistKVStore::NewInflight(std::size_t messages) {
  // Clearing keeps the lists' memory for this request.
  Inflight& inflight = inflights_.Take();
  inflight.nodes.clear();
  inflight.slots.clear();
  inflight.keys.clear();
  inflight.pulls = false;
  inflight.reroutable = false;
  if (inflight.destinations.size() < messages) inflight.destinations.resize(messages);
  for (auto& list : inflight.destinations) list.clear();
  if (replicated_) {
    if (inflight.requests.size() < messages) {
      inflight.requests.resize(messages);
      inflight.frames.resize(messages);
      inflight.origins.resize(messages);
    }
    for (auto& frames : inflight.frames) frames.clear();  // they may pin the caller's memory
  }
  return inflight;
}

void DistKVStore::Track(std::span<Message> messages, Inflight& inflight) {
  if (messages.empty()) {
    inflights_.Give(inflight);
    return;
  }
  for (const Message& msg : messages) inflight.nodes.push_back(msg.meta.recipient);
  {
    MutexLock lock(ops_mu_);
    ++outstanding_;
    for (const Key key : inflight.keys) ++key_ops_[key];
    if (inflight.pulls) {
      for (const Key key : inflight.keys) ++key_pulls_[key];
    }
  }
  // Captures two pointers: std::function keeps them without allocating.
  runtime_->Request(messages, [this, pending = &inflight](RequestResult&& result) {
    OnReplies(*pending, result);
  });
}

void DistKVStore::OnReplies(Inflight& inflight, const RequestResult& result) {
  if (!result.ok() && result.lost_peer != kNoNode && inflight.reroutable) {
    Reroute(inflight, result);  // completes it when the new servers answered
    return;
  }
  std::string error = result.error;
  for (const Message& response : result.responses) {
    if (!error.empty()) break;
    const auto node = std::find(inflight.nodes.begin(), inflight.nodes.end(), response.meta.sender);
    if (node == inflight.nodes.end()) continue;
    error = CopyReply(
        response, inflight.destinations[static_cast<std::size_t>(node - inflight.nodes.begin())]);
  }
  // After a clean reply the server is done with the slots; after a failure it may still
  // write into them, so they are never used again.
  for (ShmSlot* slot : inflight.slots) {
    if (error.empty()) {
      slot->Release();
    } else {
      slot->Retire();
    }
  }
  for (auto& frames : inflight.frames) frames.clear();
  // Before the record goes back to the pool: Complete reads its keys.
  Complete(error, FailureOf(result, error), inflight.keys, inflight.pulls,
           error == result.error ? result.error_kind : ErrorKind::kOther);
  inflights_.Give(inflight);
}

std::string DistKVStore::CopyReply(const Message& response, std::span<const Destination> targets) {
  if (response.data.size() != targets.size()) {
    return "malformed response from " + runtime_->Describe(response.meta.sender);
  }
  for (std::size_t j = 0; j < targets.size(); ++j) {
    if (SliceCompression* copy = targets[j].compressed; copy != nullptr) {
      std::string error;
      try {  // the change since this worker's copy, or the full value
        error =
            copy->ApplyPull(response.data[j], targets[j].pull, targets[j].data, targets[j].device);
      } catch (const Error& e) {
        error = PulledValueError(e);
      }
      if (!error.empty()) {
        return "response from " + runtime_->Describe(response.meta.sender) + ": " + error;
      }
      continue;
    }
    const ShmSlot* slot = targets[j].slot;
    if (response.data[j].bytes() != (slot != nullptr ? 0 : targets[j].bytes)) {
      return "response from " + runtime_->Describe(response.meta.sender) + " has the wrong size";
    }
    const std::byte* value = slot != nullptr ? slot->data() : response.data[j].data();
    try {
      CopyFromHost(targets[j].data, targets[j].device, value, targets[j].bytes);
    } catch (const Error& e) {
      return PulledValueError(e);
    }
  }
  return "";
}

void DistKVStore::FollowRing() {
  if (ring_events_ == runtime_->server_event_count()) return;
  for (const Runtime::ServerEvent& event : runtime_->ServerEvents(ring_events_)) {
    if (event.joined) {
      ring_.MarkJoined(event.rank);
    } else {
      ring_.MarkDead(event.rank);
    }
    ++ring_events_;
  }
}

int DistKVStore::OwnerRank(int home) {
  if (!replicated_ || runtime_->server_event_count() == 0) return home;
  MutexLock lock(ring_mu_);
  FollowRing();
  const int owner = ring_.Primary(home);
  return owner < 0 ? home : owner;  // none left: the request fails on the dead one
}

bool DistKVStore::SharesSlotsWith(int home) {
  if (!replicated_ || runtime_->server_event_count() == 0) return true;
  MutexLock lock(ring_mu_);
  FollowRing();
  // A server that took a dead one's rank never mapped this worker's segments.
  return ring_.Primary(home) == home && !ring_.rejoined(home);
}

int DistKVStore::SlotMirror(int home) {
  if (!replicated_) return kNoNode;
  int replica = -1;
  {
    MutexLock lock(ring_mu_);
    FollowRing();
    replica = ring_.Replica(home);
  }
  if (replica < 0 || replica == home || !shm_servers_[static_cast<std::size_t>(replica)]) {
    return kNoNode;
  }
  return runtime_->ServerId(replica);
}

void DistKVStore::SendToLiveServers(const kv::Request& request) {
  std::vector<Message> messages;
  for (const int s : LiveServerRanks()) {
    messages.push_back(kv::RequestMessage(request, runtime_->ServerId(s)));
  }
  Track(messages, NewInflight(messages.size()));
}

std::vector<int> DistKVStore::DeadServerRanks() const {
  const std::vector<int> live = LiveServerRanks();  // in rank order
  std::vector<int> dead;
  for (int s = 0; s < runtime_->num_servers(); ++s) {
    if (!std::binary_search(live.begin(), live.end(), s)) dead.push_back(s);
  }
  return dead;
}

std::uint64_t DistKVStore::SliceCount() const {
  SharedLock lock(keys_mu_);
  std::uint64_t slices = 0;
  for (const auto& [key, info] : keys_) slices += info.slices.size();
  return slices;
}

std::vector<int> DistKVStore::LiveServerRanks() const {
  std::vector<int> live;
  for (int s = 0; s < runtime_->num_servers(); ++s) {
    if (!runtime_->IsDead(runtime_->ServerId(s))) live.push_back(s);
  }
  return live;
}

void DistKVStore::Reroute(Inflight& inflight, const RequestResult& result) {
  // Every message of the request goes again, not only the dead server's: the tracker stopped
  // listening for the others' answers. A live server recognizes the pushes it already has.
  auto state = std::make_shared<Rerouted>();
  state->slots = inflight.slots;
  state->keys = inflight.keys;
  state->pulls = inflight.pulls;
  std::vector<ReroutedPart> parts;
  for (std::size_t m = 0; m < inflight.nodes.size(); ++m) {
    ReroutedPart part;
    part.request = inflight.requests[m];
    part.frames = std::move(inflight.frames[m]);
    part.destinations = inflight.destinations[m];
    part.origins = inflight.origins[m];
    part.node = inflight.nodes[m];
    // Only the messages to the peer whose connection was reset went through it.
    part.resets = result.peer_reset && part.node == result.lost_peer ? 1 : 0;
    parts.push_back(std::move(part));
  }
  for (auto& frames : inflight.frames) frames.clear();
  inflights_.Give(inflight);
  {
    MutexLock lock(state->mu);
    state->remaining = parts.size();
  }
  for (ReroutedPart& part : parts) SendRerouted(state, std::move(part));
}

void DistKVStore::SendRerouted(const std::shared_ptr<Rerouted>& state, ReroutedPart part) {
  std::map<int, ReroutedPart> pieces;
  try {
    SplitRerouted(part, pieces);
  } catch (const Error& e) {  // a GPU value that cannot be copied again
    ReroutedPartDone(state, std::string(kStore) + ": a pushed value sent again: " + e.what());
    return;
  }
  {
    MutexLock lock(state->mu);
    state->remaining += pieces.size();
    --state->remaining;  // `part` itself
  }
  for (auto& [owner, piece] : pieces) {
    Message msg = kv::RequestMessage(piece.request, piece.node);
    msg.data = piece.frames;
    auto sent = std::make_shared<ReroutedPart>(std::move(piece));
    runtime_->Request(std::span<Message>(&msg, 1), [this, state, sent](RequestResult&& result) {
      OnReroutedReply(state, *sent, result);
    });
  }
}

void DistKVStore::SplitRerouted(const ReroutedPart& part, std::map<int, ReroutedPart>& pieces) {
  // A slice that went through a slot keeps it only when the same server still serves it;
  // elsewhere its value travels as a frame.
  const kv::Request& request = part.request;
  std::vector<const kv::ShmRef*> shm_of(request.slices.size(), nullptr);
  for (const kv::ShmRef& ref : request.shm) shm_of[ref.slice] = &ref;
  const bool carries_values = request.command != kv::kPull;
  std::size_t destination = 0;
  for (std::size_t i = 0; i < request.slices.size(); ++i) {
    const int owner = OwnerRank(request.homes[i]);
    const int node = runtime_->ServerId(owner);
    ReroutedPart& piece = pieces[owner];
    piece.node = node;
    piece.resets = part.resets;
    kv::Request& out = piece.request;
    out.command = request.command;
    out.sync = request.sync;
    out.collectives = request.collectives;
    out.slices.push_back(request.slices[i]);
    out.homes.push_back(request.homes[i]);
    if (!request.seqs.empty()) out.seqs.push_back(request.seqs[i]);
    if (!request.pulls.empty()) out.pulls.push_back(request.pulls[i]);
    const SliceOrigin origin = i < part.origins.size() ? part.origins[i] : SliceOrigin{};
    const bool keep_slot = shm_of[i] != nullptr && node == part.node;
    if (keep_slot) {
      kv::ShmRef ref = *shm_of[i];
      ref.slice = static_cast<std::uint32_t>(out.slices.size() - 1);
      out.shm.push_back(ref);
    }
    piece.origins.push_back(keep_slot ? origin : SliceOrigin{});
    if (carries_values) {
      Blob frame = part.frames[i];
      if (shm_of[i] != nullptr && !keep_slot) {
        // Out of the slot: the pushed value again from the caller's memory (valid until its
        // WaitAll), through a host copy when it lies on a GPU.
        const std::size_t bytes = shm_of[i]->bytes;
        if (origin.device.is_cuda()) {
          std::shared_ptr<std::byte> host = staging_->Get(bytes, origin.device);
          CopyFromDevice(host.get(), origin.source, bytes, origin.device);
          const std::byte* data = host.get();
          frame = Blob(std::move(host), data, bytes, frame.dtype());
        } else {
          frame = Blob(borrowed_, origin.source, bytes, frame.dtype());
        }
      }
      piece.frames.push_back(std::move(frame));
    }
    if (request.command != kv::kPush) {
      Destination target = part.destinations[destination++];
      if (!keep_slot) target.slot = nullptr;
      piece.destinations.push_back(target);
    }
  }
}

void DistKVStore::OnReroutedReply(const std::shared_ptr<Rerouted>& state, const ReroutedPart& part,
                                  const RequestResult& result) {
  std::string error = result.error;
  if (!result.ok() && result.lost_peer != kNoNode) {
    // Its new server died too, or the connection was reset again: on to the server that
    // serves the slices now, as long as a live one does (and not past kMaxResetRetries resets).
    bool served = true;
    for (const int home : part.request.homes) {
      served = served && !runtime_->IsDead(runtime_->ServerId(OwnerRank(home)));
    }
    ReroutedPart again = part;
    if (result.peer_reset) ++again.resets;
    if (served && again.resets <= kMaxResetRetries) {
      SendRerouted(state, std::move(again));  // the pieces take this part's place in the count
      return;
    }
    if (served) {
      error += "; sent " + std::to_string(again.resets) +
               " times, its connection reset every time (a server that cannot take the "
               "request, without the memory for its frames, drops the connection)";
    }
  }
  if (error.empty() && !result.responses.empty()) {
    error = CopyReply(result.responses[0], part.destinations);
  }
  ReroutedPartDone(state, error);
}

void DistKVStore::ReroutedPartDone(const std::shared_ptr<Rerouted>& state,
                                   const std::string& error) {
  std::string first_error;
  {
    MutexLock lock(state->mu);
    if (!error.empty() && state->error.empty()) state->error = error;
    if (--state->remaining != 0) return;
    first_error = state->error;
  }
  // The last part: the request is done. Its slots may have been written by a server that
  // died, or be written by a live one answering a copy sent twice: never used again.
  for (ShmSlot* slot : state->slots) slot->Retire();
  Complete(first_error, Failure::kOther, state->keys, state->pulls);
}

}  // namespace ps
