#pragma once
// DistKVStore: the worker side of dist_sync and dist_async.
//
// Push/Pull/PushPull split each call into one message per server (a big key's slices go to
// all servers) and return at once; WaitAll() waits for every outstanding one and throws the
// first error any of them met. Pushed tensors are sent zero-copy from the caller's memory;
// pulled values are copied once, from the received frame into the caller's tensor, on the
// receive thread. Slices of 64 KiB or more on a same-host server go through a shared-memory
// slot instead (ShmSlots; PS_USE_SHM=0 turns this off): copied in before the request is sent,
// copied out when the reply arrives.
//
// Replication (PS_REPLICATION, server_ring.h): each message names its slices' home servers and
// carries this worker's push numbers; a request that failed because its server died is sent
// again, slice by slice, to the servers that now serve those slices (Reroute). The servers
// recognize a push sent twice, so none is applied twice.
//
// Threads: Push/Pull/PushPull/WaitAll/Wait from any thread; Init/SetOptimizer/Barrier are
// collective (one thread per worker). `keys_` is written only by Init.
//
// Its code: dist_kvstore.cc (Init and the data path: planning, sending, replies),
// dist_kvstore_waits.cc (waits and their stall reports), dist_kvstore_collectives.cc (the
// collective calls), dist_kvstore_reroute.cc (the ring after deaths and joins, re-sent
// requests), dist_kvstore_residuals.cc (push residuals in checkpoints).
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <memory_resource>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvstore/checkpoint.h"
#include "kvstore/compression.h"
#include "kvstore/dist/calls_in_progress.h"
#include "kvstore/dist/key_layout.h"
#include "kvstore/dist/kv_protocol.h"
#include "kvstore/dist/server_ring.h"
#include "kvstore/dist/shm_slots.h"
#include "kvstore/dist/slice_compression.h"
#include "kvstore/object_pool.h"
#include "kvstore/staging_pool.h"
#include "ps/kvstore.h"
#include "ps/mutex.h"
#include "ps/runtime.h"
#include "ps/thread_annotations.h"

namespace ps {

class DistKVStore final : public KVStore {
 public:
  // A failed request's kind: a server it waited on died, or its connection was reset (a
  // collective may run again then, RunOverLiveServers), or anything else.
  enum class Failure { kOther, kServerLost, kConnectionReset };

  DistKVStore(std::unique_ptr<Runtime> runtime, bool sync);
  // Waits for outstanding operations (logging their errors) and tells the scheduler this
  // worker finished.
  ~DistKVStore() override;

  void WaitAll() override;
  void Barrier() override;
  void SetOptimizer(const OptimizerConfig& config) override;
  void SetGradientCompression(const GradientCompression& config) override;
  TrafficStats Traffic() const override;
  void ReportFailure(const std::string& why) override;
  void SaveCheckpoint(const std::string& dir) override;
  void LoadCheckpoint(const std::string& dir) override;
  int Rank() const override { return runtime_->rank(); }
  int NumWorkers() const override { return runtime_->num_workers(); }
  std::string Type() const override { return sync_ ? "dist_sync" : "dist_async"; }

 protected:
  void InitImpl(std::span<const Key> keys, std::span<const Tensor> values) override;
  void PushImpl(std::span<const Key> keys, std::span<const Tensor> grads, int priority) override;
  void PullImpl(std::span<const Key> keys, std::span<const Tensor> outs, int priority) override;
  void PushPullImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                    std::span<const Tensor> outs, int priority) override;
  void WaitImpl(std::span<const Key> keys) override;
  void WaitPullsImpl(std::span<const Key> keys) override;

