// KVServerStore's replication (PS_REPLICATION): the primary's side (updates sent to the
// replica, applied here as they go or once it answers, full copies after a death), the
// replica's side (Replicate requests) and the take-over when a server dies. See kv_server.h.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>

#include "kvstore/server/kv_server.h"
#include "ps/src/internal.h"

namespace ps {
namespace {

// The state a kState op carries besides the value, as bytes: the optimizer's update count
// and buffers, then each worker's dist_async push numbers. Native byte order: both ends are
// servers of one job, built alike.
class StateWriter {
 public:
  void U64(std::uint64_t value) { Bytes(&value, sizeof(value)); }
  void Bytes(const void* data, std::size_t bytes) {
    const auto* begin = static_cast<const char*>(data);
    text_.append(begin, bytes);
  }
  std::string Take() { return std::move(text_); }

 private:
  std::string text_;
};

class StateReader {
 public:
  explicit StateReader(const std::string& text) : text_(text) {}
  bool U64(std::uint64_t* value) { return Bytes(value, sizeof(*value)); }
  bool Bytes(void* out, std::size_t bytes) {
    if (bytes > text_.size() - at_) return false;
    if (bytes == 0) return true;  // `out` may be an empty vector's null data()
    std::memcpy(out, text_.data() + at_, bytes);
    at_ += bytes;
    return true;
  }
  bool done() const { return at_ == text_.size(); }

