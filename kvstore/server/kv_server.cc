#include "kvstore/server/kv_server.h"

#include <glog/logging.h>
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>

#include "ps/mutex.h"
#include "ps/src/internal.h"
#include "ps/src/stderr_log.h"
#include "ps/thread_annotations.h"

namespace ps {
namespace {

// Why a dist_sync round of `key` can never close, because worker `who` is gone. Only a
// finished worker's missing push is the program's doing: one that died was cut off.
std::string UnfinishableRound(Key key, const std::string& who, bool died) {
  return KeyText(key) + ": this dist_sync round can never complete: " + who +
         (died ? " died before pushing it"
               : " has finished without pushing it (every worker must push each key "
                 "equally often)");
}

// Every pushed chunk arrives in a buffer ZeroMQ mallocs and the server frees after its round.
// glibc's defaults hand such buffers back to the kernel (munmap, or trimming the heap top) and
// fault fresh zeroed pages in for the next chunk: a page fault per 4 KiB of every push, about
// a quarter of a 16 MB push+pull over TCP (docs/performance.md). A server process keeps freed
// memory for reuse instead; its footprint stays at its high-water mark (the model plus the
// chunks in flight), and only more than kTrimBytes free at the heap top goes back.
void KeepFreedMemoryForReuse() {
  constexpr int kMmapThresholdBytes = 32 << 20;  // glibc's largest: only huge frames mmap
  constexpr int kTrimBytes = 256 << 20;
  if (mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes) != 1 ||
      mallopt(M_TRIM_THRESHOLD, kTrimBytes) != 1) {
    LOG(WARNING) << "mallopt failed: received chunks will fault in fresh pages (slower pushes)";
  }
}

// Requests held until this server's view of the job catches up with their sender's
// (KVServerStore::RoutedAhead): far more than a death's worth of in-flight requests.
constexpr std::size_t kMaxHeldRequests = 65536;

// A received frame at least this big has its own allocation, which the server may keep as a
// slice's value. ZeroMQ packs smaller ones into shared receive buffers.
constexpr std::size_t kAdoptMinBytes = 64 << 10;

// A fresh value buffer of `bytes` bytes, owned by the returned blob (and its copies). Throws
// std::bad_alloc, which the store turns into an error for the request (OutOfMemory).
Blob NewBuffer(std::size_t bytes, DType dtype) {
  return Blob::FromVector(std::vector<std::byte>(bytes), dtype);
}

}  // namespace

std::string OutOfMemory(Key key, std::uint64_t offset, std::uint64_t length, std::uint64_t total,
                        std::size_t bytes, std::string_view what) {
  std::string text = KeyText(key) + ": out of memory: this server could not allocate " +
                     std::to_string(bytes) + " bytes " + std::string(what);
  if (length < total) {
    text += " (elements " + std::to_string(offset) + " to " + std::to_string(offset + length) +
            " of the key's " + std::to_string(total) + ", its part on this server)";
  }
  return text +
         "; nothing was changed (give the server more memory, or spread the keys over more "
         "servers)";
}

KVServerStore::KVServerStore(Runtime& runtime)
    : runtime_(runtime),
      num_workers_(runtime.num_workers()),
      ring_(runtime.num_servers(), runtime.config().replicated(), runtime.config().server_weights),
      segment_limit_(runtime.config().shm_max_segments) {
  const int replica = ring_.ReplicaOf(runtime.rank());
  if (replica >= 0) replica_node_ = runtime.ServerId(replica);
}

void KVServerStore::OnRequest(Message&& msg) {
  failed_update_ = nullptr;  // a failed update's error is for the waiters it released
  std::string error;
  const kv::Request* request = nullptr;
  if (msg.meta.app_id != kv::kAppId) {
    error = "unknown application id " + std::to_string(msg.meta.app_id);
  } else {
    request = decoder_.Decode(msg, &error);
    if (request && RoutedAhead(*request)) {
      // Served once this server hears of the deaths and joins its sender knows of (ServeHeld).
      if (held_.size() < kMaxHeldRequests) {
        held_.push_back(std::move(msg));
        return;
      }
      error = "this server holds too many requests for key ranges it does not serve";
      request = nullptr;
    }
    msg.meta.body.clear();  // decoded; Pending keeps a copy of the meta, without it
  }
  shm_.clear();
  if (request) error = ResolveShm(msg.meta.sender, *request, msg.data, shm_);
  if (request && error.empty()) error = Validate(*request, msg.data, shm_);
  if (request && error.empty()) error = DecodeCompressed(*request, msg.data);
  if (!error.empty()) {
    const std::string server = "server " + std::to_string(runtime_.rank());
    if (LogOccurrence(++rejected_)) {  // the requester gets every error; the log a sample
      LOG(WARNING) << server << ": rejected a request (#" << rejected_ << ") from "
                   << runtime_.Describe(msg.meta.sender) << ": " << error;
    }
    runtime_.ReplyError(msg.meta, server + ": " + error);
    if (request && request->sync &&
        (request->command == kv::kPush || request->command == kv::kPushPull)) {
      FailRoundsOf(msg.meta.sender, *request, server + ": " + error);
    }
    return;
  }
  switch (request->command) {
    case kv::kInit:
      HandleInit(msg.meta, *request, msg.data);
      break;
    case kv::kPush:
    case kv::kPushPull:
      HandlePush(msg.meta, *request, msg.data, shm_);
      break;
    case kv::kPull:
      HandlePull(msg.meta, *request, shm_);
      break;
    case kv::kSetOptimizer:
      HandleSetOptimizer(msg.meta, *request);
      break;
    case kv::kShmAttach:
      HandleShmAttach(msg.meta, *request);
      break;
    case kv::kForget:
      HandleForget(msg.meta, *request);
      break;
    case kv::kSave:
      HandleSave(msg.meta, *request);
      break;
    case kv::kLoad:
      HandleLoad(msg.meta, *request);
      break;
    case kv::kSetCompression:
      HandleSetCompression(msg.meta, *request);
      break;
    case kv::kReplicate:
      HandleReplicate(msg.meta, *request, msg.data, shm_);
      break;
    case kv::kCollective:
      HandleCollective(msg.meta, *request);
      break;
    case kv::kStalled:
      HandleStalled(msg.meta, *request);
      break;
  }
}