 private:
  struct KeyInfo {
    DType dtype;
    std::size_t size;
    std::vector<KeySlice> slices;
    std::vector<ShmSlot*> slots;  // per slice: its shared-memory slot, or null (frames)
    // Per slice, with gradient compression on and a float32 key (else empty): its residual and
    // its copy for compressed pulls. Such slices never take a shared-memory slot.
    std::vector<std::unique_ptr<SliceCompression>> compression;
    // With replication, per slice: the pushes this worker sent of it (seq_mu_).
    mutable std::vector<std::uint64_t> pushes;
  };
  // Where a pulled slice goes: the caller's tensor and the slice's place in it.
  struct Destination {
    std::byte* data;
    std::size_t bytes;
    Device device;                           // a GPU destination gets a host-to-device copy
    const ShmSlot* slot = nullptr;           // the value arrives here instead of in a frame
    SliceCompression* compressed = nullptr;  // a compressed pull: the slice's copy, and
    kv::PullState pull;                      // the state the reply brings it to
  };

  // Checks the call, then sends one request per server; `sends` / `outs` may be empty. Two
  // steps: PlanKey lays every key's slices out into per-server messages (checking each key
  // first, so a bad call throws before anything is sent), SendPlan sends them wave by wave.
  void Issue(kv::Command command, std::span<const Key> keys, std::span<const Tensor> sends,
             std::span<const Tensor> outs, int priority);

  // One Issue call.
  struct Call {
    kv::Command command;
    std::span<const Key> keys;
    std::span<const Tensor> sends;  // per key: the pushed value (empty for a pull)
    std::span<const Tensor> outs;   // per key: where the pulled value goes (empty for a push)
    int priority;
    std::string op;  // the command's name, for messages
    bool sending;    // push, push+pull or init
    bool receiving;  // pull or push+pull
  };
  // A message Issue builds, with the request it encodes. Pooled: taken for one Issue call and
  // given back when it returns, so the memory of its lists serves the next call.
  struct Draft {
    kv::Request request;
    Message msg;
  };
  // The drafts one Issue call took: given back to the pool when the call returns or throws,
  // emptied of the frames that reference the caller's memory.
  class DraftsTaken {
   public:
    DraftsTaken(ObjectPool<Draft>& pool, std::pmr::memory_resource* arena)
        : pool_(pool), taken_(arena) {}
    ~DraftsTaken();
    DraftsTaken(const DraftsTaken&) = delete;
    DraftsTaken& operator=(const DraftsTaken&) = delete;
    Draft& Take();  // an empty draft

