#include "scheduler/src/deadlock_watch.h"

#include <charconv>

#include "ps/src/wire.h"

namespace ps {
namespace {

// A stall number as a STALLED body or a worker's probe answer carries it; 0 when malformed.
std::uint64_t ParseStall(const std::string& text) {
  std::uint64_t number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  return error == std::errc{} && end == text.data() + text.size() ? number : 0;
}

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
  const auto describe = [nodes](int id) {
    return id >= 0 && static_cast<std::size_t>(id) < nodes.size() ? nodes[id].Describe()
                                                                  : "node " + std::to_string(id);
  };
  std::string text = "the workers wait for each other's pushes and none can go on: ";
  bool first = true;
  for (const auto& [waiter, edge] : deadlock) {
    if (!first) text += "; ";
    first = false;
    text += describe(waiter) + " waits for " + edge.what + ", which " + describe(edge.awaited) +
            " has not pushed";
  }
  return text +
         ". Each of them waits (WaitAll, Wait, a pull) and pushes nothing until its wait "
         "ends: in dist_sync a round of a key closes once every worker pushed it, so every "
         "worker must push the same keys, equally often, before it waits";
}

void DeadlockWatch::OnStalled(int worker, const std::string& body, const std::vector<int>& servers,
                              Clock::time_point now) {
  const std::uint64_t number = ParseStall(body);
  if (number == 0) return;
  stalls_[worker] = number;
  if (probe_ || now - last_probe_ < kProbeGap) {
    again_ = true;  // OnTick or EndProbe starts it
    return;
  }
  StartProbe(servers, now);
}

std::string DeadlockWatch::OnAnswer(const Message& answer, const std::vector<int>& servers,
                                    std::span<const NodeInfo> nodes, Clock::time_point now) {
  const Meta& meta = answer.meta;
  if (!probe_ || meta.request || meta.timestamp != probe_->id ||
      probe_->unanswered.erase(meta.sender) == 0) {
    return "";  // an answer to a probe given up
  }
  if (probe_->confirming) {
    // Still in the stall the servers reported about (a later report of the same wait keeps
    // its number; a new wait has another).
    if (ParseStall(meta.body) != probe_->deadlock.at(meta.sender).waiter_stall) {
      EndProbe(servers, now);  // its wait ended: it may push again
      return "";
    }
    if (!probe_->unanswered.empty()) return "";
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
  probe_->deadlock = FindDeadlock(probe_->edges, stalls_);
  if (probe_->deadlock.empty()) {
    EndProbe(servers, now);
    return "";
  }
  probe_->confirming = true;
  probe_->id = ++probes_;
  for (const auto& [waiter, edge] : probe_->deadlock) probe_->unanswered.insert(waiter);
  Ask(probe_->unanswered);
  return "";
}

void DeadlockWatch::Forget(int id, const std::vector<int>& servers, Clock::time_point now) {
  stalls_.erase(id);
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
