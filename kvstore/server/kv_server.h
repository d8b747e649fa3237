#pragma once
// The server side of the key-value store.
//
// KVServerStore keeps the slices of keys that live on this server, merges the workers'
// pushes, applies the optimizer and answers pulls. It runs entirely on the runtime's receive
// thread (requests and peer events arrive there), so it needs no lock.
//
// dist_sync, per slice: pushes are numbered in rounds. Round r closes when every worker has
// pushed once into it; then the optimizer (or, with none, "store the sum") is applied and the
// round's pushes are answered. A worker's second push before its round closed goes into the
// next round. A pull waits for the round of the puller's own latest push, so "pull after push"
// returns the value after that push's round.
// dist_async: each push is applied on arrival.
//
// Replication (PS_REPLICATION, two or more servers; kv_server_replication.cc): each slice
// lives on its primary and on the primary's replica (server_ring.h). The primary sends every
// update it makes (a dist_sync round's sum, a dist_async push, a new slice) to the replica and
// answers the requests it releases only once the replica answered: no acknowledged update
// exists in one place only. A dist_sync round's sum and a dist_async push are applied here as
// soon as they are sent, while the replica applies them too (the waiters they release wait for
// the replica's answer; a plain pull, which acknowledges nothing, sees them at once); the rest
// (an update behind one that could not be applied ahead) is applied once the replica answered.
// Pushes carry their sender's push number, so a push sent again after a server died is
// recognized and never applied twice. When a server dies its replica becomes the primary of
// its ranges, and every range whose copy was lost is copied in full to its new replica.
//
// Values are copy-on-write (shared ownership): a pull's reply frame references the current
// buffer without copying, and an update that finds the buffer still shared writes a fresh one.
// Without an optimizer a closed round's sum becomes the value as it is: the received frame
// that accumulated it is adopted, not copied (payload is copied at most once on the server).
//
// Same-host workers may attach a shared-memory segment (ShmAttach) and then pass slices
// through it: the server reads a pushed gradient in place and writes a reply value back into
// the same place before answering. The worker leaves that memory alone from sending the
// request until the reply arrives.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvstore/checkpoint.h"
#include "kvstore/compression.h"
#include "kvstore/dist/kv_protocol.h"
#include "kvstore/dist/server_ring.h"
#include "kvstore/dist/shm_slots.h"
#include "kvstore/object_pool.h"
#include "kvstore/optimizer.h"
#include "kvstore/shm/shared_segment.h"
#include "ps/config.h"
#include "ps/runtime.h"

namespace ps {

// How the server's messages name a key.
inline std::string KeyText(Key key) { return "key " + std::to_string(key); }

// The error a request gets when this server cannot allocate `bytes` for `what` ("for the value
// this Init stores") of its part of `key`: elements [offset, offset + length) of the key's
// `total`, named when that is not the whole key, as a user knows the key's size, not how the
// servers split it. The request fails; the server and what it stores stay as they were.
std::string OutOfMemory(Key key, std::uint64_t offset, std::uint64_t length, std::uint64_t total,
                        std::size_t bytes, std::string_view what);

class KVServerStore {
 public:
  explicit KVServerStore(Runtime& runtime);
  // Handles one KVStore request (receive thread).
  void OnRequest(Message&& msg);
  // A worker that finished or died can no longer push: rounds waiting on it fail.
  void OnPeer(const NodeInfo& peer, Runtime::PeerEvent event);
  // The scheduler's WAIT_PROBE (receive thread; kv_server_stalls.cc): each stalled worker
  // whose request waits for an open round that another stalled worker has not pushed into.
  std::vector<WaitEdge> StalledWaits() const;

 private:
  using SliceId = std::pair<Key, std::uint64_t>;  // (key, offset)

