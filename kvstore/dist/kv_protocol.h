#pragma once
// The KVStore's application protocol on top of the runtime: commands, the body, and the one
// encoder / one decoder of a request. Decoding validates everything against the message's
// data frames, because the server must survive anything a peer sends.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvstore/shm/shared_segment.h"
#include "ps/kvstore.h"
#include "ps/message.h"

namespace ps::pb {
class KVBody;  // generated from kvstore/proto/kv.proto
}  // namespace ps::pb

namespace ps::kv {

constexpr int kAppId = 1;
// At most this many key slices in one message (below the wire's data-frame cap).
constexpr std::size_t kMaxSlicesPerMessage = 4000;

enum Command : int {
  kInit = 1,             // frames: one value per slice
  kPush = 2,             // frames: one gradient per slice
  kPull = 3,             // no frames; the response carries one value per slice
  kPushPull = 4,         // a push whose response carries the value after it (the round's, in sync)
  kSetOptimizer = 5,     // no frames
  kShmAttach = 6,        // no frames; the server maps the worker's shared-memory segment
  kForget = 7,           // no frames; the server drops these slices (undoes a failed Init)
  kSave = 8,             // no frames; the server writes its checkpoint file (reply: 1 frame)
  kLoad = 9,             // no frames; the server loads its slices from a checkpoint
  kSetCompression = 10,  // no frames; the job's gradient compression
  kReplicate = 11,       // server to server: one frame per slice, see ReplicaOp
  kCollective = 12,      // no frames; a dist_sync worker enters a collective (Request::call)
  kStalled = 13,         // no frames; a dist_sync worker waits (Request::stall; slices: keys)
};
constexpr int kLastCommand = kStalled;
std::string CommandName(int command);

struct SliceRef {
  Key key = 0;
  std::uint64_t offset = 0;  // elements into the key
  std::uint64_t total = 0;   // the key's full length
  friend bool operator==(const SliceRef&, const SliceRef&) = default;
};

// A slice whose value travels through the worker's shared-memory segment (its frame, if the
// command carries values, is empty).
struct ShmRef {
  std::uint32_t slice = 0;  // index into Request::slices
  std::uint32_t segment = 0;
  std::uint64_t offset = 0;  // bytes
  std::uint64_t bytes = 0;
  // kReplicate: the node whose segment it is (a worker's), kNoNode: the sender's.
  int owner = kNoNode;
  // kPush, kPushPull: a server (node id) that mapped the segment too, the slice's replica,
  // which may read the update from the slot itself; kNoNode: none.
  int mirror = kNoNode;
  friend bool operator==(const ShmRef&, const ShmRef&) = default;
};

// A compressed pull of one slice: the state of the worker's copy of the value (0: it holds
// none) and the state the reply brings it to (never reused; 0: the slice is pulled in full).
// The server answers with the change since `base` when its mirror of the worker's copy is at
// `base`, else with the full value; either way its mirror moves to `next`.
struct PullState {
  std::uint64_t base = 0;
  std::uint64_t next = 0;
  friend bool operator==(const PullState&, const PullState&) = default;
};

// What a replica does with one slice of a Replicate request (server_ring.h: the primary
// sends every update it makes, in order, and answers what it releases once the replica did).
enum class ReplicaKind : std::uint32_t {
  kState = 1,         // a full copy: the frame is the value, `state` the rest; seq: its rounds
  kRound = 2,         // dist_sync round `seq` closed: the frame is its sum, to apply
  kSkippedRound = 3,  // dist_sync round `seq` failed: nothing to apply, the round is over
  kAsyncPush = 4,     // dist_async: `worker`'s push `seq`, to apply
  kForget = 5,        // the slice is dropped (an Init undone); empty frame
};
constexpr std::uint32_t kLastReplicaKind = 5;

// A replica's answer to a kReplicate is empty when it applied the request. One with a body
// applied the ops before the first one it lacks the state for (the slice, or the round before:
// a full copy lost with a reset connection, or a round it holds already), and none from that
// one on. The body says why; the primary sends the slice in full again rather than end the job.
struct ReplicaOp {
  ReplicaKind kind = ReplicaKind::kState;
  std::uint64_t seq = 0;
  int worker = 0;
  // kState: the slice's state besides its value (its optimizer buffers: up to twice the bytes
  // of a float32 value), in a frame of its own after the value frames (AttachReplicaStates),
  // not in the header, whose size is capped far lower.
  std::string state;
  friend bool operator==(const ReplicaOp&, const ReplicaOp&) = default;
};

// A LoadCheckpoint runs in steps so that it changes every server's slices or none: worker 0
// has each live server read and check its slices into a staged copy (kStage), then, once every
// one succeeded, apply it (kApply), or else drop it (kDiscard).
enum class LoadStep : std::uint32_t { kStage = 0, kApply = 1, kDiscard = 2 };
constexpr std::uint32_t kLastLoadStep = 2;

struct Request {
  Command command = kPush;
  std::vector<SliceRef> slices;
  bool sync = true;
  OptimizerConfig optimizer;  // kSetOptimizer only
  std::vector<ShmRef> shm;    // kPush, kPull, kPushPull: at most one per slice
  // kShmAttach only.
  std::uint32_t segment_id = 0;
  SharedSegment::Descriptor segment;
  // kSave and kLoad only: the directory, the MANIFEST (kLoad) and the server ranks the sender
  // knows dead (see kv.proto).
  std::string path;
  std::string manifest;
  std::vector<int> dead_servers;
  LoadStep load_step = LoadStep::kStage;  // kLoad only
  GradientCompression compression;        // kSetCompression only
  // kPull, kPushPull: one per slice when any slice's pull is compressed, else empty.
  std::vector<PullState> pulls;
  // With replication: per slice, its home server rank (or empty), and for kPush, kPushPull and
  // kPull the sender's push number (or empty); see kv.proto.
  std::vector<int> homes;
  std::vector<std::uint64_t> seqs;
  std::vector<ReplicaOp> replica_ops;  // kReplicate: one per slice
  // kReplicate, kSave, kLoad, kCollective: how many server deaths and joins the sender knows
  // of.
  std::uint64_t membership = 0;
  // kPush, kPushPull (dist_sync) and kCollective: the worker-group collectives the sender had
  // entered; kCollective: the call it enters now (see kv.proto).
  std::uint64_t collectives = 0;
  std::string call;
  // kStalled: the sender's stall number (Runtime::ReportStall); its slices name the keys it
  // waits for (offset and total 0), none when it waits for every request it sent.
  std::uint64_t stall = 0;
};

std::string EncodeBody(const Request& request);
// A KVStore request message carrying `request` (its command and encoded body) to `recipient`.
Message RequestMessage(const Request& request, int recipient);
// The same, written over `msg`'s header (its data frames are left alone) so that the memory
// of its body string is reused.
void FillRequestMessage(const Request& request, int recipient, Message& msg);

// Decodes requests through one reused protobuf body and Request, so that a steady stream of
// requests allocates nothing here. One thread at a time.
class RequestDecoder {
 public:
  RequestDecoder();
  ~RequestDecoder();
  RequestDecoder(const RequestDecoder&) = delete;
  RequestDecoder& operator=(const RequestDecoder&) = delete;
  // Decodes msg.meta.head/body and checks them against msg.data. The request stays valid until
  // the next call; null with `error` set when anything is inconsistent.
  const Request* Decode(const Message& msg, std::string* error);

 private:
  std::unique_ptr<pb::KVBody> body_;
  Request request_;
};

// kReplicate: appends to `msg`, after its value frames, one frame per op with its state
// (empty but for kState), which it moves out of `request`.
void AttachReplicaStates(Request& request, Message& msg);

// A one-off RequestDecoder::Decode.
std::optional<Request> DecodeRequest(const Message& msg, std::string* error);

}  // namespace ps::kv
