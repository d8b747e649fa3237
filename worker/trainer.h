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
#include <memory>
#include <vector>

#include "ps/kvstore.h"
#include "worker/backend.h"
#include "worker/dataset.h"
#include "worker/metrics_log.h"
#include "worker/model.h"
#include "worker/sgd_trainer.h"
#include "worker/sharding.h"
#include "worker/train_config.h"

namespace ps::worker {

// The keys KVTrainer::AgreeOnLocalUpdates Inits have this bit set: far above the model's keys
// (key i is parameter i).
inline constexpr Key kLocalSettingsKeys = Key{1} << 63;

// Connects one worker's model to the KVStore. The model and the store must outlive it.
class KVTrainer {
 public:
  KVTrainer(const TrainConfig& config, KVStore& kv, Model& model);
  ~KVTrainer();
  KVTrainer(const KVTrainer&) = delete;
  KVTrainer& operator=(const KVTrainer&) = delete;

  // Init, SetOptimizer (update on kvstore) or AgreeOnLocalUpdates (update on the worker), and
  // the initial pull of every key. Collective.
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
  // Updating on the worker: the collective the others' SetOptimizer pairs with, and the check
  // that every worker runs the same SGD (a worker given another --lr would drift apart from the
  // others unseen). Each worker Inits one key of one element whose number holds a fingerprint
  // of its settings, so workers that differ Init different keys and the Init fails on every
  // worker (ps::DisagreementError, naming the flags). The key is never pushed or pulled.
  void AgreeOnLocalUpdates();
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

}  // namespace ps::worker
