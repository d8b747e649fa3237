#pragma once
// RequestTracker: matches responses to outstanding requests by timestamp. A request waits for
// one response from each of a set of peers; it completes once all have answered, or fails at
// the first error response, when one of its peers dies, at its deadline, or at shutdown.
//
// Threads: every method may be called from any thread. Callbacks run outside the lock, on the
// thread that completed the request (usually the receive thread): keep them short.
//
// Storage: each outstanding request holds a slot; its timestamp is the slot's index plus the
// slot's use count (so a late answer to an earlier use of the slot is recognized as stale). A
// freed slot keeps the memory of its peer list and response list for the next request, so a
// steady stream of requests allocates nothing here; slots are added only when more requests
// are outstanding at once than ever before.
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ps/message.h"
#include "ps/mutex.h"
#include "ps/thread_annotations.h"

namespace ps {

struct RequestResult {
  std::string error;               // empty: success
  std::vector<Message> responses;  // in arrival order; partial on error
  // The peer whose death failed the request (RequestTracker::FailPeer with `died`), or whose
  // connection was reset while it was in flight (FailReset: `peer_reset`), else kNoNode: a
  // caller that can send the request again knows that it may not have arrived, or its answer
  // not come back, and where not to send it again after a death.
  int lost_peer = kNoNode;
  bool peer_reset = false;
  ErrorKind error_kind = ErrorKind::kOther;  // what `error` reports, as its sender said
  bool ok() const { return error.empty(); }
  // Failed because `lost_peer` died (not a reset: the peer lives and may answer again).
  bool peer_died() const { return lost_peer != kNoNode && !peer_reset; }
};

class RequestTracker {
 public:
  using Clock = std::chrono::steady_clock;
  // Gets the result as an rvalue: it may move from it (the tracker clears it afterwards).
  using Callback = std::function<void(RequestResult&&)>;

  RequestTracker();
  ~RequestTracker();
  RequestTracker(const RequestTracker&) = delete;
  RequestTracker& operator=(const RequestTracker&) = delete;

  // Registers a request awaiting one response from each of `peers` and returns its timestamp
  // (never 0; 0 when the request completed at once: no peers, or after FailAll).
  // `deadline`: fail with a timeout error if not complete by then.
  std::uint64_t Start(std::span<const int> peers, Callback callback,
                      std::optional<Clock::time_point> deadline = std::nullopt);
  std::uint64_t Start(std::initializer_list<int> peers, Callback callback,
                      std::optional<Clock::time_point> deadline = std::nullopt) {
    return Start(std::span<const int>(peers.begin(), peers.size()), std::move(callback), deadline);
  }

  // A response (or error) from msg.meta.sender for msg.meta.timestamp. Unknown timestamps
  // (late answers to failed requests) are ignored; returns false for them. A taken response
  // leaves `msg` holding an emptied earlier response, whose lists' memory the caller (the
  // receive loop) reuses for the next message.
  bool OnResponse(Message&& msg);

  // Fails every request still waiting on `node` with `why`; `died`: because the node died
  // (RequestResult::lost_peer).
  void FailPeer(int node, const std::string& why, bool died = false);
  // Fails every request still waiting on `node` with `why`, because a connection between the
  // two was reset while it was in flight (RequestResult::lost_peer and peer_reset).
  void FailReset(int node, const std::string& why);
  // Fails every outstanding request with `why`, and every later Start() at once.
  void FailAll(const std::string& why);
  // Fails the requests whose deadline is past.
  void ExpireOverdue(Clock::time_point now);

  std::size_t outstanding() const;

 private:
  enum class SlotState { kFree, kWaiting, kCompleting };
  struct Slot {
    SlotState state = SlotState::kFree;
    std::uint32_t index = 0;      // in slots_
    std::uint32_t uses = 0;       // the high half of its timestamps; never 0
    std::vector<int> waiting_on;  // peers that have not answered yet
    RequestResult result;
    std::vector<Message> spare;  // emptied responses of earlier uses, handed back on receive
    Callback callback;
    std::optional<Clock::time_point> deadline;
  };

  // The waiting slot of `timestamp`, or null.
  Slot* Find(std::uint64_t timestamp) PS_REQUIRES(mu_);
  // Marks `slot` completing with `error` (unless empty); its callback runs in Finish.
  void Complete(Slot& slot, const std::string& error) PS_REQUIRES(mu_);
  // Runs a completing slot's callback (without mu_), then frees the slot.
  void Finish(Slot& slot) PS_EXCLUDES(mu_);
  // FailPeer and FailReset: fails every request waiting on `node`.
  void FailWaitingOn(int node, const std::string& why, int lost_peer, bool peer_reset);
  // Fails, then finishes, every waiting slot `matches` selects.
  void FailWhere(const std::function<bool(const Slot&)>& matches,
                 const std::function<std::string(const Slot&)>& why, int lost_peer = kNoNode,
                 bool peer_reset = false);

  mutable Mutex mu_;
  // Slots are heap objects so that a completing callback's reference survives slots_ growing.
  std::vector<std::unique_ptr<Slot>> slots_ PS_GUARDED_BY(mu_);
  std::vector<std::uint32_t> free_ PS_GUARDED_BY(mu_);    // indices of free slots
  std::size_t waiting_ PS_GUARDED_BY(mu_) = 0;            // slots in kWaiting
  std::optional<std::string> closed_ PS_GUARDED_BY(mu_);  // set by FailAll
};

}  // namespace ps
