#pragma once
// Runtime: one server or worker node of a job. Start() binds a receive socket, registers with
// the scheduler and returns once the node table has arrived; from then on the node can send
// requests to its peers, answer theirs, run barriers, and learns when peers die or the job ends.
//
// There is no process-wide state: a test may run several Runtimes (and a Scheduler) in one
// process. Destroying a Runtime stops and joins its threads.
//
// Threads: the receive thread runs the request handler and request callbacks; a timer thread
// sends heartbeats and expires overdue requests. Every public method is safe from any thread
// except where noted.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ps/config.h"
#include "ps/message.h"
#include "ps/mutex.h"
#include "ps/pause_watch.h"
#include "ps/request_tracker.h"
#include "ps/thread_annotations.h"

namespace ps {

class ZmqTransport;
class ReceiveLoop;
class PeriodicTask;

class Runtime {
 public:
  // Throws ps::Error when the scheduler cannot be reached within config.register_timeout, when
  // the scheduler refuses this node, or on a bad address or port.
  static std::unique_ptr<Runtime> Start(const ClusterConfig& config);
  // Only Start() can make the key, so only Start() constructs a Runtime.
  class StartKey {
    friend class Runtime;
    StartKey() = default;
  };
  Runtime(StartKey, const ClusterConfig& config);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // --- identity (fixed after Start) ---
  int id() const { return self_.id; }
  Role role() const { return self_.role; }
  int rank() const { return self_.rank; }
  int num_servers() const { return config_.num_servers; }
  int num_workers() const { return config_.num_workers; }
  const ClusterConfig& config() const { return config_; }
  // Every node of the job so far, indexed by id: the ones it started with, then the servers
  // that took dead ones' ranks (NODE_JOINED), in the order they joined.
  std::span<const NodeInfo> nodes() const;
  // The node id of the server with that rank: the last one that took it, when a server took a
  // dead one's place.
  int ServerId(int rank) const;
  int WorkerId(int rank) const;
  // The servers that died, and those that took a dead one's rank, in the order the scheduler
  // reported them (the same on every node): ServerRing's input.
  struct ServerEvent {
    int rank = -1;
    int node_id = kNoNode;
    bool joined = false;  // else died
  };
  std::vector<ServerEvent> ServerEvents(std::size_t from = 0) const;
  std::size_t server_event_count() const { return server_event_count_.load(); }
  // Waits until this node has heard of more than `count` server deaths and joins, the job
  // ended, or `limit` passed; whether it heard of more.
  bool AwaitServerEventsBeyond(std::size_t count, std::chrono::milliseconds limit);
  // The server deaths and joins whose requests waiting on the servers concerned have failed and
  // whose peer handler has run (server_event_count() is raised before): a KVStore request sent
  // with this count is behind every request a failure callback sent again to another server.
  std::size_t server_events_applied() const { return server_events_applied_.load(); }
  // Whether the scheduler reported `node_id` dead (set before the requests waiting on it fail
  // and before the peer handler hears of it), and how many nodes it reported so far.
  bool IsDead(int node_id) const;
  // True from the moment this node's connection to `node_id` closes until both have acted on
  // its reset (Runtime::PeerEvent::kReset): an error answer from the peer meanwhile may be
  // about a message lost with the old connection (a replica that missed an update).
  bool ConnectionResetPending(int node_id);
  std::size_t dead_count() const { return dead_count_.load(); }
  // Connection resets this node acted on so far (OnConnectionReset), both sides' notices counted.
  std::uint64_t connection_reset_count() const { return connection_resets_.load(); }
  // "worker 1 (node 5 at 127.0.0.1:4321)", or "node N" for an unknown id.
  std::string Describe(int node_id) const;

