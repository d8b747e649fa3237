#include "ps/src/zmq_transport.h"

#include <glog/logging.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "ps/error.h"
#include "ps/src/glog_or_stderr.h"
#include "ps/src/log_text.h"
#include "ps/src/stack_room.h"

namespace ps {
namespace {

// Frame caps of servers and workers (TransportOptionsFor): the widest element (DTypeSize), and
// room for the header frame (a request's slice list, the node table, a barrier's votes). A
// slice's optimizer state, copied to its replica, is at most two float32 buffers of a float32
// value: twice a PS_CHUNK_BYTES slice, 8 bytes per element of a whole key.
constexpr std::uint64_t kMaxElementBytes = 8;
constexpr std::uint64_t kMaxStateBytesPerValueByte = 2;
constexpr std::uint64_t kHeaderBaseBytes = std::uint64_t{1} << 20;
constexpr std::uint64_t kHeaderBytesPerNode = 1024;
constexpr std::uint64_t kFrameSlackBytes = std::uint64_t{64} << 10;

// Accepted-connection caps (ConnectionLimits). A job's peers need one connection each; the
// spare ones serve reconnections, refused nodes and tools. Never more than the descriptor limit
// allows after the node's own descriptors (ZeroMQ's eventfds and epoll, logs, shared memory:
// kOwnDescriptors), four per peer it sends to (a send socket's mailbox and connection, and a
// monitor's two sockets), and the connections ZeroMQ may accept ahead of the monitor (the
// listen backlog).
constexpr std::size_t kSpareConnections = 32;
constexpr std::size_t kMaxPendingConnections = 32;
constexpr std::size_t kOwnDescriptors = 64;
constexpr std::size_t kDescriptorsPerPeer = 4;
constexpr int kListenBacklog = 64;
// ZMQ_HANDSHAKE_IVL of the receive socket (ZeroMQ's default is 30 s): a connection that has not
// completed the ZMTP handshake by then is closed, and its peer starts over. A peer of the job
// needs about two round trips after connecting (greetings, then PLAIN's or CURVE's four
// commands): on a path of a 2 s round trip, more than 5 s. It gets a heartbeat timeout, the
// job's bound on how slow a live path may be, within these bounds: the short one keeps
// half-open connections from holding handshake slots long (ConnectionLimits::max_pending).
// (kMinHandshakeInterval, kMaxHandshakeInterval: zmq_transport.h.)
// How long closing a send socket may wait to flush queued messages (ZMQ_LINGER). The
// scheduler's last messages matter (a TERMINATE, a refusal) and nobody acknowledges them.
// Everything a server or worker must deliver before it exits is acknowledged before it closes
// (FinishWorker, ReportFailure, barriers, registration), so what is left queued then is for
// peers that no longer wait for it, often because they are gone: a short linger lets it reach
// the kernel without holding up the exit of a job whose peers are gone.
constexpr int kSchedulerLingerMs = 2000;
// The shortest ZMQ_TCP_MAXRT: a few of TCP's retransmission timeouts (200 ms at least, each
// doubling), so that one lost packet never closes a connection, whatever PS_HEARTBEAT_TIMEOUT.
constexpr std::chrono::milliseconds kMinUnacknowledgedTimeout{5000};
constexpr int kNodeLingerMs = 100;
// A received data frame's values are used in place only at this alignment (the largest
// element type's, 8 bytes): else they are copied (Recv).
constexpr std::uintptr_t kFrameAlignment = 8;
// Below this size a payload is copied into the frame: cheaper than reference bookkeeping.
constexpr std::size_t kZeroCopyMinBytes = 512;

// What a zero-copy frame holds until ZeroMQ is done with it: a reference to the Blob's
// owner. Its memory comes from, and goes back to, the transport's pool of such holders.
struct FrameOwner {
  std::shared_ptr<const void> owner;
  std::shared_ptr<BlockPool> pool;  // keeps the pool alive while ZeroMQ holds the frame
};

// ZeroMQ calls this (on one of its I/O threads) once it no longer reads a zero-copy frame:
// drops our reference and returns the holder's memory.
void ReleaseFrameOwner(void* /*data*/, void* hint) {
  auto* holder = static_cast<FrameOwner*>(hint);
  PoolAllocator<FrameOwner> allocator(std::move(holder->pool));
  std::destroy_at(holder);
  allocator.deallocate(holder, 1);
}

zmq::message_t FrameFor(const Blob& blob, const std::shared_ptr<BlockPool>& holders) {
  if (blob.bytes() < kZeroCopyMinBytes || !blob.owner()) {
    return zmq::message_t(blob.data(), blob.bytes());
  }
  PoolAllocator<FrameOwner> allocator(holders);
  FrameOwner* holder = std::construct_at(allocator.allocate(1), FrameOwner{blob.owner(), holders});
  try {
    // const_cast: ZeroMQ's API takes void* but never writes to an outgoing frame.
    return zmq::message_t(const_cast<std::byte*>(blob.data()), blob.bytes(), &ReleaseFrameOwner,
                          holder);  // from here the frame owns the holder
  } catch (...) {
    ReleaseFrameOwner(nullptr, holder);
    throw;
  }
}

int PortOf(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  return colon == std::string::npos ? -1 : std::stoi(endpoint.substr(colon + 1));
}

// Raises the soft descriptor limit to the hard one (a shell's `ulimit -n N` sets both, so this
// helps only where the soft limit was lowered alone, as systemd's 1024 default is) and returns
// the soft limit in force.
std::size_t RaiseDescriptorLimit(int verbose) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      if (verbose >= 1) {
        PS_LOG(INFO) << "raised the descriptor limit (ulimit -n) from " << before << " to "
                     << limit.rlim_max;
      }
    } else {
      limit.rlim_cur = before;  // e.g. a hard limit above the kernel's nr_open
    }
  }
  constexpr auto kMost = static_cast<rlim_t>(std::numeric_limits<int>::max());
  return static_cast<std::size_t>(std::min(limit.rlim_cur, kMost));
}