   private:
    ObjectPool<Draft>& pool_;
    std::pmr::vector<Draft*> taken_;
  };
  // A pushed slice that goes through a shared-memory slot: copied in just before its message
  // is sent, so the server already works on one message while the next is copied.
  struct SlotCopy {
    ShmSlot* slot;
    const std::byte* source;  // host memory (a GPU tensor is copied while the call is planned)
  };
  // Where a slice of a message came from, for sending it again (Reroute): its shared-memory
  // slot (or null) and, for a pushed value, the caller's memory it was copied from. The slot
  // itself is no source: a server sums the other workers' gradients into the first one's.
  struct SliceOrigin {
    ShmSlot* slot = nullptr;
    const std::byte* source = nullptr;
    Device device;
  };
  // A pushed slice to encode with gradient compression into its (placeholder) frame, once
  // every key of the call passed its checks.
  struct Encode {
    std::size_t frame;
    SliceCompression* state;
    const float* grad;  // in the memory of `device`
    Device device;
    Key key;
  };
  // A message being planned for one server: at most chunk_bytes of values (a big key's slices
  // travel separately, so servers and this worker work on one while the next is in flight),
  // its frames, and where its pulled slices go. Its lists live in the call's arena.
  struct Outgoing {
    Outgoing(std::pmr::memory_resource* arena, Draft& taken)
        : request(taken.request),
          frames(taken.msg.data),
          draft(&taken),
          destinations(arena),
          copies(arena),
          slots(arena),
          encodes(arena),
          counters(arena),
          origins(arena) {}
    kv::Request& request;       // the draft's
    std::vector<Blob>& frames;  // the draft's message's data
    Draft* draft;
    std::pmr::vector<Destination> destinations;
    std::pmr::vector<SlotCopy> copies;
    std::pmr::vector<ShmSlot*> slots;  // owned by this message until its reply
    std::pmr::vector<Encode> encodes;
    // With replication, per slice: its push counter (KeyInfo::pushes) and its origin.
    std::pmr::vector<std::uint64_t*> counters;
    std::pmr::vector<SliceOrigin> origins;
    std::size_t bytes = 0;
  };
  // Per server rank, the messages planned for it in sending order: wave w of a call is every
  // server's w-th message.
  using Plan = std::pmr::map<int, std::pmr::vector<Outgoing>>;
  // Issue's planning step for key `i` of `call` (declared as `info`, an entry of keys_).
  void PlanKey(const Call& call, std::size_t i, const KeyInfo& info, Plan& plan,
               DraftsTaken& drafts) PS_REQUIRES_SHARED(keys_mu_);
  // What a key's frames point into: the caller's memory, or a host copy of a GPU tensor (made
  // only when some slice of it travels as a frame; `owner` then keeps it alive).
  struct SendSource {
    const std::byte* base;
    std::shared_ptr<const void> owner;
    bool staged;
  };
  // PlanKey's step for the value of slice `j` of a key being sent: an encoding, a copy into
  // its shared-memory `slot`, or a frame of `source`.
  void PlanSliceValue(const Call& call, std::size_t i, const KeyInfo& info, std::size_t j,
                      bool compressed, ShmSlot* slot, SendSource& source, Outgoing& target)
      PS_REQUIRES_SHARED(keys_mu_);
  // Issue's sending step: each wave's slot copies and encodings, then its messages.
  void SendPlan(const Call& call, Plan& plan);
  // Gives back the slots of the messages of waves from `from_wave` on: not sent (a throw).
  static void ReleaseUnsent(Plan& plan, std::size_t from_wave);
  // What an in-flight request needs when its replies arrive. Pooled: a request takes one and
  // gives it back with the memory of its lists, so tracking allocates nothing once warm.
  struct Inflight {
    std::vector<int> nodes;                              // per message: the server it went to
    std::vector<std::vector<Destination>> destinations;  // per message: where its values go
    std::vector<ShmSlot*> slots;  // the shared-memory slots the request holds
    std::vector<Key> keys;        // per slice sent: its key (counted in key_ops_)
    bool pulls = false;           // a Pull or PushPull: its keys are counted in key_pulls_ too
    // With replication, for a Push, Pull or PushPull (SendPlan): sent again when its server
    // dies, with what Reroute needs per message.
    bool reroutable = false;
    std::vector<kv::Request> requests;
    std::vector<std::vector<Blob>> frames;
    std::vector<std::vector<SliceOrigin>> origins;  // per slice
  };
  // One message of a request sent again after its server died (Reroute).
  struct ReroutedPart {
    kv::Request request;
    std::vector<Blob> frames;
    std::vector<Destination> destinations;
    std::vector<SliceOrigin> origins;
    int node = kNoNode;  // the server it goes to
    // Times it went again after a reset of its connection: at most kMaxResetRetries, so that
    // a server that resets the connection at every try (no memory for the request's frames)
    // fails the call instead of taking it forever.
    int resets = 0;
  };
  // A request being sent again: done when every part was answered or failed.
  struct Rerouted {
    Mutex mu;
    std::size_t remaining PS_GUARDED_BY(mu) = 0;
    std::string error PS_GUARDED_BY(mu);
    std::vector<ShmSlot*> slots;  // the original request's: retired when it is done
    std::vector<Key> keys;        // the original request's (counted in key_ops_)
    bool pulls = false;           // the original request's
  };
  // An in-flight record from the pool, emptied for a request of `messages` messages.
  Inflight& NewInflight(std::size_t messages);
  // Sends one wave of messages (left whole for the caller to reuse); `inflight` holds each
  // message's destinations and the slots (filled by the caller) and goes back to the pool after
  // the replies. On completion the pulled values are copied to their destinations and the slots
  // freed (or retired, on error).
  void Track(std::span<Message> messages, Inflight& inflight);
  void OnReplies(Inflight& inflight, const RequestResult& result);
  // Copies one response's values to their destinations; "" or what was wrong with it.
  std::string CopyReply(const Message& response, std::span<const Destination> targets);
  // The server rank that serves slices whose home is `home`: the home itself until a server
  // dies, then the one server_ring.h names.
  int OwnerRank(int home);
  // Whether slices of `home` may travel through the shared-memory slots this worker gave the
  // server of that rank: it still serves them and is the server that mapped the slots.
  bool SharesSlotsWith(int home);
  void FollowRing() PS_REQUIRES(ring_mu_);  // applies the server events not yet applied
  // The ranks of the servers not reported dead, and of those reported dead.
  std::vector<int> LiveServerRanks() const;
  std::vector<int> DeadServerRanks() const;
  // Slices of all the keys this worker knows.
  std::uint64_t SliceCount() const;
  // Sends `request` to every live server as one tracked request (the collectives' settings and
  // loads).
  void SendToLiveServers(const kv::Request& request);
  // Sends the messages of a request whose server died, or whose connection was reset
  // (`result`), again, split by the servers that now serve their slices; completes the request
  // when all are answered.
  void Reroute(Inflight& inflight, const RequestResult& result);
  // Splits `part` by its slices' owners now, adds the pieces to `state` and sends them.
  void SendRerouted(const std::shared_ptr<Rerouted>& state, ReroutedPart part);
  // `part` split by the servers that serve its slices now (throws when a GPU value cannot be
  // copied again).
  void SplitRerouted(const ReroutedPart& part, std::map<int, ReroutedPart>& pieces);
  void OnReroutedReply(const std::shared_ptr<Rerouted>& state, const ReroutedPart& part,
                       const RequestResult& result);
  // One part answered (or failed with `error`): the request completes with the last.
  void ReroutedPartDone(const std::shared_ptr<Rerouted>& state, const std::string& error);
  // Undoes a failed Init on the servers: each drops the slices of `keys` it took.
  void Forget(std::span<const Key> keys);
  // Gives the new keys' big slices on same-host servers a shared-memory slot (Init).
  void AttachSlots(std::span<const Key> keys);
  // The server (node id) that should map the slots of the slices whose home is `home` too: its
  // replica, when there is one and it shares this host (kNoNode: none).
  int SlotMirror(int home);
  // With push compression, after SaveCheckpoint / LoadCheckpoint committed or loaded `dir` on
  // every worker: this worker's push residuals to and from `dir` (checkpoint::Residuals;
  // dist_kvstore_residuals.cc). Not collective: each worker writes or reads its own file.
  void SaveResiduals(const std::string& dir);
  void LoadResiduals(const std::string& dir);
  // This worker's residual file in `dir` if this job can use it; else nullopt, and `why_not`
  // says why (no file, another save's, other compression, unreadable).
  std::optional<checkpoint::Residuals> ReadUsableResiduals(const std::string& dir,
                                                           std::string& why_not);
  // Sets every compressed slice's residual to its part of `from`'s saved key, or zero (a null
  // `from`: all; keys it lacks or holds at another size, which it returns). With a saved one it
  // may throw (std::bad_alloc) part-way: the caller then calls it with null, which allocates
  // nothing, so that no slice keeps a mix.
  std::vector<Key> ImportResiduals(const checkpoint::Residuals* from);
  // Gives a key's slices (`info`, an entry of keys_) their compression state when compression_
  // is on (Init, and SetGradientCompression for the keys already there).
  void AttachCompression(KeyInfo& info) PS_REQUIRES(keys_mu_);
  // One request is done, with `error` ("" for success) of kind `failure` (a server it waited
  // on died, or its connection was reset: RunOverLiveServers may run the call again) and
  // `error_kind` (the server's, for the exception WaitAll throws).
  // `keys`: its slices'; `pulls`: whether it was a Pull or PushPull.
  void Complete(const std::string& error, Failure failure, std::span<const Key> keys, bool pulls,
                ErrorKind error_kind = ErrorKind::kOther);
  // WaitAll and Wait: returns once `done()` (called with ops_mu_ held) is true, first polling
  // `poll()` (the same test, called without the lock); then throws the first error reported
  // since the last wait. `keys`: those Wait waits for (empty: WaitAll).
  template <typename Done, typename Poll>
  void WaitUntil(Done done, Poll poll, std::span<const Key> keys);
  // Logs that a dist_sync wait for `keys` (none: every key) has lasted `waited`.
  void NoteLongWait(std::chrono::steady_clock::duration waited, std::span<const Key> keys) const;
  // Wait and WaitPulls: until no request (`pulls`: no Pull or PushPull) of any of `keys` is in
  // flight.
  void WaitForKeys(std::span<const Key> keys, bool pulls);
  // What must hold still while a stall is reported: the server deaths and joins applied, and
  // the connection resets (both send pushes again, which must be in before the notice).
  struct StallGate {
    std::size_t server_events = 0;
    std::uint64_t resets = 0;
    friend bool operator==(const StallGate&, const StallGate&) = default;
  };
  StallGate Gate() const;
  // A stall being reported, shared by the waiting thread and the callback of its notices.
  struct StallReport {
    explicit StallReport(std::thread::id waiter) : thread(waiter) {}
    const std::thread::id thread;  // the waiting one
    Mutex mu;
    // The wait's number while OnlyCallerPushes (0: none yet); its notices carry it.
    std::uint64_t alone_stall PS_GUARDED_BY(mu) = 0;
    bool waiting PS_GUARDED_BY(mu) = true;    // until the wait ends
    bool reported PS_GUARDED_BY(mu) = false;  // the scheduler was told (Runtime::ReportStall)
  };
  // dist_sync, a wait for `keys` (empty: all) that lasts: every live server hears that this
  // worker stalls (kStalled, behind every push it sent); once all answered, while `report`
  // still waits, `gate` held still and no push contradicts the stall, the scheduler hears it
  // too. When OnlyCallerPushes, no push of this worker can come before the wait ends, and the
  // scheduler ends the job when stalled workers wait for each other's pushes; otherwise
  // another thread may still push, and it suspects a deadlock (StallOfThreads,
  // scheduler/src/deadlock_watch.h). Never blocks the waiting thread.
  void ReportStall(std::span<const Key> keys, const StallGate& gate,
                   const std::shared_ptr<StallReport>& report, bool in_vote) noexcept;
  // A wait of one thread that lasts (WaitUntil; a collective's vote, `in_vote`, for `keys`
  // empty): Tick each time it lasted another gap, without this store's locks; End once over.
  class WaitStall {
   public:
    WaitStall(DistKVStore& store, std::span<const Key> keys, bool in_vote);
    WaitStall(const WaitStall&) = delete;
    WaitStall& operator=(const WaitStall&) = delete;
    ~WaitStall() { End(); }
    // Reports the stall (made at the first), if the gate held still since the last tick.
    void Tick();
    void End();

