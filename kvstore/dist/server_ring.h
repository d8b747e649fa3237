#pragma once
// Where a key range is served while servers die (PS_REPLICATION). Every range has a home, the
// server rank the key layout (key_layout.h) puts it on. It is served by its primary, the first
// live server from its home on in rank order (wrapping around), and kept by the primary's
// replica, the next live server after the primary. Workers and servers compute this alike from
// the servers the scheduler reported dead, so a death moves a range to the server that
// already holds its copy.
#include <cstddef>
#include <vector>

namespace ps {

class ServerRing {
 public:
  // `replicated`: ranges have a replica (ClusterConfig::replicated()).
  ServerRing(int num_servers, bool replicated)
      : dead_(static_cast<std::size_t>(num_servers), false), replicated_(replicated) {}

  void MarkDead(int rank) {
    if (rank >= 0 && static_cast<std::size_t>(rank) < dead_.size()) {
      dead_[static_cast<std::size_t>(rank)] = true;
    }
  }
  bool dead(int rank) const { return dead_.at(static_cast<std::size_t>(rank)); }
  int num_servers() const { return static_cast<int>(dead_.size()); }

  // The primary of the range whose home is `home`; -1 when every server is dead.
  int Primary(int home) const { return FirstLiveFrom(home); }
  // The replica of the ranges `primary` serves; -1 without replication or when the primary is
  // the only live server.
  int ReplicaOf(int primary) const {
    if (!replicated_ || primary < 0) return -1;
    const int next = FirstLiveFrom((primary + 1) % num_servers());
    return next == primary ? -1 : next;
  }
  int Replica(int home) const { return ReplicaOf(Primary(home)); }

 private:
  int FirstLiveFrom(int rank) const {
    const int n = num_servers();
    for (int step = 0; step < n; ++step) {
      const int r = (rank + step) % n;
      if (!dead_[static_cast<std::size_t>(r)]) return r;
    }
    return -1;
  }

  std::vector<bool> dead_;  // per server rank
  bool replicated_;
};

}  // namespace ps
