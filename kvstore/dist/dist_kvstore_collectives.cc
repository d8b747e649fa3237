// DistKVStore's collective calls: Barrier, SetOptimizer, SetGradientCompression and the
// checkpoint calls. Every worker states its call first (Runtime::Agree), so ranks that
// disagree fail everywhere; worker 0 then does the work over the live servers, running it
// again after a server death or a connection reset, and every worker learns the outcome.
#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <thread>

#include "kvstore/checkpoint.h"
#include "kvstore/dist/dist_kvstore.h"
#include "kvstore/dist/dist_kvstore_common.h"
#include "ps/src/internal.h"

namespace ps {

using dist_detail::Bounded;
using dist_detail::ConnectionReset;
using dist_detail::FailureOf;
using dist_detail::kStore;
using dist_detail::ServerLost;

namespace {

std::string DescribeOptimizer(const OptimizerConfig& config) {
  char text[512];
  const LRSchedule& s = config.schedule;
  std::snprintf(text, sizeof(text),
                "%s lr=%.9g momentum=%.9g wd=%.9g rescale=%.9g clip=%.9g beta1=%.9g beta2=%.9g "
                "epsilon=%.9g rho=%.9g schedule=%s step=%llu factor=%.9g stop=%.9g max_update=%llu "
                "final=%.9g warmup=%llu from=%.9g steps=",
                config.name.c_str(), config.learning_rate, config.momentum, config.weight_decay,
                config.rescale_grad, config.clip_gradient, config.beta1, config.beta2,
                config.epsilon, config.rho, s.type.empty() ? "constant" : s.type.c_str(),
                static_cast<unsigned long long>(s.step), s.factor, s.stop_factor_lr,
                static_cast<unsigned long long>(s.max_update), s.final_lr,
                static_cast<unsigned long long>(s.warmup_steps), s.warmup_begin_lr);
  std::string call = text;
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    call += (i == 0 ? "" : ",") + std::to_string(s.steps[i]);
  }
  return Bounded(std::move(call));
}

// `dir` as the servers, which run in directories of their own, must get it: a relative one
// from this worker's working directory.
std::string CheckpointDir(const std::string& dir) {
  if (dir.empty()) return dir;
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(dir, error);
  return error ? dir : absolute.lexically_normal().string();
}

}  // namespace

DistKVStore::OneCollective::OneCollective(std::atomic<bool>& running, std::string_view op)
    : running_(running) {
  if (running_.exchange(true)) {
    throw Error(std::string(kStore) + ": " + std::string(op) +
                " was called while another thread of this worker is in a collective call: the "
                "workers' collective calls pair up in order, so call Init, SetOptimizer, "
                "SetGradientCompression, Barrier and the checkpoint calls from one thread");
  }
}

DistKVStore::OneCollective::~OneCollective() { running_.store(false); }

void DistKVStore::Barrier() {
  const auto in_call = EnterCall("Barrier");
  RefuseAfterFailure("Barrier");
  const OneCollective one(collective_running_, "Barrier");
  try {
    AgreeAmongWorkers("Barrier", "");
  } catch (const Error& e) {
    Raise(e.kind(), std::string(kStore) + ": Barrier failed on every worker: " + e.what());
  }
}

void DistKVStore::RunOverLiveServers(std::string_view op, const std::function<void()>& work) {
  WaitAll();  // an earlier operation's error fails the call, never to be hidden by a retry
  // Each pass follows a server death or join (both bounded in number), or one of at most
  // kMaxResetRetries connection resets, so this ends.
  int reset_retries = 0;
  for (;;) {
    const std::size_t deaths = runtime_->dead_count();
    const std::size_t events = runtime_->server_event_count();
    const std::uint64_t resets = runtime_->connection_reset_count();
    try {
      work();
      WaitAll();
    } catch (const ServerLost& e) {
      const std::size_t live = LiveServerRanks().size();
      if (!replicated_ || live == 0 || runtime_->dead_count() == deaths) throw;
      PS_LOG(WARNING) << "worker " << Rank() << ": " << op
                      << " failed as a server died: " << e.what() << "; running it again on the "
                      << live << " live servers";
      continue;
    } catch (const Error& e) {
      // A reset of this request's connection, or of another meanwhile, may have lost a request
      // or its answer: each collective is safe to run twice.
      const bool reset = dynamic_cast<const ConnectionReset*>(&e) != nullptr ||
                         runtime_->connection_reset_count() != resets;
      if (replicated_ && reset && reset_retries++ < kMaxResetRetries) {
        PS_LOG(WARNING) << "worker " << Rank() << ": " << op << " failed as a connection was "
                        << "reset: " << e.what() << "; running it again";
        continue;
      }
      // Another failure while servers died or joined may be theirs (a server that took a
      // dead one's rank and holds nothing yet): once more, on the servers as they are now.
      if (!replicated_ ||
          (runtime_->dead_count() == deaths && runtime_->server_event_count() == events)) {
        throw;
      }
      PS_LOG(WARNING) << "worker " << Rank() << ": " << op << " failed while servers died or "
                      << "joined: " << e.what() << "; running it again on the "
                      << LiveServerRanks().size() << " live servers";
      continue;
    }
    // A server that joined meanwhile may have missed the call: it runs again on every live
    // server (each collective is safe to run twice).
    const auto since = runtime_->ServerEvents(events);
    if (!std::any_of(since.begin(), since.end(), [](const auto& event) { return event.joined; })) {
      return;
    }
    PS_LOG(WARNING) << "worker " << Rank() << ": a server joined during " << op
                    << "; running it again on the " << LiveServerRanks().size() << " live servers";
  }
}