std::string KVServerStore::ResolveShm(int sender, const kv::Request& request,
                                      std::vector<Blob>& data, std::vector<ShmTarget>& shm) const {
  if (request.shm.empty()) return "";
  shm.assign(request.slices.size(), ShmTarget{});
  for (const kv::ShmRef& ref : request.shm) {
    // A replicating server may name a worker's segment (a slot holding the update), which the
    // worker had this server map too; any other reference is to the sender's own.
    const int owner = ref.owner == kNoNode ? sender : ref.owner;
    const auto it = segments_.find({owner, ref.segment});
    const Key key = request.slices[ref.slice].key;
    if (it == segments_.end()) {
      return KeyText(key) + ": unknown shared-memory segment " + std::to_string(ref.segment) +
             (owner == sender ? "" : " of " + runtime_.Describe(owner));
    }
    const SharedSegment& segment = *it->second;
    if (ref.offset < SharedSegment::kHeaderBytes || ref.offset > segment.bytes() ||
        ref.bytes > segment.bytes() - ref.offset) {
      return KeyText(key) + ": shared-memory range outside its segment";
    }
    std::byte* where = segment.data() + ref.offset;
    shm[ref.slice] = ShmTarget{it->second, where, ref.bytes, ref};
    if (request.command != kv::kPull) {
      data[ref.slice] = Blob(it->second, where, ref.bytes, data[ref.slice].dtype());
    }
  }
  return "";
}

std::string KVServerStore::SegmentsFull() const {
  std::size_t mapped = segments_.size();
  for (const auto& [node, slots] : replica_shm_) mapped += slots.mapped();
  return segment_limit_.Exceeded(mapped, "server " + std::to_string(runtime_.rank()));
}

void KVServerStore::HandleShmAttach(const Meta& meta, const kv::Request& request) {
  const std::string server = "server " + std::to_string(runtime_.rank());
  if (const std::string full = SegmentsFull(); !full.empty()) {
    const std::string refusal =
        "will not map the shared memory of " + runtime_.Describe(meta.sender) + ": " + full;
    if (LogOccurrence(++refused_segments_)) LOG(WARNING) << server << ": " << refusal;
    runtime_.ReplyError(meta, server + ": " + refusal);
    return;
  }
  try {
    segments_[{meta.sender, request.segment_id}] = SharedSegment::Attach(request.segment);
  } catch (const Error& e) {
    runtime_.ReplyError(meta, server + ": cannot map the shared memory of " +
                                  runtime_.Describe(meta.sender) + ": " + e.what());
    return;
  }
  if (runtime_.config().verbose >= 1) {
    LOG(INFO) << server << ": attached the shared memory of " << runtime_.Describe(meta.sender)
              << " (" << request.segment.bytes << " bytes)";
  }
  runtime_.Reply(meta, Message{});
}

std::string KVServerStore::Validate(const kv::Request& request, const std::vector<Blob>& data,
                                    const std::vector<ShmTarget>& shm) {
  if (std::string why = ValidateLists(request); !why.empty()) return why;
  for (std::size_t i = 0; i < request.slices.size(); ++i) {
    if (std::string why = ValidateSlice(request, i, data, shm); !why.empty()) return why;
  }
  return "";
}

std::string KVServerStore::ValidateLists(const kv::Request& request) {
  if (request.slices.size() > 1) {
    seen_.clear();
    for (const kv::SliceRef& ref : request.slices) seen_.emplace_back(ref.key, ref.offset);
    std::sort(seen_.begin(), seen_.end());
    const auto twice = std::adjacent_find(seen_.begin(), seen_.end());
    if (twice != seen_.end()) return KeyText(twice->first) + ": given twice in one request";
  }
  for (const int rank : request.dead_servers) {
    if (rank >= ring_.num_servers()) {
      return "dead server rank " + std::to_string(rank) + " out of range (the job has " +
             std::to_string(ring_.num_servers()) + " servers)";
    }
  }
  for (std::size_t i = 0; i < request.homes.size(); ++i) {
    if (request.homes[i] >= ring_.num_servers()) {
      return KeyText(request.slices[i].key) + ": home server rank " +
             std::to_string(request.homes[i]) + " out of range (the job has " +
             std::to_string(ring_.num_servers()) + " servers)";
    }
  }
  return "";
}

