#include "ps/src/connection_monitor.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_received (glibc's lacks it)
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "ps/error.h"
#include "ps/src/glog_or_stderr.h"
#include "ps/src/log_text.h"
#include "ps/src/start_thread.h"

namespace ps {
namespace {

// What the receive socket's monitor reports: connections opening and closing (with their
// descriptor), handshakes ending (without one), and accepts that failed (with errno).
constexpr int kReceiverEvents =
    ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED | ZMQ_EVENT_DISCONNECTED |
    ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
    ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
// What a send socket's monitor reports: its connection opened (with its descriptor), up
// (handshake done), refused for its credentials, and down.
constexpr int kPeerEvents = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                            ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED;
// A ZeroMQ peer sends its 64-byte greeting within a round trip of connecting, and no message
// before it: a connection that has sent less is still in the handshake for certain, and one
// that has sent less for this long is not a peer slow to greet. It goes first when one must.
constexpr std::uint64_t kGreetingBytes = 64;
constexpr auto kIdleGrace = std::chrono::milliseconds(500);
// Events handled per wake-up from one socket, so a flood on the receive socket cannot keep the
// send sockets' events waiting.
constexpr int kMaxEventsPerPass = 1024;
// How often a refused accept is logged past the first ten (ConnectionMonitor's
// accept_failure_logged_).
constexpr auto kAcceptFailureLogEvery = std::chrono::seconds(10);

// "1.2.3.4:5678" for a TCP peer, "a local (ipc) peer" for a Unix-domain one.
std::string PeerName(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "a peer";
  char text[INET6_ADDRSTRLEN] = "";
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    return std::string(text) + ":" + std::to_string(ntohs(in.sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    return "[" + std::string(text) + "]:" + std::to_string(ntohs(in6.sin6_port));
  }
  return "a local (ipc) peer";
}

// Why a peer's security handshake failed, from ZeroMQ's protocol error code, and the fix.
std::string HandshakeFailure(std::uint32_t code) {
  switch (code) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      return "the peer speaks another security mechanism (PLAIN or CURVE): every node of a "
             "job must set the same PS_ENCRYPT";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
      return "the peer's CURVE keys are not this job's: with PS_ENCRYPT=1 they come from "
             "PS_JOB_SECRET, so every node must be given the job's secret (or the peer replays "
             "a connection of another job with the same secret, which is refused too)";
    default: {
      char hex[16];
      std::snprintf(hex, sizeof(hex), "%#x", code);
      return std::string("the peer broke ZeroMQ's handshake (protocol error ") + hex +
             "): is it a node of this job, of the same version, with the same PS_ENCRYPT?";
    }
  }
}

// Whether descriptor `fd` is a socket accepted by the listener bound to `endpoint`
// ("tcp://host:port", "ipc://@name"): an ACCEPTED event read late may name a descriptor that
// ZeroMQ has closed and reused since, perhaps for a connection of its own. True when the
// endpoint cannot be read (the check is a safeguard, not a filter).
bool IsAcceptedBy(int fd, const std::string& endpoint) {
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return false;
  if (local.ss_family == AF_INET || local.ss_family == AF_INET6) {
    const auto colon = endpoint.rfind(':');
    if (!endpoint.starts_with("tcp://") || colon == std::string::npos) return true;
    const int port = std::atoi(endpoint.c_str() + colon + 1);
    const auto local_port = local.ss_family == AF_INET
                                ? reinterpret_cast<const sockaddr_in&>(local).sin_port
                                : reinterpret_cast<const sockaddr_in6&>(local).sin6_port;
    return ntohs(local_port) == port;
  }
  if (local.ss_family == AF_UNIX) {
    constexpr std::string_view kAbstract = "ipc://@";
    if (!endpoint.starts_with(kAbstract)) return true;
    const auto& un = reinterpret_cast<const sockaddr_un&>(local);
    const std::size_t path_bytes = length - offsetof(sockaddr_un, sun_path);
    const std::string_view name = std::string_view(endpoint).substr(kAbstract.size());
    return path_bytes == name.size() + 1 && un.sun_path[0] == '\0' &&
           std::string_view(un.sun_path + 1, name.size()) == name;
  }
  return false;
}

// Whether TCP connection `fd` has received less than a ZeroMQ greeting: then it carried no
// message yet, and dropping it loses nothing. False when unknown (an ipc connection, or a
// kernel older than 4.1 without the counter).
bool Ungreeted(int fd) {
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return false;
  const std::size_t needed =
      offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received);
  return length >= needed && info.tcpi_bytes_received < kGreetingBytes;
}

// The inode of descriptor `fd` if it is a socket; 0 otherwise (closed, or reused for a file).
ino_t SocketInode(int fd) {
  struct stat status {};
  if (fstat(fd, &status) != 0 || !S_ISSOCK(status.st_mode)) return 0;
  return status.st_ino;
}

}  // namespace

