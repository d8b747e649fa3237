#include "zmq_transport.h"

#include <glog/logging.h>

#include <cerrno>
#include <vector>

#include "ps/error.h"
#include "text.h"

namespace ps {
namespace {

// Receive-side cap on one frame, enforced by ZeroMQ before it allocates: a hostile peer cannot
// make this process reserve more than this. Big tensors travel in chunks far below it.
constexpr std::int64_t kMaxZmqMessageBytes = std::int64_t{8} << 30;
// How long closing a send socket may wait to flush queued messages (a TERMINATE, say).
constexpr int kLingerMs = 2000;
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

}  // namespace

ZmqTransport::ZmqTransport(int verbose, int io_threads)
    : verbose_(verbose),
      receive_affinity_(io_threads > 1 ? 1 : 0),
      send_affinity_(io_threads > 1 ? ((std::uint64_t{1} << io_threads) - 1) & ~std::uint64_t{1}
                                    : 0),
      context_(io_threads) {}

ZmqTransport::~ZmqTransport() { Shutdown(); }

int ZmqTransport::Bind(const std::string& ip, int port) {
  receiver_ = zmq::socket_t(context_, zmq::socket_type::pull);
  receiver_.set(zmq::sockopt::linger, 0);
  receiver_.set(zmq::sockopt::rcvhwm, 0);
  receiver_.set(zmq::sockopt::maxmsgsize, kMaxZmqMessageBytes);
  receiver_.set(zmq::sockopt::affinity, receive_affinity_);
  const std::string endpoint =
      "tcp://" + ip + ":" + (port == 0 ? std::string("*") : std::to_string(port));
  try {
    receiver_.bind(endpoint);
  } catch (const zmq::error_t& e) {
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
  if (verbose_ >= 1) LOG(INFO) << "listening on " << ip << ":" << bound;
  return bound;
}

std::string ZmqTransport::BindIpc(const std::string& name) {
  const std::string endpoint = "ipc://@" + name;
  try {
    receiver_.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw Error("cannot listen on " + endpoint + ": " + e.what());
  }
  if (verbose_ >= 1) LOG(INFO) << "listening on " << endpoint;
  return endpoint;
}

void ZmqTransport::Connect(int node_id, const std::string& host, int port) {
  ConnectEndpoint(node_id, "tcp://" + host + ":" + std::to_string(port));
}

std::string ZmqTransport::EndpointOf(int node_id) const {
  std::shared_lock lock(peers_mu_);
  const auto it = peers_.find(node_id);
  return it == peers_.end() ? "" : it->second->endpoint;
}

void ZmqTransport::ConnectEndpoint(int node_id, const std::string& endpoint) {
  auto peer = std::make_unique<Peer>();
  peer->socket = zmq::socket_t(context_, zmq::socket_type::push);
  peer->socket.set(zmq::sockopt::linger, kLingerMs);
  peer->socket.set(zmq::sockopt::sndhwm, 0);
  peer->socket.set(zmq::sockopt::affinity, send_affinity_);
  peer->endpoint = endpoint;
  try {
    peer->socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw Error("cannot connect to " + endpoint + ": " + e.what());
  }
  if (verbose_ >= 1) LOG(INFO) << "connected to node " << node_id << " at " << endpoint;
  std::unique_lock lock(peers_mu_);
  peers_[node_id] = std::move(peer);
}

bool ZmqTransport::IsConnected(int node_id) const {
  std::shared_lock lock(peers_mu_);
  return peers_.contains(node_id);
}

void ZmqTransport::Disconnect(int node_id) {
  std::unique_lock lock(peers_mu_);
  peers_.erase(node_id);
}

bool ZmqTransport::Send(const Message& msg) {
  if (shut_down_.load()) return false;
  std::shared_lock map_lock(peers_mu_);
  const auto it = peers_.find(msg.meta.recipient);
  if (it == peers_.end()) return false;
  Peer& peer = *it->second;
  std::lock_guard peer_lock(peer.mu);
  const std::string& header = peer.encoder.Encode(msg.meta, msg.data);
  try {
    const auto more = msg.data.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore;
    peer.socket.send(zmq::buffer(header), more);
    for (std::size_t i = 0; i < msg.data.size(); ++i) {
      const bool last = i + 1 == msg.data.size();
      peer.socket.send(FrameFor(msg.data[i], frame_owners_),
                       last ? zmq::send_flags::none : zmq::send_flags::sndmore);
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != ETERM) LOG(WARNING) << "send to node " << msg.meta.recipient << ": " << e.what();
    return false;
  }
  if (verbose_ >= 2) LOG(INFO) << "sent " << msg.DebugString();
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
      LOG(WARNING) << "receive failed: " << e.what();
      continue;
    }
    if (frames_.size() > wire::kMaxDataFrames + 1) {
      Drop("message with more than " + std::to_string(wire::kMaxDataFrames) + " data frames");
      continue;
    }
    if (auto bad = decoder_.Decode(frames_[0].data(), frames_[0].size(), decoded_); !bad.empty()) {
      Drop(bad);
      continue;
    }
    frame_sizes_.clear();
    for (std::size_t i = 1; i < frames_.size(); ++i) frame_sizes_.push_back(frames_[i].size());
    if (auto bad = wire::CheckFrames(decoded_.data, frame_sizes_); !bad.empty()) {
      Drop(bad);
      continue;
    }
    msg.meta = std::move(decoded_.meta);
    msg.data.clear();
    msg.data.reserve(frames_.size() - 1);
    for (std::size_t i = 1; i < frames_.size(); ++i) {
      auto frame = std::allocate_shared<zmq::message_t>(
          PoolAllocator<zmq::message_t>(frame_holders_), std::move(frames_[i]));
      const void* data = frame->data();
      const std::size_t bytes = frame->size();
      msg.data.emplace_back(std::move(frame), data, bytes, decoded_.data[i - 1].dtype);
    }
    if (verbose_ >= 2) LOG(INFO) << "received " << msg.DebugString();
    return true;
  }
  return false;
}

void ZmqTransport::Drop(const std::string& why) {
  const auto count = ++dropped_;
  if (LogOccurrence(count)) {
    LOG(WARNING) << "dropped malformed message #" << count << ": " << why;
  }
}

void ZmqTransport::Shutdown() {
  if (!shut_down_.exchange(true)) context_.shutdown();
}

}  // namespace ps
