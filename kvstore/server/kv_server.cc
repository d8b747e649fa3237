#include "kv_server.h"

#include <glog/logging.h>

#include "ps/runtime.h"

namespace ps {

int RunServer(const ClusterConfig& config) {
  auto runtime = Runtime::Start(config);
  const std::string failure = runtime->WaitForTermination();
  if (!failure.empty()) {
    LOG(ERROR) << "server " << runtime->rank() << ": " << failure;
    return 1;
  }
  return 0;
}

}  // namespace ps
