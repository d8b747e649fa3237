// The server's part in finding dist_sync workers that wait for each other
// (scheduler/src/deadlock_watch.h): which workers stall, and what their requests wait for.
#include <algorithm>
#include <utility>

#include "kvstore/server/kv_server.h"

namespace ps {

void KVServerStore::HandleStalled(const Meta& meta, const kv::Request& request) {
  const NodeInfo* node = PeerOf(meta.sender);
  if (node == nullptr || node->role != Role::kWorker || request.stall == 0) {
    runtime_.ReplyError(meta, "server " + std::to_string(runtime_.rank()) +
                                  ": a Stalled request comes from a worker, with a stall number");
    return;
  }
  // A worker that has not heard of every server death or join this server knows of may still
  // send pushes here again (after the death) that were meant for the dead server: its stall
  // does not say that all its pushes are in. It reports again once it heard.
  // A wait for more keys than one notice lists comes in several with the same number: they
  // add up, as do the reports of threads that share a number. No keys: every key.
  if (request.membership == membership_) {
    Stall& stall = stalled_[meta.sender];
    if (stall.number != request.stall) stall = Stall{request.stall, false, {}};
    stall.every_key = stall.every_key || request.slices.empty();
    for (const kv::SliceRef& ref : request.slices) stall.keys.insert(ref.key);
  }
  runtime_.Reply(meta, Message{});
}

std::vector<WaitEdge> KVServerStore::StalledWaits() const {
  if (stalled_.size() < 2) return {};
  // One edge per (waiter, awaited) pair, the first round found, and at most
  // kMaxEdgesPerWaiter per waiter: fewer edges can hide a deadlock, never make one up.
  constexpr std::size_t kMaxEdgesPerWaiter = 16;
  std::map<std::pair<int, int>, WaitEdge> edges;
  std::map<int, std::size_t> per_waiter;
  const auto add = [&](const Slice& slice, int waiter) {
    const auto waiting = stalled_.find(waiter);
    if (waiting == stalled_.end() ||
        !(waiting->second.every_key || waiting->second.keys.contains(slice.key))) {
      return;
    }
    // Every later round closes after the open one, which waits for each worker not in it.
    for (const auto& [awaited, stall] : stalled_) {
      if (awaited == waiter || per_waiter[waiter] >= kMaxEdgesPerWaiter ||
          edges.contains({waiter, awaited}) ||
          std::find(slice.pushed.begin(), slice.pushed.end(), awaited) != slice.pushed.end()) {
        continue;
      }
      ++per_waiter[waiter];
      edges.emplace(std::pair{waiter, awaited},
                    WaitEdge{waiter, waiting->second.number, awaited, stall.number,
                             "round " + std::to_string(slice.completed + 1) + " of key " +
                                 std::to_string(slice.key)});
    }
  };
  for (const auto& [id, slice] : slices_) {
    // Only an open round that waits for pushes: one on its way to the replica has them all.
    if (!Serves(slice) || slice.round_in_flight) continue;
    for (const RoundWaiter& entry : slice.waiters) {
      if (entry.waiter.pending != nullptr) add(slice, entry.waiter.pending->request.sender);
    }
    for (const DeferredPush& push : slice.deferred) {
      if (push.waiter.pending != nullptr) add(slice, push.sender);
    }
  }
  std::vector<WaitEdge> report;
  report.reserve(edges.size());
  for (auto& [pair, edge] : edges) report.push_back(std::move(edge));
  return report;
}

}  // namespace ps
