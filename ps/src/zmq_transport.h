#pragma once
// ZmqTransport: one bound PULL socket that receives, one connected PUSH socket per peer that
// sends. Payload buffers go out as separate frames, zero-copy (the frame holds a reference to
// the Blob's owner until ZeroMQ is done with it), and come in zero-copy (a received Blob owns
// its ZeroMQ frame).
//
// Threads: Send() and Connect() may be called from any thread (a mutex per peer socket);
// Recv() only from the one receive thread. Shutdown() from any thread wakes Recv(). A
// ConnectionMonitor thread bounds the accepted connections and reports send-socket
// connections closing (connection_monitor.h).
//
// Limits (docs/errors.md, "Fault suite"): a frame larger than max_frame_bytes closes its
// connection before ZeroMQ allocates it; accepted connections are capped (ConnectionLimits);
// the process's soft descriptor limit is raised to its hard limit when a transport is made.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <zmq.hpp>

#include "ps/config.h"
#include "ps/message.h"
#include "ps/mutex.h"
#include "ps/src/block_pool.h"
#include "ps/src/connection_monitor.h"
#include "ps/src/curve_keys.h"
#include "ps/src/job_authenticator.h"
#include "ps/src/wire.h"
#include "ps/thread_annotations.h"

namespace ps {

struct TransportOptions {
  int verbose = 0;
  int io_threads = 1;
  // ZMQ_MAXMSGSIZE of the receive socket: ZeroMQ closes the connection of a peer that declares
  // a larger frame, before allocating anything.
  std::int64_t max_frame_bytes = std::int64_t{8} << 30;
  // ZMQ_RCVBUF of the receive socket, so SO_RCVBUF of every TCP connection it accepts (0: the
  // kernel's autotuning; ClusterConfig::tcp_receive_buffer).
  int tcp_receive_buffer = 0;
  // ZMQ_RCVHWM: complete messages that wait for the receive thread, per connection (0: no cap);
  // past it ZeroMQ stops reading that connection until the thread catches up.
  int receive_hwm = 0;
  // The largest header frame Recv() decodes; a larger one is dropped unread, so that a stream of
  // big garbage frames costs the receive thread no parsing.
  std::size_t max_header_bytes = std::size_t{1} << 20;
  // Nodes of the job (scheduler included): the accepted-connection cap is sized from it.
  int job_nodes = 1;
  // ZMQ_LINGER of the send sockets: how long closing one may wait to flush what is queued.
  int linger_ms = 2000;
  // ZMQ_TCP_MAXRT of the send sockets (TCP_USER_TIMEOUT): a TCP connection whose data stays
  // unacknowledged this long is closed (0: the kernel's retransmission limit, about 15 min).
  // A network that silently drops a peer's traffic then shows as a closed connection.
  int unacknowledged_timeout_ms = 0;
  // TCP keepalive of the receive socket's connections, which never send data: probes after
  // this many idle seconds, three of them this far apart, and a connection whose sender is
  // gone is closed (0: off). A sender whose kernel gave up on a broken path (above) sends no
  // reset, and its end would otherwise stay open here for ever.
  int keepalive_s = 0;
  // ZMQ_HANDSHAKE_IVL of the receive socket: a connection that has not completed ZeroMQ's
  // handshake by then is closed (TransportOptionsFor: the heartbeat timeout, within 5-30 s).
  std::chrono::milliseconds handshake_timeout{5000};
  // PS_JOB_SECRET: the password every connection must give ("" : the job has none); and this
  // node's connection key, the user name its send sockets give (job_authenticator.h).
  std::string job_secret;
  std::string connection_key;
  // PS_ENCRYPT: CURVE instead of PLAIN (curve_keys.h). The job's server key pair, from the
  // secret, and this node's own pair, whose public key is its connection key.
  bool encrypt = false;
  CurveKeyPair job_keys;
  CurveKeyPair node_keys;
};

// The options of a `role` node of `config`'s job. The scheduler receives small control
// messages only (kSchedulerMaxFrameBytes); a server or worker, the largest frame its job's key
// layout produces (a whole key below MXNET_KVSTORE_BIGARRAY_BOUND at 8 bytes per element, or a
// PS_CHUNK_BYTES slice) or the node table, whichever is larger.
TransportOptions TransportOptionsFor(const ClusterConfig& config, Role role);
// The ZMQ_HANDSHAKE_IVL a node of `config`'s job gets: PS_HEARTBEAT_TIMEOUT within these.
constexpr std::chrono::milliseconds kMinHandshakeInterval{5000};
constexpr std::chrono::milliseconds kMaxHandshakeInterval{30000};
std::chrono::milliseconds HandshakeTimeoutFor(const ClusterConfig& config);
constexpr std::int64_t kSchedulerMaxFrameBytes = std::int64_t{1} << 20;
constexpr int kSchedulerReceiveHwm = 4;

class ZmqTransport {
 public:
  // Raises this process's soft RLIMIT_NOFILE to its hard limit (once per process in effect)
  // and sizes the connection caps from it; gives threads at least stack_room.h's stack.
  // Throws ps::Error when ZeroMQ cannot start, or a limit is too low for it to run.
  explicit ZmqTransport(const TransportOptions& options);
  ~ZmqTransport();
  ZmqTransport(const ZmqTransport&) = delete;
  ZmqTransport& operator=(const ZmqTransport&) = delete;