std::string KVServerStore::ValidateSlice(const kv::Request& request, std::size_t i,
                                         const std::vector<Blob>& data,
                                         const std::vector<ShmTarget>& shm) const {
  const kv::SliceRef& ref = request.slices[i];
  const SliceId id{ref.key, ref.offset};
  const auto it = slices_.find(id);
  if (request.command == kv::kInit) {
    // The same values again are worker 0's Init sent once more after a server died: the
    // part that had arrived is kept (HandleInit).
    if (it != slices_.end() && !HoldsExactly(it->second, ref, data[i])) {
      return KeyText(ref.key) + ": already initialized (a key is initialized once)";
    }
    if (!IsSummableDType(data[i].dtype())) {
      return KeyText(ref.key) + ": dtype " + DTypeName(data[i].dtype()) + " is not supported";
    }
    return "";
  }
  // A Stalled request names keys the sender waits for, wherever they live.
  if (request.command == kv::kSetOptimizer || request.command == kv::kForget ||
      request.command == kv::kSetCompression || request.command == kv::kReplicate ||
      request.command == kv::kStalled) {
    return "";
  }
  if (it == slices_.end()) {
    const int home = request.homes.empty() ? -1 : request.homes[i];
    const bool moved = home >= 0 && ring_.num_servers() > 1 &&
                       (ring_.Primary(home) != home || ring_.rejoined(home));
    if (moved) {  // its home's server died: it should be here
      return KeyText(ref.key) +
             ": lost: the servers that held it died before a new copy was made (the job "
             "cannot recover it; restart from a checkpoint)";
    }
    return KeyText(ref.key) + ": was never initialized (call Init first)";
  }
  const Slice& slice = it->second;
  if (!shm.empty() && shm[i].data != nullptr &&
      shm[i].bytes != slice.length * DTypeSize(slice.dtype)) {
    return KeyText(ref.key) + ": size mismatch: expected " + std::to_string(slice.total) +
           " elements, the shared-memory slot holds " + std::to_string(shm[i].bytes) + " bytes";
  }
  if (!request.pulls.empty() && request.pulls[i].next != 0) {
    const bool in_shm = !shm.empty() && shm[i].data != nullptr;
    if (std::string why = CheckCompressedPull(ref, slice, in_shm); !why.empty()) return why;
  }
  if (request.command == kv::kPull) return "";
  // A frame of dtype uint8 for a key of another dtype is a compressed gradient.
  if (data[i].dtype() == DType::kUInt8 && slice.dtype != DType::kUInt8) {
    if (std::string why = CheckCompressedPush(ref, slice, data[i]); !why.empty()) return why;
  } else if (data[i].dtype() != slice.dtype) {
    return KeyText(ref.key) + ": dtype mismatch: expected " + DTypeName(slice.dtype) + ", given " +
           DTypeName(data[i].dtype());
  } else if (data[i].count() != slice.length || ref.total != slice.total) {
    return KeyText(ref.key) + ": size mismatch: expected " + std::to_string(slice.total) +
           " elements, given " + std::to_string(ref.total);
  }
  if (!request.sync && !optimizer_) {
    return KeyText(ref.key) +
           ": dist_async applies every push at once, so it needs an optimizer: call "
           "SetOptimizer before the first Push";
  }
  if (optimizer_ && slice.dtype != DType::kFloat32) {
    return KeyText(ref.key) + ": optimizers update float32 keys only, this key holds " +
           DTypeName(slice.dtype);
  }
  if (request.sync && !gone_workers_.empty()) {
    const GoneWorker& gone = gone_workers_.begin()->second;
    return UnfinishableRound(ref.key, gone.who, gone.died);
  }
  return "";
}

bool KVServerStore::HoldsExactly(const Slice& slice, const kv::SliceRef& ref, const Blob& value) {
  return slice.dtype == value.dtype() && slice.length == value.count() &&
         slice.total == ref.total && slice.value.bytes() == value.bytes() &&
         std::memcmp(slice.value.data(), value.data(), value.bytes()) == 0;
}

void KVServerStore::HandleInit(const Meta& meta, const kv::Request& request,
                               const std::vector<Blob>& data) {
  // Every slice is built (and allocated) aside first: an Init this server has no memory for is
  // answered with an error naming the key and the size, and stores nothing.
  std::map<SliceId, Slice> staged;
  std::size_t i = 0;
  try {
    for (; i < request.slices.size(); ++i) {
      const kv::SliceRef& ref = request.slices[i];
      if (slices_.contains({ref.key, ref.offset})) continue;  // sent again (Validate)
      Slice slice;
      slice.key = ref.key;
      slice.offset = ref.offset;
      slice.home = request.homes.empty() ? runtime_.rank() : request.homes[i];
      slice.dtype = data[i].dtype();
      slice.length = data[i].count();
      slice.total = ref.total;
      slice.state_id = next_state_id_++;
      slice.value = NewBuffer(data[i].bytes(), slice.dtype);
      CopyInto(const_cast<std::byte*>(slice.value.data()), data[i].data(), data[i].bytes(),
               parallel_);
      staged.emplace(SliceId{ref.key, ref.offset}, std::move(slice));
    }
  } catch (const std::bad_alloc&) {
    const std::string server = "server " + std::to_string(runtime_.rank());
    const kv::SliceRef& ref = request.slices[i];
    const std::string error = OutOfMemory(ref.key, ref.offset, data[i].count(), ref.total,
                                          data[i].bytes(), "for the value this Init stores");
    if (LogOccurrence(++rejected_)) LOG(WARNING) << server << ": " << error;
    runtime_.ReplyError(meta, server + ": " + error);
    return;
  }
  std::vector<SliceId> ids;
  for (const auto& [id, slice] : staged) ids.push_back(id);
  slices_.merge(staged);  // moves the nodes: allocates nothing (all of them are new)
  if (replica_node_ == kNoNode) {
    runtime_.Reply(meta, Message{});
    return;
  }
  // Answered once the replica holds every slice: a new one once its copy is in, one sent
  // again once what is on its way to the replica (a copy after a failover, updates) is in.
  AttachReplicaSlots(ids, replica_node_);
  Pending* const pending = StartPending(meta, request, false, {});
  for (std::size_t j = 0; j < request.slices.size(); ++j) {
    const SliceId id{request.slices[j].key, request.slices[j].offset};
    Slice& slice = slices_.at(id);
    const Waiter waiter{pending, j};
    if (std::binary_search(ids.begin(), ids.end(), id)) {
      slice.replicated_to = replica_node_;
      Forward copy;
      copy.kind = kv::ReplicaKind::kState;
      copy.waiters.push_back(waiter);
      StartForward(slice, std::move(copy));
    } else {
      ResolveWhenReplicated(slice, waiter);
    }
  }
}