  // Where a slice's reply value goes instead of a frame: the worker's shared memory.
  struct ShmTarget {
    std::shared_ptr<SharedSegment> segment;  // keeps the mapping while the request waits
    std::byte* data = nullptr;               // null: the value travels as a frame
    std::size_t bytes = 0;
    kv::ShmRef ref;  // as the request named it
  };
  // A request waiting for some of its slices; answered when `remaining` reaches 0, then kept
  // for reuse (with the memory its members hold) by a later request.
  struct Pending {
    Meta request;
    std::size_t remaining = 0;
    bool with_values = false;
    // A plain pull (no push rides on it, no compression state changes with its answer): it
    // acknowledges nothing, so a round's value answers it once this server applied the round,
    // before the replica has (AnswersEarly).
    bool values_only = false;
    std::vector<Blob> values;    // per slice of the request, filled as they resolve
    std::vector<ShmTarget> shm;  // per slice, or empty when no slice uses shared memory
    // Compressed pulls (kv::Request::pulls): per slice, its state and id, or empty when none.
    std::vector<kv::PullState> pulls;
    std::vector<SliceId> pull_ids;
    std::string error;
  };
  struct Waiter {
    Pending* pending;   // from pendings_; in use until answered
    std::size_t index;  // slice index within the request
  };
  struct RoundWaiter {
    std::uint64_t round;  // released when this round closes
    Waiter waiter;
  };
  // A pushed gradient: a received frame (this server's alone) or a view of the pushing
  // worker's shared-memory slot (the worker's again once the push is answered).
  struct Gradient {
    Blob values;
    bool in_shared_memory = false;
    // The worker's slot it lies in (its push, or a round's sum added into rank 0's push), as
    // the push named it with `owner` set to the worker: a replica that maps the slot
    // too (`mirror`) reads the update there. owner kNoNode: not in a worker's slot.
    kv::ShmRef slot;
  };
  // A push's stamp of the worker-group collectives its sender had entered (kv.proto);
  // unknown for a rejected push's marker.
  static constexpr std::uint64_t kUnknownCollectives = ~std::uint64_t{0};
  struct DeferredPush {
    int sender;
    std::uint64_t round;
    Gradient gradient;
    Waiter waiter;
    std::uint64_t collectives = kUnknownCollectives;
  };
  // Compressed pulls: what one worker holds of a slice, as far as this server knows (the
  // value minus what error feedback kept back), and the state the worker named it by.
  struct Mirror {
    std::vector<float> value;
    std::uint64_t state = 0;
  };
  // dist_async with replication: the push numbers of one worker's pushes into a slice that
  // were applied or are under way (all below `next`, and those in `ahead`).
  struct SeenPushes {
    std::uint64_t next = 0;
    std::set<std::uint64_t> ahead;
    bool Contains(std::uint64_t seq) const { return seq < next || ahead.contains(seq); }
    void Add(std::uint64_t seq);
  };
  // An update sent to the replica and applied here when the replica answers, in order (or,
  // `applied`, already: a dist_sync round or a dist_async push whose answers wait for the
  // replica's).
  struct Forward {
    std::uint64_t serial = 0;  // unique on this server: matches the replica's answer
    kv::ReplicaKind kind = kv::ReplicaKind::kRound;
    std::uint64_t seq = 0;        // the round (dist_sync) or push number (dist_async)
    int worker = kNoNode;         // dist_async: the pushing worker
    Gradient gradient;            // what is applied (a round's sum, a push); kept until then
    std::vector<Waiter> waiters;  // answered once it is applied (pushes, Init)
    ShmSlot* slot = nullptr;      // the replica slot it travels through, held until answered
    // A copy to the replica the updates before it went to: their slots, which the replica may
    // still read until it answers this copy (it handles a sender's messages in order). Held
    // until then, and released with this copy's answer (CopyToReplica).
    std::vector<ShmSlot*> held_slots;
    // A round's sum or a push applied to the value when it was sent (CloseRound,
    // ApplyPushesAhead).
    bool applied = false;
    // An applied update that a full copy sent since holds (CopyToReplica): never sent again,
    // done when the copy before it is answered (the copy counts the round or the push too).
    bool in_copy = false;
    // Whether it changes the slice (a round, a push) rather than copying or dropping it.
    bool updates() const {
      return kind != kv::ReplicaKind::kState && kind != kv::ReplicaKind::kForget;
    }
  };
  struct Slice {
    Key key = 0;               // the slice's id (its key in slices_), for messages
    std::uint64_t offset = 0;  // (elements)
    int home = 0;              // the server rank the key layout puts it on (server_ring.h)
    DType dtype = DType::kFloat32;
    std::size_t length = 0;
    std::uint64_t total = 0;
    std::uint64_t state_id = 0;  // optimizer state of this slice
    // The stored value: a buffer this server allocated or a frame it adopted; written only
    // through WritableValue, which copies it first while a reply still references it.
    Blob value;
    // dist_sync rounds.
    std::uint64_t completed = 0;  // rounds closed so far; the open round's number
    // The open round's sum, added up in worker-rank order so that its bits do not depend on
    // the order the pushes arrive in (a round sent again to a new primary after a failover, a
    // job resumed from a checkpoint): rank 0's push's frame (or shared-memory slot), into
    // which ranks 1, 2, ... are added in place as soon as the ranks before them are in.
    Gradient sum;
    int folded = 0;  // ranks 0 .. folded-1 are in `sum`
    // The open round's pushes that came before a lower rank's, until they are added.
    std::vector<std::pair<int, Gradient>> unfolded;
    // The containers below keep their memory from round to round: a steady stream of rounds
    // allocates nothing here.
    std::vector<int> pushed;  // workers in the open round
    // The least collectives stamp of the open round's pushes (kUnknownCollectives: none known).
    std::uint64_t round_collectives = kUnknownCollectives;
    std::map<int, std::uint64_t> last_round;  // worker -> round of its latest push
    std::vector<RoundWaiter> waiters;         // in arrival order
    std::vector<DeferredPush> deferred;       // pushes for rounds after the open one
    // Rounds that cannot complete because a worker's push into them was rejected, with why:
    // their pushes fail and they close without an update (FailRoundsOf).
    std::map<std::uint64_t, std::string> failed_rounds;
    std::map<int, Mirror> mirrors;  // worker node id -> its copy (compressed pulls only)
    // Replication. On a primary: the node holding the copy (kNoNode: none), the updates on
    // their way there, and whether the open dist_sync round is among them (closed, not yet
    // applied: its pushes stay in `pushed` until then).
    int replicated_to = kNoNode;
    // A same-host replica's view of this slice's updates: a slot in this server's segment that
    // the replica maps (null: updates travel as frames).
    ShmSlot* replica_slot = nullptr;
    std::deque<Forward> forwards;
    // The first update applied here while on its way to the replica, or null: a dist_sync
    // round (CloseRound; at most one) or a dist_async push (ApplyPushesAhead; only copies
    // come before it).
    const Forward* AppliedAhead() const {
      const auto it = std::ranges::find_if(forwards, &Forward::applied);
      return it == forwards.end() ? nullptr : &*it;
    }
    Forward* AppliedAhead() { return const_cast<Forward*>(std::as_const(*this).AppliedAhead()); }
    // Resets of the replica's connection with updates on their way since it last answered one
    // (OnServerReset): at most kMaxReplicaResets, then the job ends.
    int replica_resets = 0;
    // The replica's answers that it lacked the state for an update, since it last applied one
    // (OnReplicaLacks; a round a copy carried does not count as applied): at most
    // kMaxReplicaLacks, then the job ends.
    int replica_lacks = 0;
    // Full copies CopyToReplica sent so far: an answer to an update sent before the latest one
    // is about a state that copy replaces. (The first copy, from Init or Load, is not counted:
    // no update is on its way then.)
    std::uint64_t copies = 0;
    bool round_in_flight = false;
    // A copy this server kept for a primary whose replica is now a server that joined: updates
    // from the primary still apply, but it may miss later ones, so it is never served (it is
    // dropped should this server come to serve it) until a full copy refreshes it.
    bool stale = false;
    std::map<int, SeenPushes> seen;  // worker node id -> its pushes (dist_async)
    // Whether a round or a push is in progress: pushes gathered or waiting, waiters, or an
    // update on its way to the replica (copies on their way change nothing here).
    bool updating() const {
      return !pushed.empty() || !waiters.empty() || !deferred.empty() ||
             std::any_of(forwards.begin(), forwards.end(), std::mem_fn(&Forward::updates));
    }
  };