void DistKVStore::AgreeAmongWorkers(const std::string& call, const std::string& failure,
                                    ErrorKind failure_kind) {
  std::string why = failure;
  if (why.empty() && sync_ && OnlyCallerPushes()) {
    why = AnnounceCollective(call);
    runtime_->Agree(kWorkerGroup, call, why);
    return;
  }
  ++collectives_entered_;  // every worker counts it, failed or not
  if (!sync_ || !why.empty()) {
    runtime_->Agree(kWorkerGroup, call, why, {}, failure_kind);
    return;
  }
  // Unannounced, the servers cannot tell that a round waits for this worker's push while it
  // votes: a vote that lasts is reported as a stall of several threads, for the scheduler to
  // suspect a deadlock with a worker whose wait needs that push (deadlock_watch.h).
  WaitStall stall(*this, {}, true);  // ends with the vote, thrown or not
  runtime_->Agree(kWorkerGroup, call, why, [&stall] { stall.Tick(); });
}

bool DistKVStore::OnlyCallerPushes() const {
  const std::thread::id first = pusher_.load();
  return !several_pushers_.load() &&
         (first == std::thread::id{} || first == std::this_thread::get_id());
}

std::string DistKVStore::AnnounceCollective(const std::string& call) {
  struct Answers {
    Mutex mu;
    CondVar arrived;
    std::size_t remaining PS_GUARDED_BY(mu) = 0;
    std::string refusal PS_GUARDED_BY(mu);
  } answers;
  kv::Request request;
  request.command = kv::kCollective;
  request.call = Bounded(call);  // for the servers' messages: its start is enough
  // A server that knows of a death or join this worker has not heard of yet may get pushes of
  // this worker sent again after the announcement: it does not check this collective.
  request.membership = runtime_->server_events_applied();
  const std::vector<int> servers = LiveServerRanks();
  {
    MutexLock lock(answers.mu);
    answers.remaining = servers.size();
  }
  {
    // Pushes are stamped and sent under seq_mu_ too: every push sent before this announcement
    // is ahead of it on its connection and carries the count without this collective; every
    // push sent after it (another thread's, while this one votes) carries the count with it,
    // that is, counts as after the collective.
    MutexLock numbering(seq_mu_);
    request.collectives = collectives_entered_.load();
    for (const int s : servers) {
      Message message = kv::RequestMessage(request, runtime_->ServerId(s));
      runtime_->Request(std::span<Message>(&message, 1), [&answers](RequestResult&& result) {
        MutexLock lock(answers.mu);
        // A server lost meanwhile fails the collective on its own; a refusal names the round.
        if (!result.ok() && result.lost_peer == kNoNode && answers.refusal.empty()) {
          answers.refusal = result.error;
        }
        if (--answers.remaining == 0) answers.arrived.NotifyAll();
      });
    }
    ++collectives_entered_;
  }
  MutexLock lock(answers.mu);
  while (answers.remaining > 0) answers.arrived.Wait(answers.mu);
  return answers.refusal;
}

