#include "kvstore/dist/kv_protocol.h"

#include <google/protobuf/arena.h>

#include <cstddef>

#include "kv.pb.h"

namespace ps::kv {
namespace {

// Stack bytes for encoding one body: its three key lists take 8 to 30 bytes per slice.
constexpr std::size_t kEncodeArenaBytes = 2048;
// The longest call a Collective request names (the worker bounds its votes below this).
constexpr std::size_t kMaxCallBytes = 4096;

bool CarriesValues(int command) {
  return command == kInit || command == kPush || command == kPushPull || command == kReplicate;
}

// Empties every field a previous Decode filled, keeping the memory of its lists.
void ClearRequest(Request& request) {
  request.slices.clear();
  request.shm.clear();
  request.optimizer = OptimizerConfig{};
  request.path.clear();
  request.manifest.clear();
  request.dead_servers.clear();
  request.load_step = LoadStep::kStage;
  request.segment_id = 0;
  request.segment = SharedSegment::Descriptor{};
  request.compression = GradientCompression{};
  request.pulls.clear();
  request.call.clear();
  request.homes.clear();
  request.seqs.clear();
  request.replica_ops.clear();
}

// Fills request.slices from the body's three key lists and checks them against the value
// frames: one per slice for a command that carries values, each inside its key (a Replicate
// has as many state frames after them: AttachReplicaStates).
bool DecodeSlices(const pb::KVBody& body, Request& request, const std::vector<Blob>& data,
                  std::string* error) {
  if (body.keys_size() != body.offsets_size() || body.keys_size() != body.totals_size() ||
      static_cast<std::size_t>(body.keys_size()) > kMaxSlicesPerMessage) {
    *error = "inconsistent key lists in a " + CommandName(request.command) + " request";
    return false;
  }
  request.slices.reserve(static_cast<std::size_t>(body.keys_size()));
  for (int i = 0; i < body.keys_size(); ++i) {
    request.slices.push_back(SliceRef{body.keys(i), body.offsets(i), body.totals(i)});
  }
  const std::size_t frames = CarriesValues(request.command) ? request.slices.size() : 0;
  const std::size_t state_frames = request.command == kReplicate ? frames : 0;
  if (data.size() != frames + state_frames) {
    *error = CommandName(request.command) + " request with " + std::to_string(data.size()) +
             " value frames for " + std::to_string(request.slices.size()) + " keys";
    return false;
  }
  for (std::size_t i = 0; i < request.slices.size(); ++i) {
    const SliceRef& slice = request.slices[i];
    // A compressed gradient's frame counts bytes, not elements: the server checks its size
    // against the slice it holds (and a key is never of dtype uint8).
    const bool compressed = frames && data[i].dtype() == DType::kUInt8;
    const std::uint64_t length = frames && !compressed ? data[i].count() : 0;
    if (slice.offset > slice.total || length > slice.total - slice.offset) {
      *error = "key " + std::to_string(slice.key) + ": slice [" + std::to_string(slice.offset) +
               ", +" + std::to_string(length) + ") outside its " + std::to_string(slice.total) +
               " elements";
      return false;
    }
  }
  return true;
}

// Fills request.path, .manifest, .dead_servers and .load_step of a SaveCheckpoint or
// LoadCheckpoint; no other command may carry dead server ranks or a load step.
bool DecodeCheckpoint(const pb::KVBody& body, Request& request, std::string* error) {
  if (body.load_step() > (request.command == kLoad ? kLastLoadStep : 0)) {
    *error = "load step " + std::to_string(body.load_step()) + " in a " +
             CommandName(request.command) + " request";
    return false;
  }
  request.load_step = static_cast<LoadStep>(body.load_step());
  if (request.command != kSave && request.command != kLoad) {
    if (body.dead_servers_size() == 0) return true;
    *error = "dead server ranks in a " + CommandName(request.command) + " request";
    return false;
  }
  // A directory path: no NUL (the file system would cut it there), not empty.
  if (body.path().empty() || body.path().find('\0') != std::string::npos ||
      body.path().size() > 4096) {
    *error = "a checkpoint request without a valid directory path";
    return false;
  }
  request.path = body.path();
  request.manifest = body.manifest();
  for (const int rank : body.dead_servers()) {
    if (rank < 0) {
      *error = "a negative dead server rank in a " + CommandName(request.command) + " request";
      return false;
    }
    request.dead_servers.push_back(rank);
  }
  return true;
}

// Copies a SetOptimizer body's settings into `c`; a schedule of more than 1024 steps is refused.
bool DecodeOptimizer(const pb::OptimizerSpec& spec, OptimizerConfig& c, std::string* error) {
  c.name = spec.name();
  c.learning_rate = spec.learning_rate();
  c.momentum = spec.momentum();
  c.weight_decay = spec.weight_decay();
  c.rescale_grad = spec.rescale_grad();
  c.clip_gradient = spec.clip_gradient();
  c.beta1 = spec.beta1();
  c.beta2 = spec.beta2();
  c.epsilon = spec.epsilon();
  c.rho = spec.rho();
  const auto& schedule = spec.schedule();
  if (schedule.steps_size() > 1024) {
    *error = "a learning-rate schedule with " + std::to_string(schedule.steps_size()) + " steps";
    return false;
  }
  c.schedule.type = schedule.type();
  c.schedule.step = schedule.step();
  c.schedule.steps.assign(schedule.steps().begin(), schedule.steps().end());
  c.schedule.factor = schedule.factor();
  c.schedule.stop_factor_lr = schedule.stop_factor_lr();
  c.schedule.max_update = schedule.max_update();
  c.schedule.final_lr = schedule.final_lr();
  c.schedule.warmup_steps = schedule.warmup_steps();
  c.schedule.warmup_begin_lr = schedule.warmup_begin_lr();
  return true;
}

// Fills request.shm from the body: every reference names a distinct slice of the request, and
// for a command that carries values the slice's frame is an empty placeholder.
bool DecodeShm(const pb::KVBody& body, Request& request, const std::vector<Blob>& data,
               std::string* error) {
  if (body.shm_size() == 0) return true;
  const Command command = request.command;
  if (command != kPush && command != kPull && command != kPushPull && command != kReplicate) {
    *error = CommandName(command) + " request with shared-memory slices";
    return false;
  }
  std::vector<bool> seen(request.slices.size(), false);
  for (const auto& ref : body.shm()) {
    if (ref.slice() >= request.slices.size() || seen[ref.slice()] ||
        (CarriesValues(command) && data[ref.slice()].bytes() != 0)) {
      *error = "malformed shared-memory slice list in a " + CommandName(command) + " request";
      return false;
    }
    seen[ref.slice()] = true;
    if ((ref.has_owner() && (command != kReplicate || ref.owner() < 0)) ||
        (ref.has_mirror() && ref.mirror() < 0)) {
      *error = "malformed shared-memory owner or mirror in a " + CommandName(command) + " request";
      return false;
    }
    request.shm.push_back(ShmRef{ref.slice(), ref.segment(), ref.offset(), ref.bytes(),
                                 ref.has_owner() ? ref.owner() : kNoNode,
                                 ref.has_mirror() ? ref.mirror() : kNoNode});
  }
  return true;
}

// Fills request.pulls from the body: none, or one state per slice of a Pull or PushPull.
bool DecodePulls(const pb::KVBody& body, Request& request, std::string* error) {
  if (body.pull_base_size() == 0 && body.pull_next_size() == 0) return true;
  const Command command = request.command;
  if ((command != kPull && command != kPushPull) ||
      body.pull_base_size() != body.pull_next_size() ||
      static_cast<std::size_t>(body.pull_base_size()) != request.slices.size()) {
    *error = "malformed compressed-pull list in a " + CommandName(command) + " request";
    return false;
  }
  request.pulls.reserve(request.slices.size());
  for (int i = 0; i < body.pull_base_size(); ++i) {
    request.pulls.push_back(PullState{body.pull_base(i), body.pull_next(i)});
  }
  return true;
}

// Fills request.homes, request.seqs and request.replica_ops from the body: each list empty or
// one entry per slice, and only for the commands that use it.
bool DecodeReplication(const pb::KVBody& body, Request& request, const std::vector<Blob>& data,
                       std::string* error) {
  const Command command = request.command;
  const auto slices = static_cast<int>(request.slices.size());
  const auto fits = [&](int size, bool allowed) {
    return size == 0 || (allowed && size == slices);
  };
  const bool routed = command == kInit || command == kPush || command == kPull ||
                      command == kPushPull || command == kForget;
  const bool numbered = command == kPush || command == kPull || command == kPushPull;
  const bool replicate = command == kReplicate;
  if (!fits(body.homes_size(), routed) || !fits(body.seqs_size(), numbered) ||
      body.replica_kinds_size() != (replicate ? slices : 0) ||
      body.replica_seqs_size() != body.replica_kinds_size() ||
      body.replica_workers_size() != body.replica_kinds_size()) {
    *error = "malformed replication lists in a " + CommandName(command) + " request";
    return false;
  }
  for (const int home : body.homes()) {
    if (home < 0) {
      *error = "a negative home server rank in a " + CommandName(command) + " request";
      return false;
    }
  }
  request.homes.assign(body.homes().begin(), body.homes().end());
  request.seqs.assign(body.seqs().begin(), body.seqs().end());
  for (int i = 0; i < body.replica_kinds_size(); ++i) {
    const std::uint32_t kind = body.replica_kinds(i);
    if (kind == 0 || kind > kLastReplicaKind) {
      *error = "unknown replica operation " + std::to_string(kind);
      return false;
    }
    // DecodeSlices checked that the state frames follow the value frames.
    const Blob& state = data[request.slices.size() + static_cast<std::size_t>(i)];
    if (state.dtype() != DType::kUInt8) {
      *error = "a Replicate request's state frame is not of bytes";
      return false;
    }
    request.replica_ops.push_back(
        ReplicaOp{static_cast<ReplicaKind>(kind), body.replica_seqs(i), body.replica_workers(i),
                  std::string(reinterpret_cast<const char*>(state.data()), state.bytes())});
  }
  return true;
}

}  // namespace

std::string CommandName(int command) {
  switch (command) {
    case kInit:
      return "Init";
    case kPush:
      return "Push";
    case kPull:
      return "Pull";
    case kPushPull:
      return "PushPull";
    case kSetOptimizer:
      return "SetOptimizer";
    case kShmAttach:
      return "ShmAttach";
    case kForget:
      return "Forget";
    case kSave:
      return "SaveCheckpoint";
    case kLoad:
      return "LoadCheckpoint";
    case kSetCompression:
      return "SetGradientCompression";
    case kReplicate:
      return "Replicate";
    case kCollective:
      return "Collective";
    case kStalled:
      return "Stalled";
  }
  return "command " + std::to_string(command);
}

namespace {

// Copies a SetOptimizer request's settings into its body (DecodeOptimizer reads them back).
void EncodeOptimizer(const OptimizerConfig& c, pb::OptimizerSpec& spec) {
  spec.set_name(c.name);
  spec.set_learning_rate(c.learning_rate);
  spec.set_momentum(c.momentum);
  spec.set_weight_decay(c.weight_decay);
  spec.set_rescale_grad(c.rescale_grad);
  spec.set_clip_gradient(c.clip_gradient);
  spec.set_beta1(c.beta1);
  spec.set_beta2(c.beta2);
  spec.set_epsilon(c.epsilon);
  spec.set_rho(c.rho);
  auto* schedule = spec.mutable_schedule();
  schedule->set_type(c.schedule.type);
  schedule->set_step(c.schedule.step);
  for (const std::uint64_t at : c.schedule.steps) schedule->add_steps(at);
  schedule->set_factor(c.schedule.factor);
  schedule->set_stop_factor_lr(c.schedule.stop_factor_lr);
  schedule->set_max_update(c.schedule.max_update);
  schedule->set_final_lr(c.schedule.final_lr);
  schedule->set_warmup_steps(c.schedule.warmup_steps);
  schedule->set_warmup_begin_lr(c.schedule.warmup_begin_lr);
}

// Serializes `request`'s body into `encoded`, reusing its memory.
void EncodeBodyInto(const Request& request, std::string& encoded) {
  // The body lives in an arena whose first block is on this stack: a request of a few dozen
  // keys is encoded without touching the heap (Issue runs this for every message it sends).
  alignas(std::max_align_t) std::byte first_block[kEncodeArenaBytes];
  google::protobuf::ArenaOptions options;
  options.initial_block = reinterpret_cast<char*>(first_block);
  options.initial_block_size = sizeof(first_block);
  google::protobuf::Arena arena(options);
  pb::KVBody& body = *google::protobuf::Arena::CreateMessage<pb::KVBody>(&arena);
  for (const SliceRef& slice : request.slices) {
    body.add_keys(slice.key);
    body.add_offsets(slice.offset);
    body.add_totals(slice.total);
  }
  body.set_sync(request.sync);
  for (const ShmRef& ref : request.shm) {
    auto* out = body.add_shm();
    out->set_slice(ref.slice);
    out->set_segment(ref.segment);
    out->set_offset(ref.offset);
    out->set_bytes(ref.bytes);
    if (ref.owner != kNoNode) out->set_owner(ref.owner);
    if (ref.mirror != kNoNode) out->set_mirror(ref.mirror);
  }
  if (request.command == kShmAttach) {
    auto* attach = body.mutable_attach();
    attach->set_id(request.segment_id);
    attach->set_pid(request.segment.pid);
    attach->set_fd(request.segment.fd);
    attach->set_bytes(request.segment.bytes);
    attach->set_token(request.segment.token);
  }
  if (request.command == kSave || request.command == kLoad) {
    body.set_path(request.path);
    body.set_manifest(request.manifest);
    for (const int rank : request.dead_servers) body.add_dead_servers(rank);
    if (request.command == kLoad) body.set_load_step(static_cast<std::uint32_t>(request.load_step));
  }
  if (request.command == kSetCompression) {
    auto* spec = body.mutable_compression();
    spec->set_type(request.compression.type);
    spec->set_threshold(request.compression.threshold);
    spec->set_pull_type(request.compression.pull_type);
  }
  for (const PullState& pull : request.pulls) {
    body.add_pull_base(pull.base);
    body.add_pull_next(pull.next);
  }
  for (const int home : request.homes) body.add_homes(home);
  for (const std::uint64_t seq : request.seqs) body.add_seqs(seq);
  if (request.command == kReplicate || request.command == kSave || request.command == kLoad ||
      request.command == kCollective || request.command == kStalled) {
    body.set_membership(request.membership);
  }
  if (request.command == kStalled) body.set_stall(request.stall);
  body.set_collectives(request.collectives);
  if (request.command == kCollective) body.set_call(request.call);
  for (const ReplicaOp& op : request.replica_ops) {
    body.add_replica_kinds(static_cast<std::uint32_t>(op.kind));
    body.add_replica_seqs(op.seq);
    body.add_replica_workers(op.worker);
  }
  if (request.command == kSetOptimizer)
    EncodeOptimizer(request.optimizer, *body.mutable_optimizer());
  body.SerializeToString(&encoded);
}

}  // namespace

std::string EncodeBody(const Request& request) {
  std::string body;
  EncodeBodyInto(request, body);
  return body;
}

void FillRequestMessage(const Request& request, int recipient, Message& msg) {
  std::string body = std::move(msg.meta.body);
  msg.meta = Meta{};
  msg.meta.body = std::move(body);
  msg.meta.app_id = kAppId;
  msg.meta.head = request.command;
  msg.meta.recipient = recipient;
  EncodeBodyInto(request, msg.meta.body);
}

Message RequestMessage(const Request& request, int recipient) {
  Message msg;
  FillRequestMessage(request, recipient, msg);
  return msg;
}

RequestDecoder::RequestDecoder() : body_(std::make_unique<pb::KVBody>()) {}
RequestDecoder::~RequestDecoder() = default;

const Request* RequestDecoder::Decode(const Message& msg, std::string* error) {
  if (msg.meta.head < kInit || msg.meta.head > kLastCommand) {
    *error = "unknown KVStore command " + std::to_string(msg.meta.head);
    return nullptr;
  }
  // Parsing clears the body first but keeps the memory of its repeated fields.
  pb::KVBody& body = *body_;
  if (!body.ParseFromString(msg.meta.body)) {
    *error = "malformed KVStore request body";
    return nullptr;
  }
  Request& request = request_;
  ClearRequest(request);
  request.membership = body.membership();
  request.collectives = body.collectives();
  request.stall = body.stall();
  request.command = static_cast<Command>(msg.meta.head);
  request.sync = body.sync();
  if (!DecodeSlices(body, request, msg.data, error) || !DecodeShm(body, request, msg.data, error) ||
      !DecodePulls(body, request, error) || !DecodeReplication(body, request, msg.data, error) ||
      !DecodeCheckpoint(body, request, error)) {
    return nullptr;
  }
  if (request.command == kShmAttach) {
    const auto& attach = body.attach();
    request.segment_id = attach.id();
    request.segment =
        SharedSegment::Descriptor{attach.pid(), attach.fd(), attach.bytes(), attach.token()};
  }
  if (request.command == kCollective) {
    if (body.call().size() > kMaxCallBytes) {
      *error =
          "a Collective request's call is longer than " + std::to_string(kMaxCallBytes) + " bytes";
      return nullptr;
    }
    request.call = body.call();
  }
  if (request.command == kSetCompression) {
    const auto& spec = body.compression();
    request.compression.type = spec.type();
    request.compression.threshold = spec.threshold();
    request.compression.pull_type = spec.pull_type();
  }
  if (request.command == kSetOptimizer &&
      !DecodeOptimizer(body.optimizer(), request.optimizer, error)) {
    return nullptr;
  }
  return &request;
}

void AttachReplicaStates(Request& request, Message& msg) {
  for (ReplicaOp& op : request.replica_ops) {
    auto state = std::make_shared<std::string>(std::move(op.state));
    op.state.clear();
    const auto* bytes = reinterpret_cast<const std::byte*>(state->data());
    const std::size_t size = state->size();
    msg.data.emplace_back(std::move(state), bytes, size, DType::kUInt8);
  }
}

std::optional<Request> DecodeRequest(const Message& msg, std::string* error) {
  RequestDecoder decoder;
  const Request* request = decoder.Decode(msg, error);
  if (request == nullptr) return std::nullopt;
  return *request;
}

}  // namespace ps::kv