// Settles the process limits ZeroMQ needs before its context starts threads: stack room for
// them, and descriptors, which size the connection caps.
ConnectionLimits LimitsFor(const TransportOptions& options) {
  internal::EnsureStackRoom(options.verbose);
  const std::size_t descriptors = RaiseDescriptorLimit(options.verbose);
  const auto peers = static_cast<std::size_t>(std::max(options.job_nodes, 1));
  const std::size_t reserve =
      kOwnDescriptors + static_cast<std::size_t>(kListenBacklog) + kDescriptorsPerPeer * peers;
  // ZeroMQ aborts the process when it runs out of descriptors for its own threads or the
  // job's connections: below that, the node does not start.
  if (const std::size_t least = kOwnDescriptors + kDescriptorsPerPeer * peers;
      descriptors < least) {
    throw Error("the descriptor limit (ulimit -n) is " + std::to_string(descriptors) +
                ", below the " + std::to_string(least) + " that a node of a job of " +
                std::to_string(peers) + " nodes needs at the least: raise it to at least " +
                std::to_string(reserve + peers) +
                " (ulimit -n in the shell that starts the node, or LimitNOFILE for a service)");
  }
  const std::size_t room = descriptors > reserve ? descriptors - reserve : 0;
  ConnectionLimits limits;
  // Never below what the job itself needs: a limit too low for the job is the user's to raise
  // (said here, at start), not a reason to turn the job's own peers away.
  limits.max_open = std::min(peers + kSpareConnections, std::max(room, peers));
  if (room < peers) {
    PS_LOG(WARNING) << "the descriptor limit (ulimit -n) is " << descriptors
                    << ", too low for a job of " << peers
                    << " nodes: this node may run out of descriptors; raise it to at least "
                    << reserve + peers << " (the shell or the service manager sets the hard "
                    << "limit, above which this process cannot raise it)";
  }
  limits.max_pending = std::min(kMaxPendingConnections, limits.max_open);
  limits.handshake = options.handshake_timeout;
  return limits;
}

// The message of a ZeroMQ failure to open a socket, with what to do when it is EMFILE.
std::string SocketFailure(const zmq::error_t& e) {
  std::string text = e.what();
  if (e.num() == EMFILE || e.num() == ENFILE) {
    text += " (this process is out of descriptors: raise its limit, ulimit -n)";
  }
  return text;
}

}  // namespace

