#pragma once
// The whole ps-train run on one worker: backend, data, model, resume, epochs, evaluation,
// checkpoints and log.
#include <ostream>

#include "ps/kvstore.h"
#include "worker/train_config.h"

namespace ps::worker {

struct TrainSummary {
  double test_accuracy = 0.0;    // rank 0's last evaluation; 0 on other ranks
  double samples_per_sec = 0.0;  // all workers' samples over this worker's training time
};

// Runs it. Throws what ps-train reports (worker/errors.h): ConfigError naming a flag to fix,
// DataError, DivergenceError, DeviceError; and ps::Error for the store's failures.
TrainSummary RunTraining(const TrainConfig& config, KVStore& kv, std::ostream& log);

}  // namespace ps::worker