  // Binds the receive socket on ip:port (port 0: an ephemeral one) and returns the bound port.
  // Throws ps::Error when the address is in use or not local.
  int Bind(const std::string& ip, int port);

  // Also listens on the abstract-namespace ipc socket "ipc://@<name>" (Linux); returns that
  // endpoint. Same-host peers send through it instead of TCP.
  std::string BindIpc(const std::string& name);

  // Opens (or replaces) the send socket for `node_id`, connected to host:port. Throws
  // ps::Error when the socket cannot be opened (out of descriptors: EMFILE) or connected.
  // Returns whether the peer watcher follows its connection (SetPeerWatcher; false without a
  // watcher, or when ZeroMQ could not set the monitor up).
  // `peer_key` is the peer's connection key ("" for the scheduler): the socket authenticates
  // with the token for that connection alone (job_authenticator.h).
  bool Connect(int node_id, const std::string& host, int port, const std::string& peer_key);
  // The same, to a full ZeroMQ endpoint ("tcp://h:p" or "ipc://@name").
  bool ConnectEndpoint(int node_id, const std::string& endpoint, const std::string& peer_key);
  // The user name a message from the node of key `sender_key` carries when it came on that
  // node's connection to this one (Message::connection_key): its token for this node, or with
  // CURVE its public key, which the handshake proved it holds.
  std::string ExpectedUser(const std::string& sender_key, const std::string& own_key) const;
  // The endpoint the send socket for `node_id` is connected to ("" if none).
  std::string EndpointOf(int node_id) const;
  bool IsConnected(int node_id) const;
  // Closes the send socket for `node_id`; queued messages are still flushed (linger).
  void Disconnect(int node_id);
  // `node_id` is gone for good: closing its send socket, or the transport, drops what is
  // queued for it at once instead of waiting linger_ms to flush it.
  void Abandon(int node_id);

  // Calls `watcher(node_id, connected)` on the monitor thread when the connection of a send
  // socket opened after this call closes (false: the peer's process exited or was killed, or
  // the network reset it) and when it is back (true). The watcher must return promptly and
  // never wait for a thread that may be calling the transport (ZeroMQ's socket monitors wait
  // for the monitor thread): record the news and act on it elsewhere. An empty function stops
  // the calls, waiting for one running: never clear it holding a lock the watcher takes.
  void SetPeerWatcher(std::function<void(int node_id, bool connected)> watcher);

  // What TCP knows of the path to `node_id` over its send socket's connection (link_state.h);
  // nullopt without one (not connected yet, over ipc, or not watched: no peer watcher set).
  std::optional<LinkState> LinkTo(int node_id) const { return monitor_.LinkTo(node_id); }
  // Whether `node_id` refused this node's connection for its credentials (the job secret).
  bool RefusedCredentials(int node_id) const { return monitor_.RefusedCredentials(node_id); }

