#include "ps/runtime.h"

#include <glog/logging.h>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <memory_resource>

#include "ps/error.h"
#include "ps/src/glog_or_stderr.h"
#include "ps/src/link_state.h"
#include "ps/src/log_text.h"
#include "ps/src/net_util.h"
#include "ps/src/node_threads.h"
#include "ps/src/wire.h"
#include "ps/src/zmq_transport.h"

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;

// While a node waits to register it says what it waits for this often, so that a pod whose
// scheduler is not up yet, or a wrong port, shows in its log long before PS_REGISTER_TIMEOUT.
constexpr std::chrono::milliseconds kWaitReportEvery{3000};
// The registration wait's probe of the scheduler's port (SchedulerProbe): its answer limit (a
// connect takes a round trip, seconds on a long path), and the round trip past which the path,
// more than a refusal, explains a missing reply.
constexpr std::chrono::milliseconds kSchedulerProbeTimeout{10000};
constexpr std::chrono::milliseconds kSlowRoundTrip{300};

std::string TimeLeft(SteadyClock::time_point deadline) {
  const auto left = std::max(SteadyClock::duration::zero(), deadline - SteadyClock::now());
  return FormatSeconds(std::chrono::duration_cast<std::chrono::milliseconds>(left)) +
         " left of PS_REGISTER_TIMEOUT";
}

// Resolves `host` (the value of variable `what`) until `deadline`, logging the wait.
std::string ResolveWaiting(const std::string& host, const std::string& what,
                           SteadyClock::time_point deadline) {
  return net::ResolveIPv4Until(host, what, deadline, kWaitReportEvery, [&](const std::string& why) {
    PS_LOG(WARNING) << "waiting for " << what << "='" << host << "' to resolve (" << why << "); "
                    << TimeLeft(deadline);
  });
}

// The address this node tells the others: DMLC_NODE_HOST, else DMLC_INTERFACE's address, else
// the local end of the route to the scheduler.
std::string AdvertisedHost(const ClusterConfig& config, const std::string& scheduler_ip,
                           SteadyClock::time_point deadline) {
  if (!config.node_host.empty()) {
    // Peers will connect to this name: a typo fails here, with the variable named.
    ResolveWaiting(config.node_host, "DMLC_NODE_HOST", deadline);
    return config.node_host;
  }
  if (!config.interface.empty()) return net::InterfaceAddress(config.interface);
  return net::RouteSourceAddress(scheduler_ip);
}

// This node's failure report to the scheduler (kNodeFailed), which ends the job naming `why`.
Message FailureReport(const std::string& why) {
  Message report;
  report.meta.control = Control::kNodeFailed;
  report.meta.recipient = kSchedulerId;
  report.meta.error = why;
  return report;
}

}  // namespace

Runtime::Runtime(StartKey, const ClusterConfig& config) : config_(config) {}

std::unique_ptr<Runtime> Runtime::Start(const ClusterConfig& config) {
  if (config.role == Role::kScheduler) {
    throw Error("Runtime::Start is for servers and workers; run the scheduler with ps::Scheduler");
  }
  config.Validate();  // a config filled in by hand, checked as the environment's is
  auto runtime = std::make_unique<Runtime>(StartKey{}, config);
  runtime->Register();
  return runtime;
}

Runtime::~Runtime() {
  if (transport_) {
    transport_->SetPeerWatcher({});  // waits for a call in progress (it uses members)
    transport_->Shutdown();
  }
  receiver_.reset();
  timer_.reset();
  tracker_.FailAll("the node is shutting down");
}

void Runtime::Register() {
  // Every wait of registration, name resolution included, ends at one deadline.
  const auto deadline = SteadyClock::now() + config_.register_timeout;
  OpenTransport(deadline);
  // Everything read from self_ is read before the receive thread starts: that thread rewrites
  // self_ (under mu_) when the node table arrives, and nothing orders this thread's later
  // reads before that write but the network round trip, which is invisible to the memory model.
  const NodeInfo announced = self_;
  AnnounceToScheduler(announced);
  AwaitNodeTable(deadline);
  if (config_.verbose >= 1) {
    PS_LOG(INFO) << "registered as " << self_.Describe() << " in a job of " << config_.num_servers
                 << " server(s) and " << config_.num_workers << " worker(s)";
  }
  // Ticks drive heartbeats and request deadlines; with heartbeats off, deadlines still expire.
  timer_ = std::make_unique<PeriodicTask>(TickPeriod(config_), [this] {
    try {
      OnTick();
    } catch (const std::exception& e) {
      FailOn("checking on the job", e);
    }
  });
}

void Runtime::OpenTransport(std::chrono::steady_clock::time_point deadline) {
  scheduler_ip_ = ResolveWaiting(config_.root_uri, "DMLC_PS_ROOT_URI", deadline);
  self_.role = config_.role;
  self_.host = AdvertisedHost(config_, scheduler_ip_, deadline);
  const TransportOptions options = TransportOptionsFor(config_, config_.role);
  self_.connection_key = options.connection_key;
  transport_ = std::make_unique<ZmqTransport>(options);
  // Before any send socket opens: the watcher follows the sockets opened after it is set.
  transport_->SetPeerWatcher([this](int id, bool connected) { OnPeerConnection(id, connected); });
  // Listen on the advertised address when it is ours; behind NAT (a name or a foreign
  // address) listen everywhere.
  const bool local = net::IsLocalAddress(self_.host);
  self_.port = transport_->Bind(local ? self_.host : "0.0.0.0", 0);
  self_.host_id = net::HostIdentity();
  if (config_.use_ipc && !self_.host_id.empty()) {
    self_.ipc_endpoint =
        transport_->BindIpc("ps-" + std::to_string(getpid()) + "-" + std::to_string(self_.port));
  }
  transport_->Connect(kSchedulerId, scheduler_ip_, config_.root_port, "");
}

void Runtime::AnnounceToScheduler(const NodeInfo& announced) {
  Message hello;
  hello.meta.control = Control::kRegister;
  hello.meta.request = true;
  hello.meta.recipient = kSchedulerId;
  hello.meta.nodes.push_back(announced);
  hello.meta.nodes.back().rank = config_.rank_hint;  // a request; the table has the real rank
  hello.meta.body = EncodeSharedSettings(config_.SharedSettings());  // the scheduler compares
  receiver_ = std::make_unique<ReceiveLoop>(*transport_, [this](Message&& msg) {
    try {
      OnMessage(std::move(msg));
    } catch (const std::exception& e) {
      FailOn("handling a message", e);
    }
  });
  transport_->Send(hello);
  if (config_.verbose >= 1) {
    PS_LOG(INFO) << RoleName(announced.role) << " at " << announced.host << ":" << announced.port
                 << " registering with the scheduler at " << config_.SchedulerAddress();
  }
}

std::string Runtime::RefusedCredentialsError() const {
  return "the scheduler at " + config_.SchedulerAddress() +
         " refused this node's connection: its PS_JOB_SECRET is not the job's (or the job has "
         "a secret and this node none): give every node of the job the same PS_JOB_SECRET or "
         "PS_JOB_SECRET_FILE (launch.py hands its own processes the job's)";
}