void DistKVStore::Collective(std::string_view op, const std::string& call,
                             const std::string& local_error, const std::function<void()>& work,
                             const std::function<void()>& undo) {
  RefuseAfterFailure(op);
  const OneCollective one(collective_running_, op);
  const auto failed_everywhere = [&](const Error& e) {
    // A worker whose own checks failed throws its own words; the others learn who and why.
    if (!local_error.empty()) throw Error(local_error);
    Raise(e.kind(),
          std::string(kStore) + ": " + std::string(op) + " failed on every worker: " + e.what());
  };
  try {
    AgreeAmongWorkers(call, local_error);
  } catch (const Error& e) {
    failed_everywhere(e);
  }
  std::string error;
  ErrorKind error_kind = ErrorKind::kOther;
  if (Rank() == 0) {
    try {
      RunOverLiveServers(op, work);
    } catch (const Error& e) {
      error = e.what();
      error_kind = e.kind();
      try {
        if (undo) undo();
      } catch (const std::exception& undo_error) {  // the outcome vote must still happen
        PS_LOG(WARNING) << "worker 0: could not undo the failed " << op << ": "
                        << undo_error.what();
      }
    }
  }
  try {
    AgreeAmongWorkers(call + std::string(Runtime::kOutcomeVoteSuffix), error, error_kind);
  } catch (const Error& e) {
    failed_everywhere(e);
  }
}

void DistKVStore::SaveCheckpoint(const std::string& given) {
  const auto in_call = EnterCall("SaveCheckpoint");
  const std::string dir = CheckpointDir(given);
  std::string local_error;
  try {
    if (dir.empty()) throw Error(std::string(kStore) + ": SaveCheckpoint: the directory is empty");
    WaitAll();  // this worker's pushes are part of what is saved
  } catch (const Error& e) {
    local_error = e.what();
  }
  Collective("SaveCheckpoint", "SaveCheckpoint " + Bounded(dir), local_error, [&] {
    // One file per live server (each writes the slices it serves).
    checkpoint::Manifest manifest;
    const std::vector<int> live = LiveServerRanks();
    manifest.servers = static_cast<int>(live.size());
    kv::Request request;
    request.command = kv::kSave;
    request.path = dir;
    request.dead_servers = DeadServerRanks();
    request.membership = runtime_->server_event_count();  // read after: at least as far
    std::uint64_t saved = 0;                              // slices in the files
    for (const int s : live) {
      const RequestResult result =
          runtime_->RequestAndWait(kv::RequestMessage(request, runtime_->ServerId(s)));
      if (!result.ok()) {
        Raise(result.error_kind, result.error, FailureOf(result, result.error));
      }
      const auto& reply = result.responses.at(0);
      if (reply.data.size() != 1 || reply.data[0].count() != 3 ||
          reply.data[0].dtype() != DType::kUInt64) {
        throw Error("malformed checkpoint reply from " + runtime_->Describe(runtime_->ServerId(s)));
      }
      const auto summary = reply.data[0].as<std::uint64_t>();
      manifest.files.push_back(
          {checkpoint::DataFileName(s, runtime_->num_servers()), summary[0], summary[1]});
      saved += summary[2];
    }
    // Every slice once, or no MANIFEST: the last good checkpoint stays the one to load.
    if (const std::uint64_t slices = SliceCount(); saved != slices) {
      throw Error("SaveCheckpoint: the live servers hold " + std::to_string(saved) + " of the " +
                  std::to_string(slices) +
                  " key slices (the others died with the servers that held them); " + dir +
                  " keeps its previous checkpoint, if it had one");
    }
    // The commit point; the files of an earlier checkpoint there that it does not list go.
    // The other workers wait for it: a file system that stops answering ends the job (at
    // PS_HEARTBEAT_TIMEOUT) instead of holding them all.
    std::vector<std::string> removed;
    {
      Runtime::SlowWork work =
          runtime_->BeginSlowWork("saving the checkpoint manifest " + dir +
                                      "/MANIFEST (and removing the files it replaces)",
                                  Runtime::SlowWorkThread::kCaller);
      removed = checkpoint::WriteManifest(dir, manifest, [&work] { work.Progress(); });
      for (std::string& name :
           checkpoint::RemoveStaleResidualFiles(dir, NumWorkers(), [&work] { work.Progress(); })) {
        removed.push_back(std::move(name));
      }
    }
    for (const std::string& name : removed) {
      PS_LOG(INFO) << "worker 0: removed " << dir << "/" << name
                   << ", an earlier checkpoint's file that the new MANIFEST does not list";
    }
  });
  SaveResiduals(dir);
}