void KVServerStore::HandleForget(const Meta& meta, const kv::Request& request) {
  // Only Init's undo sends this, before any push or pull of the keys: a slice with a push in
  // progress is left alone (its waiters would never be answered). One whose Init copy is still
  // on its way to the replica goes: what waits for that copy (this Init's other part, maybe
  // sent again) is answered with an error now, and the replica drops its copy after it.
  for (const kv::SliceRef& ref : request.slices) {
    const auto it = slices_.find({ref.key, ref.offset});
    if (it == slices_.end()) continue;
    Slice& slice = it->second;
    if (slice.updating()) continue;
    for (const Forward& copy : slice.forwards) {
      for (const Waiter& waiter : copy.waiters) {
        FailWaiter(waiter, KeyText(ref.key) + ": its Init was undone");
      }
    }
    if (slice.replicated_to != kNoNode) {
      Forward drop;
      drop.kind = kv::ReplicaKind::kForget;
      SendForward(slice, drop);  // no answer awaited: the copy of an Init undone
    }
    slices_.erase(it);
  }
  runtime_.Reply(meta, Message{});
}

void KVServerStore::HandleSetOptimizer(const Meta& meta, const kv::Request& request) {
  try {
    optimizer_ = MakeOptimizer(request.optimizer, parallel_);
  } catch (const Error& e) {
    runtime_.ReplyError(meta, "server " + std::to_string(runtime_.rank()) + ": " + e.what());
    return;
  }
  optimizer_body_ = SettingBody(request);
  runtime_.Reply(meta, Message{});
}

KVServerStore::Pending& KVServerStore::NewPending(const Meta& meta, std::size_t parts) {
  Pending& pending = pendings_.Take();
  // Assignments into a reused Pending keep the memory its strings and vectors already hold.
  pending.request = meta;
  pending.remaining = parts;
  pending.with_values = false;
  pending.values_only = false;
  pending.values.clear();
  pending.shm.clear();
  pending.pulls.clear();
  pending.pull_ids.clear();
  pending.error.clear();
  return pending;
}

KVServerStore::Pending* KVServerStore::StartPending(const Meta& meta, const kv::Request& request,
                                                    bool with_values,
                                                    const std::vector<ShmTarget>& shm) {
  const std::size_t slices = request.slices.size();
  Pending* pending = &NewPending(meta, slices);
  pending->with_values = with_values;
  pending->values.assign(with_values ? slices : 0, Blob());
  pending->shm.assign(shm.begin(), shm.end());
  pending->pulls.assign(request.pulls.begin(), request.pulls.end());
  for (std::size_t i = 0; i < request.pulls.size(); ++i) {
    pending->pull_ids.emplace_back(request.slices[i].key, request.slices[i].offset);
  }
  if (slices == 0) {
    Answer(*pending);
    return nullptr;
  }
  return pending;
}

void KVServerStore::HandlePush(const Meta& meta, const kv::Request& request,
                               std::vector<Blob>& data, const std::vector<ShmTarget>& shm) {
  if (!stalled_.empty()) stalled_.erase(meta.sender);  // its wait is over
  Pending* const pending = StartPending(meta, request, request.command == kv::kPushPull, shm);
  if (pending == nullptr) return;
  for (std::size_t i = 0; i < request.slices.size(); ++i) {
    Slice& slice = slices_.at({request.slices[i].key, request.slices[i].offset});
    const Waiter waiter{pending, i};
    const bool in_shm = !shm.empty() && shm[i].data != nullptr;
    Gradient gradient{data[i], in_shm, in_shm ? shm[i].ref : kv::ShmRef{}};
    if (in_shm) gradient.slot.owner = meta.sender;
    if (!request.sync) {
      if (request.seqs.empty()) {
        ApplyUpdate(slice, gradient);
        Resolve(waiter, slice);
        continue;
      }
      // A push sent again after a server died is applied once: answered once the replica holds
      // it when it was applied (`seen` holds applied pushes only, here those applied ahead of
      // the replica too, so a copy to a new replica claims exactly those its value holds), or
      // with the copy under way.
      const std::uint64_t seq = request.seqs[i];
      if (slice.seen[meta.sender].Contains(seq)) {
        ResolveWhenReplicated(slice, waiter);
        continue;
      }
      const auto under_way =
          std::find_if(slice.forwards.begin(), slice.forwards.end(), [&](const Forward& f) {
            return f.kind == kv::ReplicaKind::kAsyncPush && f.worker == meta.sender && f.seq == seq;
          });
      if (under_way != slice.forwards.end()) {
        under_way->waiters.push_back(waiter);
        continue;
      }
      Forward push;
      push.kind = kv::ReplicaKind::kAsyncPush;
      push.seq = seq;
      push.worker = meta.sender;
      push.gradient = gradient;
      push.waiters.push_back(waiter);
      StartForward(slice, std::move(push));  // applied at once when the slice has no replica
      ApplyPushesAhead(slice);
      continue;
    }
    const std::uint64_t round = RoundOf(slice, meta.sender, request, i);
    if (PushedInto(slice, meta.sender, round)) {
      // Sent again after a server died: answered with the round's value, applied once. (No
      // later round can be on its way to the replica: it would need this sender's next push.)
      if (round < slice.completed) {
        ResolveWhenReplicated(slice, waiter);
      } else {
        slice.waiters.push_back({round, waiter});
      }
      continue;
    }
    auto& last = slice.last_round[meta.sender];
    last = std::max(last, round);
    if (round == slice.completed && !slice.round_in_flight) {
      MergeIntoRound(slice, meta.sender, gradient, waiter, request.collectives);
      CloseRound(slice);
    } else {
      slice.deferred.push_back(
          DeferredPush{meta.sender, round, gradient, waiter, request.collectives});
    }
    if (!in_collective_.empty()) CheckCollectives(slice, request.collectives);
  }
}

std::uint64_t KVServerStore::RoundOf(const Slice& slice, int sender, const kv::Request& request,
                                     std::size_t index) const {
  if (!request.seqs.empty()) return request.seqs[index];
  const auto last = slice.last_round.find(sender);
  if (last != slice.last_round.end() && last->second >= slice.completed) return last->second + 1;
  return slice.completed;
}