  void HandleInit(const Meta& meta, const kv::Request& request, const std::vector<Blob>& data);
  void HandlePush(const Meta& meta, const kv::Request& request, std::vector<Blob>& data,
                  const std::vector<ShmTarget>& shm);
  void HandlePull(const Meta& meta, const kv::Request& request, const std::vector<ShmTarget>& shm);
  void HandleSetOptimizer(const Meta& meta, const kv::Request& request);
  // Gradient compression (kv_server_compression.cc). The setting may change until the first
  // push; a compressed push's frames are decoded into float32 gradients before it is handled,
  // so rounds and updates never see the codes.
  void HandleSetCompression(const Meta& meta, const kv::Request& request);
  std::string CheckCompressedPush(const kv::SliceRef& ref, const Slice& slice,
                                  const Blob& frame) const;
  std::string CheckCompressedPull(const kv::SliceRef& ref, const Slice& slice,
                                  bool in_shared_memory) const;
  std::string DecodeCompressed(const kv::Request& request, std::vector<Blob>& data);
  // Replaces each compressed-pull slice's value in a reply about to go out with the change
  // since the worker's copy (or the full value when the copy's state is not the mirror's).
  void CompressPullReplies(Pending& pending);
  void HandleForget(const Meta& meta, const kv::Request& request);
  // Whether `slice` is exactly what an Init of `ref` with `value` would store.
  static bool HoldsExactly(const Slice& slice, const kv::SliceRef& ref, const Blob& value);
  // Checkpoints (kv_server_checkpoint.cc): writes this server's file / loads its slices from
  // the files, in the steps of kv::LoadStep.
  void HandleSave(const Meta& meta, const kv::Request& request);
  void HandleLoad(const Meta& meta, const kv::Request& request);
  void StageLoad(const Meta& meta, const kv::Request& request);
  void ApplyLoad(const Meta& meta, const kv::Request& request);
  // "" when no slice has a dist_sync round (or an update on its way to the replica) in
  // progress, else which one does.
  std::string RoundInProgress() const;
  void HandleShmAttach(const Meta& meta, const kv::Request& request);
  // Why this server maps no more shared-memory segments ("" when it may): the peers' it
  // attached and its own for its replicas count against its SegmentLimit.
  std::string SegmentsFull() const;
  // Points the shared-memory slices of a request into the sender's segment: their frames
  // become views of it and `shm` (one entry per slice) says where replies go. "" or why not.
  std::string ResolveShm(int sender, const kv::Request& request, std::vector<Blob>& data,
                         std::vector<ShmTarget>& shm) const;
  // Checks every slice of a request before anything changes; "" when all are fine.
  std::string Validate(const kv::Request& request, const std::vector<Blob>& data,
                       const std::vector<ShmTarget>& shm);
  // Validate's checks of the request as a whole: no slice twice, server ranks in range.
  std::string ValidateLists(const kv::Request& request);
  // Validate's checks of slice `i` against the slice this server holds (or not).
  std::string ValidateSlice(const kv::Request& request, std::size_t i,
                            const std::vector<Blob>& data, const std::vector<ShmTarget>& shm) const;

