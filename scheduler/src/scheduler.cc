#include "ps/scheduler.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string_view>
#include <tuple>
#include <utility>

#include "ps/error.h"
#include "ps/runtime.h"
#include "ps/src/internal.h"
#include "ps/src/link_state.h"
#include "ps/src/wire.h"
#include "scheduler/src/deadlock_watch.h"

namespace ps {
namespace {

// How long a live node's closed connection may stay closed before the node is declared dead.
// A closed TCP connection means the peer's kernel closed its socket (the process exited or was
// killed) or reset it; ZeroMQ reconnects within 100 ms (ZMQ_RECONNECT_IVL) to a process that is
// still there. A node that hangs with its sockets open (SIGSTOP, a partitioned network) keeps
// its connection and is found by the heartbeat timeout instead.
constexpr auto kReconnectGrace = std::chrono::milliseconds(1000);
constexpr int kNoRequest = 1 << 30;  // sorts after every requested rank

// A registrant as the scheduler's messages name it: "worker at HOST:PORT".
std::string RegistrantName(const NodeInfo& node) {
  return RoleName(node.role) + " at " + node.host + ":" + std::to_string(node.port);
}

int RoleBit(Role role) {
  switch (role) {
    case Role::kServer:
      return kServerGroup;
    case Role::kWorker:
      return kWorkerGroup;
    case Role::kScheduler:
      return kSchedulerGroup;
  }
  return 0;
}

// A REGISTER_REPLY to `recipient` (an acknowledgement; the caller adds a refusal's error or the
// node table). It echoes the node's connection key: how the node knows the reply is ours.
Message RegisterReply(int recipient, const std::string& connection_key) {
  Message reply;
  reply.meta.control = Control::kRegisterReply;
  reply.meta.recipient = recipient;
  reply.meta.body = connection_key;
  return reply;
}

// A worker vote (a collective's call and arguments) as a log line shows it: its start.
std::string ShownCall(std::string_view vote) {
  constexpr std::size_t kCallChars = 60;
  return vote.size() <= kCallChars ? std::string(vote)
                                   : std::string(vote.substr(0, kCallChars)) + "...";
}

// A vote's items: its ", "-separated parts where it has them (Init's keys: "Init key 0 (10 x
// float32), key 1 (4 x float32)"), else its words ("SetOptimizer sgd lr=0.1 max_update=10").
std::vector<std::string_view> VoteItems(std::string_view vote, bool listed) {
  const std::string_view separator = listed ? ", " : " ";
  std::vector<std::string_view> items;
  for (std::size_t at = 0; at <= vote.size();) {
    const std::size_t end = std::min(vote.find(separator, at), vote.size());
    if (end > at) items.push_back(vote.substr(at, end - at));
    at = end + separator.size();
  }
  return items;
}

// Where two votes of the same call part, for the reader of a long vote: the first key of two
// Inits that differs (" (first difference: worker 1's key 49 (2 x float32), worker 0's key 49
// (1 x float32))"), or the first setting of two calls with as many words (" (first
// difference: worker 1's max_update=10, worker 0's max_update=20)"); else "". `second` names
// a vote's members.
std::string FirstDifference(const std::pair<const std::string*, std::string>& one,
                            const std::pair<const std::string*, std::string>& other) {
  const std::string& a_text = *one.first;
  const std::string& b_text = *other.first;
  const bool listed =
      a_text.find(", ") != std::string::npos || b_text.find(", ") != std::string::npos;
  const std::vector<std::string_view> a = VoteItems(a_text, listed);
  const std::vector<std::string_view> b = VoteItems(b_text, listed);
  const auto call = [](std::string_view vote) { return vote.substr(0, vote.find(' ')); };
  if (a.empty() || b.empty() || call(a_text) != call(b_text)) return "";
  const auto named = [](const std::string& members, std::string_view item) {
    return members + (item.empty() ? " has no more" : "'s " + std::string(item));
  };
  if (listed) {
    const std::size_t common = std::min(a.size(), b.size());
    std::size_t i = 0;
    while (i < common && a[i] == b[i]) ++i;
    if (i == a.size() && i == b.size()) return "";
    // Both cut where they still agree: the difference lies past what they show, and only the
    // summaries of the whole calls can tell it.
    const auto cut_at = [](std::string_view item) { return item.find(Runtime::kVoteCutMarker); };
    if (i + 1 == a.size() && i + 1 == b.size() && cut_at(a[i]) != std::string_view::npos &&
        a[i].substr(0, cut_at(a[i])) == b[i].substr(0, cut_at(b[i]))) {
      const auto whole = [&](std::string_view item) {
        std::string_view summary = item.substr(cut_at(item) + Runtime::kVoteCutMarker.size());
        if (summary.ends_with(')')) summary.remove_suffix(1);
        return std::string(summary);
      };
      return " (first difference: past the first " + std::to_string(i) +
             " items shown, which agree; " + one.second + "'s call: " + whole(a[i]) + ", " +
             other.second + "'s: " + whole(b[i]) + ")";
    }
    return " (first difference: " + named(one.second, i < a.size() ? a[i] : "") + ", " +
           named(other.second, i < b.size() ? b[i] : "") + ")";
  }
  if (a.size() != b.size() || a.size() < 2) return "";
  const auto differ = std::mismatch(a.begin(), a.end(), b.begin());
  if (differ.first == a.end() || differ.first->find('=') == std::string_view::npos) return "";
  return " (first difference: " + named(one.second, *differ.first) + ", " +
         named(other.second, *differ.second) + ")";
}

// `config`, once Validate found it sound (a config filled in by hand).
const ClusterConfig& Checked(const ClusterConfig& config) {
  config.Validate();
  return config;
}

}  // namespace

Scheduler::Scheduler(const ClusterConfig& config)
    : config_(Checked(config)),
      started_(Clock::now()),
      deadlocks_(std::make_unique<DeadlockWatch>(
          [this](Message probe) { Send(std::move(probe)); },
          [](const std::string& warning) { LOG(WARNING) << warning; }, config.stall_timeout)) {
  const std::string ip =
      config.use_kubernetes ? "0.0.0.0" : net::ResolveIPv4(config.root_uri, "DMLC_PS_ROOT_URI");
  const TransportOptions options = TransportOptionsFor(config, Role::kScheduler);
  transport_ = std::make_unique<ZmqTransport>(options);
  try {
    port_ = transport_->Bind(ip, config.root_port);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) +
                " (DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT set this address; DMLC_PS_ROOT_PORT=0 picks "
                "a free port)");
  }
  // Before any node registers, so that the connection to every node is watched.
  transport_->SetPeerWatcher([this](int id, bool connected) { OnPeerConnection(id, connected); });
  NodeInfo self;
  self.id = kSchedulerId;
  self.role = Role::kScheduler;
  self.host = config.root_uri;
  self.port = port_;
  self.rank = 0;
  self.connection_key = options.connection_key;
  nodes_.push_back(self);
  last_seen_.push_back(started_);
  pause_watch_.Start(started_);
  requested_rank_.push_back(0);
  receiver_ = std::make_unique<ReceiveLoop>(*transport_, [this](Message&& msg) {
    try {
      OnMessage(std::move(msg));
    } catch (const std::exception& e) {
      FailOn("handling a message", e);
    }
  });
  timer_ = std::make_unique<PeriodicTask>(kTickPeriod, [this] {
    try {
      OnTick();
    } catch (const std::exception& e) {
      FailOn("checking on the nodes", e);
    }
  });
}