   private:
    DistKVStore& store_;
    const std::span<const Key> keys_;
    const bool in_vote_;
    StallGate gate_;
    std::shared_ptr<StallReport> report_;  // made at the first report
  };
  // The stall number of a worker whose pushes come from several threads: the same for every
  // wait until a push begins (push_count_). Returns it and the count it stands for.
  std::pair<std::uint64_t, std::uint64_t> StallOfThreads() PS_EXCLUDES(stall_mu_);
  // A push begins, or was sent: a stall reported before no longer holds.
  void CountPush();
  // A collective call: every worker states `call` (the call and its arguments, as text) or the
  // error its own checks found (`local_error`); only when all agree does rank 0 run `work`,
  // whose outcome every worker then shares. Ranks that disagree, or one that fails, make the
  // call throw on every rank; none is left waiting. With replication, `work` runs again when a
  // server died during it (RunOverLiveServers); `undo` runs when it failed for good.
  void Collective(std::string_view op, const std::string& call, const std::string& local_error,
                  const std::function<void()>& work, const std::function<void()>& undo = {});
  // Runs `work` and waits for its requests. When it failed while servers died and, with
  // replication, live ones took their ranges over, runs it again on those: once per server
  // lost at most; and, with replication, when a connection reset during it (Runtime's
  // connection_reset_count moved), up to kMaxResetRetries times. Every collective's work may
  // run twice: settings are set again, files written again, and a server answers an Init of
  // the values it already holds.
  void RunOverLiveServers(std::string_view op, const std::function<void()>& work);
  static constexpr int kMaxResetRetries = 8;
  // Runtime::Agree among the workers, counted in collectives_entered_. In dist_sync, when
  // OnlyCallerPushes, the servers hear first that this worker enters a collective
  // (kCollective; every push it sent before is then in), so that a round that waits for its
  // push, which cannot come before the collective ends, fails naming both instead of hanging:
  // the workers pushed a key unequally often (kv_server.h, in_collective_).
  void AgreeAmongWorkers(const std::string& call, const std::string& failure,
                         ErrorKind failure_kind = ErrorKind::kOther);
  // Sends kCollective to every live server and counts the collective, both under seq_mu_;
  // returns "" or the first refusal (a round found waiting).
  std::string AnnounceCollective(const std::string& call);
  // Whether every push of this worker so far came from the calling thread (or none came):
  // only then can no push be on its way, or about to go, while this thread is in a collective.
  // Workers whose pushes come from other threads are not checked (a collective would fail
  // whenever it overtook one of their pushes).
  bool OnlyCallerPushes() const;
  // Held by a collective call (Barrier, Collective): a second one on another thread of this
  // worker throws instead of voting out of turn.
  class OneCollective {
   public:
    OneCollective(std::atomic<bool>& running, std::string_view op);
    ~OneCollective();
    OneCollective(const OneCollective&) = delete;
    OneCollective& operator=(const OneCollective&) = delete;