ConnectionMonitor::ConnectionMonitor(zmq::context_t& context, int verbose,
                                     const ConnectionLimits& limits)
    : context_(context), verbose_(verbose), limits_(limits), wake_("the connection monitor") {
  thread_ = internal::StartThread("the connection monitor",
                                  [this](std::stop_token stop) { RunOnMonitorThread(stop); });
}

ConnectionMonitor::~ConnectionMonitor() {
  thread_.request_stop();
  Wake();
  if (thread_.joinable()) thread_.join();
  // The PAIR sockets close with the members, before the context (the owner's) ends.
}

zmq::socket_t ConnectionMonitor::OpenEvents(zmq::socket_t& socket, int mask) {
  const std::string endpoint = "inproc://ps-connection-monitor-" + std::to_string(next_endpoint_++);
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), mask) != 0) throw zmq::error_t();
  // From here ZeroMQ blocks the thread that reports an event until a reader takes it (it sends
  // events without ZMQ_DONTWAIT): the reader connects at once and lives until Unwatch, which
  // detaches the monitor first. That also bounds the events queued for a slow reader.
  try {
    zmq::socket_t events(context_, zmq::socket_type::pair);
    events.connect(endpoint);
    return events;
  } catch (const zmq::error_t&) {
    zmq_socket_monitor(socket.handle(), nullptr, 0);  // no reader: no monitor either
    throw;
  }
}

bool ConnectionMonitor::WatchReceiver(zmq::socket_t& receiver) {
  try {
    zmq::socket_t events = OpenEvents(receiver, kReceiverEvents);
    MutexLock lock(mu_);
    new_receiver_.push_back(std::move(events));
  } catch (const zmq::error_t& e) {
    PS_LOG(WARNING) << "cannot watch the connections of the receive socket (" << e.what()
                    << "): they are not bounded";
    return false;
  }
  Wake();
  return true;
}

std::uint64_t ConnectionMonitor::WatchPeer(int node_id, zmq::socket_t& socket) {
  {
    MutexLock lock(mu_);
    if (!watching_peers_) return 0;
  }
  zmq::socket_t events;
  try {
    events = OpenEvents(socket, kPeerEvents);
  } catch (const zmq::error_t& e) {
    PS_LOG(WARNING) << "cannot watch the connection to node " << node_id << " (" << e.what()
                    << "): its loss will be noticed by heartbeats only";
    return 0;
  }
  std::uint64_t watch = 0;
  {
    MutexLock lock(mu_);
    watch = next_watch_++;
    new_peers_.emplace(watch, PeerWatch{node_id, std::move(events), false});
  }
  Wake();
  return watch;
}

void ConnectionMonitor::Unwatch(std::uint64_t watch, zmq::socket_t& socket) {
  if (watch == 0) return;
  zmq_socket_monitor(socket.handle(), nullptr, 0);  // fails only after shutdown: no events then
  {
    MutexLock lock(mu_);
    if (new_peers_.erase(watch) != 0) return;  // never reached the monitor thread
    removed_.push_back(watch);
  }
  Wake();
}

void ConnectionMonitor::SetPeerWatcher(PeerWatcher watcher) {
  const bool set = static_cast<bool>(watcher);
  {
    MutexLock lock(watcher_mu_);
    watcher_ = std::move(watcher);
  }
  MutexLock lock(mu_);
  watching_peers_ = set;
}

void ConnectionMonitor::Wake() { wake_.Wake(); }

