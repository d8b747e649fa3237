#include "ps/request_tracker.h"

#include <algorithm>

namespace ps {

RequestTracker::RequestTracker() = default;
RequestTracker::~RequestTracker() = default;

RequestTracker::Slot* RequestTracker::Find(std::uint64_t timestamp) {
  const auto index = static_cast<std::uint32_t>(timestamp);
  if (index >= slots_.size()) return nullptr;
  Slot& slot = *slots_[index];
  const bool same_use = slot.uses == static_cast<std::uint32_t>(timestamp >> 32);
  return slot.state == SlotState::kWaiting && same_use ? &slot : nullptr;
}

std::uint64_t RequestTracker::Start(std::span<const int> peers, Callback callback,
                                    std::optional<Clock::time_point> deadline) {
  MutexLock lock(mu_);
  if (closed_ || peers.empty()) {
    RequestResult result{closed_.value_or(""), {}};
    lock.Unlock();
    if (callback) callback(std::move(result));
    return 0;
  }
  if (free_.empty()) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->index = static_cast<std::uint32_t>(slots_.size() - 1);
    free_.reserve(slots_.size());  // Finish never allocates to give a slot back
    free_.push_back(slots_.back()->index);
  }
  Slot& slot = *slots_[free_.back()];
  free_.pop_back();
  if (++slot.uses == 0) slot.uses = 1;  // timestamps are never 0
  slot.state = SlotState::kWaiting;
  slot.waiting_on.assign(peers.begin(), peers.end());
  std::sort(slot.waiting_on.begin(), slot.waiting_on.end());
  slot.waiting_on.erase(std::unique(slot.waiting_on.begin(), slot.waiting_on.end()),
                        slot.waiting_on.end());
  slot.callback = std::move(callback);
  slot.deadline = deadline;
  ++waiting_;
  return (std::uint64_t{slot.uses} << 32) | slot.index;
}

void RequestTracker::Complete(Slot& slot, const std::string& error) {
  if (!error.empty()) slot.result.error = error;
  slot.state = SlotState::kCompleting;
  --waiting_;
}

void RequestTracker::Finish(Slot& slot) {
  // Completing: no other thread touches the slot until it is free again.
  const auto release = [&] {
    slot.callback = nullptr;  // drops what the callback captured, outside the lock
    slot.result.error.clear();
    slot.result.error_kind = ErrorKind::kOther;
    slot.result.lost_peer = kNoNode;
    slot.result.peer_reset = false;
    // The responses, emptied of their frames, go back to the receive loop one by one.
    for (Message& response : slot.result.responses) {
      response.data.clear();
      slot.spare.push_back(std::move(response));
    }
    slot.result.responses.clear();
    MutexLock lock(mu_);
    slot.state = SlotState::kFree;
    free_.push_back(slot.index);
  };
  try {
    if (slot.callback) slot.callback(std::move(slot.result));
  } catch (...) {
    release();
    throw;
  }
  release();
}

bool RequestTracker::OnResponse(Message&& msg) {
  MutexLock lock(mu_);
  Slot* slot = Find(msg.meta.timestamp);
  if (slot == nullptr) return false;
  std::vector<int>& waiting = slot->waiting_on;
  const auto peer = std::find(waiting.begin(), waiting.end(), msg.meta.sender);
  if (peer == waiting.end()) return false;
  waiting.erase(peer);
  const bool failed = msg.meta.control == Control::kError || !msg.meta.error.empty();
  if (failed) {
    slot->result.error = msg.meta.error.empty() ? "request failed" : msg.meta.error;
    slot->result.error_kind = msg.meta.error_kind;
  }
  slot->result.responses.push_back(std::move(msg));
  if (!slot->spare.empty()) {
    msg = std::move(slot->spare.back());
    slot->spare.pop_back();
  }
  if (!failed && !waiting.empty()) return true;
  Complete(*slot, "");
  lock.Unlock();
  Finish(*slot);
  return true;
}

void RequestTracker::FailWhere(const std::function<bool(const Slot&)>& matches,
                               const std::function<std::string(const Slot&)>& why, int lost_peer,
                               bool peer_reset) {
  std::vector<Slot*> failed;
  {
    MutexLock lock(mu_);
    for (const auto& owned : slots_) {
      Slot& slot = *owned;
      if (slot.state != SlotState::kWaiting || !matches(slot)) continue;
      Complete(slot, why(slot));
      slot.result.lost_peer = lost_peer;
      slot.result.peer_reset = peer_reset;
      failed.push_back(&slot);
    }
  }
  for (Slot* slot : failed) Finish(*slot);
}

void RequestTracker::FailPeer(int node, const std::string& why, bool died) {
  FailWaitingOn(node, why, died ? node : kNoNode, false);
}

void RequestTracker::FailReset(int node, const std::string& why) {
  FailWaitingOn(node, why, node, true);
}

void RequestTracker::FailWaitingOn(int node, const std::string& why, int lost_peer,
                                   bool peer_reset) {
  FailWhere(
      [node](const Slot& slot) {
        return std::find(slot.waiting_on.begin(), slot.waiting_on.end(), node) !=
               slot.waiting_on.end();
      },
      [&why](const Slot&) { return why; }, lost_peer, peer_reset);
}

void RequestTracker::FailAll(const std::string& why) {
  {
    MutexLock lock(mu_);
    if (!closed_) closed_ = why;
  }
  FailWhere([](const Slot&) { return true; }, [&why](const Slot&) { return why; });
}

void RequestTracker::ExpireOverdue(Clock::time_point now) {
  FailWhere([now](const Slot& slot) { return slot.deadline && *slot.deadline <= now; },
            [](const Slot& slot) {
              return "request timed out waiting for " + std::to_string(slot.waiting_on.size()) +
                     " response(s)";
            });
}

std::size_t RequestTracker::outstanding() const {
  MutexLock lock(mu_);
  return waiting_;
}

}  // namespace ps