bool KVServerStore::PushedInto(const Slice& slice, int sender, std::uint64_t round) const {
  if (round < slice.completed) return true;
  if (round == slice.completed &&
      std::find(slice.pushed.begin(), slice.pushed.end(), sender) != slice.pushed.end()) {
    return true;
  }
  return std::any_of(slice.deferred.begin(), slice.deferred.end(), [&](const DeferredPush& push) {
    return push.sender == sender && push.round == round;
  });
}

void KVServerStore::HandlePull(const Meta& meta, const kv::Request& request,
                               const std::vector<ShmTarget>& shm) {
  Pending* const pending = StartPending(meta, request, true, shm);
  if (pending == nullptr) return;
  pending->values_only = request.command == kv::kPull && request.pulls.empty();
  // A round still open never closes once a worker is gone (OnPeer failed those waiting then).
  const auto wait_for_round = [&](Slice& slice, std::uint64_t round, const Waiter& waiter) {
    if (round == slice.completed && slice.round_in_flight && AnswersEarly(waiter) &&
        slice.AppliedAhead() != nullptr) {
      Resolve(waiter, slice);  // that round is applied here already
    } else if (gone_workers_.empty()) {
      slice.waiters.push_back({round, waiter});
    } else {
      const GoneWorker& gone = gone_workers_.begin()->second;
      FailWaiter(waiter, "server " + std::to_string(runtime_.rank()) + ": " +
                             UnfinishableRound(slice.key, gone.who, gone.died));
    }
  };
  for (std::size_t i = 0; i < request.slices.size(); ++i) {
    Slice& slice = slices_.at({request.slices[i].key, request.slices[i].offset});
    const Waiter waiter{pending, i};
    if (request.sync && !request.seqs.empty()) {
      // After the puller's own pushes: the rounds before its push number.
      const std::uint64_t pushes = request.seqs[i];
      if (pushes > slice.completed) {
        wait_for_round(slice, pushes - 1, waiter);
      } else {
        ResolveCurrent(slice, waiter);
      }
      continue;
    }
    const auto last = slice.last_round.find(meta.sender);
    if (request.sync && last != slice.last_round.end() && last->second >= slice.completed) {
      wait_for_round(slice, last->second, waiter);  // after the puller's own push
    } else {
      ResolveCurrent(slice, waiter);
    }
  }
}

void KVServerStore::FailRoundsOf(int sender, const kv::Request& request, const std::string& why) {
  // Only a worker of the job takes part in rounds; a worker that is gone already failed them.
  const NodeInfo* node = PeerOf(sender);
  if (node == nullptr || node->role != Role::kWorker || !gone_workers_.empty()) return;
  const std::string reason = "this dist_sync round cannot complete: " + runtime_.Describe(sender) +
                             "'s push was rejected (" + why + ")";
  for (std::size_t i = 0; i < request.slices.size(); ++i) {
    const kv::SliceRef& ref = request.slices[i];
    const auto it = slices_.find({ref.key, ref.offset});
    if (it == slices_.end()) continue;
    Slice& slice = it->second;
    // The round the rejected push would have joined: it fails, and the push counts as the
    // sender's part in it, so the others' pushes of that round fail too (at once, or when they
    // arrive) and the next round starts aligned.
    const std::uint64_t round = RoundOf(slice, sender, request, i);
    if (slice.failed_rounds.contains(round)) continue;  // a request naming the slice twice
    if (PushedInto(slice, sender, round)) continue;     // sent again: its part is counted
    FailRound(slice, sender, round, KeyText(ref.key) + ": " + reason);
  }
}

void KVServerStore::FailRound(Slice& slice, int sender, std::uint64_t round,
                              const std::string& failure) {
  auto& last = slice.last_round[sender];
  last = std::max(last, round);
  slice.failed_rounds.emplace(round, failure);
  const Waiter marker{nullptr, 0};  // the sender's part, with nobody to answer
  if (round != slice.completed || slice.round_in_flight) {
    slice.deferred.push_back(DeferredPush{sender, round, Gradient(), marker});
    return;
  }
  // The open round: what it gathered so far is dropped and its waiters fail now.
  DropRoundSum(slice);
  std::erase_if(slice.waiters, [&](const RoundWaiter& entry) {
    if (entry.round != slice.completed) return false;
    FailWaiter(entry.waiter, failure);
    return true;
  });
  MergeIntoRound(slice, sender, Gradient(), marker);
  CloseRound(slice);
}

void KVServerStore::HandleCollective(const Meta& meta, const kv::Request& request) {
  const std::string server = "server " + std::to_string(runtime_.rank());
  const NodeInfo* node = PeerOf(meta.sender);
  if (node == nullptr || node->role != Role::kWorker) {
    runtime_.ReplyError(meta, server + ": only workers enter collectives");
    return;
  }
  if (request.membership < membership_) {
    // The worker has not heard of every server death or join this server knows of: pushes it
    // sends again to this server after it does may come after this announcement, so the
    // announcement does not say that all its pushes before the collective are in.
    runtime_.Reply(meta, Message{});
    return;
  }
  stalled_.erase(meta.sender);  // out of its wait
  const CollectiveEntry& entry = in_collective_[meta.sender] =
      CollectiveEntry{request.collectives + 1, request.call};
  if (runtime_.config().verbose >= 1) {
    LOG(INFO) << server << ": " << runtime_.Describe(meta.sender) << " enters collective #"
              << entry.number << " (" << entry.call << ")";
  }
  std::string why;
  for (auto& [id, slice] : slices_) {
    if (!Serves(slice)) continue;
    const std::string failed = FailRoundWaitingFor(slice, meta.sender, entry);
    if (why.empty()) why = failed;
  }
  if (why.empty()) {
    runtime_.Reply(meta, Message{});
  } else {
    runtime_.ReplyError(meta, server + ": " + why);
  }
}

