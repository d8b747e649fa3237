#include "scheduler/src/deadlock_watch.h"

#include <algorithm>
#include <iterator>

#include "ps/src/log_text.h"

namespace ps {
namespace {

// "worker 0 (...) waits for round 1 of key 0, which worker 1 (...) has not pushed; ..."
std::string DescribeWaits(const std::map<int, WaitEdge>& deadlock,
                          std::span<const NodeInfo> nodes) {
  const auto describe = [nodes](int id) {
    return id >= 0 && static_cast<std::size_t>(id) < nodes.size() ? nodes[id].Describe()
                                                                  : "node " + std::to_string(id);
  };
  std::string text;
  for (const auto& [waiter, edge] : deadlock) {
    if (!text.empty()) text += "; ";
    text += describe(waiter) + " waits for " + edge.what + ", which " + describe(edge.awaited) +
            (edge.collective ? " has not entered" : " has not pushed");
  }
  return text;
}

constexpr std::string_view kRoundRule =
    "dist_sync closes a round of a key once every worker pushed it, so every worker must push "
    "the same keys, equally often, before it waits";

}  // namespace

std::map<int, WaitEdge> FindDeadlock(std::span<const WaitEdge> edges,
                                     const std::map<int, std::uint64_t>& stalls) {
  const auto current = [&stalls](int worker, std::uint64_t stall) {
    const auto it = stalls.find(worker);
    return it != stalls.end() && it->second == stall && stall != 0;
  };
  std::map<int, std::vector<const WaitEdge*>> waits;  // waiter -> its current edges
  for (const WaitEdge& edge : edges) {
    if (edge.waiter != edge.awaited && current(edge.waiter, edge.waiter_stall) &&
        current(edge.awaited, edge.awaited_stall)) {
      waits[edge.waiter].push_back(&edge);
    }
  }
  // The largest set of waiters each of which waits for another of the set: start from all,
  // drop any that waits for none of the rest, until none drops. Bounded: each pass drops one
  // or ends.
  std::set<int> stuck;
  for (const auto& [waiter, unused] : waits) stuck.insert(waiter);
  const auto edge_into_stuck = [&](int waiter) -> const WaitEdge* {
    for (const WaitEdge* edge : waits[waiter]) {
      if (stuck.contains(edge->awaited)) return edge;
    }
    return nullptr;
  };
  for (bool dropped = true; dropped;) {
    dropped = false;
    for (auto it = stuck.begin(); it != stuck.end();) {
      if (edge_into_stuck(*it) == nullptr) {
        it = stuck.erase(it);
        dropped = true;
      } else {
        ++it;
      }
    }
  }
  std::map<int, WaitEdge> deadlock;
  for (const int waiter : stuck) deadlock[waiter] = *edge_into_stuck(waiter);
  return deadlock;
}

std::string DeadlockError(const std::map<int, WaitEdge>& deadlock,
                          std::span<const NodeInfo> nodes) {
  return "the workers wait for each other's pushes and none can go on: " +
         DescribeWaits(deadlock, nodes) +
         ". Each of them waits (WaitAll, Wait, a pull) and pushes nothing until its wait ends: " +
         std::string(kRoundRule);
}

std::string SuspectedDeadlockWarning(const std::map<int, WaitEdge>& deadlock,
                                     std::span<const NodeInfo> nodes,
                                     std::chrono::milliseconds timeout) {
  const std::string outcome = timeout.count() > 0
                                  ? "the job ends once they waited " + FormatSeconds(timeout) +
                                        " (PS_STALL_TIMEOUT) with none of them pushing"
                                  : "with PS_STALL_TIMEOUT=0 the job waits for ever";
  return "the workers may wait for each other's pushes: " + DescribeWaits(deadlock, nodes) +
         ". Some of them push from other threads than the waiting one, and those may still "
         "push: " +
         outcome + ". " + std::string(kRoundRule);
}

std::string SuspectedDeadlockError(const std::map<int, WaitEdge>& deadlock,
                                   std::span<const NodeInfo> nodes,
                                   std::chrono::milliseconds timeout) {
  return "the workers waited " + FormatSeconds(timeout) +
         " (PS_STALL_TIMEOUT) for each other's pushes, and no thread of theirs pushed: " +
         DescribeWaits(deadlock, nodes) + ". " + std::string(kRoundRule) +
         " (raise PS_STALL_TIMEOUT if a thread pushes only after a longer pause; 0 waits for "
         "ever)";
}

void DeadlockWatch::OnStalled(int worker, const wire::StalledNotice& notice,
                              const std::vector<int>& servers, Clock::time_point now) {
  if (notice.stall == 0) return;
  stalls_[worker] = notice.stall;
  if (notice.several_threads) {
    several_threads_.insert(worker);
  } else {
    several_threads_.erase(worker);
  }
  if (probe_ || now - last_probe_ < kProbeGap) {
    again_ = true;  // OnTick or EndProbe starts it
    return;
  }
  StartProbe(servers, now);
}

std::string DeadlockWatch::OnAnswer(const Message& answer, const std::vector<int>& servers,
                                    std::span<const NodeInfo> nodes,
                                    std::span<const VoteWait> votes, Clock::time_point now) {
  const Meta& meta = answer.meta;
  if (!probe_ || meta.request || meta.timestamp != probe_->id ||
      probe_->unanswered.erase(meta.sender) == 0) {
    return "";  // an answer to a probe given up
  }
  if (probe_->confirming) {
    // Still in the stall the servers reported about (a later report of the same wait keeps
    // its number; a new wait has another).
    if (wire::DecodeStallNumber(meta.body).value_or(0) !=
        probe_->deadlock.at(meta.sender).waiter_stall) {
      EndProbe(servers, now);  // its wait ended: it may push again
      return "";
    }
    if (!probe_->unanswered.empty()) return "";
    if (probe_->suspected) return Suspect(servers, nodes, now);
    const std::string error = DeadlockError(probe_->deadlock, nodes);
    probe_.reset();
    return error;
  }
  // A malformed report adds nothing: a deadlock it would have shown stays unfound, never one
  // made up.
  if (auto edges = wire::DecodeWaitReport(meta.body)) {
    probe_->edges.insert(probe_->edges.end(), edges->begin(), edges->end());
  }
  if (!probe_->unanswered.empty()) return "";
  // First: a voter's edge to a worker that has not voted names what it waits for (the edges of
  // its pushes, which the servers report too, name what those wait for).
  std::vector<WaitEdge> edges;
  for (const VoteWait& vote : votes) {
    const auto waiter = stalls_.find(vote.waiter);
    const auto awaited = stalls_.find(vote.awaited);
    if (waiter == stalls_.end() || awaited == stalls_.end()) continue;
    WaitEdge edge{vote.waiter, waiter->second, vote.awaited, awaited->second,
                  "the collective " + vote.call};
    edge.collective = true;
    edges.push_back(std::move(edge));
  }
  probe_->edges.insert(probe_->edges.begin(), std::make_move_iterator(edges.begin()),
                       std::make_move_iterator(edges.end()));
  probe_->deadlock = FindDeadlock(probe_->edges, stalls_);
  if (probe_->deadlock.empty()) {
    EndProbe(servers, now);
    return "";
  }
  // stalls_ holds the numbers the edges matched: several_threads_ tells their kind.
  probe_->suspected =
      std::any_of(probe_->deadlock.begin(), probe_->deadlock.end(),
                  [this](const auto& entry) { return several_threads_.contains(entry.first); });
  probe_->confirming = true;
  probe_->id = ++probes_;
  for (const auto& [waiter, edge] : probe_->deadlock) probe_->unanswered.insert(waiter);
  Ask(probe_->unanswered);
  return "";
}

std::string DeadlockWatch::Suspect(const std::vector<int>& servers, std::span<const NodeInfo> nodes,
                                   Clock::time_point now) {
  std::map<int, std::uint64_t> stalls;
  for (const auto& [waiter, edge] : probe_->deadlock) stalls[waiter] = edge.waiter_stall;
  if (!suspicion_ || suspicion_->stalls != stalls) {
    // Another set of workers, or one that pushed since: the timeout starts again.
    suspicion_ = Suspicion{std::move(stalls), now};
  }
  const auto lasted = now - suspicion_->since;
  const bool timed_out = stall_timeout_.count() > 0 && lasted >= stall_timeout_;
  // Not at first sight: workers that push the keys in other orders, from threads that
  // compute between pushes, wait for each other for a while at every step.
  const auto warn_after = stall_timeout_.count() > 0
                              ? std::min<Clock::duration>(kWarnAfter, stall_timeout_ / 2)
                              : Clock::duration(kWarnAfter);
  if (!suspicion_->warned &&
      (timed_out ||
       (lasted >= warn_after && (!last_warning_ || now - *last_warning_ >= kWarnGap)))) {
    suspicion_->warned = true;
    last_warning_ = now;
    warn_(SuspectedDeadlockWarning(probe_->deadlock, nodes, stall_timeout_));
  }
  if (timed_out) {
    std::string error = SuspectedDeadlockError(probe_->deadlock, nodes, stall_timeout_);
    probe_.reset();
    return error;
  }
  EndProbe(servers, now);
  return "";
}

void DeadlockWatch::Forget(int id, const std::vector<int>& servers, Clock::time_point now) {
  stalls_.erase(id);
  several_threads_.erase(id);
  if (suspicion_ && suspicion_->stalls.contains(id)) suspicion_.reset();
  if (probe_ && probe_->unanswered.contains(id)) EndProbe(servers, now);
}

void DeadlockWatch::OnTick(const std::vector<int>& servers, Clock::time_point now) {
  if (probe_ && now - probe_->started > kProbeTimeout) EndProbe(servers, now);
  if (!probe_ && again_ && now - last_probe_ >= kProbeGap) StartProbe(servers, now);
}

void DeadlockWatch::StartProbe(const std::vector<int>& servers, Clock::time_point now) {
  again_ = false;
  if (servers.empty()) return;
  last_probe_ = now;
  probe_.emplace(++probes_, std::set<int>(servers.begin(), servers.end()), now);
  Ask(probe_->unanswered);
}

void DeadlockWatch::Ask(const std::set<int>& nodes) {
  for (const int id : nodes) {
    Message probe;
    probe.meta.control = Control::kWaitProbe;
    probe.meta.request = true;
    probe.meta.recipient = id;
    probe.meta.timestamp = probe_->id;
    send_(std::move(probe));
  }
}

void DeadlockWatch::EndProbe(const std::vector<int>& servers, Clock::time_point now) {
  probe_.reset();
  if (again_ && now - last_probe_ >= kProbeGap) StartProbe(servers, now);
}

}  // namespace ps
