#pragma once
// The worker half of ps-bench: ps-bench re-executed with --worker_mode, one process per
// worker of a job, measuring through the public ps::KVStore API only.
#include <cstddef>
#include <string>
#include <vector>

#include "tools/bench/bench_util.h"

namespace ps::bench {

// What a worker prints per case, parsed by the driver: its latency samples in lines of at
// most kSamplesPerLine ("ps-bench-samples op=push size=4 rank=0 ns=a,b,..."), then
// "ps-bench-result op=push size=4 rank=0 workers=1 iterations=N warmup=K start_unix_us=T0
// end_unix_us=T1 wire_sent=B wire_received=B" (T0, T1: the timed loop's wall-clock bounds; B:
// bytes this worker's transport sent / received per timed iteration).
inline constexpr const char* kSamplesPrefix = "ps-bench-samples ";
inline constexpr const char* kResultPrefix = "ps-bench-result ";
inline constexpr std::size_t kSamplesPerLine = 200;

struct WorkerOptions {
  std::string mode;  // dist_sync or dist_async
  std::vector<std::size_t> sizes;
  std::vector<std::string> ops;  // push, pull, pushpull
  Calibration calibration;
  bool verify = false;  // check every pulled value (the final value is always checked)
  // KVStore::SetGradientCompression's type and pull_type (threshold 0.5); "none": off.
  std::string compression = "none";
  std::string pull_compression = "none";
};

// Runs every (size, op) case, in that order, as one worker of the job the DMLC_* environment
// describes; prints one result line per case. Returns the process exit status (1 on any
// error, with "ps-bench-worker: error: ..." printed).
int RunWorker(const WorkerOptions& options);

}  // namespace ps::bench