std::string KVServerStore::FailRoundWaitingFor(Slice& slice, int worker,
                                               const CollectiveEntry& entry) {
  // Only an open round holding a push from before the collective, without the worker's.
  if (slice.pushed.empty() || slice.round_in_flight || slice.round_collectives >= entry.number ||
      slice.failed_rounds.contains(slice.completed) ||
      std::find(slice.pushed.begin(), slice.pushed.end(), worker) != slice.pushed.end()) {
    return "";
  }
  const std::string why =
      KeyText(slice.key) +
      ": this dist_sync round can never complete: " + runtime_.Describe(worker) +
      " is in a collective (" + entry.call + ") and pushed this key fewer times than " +
      runtime_.Describe(slice.pushed.front()) +
      ": every worker must push each key equally often between collectives (Barrier, Init, "
      "SetOptimizer, checkpoints)";
  FailRound(slice, worker, slice.completed, why);
  return why;
}

void KVServerStore::CheckCollectives(Slice& slice, std::uint64_t collectives) {
  for (auto it = in_collective_.begin(); it != in_collective_.end();) {
    // A push from after that collective: it is over for every worker (or the pushing worker's
    // other thread pushed while it votes; then this server stops checking the collective).
    if (collectives >= it->second.number) {
      it = in_collective_.erase(it);
      continue;
    }
    FailRoundWaitingFor(slice, it->first, it->second);
    ++it;
  }
}

void KVServerStore::FailWaiter(const Waiter& waiter, const std::string& why) {
  Pending& pending = *waiter.pending;
  if (pending.error.empty()) pending.error = why;
  if (--pending.remaining == 0) Answer(pending);
}

void KVServerStore::MergeIntoRound(Slice& slice, int sender, const Gradient& gradient,
                                   const Waiter& waiter, std::uint64_t collectives) {
  slice.round_collectives =
      slice.pushed.empty() ? collectives : std::min(slice.round_collectives, collectives);
  if (const auto failed = slice.failed_rounds.find(slice.completed);
      failed != slice.failed_rounds.end()) {
    // A failed round: each worker's part is counted, nothing is summed, every push fails.
    if (waiter.pending != nullptr) FailWaiter(waiter, failed->second);
    slice.pushed.push_back(sender);
    return;
  }
  const NodeInfo* const worker = PeerOf(sender);
  FoldInRankOrder(slice, worker != nullptr ? worker->rank : -1, gradient);
  slice.pushed.push_back(sender);  // once per round: a worker's next push waits in `deferred`
  slice.waiters.push_back({slice.completed, waiter});
}

void KVServerStore::FoldInRankOrder(Slice& slice, int rank, const Gradient& gradient) {
  if (rank != slice.folded) {
    slice.unfolded.emplace_back(rank, gradient);  // CloseRound adds what is left, in rank order
    return;
  }
  AddToRoundSum(slice, gradient);
  for (auto next = slice.unfolded.begin(); next != slice.unfolded.end();) {
    if (next->first != slice.folded) {
      ++next;
      continue;
    }
    AddToRoundSum(slice, next->second);
    slice.unfolded.erase(next);
    next = slice.unfolded.begin();  // a held rank may now be next: look again from the start
  }
}

void KVServerStore::AddToRoundSum(Slice& slice, const Gradient& gradient) {
  if (slice.folded++ == 0) {
    slice.sum = gradient;  // the round's accumulator from now on: no merge buffer, no copy
    return;
  }
  // Rank 0's bytes are this server's to change: a frame it received (nobody else references
  // it) or the pushing worker's shared-memory slot (which the worker leaves alone until the
  // reply, and which gets the reply value anyway).
  AddInto(slice.dtype, const_cast<std::byte*>(slice.sum.values.data()), gradient.values.data(),
          slice.length, parallel_);
}

void KVServerStore::DropRoundSum(Slice& slice) {
  slice.sum = Gradient();
  slice.folded = 0;
  slice.unfolded.clear();
}

void KVServerStore::CloseRound(Slice& slice) {
  if (slice.round_in_flight || slice.pushed.size() != static_cast<std::size_t>(num_workers_)) {
    return;
  }
  slice.round_in_flight = true;
  if (!slice.unfolded.empty()) {
    // Every rank 0 .. num_workers-1 pushed, so only a sender outside them is left (none in a
    // job whose workers hold those ranks): added last, in rank order.
    std::vector<std::pair<int, Gradient>> left;
    left.swap(slice.unfolded);
    std::ranges::sort(left, {}, [](const auto& held) { return held.first; });
    for (const auto& held : left) AddToRoundSum(slice, held.second);
  }
  Forward round;
  // A failed round changes nothing: the value stays as the last good round left it.
  round.kind = slice.failed_rounds.contains(slice.completed) ? kv::ReplicaKind::kSkippedRound
                                                             : kv::ReplicaKind::kRound;
  round.seq = slice.completed;
  if (round.kind == kv::ReplicaKind::kRound) round.gradient = slice.sum;
  // Only behind nothing else on its way: a request waiting on an earlier update (a push sent
  // again after a failover, waiting on the copy) is answered with the value before this round.
  const bool apply_ahead = round.kind == kv::ReplicaKind::kRound &&
                           slice.replicated_to != kNoNode && slice.forwards.empty();
  StartForward(slice, std::move(round));  // CommitRound, now or when the replica answers
  if (!apply_ahead) return;
  // The sum is on its way to the replica (at the back of the queue: a failed send never
  // answers on this thread): applied here meanwhile, so the two updates overlap rather than
  // follow each other. Out of memory, it is applied when the replica answers, as the rest.
  Forward& sent = slice.forwards.back();
  ApplyUpdate(slice, sent.gradient);
  sent.applied = failed_update_ != &slice;
  failed_update_ = nullptr;
  if (sent.applied) ResolveEarlyPulls(slice);
}

