#pragma once
// Local training without a parameter server: plain SGD (with optional momentum and weight
// decay) applied on the model's own device. It proves the model math end to end and is the
// reference the distributed trainer is compared with.
#include <vector>

#include "worker/backend.h"
#include "worker/dataset.h"
#include "worker/model.h"
#include "worker/sharding.h"

namespace ps::worker {

struct SgdOptions {
  float learning_rate = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
};

// Updates every parameter of a model from its gradient. Owns the momentum buffers (device
// memory of the model's backend); the model must outlive the optimizer.
class SgdOptimizer {
 public:
  SgdOptimizer(Model& model, SgdOptions options);
  // w <- w - lr * (grad + wd * w), through momentum when it is non-zero.
  void Step();
  const SgdOptions& options() const { return options_; }
  // The rate of the next Step (a learning-rate schedule changes it step by step).
  void set_learning_rate(float rate) { options_.learning_rate = rate; }

 private:
  Model& model_;  // not owned
  SgdOptions options_;
  std::vector<DeviceArray<float>> momentum_;  // one per parameter; empty without momentum
};

struct EpochResult {
  BatchStats train;  // summed over the epoch's batches
  double seconds = 0.0;
  // KVTrainer only: the epoch's time split per batch into computing (forward, backward, and
  // staging and issuing each layer's push as its backward ends) and waiting (blocked in
  // WaitAll for the communication that did not overlap, then applying the pulled values).
  int batches = 0;
  double compute_seconds = 0.0;
  double wait_seconds = 0.0;
  double samples_per_sec() const { return seconds > 0.0 ? train.samples / seconds : 0.0; }
};

// One epoch over the sampler's shard: batches_per_epoch() steps of TrainStep + Step.
EpochResult TrainEpoch(Model& model, SgdOptimizer& optimizer, const Dataset& data,
                       const ShardSampler& sampler, int epoch);

// Loss and accuracy over a whole dataset in batches of model.max_batch() (the last one partial).
BatchStats EvaluateDataset(Model& model, const Dataset& data);

}  // namespace ps::worker