  // A reply to `meta` waiting on `parts` answers (Resolve, FailWaiter), without values.
  Pending& NewPending(const Meta& meta, std::size_t parts);
  // A reply waiting on the request's slices; answered at once (and null returned) when there
  // are none.
  Pending* StartPending(const Meta& meta, const kv::Request& request, bool with_values,
                        const std::vector<ShmTarget>& shm);
  // A dist_sync push of `sender` was rejected: the rounds of its slices it would have joined
  // fail on every worker, naming it and `why`, instead of waiting for it forever.
  void FailRoundsOf(int sender, const kv::Request& request, const std::string& why);
  // Round `round` of `slice` fails with `failure` (the full text), `sender`'s part in it
  // counted: the others' pushes of that round fail too, at once or when they arrive.
  void FailRound(Slice& slice, int sender, std::uint64_t round, const std::string& failure);
  // A dist_sync worker enters a worker-group collective (kCollective), every push it sent
  // before already in: until the collective ends it pushes nothing, so an open round that
  // waits for its push can never complete. Such rounds fail on every worker, and so does the
  // collective (the reply), instead of both waiting for ever.
  void HandleCollective(const Meta& meta, const kv::Request& request);
  // Fails `slice`'s open round when it waits for `worker`, which is in `entry`'s collective,
  // and holds a push from before that collective; returns why, or "".
  struct CollectiveEntry {
    std::uint64_t number = 0;  // the sender's collectives stamp + 1
    std::string call;
  };
  std::string FailRoundWaitingFor(Slice& slice, int worker, const CollectiveEntry& entry);
  // After a push merged into `slice` with stamp `collectives`: entries of collectives that are
  // over go, and the open round fails if it waits for a worker still in one.
  void CheckCollectives(Slice& slice, std::uint64_t collectives);
  // After a server death or join: the workers send pushes that were on their way to the dead
  // server again, after their announcements, so those say no longer that every push before
  // the collective (or the stall) is in; the collectives in progress are not checked, and the
  // stalls wait for the workers' next reports.
  void ForgetAnnouncements() {
    in_collective_.clear();
    stalled_.clear();
  }
  // A dist_sync worker waits (kStalled, kv_server_stalls.cc): every push it sent before is in
  // (unless it knows of fewer server deaths and joins than this server: then it is ignored),
  // and it pushes nothing until the wait ends. Recorded for StalledWaits until its next push.
  void HandleStalled(const Meta& meta, const kv::Request& request);
  // `waiter` is answered with `why` (once its request has no other slice pending).
  void FailWaiter(const Waiter& waiter, const std::string& why);
  // Adds a push to the open round; a null waiter.pending marks a rejected push's part in it.
  // The sum follows the pushing workers' ranks (FoldInRankOrder).
  void MergeIntoRound(Slice& slice, int sender, const Gradient& gradient, const Waiter& waiter,
                      std::uint64_t collectives = kUnknownCollectives);
  // Adds `gradient`, the push of worker `rank`, to the open round's sum once ranks 0 .. rank-1
  // are in it, and the held pushes that may follow it then.
  void FoldInRankOrder(Slice& slice, int rank, const Gradient& gradient);
  // Adds `gradient` to the open round's sum as the next rank's (the first becomes the sum).
  void AddToRoundSum(Slice& slice, const Gradient& gradient);
  // Drops the open round's sum and the pushes held for it.
  static void DropRoundSum(Slice& slice);
  // Closes the open round once every worker pushed into it (and no earlier round is still
  // on its way to the replica): its update goes to the replica and, when no other update is
  // on its way, is applied here meanwhile; then CommitRound once the replica answered.
  void CloseRound(Slice& slice);
  // Applies a closed round's sum (unless the round failed or `sum` is empty: applied already),
  // answers its waiters, then `replicated` (waiters on the replica's answer), and opens the next
  // round, merging the pushes that waited for it. False when the sum could not be applied (out
  // of memory: its waiters got the error).
  bool CommitRound(Slice& slice, const Gradient& sum, const std::vector<Waiter>& replicated = {});
  // dist_sync: the round a push of `sender` joins (its push number, with replication).
  std::uint64_t RoundOf(const Slice& slice, int sender, const kv::Request& request,
                        std::size_t index) const;
  // dist_sync: whether `sender` already pushed into `round` (a push sent again).
  bool PushedInto(const Slice& slice, int sender, std::uint64_t round) const;

