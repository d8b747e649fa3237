// ps-test-node: a worker for the multi-process tests. Registers (cluster from DMLC_*), then
//   --barriers N   runs N worker barriers, tells the scheduler it finished, exits 0;
//   --block        waits until the job ends (a test kills it or another node dies).
// Any ps::Error is printed as "ps-test-node: error: ..." with exit status 2.
#include <cstdio>
#include <cstring>
#include <string>

#include "ps/error.h"
#include "ps/message.h"
#include "ps/runtime.h"

int main(int argc, char** argv) {
  int barriers = 0;
  bool block = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--barriers") == 0 && i + 1 < argc) {
      barriers = std::stoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--block") == 0) {
      block = true;
    }
  }
  try {
    auto runtime = ps::Runtime::Start(ps::ClusterConfig::FromEnvironment());
    std::printf("ps-test-node: registered as worker %d\n", runtime->rank());
    std::fflush(stdout);
    if (block) {
      const std::string failure = runtime->WaitForTermination();
      std::printf("ps-test-node: ended: %s\n", failure.c_str());
      return failure.empty() ? 0 : 2;
    }
    for (int i = 0; i < barriers; ++i) runtime->Barrier(ps::kWorkerGroup);
    std::printf("ps-test-node: %d barriers done\n", barriers);
    std::fflush(stdout);
    runtime->FinishWorker();
    return 0;
  } catch (const ps::Error& e) {
    std::printf("ps-test-node: error: %s\n", e.what());
    return 2;
  }
}