  // --- barriers ---
  // Blocks until every node of `groups` (kWorkerGroup, kServerGroup, ...) has called Barrier.
  // Throws ps::Error when a member died, the node failed, or `timeout` passed.
  void Barrier(int groups, std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // A barrier at which each member states what it is about to do (`vote`: a collective call and
  // its arguments) or a failure it met (`failure`, non-empty). Returns once every member of
  // `groups` arrived with the same vote and none failed; otherwise throws ps::Error on every
  // member, naming the members that failed and why, or each distinct vote and who gave it. So
  // a collective whose ranks disagree fails everywhere instead of leaving some waiting.
  // `stalled`, if given, is called by the waiting thread (no lock held) when the wait has
  // lasted kStallReportAfter, then after twice as long each time, at most kMaxStallReportGap.
  // The exception is the one of the failure's kind: DisagreementError when the votes differ,
  // the members' own (`failure_kind`) when every member that failed gave the same kind.
  void Agree(int groups, const std::string& vote, const std::string& failure = "",
             const std::function<void()>& stalled = {}, ErrorKind failure_kind = ErrorKind::kOther);
  // The suffix of a collective's second vote: after every worker agreed on the call, one of
  // them (rank 0) does its work and the others wait for the outcome, voted as the call plus
  // this. The scheduler's long-wait note tells such a wait (a worker inside the call) apart
  // from one for a worker that has not entered it.
  static constexpr std::string_view kOutcomeVoteSuffix = " (outcome)";
  // A vote too long to send whole is cut, then goes on with this, a summary of the whole and
  // its fingerprint ("... (2500 keys of 10000 elements in all; fingerprint 1234abcd...)"), so
  // that the scheduler tells two votes that differ past the cut from two that differ where it
  // shows them.
  static constexpr std::string_view kVoteCutMarker = "... (";
  // How long a wait lasts before a worker reports it as a stall (ReportStall), then between
  // its reports while it lasts: twice as long each time, at most kMaxStallReportGap.
  static constexpr auto kStallReportAfter = std::chrono::seconds(1);
  static constexpr auto kMaxStallReportGap = std::chrono::seconds(8);
  // When a wait that began at `start` is reported next, on that schedule. Owned by the waiting
  // thread.
  class StallSchedule {
   public:
    using Clock = std::chrono::steady_clock;
    explicit StallSchedule(Clock::time_point start) : next_(start + kStallReportAfter) {}
    Clock::time_point next() const { return next_; }
    // A report went out now: the next one waits twice as long as the last gap.
    void Reported() {
      gap_ = std::min<Clock::duration>(2 * gap_, kMaxStallReportGap);
      next_ = Clock::now() + gap_;
    }

   private:
    Clock::duration gap_ = kStallReportAfter;
    Clock::time_point next_;
  };

  // --- application messages ---
  using RequestHandler = std::function<void(Message&&)>;
  // Receives every application request, on the receive thread. Requests that arrive before a
  // handler is set are held and delivered, in order, when it is set.
  void SetRequestHandler(RequestHandler handler);
  enum class PeerEvent { kDead, kFinished, kJoined, kReset };
  using PeerHandler = std::function<void(const NodeInfo& peer, PeerEvent event)>;
  // Called on the receive thread when the scheduler reports a node dead, a server that took a
  // dead one's rank, or (to servers) a worker finished; and when a connection between this
  // node and a live peer was reset (kReset: messages between the two may have been lost; the
  // requests waiting on the peer have failed with RequestResult::peer_reset just before).
  // Events reported before a handler is set are held and delivered, in order, by
  // SetPeerHandler on its caller's thread.
  void SetPeerHandler(PeerHandler handler);

  // Sends each message (to its meta.recipient) as one request with a shared timestamp and calls
  // `callback` once every recipient answered, or with an error as soon as one fails or dies.
  // The messages are left whole (only their sender, request flag and timestamp are set), so a
  // caller may reuse them and the memory they hold.
  std::uint64_t Request(std::span<Message> messages, RequestTracker::Callback callback,
                        std::optional<RequestTracker::Clock::time_point> deadline = std::nullopt);
  // Request(), blocking until every recipient answered, one failed, or `deadline` passes.
  RequestResult RequestAndWait(
      std::span<Message> messages,
      std::optional<RequestTracker::Clock::time_point> deadline = std::nullopt);
  RequestResult RequestAndWait(
      Message message, std::optional<RequestTracker::Clock::time_point> deadline = std::nullopt) {
    return RequestAndWait(std::span<Message>(&message, 1), deadline);
  }
  // Answers `request` with `response` (same app, customer and timestamp).
  void Reply(const Meta& request, Message response);
  // The same, leaving `response` to its caller: a server that answers through one Message
  // again and again reuses the memory of its lists.
  void ReplyWith(const Meta& request, Message& response);
  // Answers `request` with an error the requester's callback will see.
  void ReplyError(const Meta& request, const std::string& error,
                  ErrorKind kind = ErrorKind::kOther);

  // --- workers that wait for each other (dist_sync) ---
  // Worker: a thread waits for dist_sync rounds, and every live server has heard so as stall
  // `number` (from 1, growing). Tells the scheduler, which then asks the servers what their
  // rounds wait for (scheduler/src/deadlock_watch.h). Without `several_threads`, the waiting
  // thread is the only one that pushes and so pushes nothing until the wait ends: the job ends
  // when stalled workers wait for each other. With it, other threads push or wait too, and no
  // push was sent since `number` was taken: the scheduler only suspects a deadlock, and ends
  // the job after PS_STALL_TIMEOUT. EndStall: the wait ended, or a push came. Not from the
  // receive thread.
  void ReportStall(std::uint64_t number, bool several_threads);
  void EndStall() { stall_.store(0); }
  bool stalled() const { return stall_.load() != 0; }
  // Server: the scheduler's probes are answered with what `reporter` returns, called on the
  // receive thread.
  using WaitReporter = std::function<std::vector<WaitEdge>()>;
  void SetWaitReporter(WaitReporter reporter);

  // --- end of the job ---
  // Worker: tells the scheduler this worker is done and waits for its acknowledgement. With a
  // non-empty `failure` the worker reports that it failed, and the scheduler ends the job
  // with an error naming it instead of waiting for a heartbeat timeout.
  void FinishWorker(const std::string& failure = "");
  // Marks this node failed: outstanding requests fail, WaitForTermination returns `why`.
  // Does not tell the scheduler (ReportFailure does).
  void Fail(const std::string& why);
  // Tells the scheduler this node failed and why, so the job ends naming it at once (not when
  // its heartbeats stop). Waits a few seconds at most for the acknowledgement (none once the
  // node failed: Fail closes it to new requests, and the report goes unacknowledged). Never
  // throws.
  // Not from the receive thread (the acknowledgement arrives there).
  void ReportFailure(const std::string& why);
  // Blocks until the scheduler ends the job (returns "") or the node fails (returns why).
  std::string WaitForTermination();
  // Why this node failed ("" while healthy): lost scheduler, terminated with an error.
  std::string failure() const;
  bool terminated() const;

  // --- long work on the receive thread, or in a collective call ---
  // While a request handler runs, the receive thread reads nothing, the scheduler's heartbeat
  // answers included. A handler that may take long (checkpoint file I/O) holds a SlowWork and
  // calls Progress() whenever it gets something done (a piece of at most a few MiB). While it
  // progresses, the scheduler's silence is not lost contact. Once it has made no progress for
  // PS_HEARTBEAT_TIMEOUT (this process's own pauses not counted: a file system that does not
  // answer), receive_thread_stuck() is true, the node fails naming what the work was doing and
  // tells the scheduler, which ends the job; the process must then exit without waiting for
  // that thread (AwaitSlowWorkEnd). Nested ones count as one.
  // A worker's collective call that does file I/O itself (worker 0 writes or reads a
  // checkpoint's MANIFEST) holds one too, on its caller's thread (SlowWorkThread::kCaller):
  // the other workers wait for that call, so it must not hang the job either. Stuck, it fails
  // the node and the job the same way, but receive_thread_stuck() stays false. One thread at a
  // time holds SlowWorks: the receive thread on servers, the collective's caller on workers.
  enum class SlowWorkThread { kReceive, kCaller };
  class SlowWork {
   public:
    void Progress();
    // What it does from now on ("reading checkpoint file /a/b"), for the message; progress.
    void Doing(std::string what);
    ~SlowWork();
    SlowWork(const SlowWork&) = delete;
    SlowWork& operator=(const SlowWork&) = delete;

   private:
    friend class Runtime;
    explicit SlowWork(Runtime& runtime) : runtime_(runtime) {}
    Runtime& runtime_;
  };
  [[nodiscard]] SlowWork BeginSlowWork(std::string what,
                                       SlowWorkThread thread = SlowWorkThread::kReceive);
  bool receive_thread_stuck() const { return receive_thread_stuck_.load(); }
  // Before a node's objects go (the receive thread is joined): waits until no SlowWork runs,
  // at most `timeout`; false when one still does, and the process must exit without them.
  bool AwaitSlowWorkEnd(std::chrono::milliseconds timeout) PS_EXCLUDES(slow_mu_);
  // Once receive_thread_stuck(): waits until the scheduler, told why, ended the job (its
  // connection closes as it exits), at most `timeout`, so that the news left this process
  // before it exits. False at the timeout.
  bool AwaitSchedulerGone(std::chrono::milliseconds timeout) PS_EXCLUDES(reset_mu_);
  std::size_t dropped_messages() const;
  // Connections turned away for a wrong or missing PS_JOB_SECRET, or another PS_ENCRYPT.
  std::size_t refused_connections() const;
  // Bytes this node's transport sent and received: headers and payload frames (ps-bench's
  // bytes on the wire; KVStore::Traffic).
  std::uint64_t bytes_sent() const;
  std::uint64_t bytes_received() const;
  // Bytes this node's TCP connection to `node_id` holds, not yet sent or not yet acknowledged
  // by the peer's kernel (0 when unknown: over ipc, not connected). Not counted: what ZeroMQ
  // still queues before the kernel, which happens only when the kernel's buffer is full.
  std::uint64_t BytesOnTheWayTo(int node_id) const;
  // The endpoint this node sends to `node_id` through ("ipc://@..." for same-host peers).
  std::string EndpointOf(int node_id) const;
  // True when this node reaches `node_id` over ipc://: same kernel and network namespace, so
  // the two can share memory too.
  bool SameHost(int node_id) const;

 private:
  // Tests: count the requests held for a handler not set yet (test_cluster.cc).
  friend struct RuntimeTestAccess;
  // Registration with the scheduler, in its three steps (the constructing thread, before any
  // other thread of this node runs but the receive loop the second step starts).
  void Register();
  // The registration's error when the scheduler refused this node's job secret.
  std::string RefusedCredentialsError() const;
  // Resolves the scheduler, opens and binds the transport, fills self_ and connects.
  void OpenTransport(std::chrono::steady_clock::time_point deadline);
  // Starts the receive loop and sends the Register request carrying `announced`.
  void AnnounceToScheduler(const NodeInfo& announced);
  // Waits for the node table until `deadline`; throws ps::Error naming why it did not come.
  void AwaitNodeTable(std::chrono::steady_clock::time_point deadline) PS_EXCLUDES(mu_);
  // Why the scheduler has not answered yet, in a sentence: what a TCP probe of its port finds
  // (nothing listens, no answer, or a port that accepts but does not reply).
  // `accepted` (optional): set when the port accepted the probe's connection.
  std::string SchedulerProbe(bool* accepted = nullptr) const;
  // Barrier / Agree: an empty error when released cleanly, else why not and its kind.
  struct BarrierOutcome {
    std::string error;
    ErrorKind kind = ErrorKind::kOther;
  };
  BarrierOutcome VotedBarrier(int groups, const std::string& vote, const std::string& failure,
                              ErrorKind failure_kind,
                              std::optional<std::chrono::milliseconds> timeout,
                              const std::function<void()>& stalled = {});
  // Register's wait for the node table: true once it came, the scheduler refused this node or
  // the job ended.
  bool RegistrationAnswered() const PS_REQUIRES(mu_);
  void OnMessage(Message&& msg) PS_EXCLUDES(mu_);  // receive thread
  void OnControl(Message&& msg) PS_EXCLUDES(mu_);  // receive thread
  void OnWaitProbe(const Meta& meta);              // receive thread
  // The handlers of OnControl's commands, on the receive thread.
  void OnBarrierRelease(const Meta& meta) PS_EXCLUDES(mu_);
  // The scheduler's notice that workers finished.
  void OnWorkerDone(const Meta& meta) PS_EXCLUDES(reset_mu_);
  void OnTerminate(const Meta& meta) PS_EXCLUDES(mu_);
  // The scheduler asks whether this node lives, because another cannot reach it.
  void OnLivenessQuestion(const Meta& meta);
  // A peer (or the scheduler) says a connection with this node was reset.
  void OnResetNotice(const Meta& meta) PS_EXCLUDES(mu_, reset_mu_);
  void OnRegisterReply(const Meta& meta) PS_EXCLUDES(mu_);   // receive thread: Register's answer
  void OnNodeDead(const NodeInfo& dead) PS_EXCLUDES(mu_);    // receive thread
  void OnNodeJoined(const NodeInfo& node) PS_EXCLUDES(mu_);  // receive thread
  // The server that held `node`'s rank before it, if this node does not count it dead yet.
  std::optional<NodeInfo> LiveHolderBefore(const NodeInfo& node) const PS_REQUIRES(mu_);
  // Connects the send socket for `node`: its ipc endpoint when on this host, else TCP. The
  // peer counts as closed (never connected) until the connection completes its handshake.
  void ConnectTo(const NodeInfo& node) PS_EXCLUDES(reset_mu_);
  // The node with id `node_id`, or nullptr: reads the published part of nodes_.
  const NodeInfo* Node(int node_id) const;
  void NotifyPeer(const NodeInfo& peer, PeerEvent event);  // receive thread
  // A connection with the scheduler was reset, so a barrier request, its release or an
  // answer may be lost: sends the barriers threads wait in again (the scheduler answers a
  // request it already released with the release again) and fails the requests to it.
  void OnSchedulerReset(const std::string& why) PS_EXCLUDES(mu_);
  // Sends `msg` to the scheduler and waits until `deadline` for its answer, sending it again
  // after a reset (at most kMaxSchedulerResends times): for requests it may see twice.
  RequestResult RequestSchedulerAndWait(const Message& msg,
                                        RequestTracker::Clock::time_point deadline);
  // The transport's news of a send socket's connection (monitor thread: records only).
  void OnPeerConnection(int node_id, bool connected) PS_EXCLUDES(reset_mu_);
  // The timer's period: the heartbeat interval (or with heartbeats off, 0, often enough for
  // request deadlines to expire on time), but at most a sixth of the heartbeat timeout, so
  // that a pause of this process of half the timeout is seen (pause_watch_) whatever the
  // interval. Heartbeats still go every interval (OnTick).
  static std::chrono::milliseconds TickPeriod(const ClusterConfig& config) {
    const std::chrono::milliseconds period = config.heartbeat_interval.count() > 0
                                                 ? config.heartbeat_interval
                                                 : std::chrono::milliseconds(500);
    return std::min(period, config.heartbeat_timeout / 6);
  }
  // How long the connection to the scheduler has been closed (it was open before), or nullopt
  // while it is open.
  std::optional<std::chrono::milliseconds> SchedulerClosedFor(RequestTracker::Clock::time_point now)
      PS_EXCLUDES(reset_mu_);
  // Tells each peer whose connection came back after a close (timer thread).
  void AnnounceResets() PS_EXCLUDES(reset_mu_);
  // Tells the scheduler of each live peer whose connection has stayed closed, or not opened,
  // for PS_HEARTBEAT_TIMEOUT (timer thread, every tick while it lasts): the scheduler, which
  // hears from the peer, ends the job if it lives (a broken network path).
  void ReportUnreachablePeers(RequestTracker::Clock::time_point now) PS_EXCLUDES(reset_mu_);
  // A connection between this node and `node_id` was reset: fails what waits on it and tells
  // the peer handler (receive thread, on the peer's CONNECTION_RESET or its answer).
  void OnConnectionReset(int node_id);
  void OnTick() PS_EXCLUDES(mu_);  // timer thread
  // OnTick's look at the SlowWork in progress: why the node gives up on it ("" when none, or
  // it progresses), and since when the receive thread has been free to read (now while a
  // SlowWork progresses).
  std::string StuckWork(RequestTracker::Clock::time_point now,
                        RequestTracker::Clock::time_point& reading_since) PS_EXCLUDES(slow_mu_);
  // A SlowWork is stuck in `why`: fails the node (once) and tells the scheduler (every tick,
  // until it ends the job: a message may be lost, and the scheduler takes the first); on the
  // receive thread, receive_thread_stuck() from then on.
  void GiveUpOnStuckWork(const std::string& why) PS_EXCLUDES(slow_mu_);
  bool SendToNode(Message& msg);  // sets msg.meta.sender

  const ClusterConfig config_;
  std::string scheduler_ip_;
  NodeInfo self_;
  // The node table: sized once at registration (the job's nodes plus kMaxRejoins) and never
  // resized, so readers need no lock. Entries below node_count_ are published and never
  // change; the receive thread writes the entry at node_count_ (a joined server), then
  // publishes it by raising the count (release; readers load it with acquire).
  std::vector<NodeInfo> nodes_;
  // Beside each entry of nodes_, written and published with it: the user name a message from
  // that node carries on its connection to this one (ZmqTransport::ExpectedUser).
  std::vector<std::string> expected_users_;
  std::atomic<std::size_t> node_count_{0};
  std::vector<ServerEvent> server_events_ PS_GUARDED_BY(mu_);
  std::atomic<std::size_t> server_event_count_{0};     // server_events_.size()
  std::atomic<std::size_t> server_events_applied_{0};  // receive thread
  std::unique_ptr<ZmqTransport> transport_;
  RequestTracker tracker_;

  mutable Mutex mu_;
  CondVar changed_;                               // signals any change below
  bool acknowledged_ PS_GUARDED_BY(mu_) = false;  // scheduler saw REGISTER
  bool registered_ PS_GUARDED_BY(mu_) = false;
  std::string register_error_ PS_GUARDED_BY(mu_);
  // A barrier a thread waits in (VotedBarrier), by group. Its request's timestamp numbers it
  // (barrier_count_): the release echoes it, so a release sent again for a barrier this node
  // already left is told apart from the next one's.
  struct PendingBarrier {
    Message request;  // sent again after a reset of a connection with the scheduler
    bool released = false;
    std::string error;  // the release's: why the barrier failed, if it did
    ErrorKind error_kind = ErrorKind::kOther;
  };
  std::map<int, PendingBarrier> barriers_ PS_GUARDED_BY(mu_);
  std::uint64_t barrier_count_ PS_GUARDED_BY(mu_) = 0;
  bool terminated_ PS_GUARDED_BY(mu_) = false;
  std::string failure_ PS_GUARDED_BY(mu_);
  std::set<int> dead_ PS_GUARDED_BY(mu_);
  static constexpr std::size_t kMaxHeldMessages = 65536;
  std::vector<Message> held_until_registered_ PS_GUARDED_BY(mu_);  // peers' early messages
  // Messages from ids past the table (a joined server the scheduler has not reported yet).
  static constexpr std::size_t kMaxHeldUntilJoined = 1024;
  std::vector<Message> held_until_joined_ PS_GUARDED_BY(mu_);
  RequestTracker::Clock::time_point last_scheduler_contact_ PS_GUARDED_BY(mu_);
  // The transport's bytes_received() at that contact: what came from other nodes since tells
  // a busy link from a dead one when the scheduler falls silent.
  std::uint64_t received_at_scheduler_contact_ PS_GUARDED_BY(mu_) = 0;
  // Received meanwhile, this much says the link carries the job's data (a heartbeat is ~100 B).
  static constexpr std::uint64_t kBusyLinkBytes = 16 * 1024;
  // OnTick's gaps of half PS_HEARTBEAT_TIMEOUT or more (started with the first scheduler
  // contact, before the timer thread starts; then that thread's alone): this process itself
  // did not run (SIGSTOP, a frozen VM), which explains a lost scheduler better than the
  // network. A message sent before such a pause may still arrive after it and count as contact.
  // Its threshold is half the heartbeat timeout, but never under three ticks: a gap every
  // tick reaches would make every tick a pause.
  PauseWatch pause_watch_{std::max<PauseWatch::Clock::duration>(config_.heartbeat_timeout / 2,
                                                                3 * TickPeriod(config_))};
  // Timer thread only. When OnTick last sent a heartbeat; and when this process resumed from
  // its last pause, if the scheduler may not have declared it dead meanwhile: its silence is
  // judged from then (the scheduler had nothing to answer while this process sent nothing).
  RequestTracker::Clock::time_point last_beat_sent_{};
  RequestTracker::Clock::time_point resumed_at_{};
  // The scheduler declares a node dead within this of its timeout (it checks every 200 ms).
  static constexpr auto kSchedulerJudgesWithin = std::chrono::milliseconds(500);
  // Whether the job ended or this node failed.
  bool Stopped() PS_EXCLUDES(mu_);
  // Fails this node after an exception escaped its receive or timer thread while `doing`.
  void FailOn(const std::string& doing, const std::exception& e) PS_EXCLUDES(mu_);
  // FailOn with a std::exception caught earlier.
  void FailOnThrown(const std::string& doing, std::exception_ptr thrown) PS_EXCLUDES(mu_);
  // Sends the scheduler a failure report (kNodeFailed) that nobody waits for: the scheduler
  // ends the job naming `why`. May throw (out of memory).
  void SendFailureReport(const std::string& why);
  // Why the scheduler, its connection open, sent nothing for a heartbeat timeout, as far as
  // this node's TCP connection to it and its other traffic tell: ": it is stopped ...".
  std::string WhySchedulerIsSilent() PS_EXCLUDES(mu_);
  // Fails this node after its own pause of `pause`, saying `so` of the scheduler's view.
  void FailAfterPause(std::chrono::steady_clock::duration pause, const std::string& so)
      PS_EXCLUDES(mu_);

  std::atomic<std::size_t> dead_count_{0};           // dead_.size(), readable without mu_
  std::atomic<std::size_t> dropped_{0};              // from unknown senders, or unexpected controls
  std::atomic<std::uint64_t> connection_resets_{0};  // counted by OnConnectionReset

  Mutex handler_mu_;  // held while a handler runs, so Set*Handler never races a call
  RequestHandler request_handler_ PS_GUARDED_BY(handler_mu_);
  std::vector<Message> early_requests_ PS_GUARDED_BY(handler_mu_);
  PeerHandler peer_handler_ PS_GUARDED_BY(handler_mu_);
  std::vector<std::pair<NodeInfo, PeerEvent>> early_peer_events_ PS_GUARDED_BY(handler_mu_);
  WaitReporter wait_reporter_ PS_GUARDED_BY(handler_mu_);
  // Worker: the stall ReportStall last reported, until EndStall (0: none); a probe's answer.
  std::atomic<std::uint64_t> stall_{0};

  // Send-socket connections to peers, as the monitor thread reports them: not open yet or
  // closed and not back yet, and back after a close (a reset, unless the peer died) but not yet
  // announced.
  Mutex reset_mu_;
  // A peer's send socket from when it closed, or from when ConnectTo opened it (never_connected)
  // until its first connection: the first is no reset.
  struct ClosedPeer {
    RequestTracker::Clock::time_point since;
    bool never_connected = false;
    bool reported = false;  // to the scheduler as unreachable (logged once)
  };
  std::map<int, ClosedPeer> closed_peers_ PS_GUARDED_BY(reset_mu_);
  std::set<int> finished_peers_ PS_GUARDED_BY(reset_mu_);  // workers done (servers hear of it)
  CondVar peer_closed_;  // a connection closed: AwaitSchedulerGone's
  std::vector<int> reset_peers_ PS_GUARDED_BY(reset_mu_);
  std::set<int> announced_resets_ PS_GUARDED_BY(reset_mu_);  // told, not answered yet

  // The SlowWork in progress, if any (the receive thread's, read by the timer thread).
  struct SlowWorkState {
    std::string what;
    RequestTracker::Clock::time_point progressed;  // its start or last Progress()
    SlowWorkThread thread = SlowWorkThread::kReceive;
  };
  Mutex slow_mu_;
  CondVar slow_work_changed_;  // a SlowWork ended
  std::optional<SlowWorkState> slow_work_ PS_GUARDED_BY(slow_mu_);
  int slow_work_depth_ PS_GUARDED_BY(slow_mu_) = 0;  // nested SlowWorks alive
  RequestTracker::Clock::time_point slow_work_ended_ PS_GUARDED_BY(slow_mu_){};
  std::atomic<bool> receive_thread_stuck_{false};

  // Declared last: destroyed first, so no thread runs while the members above die.
  std::unique_ptr<PeriodicTask> timer_;
  std::unique_ptr<ReceiveLoop> receiver_;
};

}  // namespace ps
