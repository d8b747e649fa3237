// ps-server: runs one server of a job until the scheduler ends it.
#include <cstdio>

#include "kvstore/server/kv_server.h"
#include "ps/cli/cli.h"
#include "ps/error.h"
#include "ps/runtime.h"

int main(int argc, char** argv) {
  ps::cli::Init(&argc, &argv,
                "runs one server of a parameter-server job.\n"
                "Usage: ps-server [flags]\n"
                "Every flag falls back to its DMLC_*/PS_* environment variable.",
                ps::Role::kServer);
  try {
    const ps::ClusterConfig config = ps::cli::ReadClusterConfig(ps::Role::kServer);
    return ps::RunServer(config);
  } catch (const std::exception& e) {  // ps::Error, or out of memory or threads at start
    ps::cli::DieOf("ps-server", e);
  }
}