void Runtime::AwaitNodeTable(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(mu_);
  auto report_at = SteadyClock::now() + kWaitReportEvery;
  // Whether a probe found the port open but silent: a scheduler that refused this node's
  // connection (its secret), which may have given up and closed the port by the deadline.
  bool silent_port = false;
  while (!RegistrationAnswered()) {
    const auto now = SteadyClock::now();
    if (now >= deadline) break;
    if (now < report_at) {
      changed_.WaitUntil(mu_, std::min(deadline, report_at));
      continue;
    }
    const bool acknowledged = acknowledged_;
    lock.Unlock();
    if (const auto closed = SchedulerClosedFor(now);
        acknowledged && closed && *closed > config_.heartbeat_timeout) {
      // It accepted this node, then went away: waiting out PS_REGISTER_TIMEOUT helps nobody.
      throw Error("the scheduler at " + config_.SchedulerAddress() + " accepted this " +
                  RoleName(self_.role) + ", but its connection closed " + FormatSeconds(*closed) +
                  " ago, before the job filled up, and has not opened again: it exited or was "
                  "killed (its log says why), or its host went down; start the job again");
    }
    // ZeroMQ says so at once: waiting out PS_REGISTER_TIMEOUT would change nothing.
    if (!acknowledged && transport_->RefusedCredentials(kSchedulerId)) {
      throw Error(RefusedCredentialsError());
    }
    if (acknowledged) {
      PS_LOG(WARNING) << "registered with the scheduler at " << config_.SchedulerAddress()
                      << "; waiting for the job to fill up (DMLC_NUM_SERVER=" << config_.num_servers
                      << ", DMLC_NUM_WORKER=" << config_.num_workers << "); " << TimeLeft(deadline);
    } else {
      bool accepted = false;
      const std::string probe = SchedulerProbe(&accepted);
      silent_port = silent_port || accepted;
      PS_LOG(WARNING) << "waiting for the scheduler at " << config_.SchedulerAddress() << ": "
                      << probe << "; " << TimeLeft(deadline);
    }
    lock.Lock();
    report_at = SteadyClock::now() + kWaitReportEvery;
  }
  if (!register_error_.empty()) throw Error(register_error_);
  if (terminated_ && !registered_) {
    throw Error("the scheduler at " + config_.SchedulerAddress() +
                " ended the job before it started" +
                (failure_.empty() ? std::string() : ": " + failure_));
  }
  if (!registered_) {
    if (acknowledged_) {
      throw Error("the scheduler at " + config_.SchedulerAddress() + " accepted this " +
                  RoleName(self_.role) + " but the job did not fill up within " +
                  FormatSeconds(config_.register_timeout) +
                  ": it waits for DMLC_NUM_SERVER=" + std::to_string(config_.num_servers) +
                  " servers and DMLC_NUM_WORKER=" + std::to_string(config_.num_workers) +
                  " workers; start the missing ones or fix the counts (PS_REGISTER_TIMEOUT sets "
                  "this wait)");
    }
    lock.Unlock();
    if (transport_->RefusedCredentials(kSchedulerId)) throw Error(RefusedCredentialsError());
    bool accepted = false;
    std::string probe = SchedulerProbe(&accepted);
    if (silent_port && !accepted) {
      probe +=
          "; earlier the port accepted connections but no registration reply came: the "
          "scheduler was there and may have stopped waiting for this node, so check that "
          "it was given the job's PS_JOB_SECRET and PS_ENCRYPT";
    }
    throw Error("cannot reach the scheduler at " + config_.SchedulerAddress() + " within " +
                FormatSeconds(config_.register_timeout) + ": " + probe +
                "; check that ps-scheduler is running there, that DMLC_PS_ROOT_URI and "
                "DMLC_PS_ROOT_PORT point to it, and that it can resolve this node's address '" +
                self_.host + "' (its log says when it cannot; PS_REGISTER_TIMEOUT sets this wait)");
  }
  last_scheduler_contact_ = RequestTracker::Clock::now();
  received_at_scheduler_contact_ = transport_->bytes_received();
  // The pause check's reference from the same moment: a stop right after this counts. The
  // scheduler counts this node's silence from its registration too, as from a heartbeat.
  pause_watch_.Start(last_scheduler_contact_);
  last_beat_sent_ = last_scheduler_contact_;
}

void Runtime::ConnectTo(const NodeInfo& node) {
  // Same kernel and network namespace: the peer's abstract ipc socket is reachable.
  const bool same_host = config_.use_ipc && !self_.host_id.empty() &&
                         node.host_id == self_.host_id && !node.ipc_endpoint.empty();
  {
    MutexLock lock(reset_mu_);  // before the socket exists, so its first event finds the entry
    closed_peers_.try_emplace(node.id, ClosedPeer{RequestTracker::Clock::now(), true});
  }
  const bool watched =
      same_host ? transport_->ConnectEndpoint(node.id, node.ipc_endpoint, node.connection_key)
                : transport_->Connect(node.id, node.host, node.port, node.connection_key);
  if (!watched) {  // no event will say it opened: this node cannot tell
    MutexLock lock(reset_mu_);
    const auto entry = closed_peers_.find(node.id);
    if (entry != closed_peers_.end() && entry->second.never_connected) closed_peers_.erase(entry);
  }
}

bool Runtime::RegistrationAnswered() const {
  return registered_ || !register_error_.empty() || terminated_;
}

std::string Runtime::SchedulerProbe(bool* accepted) const {
  // ZeroMQ retries its connection silently: a separate probe tells why no answer came.
  const net::ProbeResult probe =
      net::ProbeTcp(scheduler_ip_, config_.root_port, kSchedulerProbeTimeout);
  if (accepted != nullptr) *accepted = probe.accepted;
  if (probe.accepted && probe.round_trip >= kSlowRoundTrip) {
    // Registering takes a few round trips each way (two connections, each with ZeroMQ's
    // handshake): a slow path, not a refusal, is the likelier reason no reply came yet.
    const auto handshake = HandshakeTimeoutFor(config_);
    const auto needed = 3 * probe.round_trip;
    std::string verdict = "ZeroMQ's handshake gets " + FormatSeconds(handshake) +
                          " (PS_HEARTBEAT_TIMEOUT, within 5 to 30 s), ";
    if (needed <= handshake) {
      verdict += "enough for three";
    } else {
      verdict += "less than the three it needs, so this node cannot register: " +
                 (needed <= kMaxHandshakeInterval
                      ? "start every node of the job with PS_HEARTBEAT_TIMEOUT of at least " +
                            std::to_string((needed.count() + 999) / 1000)
                      : std::string("the path is too long for a job (over 10 s)"));
    }
    return "the port accepts connections, but a round trip to it takes about " +
           FormatSeconds(probe.round_trip) +
           ": registering takes several (ZeroMQ's handshake, then the reply over a connection "
           "of the scheduler's own), so it is slow on this path; " +
           verdict;
  }
  if (probe.accepted) {
    // The reply travels over the scheduler's own connection to this node's address.
    return "the port accepts connections but no registration reply came: is it a "
           "ps-scheduler's port (DMLC_PS_ROOT_PORT), was this node given the job's "
           "PS_JOB_SECRET and PS_ENCRYPT (the scheduler logs each connection it refuses), and "
           "can the scheduler connect to this node's address " +
           self_.host + ":" + std::to_string(self_.port) +
           " (DMLC_NODE_HOST or DMLC_INTERFACE choose it)? Or is this process starved of CPU "
           "(a cgroup's quota, an overloaded host), so that the reply waits unread?";
  }
  if (probe.refused) {
    return "connection refused, nothing listens on port " + std::to_string(config_.root_port) +
           " there (not started yet; its job ended, as a scheduler exits once every worker "
           "finished, so a KVStore created after its job ended finds none; or "
           "DMLC_PS_ROOT_PORT is wrong)";
  }
  return probe.why;
}

