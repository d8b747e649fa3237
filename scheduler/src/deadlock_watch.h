#pragma once
// DeadlockWatch: the scheduler's search for dist_sync workers that wait for each other.
//
// A worker whose pushing thread has waited a while for its rounds tells every live server
// that it stalls (its stall number; the servers then have every push it sent before), then
// the scheduler (STALLED). The scheduler asks every live server which stalled workers' requests
// wait for a round that another stalled worker has not pushed into (WAIT_PROBE, answered with
// WaitEdges), and looks for workers that can never go on (FindDeadlock). It then asks those
// workers whether they still wait in the same stall; when every one does, none of them can
// ever push again, and the job ends naming them.
//
// Why no job ends that could go on: a worker in the set pushes nothing until its wait ends;
// its wait needs a round that another worker of the set has not pushed into, as a server saw
// after that worker stalled, so that push comes only after that worker's own wait ended. The
// first of them to go on would need another to have gone on before it. The confirmation rules
// out reports about a wait that ended before a server reported on it. (A worker reports so
// only while its pushes all came from the waiting thread; another thread's first push ends
// the stall, unless it comes between the worker's confirmation and the end of the job.)
//
// A worker whose pushes come from several threads, or in which several threads wait, cannot
// say that it pushes nothing until its wait ends: another thread may still push. It reports a stall
// whose number changes with each push it sends (StalledNotice::several_threads). A deadlock that
// such a worker is part of is only suspected: once the same workers stayed in the same stalls (none
// pushed) for a while, the scheduler logs a warning naming them, and it ends the job once they did
// for the stall timeout (PS_STALL_TIMEOUT).
//
// Threads: the scheduler calls every method under its lock.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ps/message.h"
#include "ps/src/wire.h"

namespace ps {

// The stalled workers none of which can go on: each waits, per `edges`, for a push of another
// of them. Edges whose stall numbers are not the workers' latest (`stalls`, by node id) are
// stale and ignored. Returns, per such worker, one edge to another of them; empty: none.
std::map<int, WaitEdge> FindDeadlock(std::span<const WaitEdge> edges,
                                     const std::map<int, std::uint64_t>& stalls);
// A worker that waits in a collective's vote for another worker, which has not voted yet: the
// scheduler's own part of the picture, beside the servers' WaitEdges. A worker that votes
// without having announced the collective to the servers (its pushes come from other threads)
// reports a stall of several threads while it waits; with a worker whose wait needs its push,
// that makes a suspected deadlock.
struct VoteWait {
  int waiter = kNoNode;
  int awaited = kNoNode;
  std::string call;  // the collective ("Barrier")
};

// The job's error for FindDeadlock's result; `nodes`: the job's node table, by id.
std::string DeadlockError(const std::map<int, WaitEdge>& deadlock, std::span<const NodeInfo> nodes);
// For a deadlock of workers some of whose pushes come from several threads: the warning once
// it lasted a while (kWarnAfter), and the job's error once it lasted `timeout`
// (PS_STALL_TIMEOUT; 0: never).
std::string SuspectedDeadlockWarning(const std::map<int, WaitEdge>& deadlock,
                                     std::span<const NodeInfo> nodes,
                                     std::chrono::milliseconds timeout);
std::string SuspectedDeadlockError(const std::map<int, WaitEdge>& deadlock,
                                   std::span<const NodeInfo> nodes,
                                   std::chrono::milliseconds timeout);

class DeadlockWatch {
 public:
  using Clock = std::chrono::steady_clock;
  using Send = std::function<void(Message)>;
  using Warn = std::function<void(const std::string&)>;
  // A probe unanswered this long is given up (a node stopped, a message lost with a reset
  // connection); the next stall report starts another.
  static constexpr auto kProbeTimeout = std::chrono::seconds(10);
  // Probes start at most this often: stalls reported meanwhile wait for the next (OnTick).
  static constexpr auto kProbeGap = std::chrono::milliseconds(500);
  // A suspected deadlock is logged once it lasted this long, or half the stall timeout, and
  // at most one every kWarnGap (a job whose threads compute long between pushes may stall so
  // at every step), but always before the job ends for it.
  static constexpr auto kWarnAfter = std::chrono::seconds(10);
  static constexpr auto kWarnGap = std::chrono::seconds(60);
  // `send` sends one probe (the scheduler's Send); `warn` logs a suspected deadlock;
  // `stall_timeout`: how long one may last before the job ends (0: never).
  DeadlockWatch(Send send, Warn warn, std::chrono::milliseconds stall_timeout)
      : send_(std::move(send)), warn_(std::move(warn)), stall_timeout_(stall_timeout) {}

  // Worker `worker` reported a stall. Probes `servers` unless a probe runs; then another
  // follows it.
  void OnStalled(int worker, const wire::StalledNotice& notice, const std::vector<int>& servers,
                 Clock::time_point now);
  // A WAIT_PROBE answer; `votes`: the workers waiting in a vote now. Returns the job's error
  // once every worker of a deadlock confirmed it still waits (a suspected one: for
  // stall_timeout, in the same stalls), else "".
  std::string OnAnswer(const Message& answer, const std::vector<int>& servers,
                       std::span<const NodeInfo> nodes, std::span<const VoteWait> votes,
                       Clock::time_point now);
  // Node `id` died or finished: its stall goes, and a probe that waits for it is given up.
  void Forget(int id, const std::vector<int>& servers, Clock::time_point now);
  // Gives up a probe older than kProbeTimeout; starts one asked for, once kProbeGap passed.
  void OnTick(const std::vector<int>& servers, Clock::time_point now);

 private:
  struct Probe {
    Probe(std::uint64_t number, std::set<int> asked, Clock::time_point at)
        : id(number), unanswered(std::move(asked)), started(at) {}
    std::uint64_t id;          // the WAIT_PROBE requests' timestamp
    bool confirming = false;   // asking the deadlocked workers (else the servers)
    std::set<int> unanswered;  // node ids
    std::vector<WaitEdge> edges;
    std::map<int, WaitEdge> deadlock;  // FindDeadlock's, while confirming
    // A worker of `deadlock` was, by the stall number FindDeadlock matched, in a stall of
    // several threads (decided then: a later report may be of another kind).
    bool suspected = false;
    Clock::time_point started;
  };
  void StartProbe(const std::vector<int>& servers, Clock::time_point now);
  void Ask(const std::set<int>& nodes);
  // The probe is over (or given up): the next starts when a stall came meanwhile.
  void EndProbe(const std::vector<int>& servers, Clock::time_point now);
  // The probe's deadlock was confirmed, and a worker of it may push from another thread.
  std::string Suspect(const std::vector<int>& servers, std::span<const NodeInfo> nodes,
                      Clock::time_point now);

  // A suspected deadlock: its workers' stall numbers, and when it was first confirmed.
  struct Suspicion {
    std::map<int, std::uint64_t> stalls;
    Clock::time_point since;
    bool warned = false;  // warn_ was called
  };

  const Send send_;
  const Warn warn_;
  const std::chrono::milliseconds stall_timeout_;
  std::map<int, std::uint64_t> stalls_;  // worker node id -> its latest stall number
  std::set<int> several_threads_;        // workers whose latest stall is of several threads
  std::optional<Suspicion> suspicion_;
  std::optional<Clock::time_point> last_warning_;
  std::optional<Probe> probe_;
  bool again_ = false;            // a stall was reported while a probe ran, or within kProbeGap
  Clock::time_point last_probe_;  // when the last probe started
  std::uint64_t probes_ = 0;
};

}  // namespace ps