   private:
    std::atomic<bool>& running_;
  };
  // Throws, naming `op`, once ReportFailure was called: the scheduler has ended the job, and
  // a call would wait for nodes that no longer answer.
  void RefuseAfterFailure(std::string_view op) const;
  // Counts the calling thread as in call `op` (every public call holds one), or throws once the
  // destructor began.
  CallsInProgress::Call EnterCall(std::string_view op);
  // The destructor's last step before members go: calls of other threads still in progress
  // fail (the runtime fails, which wakes their waits) and are waited for, within a bound.
  void EndCallsInProgress();
  // Tells the scheduler this worker is done, with `failure` ("" for success), once.
  void ReportFinished(const std::string& failure);
  // Throws a failure of the job's (a failed operation or collective) to the program, keeping
  // its text for the destructor: a program that leaves the store through an exception then
  // tells the other nodes the last such error, not only that it left.
  [[noreturn]] void Raise(ErrorKind kind, const std::string& error,
                          Failure failure = Failure::kOther);

  CallsInProgress calls_;  // threads inside a public call (EnterCall)
  // Declared before runtime_: destroyed after its threads, which copy out of slots and use
  // the in-flight records, stop.
  ShmSlots shm_;
  ObjectPool<Inflight> inflights_;
  ObjectPool<Draft> drafts_;
  std::unique_ptr<Runtime> runtime_;
  const bool sync_;
  const bool replicated_;  // ClusterConfig::replicated()
  const KeyLayout layout_;
  const SegmentLimit segment_limit_;  // PS_SHM_MAX_SEGMENTS: the most segments shm_ maps
  // Held while push numbers are given out and their messages sent, so that a slice's pushes
  // leave in the order of their numbers.
  Mutex seq_mu_;
  // The server ring after the first `ring_events_` server deaths and joins (OwnerRank).
  Mutex ring_mu_;
  ServerRing ring_ PS_GUARDED_BY(ring_mu_);
  std::size_t ring_events_ PS_GUARDED_BY(ring_mu_) = 0;