std::span<const NodeInfo> Runtime::nodes() const {
  const std::size_t count = node_count_.load(std::memory_order_acquire);
  return {nodes_.data(), count};
}

const NodeInfo* Runtime::Node(int node_id) const {
  const std::span<const NodeInfo> table = nodes();
  if (node_id < 0 || static_cast<std::size_t>(node_id) >= table.size()) return nullptr;
  return &table[static_cast<std::size_t>(node_id)];
}

int Runtime::ServerId(int rank) const {
  const std::span<const NodeInfo> table = nodes();
  for (auto node = table.rbegin(); node != table.rend(); ++node) {  // the latest holder
    if (node->role == Role::kServer && node->rank == rank) return node->id;
  }
  throw Error("no server with rank " + std::to_string(rank));
}

bool Runtime::AwaitServerEventsBeyond(std::size_t count, std::chrono::milliseconds limit) {
  const auto deadline = SteadyClock::now() + limit;
  MutexLock lock(mu_);
  while (server_events_.size() <= count && !terminated_) {
    if (!changed_.WaitUntil(mu_, deadline) && SteadyClock::now() >= deadline) break;
  }
  return server_events_.size() > count;
}

std::vector<Runtime::ServerEvent> Runtime::ServerEvents(std::size_t from) const {
  MutexLock lock(mu_);
  if (from >= server_events_.size()) return {};
  return {server_events_.begin() + static_cast<std::ptrdiff_t>(from), server_events_.end()};
}

int Runtime::WorkerId(int rank) const {
  for (const NodeInfo& node : nodes()) {
    if (node.role == Role::kWorker && node.rank == rank) return node.id;
  }
  throw Error("no worker with rank " + std::to_string(rank));
}

bool Runtime::IsDead(int node_id) const {
  MutexLock lock(mu_);
  return dead_.contains(node_id);
}

std::string Runtime::Describe(int node_id) const {
  const NodeInfo* node = Node(node_id);
  return node != nullptr ? node->Describe() : "node " + std::to_string(node_id);
}

void Runtime::OnMessage(Message&& msg) {
  const Meta& meta = msg.meta;
  {
    MutexLock lock(mu_);
    const bool from_scheduler = meta.sender == kSchedulerId;
    // A peer may get the node table, and write to us, before our own copy arrives: hold its
    // messages (boundedly) until the table is in, then replay them in order.
    if (!registered_ && !from_scheduler && meta.sender > 0 &&
        held_until_registered_.size() < kMaxHeldMessages) {
      held_until_registered_.push_back(std::move(msg));
      return;
    }
    // A server that joined may write to us before the scheduler's word of it arrives (they come
    // on different connections): hold its messages (boundedly) until OnNodeJoined, which
    // checks them as it replays them.
    if (registered_ && !from_scheduler && meta.sender > 0 &&
        static_cast<std::size_t>(meta.sender) >= node_count_.load() &&
        static_cast<std::size_t>(meta.sender) < nodes_.size() &&
        held_until_joined_.size() < kMaxHeldUntilJoined) {
      held_until_joined_.push_back(std::move(msg));
      return;
    }
    // Until the table arrives only the scheduler may speak, with a register reply or a
    // terminate that echoes this node's connection key (nobody else knows it); after, only
    // known nodes, to us, each on the connection that authenticated with its key.
    const bool early_from_scheduler =
        from_scheduler && meta.body == self_.connection_key &&
        (meta.control == Control::kRegisterReply || meta.control == Control::kTerminate);
    const NodeInfo* sender = registered_ ? Node(meta.sender) : nullptr;
    const bool known = registered_
                           ? sender != nullptr && (from_scheduler || meta.recipient == self_.id) &&
                                 msg.connection_key == expected_users_[meta.sender]
                           : early_from_scheduler;
    if (!known) {
      if (const auto count = ++dropped_; LogOccurrence(count)) {
        PS_LOG(WARNING) << "dropped a message (#" << count << ") from node " << meta.sender
                        << " to " << meta.recipient
                        << " that is not known, or did not come on that node's own connection: "
                        << msg.DebugString();
      }
      return;
    }
    if (from_scheduler) {
      last_scheduler_contact_ = RequestTracker::Clock::now();
      received_at_scheduler_contact_ = transport_->bytes_received();
    }
    // A node the scheduler declared dead may still be running (stopped past the heartbeat
    // timeout, then resumed): the others went on without it, so what it says now is stale.
    if (dead_.contains(meta.sender)) {
      ++dropped_;
      return;
    }
  }
  if (meta.control != Control::kNone && meta.control != Control::kError) {
    OnControl(std::move(msg));
  } else if (!meta.request) {
    tracker_.OnResponse(std::move(msg));
  } else {
    MutexLock lock(handler_mu_);
    if (request_handler_) {
      request_handler_(std::move(msg));
    } else {
      early_requests_.push_back(std::move(msg));
    }
  }
}

void Runtime::OnControl(Message&& msg) {
  const Meta& meta = msg.meta;
  switch (meta.control) {
    case Control::kRegisterReply:
      OnRegisterReply(meta);
      break;
    case Control::kBarrierRelease:
      OnBarrierRelease(meta);
      break;
    case Control::kHeartbeat:
      break;                    // the contact time was recorded on arrival
    case Control::kNodeFailed:  // the acknowledgement of our own ReportFailure
      tracker_.OnResponse(std::move(msg));
      break;
    case Control::kWorkerDone:
      if (meta.request) {
        OnWorkerDone(meta);
      } else {  // the acknowledgement of our own FinishWorker
        tracker_.OnResponse(std::move(msg));
      }
      break;
    case Control::kTerminate:
      OnTerminate(meta);
      break;
    case Control::kNodeDead:
      for (const NodeInfo& dead : meta.nodes) OnNodeDead(dead);
      break;
    case Control::kWaitProbe:
      if (meta.request && meta.sender == kSchedulerId) OnWaitProbe(meta);
      break;
    case Control::kPeerUnreachable:
      if (meta.request && meta.sender == kSchedulerId) OnLivenessQuestion(meta);
      break;
    case Control::kNodeJoined:
      for (const NodeInfo& joined : meta.nodes) OnNodeJoined(joined);
      break;
    case Control::kConnectionReset:
      OnResetNotice(meta);
      break;
    default:
      if (const auto count = ++dropped_; LogOccurrence(count)) {
        PS_LOG(WARNING) << "dropped an unexpected message (#" << count
                        << "): " << msg.DebugString();
      }
  }
}

