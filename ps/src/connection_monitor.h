#pragma once
// ConnectionMonitor: one thread per transport that reads ZeroMQ's socket-monitor events and
// does what ZeroMQ leaves to its user.
//
// The receive socket: ZeroMQ accepts every TCP or ipc connection offered and keeps it until the
// peer closes it, so a few thousand idle connections exhaust the process's descriptors, and
// ZeroMQ then aborts (an ipc accept asserts on EMFILE) or our own next socket fails. The monitor
// keeps a table of the accepted connections (from ZMQ_EVENT_ACCEPTED / DISCONNECTED, which carry
// the descriptor) and drops, with shutdown(2), connections beyond two caps:
//   - max_pending: connections still in the ZMTP handshake. Handshake events carry no
//     descriptor, so this count is an estimate (accepted minus handshakes ended, never more than
//     the connections younger than the handshake interval), an upper bound of the true one.
//   - max_open: every accepted connection, sized to leave a reserve of descriptors.
// The connection dropped is the oldest one that has not sent a full ZMTP greeting for
// kIdleGrace (no ZeroMQ peer is that slow to greet; TCP only, from TCP_INFO's byte count), so
// idle connections never keep a peer of the job out; else the newest, if it has not greeted
// either (it carried no message: a peer of the job just reconnects) or the total cap is
// reached. shutdown(), never close(): the descriptor is ZeroMQ's, which sees the end of the
// stream and closes it itself (ZMQ_EVENT_DISCONNECTED). The descriptor's inode is compared
// first, so a number ZeroMQ already reused is left alone.
//
// Send sockets: with a watcher set, WatchPeer() follows a send socket's connection to a node
// and reports when it closes (ZMQ_EVENT_DISCONNECTED: the peer process exited or was killed,
// its kernel closed the socket) and when a new one completes its handshake. It also keeps the
// descriptor of that connection (ZMQ_EVENT_CONNECTED carries it), so that LinkTo() can read
// what TCP knows of the path to the node (link_state.h).
//
// Threads: the monitor thread (the *OnMonitorThread methods) owns the PAIR sockets that read
// the events and the table of accepted connections. The public methods may be called from any
// thread; the watcher runs on the monitor thread with no lock of the transport held. ZeroMQ
// blocks a thread that reports an event while the event queue (about 2000) is full, and
// zmq_socket_monitor waits for such a thread: so the monitor thread waits for nothing but its
// own short hand-over lock and the watcher, which must not wait for a thread that calls the
// transport.
// Destruction stops and joins the thread; it must happen before the ZeroMQ context ends.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "ps/mutex.h"
#include "ps/src/link_state.h"
#include "ps/src/wake_fd.h"
#include "ps/thread_annotations.h"

namespace ps {

struct ConnectionLimits {
  std::size_t max_open = 1024;   // accepted connections open at once
  std::size_t max_pending = 32;  // of those, still in the ZMTP handshake (estimated)
  // ZMQ_HANDSHAKE_IVL of the receive socket: ZeroMQ closes a connection that has not completed
  // the handshake by then, so no connection stays pending longer.
  std::chrono::milliseconds handshake{5000};
};

class ConnectionMonitor {
 public:
  using PeerWatcher = std::function<void(int node_id, bool connected)>;

  ConnectionMonitor(zmq::context_t& context, int verbose, const ConnectionLimits& limits);
  ~ConnectionMonitor();
  ConnectionMonitor(const ConnectionMonitor&) = delete;
  ConnectionMonitor& operator=(const ConnectionMonitor&) = delete;

  // Reads the receive socket's connection events from now on. Call once, on the thread that
  // owns `receiver`, before it binds. False (logged) when ZeroMQ cannot set the monitor up.
  bool WatchReceiver(zmq::socket_t& receiver);
  // Follows send socket `socket`'s connection to `node_id`; returns a watch id for Unwatch
  // (0: not watched: no watcher is set, or ZeroMQ could not set the monitor up). Call before
  // the socket connects, on the thread that owns it.
  std::uint64_t WatchPeer(int node_id, zmq::socket_t& socket);
  // Stops following a watch (0 is ignored): detaches the monitor from `socket` first, which
  // must be the watched socket, still open and owned by the calling thread. ZeroMQ would
  // otherwise block the thread that reports the socket's next event (while it flushes, say)
  // for want of a reader.
  void Unwatch(std::uint64_t watch, zmq::socket_t& socket);
  // Sets (or, with an empty function, clears) the watcher of send-socket connections. Waits
  // for a call in progress to return: never call it holding a lock the watcher takes.
  void SetPeerWatcher(PeerWatcher watcher);

  // What TCP knows of the path to `node_id`, from the watched send socket's connection to it;
  // nullopt when there is none (not watched, not connected, or over ipc). Any thread.
  std::optional<LinkState> LinkTo(int node_id) const;
  // Whether `node_id` turned the watched send socket's handshake away for its credentials (a
  // PLAIN password that is not its job's secret). Any thread.
  bool RefusedCredentials(int node_id) const;