  mutable SharedMutex keys_mu_;
  std::unordered_map<Key, KeyInfo> keys_ PS_GUARDED_BY(keys_mu_);
  bool optimizer_set_ = false;         // collective calls only
  compression::Settings compression_;  // set by a collective call, before any push
  // LoadResiduals restored saved residuals (that another SetGradientCompression would drop).
  // Touched only by collective calls, on the thread that makes them.
  bool residuals_loaded_ = false;
  std::atomic<bool> pushed_{false};  // a Push or PushPull was issued
  // Worker-group collectives entered (AgreeAmongWorkers), stamped on dist_sync pushes; in
  // dist_sync changed under seq_mu_, so that a push's stamp tells on which side of each
  // collective it was sent.
  std::atomic<std::uint64_t> collectives_entered_{0};
  // The thread that pushed first, and whether another thread pushed since (OnlyCallerPushes).
  std::atomic<std::thread::id> pusher_{};
  std::atomic<bool> several_pushers_{false};
  std::atomic<bool> collective_running_{false};  // OneCollective
  std::atomic<std::uint64_t> stalls_{0};         // ReportStall's numbers
  // Bumped as each push (not Init) begins and again once it was sent (CountPush).
  std::atomic<std::uint64_t> push_count_{0};
  std::atomic<int> stalled_waiters_{0};  // waits that made a StallReport and go on
  struct ThreadsStall {
    std::uint64_t number = 0;      // 0: none yet
    std::uint64_t push_count = 0;  // push_count_ when it was taken
  };
  Mutex stall_mu_;
  ThreadsStall threads_stall_ PS_GUARDED_BY(stall_mu_);  // StallOfThreads
  std::atomic<bool> finished_{false};  // the scheduler was told this worker is done
  Mutex raised_mu_;
  std::string last_raised_ PS_GUARDED_BY(raised_mu_);  // Raise
  std::vector<bool> shm_servers_;  // collective calls only: per server rank, slots on

