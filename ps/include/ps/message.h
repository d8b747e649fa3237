#pragma once
// Message: one header (Meta) plus zero or more payload buffers (Blob), each sent as its own
// ZeroMQ frame.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ps/config.h"
#include "ps/error.h"
#include "ps/tensor.h"

namespace ps {

constexpr std::uint32_t kProtocolVersion = 1;
constexpr int kSchedulerId = 0;
constexpr int kNoNode = -1;
// Servers a job admits in the place of dead ones (NODE_JOINED), over its lifetime: every node
// sizes its node table for the job's nodes plus this many.
constexpr int kMaxRejoins = 64;

// Barrier groups: a bitmask of roles.
constexpr int kServerGroup = 1;
constexpr int kWorkerGroup = 2;
constexpr int kSchedulerGroup = 4;
constexpr int kAllGroups = kServerGroup | kWorkerGroup | kSchedulerGroup;

// Same numbers as ps.pb.Control (proto/ps.proto).
enum class Control {
  kNone = 0,
  kRegister = 1,
  kRegisterReply = 2,
  kBarrier = 3,
  kBarrierRelease = 4,
  kHeartbeat = 5,
  kTerminate = 6,
  kError = 7,
  kNodeDead = 8,
  kWorkerDone = 9,
  kNodeFailed = 10,
  kNodeJoined = 11,
  kConnectionReset = 12,
  kStalled = 13,
  kWaitProbe = 14,
  kPeerUnreachable = 15,
};
std::string ControlName(Control control);

struct NodeInfo {
  int id = kNoNode;
  Role role = Role::kWorker;
  std::string host;
  int port = 0;
  int rank = -1;
  std::string host_id;       // same value: same kernel and network namespace
  std::string ipc_endpoint;  // "" when the node does not listen on ipc
  // The user name this node's connections authenticate with: a message that names this node
  // as its sender is accepted only from a connection that gave this key.
  std::string connection_key;

  std::string Describe() const;  // "worker 1 (node 5 at 127.0.0.1:4321)"
  friend bool operator==(const NodeInfo&, const NodeInfo&) = default;
};

// A read-only payload buffer. `owner_` keeps the bytes alive: a received ZeroMQ frame, a
// vector the sender handed over, or a token the caller holds for a zero-copy send of user
// memory. Copies share the bytes.
class Blob {
 public:
  Blob() = default;
  Blob(std::shared_ptr<const void> owner, const void* data, std::size_t bytes, DType dtype)
      : owner_(std::move(owner)),
        data_(static_cast<const std::byte*>(data)),
        bytes_(bytes),
        dtype_(dtype) {}

  // A blob owning a copy of `data`.
  static Blob Copy(const void* data, std::size_t bytes, DType dtype);
  template <class T>
  static Blob FromVector(std::vector<T> values, DType dtype) {
    auto owned = std::make_shared<std::vector<T>>(std::move(values));
    const void* data = owned->data();
    const std::size_t bytes = owned->size() * sizeof(T);
    return Blob(std::move(owned), data, bytes, dtype);
  }

  const std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  DType dtype() const { return dtype_; }
  std::size_t count() const { return DTypeSize(dtype_) == 0 ? 0 : bytes_ / DTypeSize(dtype_); }
  template <class T>
  std::span<const T> as() const {
    return {reinterpret_cast<const T*>(data_), bytes_ / sizeof(T)};
  }
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  std::shared_ptr<const void> owner_;
  const std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  DType dtype_ = DType::kUInt8;
};

// One stalled worker waiting for another (Runtime::ReportStall, WAIT_PROBE): a request of
// `waiter` waits for a dist_sync round that `awaited` has not pushed into. Both are node ids;
// the stall numbers are the ones the reporting server heard from each.
struct WaitEdge {
  int waiter = kNoNode;
  std::uint64_t waiter_stall = 0;
  int awaited = kNoNode;
  std::uint64_t awaited_stall = 0;
  std::string what;  // what the waiter waits for, for the job's error ("round 2 of key 7")
  // The scheduler's own: the waiter votes in a collective (`what`) that `awaited` has not
  // entered, instead of a round it has not pushed into. Never on the wire.
  bool collective = false;
  friend bool operator==(const WaitEdge&, const WaitEdge&) = default;
};

struct Meta {
  int sender = kNoNode;
  int recipient = kNoNode;
  Control control = Control::kNone;
  bool request = false;
  int app_id = 0;
  int customer_id = 0;
  std::uint64_t timestamp = 0;
  int head = 0;
  std::string body;
  std::vector<NodeInfo> nodes;
  int barrier_group = 0;
  std::string error;
  ErrorKind error_kind = ErrorKind::kOther;  // with `error`: what it reports
  int priority = 0;

  friend bool operator==(const Meta&, const Meta&) = default;
};

struct Message {
  Meta meta;
  std::vector<Blob> data;
  // Receive side only, not on the wire: the connection key the connection this message came
  // on authenticated with (NodeInfo::connection_key of its true sender).
  std::string connection_key;

  std::string DebugString() const;  // one line, for PS_VERBOSE=2 and errors
};

}  // namespace ps
