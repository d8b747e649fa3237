#pragma once
// Data-parallel training through ps::KVStore: what ps-train runs on each worker.
//
// Parameter i of the model is KVStore key i. Start(): every worker Init()s the keys (the
// KVStore keeps rank 0's values; all ranks hold the same seeded values anyway), SetOptimizer()
// when the servers update, then pulls the weights. Each step: forward, backward; as each layer's
// backward finishes, its gradients are pushed with priority -layer_index and the weights (update
// on kvstore) or the summed gradients (update locally) are pulled with the same priority; the
// step ends with WaitAll() and, when updating locally, the SGD step.
//
// On a CUDA backend gradients go device -> one page-locked staging buffer -> wire, and pulled
// values land in a second page-locked buffer that is copied to the device after WaitAll(). On
// the CPU backend the parameter buffers themselves are pushed and pulled, with no copy.
#include <cstdint>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <ps/kvstore.h>

#include "worker/backend.h"
#include "worker/dataset.h"
#include "worker/model.h"
#include "worker/sgd_trainer.h"
#include "worker/sharding.h"

namespace ps::worker {

struct TrainConfig {
  std::string model = "mlp";
  std::string device = "auto";
  std::string data_dir = kDefaultDataDir;
  std::string kvstore = "dist_sync";
  bool update_on_kvstore = true;
  int batch_size = 64;
  int epochs = 10;
  float lr = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  std::uint64_t seed = 1;
  int log_interval = 100;
  std::string metrics_out;  // JSON lines, written by rank 0; empty: none
  // This worker's index among the job's workers on its machine (PS_LOCAL_RANK, which
  // launch.py sets): the GPU that --device auto or cuda takes, modulo the GPU count.
  // -1: the worker's rank, right when the ranks on each machine are consecutive.
  int local_rank = -1;
};

// Checks every field that can be checked without data or devices. Throws ConfigError naming
// the flag to fix.
void ValidateConfig(const TrainConfig& config);

// Writes the training log: human lines to `log`, and, when a path is given, the same records
// as JSON lines to a file.
class MetricsLog {
 public:
  // Throws ConfigError when metrics_path cannot be written.
  MetricsLog(std::ostream& log, const std::string& metrics_path, int rank);
  void Batch(int epoch, int batch, double samples_per_sec, double loss, double accuracy);
  void EpochEnd(int epoch, const EpochResult& train);
  void TestAccuracy(int epoch, double accuracy);
  void Final(double test_accuracy, double samples_per_sec);

 private:
  void Json(const std::string& record);

  std::ostream& log_;  // not owned
  std::ofstream json_;
  int rank_;
};

// Connects one worker's model to the KVStore. The model and the store must outlive it.
class KVTrainer {
 public:
  KVTrainer(const TrainConfig& config, KVStore& kv, Model& model);

  // Init, SetOptimizer (update on kvstore) and the initial pull of every key. Collective.
  void Start();
  // One epoch over the sampler's shard; logs a Speedometer line every log_interval batches.
  EpochResult TrainEpoch(const Dataset& data, const ShardSampler& sampler, int epoch,
                         MetricsLog& log);

 private:
  // The gradient-ready hook: stage (CUDA) and push this layer's gradients, pull its values.
  void OnGradientsReady(int layer_index, const std::vector<Param*>& params);
  // WaitAll, then bring pulled values into the model (and update, when updating locally).
  void FinishStep();
  Tensor PushSource(std::size_t i);
  Tensor PullTarget(std::size_t i);

  TrainConfig config_;
  KVStore& kv_;   // not owned
  Model& model_;  // not owned
  Backend& backend_;
  bool on_device_;                    // parameters live in GPU memory: stage through pinned buffers
  std::vector<std::size_t> offsets_;  // parameter i's offset in the staging buffers
  HostArray<float> push_staging_;     // gradients on their way out (CUDA only)
  HostArray<float> pull_staging_;     // pulled weights or summed gradients
  std::unique_ptr<SgdOptimizer> local_optimizer_;  // --no-update-on-kvstore only
};

struct TrainSummary {
  double test_accuracy = 0.0;    // rank 0's last evaluation; 0 on other ranks
  double samples_per_sec = 0.0;  // all workers' samples over this worker's training time
};

// The whole ps-train run on one worker: backend, data, model, epochs, evaluation, log.
TrainSummary RunTraining(const TrainConfig& config, KVStore& kv, std::ostream& log);

}  // namespace ps::worker