std::string ZmqTransport::DescriptorShortage() const {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return "";
  const std::size_t needed = 2 * kDescriptorsPerPeer;
  std::size_t open = 0;
  std::error_code error;
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end; !error && it != end;
       it.increment(error)) {
    ++open;
  }
  if (error && error.value() != EMFILE && error.value() != ENFILE) return "";  // no /proc
  if (!error && open + needed <= limit.rlim_cur) return "";
  return "this process has " + (error ? std::string("all") : std::to_string(open)) + " of the " +
         std::to_string(limit.rlim_cur) +
         " descriptors its limit allows open (ulimit -n), and a connection to one more node "
         "takes " +
         std::to_string(kDescriptorsPerPeer) +
         ": raise the limit of the process (ulimit -n, or LimitNOFILE for a service)";
}

std::chrono::milliseconds HandshakeTimeoutFor(const ClusterConfig& config) {
  return std::clamp(config.heartbeat_timeout, kMinHandshakeInterval, kMaxHandshakeInterval);
}

TransportOptions TransportOptionsFor(const ClusterConfig& config, Role role) {
  TransportOptions options;
  options.verbose = config.verbose;
  options.io_threads = config.io_threads;
  options.tcp_receive_buffer = config.tcp_receive_buffer;
  options.job_nodes = config.num_servers + config.num_workers + 1;
  const std::uint64_t header =
      kHeaderBaseBytes + kHeaderBytesPerNode * static_cast<std::uint64_t>(options.job_nodes);
  options.max_header_bytes = static_cast<std::size_t>(header);
  options.linger_ms = role == Role::kScheduler ? kSchedulerLingerMs : kNodeLingerMs;
  // A live peer's kernel acknowledges within a heartbeat timeout, even when its process is
  // slow (a zero window answers the probes; one that stays shut that long is a frozen peer,
  // declared dead anyway). Without heartbeats nobody can tell a broken path from a slow peer.
  if (config.heartbeat_interval.count() > 0) {
    options.unacknowledged_timeout_ms =
        static_cast<int>(std::max(config.heartbeat_timeout, kMinUnacknowledgedTimeout).count());
    options.keepalive_s = static_cast<int>(
        std::max<std::int64_t>(1, (config.heartbeat_timeout.count() + 999) / 1000));
  }
  options.handshake_timeout = HandshakeTimeoutFor(config);
  options.job_secret = config.job_secret;
  options.encrypt = config.encrypt;
  if (config.encrypt) {
    options.job_keys = JobServerKeys(config.job_secret);
    options.node_keys = NewNodeKeys();
    options.connection_key = options.node_keys.public_key;
  } else {
    options.connection_key = NewConnectionKey();
  }
  if (role == Role::kScheduler) {
    options.max_frame_bytes = kSchedulerMaxFrameBytes;
    options.receive_hwm = kSchedulerReceiveHwm;
    return options;
  }
  const std::uint64_t data = std::max<std::uint64_t>(
      kMaxStateBytesPerValueByte * config.chunk_bytes, config.big_array_bound * kMaxElementBytes);
  const std::uint64_t frame = std::max(data, header) + kFrameSlackBytes;
  constexpr auto kMost = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  options.max_frame_bytes = static_cast<std::int64_t>(std::min(frame, kMost));
  return options;
}

ZmqTransport::ZmqTransport(const TransportOptions& options)
    : options_(options),
      verbose_(options.verbose),
      receive_affinity_(options.io_threads > 1 ? 1 : 0),
      send_affinity_(options.io_threads > 1
                         ? ((std::uint64_t{1} << options.io_threads) - 1) & ~std::uint64_t{1}
                         : 0),
      limits_(LimitsFor(options)),
      context_(options.io_threads),
      authenticator_(context_,
                     options.encrypt ? JobAuthenticator::Mechanism::kCurve
                                     : JobAuthenticator::Mechanism::kPlain,
                     options.job_secret, options.verbose),
      monitor_(context_, options.verbose, limits_) {}

ZmqTransport::~ZmqTransport() { Shutdown(); }