void Runtime::OnBarrierRelease(const Meta& meta) {
  MutexLock lock(mu_);
  const auto waiting = barriers_.find(meta.barrier_group);
  // Not the barrier waited in: the release of one this node left, sent again because its
  // request came again after a reset.
  if (waiting == barriers_.end() || waiting->second.request.meta.timestamp != meta.timestamp) {
    return;
  }
  waiting->second.released = true;
  waiting->second.error = meta.error;
  waiting->second.error_kind = meta.error_kind;
  changed_.NotifyAll();
}

void Runtime::OnWorkerDone(const Meta& meta) {
  for (const NodeInfo& peer : meta.nodes) {
    {
      MutexLock lock(reset_mu_);  // its connection closes as it exits: no news
      finished_peers_.insert(peer.id);
    }
    NotifyPeer(peer, PeerEvent::kFinished);
  }
}

void Runtime::OnTerminate(const Meta& meta) {
  const std::string why = meta.error;
  {
    MutexLock lock(mu_);
    terminated_ = true;
    if (!why.empty() && failure_.empty()) failure_ = "the job failed: " + why;
    changed_.NotifyAll();
  }
  if (config_.verbose >= 1)
    PS_LOG(INFO) << "the scheduler ended the job" << (why.empty() ? "" : ": " + why);
  tracker_.FailAll(why.empty() ? "the job has ended" : "the job failed: " + why);
}

void Runtime::OnLivenessQuestion(const Meta& meta) {
  // Answered here, so the answer also says that this receive thread reads.
  Message answer;
  answer.meta.control = Control::kPeerUnreachable;
  answer.meta.recipient = kSchedulerId;
  answer.meta.timestamp = meta.timestamp;
  SendToNode(answer);
}

void Runtime::OnResetNotice(const Meta& meta) {
  if (meta.sender == kSchedulerId) {  // its connection to this node was reset
    OnSchedulerReset("the scheduler's connection to this node was reset");
    return;
  }
  if (!meta.request) {
    MutexLock lock(reset_mu_);
    announced_resets_.erase(meta.sender);
  }
  OnConnectionReset(meta.sender);
  if (meta.request) {  // the peer saw the reset: it learns that this side acted too
    Message answer;
    answer.meta.control = Control::kConnectionReset;
    answer.meta.recipient = meta.sender;
    SendToNode(answer);
  }
}

void Runtime::OnWaitProbe(const Meta& meta) {
  Message answer;
  answer.meta.control = Control::kWaitProbe;
  answer.meta.recipient = kSchedulerId;
  answer.meta.timestamp = meta.timestamp;
  if (self_.role == Role::kWorker) {
    answer.meta.body = std::to_string(stall_.load());
  } else {
    MutexLock lock(handler_mu_);
    if (wait_reporter_) answer.meta.body = wire::EncodeWaitReport(wait_reporter_());
  }
  SendToNode(answer);
}

void Runtime::ReportStall(std::uint64_t number, bool several_threads) {
  stall_.store(number);
  Message msg;
  msg.meta.control = Control::kStalled;
  msg.meta.request = true;  // (unanswered)
  msg.meta.recipient = kSchedulerId;
  msg.meta.body = wire::EncodeStalled({number, several_threads});
  // Unacknowledged: a notice lost with a reset connection only leaves a deadlock unfound
  // until the worker's next report (DistKVStore reports again while it waits).
  SendToNode(msg);
}

void Runtime::SetWaitReporter(WaitReporter reporter) {
  MutexLock lock(handler_mu_);
  wait_reporter_ = std::move(reporter);
}

void Runtime::OnRegisterReply(const Meta& meta) {
  std::vector<Message> held;
  bool table_arrived = false;
  {
    MutexLock lock(mu_);
    if (registered_) return;
    if (!meta.error.empty()) {
      // Once acknowledged, the node was in: the job as a whole cannot start.
      register_error_ = "the scheduler at " + config_.SchedulerAddress() +
                        (acknowledged_ ? " accepted this node, but the job cannot start: "
                                       : " refused this node: ") +
                        meta.error;
    } else if (meta.nodes.empty()) {
      acknowledged_ = true;  // an acknowledgement: the table comes when the job is full
    } else {
      // The table: ids are dense from 0 (the scheduler); find ourselves by host and port. Room
      // is left for the servers that may take dead ones' ranks later (OnNodeJoined).
      std::vector<NodeInfo> table(meta.nodes.size() + kMaxRejoins);
      bool valid = true;
      for (const NodeInfo& node : meta.nodes) {
        if (node.id < 0 || static_cast<std::size_t>(node.id) >= meta.nodes.size()) valid = false;
        if (valid) table[node.id] = node;
        if (node.host == self_.host && node.port == self_.port && node.role == self_.role) {
          self_ = node;
        }
      }
      if (!valid || self_.id <= 0) {
        register_error_ = "the scheduler sent a node table without this node";
      } else {
        nodes_ = std::move(table);
        expected_users_.assign(nodes_.size(), std::string());
        for (std::size_t id = 0; id < meta.nodes.size(); ++id) {
          expected_users_[id] =
              transport_->ExpectedUser(nodes_[id].connection_key, self_.connection_key);
        }
        node_count_.store(meta.nodes.size(), std::memory_order_release);
        table_arrived = true;
      }
    }
    if (!table_arrived) {
      changed_.NotifyAll();
      held.swap(held_until_registered_);
    }
  }
  if (table_arrived) {
    // Connected before Register() returns, so the node can send to every peer at once; here,
    // on the receive thread, so that the deaths and joins reported next find these sockets.
    std::string error;
    try {
      for (const NodeInfo& node : nodes()) {
        if (node.id != self_.id && node.role != Role::kScheduler) ConnectTo(node);
      }
    } catch (const Error& e) {  // out of descriptors: Register() throws it
      error = e.what();
    }
    MutexLock lock(mu_);
    if (error.empty()) {
      registered_ = true;
    } else {
      register_error_ = error;
    }
    changed_.NotifyAll();
    held.swap(held_until_registered_);
  }
  // The peers' messages held so far: delivered now if the table came, else held again.
  for (Message& early : held) OnMessage(std::move(early));
}

void Runtime::OnNodeDead(const NodeInfo& dead) {
  {
    MutexLock lock(mu_);
    if (dead.id <= 0 || static_cast<std::size_t>(dead.id) >= node_count_.load()) {
      // Not in this node's table: a server whose join was lost with a reset of the scheduler's
      // connection. The scheduler sends the join and the death again, in order (catch-up).
      if (const auto dropped = ++dropped_; LogOccurrence(dropped)) {
        PS_LOG(WARNING) << "dropped a report (#" << dropped << ") of the death of a node this "
                        << "node has not heard join: " << dead.Describe();
      }
      return;
    }
    if (!dead_.insert(dead.id).second) return;
    dead_count_.fetch_add(1);
    if (dead.role == Role::kServer) {
      server_events_.push_back(ServerEvent{dead.rank, dead.id, false});
      server_event_count_.store(server_events_.size());
      changed_.NotifyAll();
    }
  }
  if (dead.role == self_.role && dead.rank == self_.rank) {
    // The server whose rank this one took: the catch-up at its registration tells of that
    // death, which is old news here.
    if (config_.verbose >= 1) PS_LOG(INFO) << "took the place of dead " << dead.Describe();
  } else {
    PS_LOG(WARNING) << "the scheduler reports " << dead.Describe() << " dead";
  }
  // What is queued for it goes now, not when it comes back (a stopped process may resume):
  // queued frames may borrow memory their senders get back with the failure below.
  transport_->Abandon(dead.id);
  transport_->Disconnect(dead.id);
  tracker_.FailPeer(dead.id, dead.Describe() + " died", /*died=*/true);
  NotifyPeer(dead, PeerEvent::kDead);
  server_events_applied_.store(server_event_count_.load());
}