void KVServerStore::ApplyPushesAhead(Slice& slice) {
  // The pushes on their way to the replica are applied here in the order they were sent, the
  // order the replica applies them in (an optimizer's step depends on it): from the front of
  // the queue, past copies and those applied already, up to one that cannot be applied now
  // (out of memory: it is applied when the replica answers, and this runs again then).
  for (Forward& forward : slice.forwards) {
    if (forward.applied || !forward.updates()) continue;
    if (forward.kind != kv::ReplicaKind::kAsyncPush) return;
    ApplyUpdate(slice, forward.gradient);
    forward.applied = failed_update_ != &slice;
    failed_update_ = nullptr;
    if (!forward.applied) return;
    slice.seen[forward.worker].Add(forward.seq);
  }
}

void KVServerStore::ResolveEarlyPulls(Slice& slice) {
  // Rounds before the open one were answered when they were committed; the open one is the
  // round just applied.
  std::erase_if(slice.waiters, [&](const RoundWaiter& entry) {
    if (entry.round > slice.completed || !AnswersEarly(entry.waiter)) return false;
    Resolve(entry.waiter, slice);
    return true;
  });
}

bool KVServerStore::CommitRound(Slice& slice, const Gradient& sum,
                                const std::vector<Waiter>& replicated) {
  if (slice.failed_rounds.erase(slice.completed) == 0 && sum.values.data() != nullptr) {
    ApplyUpdate(slice, sum);
  } else {
    failed_update_ = nullptr;  // nothing applied now: an earlier update's error is not this one's
  }
  const bool applied = failed_update_ != &slice;
  DropRoundSum(slice);  // releases the frame (or slot) that held the round's sum
  slice.pushed.clear();
  slice.round_in_flight = false;
  ++slice.completed;
  // Answer everyone whose round is now closed (answering never touches this slice), and keep
  // the others in order.
  std::erase_if(slice.waiters, [&](const RoundWaiter& entry) {
    if (entry.round >= slice.completed) return false;
    Resolve(entry.waiter, slice);
    return true;
  });
  // Before the next round can change the value (CloseRound applies it ahead of the replica).
  for (const Waiter& waiter : replicated) Resolve(waiter, slice);
  // Pushes that arrived early join the round that just opened.
  std::erase_if(slice.deferred, [&](const DeferredPush& push) {
    if (push.round != slice.completed) return false;
    MergeIntoRound(slice, push.sender, push.gradient, push.waiter, push.collectives);
    return true;
  });
  CloseRound(slice);
  return applied;
}

std::byte* KVServerStore::WritableValue(Slice& slice) {
  // A reply frame may still reference the current buffer: write a fresh one then (which may
  // throw std::bad_alloc before anything changed: ApplyUpdate).
  if (slice.value.owner().use_count() > 1) {
    Blob fresh = NewBuffer(slice.value.bytes(), slice.dtype);
    CopyInto(const_cast<std::byte*>(fresh.data()), slice.value.data(), slice.value.bytes(),
             parallel_);
    slice.value = std::move(fresh);
  }
  return const_cast<std::byte*>(slice.value.data());
}

void KVServerStore::ApplyUpdate(Slice& slice, const Gradient& gradient) {
  failed_update_ = nullptr;
  try {
    if (optimizer_) {
      optimizer_->Update(slice.state_id, reinterpret_cast<float*>(WritableValue(slice)),
                         reinterpret_cast<const float*>(gradient.values.data()), slice.length);
      return;
    }
    // No optimizer: the stored value becomes the round's sum (dist_sync). A big received frame
    // is this server's alone, so it becomes the value as it is. A small one may share ZeroMQ's
    // receive batch buffer (and would pin it), and a shared-memory slot is the worker's again
    // after the reply: those are copied.
    if (!gradient.in_shared_memory && gradient.values.bytes() >= kAdoptMinBytes) {
      slice.value = gradient.values;
      return;
    }
    CopyInto(WritableValue(slice), gradient.values.data(), slice.value.bytes(), parallel_);
  } catch (const std::bad_alloc&) {
    // Out of memory before anything was written (the copy-on-write buffer and the optimizer's
    // state are allocated first, and a state left half-made is made again next time): the
    // value stays, and the waiters this update releases get the error instead (Resolve).
    failed_update_ = &slice;
    failed_update_error_ =
        "server " + std::to_string(runtime_.rank()) + ": " +
        OutOfMemory(
            slice.key, slice.offset, slice.length, slice.total, slice.value.bytes(),
            optimizer_ ? "for its updated value or its optimizer state" : "for its updated value");
    if (LogOccurrence(++rejected_)) LOG(WARNING) << failed_update_error_;
  }
}

const NodeInfo* KVServerStore::PeerOf(int node_id) const {
  const auto& nodes = runtime_.nodes();
  if (node_id <= 0 || static_cast<std::size_t>(node_id) >= nodes.size()) return nullptr;
  return &nodes[static_cast<std::size_t>(node_id)];
}

void KVServerStore::Resolve(const Waiter& waiter, const Slice& slice) {
  Pending& pending = *waiter.pending;
  if (&slice == failed_update_ && pending.error.empty()) pending.error = failed_update_error_;
  if (pending.with_values) pending.values[waiter.index] = slice.value;
  if (--pending.remaining == 0) Answer(pending);
}

void KVServerStore::ResolveWhenReplicated(Slice& slice, const Waiter& waiter) {
  if (slice.forwards.empty()) {
    Resolve(waiter, slice);
  } else {
    slice.forwards.back().waiters.push_back(waiter);  // answered once that one is applied
  }
}

void KVServerStore::ResolveCurrent(Slice& slice, const Waiter& waiter) {
  // dist_sync: at most one round is on its way at a time (CloseRound waits for the one before),
  // and no update applies here before it is answered: its waiters see exactly what the replica
  // holds. dist_async: the first push applied ahead answers them, with the value as it is then.
  Forward* const ahead = slice.AppliedAhead();
  if (ahead == nullptr || AnswersEarly(waiter)) {
    Resolve(waiter, slice);
  } else {
    ahead->waiters.push_back(waiter);
  }
}

