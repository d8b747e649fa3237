#pragma once
// Where a key range is served while servers die and others take their place
// (PS_REPLICATION). Every range has a home, the server rank the key layout (key_layout.h) puts
// it on, and an owner, its primary: at first its home. A range's replica is the next live
// server after its owner in rank order (wrapping around), so when an owner dies its ranges move
// to that next live server, which already holds their copies. With server weights
// (PS_SERVER_WEIGHTS) it is the next live server of a weight at least its owner's, if any: a
// light server (a host with a slow link) keeps no copies of a heavier one's ranges, and never
// inherits them while a heavier server lives.
//
// A server started later takes a dead server's rank (it "rejoins" it): it becomes live again
// in the ring, so the live server before it now sends its copies to it, but it owns nothing
// (the ranges of its rank stay with the server that took them over). It owns ranges only once
// the server before it dies. Workers and servers apply the same deaths and joins in the order
// the scheduler reported them, so they agree on every owner and replica.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ps {

class ServerRing {
 public:
  // `replicated`: ranges have a replica (ClusterConfig::replicated()). `weights`: empty, or
  // one per rank (ClusterConfig::server_weights).
  ServerRing(int num_servers, bool replicated, std::vector<std::uint32_t> weights = {})
      : dead_(static_cast<std::size_t>(num_servers), false),
        rejoined_(static_cast<std::size_t>(num_servers), false),
        weights_(std::move(weights)),
        replicated_(replicated) {
    for (int rank = 0; rank < num_servers; ++rank) owner_.push_back(rank);
    if (weights_.size() != dead_.size()) weights_.clear();
  }

  void MarkDead(int rank) {
    if (!InRange(rank) || dead(rank)) return;
    const int heir = NextHolder(rank);  // its replica, which holds the copies; -1: none left
    dead_[static_cast<std::size_t>(rank)] = true;
    for (int& owner : owner_) {
      if (owner == rank) owner = heir;
    }
  }
  // A server took `rank`'s place: live again, owning nothing yet.
  void MarkJoined(int rank) {
    if (!InRange(rank) || !dead(rank)) return;
    dead_[static_cast<std::size_t>(rank)] = false;
    rejoined_[static_cast<std::size_t>(rank)] = true;
  }
  bool dead(int rank) const { return dead_.at(static_cast<std::size_t>(rank)); }
  // Whether `rank` is served by a server started later than the job (a rejoined rank).
  bool rejoined(int rank) const { return rejoined_.at(static_cast<std::size_t>(rank)); }
  int num_servers() const { return static_cast<int>(dead_.size()); }

  // The primary of the range whose home is `home`; -1 once every server died.
  int Primary(int home) const { return owner_.at(static_cast<std::size_t>(home)); }
  // The replica of the ranges `primary` serves; -1 without replication or when the primary is
  // the only live server.
  int ReplicaOf(int primary) const {
    if (!replicated_ || primary < 0) return -1;
    return NextHolder(primary);
  }
  int Replica(int home) const { return ReplicaOf(Primary(home)); }

 private:
  bool InRange(int rank) const { return rank >= 0 && rank < num_servers(); }
  // The live server after `rank` (wrapping around, never `rank` itself) of a weight at least
  // its, else the first live one after it; -1 when none lives.
  int NextHolder(int rank) const {
    const int n = num_servers();
    int first_live = -1;
    for (int step = 1; step < n; ++step) {
      const int r = (rank + step) % n;
      if (dead(r)) continue;
      if (first_live < 0) first_live = r;
      if (weights_.empty() ||
          weights_[static_cast<std::size_t>(r)] >= weights_[static_cast<std::size_t>(rank)]) {
        return r;
      }
    }
    return first_live;
  }

  std::vector<bool> dead_;              // per server rank
  std::vector<bool> rejoined_;          // per server rank
  std::vector<std::uint32_t> weights_;  // per server rank; empty: alike
  std::vector<int> owner_;              // per home rank: its primary (-1: none left)
  bool replicated_;
};

}  // namespace ps