void Runtime::OnNodeJoined(const NodeInfo& node) {
  bool is_new = false;
  std::optional<NodeInfo> predecessor;
  {
    MutexLock lock(mu_);
    const std::size_t count = node_count_.load();
    const bool fits = node.role == Role::kServer && node.rank >= 0 &&
                      node.rank < config_.num_servers && node.id > 0;
    is_new = fits && static_cast<std::size_t>(node.id) == count && count < nodes_.size();
    if (!is_new &&
        (!fits || static_cast<std::size_t>(node.id) >= count || nodes_[node.id] != node)) {
      // Not the next id, or a known id with other details: not what this scheduler sends.
      if (const auto dropped = ++dropped_; LogOccurrence(dropped)) {
        PS_LOG(WARNING) << "dropped a report (#" << dropped << ") of a joined node that does "
                        << "not fit the node table: " << node.Describe();
      }
      return;
    }
    // Heard again: the scheduler sends its notices again after a reset of its connection.
    if (std::any_of(server_events_.begin(), server_events_.end(), [&](const ServerEvent& event) {
          return event.joined && event.node_id == node.id;
        }))
      return;
    predecessor = LiveHolderBefore(node);
  }
  if (predecessor) {
    // The scheduler admits a server only in the place of a dead one: that one died, and its
    // death notice was lost with a reset connection (it comes again, and is ignored then).
    // Counted now, so that this node hears the death before the join, as every node does.
    PS_LOG(WARNING) << node.Describe() << " joined in the place of " << predecessor->Describe()
                    << " before this node heard of its death";
    OnNodeDead(*predecessor);
  }
  // Connected before it is in the table: a thread that finds the rank's server there (a
  // collective's request, say) must find a socket to it too, or its send is refused.
  if (is_new && node.id != self_.id) {
    try {
      ConnectTo(node);
    } catch (const Error& e) {  // out of descriptors: this node cannot go on
      Fail("cannot connect to " + node.Describe() + ", which joined the job: " + e.what());
      return;
    }
  }
  {
    MutexLock lock(mu_);
    if (is_new) {
      nodes_[node.id] = node;
      expected_users_[node.id] =
          transport_->ExpectedUser(node.connection_key, self_.connection_key);
      node_count_.store(static_cast<std::size_t>(node.id) + 1, std::memory_order_release);
    }
    server_events_.push_back(ServerEvent{node.rank, node.id, true});
    server_event_count_.store(server_events_.size());
    changed_.NotifyAll();
  }
  if (node.id != self_.id) {
    PS_LOG(WARNING) << node.Describe() << " joined the job in the place of a dead server";
  }
  NotifyPeer(node, PeerEvent::kJoined);
  server_events_applied_.store(server_event_count_.load());
  // What it sent before this node heard of it, now that its entry is in the table.
  std::vector<Message> held;
  {
    MutexLock lock(mu_);
    held.swap(held_until_joined_);
  }
  for (Message& early : held) OnMessage(std::move(early));
}

std::optional<NodeInfo> Runtime::LiveHolderBefore(const NodeInfo& node) const {
  // The latest server of the rank before `node` (ids grow with every join).
  for (int id = node.id - 1; id > 0; --id) {
    const NodeInfo& other = nodes_[static_cast<std::size_t>(id)];
    if (other.role != Role::kServer || other.rank != node.rank) continue;
    if (dead_.contains(id)) return std::nullopt;
    return other;
  }
  return std::nullopt;
}

void Runtime::NotifyPeer(const NodeInfo& peer, PeerEvent event) {
  MutexLock lock(handler_mu_);
  if (peer_handler_) {
    peer_handler_(peer, event);
  } else if (early_peer_events_.size() < kMaxHeldMessages) {  // a node may never set one
    early_peer_events_.emplace_back(peer, event);
  }
}

std::optional<std::chrono::milliseconds> Runtime::SchedulerClosedFor(
    RequestTracker::Clock::time_point now) {
  MutexLock lock(reset_mu_);
  const auto closed = closed_peers_.find(kSchedulerId);
  if (closed == closed_peers_.end() || closed->second.never_connected) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - closed->second.since);
}

void Runtime::OnPeerConnection(int node_id, bool connected) {
  MutexLock lock(reset_mu_);
  if (!connected) {
    closed_peers_.try_emplace(node_id, ClosedPeer{RequestTracker::Clock::now()});
    peer_closed_.NotifyAll();
    return;
  }
  const auto closed = closed_peers_.find(node_id);
  if (closed == closed_peers_.end()) return;
  const bool reset = !closed->second.never_connected;
  closed_peers_.erase(closed);
  if (reset) reset_peers_.push_back(node_id);
}

void Runtime::OnSchedulerReset(const std::string& why) {
  std::vector<Message> waiting;
  {
    MutexLock lock(mu_);
    for (const auto& [group, barrier] : barriers_) {
      if (!barrier.released) waiting.push_back(barrier.request);
    }
  }
  if (!waiting.empty() && config_.verbose >= 1) {
    PS_LOG(INFO) << why << ": sending the barrier request it waits in again";
  }
  for (Message& request : waiting) SendToNode(request);
  tracker_.FailReset(kSchedulerId, why + " while this request was in flight");
}

bool Runtime::ConnectionResetPending(int node_id) {
  MutexLock lock(reset_mu_);
  const auto closed = closed_peers_.find(node_id);
  return (closed != closed_peers_.end() && !closed->second.never_connected) ||
         announced_resets_.contains(node_id) ||
         std::find(reset_peers_.begin(), reset_peers_.end(), node_id) != reset_peers_.end();
}

void Runtime::AnnounceResets() {
  std::vector<int> reset;
  {
    MutexLock lock(reset_mu_);
    reset.swap(reset_peers_);
    for (const int peer : reset) {
      if (peer != kSchedulerId) announced_resets_.insert(peer);
    }
  }
  for (const int peer : reset) {
    if (peer == kSchedulerId) {
      OnSchedulerReset("this node's connection to the scheduler was reset");
      continue;
    }
    if (IsDead(peer)) continue;
    // Each side fails what waits on the other when it reads this request or its answer, on
    // its receive thread: what this node sent may be lost, and so may what it answered.
    Message notice;
    notice.meta.control = Control::kConnectionReset;
    notice.meta.request = true;
    notice.meta.recipient = peer;
    SendToNode(notice);
  }
}

