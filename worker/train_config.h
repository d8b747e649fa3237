#pragma once
// ps-train's settings (TrainConfig, one field per flag), their checks, the model's defaults,
// and the optimizer config they make for the store.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "ps/kvstore.h"
#include "worker/dataset.h"

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

// The flags that set each update's step, in flag syntax ("--lr 0.1 --momentum 0.9 --wd 0
// ..."): those the optimizer and the schedule read. For the start-up line and the run record.
std::string UpdateFlags(const TrainConfig& config);

}  // namespace ps::worker
