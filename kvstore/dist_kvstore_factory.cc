// CreateDistKVStore: the dist_* types. In a server or scheduler process (DMLC_ROLE), this
// runs that role to the end of the job and exits the process with its status, so that one
// program can be launched for every role, as with MXNet's launcher.
#include <cstdlib>
#include <iostream>

#include "dist/dist_kvstore.h"
#include "dist_kvstore_factory.h"
#include "ps/scheduler.h"
#include "server/kv_server.h"

namespace ps {
namespace {

int RunScheduler(const ClusterConfig& config) {
  Scheduler scheduler(config);
  std::cout << "ps-scheduler: listening on " << config.root_uri << ":" << scheduler.port()
            << std::endl;
  const int status = scheduler.Run();
  if (status != 0) std::cerr << "ps-scheduler: error: " << scheduler.failure() << std::endl;
  return status;
}

}  // namespace

std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type, const ClusterConfig* given) {
  const ClusterConfig config = given != nullptr ? *given : ClusterConfig::FromEnvironment();
  switch (config.role) {
    case Role::kScheduler:
      std::exit(RunScheduler(config));
    case Role::kServer:
      std::exit(RunServer(config));
    case Role::kWorker:
      break;
  }
  return std::make_unique<DistKVStore>(Runtime::Start(config), type == "dist_sync");
}

}  // namespace ps