 private:
  const std::string& text_;
  std::size_t at_ = 0;
};

std::string SliceText(const kv::SliceRef& ref) {
  return "key " + std::to_string(ref.key) + " (slice at " + std::to_string(ref.offset) + ")";
}

}  // namespace

void KVServerStore::SeenPushes::Add(std::uint64_t seq) {
  if (Contains(seq)) return;
  if (seq != next) {
    ahead.insert(seq);
    return;
  }
  ++next;
  while (ahead.erase(next) != 0) ++next;
}

bool KVServerStore::RoutedAhead(const kv::Request& request) const {
  if (ring_.num_servers() < 2) return false;
  // A Replicate from a primary, a Save or Load from worker 0: which slices this server holds
  // or serves depends on the deaths and joins the sender knows of. One that knows fewer is
  // served: a primary's update was meant for this server (what follows goes to its new
  // replica, a full copy first), and worker 0 runs a Save or Load again when a server died.
  if (request.membership > membership_) return true;
  if (request.command == kv::kReplicate) return false;
  const int me = runtime_.rank();
  for (const int home : request.homes) {
    if (home >= ring_.num_servers()) return false;  // Validate refuses it
    if (ring_.Primary(home) != me) return true;
  }
  return false;
}

void KVServerStore::StartForward(Slice& slice, Forward forward) {
  forward.serial = next_forward_++;
  if (slice.replicated_to == kNoNode) {
    ApplyForward(slice, forward);
    return;
  }
  slice.forwards.push_back(std::move(forward));
  SendForward(slice, slice.forwards.back());
}

void KVServerStore::AttachReplicaSlots(const std::vector<SliceId>& ids, int to) {
  if (to == kNoNode || !runtime_.config().use_shm || !runtime_.SameHost(to)) return;
  std::vector<SliceId> wanted;
  std::vector<std::size_t> sizes;
  for (const SliceId& id : ids) {
    const auto it = slices_.find(id);
    // A slice copied again to the replica that maps its slot already keeps that slot.
    if (it == slices_.end() || it->second.replica_slot != nullptr) continue;
    const std::size_t bytes = it->second.value.bytes();
    if (bytes < kShmMinBytes) continue;
    wanted.push_back(id);
    sizes.push_back(bytes);
  }
  if (wanted.empty()) return;
  ShmSlots::NewSegment segment;
  try {
    if (std::string full = SegmentsFull(); !full.empty()) throw Error(full);
    segment = replica_shm_[to].Create(sizes);
  } catch (const Error& e) {
    LOG(WARNING) << "server " << runtime_.rank() << ": updates for " << runtime_.Describe(to)
                 << " travel over the socket, not shared memory: " << e.what();
    return;
  }
  kv::Request request;
  request.command = kv::kShmAttach;
  request.segment_id = segment.id;
  request.segment = segment.descriptor;
  Message msg = kv::RequestMessage(request, to);
  runtime_.Request(std::span<Message>(&msg, 1), [this, segment, wanted = std::move(wanted),
                                                 to](RequestResult&& result) {
    if (!result.ok()) {
      // Only a refusal is answered on the receive thread; other failures leave the segment
      // as it is (this server is going, or the replica died).
      if (result.lost_peer == kNoNode && !runtime_.terminated() && runtime_.failure().empty()) {
        if (const auto slots = replica_shm_.find(to); slots != replica_shm_.end()) {
          slots->second.Abandon(segment);
        }
        LOG(WARNING) << "server " << runtime_.rank() << ": updates for " << runtime_.Describe(to)
                     << " travel over the socket, not shared memory: " << result.error;
      }
      return;
    }
    const auto slots = replica_shm_.find(to);
    if (slots == replica_shm_.end()) return;  // the replica died since
    slots->second.Attached(segment);
    for (std::size_t n = 0; n < wanted.size(); ++n) {
      const auto it = slices_.find(wanted[n]);
      if (it != slices_.end() && it->second.replicated_to == to) {
        it->second.replica_slot = segment.slots[n];
      }
    }
  });
}

void KVServerStore::SendForward(const Slice& slice, Forward& forward) {
  kv::Request request;
  request.command = kv::kReplicate;
  request.slices.push_back(kv::SliceRef{slice.key, slice.offset, slice.total});
  kv::ReplicaOp op{forward.kind, forward.seq, forward.worker, {}};
  Blob frame(nullptr, nullptr, 0, slice.dtype);
  switch (forward.kind) {
    case kv::ReplicaKind::kState:
      // The rounds closed here, the one applied ahead included (it rides on this copy; so do
      // dist_async pushes applied ahead, in the value and the push numbers).
      if (const Forward* ahead = slice.AppliedAhead()) {
        op.seq = slice.completed + (ahead->kind == kv::ReplicaKind::kRound ? 1 : 0);
      } else {
        op.seq = slice.completed;
      }
      op.state = EncodeState(slice);
      frame = slice.value;
      break;
    case kv::ReplicaKind::kRound:
    case kv::ReplicaKind::kAsyncPush:
      frame = forward.gradient.values;
      if (const kv::ShmRef& from = forward.gradient.slot;
          from.owner != kNoNode && from.mirror == slice.replicated_to) {
        // The replica maps the worker's slot that holds the update: it reads it there, no copy.
        // The worker leaves the slot alone until its push is answered, which waits for the
        // replica's answer.
        request.shm.push_back(
            kv::ShmRef{0, from.segment, from.offset, frame.bytes(), from.owner, kNoNode});
        frame = Blob(nullptr, nullptr, 0, slice.dtype);
        break;
      }
      // To a same-host replica through its slot: one copy here instead of two through the
      // kernel and a buffer on the other side.
      if (forward.slot == nullptr && slice.replica_slot != nullptr &&
          slice.replica_slot->bytes() == frame.bytes() && slice.replica_slot->TryAcquire()) {
        forward.slot = slice.replica_slot;
      }
      if (forward.slot != nullptr) {
        CopyInto(forward.slot->data(), frame.data(), frame.bytes(), parallel_);
        request.shm.push_back(
            kv::ShmRef{0, forward.slot->segment(), forward.slot->offset(), frame.bytes()});
        frame = Blob(nullptr, nullptr, 0, slice.dtype);
      }
      break;
    case kv::ReplicaKind::kSkippedRound:
    case kv::ReplicaKind::kForget:
      break;
  }
  request.replica_ops.push_back(std::move(op));
  request.membership = membership_;
  Message msg = kv::RequestMessage(request, slice.replicated_to);
  msg.data.push_back(std::move(frame));
  kv::AttachReplicaStates(request, msg);
  const SentForward sent{
      {slice.key, slice.offset}, forward.serial, slice.copies, slice.replicated_to};
  runtime_.Request(std::span<Message>(&msg, 1), [this, sent](RequestResult&& result) {
    try {
      OnForwardReply(sent, result);
    } catch (const std::exception& e) {  // not from the receive loop
      runtime_.Fail("server " + std::to_string(runtime_.rank()) + " failed: " + e.what());
    }
  });
}

void KVServerStore::OnForwardReply(const SentForward& sent, const RequestResult& result) {
  const SliceId& id = sent.id;
  const int to = sent.to;
  if (!result.ok() && result.lost_peer == kNoNode && !runtime_.terminated() &&
      runtime_.failure().empty()) {
    // An answer on the receive thread: from a replica that was replaced since (a server took
    // a dead one's rank), or to an update sent before the latest copy (which sends it again),
    // its refusal is stale too.
    const auto it = slices_.find(id);
    if (it != slices_.end() && !AboutCurrentCopy(it->second, sent)) return;
    // A refusal that may be about a frame lost with the old connection (a replica without the
    // memory for it): the slice and its updates go again, as after a lack (bounded).
    if (runtime_.ConnectionResetPending(to)) {
      OnReplicaLacks(sent, result.error);
      return;
    }
  }
  if (!result.ok()) {
    // A replica that died is replaced by OnServerDead, which sends the updates again; one
    // whose connection was reset gets them again from OnServerReset. At the end of the job,
    // or when this node failed, the requests still out fail without anyone at fault,
    // possibly on another thread than the receive thread: the store is not touched.
    if (result.lost_peer != kNoNode || runtime_.terminated() || !runtime_.failure().empty()) {
      return;
    }
    // A replica that refuses an update (an answer, on the receive thread) no longer mirrors
    // this server: the job cannot go on with the guarantee it was started with.
    runtime_.Fail("server " + std::to_string(runtime_.rank()) + ": its replica " +
                  runtime_.Describe(to) + " refused an update of key " + std::to_string(id.first) +
                  ": " + result.error);
    return;
  }
  if (!result.responses.empty() && !result.responses.front().meta.body.empty()) {
    OnReplicaLacks(sent, result.responses.front().meta.body);
    return;
  }
  failed_update_ = nullptr;
  const auto it = slices_.find(id);
  if (it == slices_.end()) return;  // dropped since (an Init undone)
  Slice& slice = it->second;
  // Answers from a replica that was replaced, or to updates sent again since, are stale.
  if (slice.replicated_to != to || slice.forwards.empty() ||
      slice.forwards.front().serial != sent.serial) {
    return;
  }
  Forward forward = std::move(slice.forwards.front());
  slice.forwards.pop_front();
  slice.replica_resets = 0;
  // The replica applied an update: what came before held. A copy alone says nothing of that.
  if (forward.updates()) slice.replica_lacks = 0;
  // The replica has read them.
  if (forward.slot != nullptr) forward.slot->Release();
  for (ShmSlot* slot : forward.held_slots) slot->Release();
  const bool applied = ApplyForward(slice, forward);
  // A round that rode on a copy is done with it.
  while (!slice.forwards.empty() && slice.forwards.front().in_copy) {
    Forward counted = std::move(slice.forwards.front());
    slice.forwards.pop_front();
    ApplyForward(slice, counted);
  }
  if (applied) return;
  // The replica applied an update that this server could not (out of memory), and whose
  // workers were told so: it gets the slice as it is here, or a failover would bring the
  // update back. The copy shares the value's buffer: it needs no room for another.
  if (LogOccurrence(++replica_undone_)) {
    LOG(WARNING) << "server " << runtime_.rank() << ": key " << id.first << ": its replica "
                 << runtime_.Describe(to) << " applied an update that this server could not; "
                 << "the slice is copied to it again";
  }
  CopyToReplica(slice, to);
  AttachReplicaSlots({id}, to);
}

void KVServerStore::OnReplicaLacks(const SentForward& sent, const std::string& why) {
  const auto it = slices_.find(sent.id);
  if (it == slices_.end()) return;  // dropped since (an Init undone)
  Slice& slice = it->second;
  // About a replica replaced since, or a state that a copy sent since replaces: stale. (A reset
  // not yet acted on, the likely cause, sends a copy of its own too: that one makes the
  // answers to this copy stale. Waiting for it instead would wait for ever were its notice
  // lost.)
  if (!AboutCurrentCopy(slice, sent)) return;
  const std::string replica = "its replica " + runtime_.Describe(sent.to);
  if (++slice.replica_lacks > kMaxReplicaLacks) {
    runtime_.Fail("server " + std::to_string(runtime_.rank()) + ": " + replica +
                  " lacked what came before an update of key " + std::to_string(sent.id.first) +
                  " " + std::to_string(kMaxReplicaLacks + 1) +
                  " times in a row, a full copy sent after each (last: " + why +
                  "); the copies do not reach it intact: check the network between the two, "
                  "or set PS_REPLICATION=0");
    return;
  }
  if (LogOccurrence(++replica_lacks_)) {
    LOG(WARNING) << "server " << runtime_.rank() << ": " << replica << " lacks what came before "
                 << "an update (" << why << "); the slice is copied to it again";
  }
  CopyToReplica(slice, sent.to);
  AttachReplicaSlots({sent.id}, sent.to);
}

bool KVServerStore::ApplyForward(Slice& slice, Forward& forward) {
  bool applied = true;
  switch (forward.kind) {
    case kv::ReplicaKind::kRound:
    case kv::ReplicaKind::kSkippedRound:
      // Answers the round's pushes (slice.waiters) and this update's waiters, in that order,
      // before the next round starts.
      return CommitRound(slice, forward.applied ? Gradient() : forward.gradient, forward.waiters);
    case kv::ReplicaKind::kAsyncPush:
      if (forward.applied) {
        failed_update_ = nullptr;  // applied when it was sent (ApplyPushesAhead)
      } else {
        ApplyUpdate(slice, forward.gradient);
        slice.seen[forward.worker].Add(forward.seq);
        applied = failed_update_ != &slice;
        // Those it held back go ahead again (out of memory again, its waiters get the error).
        if (applied) ApplyPushesAhead(slice);
      }
      // The value as it is now, later pushes applied ahead of the replica included: waiting
      // for a value the replica holds too would wait for ever under a steady stream of pushes.
      // Were this server to die, those pushes were never answered: their workers send them
      // to the new owner, which applies each once.
      for (const Waiter& waiter : forward.waiters) Resolve(waiter, slice);
      return applied;
    case kv::ReplicaKind::kState:
    case kv::ReplicaKind::kForget:
      break;
  }
  // A round applied ahead is never queued behind another update (CloseRound), but a copy may
  // go in front of it (CopyToReplica): what waits on the copy then waits for the round too.
  for (const Waiter& waiter : forward.waiters) ResolveCurrent(slice, waiter);
  return true;
}

void KVServerStore::CopyToReplica(Slice& slice, int to) {
  // The same replica again (after a reset or a lack) keeps the slots it maps: those of the
  // updates on their way are free again once it answers the copy, which it handles after them.
  // Another replica's slots are never used again (a stopped one might still read them).
  const bool same_replica = to != kNoNode && to == slice.replicated_to;
  slice.replicated_to = to;
  ++slice.copies;
  std::vector<ShmSlot*> held;
  for (Forward& forward : slice.forwards) {
    if (forward.slot != nullptr) held.push_back(forward.slot);
    held.insert(held.end(), forward.held_slots.begin(), forward.held_slots.end());
    forward.slot = nullptr;
    forward.held_slots.clear();
  }
  if (!same_replica) {
    for (ShmSlot* slot : held) slot->Retire();
    held.clear();
    slice.replica_slot = nullptr;
  }
  if (to == kNoNode) {
    // The last server standing: what was on its way to a replica is applied here now.
    while (!slice.forwards.empty()) {
      Forward forward = std::move(slice.forwards.front());
      slice.forwards.pop_front();
      ApplyForward(slice, forward);
    }
    return;
  }
  // The copy goes first, with the value as this server applied it; the updates not yet
  // answered follow in order, answered as they would have been. The copy is queued like them,
  // so that what waits for the replica to hold the slice (an Init sent again) waits for it. A
  // round applied here already is in the copy, which counts it: it is not sent again (were it
  // sent on its own, a reset could lose the copy and deliver it), and it is done with the copy.
  for (Forward& forward : slice.forwards) forward.in_copy = forward.applied;
  Forward copy;
  copy.kind = kv::ReplicaKind::kState;
  copy.serial = next_forward_++;
  copy.held_slots = std::move(held);
  slice.forwards.push_front(std::move(copy));
  for (Forward& forward : slice.forwards) {
    if (!forward.in_copy) SendForward(slice, forward);
  }
}

std::size_t KVServerStore::CopySlicesTo(int to,
                                        const std::function<bool(const Slice&)>& needs_copy) {
  std::vector<SliceId> copied_ids;
  for (auto& [id, slice] : slices_) {
    // Copies this server keeps for another are not its to copy.
    if (!Serves(slice) || !needs_copy(slice)) continue;
    copied_ids.push_back(id);
    CopyToReplica(slice, to);
  }
  AttachReplicaSlots(copied_ids, to);
  return copied_ids.size();
}

void KVServerStore::OnServerDead(const NodeInfo& peer) {
  // Without replication the scheduler ends the job: nothing to take over.
  if (!runtime_.config().replicated() || peer.rank < 0 || peer.rank >= ring_.num_servers()) {
    return;
  }
  ring_.MarkDead(peer.rank);
  ++membership_;
  staged_load_.reset();  // read for the servers as they were: its apply would be refused
  ForgetAnnouncements();
  // Segments the dead server shared with this one (as its replica): mapped until the requests
  // that reference them are done.
  std::erase_if(segments_, [&](const auto& entry) { return entry.first.first == peer.id; });
  FollowRing(peer.rank == runtime_.rank() ? "took the place of dead " + peer.Describe()
                                          : peer.Describe() + " died");
  // This server's segments for it: FollowRing sent every slice that went to it to another
  // replica (or none), which retired their slots, so nothing refers to them. Unmapped here,
  // their memory goes back to the kernel (node ids are never reused).
  if (const auto slots = replica_shm_.find(peer.id); slots != replica_shm_.end()) {
    if (runtime_.config().verbose >= 1) {
      LOG(INFO) << "server " << runtime_.rank() << ": unmaps the shared memory it kept for "
                << peer.Describe();
    }
    replica_shm_.erase(slots);
  }
}

void KVServerStore::OnServerReset(const NodeInfo& peer) {
  if (!runtime_.config().replicated()) return;
  // An update on its way to the replica, or the replica's answer, may be lost: the replica
  // gets the slice again as this server holds it, then the updates not yet applied, in order
  // (what it applied twice meanwhile the copy undoes). Not for ever: a replica that resets the
  // connection at every try (no memory for the frames) ends the job instead of stalling it.
  const auto updates_on_their_way = [&](const Slice& slice) {
    return slice.replicated_to == peer.id && !slice.forwards.empty();
  };
  for (auto& [id, slice] : slices_) {
    if (!updates_on_their_way(slice) || ++slice.replica_resets <= kMaxReplicaResets) continue;
    runtime_.Fail("server " + std::to_string(runtime_.rank()) + ": the connection to its replica " +
                  peer.Describe() + " was reset " + std::to_string(kMaxReplicaResets + 1) +
                  " times while an update of key " + std::to_string(id.first) +
                  " was on its way (a network that loses big packets, such as a link of a "
                  "smaller MTU on the way, or a replica without the memory for its frames drops "
                  "the connection; check the path between the two hosts and the servers' memory, "
                  "or set PS_REPLICATION=0)");
    return;
  }
  const std::size_t copied = CopySlicesTo(peer.id, updates_on_their_way);
  if (copied != 0) {
    LOG(WARNING) << "server " << runtime_.rank() << ": the connection to its replica "
                 << peer.Describe() << " was reset; " << copied
                 << " key slice(s) with updates on their way copied to it again";
  }
}

void KVServerStore::OnServerJoined(const NodeInfo& peer) {
  if (!runtime_.config().replicated() || peer.rank < 0 || peer.rank >= ring_.num_servers()) {
    return;
  }
  ring_.MarkJoined(peer.rank);
  ++membership_;
  staged_load_.reset();  // read for the servers as they were: its apply would be refused
  ForgetAnnouncements();
  const int me = runtime_.rank();
  if (peer.id == runtime_.id()) {  // this server: it serves nothing yet
    ServeHeld();                   // copies that came before this server heard of its own join
    return;
  }
  // Copies kept for a primary whose replica is now the new server: no longer kept up to date.
  for (auto& [id, slice] : slices_) {
    if (!Serves(slice) && ring_.Replica(slice.home) != me) slice.stale = true;
  }
  FollowRing(peer.Describe() + " joined in the place of a dead server");
}

std::string KVServerStore::SettingBody(const kv::Request& call) {
  kv::Request setting;
  setting.command = call.command;
  setting.optimizer = call.optimizer;
  setting.compression = call.compression;
  return kv::EncodeBody(setting);
}

bool KVServerStore::AdoptSettings(const std::string& optimizer_body,
                                  const std::string& compression_body) {
  const auto decode = [](kv::Command command, const std::string& body) {
    Message msg;
    msg.meta.head = command;
    msg.meta.body = body;
    std::string error;
    auto call = kv::DecodeRequest(msg, &error);
    if (!call) throw Error("a malformed setting in a copy: " + error);
    return *call;
  };
  if (!compression_body.empty() && compression_body_.empty()) {
    compression_ = compression::Parse(decode(kv::kSetCompression, compression_body).compression);
    compression_body_ = compression_body;
  }
  if (optimizer_body.empty()) return true;
  if (!optimizer_) {
    optimizer_ = MakeOptimizer(decode(kv::kSetOptimizer, optimizer_body).optimizer, parallel_);
    optimizer_body_ = optimizer_body;
    return true;
  }
  return optimizer_body_ == optimizer_body;
}

void KVServerStore::FollowRing(const std::string& cause) {
  const int me = runtime_.rank();
  const int replica = ring_.ReplicaOf(me);
  replica_node_ = replica >= 0 ? runtime_.ServerId(replica) : kNoNode;
  // A copy that fell behind, which this server would serve now: the live copy died with the
  // servers that held it. Dropped, so that requests for it fail naming it lost.
  std::size_t lost = 0;
  std::erase_if(slices_, [&](const auto& entry) {
    const bool drop = entry.second.stale && Serves(entry.second);
    if (drop && LogOccurrence(++lost)) {
      LOG(ERROR) << "server " << me << ": key " << entry.first.first << " (slice at "
                 << entry.first.second << ") is lost: the servers that kept it up to date died "
                 << "before it was copied again";
    }
    return drop;
  });
  // A range this server takes over from the dead primary (it held the copy, so nothing is on
  // its way yet), or one whose replica died or gave way to a server that joined: either way
  // the replica needs a full copy.
  const std::size_t copied = CopySlicesTo(
      replica_node_, [&](const Slice& slice) { return slice.replicated_to != replica_node_; });
  LOG(WARNING) << "server " << me << ": " << cause << "; "
               << (replica_node_ == kNoNode
                       ? std::string("no replica is left for this server's keys")
                       : std::to_string(copied) + " key slice(s) copied to " +
                             runtime_.Describe(replica_node_));
  // Requests that came before this server heard of the change are served now, in order.
  ServeHeld();
}

void KVServerStore::ServeHeld() {
  std::vector<Message> held;
  held.swap(held_);
  for (Message& msg : held) OnRequest(std::move(msg));
}

void KVServerStore::HandleReplicate(const Meta& meta, const kv::Request& request,
                                    std::vector<Blob>& data, const std::vector<ShmTarget>& shm) {
  const std::string server = "server " + std::to_string(runtime_.rank());
  const NodeInfo* node = PeerOf(meta.sender);
  if (node == nullptr || node->role != Role::kServer) {
    runtime_.ReplyError(meta, server + ": only servers replicate key ranges");
    return;
  }
  for (std::size_t i = 0; i < request.slices.size(); ++i) {
    const bool in_shm = !shm.empty() && shm[i].data != nullptr;
    if (in_shm && shm[i].ref.owner != kNoNode && runtime_.config().verbose >= 1 &&
        slot_forwards_seen_.emplace(meta.sender, shm[i].ref.owner).second) {
      LOG(INFO) << server << ": reads the updates " << runtime_.Describe(meta.sender)
                << " forwards from the slots of " << runtime_.Describe(shm[i].ref.owner);
    }
    const ReplicaVerdict verdict =
        ApplyReplicaOp(meta.sender, request.slices[i], request.replica_ops[i], data[i], in_shm);
    if (verdict.why.empty()) continue;
    if (verdict.lacks_state) {  // kv_protocol.h: answered with why, the primary copies again
      if (LogOccurrence(++replica_lacks_)) {
        LOG(WARNING) << server << ": " << verdict.why << "; asks for a full copy";
      }
      Message answer;
      answer.meta.body = server + ": " + verdict.why;
      runtime_.Reply(meta, std::move(answer));
      return;
    }
    LOG(ERROR) << server << ": " << verdict.why;
    runtime_.ReplyError(meta, server + ": " + verdict.why);
    return;
  }
  runtime_.Reply(meta, Message{});
}

KVServerStore::ReplicaVerdict KVServerStore::ApplyReplicaOp(int sender, const kv::SliceRef& ref,
                                                            const kv::ReplicaOp& op,
                                                            const Blob& frame,
                                                            bool in_shared_memory) {
  const SliceId id{ref.key, ref.offset};
  if (op.kind == kv::ReplicaKind::kForget) {
    slices_.erase(id);
    return {};
  }
  if (op.kind == kv::ReplicaKind::kState) {
    // A zero-length key is one empty slice; any other slice holds at least one element.
    if (!IsSummableDType(frame.dtype()) || ref.offset > ref.total ||
        (frame.count() == 0 && ref.total != 0) || frame.count() > ref.total - ref.offset) {
      return {SliceText(ref) + ": a malformed copy from " + runtime_.Describe(sender)};
    }
    auto [it, added] = slices_.try_emplace(id);
    Slice& slice = it->second;
    if (added) slice.state_id = next_state_id_++;
    slice.key = ref.key;
    slice.offset = ref.offset;
    slice.dtype = frame.dtype();
    slice.length = frame.count();
    slice.total = ref.total;
    slice.completed = op.seq;
    slice.value = Blob::Copy(frame.data(), frame.bytes(), frame.dtype());
    if (std::string why = DecodeState(slice, op.state); !why.empty()) {
      slices_.erase(it);
      return {SliceText(ref) + ": " + why};
    }
    // Kept up to date from now on only if this server is its primary's replica as far as it
    // knows (a copy from a primary that has not heard of a join may come too late).
    slice.stale = ring_.Replica(slice.home) != runtime_.rank();
    return {};
  }
  const auto it = slices_.find(id);
  if (it == slices_.end()) {
    return {SliceText(ref) + ": an update from " + runtime_.Describe(sender) +
                " for a slice this replica does not hold",
            true};
  }
  Slice& slice = it->second;
  switch (op.kind) {
    case kv::ReplicaKind::kRound:
    case kv::ReplicaKind::kSkippedRound:
      if (op.seq != slice.completed) {
        return {SliceText(ref) + ": round " + std::to_string(op.seq) + " from " +
                    runtime_.Describe(sender) + ", this replica expects round " +
                    std::to_string(slice.completed),
                true};
      }
      if (op.kind == kv::ReplicaKind::kRound) {
        if (frame.bytes() != slice.value.bytes() || frame.dtype() != slice.dtype) {
          return {SliceText(ref) + ": a round's sum of the wrong size"};
        }
        ApplyUpdate(slice, Gradient{frame, in_shared_memory, kv::ShmRef{}});
      }
      ++slice.completed;
      break;
    case kv::ReplicaKind::kAsyncPush:
      if (frame.bytes() != slice.value.bytes() || frame.dtype() != slice.dtype) {
        return {SliceText(ref) + ": a push of the wrong size"};
      }
      ApplyUpdate(slice, Gradient{frame, in_shared_memory, kv::ShmRef{}});
      slice.seen[op.worker].Add(op.seq);
      break;
    case kv::ReplicaKind::kState:
    case kv::ReplicaKind::kForget:
      break;
  }
  if (failed_update_ == &slice) return {failed_update_error_};
  return {};
}

std::string KVServerStore::EncodeState(const Slice& slice) const {
  StateWriter out;
  out.U64(static_cast<std::uint64_t>(slice.home));
  for (const std::string* body : {&optimizer_body_, &compression_body_}) {
    out.U64(body->size());
    out.Bytes(body->data(), body->size());
  }
  std::optional<Optimizer::SavedState> saved;
  if (optimizer_) saved = optimizer_->ExportState(slice.state_id);
  out.U64(saved ? saved->count : 0);
  out.U64(saved ? saved->buffers.size() : 0);
  if (saved) out.Bytes(saved->buffers.data(), saved->buffers.size() * sizeof(float));
  out.U64(slice.seen.size());
  for (const auto& [worker, seen] : slice.seen) {
    out.U64(static_cast<std::uint64_t>(worker));
    out.U64(seen.next);
    out.U64(seen.ahead.size());
    for (const std::uint64_t seq : seen.ahead) out.U64(seq);
  }
  return out.Take();
}

std::string KVServerStore::DecodeState(Slice& slice, const std::string& state) {
  StateReader in(state);
  std::uint64_t home = 0, count = 0, floats = 0, workers = 0;
  if (!in.U64(&home) || home >= static_cast<std::uint64_t>(ring_.num_servers())) {
    return "a malformed state in a copy";
  }
  std::string settings[2];  // the optimizer's and the compression's kv request bodies
  for (std::string& body : settings) {
    std::uint64_t bytes = 0;
    if (!in.U64(&bytes) || bytes > state.size()) return "a malformed state in a copy";
    body.resize(bytes);
    if (!in.Bytes(body.data(), bytes)) return "a malformed state in a copy";
  }
  if (!in.U64(&count) || !in.U64(&floats) || floats > state.size() / sizeof(float)) {
    return "a malformed state in a copy";
  }
  slice.home = static_cast<int>(home);
  std::vector<float> buffers(floats);
  if (!in.Bytes(buffers.data(), floats * sizeof(float)) || !in.U64(&workers)) {
    return "a malformed state in a copy";
  }
  slice.seen.clear();
  for (std::uint64_t w = 0; w < workers; ++w) {
    std::uint64_t worker = 0, next = 0, ahead = 0;
    if (!in.U64(&worker) || !in.U64(&next) || !in.U64(&ahead) || ahead > state.size()) {
      return "a malformed state in a copy";
    }
    SeenPushes& seen = slice.seen[static_cast<int>(worker)];
    seen.next = next;
    for (std::uint64_t a = 0; a < ahead; ++a) {
      std::uint64_t seq = 0;
      if (!in.U64(&seq)) return "a malformed state in a copy";
      seen.ahead.insert(seq);
    }
  }
  if (!in.done()) return "a malformed state in a copy";
  try {
    // A SetOptimizer on its way gives every server a fresh optimizer state: so not this one.
    if (!AdoptSettings(settings[0], settings[1])) return "";
    if (count == 0 && buffers.empty()) return "";
    if (!optimizer_) return "a copy with optimizer state reached a server without an optimizer";
    optimizer_->ImportState(slice.state_id, {slice.length, count, std::move(buffers)});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace ps
