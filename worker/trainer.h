#pragma once
// Data-parallel training through ps::KVStore: what ps-train runs on each worker.
//
// Parameter i of the model is KVStore key i. Start(): every worker Init()s the keys (the
// KVStore keeps rank 0's values; all ranks hold the same seeded values anyway), SetOptimizer()
// when the servers update, then pulls the weights. Each step: forward, backward; as each layer's
// backward finishes, its gradients are pushed with priority -layer_index and the weights (update
// on kvstore) or the summed gradients (update locally) are pulled with the same priority.
// Updating on the kvstore, the step ends there: the next forward pass waits for each layer's
// weights just before that layer (KVStore::Wait on its keys), so the first layers compute while
// the last ones' pulls are still in flight, and the end of an epoch waits for the rest.
// Updating locally, the step ends with WaitAll() and the SGD step.
//
// On a CUDA backend gradients go device -> one page-locked staging buffer -> wire, and pulled
// values land in a second page-locked buffer, copied to the device layer by layer once pulled.
// On the CPU backend the parameter buffers themselves are pushed and pulled, with no copy.
#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "ps/kvstore.h"
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
  // Checkpoints: every checkpoint_every epochs (and after the last) the store and the epoch
  // count are saved under checkpoint_dir/epoch-N, and checkpoint_dir/LATEST names the newest;
  // resume starts from the one LATEST names. Empty: no checkpoints.
  std::string checkpoint_dir;
  int checkpoint_every = 1;
  bool resume = false;
  // Train on the first num_examples samples of the training set only (0: all of it).
  int num_examples = 0;
  // The optimizer (where it runs: the servers with update_on_kvstore, else the worker, which
  // runs sgd only) and its learning-rate schedule, in epochs; MakeOptimizerConfig turns epochs
  // into updates.
  std::string optimizer = "sgd";      // sgd, nag, adam, adagrad, rmsprop
  std::string lr_scheduler = "none";  // none, factor, multifactor, cosine
  float lr_factor = 0.1f;             // factor, multifactor: multiplier per drop
  std::string lr_step_epochs;         // factor: "E" (every E epochs); multifactor: "E1,E2,..."
  int warmup_epochs = 0;              // linear warm-up from warmup_begin_lr
  float warmup_begin_lr = 0.0f;
  float final_lr = 0.0f;  // cosine: the rate at the end of the last epoch
  // Stop training, naming the step, when the loss is not finite (diverged).
  bool stop_on_divergence = true;
  // Gradient compression (KVStore::SetGradientCompression; dist stores only): the pushes'
  // type ("none", "2bit", "1bit", "fp16"), 2bit's threshold, and the pulls' type. On a GPU a
  // compressed gradient is pushed from device memory: it is encoded there, and only the codes
  // cross to the host.
  std::string gradient_compression = "none";
  float compression_threshold = 0.5f;
  std::string pull_compression = "none";
};

// The model's defaults (learning rate, schedule, momentum, weight decay; docs/training.md
// says how they were chosen) for every such setting `given` says the user did not set.
void ApplyModelDefaults(TrainConfig& config, const std::function<bool(std::string_view)>& given);

// The optimizer config for the store: `updates_per_epoch` is how many updates one key sees
// in an epoch where the optimizer runs, which turns the schedule's epochs into updates.
OptimizerConfig MakeOptimizerConfig(const TrainConfig& config, std::uint64_t updates_per_epoch,
                                    float rescale_grad);

// Checks every field that can be checked without data or devices. Throws ConfigError naming
// the flag to fix.
void ValidateConfig(const TrainConfig& config);
// Throws ConfigError for a flag the user gave (`given`, as for ApplyModelDefaults) that
// nothing would read: --checkpoint-every without --checkpoint-dir, --compression-threshold
// without 2bit or 1bit compression, --lr-factor without a stepped schedule.
void ValidateGivenFlags(const TrainConfig& config,
                        const std::function<bool(std::string_view)>& given);

// Writes the training log: human lines to `log`, and, when a path is given, the same records
// as JSON lines to a file.
class MetricsLog {
 public:
  // Throws ConfigError when metrics_path cannot be opened; each record that cannot be written
  // later (a full disk) throws std::runtime_error naming the file: the metrics are not lost
  // silently. `append`: add to the file (a resumed job, after the lines of the epochs before).
  MetricsLog(std::ostream& log, const std::string& metrics_path, int rank, bool append = false);
  void Batch(int epoch, int batch, double samples_per_sec, double loss, double accuracy);
  void EpochEnd(int epoch, const EpochResult& train);
  void TestAccuracy(int epoch, double accuracy);
  void Final(double test_accuracy, double samples_per_sec);

 private:
  void Json(const std::string& record);

  std::ostream& log_;  // not owned
  std::ofstream json_;
  std::string json_path_;  // empty: no JSON lines from this worker
  int rank_;
};