void ConnectionMonitor::RunOnMonitorThread(std::stop_token stop) {
  std::vector<zmq_pollitem_t> items;
  // polled[i], a watch id and its watch, is items[first_peer + i]
  std::vector<std::pair<std::uint64_t, PeerWatch*>> polled;
  std::vector<Notice> notices;
  Event event;
  while (!stop.stop_requested()) {
    AdoptChangesOnMonitorThread();
    items.clear();
    polled.clear();
    items.push_back(zmq_pollitem_t{nullptr, wake_.fd(), ZMQ_POLLIN, 0});
    if (receiver_events_) {
      items.push_back(zmq_pollitem_t{receiver_events_.handle(), 0, ZMQ_POLLIN, 0});
    }
    const std::size_t first_peer = items.size();
    for (auto& [watch, peer] : peers_) {
      items.push_back(zmq_pollitem_t{peer.events.handle(), 0, ZMQ_POLLIN, 0});
      polled.emplace_back(watch, &peer);
    }
    if (zmq_poll(items.data(), static_cast<int>(items.size()), -1) < 0) {
      // ETERM: the transport shut down (no event blocks anyone then); the sockets close when
      // this object goes. Anything else is retried: a reader that stops would block ZeroMQ.
      if (zmq_errno() == ETERM) return;
      if (zmq_errno() != EINTR) {
        PS_LOG(WARNING) << "the connection monitor's poll failed: " << zmq_strerror(zmq_errno());
      }
      continue;
    }
    if (items[0].revents & ZMQ_POLLIN) wake_.Drain();
    if (receiver_events_ && (items[1].revents & ZMQ_POLLIN)) {
      for (int n = 0; n < kMaxEventsPerPass && ReadEventOnMonitorThread(receiver_events_, event);
           ++n) {
        OnReceiverEventOnMonitorThread(event);
      }
    }
    notices.clear();
    for (std::size_t i = 0; i < polled.size(); ++i) {
      if (!(items[first_peer + i].revents & ZMQ_POLLIN)) continue;
      auto& [id, peer] = polled[i];
      for (int n = 0; n < kMaxEventsPerPass && ReadEventOnMonitorThread(peer->events, event); ++n) {
        OnPeerEventOnMonitorThread(id, *peer, event, notices);
      }
    }
    NotifyOnMonitorThread(notices);
  }
}

void ConnectionMonitor::AdoptChangesOnMonitorThread() {
  // The sockets change threads here; the mutex is the memory barrier ZeroMQ asks for.
  MutexLock lock(mu_);
  for (zmq::socket_t& events : new_receiver_) receiver_events_ = std::move(events);
  new_receiver_.clear();
  peers_.merge(new_peers_);
  for (std::uint64_t watch : removed_) {
    if (const auto it = peers_.find(watch); it != peers_.end()) {
      ForgetLink(it->second.node_id, watch);
      peers_.erase(it);
    }
  }
  removed_.clear();
}

bool ConnectionMonitor::ReadEventOnMonitorThread(zmq::socket_t& events, Event& event) {
  // Version 1 events: [16-bit type, 32-bit value] then the endpoint.
  try {
    zmq::message_t head;
    if (!events.recv(head, zmq::recv_flags::dontwait)) return false;
    event.type = 0;
    event.value = 0;
    if (head.size() >= sizeof(event.type) + sizeof(event.value)) {
      std::memcpy(&event.type, head.data(), sizeof(event.type));
      std::memcpy(&event.value, head.data<char>() + sizeof(event.type), sizeof(event.value));
    }
    event.address.clear();
    if (head.more()) {
      zmq::message_t address;  // the parts of a message arrive together: never blocks
      if (events.recv(address)) event.address = address.to_string();
    }
    return true;
  } catch (const zmq::error_t&) {
    return false;  // ETERM: the next poll says so
  }
}

