#pragma once
// Scheduler: the node every other node registers with. It waits for DMLC_NUM_SERVER servers
// and DMLC_NUM_WORKER workers, gives each an id and a rank, sends everyone the node table,
// runs barriers, watches heartbeats, and ends the job.
//
// Ranks: within each role, once all have registered, nodes are ranked by (requested rank
// (PS_RANK; none sorts last), host, port), so ranks do not depend on who registered first.
// Ids: 0 is the scheduler; the others are numbered 1, 2, ... in registration order.
//
// Threads: the receive thread handles every message; a timer thread checks heartbeats and the
// registration deadline; Run() waits on the caller's thread; Stop() may come from any thread.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ps/config.h"
#include "ps/message.h"
#include "ps/mutex.h"
#include "ps/pause_watch.h"
#include "ps/thread_annotations.h"

namespace ps {

class ZmqTransport;
class ReceiveLoop;
class DeadlockWatch;
class PeriodicTask;

class Scheduler {
 public:
  // Binds DMLC_PS_ROOT_PORT (0: a free port, see port()). Throws ps::Error when the port is in
  // use or the address is not this machine's.
  explicit Scheduler(const ClusterConfig& config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  int port() const { return port_; }
  // Prints "ps-scheduler: listening on HOST:PORT" (DMLC_PS_ROOT_URI, port()) to stdout and
  // flushes it. tools/launch.py reads this line to learn the port when DMLC_PS_ROOT_PORT=0:
  // the text is a contract, printed by every program that runs the scheduler role.
  void PrintListeningLine() const;
  // A config for a node of this job: this scheduler's address and the job's counts.
  ClusterConfig NodeConfig(Role role) const;

  // Runs the job to its end. Returns 0 when every worker finished and the servers were told to
  // stop; 1 when the job failed (a node died, registration timed out, Stop() was called).
  int Run();
  // Ends the job now with `why` (e.g. on SIGTERM); Run() returns 1.
  void Stop(const std::string& why);
  // Why the job failed; "" when it did not. The scheduler does not log it: Run's caller reports
  // it (ps-scheduler prints one "ps-scheduler: error: ..." line).
  std::string failure() const;
  // Nodes declared dead so far (for tests and the final report).
  std::vector<NodeInfo> dead_nodes() const;
  // Messages dropped (unknown senders, unexpected controls, malformed registrations), and
  // registrations refused or turned away, so far.
  std::uint64_t dropped_messages() const;
  std::uint64_t refused_registrations() const;

 private:
  // Tests: sends a notice of their making to a node, as the scheduler's own (test_cluster.cc).
  friend struct SchedulerTestAccess;
  using Clock = std::chrono::steady_clock;
  void OnMessage(Message&& msg);  // receive thread
  // Validates a register message (RegistrationRefusal), then refuses or admits its node.
  void OnRegister(Message&& msg) PS_REQUIRES(mu_);  // receive thread
  // Why a register message is not admitted, and what its sender is told.
  struct Refusal {
    enum class Answer {
      kDrop,     // malformed: dropped unanswered (dropped_messages)
      kReply,    // the node is told `why` (refused_registrations)
      kNoReply,  // no reply can reach the node's address: only logged (refused_registrations)
    };
    std::string why;
    // The job cannot run as launched (the node disagrees on a shared setting, or the job
    // already failed to start): every node is told why (answer kReply).
    bool ends_job = false;
    Answer answer = Answer::kReply;
  };
  // Every check of a register message, in one place: why it is not admitted, if it is not.
  std::optional<Refusal> RegistrationRefusal(const Message& msg) const PS_REQUIRES(mu_);
  // RegistrationRefusal's check of a node arriving once the job is complete: only a server,
  // with replication on, in the place of a dead one, within the job's rejoin budget.
  std::optional<Refusal> LateJoinRefusal(const NodeInfo& node) const PS_REQUIRES(mu_);
  // Why the node's shared settings (ClusterConfig::SharedSettings) do not fit the job, if
  // they do not.
  std::optional<Refusal> SettingsRefusal(const NodeInfo& node, std::string_view settings) const
      PS_REQUIRES(mu_);
  // The refusal of a node whose settings differ from `earlier`'s: it ends the job, unless
  // `earlier`'s connection closed (it may be gone within kReconnectGrace).
  Refusal AgainstEarlierNode(std::string why, int earlier) const PS_REQUIRES(mu_);
  // Counts and logs why `node` is turned away, tells it when a reply can reach it (kReply),
  // and fails the registration when the refusal ends the job.
  void Refuse(const NodeInfo& node, const Refusal& refusal) PS_REQUIRES(mu_);
  // Gives a validated node its id, connects to it and acknowledges it; sends the table once
  // the job is full.
  void Admit(NodeInfo node, std::string_view settings) PS_REQUIRES(mu_);
  // The job cannot start: tells every registered node why (the first call; a later one keeps
  // the first reason), and ends the job once every expected node has been told (later
  // registrations are refused with the reason) or at the registration deadline.
  void FailRegistration(const std::string& why) PS_REQUIRES(mu_);
  void EndFailedRegistrationOnceAllTold() PS_REQUIRES(mu_);
  void OnBarrier(const Meta& meta) PS_REQUIRES(mu_);
  // A node's ReportFailure, a worker's FinishWorker (with its failure, if any).
  void OnNodeFailed(const Meta& meta) PS_REQUIRES(mu_);
  void OnWorkerDone(const Meta& meta) PS_REQUIRES(mu_);
  void OnTick();  // timer thread
  // A handler that threw (out of memory): the job ends naming it, where the exception would
  // end the process through std::terminate and leave the nodes to find out one timeout later.
  void FailOn(const std::string& doing, const std::exception& e);
  // OnTick's steps. Ends a job that did not fill up within PS_REGISTER_TIMEOUT, naming the
  // missing nodes.
  void EndUnfilledRegistration() PS_REQUIRES(mu_);
  // Declares dead the first live node silent past PS_HEARTBEAT_TIMEOUT, or ends the job when
  // every live node is silent at once (the scheduler's own network is the likelier cause).
  // Sends a node quiet for half the heartbeat timeout a heartbeat answer, once per silence:
  // whether its kernel acknowledges it tells, at the timeout, a stopped process from a path
  // that carries nothing (JudgeSilentNodes, link_state.h).
  void ProbeQuietNodes(Clock::time_point now) PS_REQUIRES(mu_);
  void JudgeSilentNodes(Clock::time_point now) PS_REQUIRES(mu_);
  // The transport's watcher (monitor thread): the connection to node `id` closed or is back.
  // OnTick applies it: a live node whose connection closed is suspected, and declared dead when
  // it is not back within kReconnectGrace (scheduler.cc), long before a heartbeat timeout.
  void OnPeerConnection(int id, bool connected);
  void ApplyConnectionEvents() PS_REQUIRES(mu_);
  // Declares dead the first suspected node whose connection stayed closed too long; true when
  // it did (the job has ended).
  bool DeclareClosedConnectionsDead(Clock::time_point now) PS_REQUIRES(mu_);
  // Before the job filled up: frees the places of the registrants whose connection stayed
  // closed for kReconnectGrace (they exited), for the next of their role to take (Admit).
  void VacateClosedRegistrants(Clock::time_point now) PS_REQUIRES(mu_);
  // Drops a vacated registrant's settings from those the next registrants must match.
  void ForgetSettingsOf(int id) PS_REQUIRES(mu_);
  // Registered nodes that hold a place (not vacated), the scheduler not counted.
  int Registrants() const PS_REQUIRES(mu_) {
    return static_cast<int>(nodes_.size() - 1 - vacated_.size());
  }
  void CompleteRegistration() PS_REQUIRES(mu_);
  // Connects to a registrant's address; throws as ZmqTransport::Connect.
  void ConnectToRegistrant(const NodeInfo& node) PS_REQUIRES(mu_);
  // With replication, a server that registers once the job runs takes the rank of a dead one
  // (DeadServerRank), with a new node id: it gets the table and the job's server deaths and
  // joins so far, and every live node hears of it (NODE_JOINED).
  void AdmitInPlaceOfDead(NodeInfo node) PS_REQUIRES(mu_);
  // `requested` (a rank asked for with PS_RANK) when its last holder is dead, else the lowest
  // such rank, or -1 when every rank has a live server.
  int DeadServerRank(int requested = -1) const PS_REQUIRES(mu_);
  // The id of the last server that took `rank` (kNoNode: none).
  int RankHolder(int rank) const PS_REQUIRES(mu_);
  // A control request to `recipient` about node `about` (NODE_DEAD, NODE_JOINED, WORKER_DONE).
  static Message Notice(Control control, int recipient, const NodeInfo& about);
  void DeclareDead(int id, const std::string& why) PS_REQUIRES(mu_);
  // Why a barrier fails ("": it does not), and as what: kDisagreement when the votes differ,
  // the members' kind when all that failed gave the same one.
  struct Verdict {
    std::string error;
    ErrorKind kind = ErrorKind::kOther;
  };
  void ReleaseBarrier(int group, const Verdict& verdict) PS_REQUIRES(mu_);
  // Fails the barriers in progress of every group that includes node `id`, which died or
  // finished: they can never complete.
  void ReleaseBarriersOf(int id) PS_REQUIRES(mu_);
  // Why node `id`, not live, will never arrive at a barrier.
  std::string WhyAbsent(int id) const PS_REQUIRES(mu_);
  void MaybeFinish() PS_REQUIRES(mu_);
  void Finish(int status, const std::string& why) PS_REQUIRES(mu_);
  void Send(Message msg);
  bool IsLive(int id) const PS_REQUIRES(mu_);
  std::vector<int> GroupMembers(int group) const PS_REQUIRES(mu_);
  std::vector<int> LiveServers() const PS_REQUIRES(mu_);
  // STALLED and WAIT_PROBE answers: dist_sync workers that wait for each other end the job.
  void OnWaitMessage(const Message& msg) PS_REQUIRES(mu_);
  // PEER_UNREACHABLE from a node (Runtime::ReportUnreachablePeers; the request): its
  // connection to a peer has stayed closed, or never opened. Recorded, and the peer asked
  // (PEER_UNREACHABLE to it, with each report until it answers) whether it lives; its answer
  // (the response) is recorded too. EndJobOverUnreachablePeers decides.
  void OnPeerUnreachable(const Message& msg) PS_REQUIRES(mu_);
  // Ends the job, naming both nodes and the network between them, once a reported peer
  // answered and the reporter reported again after the answer: the peer lives and the path
  // between the two is still broken. Reports whose reporter or peer died or finished, or that
  // were not repeated for a heartbeat timeout (the connection came back), are dropped. True:
  // it ended the job.
  bool EndJobOverUnreachablePeers(Clock::time_point now) PS_REQUIRES(mu_);

  const ClusterConfig config_;
  std::unique_ptr<ZmqTransport> transport_;
  int port_ = 0;
  const Clock::time_point started_;

  mutable Mutex mu_;
  CondVar finished_cv_;
  std::vector<NodeInfo> nodes_ PS_GUARDED_BY(mu_);                 // index = id; [0] is us
  std::vector<Clock::time_point> last_seen_ PS_GUARDED_BY(mu_);    // index = id
  std::map<int, Clock::time_point> probed_at_ PS_GUARDED_BY(mu_);  // ProbeQuietNodes's last
  // OnTick's period: heartbeats, deaths and deadlines are checked this often.
  static constexpr auto kTickPeriod = std::chrono::milliseconds(200);
  // OnTick's gaps of half PS_HEARTBEAT_TIMEOUT or more: the scheduler itself did not run
  // (SIGSTOP, a frozen VM), and the heartbeats of that time wait unread. Never under a few
  // ticks (a heartbeat_timeout set in code below PS_HEARTBEAT_TIMEOUT's least): a threshold
  // every tick reaches would hold every judgement off for ever.
  PauseWatch pause_watch_ PS_GUARDED_BY(mu_){
      std::max<PauseWatch::Clock::duration>(config_.heartbeat_timeout / 2, 3 * kTickPeriod)};
  std::vector<int> requested_rank_ PS_GUARDED_BY(mu_);  // index = id; -1: none
  // The first registered server or worker still registered (its id; kNoNode: none) and its
  // shared settings, which the later ones must match (SharedSetting::Among::kDataNodes).
  int first_data_node_ PS_GUARDED_BY(mu_) = kNoNode;
  std::map<std::string, std::string> first_data_node_settings_ PS_GUARDED_BY(mu_);
  // The KVStore type of each registered worker that created one (by id), and the first of them
  // still registered (kNoNode: none), whose type the later ones must match
  // (SharedSetting::Among::kStoreWorkers).
  std::map<int, std::string> store_types_ PS_GUARDED_BY(mu_);
  int first_store_worker_ PS_GUARDED_BY(mu_) = kNoNode;
  std::string registration_failure_ PS_GUARDED_BY(mu_);  // why the job cannot start ("" if it can)
  int told_of_failure_ PS_GUARDED_BY(mu_) = 0;           // nodes told registration_failure_
  bool complete_ PS_GUARDED_BY(mu_) = false;             // the table was sent
  std::set<int> done_ PS_GUARDED_BY(mu_);                // workers that finished
  std::set<int> dead_ PS_GUARDED_BY(mu_);
  // Server deaths and joins in the order they were reported (what a joining server replays).
  struct ServerEvent {
    int node_id;
    bool joined;
  };
  std::vector<ServerEvent> server_events_ PS_GUARDED_BY(mu_);
  int rejoins_ PS_GUARDED_BY(mu_) = 0;  // servers admitted in the place of dead ones
  // Live nodes whose connection closed, and when.
  std::map<int, Clock::time_point> suspected_ PS_GUARDED_BY(mu_);
  // Registrants whose address the scheduler connected to but has not seen the connection
  // open yet (its monitor follows it): a node that sends no heartbeat is then named as one
  // whose advertised address cannot be reached.
  std::set<int> unopened_ PS_GUARDED_BY(mu_);
  // Ids of registrants that exited before the job filled up (VacateClosedRegistrants): not
  // live, and each given to the next registrant of its role, so that a node restarted then (a
  // pod that crash-loops) takes the place of the one that died instead of being refused.
  std::set<int> vacated_ PS_GUARDED_BY(mu_);
  // PEER_UNREACHABLE reports by (reporter, peer): the latest one's arrival and content, and
  // the question to the peer (its timestamp) and when it answered.
  struct UnreachableReport {
    Clock::time_point reported;
    std::uint64_t closed_ms = 0;
    bool never_connected = false;
    std::uint64_t probe = 0;
    std::optional<Clock::time_point> answered;
  };
  std::map<std::pair<int, int>, UnreachableReport> unreachable_ PS_GUARDED_BY(mu_);
  std::uint64_t unreachable_probes_ PS_GUARDED_BY(mu_) = 0;  // numbers the questions
  // What OnPeerConnection reported, for OnTick. A leaf lock (never held while taking mu_ or
  // calling the transport), so the monitor thread never waits for mu_.
  struct ConnectionEvent {
    int id;
    bool connected;
    Clock::time_point at;
  };
  Mutex connection_events_mu_;
  std::vector<ConnectionEvent> connection_events_ PS_GUARDED_BY(connection_events_mu_);
  // A member at a barrier: what it is about to do (its vote) and a failure it met, if any.
  struct BarrierArrival {
    std::string vote;
    std::string error;
    ErrorKind error_kind = ErrorKind::kOther;
    std::uint64_t number = 0;  // the member's count of its barriers: its request's timestamp
    Clock::time_point at{};    // when it arrived
  };
  Verdict BarrierVerdict(const std::map<int, BarrierArrival>& arrived) const PS_REQUIRES(mu_);
  // The live members of `group` that have not arrived at its barrier: what it waits for.
  std::vector<int> AwaitedMembers(int group, const std::map<int, BarrierArrival>& arrived) const
      PS_REQUIRES(mu_);
  std::map<int, std::map<int, BarrierArrival>> barriers_ PS_GUARDED_BY(mu_);  // group -> arrivals
  // A barrier that has waited long for members that are alive but have not entered it (still
  // working, or their program skips the call) is logged, naming them (ClusterConfig's
  // long_wait_note). When each group's barrier in progress was last logged, by group; cleared
  // with it.
  std::map<int, Clock::time_point> barrier_noted_ PS_GUARDED_BY(mu_);
  void NoteLongBarriers(Clock::time_point now) PS_REQUIRES(mu_);
  // The last barrier released for each member of each group, (group, node id) -> its number
  // and verdict: a member whose connection was reset sends its request again, and gets the
  // release again if that barrier has ended.
  struct BarrierRelease {
    std::uint64_t number = 0;
    Verdict verdict;
  };
  std::map<std::pair<int, int>, BarrierRelease> released_ PS_GUARDED_BY(mu_);
  void SendBarrierRelease(int group, int id, const BarrierRelease& release) PS_REQUIRES(mu_);
  // Sends node `id` again what it may have missed while its connection was reset: every server
  // death and join in order, the other deaths and the workers that finished (it ignores what
  // it already heard).
  void SendCatchUp(int id) PS_REQUIRES(mu_);
  int next_reject_id_ PS_GUARDED_BY(mu_) = 1 << 30;  // socket ids for refusals
  std::uint64_t dropped_ PS_GUARDED_BY(mu_) = 0;     // unknown senders, unexpected
  std::uint64_t refused_ PS_GUARDED_BY(mu_) = 0;     // registrations turned away
  bool finished_ PS_GUARDED_BY(mu_) = false;
  int status_ PS_GUARDED_BY(mu_) = 0;
  std::string failure_ PS_GUARDED_BY(mu_);

  // Stalled workers and the probe in progress (deadlock_watch.h).
  std::unique_ptr<DeadlockWatch> deadlocks_ PS_GUARDED_BY(mu_);

  std::unique_ptr<PeriodicTask> timer_;
  std::unique_ptr<ReceiveLoop> receiver_;
};

}  // namespace ps