void DistKVStore::LoadCheckpoint(const std::string& given) {
  const auto in_call = EnterCall("LoadCheckpoint");
  // Worker 0 reads the manifest and hands it to the servers, which read their data files.
  const std::string dir = CheckpointDir(given);
  std::string local_error;
  try {
    if (dir.empty()) throw Error(std::string(kStore) + ": LoadCheckpoint: the directory is empty");
    WaitAll();
  } catch (const Error& e) {
    local_error = e.what();
  }
  Collective("LoadCheckpoint", "LoadCheckpoint " + Bounded(dir), local_error, [&] {
    kv::Request request;
    request.command = kv::kLoad;
    request.path = dir;
    {
      const Runtime::SlowWork work = runtime_->BeginSlowWork(
          "reading the checkpoint manifest " + dir + "/MANIFEST", Runtime::SlowWorkThread::kCaller);
      request.manifest = checkpoint::ReadManifestText(dir);
    }
    request.dead_servers = DeadServerRanks();
    // Read after the dead ranks: servers hold the request until they know as much.
    request.membership = runtime_->server_event_count();
    checkpoint::Manifest::Parse(request.manifest, dir + "/MANIFEST");  // fails here, not 4 times
    // Every server reads and checks its slices first; none changes one unless all of them
    // can (a key missing from the checkpoint fails the load with the model as it was).
    SendToLiveServers(request);
    request.manifest.clear();  // the later steps use what each server staged
    try {
      WaitAll();
    } catch (const Error&) {
      request.load_step = kv::LoadStep::kDiscard;
      SendToLiveServers(request);
      try {
        WaitAll();
      } catch (const Error& e) {  // a server that lost it frees it with the next load
        PS_LOG(WARNING) << "worker 0: could not have every server drop the checkpoint it read: "
                        << e.what();
      }
      throw;
    }
    request.load_step = kv::LoadStep::kApply;
    SendToLiveServers(request);
    try {
      WaitAll();
    } catch (const ServerLost&) {
      throw;
    } catch (const ConnectionReset&) {
      throw;  // RunOverLiveServers runs it again as it is
    } catch (const Error&) {
      // A server that heard of a death or a join since it read its slices refuses to apply
      // them, where the others may have applied theirs. Once this worker hears of it too,
      // RunOverLiveServers runs the load again on the servers as they are: every key is
      // loaded anew.
      if (replicated_) {
        runtime_->AwaitServerEventsBeyond(request.membership, runtime_->config().heartbeat_timeout);
      }
      throw;
    }
  });
  LoadResiduals(dir);
}

void DistKVStore::SetOptimizer(const OptimizerConfig& config) {
  const auto in_call = EnterCall("SetOptimizer");
  std::string local_error;
  try {
    ValidateOptimizerConfig(config);
  } catch (const Error& e) {
    local_error = std::string(kStore) + ": SetOptimizer: " + e.what();
  }
  Collective("SetOptimizer", "SetOptimizer " + DescribeOptimizer(config), local_error, [&] {
    kv::Request request;
    request.command = kv::kSetOptimizer;
    request.optimizer = config;
    SendToLiveServers(request);
  });
  optimizer_set_ = true;
}

void DistKVStore::SetGradientCompression(const GradientCompression& config) {
  const auto in_call = EnterCall("SetGradientCompression");
  std::string local_error;
  compression::Settings settings;
  try {
    settings = compression::Parse(config);
    if (pushed_.load()) {
      throw Error(
          "SetGradientCompression: this worker already pushed: set the compression before the "
          "first Push of any key (the residuals start with it, as in MXNet)");
    }
  } catch (const Error& e) {
    local_error = std::string(kStore) + ": " + e.what();
  }
  const std::string call = "SetGradientCompression " + compression::Describe(config);
  Collective("SetGradientCompression", Bounded(call), local_error, [&] {
    kv::Request request;
    request.command = kv::kSetCompression;
    request.compression = config;
    SendToLiveServers(request);
  });
  // Every worker and every server has the setting: the keys there so far get their state. The
  // same setting again keeps it (residuals a LoadCheckpoint restored included).
  ExclusiveLock lock(keys_mu_);
  if (settings == compression_) return;
  if (residuals_loaded_) {
    PS_LOG(WARNING) << "worker " << Rank() << ": SetGradientCompression "
                    << compression::Describe(config)
                    << " drops the push residuals LoadCheckpoint restored: set the compression "
                       "before LoadCheckpoint";
    residuals_loaded_ = false;
  }
  compression_ = settings;
  for (auto& [key, info] : keys_) {
    info.compression.clear();
    AttachCompression(info);
  }
}

}  // namespace ps