  // Replication (kv_server_replication.cc).
  bool Serves(const Slice& slice) const { return ring_.Primary(slice.home) == runtime_.rank(); }
  // True when the sender of `request` heard of server deaths or joins this server has not
  // (its membership count is higher), or the request names a slice whose primary, as this
  // server sees the job, is another live server. Such requests wait in held_ until
  // this server catches up (ServeHeld).
  bool RoutedAhead(const kv::Request& request) const;
  // Sends `forward` to the slice's replica, or applies it at once when the slice has none.
  void StartForward(Slice& slice, Forward forward);
  void SendForward(const Slice& slice, Forward& forward);
  // Gives the slices `ids` (replicated to the same-host node `to`) slots in a new segment that
  // `to` maps, once it answered (updates go as frames until then).
  void AttachReplicaSlots(const std::vector<SliceId>& ids, int to);
  // An update as SendForward sent it, for its answer.
  struct SentForward {
    SliceId id;
    std::uint64_t serial = 0;  // Forward::serial
    std::uint64_t copies = 0;  // Slice::copies when it was sent
    int to = kNoNode;          // the replica
  };
  // Whether an answer to `sent` is about the slice as it is replicated now: the same replica,
  // and no full copy sent since (which sends the update again).
  static bool AboutCurrentCopy(const Slice& slice, const SentForward& sent) {
    return slice.replicated_to == sent.to && slice.copies == sent.copies;
  }
  void OnForwardReply(const SentForward& sent, const RequestResult& result);
  // The replica applied nothing of `sent`: it lacks the slice or the round before (`why`). It
  // gets the slice in full again, a bounded number of times (kMaxReplicaLacks).
  void OnReplicaLacks(const SentForward& sent, const std::string& why);
  // Does here what the replica did with `forward` (it answered, or the slice has none) and
  // answers its waiters. False when an update could not be applied here (out of memory).
  bool ApplyForward(Slice& slice, Forward& forward);
  // A full copy of `slice` to the node `to`, then the updates still on their way.
  void CopyToReplica(Slice& slice, int to);
  void HandleReplicate(const Meta& meta, const kv::Request& request, std::vector<Blob>& data,
                       const std::vector<ShmTarget>& shm);
  // What a replica made of one op: applied (`why` empty), not applied for want of the state
  // it builds on (`lacks_state`: answered so, and the primary sends a full copy), or refused.
  struct ReplicaVerdict {
    std::string why;
    bool lacks_state = false;
  };
  // `in_shared_memory`: the frame is a view of the primary's segment.
  ReplicaVerdict ApplyReplicaOp(int sender, const kv::SliceRef& ref, const kv::ReplicaOp& op,
                                const Blob& frame, bool in_shared_memory);
  // The state of a slice besides its value and rounds, as a kState op carries it.
  std::string EncodeState(const Slice& slice) const;
  std::string DecodeState(Slice& slice, const std::string& state);
  void OnServerDead(const NodeInfo& peer);
  // Copies each slice this server serves that `needs_copy` selects to the replica `to` in full
  // (CopyToReplica), then offers `to` shared-memory slots for them; returns how many.
  std::size_t CopySlicesTo(int to, const std::function<bool(const Slice&)>& needs_copy);
  // A connection between this server and `peer` was reset: the slices `peer` replicates
  // whose updates were on their way are copied to it again.
  void OnServerReset(const NodeInfo& peer);
  static constexpr int kMaxReplicaResets = 8;
  static constexpr int kMaxReplicaLacks = 8;
  // A server took the rank of a dead one: it may be this server's replica now.
  void OnServerJoined(const NodeInfo& peer);
  // After a death or join: makes the ring's replica of this server its replica, giving every
  // slice it serves that another node mirrored a full copy there, then serves the requests
  // held until this server heard what `cause` says.
  void FollowRing(const std::string& cause);
  void ServeHeld();  // the requests held in held_, again, in order
  // A SetOptimizer or SetCompression call's setting alone, as a kv request body (what
  // optimizer_body_ and compression_body_ hold).
  static std::string SettingBody(const kv::Request& call);
  // Takes the settings a full copy carries where this server has none; false when its
  // optimizer differs from the copy's (a SetOptimizer on its way), whose state then does not
  // apply here. Throws ps::Error on a malformed body.
  bool AdoptSettings(const std::string& optimizer_body, const std::string& compression_body);
  // Applies a round's sum (dist_sync) or one push (dist_async) to the slice's value.
  void ApplyUpdate(Slice& slice, const Gradient& gradient);
  void Resolve(const Waiter& waiter, const Slice& slice);
  // Resolves `waiter` once the replica holds what this server holds of the slice: now, or when
  // the last update or copy on its way there (a copy after a failover) is applied. For what
  // was applied before and is asked for again after a server died.
  void ResolveWhenReplicated(Slice& slice, const Waiter& waiter);
  // Resolves `waiter` once the replica holds what this server applied ahead of it: now, or
  // when the replica answered the first such update (in dist_sync the value is then the
  // replica's; in dist_async later pushes applied ahead may be in it). For pulls served from
  // the current value. A plain pull (AnswersEarly) takes the value as it is at once.
  void ResolveCurrent(Slice& slice, const Waiter& waiter);
  // Whether `waiter` may see a round applied here before the replica answered it: a plain
  // pull. Were this server to die, the workers send the round's pushes, which it never
  // acknowledged, to the new owner, which applies the same round. Pushes (whose answer is the
  // guarantee that the replica holds them) and compressed pulls (whose answer moves the
  // puller's state, which the replica keeps too) wait for the replica.
  static bool AnswersEarly(const Waiter& waiter) {
    return waiter.pending != nullptr && waiter.pending->values_only;
  }
  // dist_async with a replica: applies the pushes on their way there that are not applied yet,
  // in the order they were sent, up to one that cannot be applied now (out of memory).
  void ApplyPushesAhead(Slice& slice);
  // dist_sync: resolves the plain pulls that wait for the round applied here ahead of the
  // replica (CloseRound).
  void ResolveEarlyPulls(Slice& slice);
  void Answer(Pending& pending);
  void FailWaiters(Slice& slice, const std::string& why);
  // The value's bytes, made this slice's alone first (copy-on-write).
  std::byte* WritableValue(Slice& slice);
  // The node `node_id` of the job's table (not the scheduler), or null for any other id.
  const NodeInfo* PeerOf(int node_id) const;