void KVServerStore::Answer(Pending& pending) {
  if (!pending.error.empty()) {
    runtime_.ReplyError(pending.request, pending.error);
  } else {
    // The reply carries no body: the worker matches values to slices by the request it kept.
    // One response Message serves every reply; its value list and the Pending's trade places,
    // so neither allocates once both have grown.
    response_.meta = Meta{};
    response_.data.clear();
    if (pending.with_values) {
      if (!pending.pulls.empty()) CompressPullReplies(pending);
      // Shared-memory slices: the value goes into the worker's slot, the frame stays empty.
      for (std::size_t i = 0; i < pending.shm.size(); ++i) {
        const ShmTarget& target = pending.shm[i];
        if (target.data == nullptr) continue;
        Blob& value = pending.values[i];
        CopyInto(target.data, value.data(), value.bytes(), parallel_);
        value = Blob(nullptr, nullptr, 0, value.dtype());
      }
      response_.data.swap(pending.values);
    }
    runtime_.ReplyWith(pending.request, response_);
    response_.data.clear();  // the sent frames hold their own references
  }
  // Spare from here on: it must not keep values or mappings alive.
  pending.values.clear();
  pending.shm.clear();
  pending.pulls.clear();
  pendings_.Give(pending);
}

void KVServerStore::FailWaiters(Slice& slice, const std::string& why) {
  ready_.clear();
  for (const RoundWaiter& entry : slice.waiters) ready_.push_back(entry.waiter);
  for (const DeferredPush& push : slice.deferred) ready_.push_back(push.waiter);
  slice.waiters.clear();
  slice.deferred.clear();
  slice.pushed.clear();
  DropRoundSum(slice);
  slice.last_round.clear();
  slice.failed_rounds.clear();
  for (const Waiter& waiter : ready_) {
    if (waiter.pending != nullptr) FailWaiter(waiter, why);
  }
}

void KVServerStore::OnPeer(const NodeInfo& peer, Runtime::PeerEvent event) {
  if (peer.role == Role::kServer) {
    if (event == Runtime::PeerEvent::kDead) OnServerDead(peer);
    if (event == Runtime::PeerEvent::kJoined) OnServerJoined(peer);
    if (event == Runtime::PeerEvent::kReset) OnServerReset(peer);
    return;
  }
  if (peer.role != Role::kWorker) return;
  // A worker whose connection was reset sends its requests again (or fails them) itself; its
  // stall no longer says that every push it sent is here.
  stalled_.erase(peer.id);
  if (event == Runtime::PeerEvent::kReset) return;
  const GoneWorker gone{peer.Describe(), event == Runtime::PeerEvent::kDead};
  gone_workers_[peer.id] = gone;
  if (runtime_.config().verbose >= 1) {
    LOG(INFO) << "server " << runtime_.rank() << ": " << gone.who
              << (gone.died ? " died" : " has finished")
              << ": dist_sync rounds that wait for it fail";
  }
  // Its segments: requests still holding one keep it mapped until they are answered.
  std::erase_if(segments_, [&](const auto& entry) { return entry.first.first == peer.id; });
  for (auto& [id, slice] : slices_) {
    slice.mirrors.erase(peer.id);  // its copies of compressed pulls
    const bool waits_on_peer =
        !slice.pushed.empty() &&
        std::find(slice.pushed.begin(), slice.pushed.end(), peer.id) == slice.pushed.end();
    if (waits_on_peer || !slice.deferred.empty()) {
      FailWaiters(slice, "server " + std::to_string(runtime_.rank()) + ": " +
                             UnfinishableRound(id.first, gone.who, gone.died));
    }
  }
}

int RunServer(const ClusterConfig& config) {
  KeepFreedMemoryForReuse();  // the process is the server's from here to its exit
  auto runtime = Runtime::Start(config);
  const int rank = runtime->rank();
  auto store = std::make_unique<KVServerStore>(*runtime);
  runtime->SetWaitReporter([&store] { return store->StalledWaits(); });
  // A request the store cannot handle for a reason of its own (not the requester's mistake,
  // which it answers), or a dead server's keys it cannot take over (out of memory), leaves it
  // in an unknown state: the exception reaches the runtime (Runtime::FailOn), which stops the
  // server and tells the scheduler why, so the job ends naming it at once.
  runtime->SetPeerHandler(
      [&store](const NodeInfo& peer, Runtime::PeerEvent event) { store->OnPeer(peer, event); });
  runtime->SetRequestHandler([&store](Message&& msg) { store->OnRequest(std::move(msg)); });
  const std::string failure = runtime->WaitForTermination();
  // A receive thread held in a call the file system never answers: joining it would wait for
  // ever, and nothing it owns can be released safely meanwhile. When the node gave up on it,
  // the scheduler was told: the process goes once it ended the job with that news (not with
  // this process's exit).
  if (runtime->receive_thread_stuck() || !runtime->AwaitSlowWorkEnd(config.heartbeat_timeout)) {
    LOG(ERROR) << "server " << rank
               << ": its receive thread is held in a slow call; exiting without it";
    if (runtime->receive_thread_stuck()) runtime->AwaitSchedulerGone(config.heartbeat_timeout);
    internal::FlushStderrLog();  // _Exit runs no atexit handler
    std::fflush(nullptr);
    std::_Exit(1);
  }
  runtime.reset();  // joins the receive thread before the store goes
  if (!failure.empty()) {
    // The store's own failures name this server already; the runtime's do not.
    const std::string self = "server " + std::to_string(rank);
    const bool named = failure.starts_with(self + ":") || failure.starts_with(self + " ");
    // The process's last word, as every role's fatal error is: "ps-server: error: ...".
    internal::FlushStderrLog();
    std::cerr << "ps-server: error: " << (named ? failure : self + ": " + failure) << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace ps