void Runtime::ReportUnreachablePeers(RequestTracker::Clock::time_point now) {
  // A peer that died or exited is declared dead by the scheduler within about a second of its
  // connection closing (ps/scheduler); a live one is back within ZeroMQ's reconnect interval
  // after a reset, and a new one connects at once (a handshake takes a few round trips, longer
  // on a starved machine: hence the floors below). A connection closed (or never opened) for
  // a heartbeat timeout is neither: the network between the two drops their traffic (TCP gave
  // up on it: ZMQ_TCP_MAXRT), or a firewall keeps ZeroMQ from connecting. The scheduler asks
  // the peer whether it lives before it believes it. Called with heartbeats on only: without
  // them the scheduler cannot tell whether the peer lives.
  constexpr std::chrono::milliseconds kMinUnreachableAfter{2000};
  // A first connection waits its turn at a busy peer (at most 32 handshakes at once, each up
  // to the handshake interval, 5 s with short heartbeat timeouts): longer before it counts.
  constexpr std::chrono::milliseconds kMinNeverConnectedAfter{10000};
  const auto closed_after = std::max(config_.heartbeat_timeout, kMinUnreachableAfter);
  const auto never_after = std::max(config_.heartbeat_timeout, kMinNeverConnectedAfter);
  // This process's own pause (SIGSTOP, a frozen machine) held its ZeroMQ threads too: time to
  // reconnect is counted from its end.
  const auto resumed = pause_watch_.last_pause_ended();
  struct Report {
    int peer;
    wire::UnreachableNotice notice;
    bool first;
  };
  std::vector<Report> reports;
  {
    MutexLock lock(reset_mu_);
    for (auto& [peer, closed] : closed_peers_) {
      const auto since = std::max(closed.since, resumed);
      if (peer == kSchedulerId || finished_peers_.contains(peer) ||
          now - since < (closed.never_connected ? never_after : closed_after)) {
        continue;
      }
      const auto closed_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - since).count();
      reports.push_back({peer,
                         {static_cast<std::uint64_t>(closed_ms), closed.never_connected},
                         !closed.reported});
      closed.reported = true;
    }
  }
  for (const Report& report : reports) {
    const NodeInfo* peer = Node(report.peer);
    // Workers send each other nothing: their connection closes only when one exits.
    if (peer == nullptr || IsDead(report.peer) ||
        (peer->role == Role::kWorker && self_.role == Role::kWorker)) {
      continue;
    }
    if (report.first && config_.verbose >= 1) {
      PS_LOG(WARNING) << "the connection from " << self_.Describe() << " to " << peer->Describe()
                      << (report.notice.never_connected ? " has not opened for "
                                                        : " has been closed for ")
                      << FormatSeconds(std::chrono::milliseconds(report.notice.closed_ms))
                      << ": asking the scheduler whether it lives";
    }
    Message notice;
    notice.meta.control = Control::kPeerUnreachable;
    notice.meta.request = true;  // the peer's answer to the scheduler's question is not
    notice.meta.recipient = kSchedulerId;
    notice.meta.nodes.push_back(*peer);
    notice.meta.body = wire::EncodeUnreachable(report.notice);
    SendToNode(notice);
  }
}

void Runtime::OnConnectionReset(int node_id) {
  if (IsDead(node_id)) return;
  const NodeInfo* peer = Node(node_id);
  if (peer == nullptr || peer->role == Role::kScheduler) return;
  if (const auto count = ++connection_resets_; LogOccurrence(count)) {
    PS_LOG(WARNING) << "the connection between " << self_.Describe() << " and " << peer->Describe()
                    << " was reset (#" << count << "): the requests in flight between them failed"
                    << (config_.replicated() ? "; the store sends them again (replication)" : "");
  }
  tracker_.FailReset(node_id, "the connection between " + self_.Describe() + " and " +
                                  peer->Describe() +
                                  " was reset while this request was in flight, so it or its "
                                  "answer may be lost (the network, a firewall or NAT reset it, "
                                  "or the peer had no memory for its frames)");
  NotifyPeer(*peer, PeerEvent::kReset);
}

void Runtime::OnTick() {
  const auto now = RequestTracker::Clock::now();
  if (const auto pause = pause_watch_.Tick(now); pause > pause.zero()) {
    PS_LOG(WARNING) << self_.Describe() << " did not run for "
                    << FormatSeconds(std::chrono::duration_cast<std::chrono::milliseconds>(pause))
                    << " (stopped, or starved of CPU): it sent no heartbeat meanwhile";
    if (config_.heartbeat_interval.count() > 0 && !Stopped() &&
        now - last_beat_sent_ > config_.heartbeat_timeout + kSchedulerJudgesWithin) {
      // Silent past the timeout: a scheduler that ran meanwhile has declared this node dead.
      FailAfterPause(pause, "silent for longer than the scheduler waits (PS_HEARTBEAT_TIMEOUT " +
                                FormatSeconds(config_.heartbeat_timeout) +
                                "), so it has declared this node dead if it ran meanwhile");
      return;
    }
    // Maybe still alive there: the scheduler counts this node's silence from its last
    // heartbeat, and answers the next one. Its silence counts from now.
    resumed_at_ = now;
  }
  tracker_.ExpireOverdue(now);
  AnnounceResets();
  if (config_.heartbeat_interval.count() == 0) {
    if (Stopped()) return;  // ended: the scheduler may well be gone
    // No heartbeats to miss, but a scheduler that exited or was killed closes its connection:
    // without this, every node would wait for it for ever.
    if (const auto closed = SchedulerClosedFor(now);
        closed && *closed > config_.heartbeat_timeout) {
      Fail("lost the scheduler at " + config_.SchedulerAddress() + ": its connection closed " +
           FormatSeconds(*closed) +
           " ago and has not opened again: it exited or was killed, or its host or the network "
           "went down (heartbeats are off: PS_HEARTBEAT_INTERVAL=0)");
    }
    return;
  }
  auto reading_since = now;
  // Whatever else happened (the node failed, or the job ended, meanwhile): a receive thread
  // held for good must be known, or the process waits for it for ever.
  if (const std::string stuck = StuckWork(now, reading_since); !stuck.empty()) {
    GiveUpOnStuckWork(stuck);
    return;
  }
  bool lost = false;
  {
    MutexLock lock(mu_);
    if (terminated_ || !failure_.empty()) return;
    // Answers that came while the receive thread was held by a SlowWork wait unread.
    lost = now - std::max({last_scheduler_contact_, reading_since, resumed_at_}) >
           config_.heartbeat_timeout;
  }
  const auto pause = pause_watch_.last_pause();
  if (lost && pause > pause.zero() &&
      now - pause_watch_.last_pause_ended() < 2 * config_.heartbeat_timeout) {
    FailAfterPause(pause, "and the scheduler has not answered it in the PS_HEARTBEAT_TIMEOUT (" +
                              FormatSeconds(config_.heartbeat_timeout) +
                              ") since: it has likely declared this node dead");
    return;
  }
  if (lost) {
    // A process that exits or is killed has its kernel close the connection; one that is
    // stopped or hung keeps it open, and so does a network that stopped carrying packets
    // until the unacknowledged data times out.
    const bool closed = SchedulerClosedFor(now).has_value();
    Fail("lost contact with the scheduler at " + config_.SchedulerAddress() + " for over " +
         FormatSeconds(config_.heartbeat_timeout) +
         (closed ? ": its connection closed: it exited or was killed, or its host or the "
                   "network went down"
                 : ": its connection is still open but it sent nothing" + WhySchedulerIsSilent()));
    return;
  }
  ReportUnreachablePeers(now);
  // Every interval; ticks may come more often (TickPeriod), and half a tick early counts.
  if (now - last_beat_sent_ + TickPeriod(config_) / 2 < config_.heartbeat_interval) return;
  last_beat_sent_ = now;
  Message beat;
  beat.meta.control = Control::kHeartbeat;
  beat.meta.request = true;
  beat.meta.recipient = kSchedulerId;
  SendToNode(beat);
}