  // The owner of frames that reference the caller's memory: a token marking them borrowed
  // (the buffer lifetime rule keeps the memory valid), shared by all of them.
  const std::shared_ptr<const void> borrowed_ = std::make_shared<int>(0);
  // Page-locked host copies of GPU tensors sent in frames (owned by the frames once sent).
  const std::shared_ptr<StagingPool> staging_ = StagingPool::Create();

  Mutex ops_mu_;
  CondVar ops_done_;
  // Changed only under ops_mu_ (so the condition variable sees every change); atomic so that
  // WaitAll can poll it without the lock while it spins.
  std::atomic<std::size_t> outstanding_{0};
  // Whether the last WaitAll that had to wait finished within PS_WAIT_SPIN_US (see WaitAll).
  std::atomic<bool> last_wait_short_{true};
  // Per key: the requests in flight with a slice of it (Wait). Entries stay at 0, so a warm
  // store allocates nothing here.
  std::unordered_map<Key, std::size_t> key_ops_ PS_GUARDED_BY(ops_mu_);
  // Per key: the Pull and PushPull requests among those (WaitPulls).
  std::unordered_map<Key, std::size_t> key_pulls_ PS_GUARDED_BY(ops_mu_);
  // An operation's failure, until a wait throws it.
  struct FailedOp {
    std::uint64_t number = 0;  // in order of failure; one per failed operation
    std::string error;
    Failure failure = Failure::kOther;
    ErrorKind kind = ErrorKind::kOther;  // as its sender said
  };
  // The first failure no wait has thrown yet, whatever its keys: the next wait of any kind
  // throws it (as MXNet's engine does at WaitAll).
  std::shared_ptr<const FailedOp> first_failed_ PS_GUARDED_BY(ops_mu_);
  // Per key, the first failure of an operation on it that no wait has thrown yet: a Wait on
  // that key throws it even after another wait threw first_failed_, so no wait for a key
  // whose operation failed returns as if its buffer were written. At most one per key; the
  // keys of one operation share its record.
  std::unordered_map<Key, std::shared_ptr<const FailedOp>> failed_keys_ PS_GUARDED_BY(ops_mu_);
  std::uint64_t failed_ops_ PS_GUARDED_BY(ops_mu_) = 0;
  // The failure a wait for `keys` (empty: WaitAll) throws, taken out of what is kept: a
  // failure of one of `keys` first, else first_failed_. WaitAll takes every failure kept and
  // names how many more there were.
  std::optional<FailedOp> TakeFailure(std::span<const Key> keys) PS_REQUIRES(ops_mu_);
};

}  // namespace ps
