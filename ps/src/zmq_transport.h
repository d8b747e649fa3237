#pragma once
// ZmqTransport: one bound PULL socket that receives, one connected PUSH socket per peer that
// sends. Payload buffers go out as separate frames, zero-copy (the frame holds a reference to
// the Blob's owner until ZeroMQ is done with it), and come in zero-copy (a received Blob owns
// its ZeroMQ frame).
//
// Threads: Send() and Connect() may be called from any thread (a mutex per peer socket);
// Recv() only from the one receive thread. Shutdown() from any thread wakes Recv().
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include <zmq.hpp>

#include "block_pool.h"
#include "ps/message.h"
#include "wire.h"

namespace ps {

class ZmqTransport {
 public:
  ZmqTransport(int verbose, int io_threads);
  ~ZmqTransport();
  ZmqTransport(const ZmqTransport&) = delete;
  ZmqTransport& operator=(const ZmqTransport&) = delete;

  // Binds the receive socket on ip:port (port 0: an ephemeral one) and returns the bound port.
  // Throws ps::Error when the address is in use or not local.
  int Bind(const std::string& ip, int port);

  // Also listens on the abstract-namespace ipc socket "ipc://@<name>" (Linux); returns that
  // endpoint. Same-host peers send through it instead of TCP.
  std::string BindIpc(const std::string& name);

  // Opens (or replaces) the send socket for `node_id`, connected to host:port.
  void Connect(int node_id, const std::string& host, int port);
  // The same, to a full ZeroMQ endpoint ("tcp://h:p" or "ipc://@name").
  void ConnectEndpoint(int node_id, const std::string& endpoint);
  // The endpoint the send socket for `node_id` is connected to ("" if none).
  std::string EndpointOf(int node_id) const;
  bool IsConnected(int node_id) const;
  // Closes the send socket for `node_id`; queued messages are still flushed (linger).
  void Disconnect(int node_id);

  // Sends `msg` to msg.meta.recipient. False when there is no socket for it or the transport
  // is shut down. Never blocks on a slow peer (unbounded queue).
  bool Send(const Message& msg);

  // Blocks for the next well-formed message and stores it in `msg`, whose lists keep their
  // memory (a caller that reuses one Message allocates nothing here per message); malformed
  // messages are logged, counted and dropped. False once Shutdown() was called.
  bool Recv(Message& msg);

  void Shutdown();
  std::uint64_t dropped_messages() const { return dropped_.load(); }

 private:
  struct Peer {
    std::mutex mu;  // guards socket and encoder: ZeroMQ sockets are not thread-safe
    zmq::socket_t socket;
    wire::HeaderEncoder encoder;
    std::string endpoint;
  };
  void Drop(const std::string& why);

  const int verbose_;
  // ZMQ_AFFINITY masks: with two or more I/O threads, the first serves the receive socket
  // and the others the send sockets, so incoming and outgoing bytes never share a thread.
  const std::uint64_t receive_affinity_;
  const std::uint64_t send_affinity_;
  zmq::context_t context_;
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
  mutable std::shared_mutex peers_mu_;
  std::map<int, std::unique_ptr<Peer>> peers_;  // GUARDED_BY(peers_mu_)
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<bool> shut_down_{false};
};

}  // namespace ps