int ZmqTransport::Bind(const std::string& ip, int port) {
  try {
    receiver_ = zmq::socket_t(context_, zmq::socket_type::pull);
  } catch (const zmq::error_t& e) {
    throw Error("cannot open the receive socket: " + SocketFailure(e));
  }
  receiver_.set(zmq::sockopt::linger, 0);
  receiver_.set(zmq::sockopt::rcvhwm, options_.receive_hwm);
  receiver_.set(zmq::sockopt::maxmsgsize, options_.max_frame_bytes);
  receiver_.set(zmq::sockopt::affinity, receive_affinity_);
  receiver_.set(zmq::sockopt::handshake_ivl, static_cast<int>(monitor_.limits().handshake.count()));
  receiver_.set(zmq::sockopt::backlog, kListenBacklog);
  if (options_.keepalive_s > 0) {
    receiver_.set(zmq::sockopt::tcp_keepalive, 1);
    receiver_.set(zmq::sockopt::tcp_keepalive_idle, options_.keepalive_s);
    receiver_.set(zmq::sockopt::tcp_keepalive_intvl, options_.keepalive_s);
    receiver_.set(zmq::sockopt::tcp_keepalive_cnt, 3);
  }
  // Set on the listening socket, so every accepted connection starts with it (ZeroMQ applies
  // it to each accepted descriptor); the kernel caps it at net.core.rmem_max.
  if (options_.tcp_receive_buffer > 0) {
    receiver_.set(zmq::sockopt::rcvbuf, options_.tcp_receive_buffer);
  }
  // Every connection authenticates (PLAIN or CURVE, checked by authenticator_) and its
  // messages carry the sender's connection key.
  if (options_.encrypt) {
    receiver_.set(zmq::sockopt::curve_server, 1);
    receiver_.set(zmq::sockopt::curve_secretkey, options_.job_keys.secret_key);
  } else {
    receiver_.set(zmq::sockopt::plain_server, 1);
  }
  receiver_.set(zmq::sockopt::zap_domain, "ps");
  monitor_.WatchReceiver(receiver_);  // before the first connection can arrive
  const std::string endpoint =
      "tcp://" + ip + ":" + (port == 0 ? std::string("*") : std::to_string(port));
  try {
    receiver_.bind(endpoint);
  } catch (const zmq::error_t& e) {
    if (e.num() == EADDRINUSE && port == 0) {
      // Any free port would do: the kernel found none in its ephemeral range.
      throw Error("no free port on " + ip +
                  " to listen on: every port of the kernel's ephemeral range "
                  "(net.ipv4.ip_local_port_range) is taken; end the processes that hold them, or "
                  "widen the range");
    }
    if (e.num() == EADDRINUSE) {
      throw Error("port " + std::to_string(port) + " on " + ip +
                  " is already in use: stop the process holding it or choose another port");
    }
    if (e.num() == EADDRNOTAVAIL) {
      throw Error("cannot listen on " + ip + ": it is not an address of this machine");
    }
    throw Error("cannot listen on " + endpoint + ": " + e.what());
  }
  const int bound = PortOf(receiver_.get(zmq::sockopt::last_endpoint));
  if (verbose_ >= 1) {
    const ConnectionLimits& limits = monitor_.limits();
    PS_LOG(INFO) << "listening on " << ip << ":" << bound << " (frames up to "
                 << options_.max_frame_bytes << " bytes; at most " << limits.max_open
                 << " connections, " << limits.max_pending << " of them in the handshake"
                 << (options_.tcp_receive_buffer > 0
                         ? "; receive buffer " + std::to_string(options_.tcp_receive_buffer) +
                               " bytes per connection"
                         : std::string())
                 << ")";
  }
  return bound;
}

std::string ZmqTransport::BindIpc(const std::string& name) {
  const std::string endpoint = "ipc://@" + name;
  try {
    receiver_.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw Error("cannot listen on " + endpoint + ": " + e.what());
  }
  if (verbose_ >= 1) PS_LOG(INFO) << "listening on " << endpoint;
  return endpoint;
}

bool ZmqTransport::Connect(int node_id, const std::string& host, int port,
                           const std::string& peer_key) {
  return ConnectEndpoint(node_id, "tcp://" + host + ":" + std::to_string(port), peer_key);
}

std::string ZmqTransport::ExpectedUser(const std::string& sender_key,
                                       const std::string& own_key) const {
  return options_.encrypt ? sender_key : ConnectionToken(sender_key, own_key);
}

std::string ZmqTransport::EndpointOf(int node_id) const {
  SharedLock lock(peers_mu_);
  const auto it = peers_.find(node_id);
  return it == peers_.end() ? "" : it->second->endpoint;
}

