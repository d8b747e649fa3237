// CreateDistKVStore: the dist_* types. In a server or scheduler process (DMLC_ROLE), this
// runs that role to the end of the job and exits the process with its status, so that one
// program can be launched for every role, as with MXNet's launcher.
#include <glog/logging.h>

#include <cstdlib>
#include <iostream>

#include "kvstore/dist/dist_kvstore.h"
#include "kvstore/dist_kvstore_factory.h"
#include "kvstore/server/kv_server.h"
#include "ps/scheduler.h"
#include "ps/src/stderr_log.h"

namespace ps {
namespace {

int RunScheduler(const ClusterConfig& config) {
  Scheduler scheduler(config);
  scheduler.PrintListeningLine();
  const int status = scheduler.Run();
  if (status != 0) {
    internal::FlushStderrLog();  // the log lines before it, then the last word
    std::cerr << "ps-scheduler: error: " << scheduler.failure() << std::endl;
  }
  return status;
}

// A scheduler or server role owns its process until it exits, so it may set up glog when the
// user's program has not (glog would otherwise open with "Logging before InitGoogleLogging").
// A worker's process stays the user's: their own InitGoogleLogging may still come, and glog
// aborts on a second one. There the library logs through PS_LOG (ps/src/glog_or_stderr.h),
// which writes glog-formatted lines to stderr itself until the program sets glog up.
void LogToStderrUnlessSetUp(const char* role_program) {
  if (google::IsGoogleLoggingInitialized()) return;
  internal::SetUpLogging(role_program);
}

}  // namespace

std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type, const ClusterConfig* given) {
  ClusterConfig config = given != nullptr ? *given : ClusterConfig::FromEnvironment();
  switch (config.role) {
    case Role::kScheduler:
      LogToStderrUnlessSetUp("ps-scheduler");
      std::exit(RunScheduler(config));
    case Role::kServer:
      LogToStderrUnlessSetUp("ps-server");
      std::exit(RunServer(config));
    case Role::kWorker:
      break;
  }
  config.kvstore_type = type;  // the scheduler has every worker agree on it
  return std::make_unique<DistKVStore>(Runtime::Start(config), type == "dist_sync");
}

}  // namespace ps