  // Connections dropped so far to keep within the limits.
  std::uint64_t dropped_connections() const { return dropped_.load(); }
  // Accepted connections whose security handshake failed because the peer speaks another
  // mechanism (PLAIN against CURVE: the nodes disagree on PS_ENCRYPT) or its CURVE keys are
  // not this job's (another PS_JOB_SECRET). (A wrong PLAIN secret is the authenticator's
  // refusal, not counted here; other protocol errors are logged, not counted.)
  std::uint64_t refused_handshakes() const { return refused_handshakes_.load(); }
  const ConnectionLimits& limits() const { return limits_; }

 private:
  using Clock = std::chrono::steady_clock;
  // An accepted connection of the receive socket.
  struct Accepted {
    ino_t inode = 0;  // of its socket: tells a reused descriptor number apart
    Clock::time_point at;
    std::string peer;       // "1.2.3.4:5678", or "a local (ipc) peer"
    bool dropping = false;  // shut down by us; ZeroMQ's DISCONNECTED removes it
  };
  struct PeerWatch {
    int node_id = 0;
    zmq::socket_t events;
    bool connected = false;
  };
  struct Event {
    std::uint16_t type = 0;
    std::uint32_t value = 0;  // a descriptor, an errno, or unused, by type
    std::string address;      // the endpoint: the listener's for accepted connections
  };
  struct Notice {
    int node_id;
    bool connected;
  };
  // A watched send socket's open TCP connection.
  struct Link {
    std::uint64_t watch = 0;
    int fd = -1;      // ZeroMQ's: read, never closed or written here
    ino_t inode = 0;  // of its socket: tells a reused descriptor number apart
  };

  // A PAIR socket that receives `socket`'s events (`mask`); throws zmq::error_t.
  zmq::socket_t OpenEvents(zmq::socket_t& socket, int mask);
  void Wake();

  void RunOnMonitorThread(std::stop_token stop);
  void AdoptChangesOnMonitorThread();
  static bool ReadEventOnMonitorThread(zmq::socket_t& events, Event& event);
  void OnReceiverEventOnMonitorThread(const Event& event);
  void OnAcceptedOnMonitorThread(int fd, const std::string& endpoint);
  // Drops one connection when the table is over a cap; `newest` is the one just accepted.
  void EnforceLimitsOnMonitorThread(int newest);
  std::size_t PendingEstimateOnMonitorThread(Clock::time_point now) const;
  std::size_t OpenOnMonitorThread() const;  // accepted connections not being dropped
  // The oldest connection that has not greeted for kIdleGrace; -1 when none.
  int OldestIdleOnMonitorThread(Clock::time_point now) const;
  void DropOnMonitorThread(int fd, const std::string& why);
  // Forgets connections whose descriptor no longer holds the socket that was accepted.
  void PruneOnMonitorThread();
  void OnPeerEventOnMonitorThread(std::uint64_t id, PeerWatch& watch, const Event& event,
                                  std::vector<Notice>& notices);
  // Forgets the link of watch `id` to `node_id`, if it is still that watch's.
  void ForgetLink(int node_id, std::uint64_t id);
  void NotifyOnMonitorThread(const std::vector<Notice>& notices);

  zmq::context_t& context_;
  const int verbose_;
  const ConnectionLimits limits_;
  std::atomic<std::uint64_t> next_endpoint_{0};  // numbers the inproc monitor endpoints
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> refused_handshakes_{0};
  std::atomic<std::uint64_t> broken_handshakes_{0};  // other protocol errors
  WakeFd wake_;  // wakes the monitor thread for changes and for stopping

  Mutex mu_;                                                         // guards the hand-over below
  std::vector<zmq::socket_t> new_receiver_ PS_GUARDED_BY(mu_);       // at most one
  std::map<std::uint64_t, PeerWatch> new_peers_ PS_GUARDED_BY(mu_);  // watch id -> its events
  std::vector<std::uint64_t> removed_ PS_GUARDED_BY(mu_);            // watch ids to forget
  std::uint64_t next_watch_ PS_GUARDED_BY(mu_) = 1;
  bool watching_peers_ PS_GUARDED_BY(mu_) = false;  // a watcher is set

  mutable Mutex links_mu_;  // guards links_: written by the monitor thread, read by LinkTo
  std::map<int, Link> links_ PS_GUARDED_BY(links_mu_);          // node id -> its connection
  std::set<int> refused_credentials_ PS_GUARDED_BY(links_mu_);  // RefusedCredentials

  Mutex watcher_mu_;  // held while the watcher runs, so SetPeerWatcher never races a call
  PeerWatcher watcher_ PS_GUARDED_BY(watcher_mu_);

  // Monitor thread only.
  zmq::socket_t receiver_events_;
  std::map<std::uint64_t, PeerWatch> peers_;
  std::unordered_map<int, Accepted> accepted_;  // descriptor -> connection
  std::uint64_t accepted_count_ = 0;            // ACCEPTED events so far
  std::uint64_t handshakes_ended_ = 0;          // HANDSHAKE_SUCCEEDED and _FAILED_* so far
  std::uint64_t accept_failures_ = 0;
  // When the last "could not accept" line was logged: ZeroMQ retries a refused accept at once
  // and for as long as the connection waits (millions a second), so past the first ten the
  // line goes out at most every kAcceptFailureLogEvery (connection_monitor.cc), with the count.
  std::chrono::steady_clock::time_point accept_failure_logged_{};

  // Declared last: started once everything above exists, joined before it goes.
  std::jthread thread_;
};

}  // namespace ps