bool ZmqTransport::ConnectEndpoint(int node_id, const std::string& endpoint,
                                   const std::string& peer_key) {
  // The socket is this thread's alone until the Peer holding it is published in peers_.
  zmq::socket_t socket;
  try {
    socket = zmq::socket_t(context_, zmq::socket_type::push);
  } catch (const zmq::error_t& e) {
    throw Error("cannot open a socket to node " + std::to_string(node_id) + " at " + endpoint +
                ": " + SocketFailure(e));
  }
  socket.set(zmq::sockopt::linger, options_.linger_ms);
  socket.set(zmq::sockopt::sndhwm, 0);
  socket.set(zmq::sockopt::affinity, send_affinity_);
  socket.set(zmq::sockopt::tcp_maxrt, options_.unacknowledged_timeout_ms);
  if (options_.encrypt) {
    socket.set(zmq::sockopt::curve_serverkey, options_.job_keys.public_key);
    socket.set(zmq::sockopt::curve_publickey, options_.node_keys.public_key);
    socket.set(zmq::sockopt::curve_secretkey, options_.node_keys.secret_key);
  } else {
    socket.set(zmq::sockopt::plain_username, ConnectionToken(options_.connection_key, peer_key));
    socket.set(zmq::sockopt::plain_password,
               options_.job_secret.empty() ? std::string(kNoJobSecret) : options_.job_secret);
  }
  const std::uint64_t watch = monitor_.WatchPeer(node_id, socket);  // 0 without a watcher
  try {
    socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    monitor_.Unwatch(watch, socket);
    throw Error("cannot connect to " + endpoint + ": " + e.what());
  }
  if (verbose_ >= 1) PS_LOG(INFO) << "connected to node " << node_id << " at " << endpoint;
  auto peer = std::make_unique<Peer>(std::move(socket), endpoint, watch);
  std::unique_ptr<Peer> replaced;
  {
    ExclusiveLock lock(peers_mu_);
    std::unique_ptr<Peer>& slot = peers_[node_id];
    replaced = std::move(slot);
    slot = std::move(peer);
  }
  if (replaced) Unwatch(*replaced);
  return watch != 0;
}

void ZmqTransport::Unwatch(Peer& peer) {
  MutexLock lock(peer.mu);  // uncontended: out of peers_, the peer is the caller's alone
  monitor_.Unwatch(peer.watch, peer.socket);
}

bool ZmqTransport::IsConnected(int node_id) const {
  SharedLock lock(peers_mu_);
  return peers_.contains(node_id);
}

void ZmqTransport::Disconnect(int node_id) {
  std::unique_ptr<Peer> closed;
  {
    ExclusiveLock lock(peers_mu_);
    const auto it = peers_.find(node_id);
    if (it == peers_.end()) return;
    closed = std::move(it->second);
    peers_.erase(it);
  }
  Unwatch(*closed);
}

void ZmqTransport::Abandon(int node_id) {
  SharedLock map_lock(peers_mu_);
  const auto it = peers_.find(node_id);
  if (it == peers_.end()) return;
  Peer& peer = *it->second;
  MutexLock peer_lock(peer.mu);
  try {
    peer.socket.set(zmq::sockopt::linger, 0);
  } catch (const zmq::error_t&) {
    // ETERM: the transport is shutting down; the socket closes with it.
  }
}

void ZmqTransport::SetPeerWatcher(std::function<void(int node_id, bool connected)> watcher) {
  monitor_.SetPeerWatcher(std::move(watcher));
}