std::string Runtime::WhySchedulerIsSilent() {
  std::uint64_t received = 0;
  {
    MutexLock lock(mu_);
    received = transport_->bytes_received() - received_at_scheduler_contact_;
  }
  // Data from the servers and workers kept coming: this host's link works, and is busy.
  const bool busy = received >= kBusyLinkBytes;
  const auto link = transport_->LinkTo(kSchedulerId);
  // Heartbeats go out every interval: the connection has sent within the timeout.
  std::string why = ExplainSilence(link, config_.heartbeat_timeout, "this node", busy);
  if (why.empty()) {
    return ": it is stopped (e.g. by SIGSTOP) or hung, or the network stopped carrying packets";
  }
  if (ProvesPeerStuck(link, config_.heartbeat_timeout, busy)) {
    // The scheduler's host is there, the path clean, and the process silent: say it as for
    // any stopped one.
    return ": it is stopped (e.g. by SIGSTOP) or hung (" + why + ")";
  }
  if (busy) {
    why += "; meanwhile " + std::to_string(received / 1024) +
           " KiB from other nodes reached this one, so this host's link carries data: it is "
           "likely saturated by the job's traffic, with the scheduler's messages queued behind "
           "it: give the hosts faster links, or raise PS_HEARTBEAT_TIMEOUT";
  }
  return ": " + why;
}

bool Runtime::Stopped() {
  MutexLock lock(mu_);
  return terminated_ || !failure_.empty();
}

void Runtime::FailAfterPause(std::chrono::steady_clock::duration pause, const std::string& so) {
  Fail("lost contact with the scheduler at " + config_.SchedulerAddress() +
       ": this process itself did not run for " +
       FormatSeconds(std::chrono::duration_cast<std::chrono::milliseconds>(pause)) +
       " (stopped, e.g. by SIGSTOP, or its machine frozen), " + so +
       ", and the job went on or ended without it");
}

void Runtime::FailOn(const std::string& doing, const std::exception& e) {
  // Out of memory, most likely: the node cannot trust its state any more, so it fails (the
  // job hears why) instead of ending in std::terminate.
  const std::string what = "while " + doing + ": " + ExceptionText(e);
  const std::string why = self_.Describe() + " failed " + what;
  try {
    // Not ReportFailure: this is the receive or the timer thread, which cannot wait for an
    // acknowledgement the receive thread would deliver. Sent before Fail, which lets the
    // node's owner close its connections.
    SendFailureReport(what);
  } catch (const std::exception&) {  // the closed connection tells the scheduler instead
  }
  try {
    Fail(why);
  } catch (const std::exception&) {
    PS_LOG(ERROR) << why;  // no memory even for that: the line at least
  }
}

void Runtime::Fail(const std::string& why) {
  {
    MutexLock lock(mu_);
    if (!failure_.empty()) return;
    failure_ = why;
    changed_.NotifyAll();
  }
  PS_LOG(ERROR) << why;
  tracker_.FailAll(why);
}

bool Runtime::SendToNode(Message& msg) {
  msg.meta.sender = self_.id;
  return transport_->Send(msg);
}

void Runtime::Barrier(int groups, std::optional<std::chrono::milliseconds> timeout) {
  if (const BarrierOutcome outcome = VotedBarrier(groups, "", "", ErrorKind::kOther, timeout);
      !outcome.error.empty()) {
    ThrowError(outcome.kind, "barrier failed: " + outcome.error);
  }
}

void Runtime::Agree(int groups, const std::string& vote, const std::string& failure,
                    const std::function<void()>& stalled, ErrorKind failure_kind) {
  if (const BarrierOutcome outcome =
          VotedBarrier(groups, vote, failure, failure_kind, std::nullopt, stalled);
      !outcome.error.empty()) {
    ThrowError(outcome.kind, outcome.error);
  }
}

Runtime::BarrierOutcome Runtime::VotedBarrier(int groups, const std::string& vote,
                                              const std::string& failure, ErrorKind failure_kind,
                                              std::optional<std::chrono::milliseconds> timeout,
                                              const std::function<void()>& stalled) {
  Message msg;
  msg.meta.control = Control::kBarrier;
  msg.meta.request = true;
  msg.meta.recipient = kSchedulerId;
  msg.meta.barrier_group = groups;
  msg.meta.body = vote;
  msg.meta.error = failure;
  msg.meta.error_kind = failure.empty() ? ErrorKind::kOther : failure_kind;
  {
    MutexLock lock(mu_);
    if (barriers_.contains(groups)) {
      // Its release would end either wait, and the other's vote pair with the wrong call.
      return {"another thread of " + self_.Describe() +
              " is in a barrier of the same group: call barriers and collectives of one group "
              "from one thread"};
    }
    msg.meta.timestamp = ++barrier_count_;
    barriers_.emplace(groups, PendingBarrier{msg, false, "", ErrorKind::kOther});
  }
  SendToNode(msg);
  const auto start = SteadyClock::now();
  MutexLock lock(mu_);
  const PendingBarrier& barrier = barriers_.at(groups);  // erased below, by this thread only
  const auto ready = [&]() PS_REQUIRES(mu_) {
    return barrier.released || !failure_.empty() || terminated_;
  };
  bool timed_out = false;
  StallSchedule reports(start);
  while (!ready() && !timed_out) {
    if (stalled && SteadyClock::now() >= reports.next()) {
      lock.Unlock();
      stalled();
      lock.Lock();
      reports.Reported();
      continue;
    }
    if (!timeout && !stalled) {
      changed_.Wait(mu_);
      continue;
    }
    const auto deadline = timeout ? start + *timeout : SteadyClock::time_point::max();
    changed_.WaitUntil(mu_, stalled ? std::min(deadline, reports.next()) : deadline);
    timed_out = timeout && SteadyClock::now() >= deadline && !ready();
  }
  BarrierOutcome outcome;
  if (timed_out) {
    outcome.error = "timed out after " + FormatSeconds(*timeout);
  } else if (barrier.released) {
    outcome = {barrier.error, barrier.error_kind};
  } else {
    outcome.error = failure_.empty() ? "the job has ended" : failure_;
  }
  barriers_.erase(groups);
  return outcome;
}

// The held messages and events go to the new handler on the caller's thread; what it throws
// fails the node as it would on the receive thread (FailOn, once handler_mu_ is released: it
// takes mu_), not the caller.
void Runtime::SetRequestHandler(RequestHandler handler) {
  std::exception_ptr thrown;
  {
    MutexLock lock(handler_mu_);
    request_handler_ = std::move(handler);
    try {
      for (Message& msg : early_requests_) request_handler_(std::move(msg));
    } catch (const std::exception&) {
      thrown = std::current_exception();
    }
    early_requests_.clear();
  }
  if (thrown) FailOnThrown("handling a message", thrown);
}