void Scheduler::FailOn(const std::string& doing, const std::exception& e) {
  const std::string why = "the scheduler failed while " + doing + ": " + ExceptionText(e);
  try {
    Stop(why);
  } catch (const std::exception&) {
    // Out of memory even for ending the job: the process goes, its connections close, and
    // every node sees the scheduler gone.
    std::fprintf(stderr, "ps-scheduler: error: %s\n", why.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
}

Scheduler::~Scheduler() {
  transport_->SetPeerWatcher({});  // waits for a call in progress (it uses members below)
  transport_->Shutdown();
  receiver_.reset();
  timer_.reset();
}

void Scheduler::PrintListeningLine() const {
  std::cout << "ps-scheduler: listening on " << config_.root_uri << ":" << port_ << std::endl;
  if (config_.heartbeat_interval.count() == 0) {
    LOG(WARNING) << "PS_HEARTBEAT_INTERVAL=0 turns heartbeats off: a node that stops (SIGSTOP, "
                    "a frozen machine, a network partition) is never declared dead, and every "
                    "wait on it lasts for ever";
  }
}

ClusterConfig Scheduler::NodeConfig(Role role) const {
  ClusterConfig node = config_;
  node.role = role;
  node.root_port = port_;
  return node;
}

int Scheduler::Run() {
  MutexLock lock(mu_);
  while (!finished_) finished_cv_.Wait(mu_);
  return status_;
}

void Scheduler::Stop(const std::string& why) {
  MutexLock lock(mu_);
  Finish(1, why);
}

std::string Scheduler::failure() const {
  MutexLock lock(mu_);
  return failure_;
}

std::uint64_t Scheduler::dropped_messages() const {
  MutexLock lock(mu_);
  return dropped_;
}

std::uint64_t Scheduler::refused_registrations() const {
  MutexLock lock(mu_);
  return refused_;
}

std::vector<NodeInfo> Scheduler::dead_nodes() const {
  MutexLock lock(mu_);
  std::vector<NodeInfo> dead;
  for (int id : dead_) dead.push_back(nodes_[id]);
  return dead;
}

void Scheduler::Send(Message msg) {
  msg.meta.sender = kSchedulerId;
  transport_->Send(msg);
}

bool Scheduler::IsLive(int id) const {
  return !dead_.contains(id) && !done_.contains(id) && !vacated_.contains(id);
}

void Scheduler::OnMessage(Message&& msg) {
  MutexLock lock(mu_);
  if (finished_) return;
  const Meta& meta = msg.meta;
  if (meta.control == Control::kRegister) {
    OnRegister(std::move(msg));
    return;
  }
  const bool known = complete_ && meta.sender > 0 &&
                     static_cast<std::size_t>(meta.sender) < nodes_.size() &&
                     meta.recipient == kSchedulerId;
  // A message counts as the node's only when it came on that node's own connection.
  if (!known ||
      msg.connection_key != transport_->ExpectedUser(nodes_[meta.sender].connection_key, "")) {
    if (LogOccurrence(++dropped_)) {
      LOG(WARNING) << "dropped a message (#" << dropped_ << ") "
                   << (known ? "that did not come from the connection of node "
                             : "from unregistered node ")
                   << meta.sender << ": " << msg.DebugString();
    }
    return;
  }
  last_seen_[meta.sender] = Clock::now();
  if (dead_.contains(meta.sender)) return;  // declared dead: too late to come back
  switch (meta.control) {
    case Control::kHeartbeat: {
      Message reply;
      reply.meta.control = Control::kHeartbeat;
      reply.meta.recipient = meta.sender;
      Send(std::move(reply));
      break;
    }
    case Control::kBarrier:
      OnBarrier(meta);
      break;
    case Control::kStalled:
    case Control::kWaitProbe:
      OnWaitMessage(msg);
      break;
    case Control::kPeerUnreachable:
      OnPeerUnreachable(msg);
      break;
    case Control::kNodeFailed:
      OnNodeFailed(meta);
      break;
    case Control::kWorkerDone:
      OnWorkerDone(meta);
      break;
    default:
      if (LogOccurrence(++dropped_)) {
        LOG(WARNING) << "dropped an unexpected message (#" << dropped_
                     << "): " << msg.DebugString();
      }
  }
}

// A node's ReportFailure: acknowledged, then the job ends naming it.
void Scheduler::OnNodeFailed(const Meta& meta) {
  Message reply;
  reply.meta.control = Control::kNodeFailed;
  reply.meta.recipient = meta.sender;
  reply.meta.timestamp = meta.timestamp;
  Send(std::move(reply));
  Finish(1, nodes_[meta.sender].Describe() +
                " failed: " + (meta.error.empty() ? std::string("no reason given") : meta.error));
}

void Scheduler::OnWorkerDone(const Meta& meta) {
  if (nodes_[meta.sender].role != Role::kWorker) return;
  const bool again = !done_.insert(meta.sender).second;  // sent again after a reset
  Message reply;
  reply.meta.control = Control::kWorkerDone;
  reply.meta.recipient = meta.sender;
  reply.meta.timestamp = meta.timestamp;
  Send(std::move(reply));
  if (again) return;
  if (!meta.error.empty()) {  // the worker failed: the job cannot succeed
    Finish(1, nodes_[meta.sender].Describe() + " failed: " + meta.error);
    return;
  }
  if (config_.verbose >= 1) LOG(INFO) << nodes_[meta.sender].Describe() << " finished";
  deadlocks_->Forget(meta.sender, LiveServers(), Clock::now());
  // Servers learn it too: a dist_sync round still waiting for this worker can never end.
  for (const int id : LiveServers()) {
    Send(Notice(Control::kWorkerDone, id, nodes_[meta.sender]));
  }
  // So can a vote of the other workers: it fails, naming this one.
  ReleaseBarriersOf(meta.sender);
  MaybeFinish();
}

std::optional<Scheduler::Refusal> Scheduler::SettingsRefusal(const NodeInfo& node,
                                                             std::string_view sent) const {
  const std::string who = RegistrantName(node);
  // A registration without readable settings is turned away, but does not end the job: a
  // stray or malformed message must not take a job down.
  const auto settings = ParseSharedSettings(sent);
  if (!settings) return Refusal{who + " sent malformed job settings", false};
  const auto value_of = [&](std::string_view name) -> const std::string* {
    for (const auto& [sent_name, value] : *settings) {
      if (sent_name == name) return &value;
    }
    return nullptr;
  };
  for (const ClusterConfig::SharedSetting& mine : config_.SharedSettings()) {
    const std::string name(mine.name);
    const std::string* theirs = value_of(name);
    if (theirs == nullptr) {
      return Refusal{who + " did not send its " + name +
                         " (a ps build older than the scheduler's?): run one build of ps for the "
                         "whole job",
                     false};
    }
    if (mine.among == ClusterConfig::SharedSetting::Among::kStoreWorkers) {
      // A worker without a KVStore (a Runtime used on its own) sends "".
      if (node.role != Role::kWorker || theirs->empty() || first_store_worker_ == kNoNode) {
        continue;
      }
      const std::string& first_type = store_types_.at(first_store_worker_);
      if (*theirs == first_type) continue;
      return AgainstEarlierNode(
          who + " created a " + *theirs + " KVStore, an earlier worker (" +
              RegistrantName(nodes_[static_cast<std::size_t>(first_store_worker_)]) + ") a " +
              first_type +
              ": every worker of a job must create the same type (the "
              "type given to KVStore::Create; ps-train --kvstore)",
          first_store_worker_);
    }
    if (mine.among == ClusterConfig::SharedSetting::Among::kAllNodes) {
      if (*theirs == mine.value) continue;
      return Refusal{who + " was started with " + name + "=" + *theirs + ", the scheduler with " +
                         name + "=" + mine.value + ": start every node of the job with the same " +
                         name,
                     true};
    }
    if (first_data_node_ == kNoNode) continue;
    const auto first = first_data_node_settings_.find(name);
    if (first == first_data_node_settings_.end() || first->second == *theirs) continue;
    return AgainstEarlierNode(
        who + " was started with " + name + "=" + *theirs + ", an earlier node (" +
            RegistrantName(nodes_[static_cast<std::size_t>(first_data_node_)]) + ") with " + name +
            "=" + first->second +
            ": servers and workers must slice keys alike, so start them with the same " + name,
        first_data_node_);
  }
  return std::nullopt;
}

Scheduler::Refusal Scheduler::AgainstEarlierNode(std::string why, int earlier) const {
  // An earlier node whose connection closed may be on its way out (vacated within
  // kReconnectGrace): a node restarted in its place with other settings is refused, but the
  // job does not end over a node that will not be part of it.
  if (suspected_.contains(earlier)) {
    return Refusal{std::move(why) +
                       " (that node's connection has closed: if it exited, its settings go "
                       "within " +
                       FormatSeconds(kReconnectGrace) + ", and this node may register then)",
                   false};
  }
  return Refusal{std::move(why), true};
}

std::optional<Scheduler::Refusal> Scheduler::LateJoinRefusal(const NodeInfo& node) const {
  if (!complete_) return std::nullopt;
  const std::string full =
      "the job already has all its nodes (DMLC_NUM_SERVER=" + std::to_string(config_.num_servers) +
      ", DMLC_NUM_WORKER=" + std::to_string(config_.num_workers) + ")";
  if (node.role == Role::kWorker) {
    // A worker that destroyed its store finished: its place is not free again.
    const std::string left =
        done_.empty() ? ""
                      : " A worker whose KVStore was destroyed has left the job (" +
                            std::to_string(done_.size()) +
                            " have) and cannot join it again: keep one store for the whole "
                            "program.";
    return Refusal{full +
                   "; was this worker started twice, or does its process create a second dist "
                   "KVStore (each Create registers a worker: share one store per process)?" +
                   left};
  }
  if (!config_.replicated()) {
    return Refusal{full +
                   "; without replication (PS_REPLICATION=0) a server cannot join a running job: "
                   "to use more servers, restart the job from a checkpoint (SaveCheckpoint, "
                   "ps-train --resume)"};
  }
  // A server started later takes the place of a dead one (AdmitInPlaceOfDead).
  if (DeadServerRank() < 0) {
    // Every rank has a live server: none died, or each dead one was replaced already.
    return Refusal{full +
                   (rejoins_ == 0 ? " and none of its servers died"
                                  : " and each of its servers that died was replaced "
                                    "already") +
                   ": a server started later joins a running job only in the place of a dead "
                   "one"};
  }
  if (rejoins_ >= kMaxRejoins) {
    return Refusal{"the job already admitted " + std::to_string(kMaxRejoins) +
                   " servers in the place of dead ones, the most a job admits: restart the "
                   "job from a checkpoint (SaveCheckpoint, ps-train --resume)"};
  }
  return std::nullopt;
}

std::optional<Scheduler::Refusal> Scheduler::RegistrationRefusal(const Message& msg) const {
  using Answer = Refusal::Answer;
  const Meta& meta = msg.meta;
  if (meta.nodes.size() != 1) {
    return Refusal{"with " + std::to_string(meta.nodes.size()) + " node entries", false,
                   Answer::kDrop};
  }
  const NodeInfo& node = meta.nodes[0];
  // The others will accept the node's messages only from connections that give the tokens of
  // the key it registers: its own connection must have given its token for the scheduler.
  if (msg.connection_key.empty() ||
      msg.connection_key != transport_->ExpectedUser(node.connection_key, "")) {
    return Refusal{"whose connection key is not its connection's", false, Answer::kDrop};
  }
  if (node.host.empty() || node.port <= 0 || node.port > 65535) {
    return Refusal{
        "without an address: host '" + node.host + "', port " + std::to_string(node.port), false,
        Answer::kDrop};
  }
  if (!registration_failure_.empty()) {
    return Refusal{"the job cannot start: " + registration_failure_, true};
  }
  if (node.role == Role::kScheduler) {
    return Refusal{"a second scheduler cannot join: set DMLC_ROLE to server or worker"};
  }
  if (auto refusal = LateJoinRefusal(node)) return refusal;
  // A node that sees the job differently would size rounds, heartbeats or key slices its own
  // way and hang the others: the job cannot run as launched. (Not fatal to a running job.)
  if (auto refusal = SettingsRefusal(node, meta.body)) {
    refusal->ends_job = refusal->ends_job && !complete_;
    return refusal;
  }
  int same_role = 0;
  for (const NodeInfo& other : nodes_) {
    if (other.host == node.host && other.port == node.port && IsLive(other.id)) {
      return Refusal{"a node at " + node.host + ":" + std::to_string(node.port) +
                     " is already registered"};
    }
    if (other.role == node.role && !vacated_.contains(other.id)) ++same_role;
  }
  const int wanted = node.role == Role::kServer ? config_.num_servers : config_.num_workers;
  if (!complete_ && same_role >= wanted) {
    return Refusal{"the job already has its " + std::to_string(wanted) + " " + RoleName(node.role) +
                   "(s): set " +
                   (node.role == Role::kServer ? "DMLC_NUM_SERVER" : "DMLC_NUM_WORKER") +
                   " to the number you start"};
  }
  // Every peer will connect to the advertised address: a name the scheduler cannot resolve
  // (a typo in DMLC_NODE_HOST, a resolver that differs) is turned away now, not found out as
  // requests that never arrive. No reply can reach that address: the node's registration
  // times out, and its message points here.
  try {
    net::ResolveIPv4(node.host,
                     "the host name this " + RoleName(node.role) + " advertises (DMLC_NODE_HOST)");
  } catch (const Error& e) {
    return Refusal{e.what(), false, Answer::kNoReply};
  }
  return std::nullopt;
}

void Scheduler::Refuse(const NodeInfo& node, const Refusal& refusal) {
  ++refused_;
  if (refusal.answer == Refusal::Answer::kNoReply) {
    LOG(WARNING) << "turned away " << RegistrantName(node) << ": " << refusal.why;
    return;
  }
  LOG(WARNING) << "refused " << RegistrantName(node) << ": " << refusal.why;
  const int socket_id = next_reject_id_++;
  try {
    transport_->Connect(socket_id, node.host, node.port, node.connection_key);
    Message reply = RegisterReply(socket_id, node.connection_key);
    reply.meta.error = refusal.why;
    Send(std::move(reply));
    transport_->Disconnect(socket_id);  // still flushes the reply
  } catch (const Error&) {
    // An address ZeroMQ cannot even parse: nobody to tell.
  }
  if (refusal.ends_job) {
    ++told_of_failure_;
    FailRegistration(refusal.why);
  }
}

void Scheduler::FailRegistration(const std::string& why) {
  if (registration_failure_.empty()) {
    registration_failure_ = why;
    // Not logged: the refusal that caused it was (Refuse), and the job's failure is the
    // caller's to report (failure()); ps-scheduler prints it once.
    for (std::size_t id = 1; id < nodes_.size(); ++id) {
      if (vacated_.contains(static_cast<int>(id))) continue;  // gone, and no longer counted
      Message reply = RegisterReply(static_cast<int>(id), nodes_[id].connection_key);
      reply.meta.error = registration_failure_;
      Send(std::move(reply));
      ++told_of_failure_;
    }
  }
  EndFailedRegistrationOnceAllTold();
}

void Scheduler::EndFailedRegistrationOnceAllTold() {
  // The nodes started after the failure still register: each is told why the job cannot
  // start (not left to time out), and once every expected node has been told the job ends.
  if (told_of_failure_ >= config_.num_servers + config_.num_workers) {
    Finish(1, registration_failure_);
  }
}

void Scheduler::OnRegister(Message&& msg) {
  const auto refusal = RegistrationRefusal(msg);
  if (!refusal && complete_) {
    AdmitInPlaceOfDead(msg.meta.nodes[0]);
  } else if (!refusal) {
    Admit(msg.meta.nodes[0], msg.meta.body);
  } else if (refusal->answer == Refusal::Answer::kDrop) {
    if (LogOccurrence(++dropped_)) {
      LOG(WARNING) << "dropped a register message (#" << dropped_ << ") " << refusal->why;
    }
  } else {
    Refuse(msg.meta.nodes[0], *refusal);
  }
}

void Scheduler::Admit(NodeInfo node, std::string_view settings) {
  // The place of one of its role that exited before the job filled up, else a new one.
  const auto vacated = std::ranges::find_if(
      vacated_, [&](int id) PS_REQUIRES(mu_) { return nodes_[id].role == node.role; });
  node.id = vacated != vacated_.end() ? *vacated : static_cast<int>(nodes_.size());
  try {
    ConnectToRegistrant(node);
  } catch (const Error& e) {
    Refuse(node, Refusal{e.what(), false, Refusal::Answer::kNoReply});
    return;
  }
  const std::string who = RegistrantName(node);
  for (const auto& [name, value] :
       ParseSharedSettings(settings).value_or(std::vector<std::pair<std::string, std::string>>{})) {
    if (first_data_node_ == kNoNode) first_data_node_settings_.emplace(name, value);
    if (name == ClusterConfig::kKVStoreTypeSetting && !value.empty() &&
        node.role == Role::kWorker) {
      store_types_[node.id] = value;
      if (first_store_worker_ == kNoNode) first_store_worker_ = node.id;
    }
  }
  if (first_data_node_ == kNoNode) first_data_node_ = node.id;
  const int requested = std::exchange(node.rank, -1);
  if (vacated != vacated_.end()) {
    LOG(WARNING) << who << " takes the place of " << RegistrantName(nodes_[node.id])
                 << ", which exited before the job filled up";
    const auto id = static_cast<std::size_t>(node.id);
    nodes_[id] = node;
    last_seen_[id] = Clock::now();
    requested_rank_[id] = requested;
    vacated_.erase(vacated);
  } else {
    nodes_.push_back(node);
    last_seen_.push_back(Clock::now());
    requested_rank_.push_back(requested);
  }
  Send(RegisterReply(node.id, node.connection_key));
  if (config_.verbose >= 1) {
    LOG(INFO) << RegistrantName(node) << " registered (" << Registrants() << " of "
              << config_.num_servers + config_.num_workers << ")";
  }
  if (Registrants() == config_.num_servers + config_.num_workers) CompleteRegistration();
}

int Scheduler::RankHolder(int rank) const {
  int holder = kNoNode;
  for (const NodeInfo& node : nodes_) {
    if (node.role == Role::kServer && node.rank == rank) holder = node.id;
  }
  return holder;
}

int Scheduler::DeadServerRank(int requested) const {
  const auto dead = [this](int rank) PS_REQUIRES(mu_) {
    const int holder = RankHolder(rank);
    return holder != kNoNode && dead_.contains(holder);
  };
  if (requested >= 0 && requested < config_.num_servers && dead(requested)) return requested;
  for (int rank = 0; rank < config_.num_servers; ++rank) {
    if (dead(rank)) return rank;
  }
  return -1;
}

Message Scheduler::Notice(Control control, int recipient, const NodeInfo& about) {
  Message notice;
  notice.meta.control = control;
  notice.meta.request = true;
  notice.meta.recipient = recipient;
  notice.meta.nodes.push_back(about);
  return notice;
}

void Scheduler::ConnectToRegistrant(const NodeInfo& node) {
  if (transport_->Connect(node.id, node.host, node.port, node.connection_key)) {
    unopened_.insert(node.id);
  } else {
    unopened_.erase(node.id);  // no event will say: nothing to tell
  }
}

void Scheduler::AdmitInPlaceOfDead(NodeInfo node) {
  const int rank = DeadServerRank(node.rank);  // the rank it asked for (PS_RANK), if dead
  node.id = static_cast<int>(nodes_.size());
  node.rank = rank;
  // Admitted and announced, a node the scheduler cannot then connect to would be declared
  // dead a heartbeat timeout later, never told why: refuse it while a reply can still go out.
  if (const std::string shortage = transport_->DescriptorShortage(); !shortage.empty()) {
    Refuse(node, Refusal{"the scheduler cannot take another node: " + shortage, false});
    return;
  }
  try {
    ConnectToRegistrant(node);
  } catch (const Error& e) {
    Refuse(node, Refusal{e.what(), false, Refusal::Answer::kNoReply});
    return;
  }
  const int dead_id = RankHolder(rank);
  nodes_.push_back(node);
  last_seen_.push_back(Clock::now());
  requested_rank_.push_back(-1);
  ++rejoins_;
  server_events_.push_back(ServerEvent{node.id, true});
  // The new server gets the table, then every server death and join so far in order (its own
  // last), as the others heard them, and the workers that finished: it starts where they are.
  Message table = RegisterReply(node.id, node.connection_key);
  table.meta.nodes = nodes_;
  Send(std::move(table));
  SendCatchUp(node.id);
  for (std::size_t other = 1; other + 1 < nodes_.size(); ++other) {
    if (IsLive(static_cast<int>(other)))
      Send(Notice(Control::kNodeJoined, static_cast<int>(other), node));
  }
  LOG(WARNING) << node.Describe() << " joined the job in the place of dead "
               << nodes_[static_cast<std::size_t>(dead_id)].Describe()
               << ": it keeps the copies of the server before it (PS_REPLICATION)";
}

void Scheduler::CompleteRegistration() {
  for (Role role : {Role::kServer, Role::kWorker}) {
    std::vector<NodeInfo*> group;
    for (NodeInfo& node : nodes_) {
      if (node.role == role) group.push_back(&node);
    }
    // A requested rank sorts first; nodes without one (-1) after all that have one.
    const auto key = [this](const NodeInfo* node) PS_REQUIRES(mu_) {
      const int requested = requested_rank_[static_cast<std::size_t>(node->id)];
      return std::tuple<int, const std::string&, int>(requested < 0 ? kNoRequest : requested,
                                                      node->host, node->port);
    };
    std::sort(group.begin(), group.end(),
              [&](const NodeInfo* a, const NodeInfo* b)
                  PS_REQUIRES(mu_) { return key(a) < key(b); });
    for (std::size_t rank = 0; rank < group.size(); ++rank)
      group[rank]->rank = static_cast<int>(rank);
    // Two nodes that asked for one rank (two pods with the same index): one gets another.
    for (const NodeInfo* node : group) {
      const int requested = requested_rank_[static_cast<std::size_t>(node->id)];
      if (requested >= 0 && requested != node->rank) {
        LOG(WARNING) << RegistrantName(*node) << " asked for rank " << requested
                     << " (PS_RANK) and got rank " << node->rank << ": another " << RoleName(role)
                     << " asked for the same one; give each node a PS_RANK of its own";
      }
    }
  }
  complete_ = true;
  const auto now = Clock::now();
  for (std::size_t id = 1; id < nodes_.size(); ++id) {
    last_seen_[id] = now;
    Message table = RegisterReply(static_cast<int>(id), nodes_[id].connection_key);
    table.meta.nodes = nodes_;
    Send(std::move(table));
  }
  LOG(INFO) << "all " << config_.num_servers << " server(s) and " << config_.num_workers
            << " worker(s) registered";
}

std::vector<int> Scheduler::LiveServers() const {
  std::vector<int> live;
  for (const int id : GroupMembers(kServerGroup)) {
    if (IsLive(id)) live.push_back(id);
  }
  return live;
}

void Scheduler::OnWaitMessage(const Message& msg) {
  const auto now = Clock::now();
  if (msg.meta.control == Control::kStalled) {
    if (nodes_[msg.meta.sender].role != Role::kWorker || !msg.meta.request) return;
    const auto notice = wire::DecodeStalled(msg.meta.body);
    if (!notice) return;
    if (config_.verbose >= 2) {
      LOG(INFO) << "stall " << notice->stall << " of " << nodes_[msg.meta.sender].Describe()
                << ": it waits for its dist_sync rounds"
                << (notice->several_threads ? " (other threads of it push or wait too)" : "");
    }
    deadlocks_->OnStalled(msg.meta.sender, *notice, LiveServers(), now);
    return;
  }
  // Workers in the workers' vote (DistKVStore's collectives), each waiting for every live
  // worker that has not voted.
  std::vector<VoteWait> votes;
  if (const auto arrived = barriers_.find(kWorkerGroup); arrived != barriers_.end()) {
    const std::vector<int> awaited = AwaitedMembers(kWorkerGroup, arrived->second);
    for (const auto& [waiter, arrival] : arrived->second) {
      const std::string call = ShownCall(arrival.vote);
      for (const int worker : awaited) votes.push_back({waiter, worker, call});
    }
  }
  const std::string deadlock = deadlocks_->OnAnswer(msg, LiveServers(), nodes_, votes, now);
  if (!deadlock.empty()) Finish(1, deadlock);
}

std::vector<int> Scheduler::GroupMembers(int group) const {
  std::vector<int> members;
  for (std::size_t id = 1; id < nodes_.size(); ++id) {
    if (RoleBit(nodes_[id].role) & group) members.push_back(static_cast<int>(id));
  }
  return members;
}

std::vector<int> Scheduler::AwaitedMembers(int group,
                                           const std::map<int, BarrierArrival>& arrived) const {
  std::vector<int> awaited = GroupMembers(group);
  std::erase_if(awaited, [&](int member) PS_REQUIRES(mu_) {
    return arrived.contains(member) || !IsLive(member);
  });
  return awaited;
}

void Scheduler::OnBarrier(const Meta& meta) {
  const int group = meta.barrier_group & (kServerGroup | kWorkerGroup);
  if (group == 0 || !(RoleBit(nodes_[meta.sender].role) & group)) {
    SendBarrierRelease(meta.barrier_group, meta.sender,
                       {meta.timestamp,
                        {"barrier group " + std::to_string(meta.barrier_group) +
                         " does not include " + nodes_[meta.sender].Describe()}});
    return;
  }
  // A request sent again after a reset: for a barrier that ended, the release again; for
  // the one in progress, nothing new.
  if (const auto last = released_.find({meta.barrier_group, meta.sender});
      last != released_.end() && meta.timestamp <= last->second.number) {
    if (meta.timestamp == last->second.number)
      SendBarrierRelease(meta.barrier_group, meta.sender, last->second);
    return;
  }
  auto& arrived = barriers_[meta.barrier_group];
  arrived[meta.sender] =
      BarrierArrival{meta.body, meta.error, meta.error_kind, meta.timestamp, Clock::now()};
  if (config_.verbose >= 2) {
    LOG(INFO) << nodes_[meta.sender].Describe() << " waits in barrier " << meta.timestamp
              << " of group " << meta.barrier_group << " (" << arrived.size() << " of "
              << GroupMembers(group).size() << " there)";
  }
  for (int member : GroupMembers(group)) {
    if (!IsLive(member)) {
      ReleaseBarrier(meta.barrier_group, {WhyAbsent(member)});
      return;
    }
  }
  if (arrived.size() == GroupMembers(group).size()) {
    ReleaseBarrier(meta.barrier_group, BarrierVerdict(arrived));
  }
}

std::string Scheduler::WhyAbsent(int id) const {
  if (dead_.contains(id)) return nodes_[id].Describe() + " died";
  return nodes_[id].Describe() +
         " has finished (its KVStore was destroyed, or its process ended) and takes part in no "
         "more collectives: every worker must make the same collective calls (Barrier, Init, "
         "SetOptimizer, checkpoints)";
}

Scheduler::Verdict Scheduler::BarrierVerdict(const std::map<int, BarrierArrival>& arrived) const {
  // At most this many failures or distinct votes are spelled out, each at most this long: the
  // verdict goes to every member.
  constexpr std::size_t kListed = 4;
  constexpr std::size_t kMaxVoteChars = 300;
  const auto shown = [](const std::string& text) {
    return text.size() <= kMaxVoteChars ? text : text.substr(0, kMaxVoteChars) + "...";
  };
  const auto who = [this](int id) PS_REQUIRES(mu_) {
    const NodeInfo& node = nodes_[id];
    return RoleName(node.role) + " " + std::to_string(node.rank);
  };
  Verdict verdict;
  std::size_t failures = 0;
  for (const auto& [id, arrival] : arrived) {
    if (arrival.error.empty()) continue;
    // One kind only if all that failed agree on it: a mix is no failure a caller can act on.
    verdict.kind = failures == 0 || verdict.kind == arrival.error_kind ? arrival.error_kind
                                                                       : ErrorKind::kOther;
    if (++failures <= kListed) {
      verdict.error +=
          (verdict.error.empty() ? "" : "; ") + who(id) + " failed: " + shown(arrival.error);
    }
  }
  if (failures > kListed) {
    verdict.error += " (and " + std::to_string(failures - kListed) + " more)";
  }
  if (failures > 0) return verdict;
  // Members that are about to do different things (a collective called with other arguments,
  // or another collective): each distinct vote once, with the members that gave it.
  std::vector<std::pair<const std::string*, std::string>> votes;  // vote, its members
  for (const auto& [id, arrival] : arrived) {
    const std::string& vote_of_id = arrival.vote;  // lambdas capture no binding before clang 16
    auto same = std::find_if(votes.begin(), votes.end(),
                             [&](const auto& vote) { return *vote.first == vote_of_id; });
    if (same == votes.end()) {
      votes.emplace_back(&vote_of_id, who(id));
    } else {
      same->second += ", " + std::to_string(nodes_[id].rank);
    }
  }
  if (votes.size() == 1) return {};
  verdict.kind = ErrorKind::kDisagreement;
  verdict.error = "the members disagree" + FirstDifference(votes[0], votes[1]) + ": ";
  for (std::size_t i = 0; i < votes.size() && i < kListed; ++i) {
    verdict.error += (i == 0 ? "" : "; ") + votes[i].second + " called " +
                     (votes[i].first->empty() ? "a plain barrier" : shown(*votes[i].first));
  }
  if (votes.size() > kListed) {
    verdict.error += " (and " + std::to_string(votes.size() - kListed) + " other calls)";
  }
  return verdict;
}

void Scheduler::ReleaseBarriersOf(int id) {
  std::vector<int> blocked;
  for (const auto& [group, arrived] : barriers_) {
    if (RoleBit(nodes_[id].role) & group) blocked.push_back(group);
  }
  for (int group : blocked) ReleaseBarrier(group, {WhyAbsent(id)});
}

void Scheduler::ReleaseBarrier(int group, const Verdict& verdict) {
  const auto it = barriers_.find(group);
  if (it == barriers_.end()) return;
  for (const auto& [id, arrival] : it->second) {
    const BarrierRelease& release = released_[{group, id}] = {arrival.number, verdict};
    SendBarrierRelease(group, id, release);
  }
  barriers_.erase(it);
  barrier_noted_.erase(group);
}

void Scheduler::NoteLongBarriers(Clock::time_point now) {
  const std::chrono::milliseconds note_after = config_.long_wait_note();
  for (const auto& [group, arrived] : barriers_) {
    const auto first =
        std::ranges::min_element(arrived, {}, [](const auto& entry) { return entry.second.at; });
    const auto noted = barrier_noted_.find(group);
    if (first == arrived.end() ||
        (noted == barrier_noted_.end() ? now - first->second.at < note_after
                                       : now - noted->second < ClusterConfig::kLongWaitNoteEvery)) {
      continue;
    }
    std::string absent;
    for (const int member : AwaitedMembers(group, arrived)) {
      absent += (absent.empty() ? "" : ", ") + nodes_[member].Describe();
    }
    if (absent.empty()) continue;  // released at the next arrival or death
    barrier_noted_[group] = now;
    std::string_view vote = first->second.vote;
    const std::string waited = FormatSeconds(
        std::chrono::duration_cast<std::chrono::milliseconds>(now - first->second.at));
    if (group == kWorkerGroup && vote.ends_with(Runtime::kOutcomeVoteSuffix)) {
      vote.remove_suffix(Runtime::kOutcomeVoteSuffix.size());
      // Every worker entered the call (they agreed on it): the absent one does its work.
      LOG(WARNING) << "the workers' collective " << ShownCall(vote) << " has waited " << waited
                   << " for the outcome from " << absent
                   << ", which is still doing the call's work (its values, files or settings "
                      "reach the servers; a slow link or a big call takes a while): the job "
                      "goes on once it is done";
      continue;
    }
    LOG(WARNING) << (group == kWorkerGroup && !vote.empty()
                         ? "the workers' collective " + ShownCall(vote)
                         : "a barrier of group " + std::to_string(group))
                 << " has waited " << waited << " for " << absent
                 << ", which has not entered it: still working (the job goes on once it enters), "
                    "or its program skips the call (every worker must make the same collective "
                    "calls)";
  }
}

void Scheduler::SendBarrierRelease(int group, int id, const BarrierRelease& release) {
  Message message;
  message.meta.control = Control::kBarrierRelease;
  message.meta.recipient = id;
  message.meta.barrier_group = group;
  message.meta.timestamp = release.number;
  message.meta.error = release.verdict.error;
  message.meta.error_kind = release.verdict.kind;
  Send(std::move(message));
}

void Scheduler::OnTick() {
  MutexLock lock(mu_);
  if (finished_) return;
  ApplyConnectionEvents();
  const auto now = Clock::now();
  const auto pause = pause_watch_.Tick(now);
  if (!complete_) {
    VacateClosedRegistrants(now);
    if (now - started_ > config_.register_timeout) EndUnfilledRegistration();
    return;
  }
  if (DeclareClosedConnectionsDead(now)) return;  // one death per tick
  deadlocks_->OnTick(LiveServers(), now);
  NoteLongBarriers(now);
  if (config_.heartbeat_interval.count() == 0) return;
  if (pause > pause.zero()) {
    // Not the nodes' silence but this process's: each gets a full timeout from now, in which
    // the heartbeats queued meanwhile are read (a node that died still closes its connection).
    LOG(WARNING) << "the scheduler did not run for "
                 << FormatSeconds(std::chrono::duration_cast<std::chrono::milliseconds>(pause))
                 << " (stopped, e.g. by SIGSTOP, or its machine frozen): heartbeats are counted "
                    "from now, no node is judged on that silence";
    std::fill(last_seen_.begin(), last_seen_.end(), now);
    // Reports and answers read after the pause arrived in no telling order: the nodes that
    // still cannot reach a peer report again, and the peers are asked again.
    unreachable_.clear();
    return;
  }
  if (EndJobOverUnreachablePeers(now)) return;
  ProbeQuietNodes(now);
  JudgeSilentNodes(now);
}

void Scheduler::ProbeQuietNodes(Clock::time_point now) {
  for (std::size_t id = 1; id < nodes_.size(); ++id) {
    if (!IsLive(static_cast<int>(id)) || now - last_seen_[id] <= config_.heartbeat_timeout / 2) {
      continue;
    }
    Clock::time_point& probed = probed_at_[static_cast<int>(id)];
    if (probed > last_seen_[id]) continue;  // once per silence
    probed = now;
    Message probe;
    probe.meta.control = Control::kHeartbeat;  // the answer to a heartbeat: the node ignores it
    probe.meta.recipient = static_cast<int>(id);
    Send(std::move(probe));
  }
}

void Scheduler::EndUnfilledRegistration() {
  int servers = 0;
  int workers = 0;
  for (const NodeInfo& node : nodes_) {
    if (vacated_.contains(node.id)) continue;
    servers += node.role == Role::kServer;
    workers += node.role == Role::kWorker;
  }
  const std::string why =
      "only " + std::to_string(servers) + " of " + std::to_string(config_.num_servers) +
      " server(s) and " + std::to_string(workers) + " of " + std::to_string(config_.num_workers) +
      " worker(s) registered within " + FormatSeconds(config_.register_timeout) +
      ": start the missing nodes or fix DMLC_NUM_SERVER/DMLC_NUM_WORKER "
      "(PS_REGISTER_TIMEOUT sets this wait)";
  // Nodes that tried but could not authenticate are the likelier cause then.
  const std::uint64_t refused = transport_->refused_connections();
  const std::string refusals =
      refused == 0 ? ""
                   : "; " + std::to_string(refused) +
                         " connection(s) were refused meanwhile for a wrong or missing "
                         "PS_JOB_SECRET or another PS_ENCRYPT (logged above): start every "
                         "node with the job's secret and settings";
  FailRegistration(why + refusals);
  Finish(1, registration_failure_);
}

void Scheduler::JudgeSilentNodes(Clock::time_point now) {
  // Every live node silent at once, their connections open: the scheduler's own host or link
  // is the likelier cause than as many nodes failing together.
  std::size_t live_nodes = 0;
  std::size_t silent_nodes = 0;
  for (std::size_t id = 1; id < nodes_.size(); ++id) {
    if (!IsLive(static_cast<int>(id))) continue;
    ++live_nodes;
    silent_nodes += now - last_seen_[id] > config_.heartbeat_timeout ? 1 : 0;
  }
  if (live_nodes >= 2 && silent_nodes == live_nodes) {
    Finish(1, "no node of the job has been heard from for over " +
                  FormatSeconds(config_.heartbeat_timeout) + " (PS_HEARTBEAT_TIMEOUT): all " +
                  std::to_string(live_nodes) +
                  " went silent together, their connections still open, so the scheduler's "
                  "own host or network is the likely cause (a link down, a firewall), or every "
                  "node was stopped (a launcher stopped with its processes)");
    return;
  }
  for (std::size_t id = 1; id < nodes_.size(); ++id) {
    if (IsLive(static_cast<int>(id)) && now - last_seen_[id] > config_.heartbeat_timeout) {
      const NodeInfo& node = nodes_[id];
      // What the probe of ProbeQuietNodes met on its way, if this connection tells.
      const std::string path = ExplainSilence(transport_->LinkTo(static_cast<int>(id)),
                                              config_.heartbeat_timeout, "the scheduler");
      const std::string silent = "no heartbeat for over " +
                                 FormatSeconds(config_.heartbeat_timeout) +
                                 " (PS_HEARTBEAT_TIMEOUT)" + (path.empty() ? "" : ", and " + path);
      // Its registration reply never left: the node waits for it, and sends no heartbeat.
      DeclareDead(static_cast<int>(id),
                  unopened_.contains(static_cast<int>(id))
                      ? silent + ", and the scheduler could not connect to its address " +
                            node.host + ":" + std::to_string(node.port) +
                            " since it registered: set DMLC_NODE_HOST (or DMLC_INTERFACE) on "
                            "that node to an address every node of the job can reach"
                      : silent);
      return;  // one death per tick (the job may have ended)
    }
  }
}

void Scheduler::OnPeerConnection(int id, bool connected) {
  // Queued, not applied here: this thread must never wait for mu_, which is held while calling
  // the transport (whose socket monitors wait for this thread).
  MutexLock lock(connection_events_mu_);
  connection_events_.push_back(ConnectionEvent{id, connected, Clock::now()});
}

void Scheduler::ApplyConnectionEvents() {
  std::vector<ConnectionEvent> events;
  {
    MutexLock lock(connection_events_mu_);
    events.swap(connection_events_);
  }
  for (const ConnectionEvent& event : events) {
    const int id = event.id;
    // A registrant hears its node table only over this connection, and sends no heartbeat
    // before: on a long path it opens seconds after the registration, and the node's silence
    // counts from then.
    if (event.connected && unopened_.erase(id) != 0 &&
        static_cast<std::size_t>(id) < nodes_.size()) {
      last_seen_[static_cast<std::size_t>(id)] =
          std::max(last_seen_[static_cast<std::size_t>(id)], event.at);
    }
    // Finished workers, dead nodes and refused registrations are nobody's concern: their
    // connections close as they exit.
    if (id <= 0 || static_cast<std::size_t>(id) >= nodes_.size() || !IsLive(id)) continue;
    if (event.connected) {
      if (suspected_.erase(id) == 0) continue;
      if (config_.verbose >= 1) {
        LOG(INFO) << "the connection to " << nodes_[id].Describe() << " is back";
      }
      // A reset: what was on its way to the node may be lost. It sends the barrier it waits
      // in again, if any (the release comes again), and gets the notices again.
      Send(Notice(Control::kConnectionReset, id, nodes_[id]));
      SendCatchUp(id);
    } else if (suspected_.emplace(id, event.at).second && config_.verbose >= 1) {
      LOG(INFO) << "the connection to " << nodes_[id].Describe()
                << " closed: it is declared dead unless it is back within "
                << FormatSeconds(kReconnectGrace);
    }
  }
}

void Scheduler::SendCatchUp(int id) {
  for (const ServerEvent& event : server_events_) {
    Send(Notice(event.joined ? Control::kNodeJoined : Control::kNodeDead, id,
                nodes_[static_cast<std::size_t>(event.node_id)]));
  }
  for (const int dead : dead_) {
    if (nodes_[dead].role != Role::kServer) Send(Notice(Control::kNodeDead, id, nodes_[dead]));
  }
  if (nodes_[id].role != Role::kServer) return;  // only servers hear of finished workers
  for (const int worker : done_) Send(Notice(Control::kWorkerDone, id, nodes_[worker]));
}

void Scheduler::VacateClosedRegistrants(Clock::time_point now) {
  for (auto it = suspected_.begin(); it != suspected_.end();) {
    const int id = it->first;
    if (now - it->second < kReconnectGrace) {
      ++it;
      continue;
    }
    it = suspected_.erase(it);
    vacated_.insert(id);
    transport_->Disconnect(id);  // its process is gone; the next of its role connects anew
    ForgetSettingsOf(id);
    const NodeInfo& node = nodes_[static_cast<std::size_t>(id)];
    LOG(WARNING) << RegistrantName(node)
                 << " registered, then its connection closed and did not come back within "
                 << FormatSeconds(kReconnectGrace)
                 << " (the process exited or was killed) before the job filled up: its place "
                    "goes to the next "
                 << RoleName(node.role) << " that registers";
  }
}

void Scheduler::ForgetSettingsOf(int id) {
  // The later registrants matched the vacated one's settings (or were refused), so they stand
  // while one of them is left; a registrant that exited must not set them for the job alone (a
  // node started wrongly, stopped and started again, would be refused for its own old self).
  store_types_.erase(id);
  if (first_store_worker_ == id) {
    first_store_worker_ = store_types_.empty() ? kNoNode : store_types_.begin()->first;
  }
  if (first_data_node_ != id) return;
  first_data_node_ = kNoNode;
  for (std::size_t other = 1; other < nodes_.size(); ++other) {
    if (!vacated_.contains(static_cast<int>(other))) {
      first_data_node_ = static_cast<int>(other);
      return;
    }
  }
  first_data_node_settings_.clear();
}

bool Scheduler::DeclareClosedConnectionsDead(Clock::time_point now) {
  for (auto it = suspected_.begin(); it != suspected_.end();) {
    const int id = it->first;
    if (!IsLive(id)) {
      it = suspected_.erase(it);
    } else if (now - it->second >= kReconnectGrace) {
      suspected_.erase(it);
      DeclareDead(id, "its connection closed and did not come back within " +
                          FormatSeconds(kReconnectGrace) + ": the process exited or was killed" +
                          (nodes_[static_cast<std::size_t>(id)].role == Role::kWorker
                               ? " (a worker whose program ends without destroying its "
                                 "KVStore counts as dead too)"
                               : ""));
      return true;
    } else {
      ++it;
    }
  }
  return false;
}

void Scheduler::OnPeerUnreachable(const Message& msg) {
  const Meta& meta = msg.meta;
  const Clock::time_point now = Clock::now();
  if (!meta.request) {  // a peer's answer: it lives
    for (auto& [pair, report] : unreachable_) {
      if (pair.second == meta.sender && report.probe == meta.timestamp) report.answered = now;
    }
    return;
  }
  const auto notice = wire::DecodeUnreachable(meta.body);
  const int peer = meta.nodes.size() == 1 ? meta.nodes[0].id : kNoNode;
  if (!notice || peer <= 0 || static_cast<std::size_t>(peer) >= nodes_.size() ||
      peer == meta.sender ||
      (nodes_[static_cast<std::size_t>(peer)].role == Role::kWorker &&
       nodes_[static_cast<std::size_t>(meta.sender)].role == Role::kWorker)) {
    if (LogOccurrence(++dropped_)) {
      LOG(WARNING) << "dropped a malformed message (#" << dropped_ << "): " << msg.DebugString();
    }
    return;
  }
  if (!IsLive(peer)) return;  // its death was the cause, and is handled
  UnreachableReport& report = unreachable_[{meta.sender, peer}];
  report.reported = now;
  // At most a day: a larger figure is garbage, and would overflow as milliseconds.
  report.closed_ms = std::min<std::uint64_t>(notice->closed_ms, 86'400'000);
  report.never_connected = notice->never_connected;
  // Asked again with each report until it answers: a question lost (a reset of the connection
  // to the peer) must not leave the report waiting for ever.
  if (report.answered) return;
  if (report.probe == 0) report.probe = ++unreachable_probes_;
  Message question;
  question.meta.control = Control::kPeerUnreachable;
  question.meta.request = true;
  question.meta.recipient = peer;
  question.meta.timestamp = report.probe;
  Send(std::move(question));
}

bool Scheduler::EndJobOverUnreachablePeers(Clock::time_point now) {
  for (auto it = unreachable_.begin(); it != unreachable_.end();) {
    const auto [reporter, peer] = it->first;
    const UnreachableReport& report = it->second;
    if (!IsLive(reporter) || !IsLive(peer) || now - report.reported > config_.heartbeat_timeout) {
      it = unreachable_.erase(it);
      continue;
    }
    if (!report.answered || report.reported <= *report.answered) {
      ++it;
      continue;
    }
    const NodeInfo& from = nodes_[static_cast<std::size_t>(reporter)];
    const NodeInfo& to = nodes_[static_cast<std::size_t>(peer)];
    const std::string closed = FormatSeconds(std::chrono::milliseconds(report.closed_ms));
    const std::string path = from.host == to.host
                                 ? "the network on " + from.host
                                 : "the network between " + from.host + " and " + to.host;
    Finish(1, from.Describe() + " cannot reach " + to.Describe() + ": " +
                  (report.never_connected
                       ? "its connection to it has not opened in " + closed
                       : "its connection to it closed and has stayed closed for " + closed) +
                  ", while " + to.Describe() + " still answers the scheduler: " + path +
                  (report.never_connected
                       ? " does not let them connect (a firewall rule or a route), or " +
                             to.Describe() +
                             " accepts no connection (out of descriptors: its log says "
                             "'could not accept a connection')"
                       : " drops their traffic (a firewall rule, a route or a link down)") +
                  "; let every host of the job reach every other on the ports its nodes listen "
                  "on");
    return true;
  }
  return false;
}

void Scheduler::DeclareDead(int id, const std::string& why) {
  dead_.insert(id);
  transport_->Abandon(id);  // what is queued for it can never arrive: exit without waiting
  const NodeInfo& node = nodes_[id];
  LOG(ERROR) << node.Describe() << " is dead: " << why;
  if (node.role == Role::kServer) server_events_.push_back(ServerEvent{id, false});
  for (std::size_t other = 1; other < nodes_.size(); ++other) {
    if (IsLive(static_cast<int>(other)))
      Send(Notice(Control::kNodeDead, static_cast<int>(other), node));
  }
  ReleaseBarriersOf(id);
  deadlocks_->Forget(id, LiveServers(), Clock::now());
  // With replication a server's key ranges live on in its replica, which takes them over as
  // soon as it hears of the death (the notice above); the job goes on while a server lives.
  if (node.role == Role::kServer && config_.replicated()) {
    const std::size_t live_servers = LiveServers().size();
    if (live_servers > 0) {
      LOG(WARNING) << "the job goes on without " << node.Describe() << ": " << live_servers
                   << " server(s) left; its replica serves its keys (PS_REPLICATION)";
      return;
    }
    std::string before;
    for (const int dead : dead_) {
      if (dead == id || nodes_[static_cast<std::size_t>(dead)].role != Role::kServer) continue;
      before += (before.empty() ? "" : ", ") + nodes_[static_cast<std::size_t>(dead)].Describe();
    }
    if (!before.empty()) {
      Finish(1, node.Describe() + " died (" + why + "), and no server is left (" + before +
                    " died before it): no copy of the job's keys remains; start the job again "
                    "from its last checkpoint (LoadCheckpoint, ps-train --resume)");
      return;
    }
  }
  // A job that lost a node cannot go on as launched: end it now, naming the node, instead of
  // letting the others discover it one timeout at a time.
  Finish(1, node.Describe() + " died (" + why + ")");
}

void Scheduler::MaybeFinish() {
  for (std::size_t id = 1; id < nodes_.size(); ++id) {
    if (nodes_[id].role == Role::kWorker && IsLive(static_cast<int>(id))) return;
  }
  Finish(0, "");
}

void Scheduler::Finish(int status, const std::string& given) {
  if (finished_) return;
  // The nodes give up on a scheduler that did not run for longer than their timeout, and say
  // so on their way out: its pause, not what they reported, is the cause. The pause may still
  // be untold (the receive thread read their reports before the next tick).
  const auto now = Clock::now();
  auto pause = pause_watch_.SinceTick(now);
  if (now - pause_watch_.last_pause_ended() < 2 * config_.heartbeat_timeout) {
    pause = std::max(pause, pause_watch_.last_pause());
  }
  const std::string why =
      status != 0 && config_.heartbeat_interval.count() > 0 && pause > config_.heartbeat_timeout
          ? "the scheduler itself did not run for " +
                FormatSeconds(std::chrono::duration_cast<std::chrono::milliseconds>(pause)) +
                " (stopped, e.g. by SIGSTOP, or its machine frozen), longer than the nodes wait "
                "for it (PS_HEARTBEAT_TIMEOUT " +
                FormatSeconds(config_.heartbeat_timeout) + "), so they gave up; then " + given
          : given;
  for (std::size_t id = 1; id < nodes_.size(); ++id) {
    if (!IsLive(static_cast<int>(id))) continue;
    Message terminate;
    terminate.meta.control = Control::kTerminate;
    terminate.meta.recipient = static_cast<int>(id);
    terminate.meta.error = why;
    // A node still waiting for the table knows the scheduler by its echoed key (Runtime).
    terminate.meta.body = nodes_[id].connection_key;
    Send(std::move(terminate));
  }
  finished_ = true;
  status_ = status;
  failure_ = why;
  // A failure is not logged here: Run's caller reports failure() (ps-scheduler prints it once,
  // as "ps-scheduler: error: ..."), so it does not appear twice.
  if (status == 0) LOG(INFO) << "every worker finished: the job is done";
  finished_cv_.NotifyAll();
}

}  // namespace ps