void ConnectionMonitor::OnReceiverEventOnMonitorThread(const Event& event) {
  const int fd = static_cast<int>(event.value);
  switch (event.type) {
    case ZMQ_EVENT_ACCEPTED:
      OnAcceptedOnMonitorThread(fd, event.address);
      break;
    case ZMQ_EVENT_DISCONNECTED:
      accepted_.erase(fd);
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      // The refused peer may learn why from its own side; this side says it too, once in a
      // while (a CURVE peer with other keys learns nothing: its handshake just stalls). Only
      // another mechanism or other keys count as a job's node with other settings; any other
      // protocol error (a port scanner, a stray client) is logged apart.
      if (event.value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ||
          event.value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) {
        if (const auto count = ++refused_handshakes_; LogOccurrence(count)) {
          PS_LOG(WARNING) << "refused a connection (#" << count
                          << "): " << HandshakeFailure(event.value);
        }
      } else if (const auto count = ++broken_handshakes_; LogOccurrence(count)) {
        PS_LOG(WARNING) << "dropped a connection (#" << count
                        << "): " << HandshakeFailure(event.value);
      }
      ++handshakes_ended_;
      break;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      ++handshakes_ended_;
      break;
    case ZMQ_EVENT_ACCEPT_FAILED:
      if (const auto now = std::chrono::steady_clock::now();
          ++accept_failures_ <= 10 || now - accept_failure_logged_ >= kAcceptFailureLogEvery) {
        accept_failure_logged_ = now;
        PS_LOG(WARNING) << "could not accept a connection (#" << accept_failures_
                        << "): " << std::strerror(static_cast<int>(event.value))
                        << (event.value == EMFILE ? " (this process is out of descriptors: "
                                                    "raise ulimit -n)"
                                                  : "");
      }
      break;
    default:
      break;
  }
}

void ConnectionMonitor::OnAcceptedOnMonitorThread(int fd, const std::string& endpoint) {
  ++accepted_count_;
  const ino_t inode = SocketInode(fd);
  // Closed already, or reused since (the event was read late): nothing of ours to track.
  if (inode == 0 || !IsAcceptedBy(fd, endpoint)) return;
  Accepted& connection = accepted_[fd];
  connection = Accepted{inode, Clock::now(), PeerName(fd), false};
  if (verbose_ >= 2) PS_LOG(INFO) << "accepted a connection from " << connection.peer;
  EnforceLimitsOnMonitorThread(fd);
}

std::size_t ConnectionMonitor::PendingEstimateOnMonitorThread(Clock::time_point now) const {
  const std::uint64_t unended =
      accepted_count_ > handshakes_ended_ ? accepted_count_ - handshakes_ended_ : 0;
  if (unended <= limits_.max_pending) return unended;
  // No connection stays in the handshake past its interval: the young ones bound the count.
  std::size_t young = 0;
  for (const auto& [fd, connection] : accepted_) {
    young += !connection.dropping && now - connection.at < limits_.handshake;
  }
  return std::min<std::uint64_t>(unended, young);
}

std::size_t ConnectionMonitor::OpenOnMonitorThread() const {
  return static_cast<std::size_t>(
      std::count_if(accepted_.begin(), accepted_.end(),
                    [](const auto& entry) { return !entry.second.dropping; }));
}

void ConnectionMonitor::EnforceLimitsOnMonitorThread(int newest) {
  const auto now = Clock::now();
  if (OpenOnMonitorThread() > limits_.max_open) PruneOnMonitorThread();
  const bool over_open = OpenOnMonitorThread() > limits_.max_open;
  if (!over_open && PendingEstimateOnMonitorThread(now) <= limits_.max_pending) return;
  const std::string why =
      over_open ? "more than " + std::to_string(limits_.max_open) +
                      " connections are open, the most this node accepts (from its peer count "
                      "and descriptor limit)"
                : "more than " + std::to_string(limits_.max_pending) +
                      " connections are still in ZeroMQ's handshake";
  if (const int idle = OldestIdleOnMonitorThread(now); idle >= 0) {
    DropOnMonitorThread(idle, "it has not completed a greeting since it connected and " + why);
  } else if (over_open || Ungreeted(newest)) {
    // The newest: it has carried no message yet (a peer of the job reconnects at once), unless
    // the total cap forces it (then what it carried, if anything, is lost).
    DropOnMonitorThread(newest, why);
  }
  // Else over the handshake cap only with nothing certain to drop (ipc connections, or TCP ones
  // that greeted): the handshake interval ends those that stall.
}