// Connects one worker's model to the KVStore. The model and the store must outlive it.
class KVTrainer {
 public:
  KVTrainer(const TrainConfig& config, KVStore& kv, Model& model);
  ~KVTrainer();
  KVTrainer(const KVTrainer&) = delete;
  KVTrainer& operator=(const KVTrainer&) = delete;

  // Init, SetOptimizer (update on kvstore) and the initial pull of every key. Collective.
  // `batches_per_epoch` (this worker's) turns the schedule's epochs into updates.
  void Start(std::uint64_t batches_per_epoch = 1);
  // Updates of a key per epoch where the optimizer runs (set by Start): the unit of the
  // learning-rate schedule.
  std::uint64_t updates_per_epoch() const { return updates_per_epoch_; }
  // Pulls every key's stored value into the model (after Start, or a LoadCheckpoint).
  void PullWeights();
  // Brings every pull still in flight into the model: after it the model holds the weights of
  // the last step (TrainEpoch calls it before it returns).
  void SettleWeights();
  // One epoch over the sampler's shard; logs a Speedometer line every log_interval batches.
  EpochResult TrainEpoch(const Dataset& data, const ShardSampler& sampler, int epoch,
                         MetricsLog& log);

 private:
  // A parametric layer whose gradients were issued on the backend but not yet pushed.
  struct PendingLayer {
    int layer_index;
    std::vector<Param*> params;
    Backend::StreamMark* ready;  // into marks_: reached once the gradients are staged
  };

  // The gradient-ready hook: queue this layer's gradients for the host (CUDA) and push every
  // layer whose gradients have arrived, without waiting for the device.
  void OnGradientsReady(int layer_index, const std::vector<Param*>& params);
  // Pushes the pending layers in order while their marks are reached; with `wait`, all of them.
  void PushReadyLayers(bool wait);
  // Push this layer's gradients and pull its values.
  void PushLayer(int layer_index, const std::vector<Param*>& params);
  // The forward pass's hook: when this parametric layer's pull is pending, waits for it and
  // queues the copy of its values to the device.
  void BringInLayer(std::size_t layer);
  // Waits for this parametric layer's push when BringInLayer left it in flight.
  void SettlePush(std::size_t layer);
  // After PushReadyLayers(true). Updating locally: WaitAll, then bring the summed gradients
  // into the model and update. Updating on the kvstore: nothing (BringInLayer brings the
  // weights in).
  void FinishStep();
  // On a GPU, gradients not pushed from device memory go from push_staging_, which only their
  // next copy rewrites: the forward pass then waits for the weights alone (WaitPulls), and for
  // the push's answer (a replica's round trip later) when the layer's next gradients are
  // staged. The CPU pushes the gradients themselves: staging them cost more than it saved on 2
  // cores (docs/performance.md).
  bool StagesPushes() const { return on_device_ && !push_from_device_; }
  Tensor PushSource(std::size_t i);
  Tensor PullTarget(std::size_t i);

  TrainConfig config_;
  KVStore& kv_;   // not owned
  Model& model_;  // not owned
  Backend& backend_;
  bool on_device_;  // parameters live in GPU memory: stage through pinned buffers
  // Compressed gradients on a GPU are pushed from device memory: the store encodes them there
  // and copies only the codes (no staging copy).
  bool push_from_device_;
  std::vector<std::size_t> offsets_;  // parameter i's offset in the staging buffers
  HostArray<float> push_staging_;     // gradients on their way out (CUDA only)
  HostArray<float> pull_staging_;     // pulled weights or summed gradients
  // One mark per parametric layer, recorded after its gradients (and their copy to
  // push_staging_) were issued; reused every step, once the step's pushes are out.
  std::vector<std::unique_ptr<Backend::StreamMark>> marks_;
  std::deque<PendingLayer> pending_;  // in the order the hook saw them (last layer first)
  // Update on kvstore: per parametric layer, its keys (as last pushed) and whether their pull
  // is issued but not yet brought into the model (BringInLayer).
  std::vector<std::vector<Key>> layer_keys_;
  std::vector<bool> pull_pending_;
  // Per parametric layer: its push may still be in flight after BringInLayer waited only for
  // its pull (StagesPushes()); waited for before push_staging_ is written again.
  std::vector<bool> push_pending_;
  double pull_wait_seconds_ = 0.0;  // waited on the store in a step since TrainEpoch read it
  std::unique_ptr<SgdOptimizer> local_optimizer_;  // --no-update-on-kvstore only
  OptimizerConfig local_schedule_;                 // its rate per update (set by Start)
  std::uint64_t local_updates_ = 0;                // updates it applied
  std::uint64_t updates_per_epoch_ = 0;
};

struct TrainSummary {
  double test_accuracy = 0.0;    // rank 0's last evaluation; 0 on other ranks
  double samples_per_sec = 0.0;  // all workers' samples over this worker's training time
};

// The whole ps-train run on one worker: backend, data, model, epochs, evaluation, log.
TrainSummary RunTraining(const TrainConfig& config, KVStore& kv, std::ostream& log);

}  // namespace ps::worker