void Runtime::SetPeerHandler(PeerHandler handler) {
  std::exception_ptr thrown;
  {
    MutexLock lock(handler_mu_);
    peer_handler_ = std::move(handler);
    if (!peer_handler_) return;
    try {
      for (const auto& [peer, event] : early_peer_events_) peer_handler_(peer, event);
    } catch (const std::exception&) {
      thrown = std::current_exception();
    }
    early_peer_events_.clear();
  }
  if (thrown) FailOnThrown("handling a peer's news", thrown);
}

void Runtime::FailOnThrown(const std::string& doing, std::exception_ptr thrown) {
  try {
    std::rethrow_exception(std::move(thrown));
  } catch (const std::exception& e) {
    FailOn(doing, e);
  }
}

std::uint64_t Runtime::Request(std::span<Message> messages, RequestTracker::Callback callback,
                               std::optional<RequestTracker::Clock::time_point> deadline) {
  // The peer list lives on this stack unless a request goes to hundreds of peers.
  alignas(int) std::byte stack[256 * sizeof(int)];
  std::pmr::monotonic_buffer_resource arena(stack, sizeof(stack));
  std::pmr::vector<int> peers(&arena);
  peers.reserve(messages.size());
  for (const Message& msg : messages) peers.push_back(msg.meta.recipient);
  const std::uint64_t timestamp = tracker_.Start(peers, std::move(callback), deadline);
  // A request to a peer reported dead fails at once (its callback runs on this thread, so it
  // may send again: re-routing) and is not sent. Checked after Start: a death reported just
  // before it found no request to fail (one reported after the count is read finds it).
  for (int peer : peers) {
    if (dead_count_.load() != 0 && IsDead(peer)) {
      tracker_.FailPeer(peer, Describe(peer) + " died", /*died=*/true);
      return 0;
    }
  }
  for (Message& msg : messages) {
    msg.meta.request = true;
    msg.meta.timestamp = timestamp;
    const int peer = msg.meta.recipient;
    if (!SendToNode(msg)) {
      tracker_.FailPeer(peer, "cannot send to " + Describe(peer) +
                                  ": this node is shutting down, or the message was refused (see "
                                  "this node's log)");
    }
  }
  return timestamp;
}

void Runtime::Reply(const Meta& request, Message response) { ReplyWith(request, response); }

void Runtime::ReplyWith(const Meta& request, Message& response) {
  response.meta.recipient = request.sender;
  response.meta.request = false;
  response.meta.app_id = request.app_id;
  response.meta.customer_id = request.customer_id;
  response.meta.timestamp = request.timestamp;
  if (response.meta.head == 0) response.meta.head = request.head;
  SendToNode(response);
}

void Runtime::ReplyError(const Meta& request, const std::string& error, ErrorKind kind) {
  Message response;
  response.meta.control = Control::kError;
  response.meta.error = error;
  response.meta.error_kind = kind;
  Reply(request, std::move(response));
}

RequestResult Runtime::RequestAndWait(std::span<Message> messages,
                                      std::optional<RequestTracker::Clock::time_point> deadline) {
  struct {
    Mutex mu;
    CondVar arrived;
    std::optional<RequestResult> result PS_GUARDED_BY(mu);
  } answer;
  Request(
      messages,
      [&](RequestResult&& result) {
        MutexLock lock(answer.mu);
        answer.result = std::move(result);
        answer.arrived.NotifyAll();
      },
      deadline);
  MutexLock lock(answer.mu);
  while (!answer.result) answer.arrived.Wait(answer.mu);
  return std::move(*answer.result);
}

RequestResult Runtime::RequestSchedulerAndWait(const Message& msg,
                                               RequestTracker::Clock::time_point deadline) {
  // Bounded: each resend follows a reset the connection monitor saw.
  constexpr int kMaxSchedulerResends = 8;
  RequestResult outcome;
  for (int sent = 0; sent <= kMaxSchedulerResends; ++sent) {
    outcome = RequestAndWait(msg, deadline);
    if (!outcome.peer_reset) break;
  }
  return outcome;
}

void Runtime::FinishWorker(const std::string& failure) {
  Message msg;
  msg.meta.control = Control::kWorkerDone;
  msg.meta.recipient = kSchedulerId;
  msg.meta.error = failure;
  const RequestResult outcome = RequestSchedulerAndWait(
      msg,
      RequestTracker::Clock::now() + std::max(config_.register_timeout, config_.heartbeat_timeout));
  if (outcome.ok()) return;
  // The job ended failing first (another node failed): say so, not that a message was lost.
  if (std::string failed = Runtime::failure(); !failed.empty()) {
    throw Error("finished after the job ended: " + failed);
  }
  throw Error("could not tell the scheduler this worker finished: " + outcome.error);
}

void Runtime::SendFailureReport(const std::string& why) {
  Message report = FailureReport(why);
  report.meta.request = true;  // untracked (timestamp 0): the scheduler's answer is dropped
  SendToNode(report);
}

void Runtime::ReportFailure(const std::string& why) {
  // A node that failed already takes no new requests (its tracker is closed): the report goes
  // unacknowledged, as FailOn's does.
  if (!failure().empty()) {
    try {
      SendFailureReport(why);
    } catch (const std::exception& e) {
      PS_LOG(WARNING) << "could not tell the scheduler why this node failed: " << e.what();
    }
    return;
  }
  // Bounded: the node is exiting, and a scheduler that cannot be told learns it from the
  // closed connection or the missing heartbeats instead.
  constexpr auto kReportWait = std::chrono::seconds(3);
  const RequestResult outcome =
      RequestSchedulerAndWait(FailureReport(why), RequestTracker::Clock::now() + kReportWait);
  if (!outcome.ok() && config_.verbose >= 1) {
    PS_LOG(WARNING) << "could not tell the scheduler why this node failed: " << outcome.error;
  }
}

std::string Runtime::WaitForTermination() {
  MutexLock lock(mu_);
  while (!terminated_ && failure_.empty()) changed_.Wait(mu_);
  return failure_;
}

std::string Runtime::failure() const {
  MutexLock lock(mu_);
  return failure_;
}

bool Runtime::terminated() const {
  MutexLock lock(mu_);
  return terminated_;
}

std::string Runtime::EndpointOf(int node_id) const { return transport_->EndpointOf(node_id); }

bool Runtime::SameHost(int node_id) const { return EndpointOf(node_id).starts_with("ipc://"); }

std::size_t Runtime::refused_connections() const { return transport_->refused_connections(); }

std::size_t Runtime::dropped_messages() const {
  return transport_->dropped_messages() + dropped_.load();
}

std::uint64_t Runtime::bytes_sent() const { return transport_->bytes_sent(); }
std::uint64_t Runtime::bytes_received() const { return transport_->bytes_received(); }

std::uint64_t Runtime::BytesOnTheWayTo(int node_id) const {
  const auto link = transport_->LinkTo(node_id);
  return link ? link->unsent_bytes + link->unacknowledged_bytes : 0;
}

}  // namespace ps