  // "" while this process can open the descriptors a connection to one more node takes (a
  // send socket, its connection, a monitor's two sockets), with as many again to spare for a
  // reply; else what it holds of its limit and the fix, for a refusal: "this process has 1020
  // of the 1024 descriptors ...".
  std::string DescriptorShortage() const;

  // Sends `msg` to msg.meta.recipient. False when there is no socket for it or the transport
  // is shut down. Never blocks on a slow peer (unbounded queue).
  bool Send(const Message& msg);

  // Blocks for the next well-formed message and stores it in `msg`, whose lists keep their
  // memory (a caller that reuses one Message allocates nothing here per message); malformed
  // messages are logged, counted and dropped. False once Shutdown() was called.
  bool Recv(Message& msg);

  // Stops the transport: Recv() returns false, sends fail. Sockets close with the transport;
  // each waits up to linger_ms to flush what is queued for its peer (Abandon: not at all).
  void Shutdown();
  std::uint64_t dropped_messages() const { return dropped_.load(); }
  // Bytes of the messages sent (handed to ZeroMQ) and received so far, headers included.
  std::uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  std::uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }
  // Accepted connections closed to keep within the connection caps.
  std::uint64_t dropped_connections() const { return monitor_.dropped_connections(); }
  // Connections turned away for a wrong or missing PS_JOB_SECRET, or another PS_ENCRYPT.
  std::uint64_t refused_connections() const {
    return authenticator_.refused() + monitor_.refused_handshakes();
  }
  const ConnectionLimits& connection_limits() const { return monitor_.limits(); }

 private:
  struct Peer {
    // Set up before the peer is published in peers_ (ConnectEndpoint).
    Peer(zmq::socket_t connected, std::string to, std::uint64_t watched)
        : socket(std::move(connected)), endpoint(std::move(to)), watch(watched) {}
    Mutex mu;  // ZeroMQ sockets are not thread-safe
    zmq::socket_t socket PS_GUARDED_BY(mu);
    wire::HeaderEncoder encoder PS_GUARDED_BY(mu);
    const std::string endpoint;
    const std::uint64_t watch;  // its ConnectionMonitor watch (0: none)
  };
  // Ends the connection monitor's watch of a peer taken out of peers_.
  void Unwatch(Peer& peer);
  void Drop(const std::string& why);

  const TransportOptions options_;
  const int verbose_;
  // ZMQ_AFFINITY masks: with two or more I/O threads, the first serves the receive socket
  // and the others the send sockets, so incoming and outgoing bytes never share a thread.
  const std::uint64_t receive_affinity_;
  const std::uint64_t send_affinity_;
  // The connection caps, from the descriptor limit: before the context, which a limit too low
  // for ZeroMQ to run refuses at start instead of letting it abort.
  const ConnectionLimits limits_;
  zmq::context_t context_;
  // After the context, so that their sockets close before the context ends.
  JobAuthenticator authenticator_;
  ConnectionMonitor monitor_;
  zmq::socket_t receiver_;  // receive thread only, after Bind()
  // Receive thread only: reused for every message, so receiving allocates nothing once warm.
  std::vector<zmq::message_t> frames_;
  std::vector<std::size_t> frame_sizes_;
  wire::HeaderDecoder decoder_;
  wire::DecodedHeader decoded_;
  // Pools (thread-safe; blocks come back from whichever thread drops the last reference):
  // each received data frame's holder (shared_ptr control block and frame), and what each
  // zero-copy frame sent holds until ZeroMQ releases it.
  const std::shared_ptr<BlockPool> frame_holders_ = std::make_shared<BlockPool>();
  const std::shared_ptr<BlockPool> frame_owners_ = std::make_shared<BlockPool>();
  mutable SharedMutex peers_mu_;
  std::map<int, std::unique_ptr<Peer>> peers_ PS_GUARDED_BY(peers_mu_);
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_received_{0};
  std::atomic<bool> shut_down_{false};
};

}  // namespace ps