  Runtime& runtime_;
  const int num_workers_;
  // Replication: which server serves which home, the node this server's ranges are copied to
  // (kNoNode: none), and requests that arrived ahead of this server's view (RoutedAhead).
  ServerRing ring_;
  std::uint64_t membership_ = 0;  // server deaths and joins applied to ring_
  int replica_node_ = kNoNode;
  std::uint64_t next_forward_ = 1;
  std::vector<Message> held_;
  // This server's segments for its same-host replicas, by replica node id; on the receive
  // thread. A dead replica's go with it (OnServerDead).
  std::map<int, ShmSlots> replica_shm_;
  // Helper threads for big merges, copies and updates, started once with the store.
  ParallelPool pool_;
  const ParallelOptions parallel_{.pool = &pool_};
  std::map<SliceId, Slice> slices_;
  // A LoadCheckpoint's slices, read and checked (kv::LoadStep::kStage) until worker 0 has this
  // server apply or drop them: each slice's saved value and optimizer state, by id. The next
  // stage replaces it. On the receive thread.
  struct StagedLoad {
    std::string path;
    std::map<SliceId, checkpoint::Index::Slice> slices;
  };
  // Dropped when a server dies or joins (membership_ changes): the slices this server serves,
  // and which replicas hold copies, may differ then, and the apply is refused as none is
  // staged; worker 0 runs the load again on the servers as they are.
  std::optional<StagedLoad> staged_load_;
  std::unique_ptr<Optimizer> optimizer_;
  compression::Settings compression_;  // SetGradientCompression's; none until set
  // The job's optimizer and compression as SettingBody gives them ("" until set): a full copy
  // carries them, for a server that took a dead one's rank and missed the calls that set them.
  std::string optimizer_body_;
  std::string compression_body_;
  bool pushed_ = false;  // a push was accepted: the compression is fixed
  std::uint64_t next_state_id_ = 1;
  // Workers that can no longer push, by node id: who they were and whether they died (cut off)
  // or finished (their missing push is the program's doing).
  struct GoneWorker {
    std::string who;  // NodeInfo::Describe()
    bool died = false;
  };
  std::map<int, GoneWorker> gone_workers_;
  // dist_sync workers in a collective as far as this server knows (HandleCollective), by node
  // id; an entry goes once a push stamped past its collective arrives. On the receive thread.
  std::map<int, CollectiveEntry> in_collective_;
  // dist_sync workers waiting (HandleStalled), by node id: their stall number and the keys
  // they wait for (empty: all). An entry goes with the worker's next push. On the receive
  // thread.
  struct Stall {
    std::uint64_t number = 0;
    bool every_key = false;  // a WaitAll, or a notice that listed no keys
    std::set<Key> keys;      // the keys its notices listed
  };
  std::map<int, Stall> stalled_;
  // (worker node id, segment id) -> the worker's attached shared memory.
  std::map<std::pair<int, std::uint32_t>, std::shared_ptr<SharedSegment>> segments_;
  std::uint64_t refused_segments_ = 0;  // attaches refused past the most segments (logged)
  const SegmentLimit segment_limit_;    // PS_SHM_MAX_SEGMENTS
  // (primary, worker) node ids whose forwarded updates this replica read from the worker's
  // slots: logged once each (PS_VERBOSE 1).
  std::set<std::pair<int, int>> slot_forwards_seen_;
  ObjectPool<Pending> pendings_;  // a Pending is in use until answered
  kv::RequestDecoder decoder_;    // OnRequest's, reused
  std::vector<ShmTarget> shm_;    // OnRequest's, reused
  std::vector<Waiter> ready_;     // FailWaiters', reused
  std::vector<SliceId> seen_;     // Validate's, reused
  std::uint64_t rejected_ = 0;    // requests answered with an error, for log throttling
  Message response_;              // Answer's, reused
  // The slice whose update ApplyUpdate just could not make (out of memory), and the error the
  // waiters that update releases get instead of a value (Resolve). Reset by every ApplyUpdate
  // and every request.
  const Slice* failed_update_ = nullptr;
  std::string failed_update_error_;
  // Replicate ops a replica lacked the state for, on either side: which get a log line.
  std::uint64_t replica_lacks_ = 0;
  // Updates the replica applied and this server could not: which get a log line.
  std::uint64_t replica_undone_ = 0;
};

// Runs the server role: registers, serves the key-value store until the scheduler ends the
// job, and returns the process exit status (0: the job ended normally).
int RunServer(const ClusterConfig& config);

}  // namespace ps
