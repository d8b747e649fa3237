#pragma once
#include "ps/config.h"

namespace ps {

// Runs the server role: registers, serves the key-value store until the scheduler ends the
// job, and returns the process exit status (0: the job ended normally).
int RunServer(const ClusterConfig& config);

}  // namespace ps
