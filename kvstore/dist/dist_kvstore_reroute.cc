// DistKVStore's view of the server ring after deaths and joins: which server now serves a
// slice, and the re-sending of a request whose server died to the slices' new owners.
#include <map>

#include "kvstore/device_memory.h"
#include "kvstore/dist/dist_kvstore.h"
#include "kvstore/dist/dist_kvstore_common.h"
#include "ps/src/internal.h"

namespace ps {

using dist_detail::kStore;

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
    if (!served && LiveServerRanks().empty()) {
      // The dead server it went to may be one whose death the job survived: not the cause.
      error =
          "no server of the job is left: every one died, the last while this request was "
          "on its way, so no copy of its keys remains (the job cannot go on; start it "
          "again from its last checkpoint)";
    } else if (served) {
      error += "; sent " + std::to_string(again.resets) +
               " times, its connection reset every time (a network that loses big packets, "
               "such as a link of a smaller MTU on the way, or a server that cannot take the "
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