int ConnectionMonitor::OldestIdleOnMonitorThread(Clock::time_point now) const {
  int oldest = -1;
  Clock::time_point oldest_at = now;
  for (const auto& [fd, connection] : accepted_) {
    if (connection.dropping || now - connection.at < kIdleGrace || connection.at >= oldest_at) {
      continue;
    }
    if (SocketInode(fd) != connection.inode || !Ungreeted(fd)) continue;
    oldest = fd;
    oldest_at = connection.at;
  }
  return oldest;
}

void ConnectionMonitor::DropOnMonitorThread(int fd, const std::string& why) {
  const auto it = accepted_.find(fd);
  if (it == accepted_.end()) return;
  Accepted& connection = it->second;
  if (SocketInode(fd) != connection.inode) {  // ZeroMQ has closed it already
    accepted_.erase(it);
    return;
  }
  // ZeroMQ owns the descriptor: it reads the end of the stream, closes it and reports
  // DISCONNECTED, which removes the entry.
  shutdown(fd, SHUT_RDWR);
  connection.dropping = true;
  if (const auto count = ++dropped_; LogOccurrence(count)) {
    PS_LOG(WARNING) << "dropped connection #" << count << " from " << connection.peer << ": "
                    << why;
  }
}

void ConnectionMonitor::PruneOnMonitorThread() {
  std::erase_if(accepted_,
                [](const auto& entry) { return SocketInode(entry.first) != entry.second.inode; });
}

void ConnectionMonitor::OnPeerEventOnMonitorThread(std::uint64_t id, PeerWatch& watch,
                                                   const Event& event,
                                                   std::vector<Notice>& notices) {
  if (event.type == ZMQ_EVENT_CONNECTED) {
    const int fd = static_cast<int>(event.value);
    if (const ino_t inode = SocketInode(fd); inode != 0) {
      MutexLock lock(links_mu_);
      links_[watch.node_id] = Link{id, fd, inode};
    }
    return;
  }
  if (event.type == ZMQ_EVENT_DISCONNECTED) ForgetLink(watch.node_id, id);
  if (event.type == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
    MutexLock lock(links_mu_);
    refused_credentials_.insert(watch.node_id);
    return;
  }
  if (event.type == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
    MutexLock lock(links_mu_);
    refused_credentials_.erase(watch.node_id);
  }
  if (event.type == ZMQ_EVENT_HANDSHAKE_SUCCEEDED && !watch.connected) {
    watch.connected = true;
    notices.push_back(Notice{watch.node_id, true});
  } else if (event.type == ZMQ_EVENT_DISCONNECTED && watch.connected) {
    watch.connected = false;
    notices.push_back(Notice{watch.node_id, false});
    if (verbose_ >= 1) {
      PS_LOG(INFO) << "the connection to node " << watch.node_id << " at " << event.address
                   << " closed";
    }
  }
}

bool ConnectionMonitor::RefusedCredentials(int node_id) const {
  MutexLock lock(links_mu_);
  return refused_credentials_.contains(node_id);
}

void ConnectionMonitor::ForgetLink(int node_id, std::uint64_t id) {
  MutexLock lock(links_mu_);
  if (const auto it = links_.find(node_id); it != links_.end() && it->second.watch == id) {
    links_.erase(it);
  }
}

std::optional<LinkState> ConnectionMonitor::LinkTo(int node_id) const {
  MutexLock lock(links_mu_);
  const auto it = links_.find(node_id);
  // ZeroMQ may have closed the descriptor, and reused its number, before its DISCONNECTED
  // event is read: the inode tells.
  if (it == links_.end() || SocketInode(it->second.fd) != it->second.inode) return std::nullopt;
  return ReadLinkState(it->second.fd);
}

void ConnectionMonitor::NotifyOnMonitorThread(const std::vector<Notice>& notices) {
  if (notices.empty()) return;
  MutexLock lock(watcher_mu_);
  if (!watcher_) return;
  for (const Notice& notice : notices) {
    try {
      watcher_(notice.node_id, notice.connected);
    } catch (const std::exception& e) {
      PS_LOG(ERROR) << "the connection watcher failed on node " << notice.node_id << ": "
                    << e.what();
    }
  }
}

}  // namespace ps
