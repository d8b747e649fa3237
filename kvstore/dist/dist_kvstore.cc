#include "kvstore/dist/dist_kvstore.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <memory_resource>
#include <thread>
#include <unordered_set>

#include "kvstore/call_checks.h"
#include "kvstore/device_memory.h"
#include "kvstore/dist/dist_kvstore_common.h"
#include "ps/src/internal.h"

namespace ps {

using dist_detail::Bounded;
using dist_detail::FailureOf;
using dist_detail::kStore;

namespace {

// A pulled value that could not be copied into the caller's memory (a GPU copy, a compressed
// pull's decoding): the reply does not say for which key.
std::string PulledValueError(const Error& e) {
  return std::string(kStore) + ": a pulled value: " + e.what();
}

// Stack bytes for one Issue call's bookkeeping: a few hundred bytes per message it builds.
constexpr std::size_t kIssueScratchBytes = 8192;

// The most of the last raised error a worker that left through an exception reports: every
// node logs the report, and a failed WaitAll's error can list many keys.
constexpr std::size_t kRaisedShownChars = 600;

// In key order: workers that declare the same keys in another order make the same call. Longer
// than other calls: the scheduler names the first key that differs, which should be in the text
// for a model's usual number of parameters (about 2000 keys fit).
std::string DescribeInit(std::span<const Key> keys, std::span<const Tensor> values) {
  constexpr std::size_t kMaxInitCallChars = 64 * 1024;
  std::vector<std::size_t> order(keys.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [keys](auto a, auto b) { return keys[a] < keys[b]; });
  std::string call = "Init";
  std::uint64_t elements = 0;
  for (const std::size_t i : order) {
    call += (call.size() == 4 ? " key " : ", key ") + std::to_string(keys[i]) + " (" +
            std::to_string(values[i].size()) + " x " + DTypeName(values[i].dtype()) + ")";
    elements += values[i].size();
  }
  // Cut, the call still says how many keys and elements it covers: a difference past the cut
  // shows there.
  return Bounded(
      std::move(call), kMaxInitCallChars,
      std::to_string(keys.size()) + " keys of " + std::to_string(elements) + " elements in all");
}

}  // namespace

DistKVStore::DistKVStore(std::unique_ptr<Runtime> runtime, bool sync)
    : runtime_(std::move(runtime)),
      sync_(sync),
      replicated_(runtime_->config().replicated()),
      layout_(runtime_->num_servers(), runtime_->config().big_array_bound,
              runtime_->config().chunk_bytes, runtime_->config().server_weights),
      segment_limit_(runtime_->config().shm_max_segments),
      ring_(runtime_->num_servers(), replicated_, runtime_->config().server_weights) {
  for (int s = 0; s < runtime_->num_servers(); ++s) {
    shm_servers_.push_back(runtime_->config().use_shm && runtime_->SameHost(runtime_->ServerId(s)));
  }
}

DistKVStore::~DistKVStore() {
  std::string raised;  // before this WaitAll raises one of its own
  {
    MutexLock lock(raised_mu_);
    raised = std::move(last_raised_);
  }
  try {
    WaitAll();
  } catch (const Error& e) {
    PS_LOG(ERROR) << "worker " << Rank() << ": an operation failed before shutdown: " << e.what();
  }
  // Destroyed while an exception unwinds: this worker failed, and the job must not end as a
  // success (or wait for a heartbeat timeout).
  std::string failure;
  if (std::uncaught_exceptions() > 0) {
    failure = "its program left the KVStore through an exception";
    if (raised.size() > kRaisedShownChars) raised = raised.substr(0, kRaisedShownChars) + "...";
    if (!raised.empty()) failure += " (the last error the store raised to it: " + raised + ")";
  }
  ReportFinished(failure);
  EndCallsInProgress();
}

void DistKVStore::Raise(ErrorKind kind, const std::string& error, Failure failure) {
  {
    MutexLock lock(raised_mu_);
    last_raised_ = error;
  }
  dist_detail::ThrowFailure(failure, error, kind);
}

CallsInProgress::Call DistKVStore::EnterCall(std::string_view op) {
  return CallsInProgress::Call(calls_, kStore, op);
}

void DistKVStore::EndCallsInProgress() {
  const int active = calls_.Close();
  if (active == 0) return;
  // Another thread of the program is still in a call (a Barrier its peers never join): its
  // waits end with the runtime's failure, and it returns before anything it uses is freed.
  const std::string why = "worker " + std::to_string(Rank()) +
                          ": the KVStore was destroyed while another thread of the program "
                          "was in one of its calls";
  PS_LOG(WARNING) << why << " (" << active
                  << " in progress): they fail; destroy the store only after its other threads' "
                     "calls returned";
  runtime_->Fail(why);
  const auto bound =
      std::max(runtime_->config().heartbeat_timeout, std::chrono::milliseconds(5000));
  if (!calls_.AwaitNone(std::chrono::steady_clock::now() + bound)) {
    PS_LOG(ERROR) << "worker " << Rank() << ": a call of another thread has not returned "
                  << FormatSeconds(bound) << " after the KVStore's destruction began";
  }
}

void DistKVStore::ReportFailure(const std::string& why) {
  const auto in_call = EnterCall("ReportFailure");
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
  const auto in_call = EnterCall("Init");
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
    // Past its most segments the worker makes no more: they would also count against the
    // server's.
    std::string error = segment_limit_.Exceeded(shm_.mapped(), "worker " + std::to_string(Rank()));
    ShmSlots::NewSegment segment;
    try {
      if (error.empty()) segment = shm_.Create(sizes);
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
  const auto in_call = EnterCall("Push");
  Issue(kv::kPush, keys, grads, {}, priority);
}

void DistKVStore::PullImpl(std::span<const Key> keys, std::span<const Tensor> outs, int priority) {
  const auto in_call = EnterCall("Pull");
  Issue(kv::kPull, keys, {}, outs, priority);
}

void DistKVStore::PushPullImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                               std::span<const Tensor> outs, int priority) {
  const auto in_call = EnterCall("PushPull");
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

}  // namespace ps