bool ZmqTransport::Send(const Message& msg) {
  if (shut_down_.load()) return false;
  SharedLock map_lock(peers_mu_);
  const auto it = peers_.find(msg.meta.recipient);
  if (it == peers_.end()) return false;
  Peer& peer = *it->second;
  MutexLock peer_lock(peer.mu);
  const std::string& header = peer.encoder.Encode(msg.meta, msg.data);
  if (header.size() > options_.max_header_bytes) {
    // The peer would drop it unread and never answer: the sender's request fails instead.
    PS_LOG(ERROR) << "a message to node " << msg.meta.recipient << " has a header of "
                  << header.size() << " bytes, more than the " << options_.max_header_bytes
                  << " its receiver reads: not sent (a bug: please report it)";
    return false;
  }
  std::uint64_t bytes = header.size();  // what goes on the wire (bytes_sent)
  try {
    const auto more = msg.data.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore;
    peer.socket.send(zmq::buffer(header), more);
    for (std::size_t i = 0; i < msg.data.size(); ++i) {
      const bool last = i + 1 == msg.data.size();
      peer.socket.send(FrameFor(msg.data[i], frame_owners_),
                       last ? zmq::send_flags::none : zmq::send_flags::sndmore);
      bytes += msg.data[i].bytes();
    }
    bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
  } catch (const zmq::error_t& e) {
    if (e.num() != ETERM)
      PS_LOG(WARNING) << "send to node " << msg.meta.recipient << ": " << e.what();
    return false;
  }
  if (verbose_ >= 2) PS_LOG(INFO) << "sent " << msg.DebugString();
  return true;
}

bool ZmqTransport::Recv(Message& msg) {
  while (!shut_down_.load()) {
    frames_.clear();
    try {
      do {
        zmq::message_t frame;
        if (!receiver_.recv(frame)) continue;  // EAGAIN cannot happen on a blocking socket
        // Past the cap, keep draining the multipart message but stop storing it.
        if (frames_.size() <= wire::kMaxDataFrames + 1) frames_.push_back(std::move(frame));
      } while (receiver_.get(zmq::sockopt::rcvmore));
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return false;
      PS_LOG(WARNING) << "receive failed: " << e.what();
      continue;
    }
    if (frames_.size() > wire::kMaxDataFrames + 1) {
      Drop("message with more than " + std::to_string(wire::kMaxDataFrames) + " data frames");
      continue;
    }
    if (frames_[0].size() > options_.max_header_bytes) {
      Drop("header frame of " + std::to_string(frames_[0].size()) + " bytes, more than " +
           std::to_string(options_.max_header_bytes) + " allowed");
      continue;
    }
    if (auto bad = decoder_.Decode(frames_[0].data(), frames_[0].size(), decoded_); !bad.empty()) {
      Drop(bad);
      continue;
    }
    frame_sizes_.clear();
    for (std::size_t i = 1; i < frames_.size(); ++i) frame_sizes_.push_back(frames_[i].size());
    std::uint64_t received = frames_[0].size();  // bytes_received: the message, header too
    for (const std::size_t size : frame_sizes_) received += size;
    bytes_received_.fetch_add(received, std::memory_order_relaxed);
    if (auto bad = wire::CheckFrames(decoded_.data, frame_sizes_); !bad.empty()) {
      Drop(bad);
      continue;
    }
    msg.meta = std::move(decoded_.meta);
    // Set by the authenticator for this connection; absent only on a socket without one.
    const char* key = zmq_msg_gets(frames_[0].handle(), "User-Id");
    msg.connection_key.assign(key != nullptr ? key : "");
    msg.data.clear();
    msg.data.reserve(frames_.size() - 1);
    for (std::size_t i = 1; i < frames_.size(); ++i) {
      const DType dtype = decoded_.data[i - 1].dtype;
      // A small frame may sit at any offset of ZeroMQ's receive batch: the values are read as
      // their type (an optimizer's floats), which needs them aligned, so such a frame is
      // copied (a few KiB at most; a big frame has an allocation of its own).
      if (reinterpret_cast<std::uintptr_t>(frames_[i].data()) % kFrameAlignment != 0) {
        msg.data.push_back(Blob::Copy(frames_[i].data(), frames_[i].size(), dtype));
        continue;
      }
      auto frame = std::allocate_shared<zmq::message_t>(
          PoolAllocator<zmq::message_t>(frame_holders_), std::move(frames_[i]));
      const void* data = frame->data();
      const std::size_t bytes = frame->size();
      msg.data.emplace_back(std::move(frame), data, bytes, dtype);
    }
    if (verbose_ >= 2) PS_LOG(INFO) << "received " << msg.DebugString();
    return true;
  }
  return false;
}

void ZmqTransport::Drop(const std::string& why) {
  const auto count = ++dropped_;
  if (LogOccurrence(count)) {
    PS_LOG(WARNING) << "dropped malformed message #" << count << ": " << why;
  }
}

void ZmqTransport::Shutdown() {
  if (!shut_down_.exchange(true)) context_.shutdown();
}

}  // namespace ps
