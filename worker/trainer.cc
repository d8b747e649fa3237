#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <span>
#include <string>

#include "kvstore/fnv1a.h"
#include "worker/device.h"
#include "worker/errors.h"
#include "worker/format.h"

namespace ps::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

}  // namespace

KVTrainer::KVTrainer(const TrainConfig& config, KVStore& kv, Model& model)
    : config_(config),
      kv_(kv),
      model_(model),
      backend_(model.backend()),
      on_device_(model.backend().kind() != DeviceKind::kCPU),
      push_from_device_(on_device_ && config.gradient_compression != "none") {
  std::size_t offset = 0;
  for (const Param* p : model_.params()) {
    offsets_.push_back(offset);
    offset += p->size();
  }
  if (on_device_) push_staging_ = HostArray<float>(backend_, offset);
  // Pulled values need their own buffer on a GPU, and summed gradients always do (they must
  // not overwrite the gradients being pushed).
  if (on_device_ || !config_.update_on_kvstore) pull_staging_ = HostArray<float>(backend_, offset);
  for (int i = 0; i < model_.num_param_layers(); ++i) marks_.push_back(backend_.NewMark());
  layer_keys_.resize(marks_.size());
  pull_pending_.resize(marks_.size(), false);
  push_pending_.resize(marks_.size(), false);
  if (!config_.update_on_kvstore) {
    local_optimizer_ = std::make_unique<SgdOptimizer>(
        model_, SgdOptions{config_.lr, config_.momentum, config_.weight_decay});
  }
}

KVTrainer::~KVTrainer() {
  // Pulls into the buffers (a step that threw, or weights never brought in) and copies into the
  // staging buffers may still be in flight: they must finish before the buffers go.
  try {
    kv_.WaitAll();
  } catch (const std::exception&) {  // already failed: the store reports it to its next caller
  }
  try {
    backend_.Synchronize();
  } catch (const std::exception&) {  // the device failed: nothing left to wait for
  }
}

Tensor KVTrainer::PushSource(std::size_t i) {
  Param& p = *model_.params()[i];
  float* data = on_device_ ? push_staging_.data() + offsets_[i] : p.grad.data();
  return Tensor(data, p.size());
}

Tensor KVTrainer::PullTarget(std::size_t i) {
  Param& p = *model_.params()[i];
  float* data = pull_staging_.size() > 0 ? pull_staging_.data() + offsets_[i] : p.value.data();
  return Tensor(data, p.size());
}

void KVTrainer::Start(std::uint64_t batches_per_epoch) {
  const std::vector<Param*>& params = model_.params();
  std::vector<Key> keys;
  std::vector<Tensor> values;
  // Init reads host memory: on a GPU the initial values go through the push staging buffer.
  for (std::size_t i = 0; i < params.size(); ++i) {
    keys.push_back(static_cast<Key>(i));
    float* data = params[i]->value.data();
    if (on_device_) {
      data = push_staging_.data() + offsets_[i];
      backend_.CopyToHost(data, params[i]->value.data(), params[i]->size() * sizeof(float));
    }
    values.emplace_back(data, params[i]->size());
  }
  kv_.Init(keys, values);
  const bool async = kv_.Type() == "dist_async";
  // A key is updated once per round in dist_sync, once per push of any worker in dist_async;
  // updating on the worker, once per batch.
  updates_per_epoch_ =
      batches_per_epoch *
      (config_.update_on_kvstore && async ? static_cast<std::uint64_t>(kv_.NumWorkers()) : 1);
  // Workers disagree when they were started with other flags: say which ones matter.
  try {
    if (config_.update_on_kvstore) {
      // Each worker pushes its batch-mean gradient, scaled by 1/num_workers: a synchronous
      // round sums num_workers of them into their mean, and in dist_async each push moves the
      // weights by its share, so one learning rate means the same step per sample in both
      // modes.
      kv_.SetOptimizer(MakeOptimizerConfig(config_, updates_per_epoch_,
                                           1.0f / static_cast<float>(kv_.NumWorkers())));
    }
  } catch (const ps::DisagreementError& e) {
    throw ps::DisagreementError(
        "the workers' optimizer settings differ: start every worker with the same --lr, "
        "--momentum, --wd, --optimizer, --lr-scheduler flags, --epochs, --batch-size, "
        "--num-examples, --gradient-compression and --update-on-kvstore or "
        "--no-update-on-kvstore (they set the optimizer, where it runs and its schedule's "
        "length; 2bit and 1bit compression change the default --lr and --momentum); " +
        std::string(e.what()));
  }
  if (!config_.update_on_kvstore) {
    local_schedule_ = MakeOptimizerConfig(config_, updates_per_epoch_, 1.0f);
    AgreeOnLocalUpdates();
  }
  if (config_.gradient_compression != "none" || config_.pull_compression != "none") {
    kv_.SetGradientCompression({.type = config_.gradient_compression,
                                .threshold = config_.compression_threshold,
                                .pull_type = config_.pull_compression});
  }
  PullWeights();  // everyone starts from the stored (rank 0's) weights
}

void KVTrainer::AgreeOnLocalUpdates() {
  // What sets each worker's SGD step: its flags, and the updates per epoch its schedule counts.
  const std::string settings =
      UpdateFlags(config_) + " (" + std::to_string(updates_per_epoch_) + " updates per epoch)";
  Fnv1a fingerprint;
  fingerprint.Add(settings.data(), settings.size());
  float unused = 0.0f;
  try {
    kv_.Init(kLocalSettingsKeys | (fingerprint.value() >> 1), Tensor(&unused, 1));
  } catch (const ps::DisagreementError& e) {
    const std::string what = e.what();
    if (what.find("SetOptimizer") != std::string::npos) {
      throw ps::DisagreementError(
          "this worker updates the weights itself (--no-update-on-kvstore), another worker "
          "set an optimizer on the servers (--update-on-kvstore): start every worker with the "
          "same of the two; " +
          what);
    }
    throw ps::DisagreementError(
        "the workers update the weights themselves (--no-update-on-kvstore), with other SGD "
        "settings: start every worker with the same --lr, --momentum, --wd, --lr-scheduler "
        "flags, --epochs, --batch-size and --num-examples (this worker's: " +
        settings + "); " + what);
  }
}

void KVTrainer::PullWeights() {
  const std::vector<Param*>& params = model_.params();
  std::vector<Key> keys;
  std::vector<Tensor> outs;
  for (std::size_t i = 0; i < params.size(); ++i) {
    keys.push_back(static_cast<Key>(i));
    outs.emplace_back(on_device_ ? pull_staging_.data() + offsets_[i] : params[i]->value.data(),
                      params[i]->size());
  }
  kv_.Pull(keys, outs);
  kv_.WaitAll();
  if (on_device_) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      backend_.CopyToDevice(params[i]->value.data(), pull_staging_.data() + offsets_[i],
                            params[i]->size() * sizeof(float));
    }
  }
  std::fill(pull_pending_.begin(), pull_pending_.end(), false);  // these values are newer
  std::fill(push_pending_.begin(), push_pending_.end(), false);  // WaitAll waited for them
}

void KVTrainer::SettleWeights() {
  for (std::size_t layer = 0; layer < pull_pending_.size(); ++layer) {
    BringInLayer(layer);
    SettlePush(layer);  // nothing stays in flight past the epoch
  }
}

void KVTrainer::BringInLayer(std::size_t layer) {
  if (!pull_pending_[layer]) return;
  pull_pending_[layer] = false;  // a Wait that throws fails the step: no second try
  const auto start = Clock::now();
  if (StagesPushes()) {
    // The layer's gradients went from push_staging_, which only their next copy rewrites
    // (OnGradientsReady waits for the push first): the weights are all this pass needs, and
    // with replication they come back a replica's round trip before the push's answer.
    push_pending_[layer] = true;  // still in flight, whether the wait returns or throws
    kv_.WaitPulls(layer_keys_[layer]);
  } else {
    // The push's source is the gradient itself, which the backward pass rewrites before any
    // hook runs.
    kv_.Wait(layer_keys_[layer]);
  }
  pull_wait_seconds_ += Seconds(start);
  if (!on_device_) return;  // pulled into the parameters themselves
  // Queued, not waited for: this layer's forward comes after the copy on the stream, and the
  // staging buffer is written again only by this layer's next pull, which its gradients' mark
  // orders after it. Key i is parameter i.
  for (const Key key : layer_keys_[layer]) {
    const auto i = static_cast<std::size_t>(key);
    Param& p = *model_.params()[i];
    backend_.CopyToDeviceAsync(p.value.data(), pull_staging_.data() + offsets_[i],
                               p.size() * sizeof(float));
  }
}

void KVTrainer::SettlePush(std::size_t layer) {
  if (!push_pending_[layer]) return;
  push_pending_[layer] = false;
  const auto start = Clock::now();
  kv_.Wait(layer_keys_[layer]);
  pull_wait_seconds_ += Seconds(start);
}

void KVTrainer::OnGradientsReady(int layer_index, const std::vector<Param*>& params) {
  // Staged gradients take one copy on the way out, into the pinned staging buffer, queued
  // behind the layer's backward; the layer's last push from there is answered first.
  if (StagesPushes()) {
    SettlePush(static_cast<std::size_t>(layer_index));
    for (const Param* p : params) {
      backend_.CopyToHostAsync(push_staging_.data() + offsets_[static_cast<std::size_t>(p->index)],
                               p->grad.data(), p->size() * sizeof(float));
    }
  }
  Backend::StreamMark& ready = *marks_[static_cast<std::size_t>(layer_index)];
  ready.Record();
  pending_.push_back({layer_index, params, &ready});
  PushReadyLayers(false);
}

void KVTrainer::PushReadyLayers(bool wait) {
  while (!pending_.empty()) {
    if (wait) {
      pending_.front().ready->Wait();
    } else if (!pending_.front().ready->Reached()) {
      return;  // the device is still on it: the next hook or the end of the step pushes it
    }
    // Off the queue first: a push that throws must not be sent again by the next call.
    const PendingLayer next = std::move(pending_.front());
    pending_.pop_front();
    PushLayer(next.layer_index, next.params);
  }
}

void KVTrainer::PushLayer(int layer_index, const std::vector<Param*>& params) {
  std::vector<Key> keys;
  std::vector<Tensor> grads;
  std::vector<Tensor> outs;
  for (Param* p : params) {
    const auto i = static_cast<std::size_t>(p->index);
    keys.push_back(static_cast<Key>(i));
    grads.push_back(push_from_device_ ? Tensor(p->grad.data(), p->size(), DType::kFloat32,
                                               Device::CUDA(backend_.ordinal()))
                                      : PushSource(i));
    outs.push_back(PullTarget(i));
  }
  // Later layers finish first; the first layer's keys get the highest priority.
  kv_.Push(keys, grads, -layer_index);
  kv_.Pull(keys, outs, -layer_index);
  if (config_.update_on_kvstore) {
    layer_keys_[static_cast<std::size_t>(layer_index)] = std::move(keys);
    pull_pending_[static_cast<std::size_t>(layer_index)] = true;
  }
}

void KVTrainer::FinishStep() {
  // Updating on the kvstore, the next forward pass brings each layer's weights in.
  if (config_.update_on_kvstore) return;
  kv_.WaitAll();
  // The copies into the model are queued, not waited for: the next step's calls come after
  // them, and pull_staging_ is written again only by pulls that its marks order after them.
  const std::vector<Param*>& params = model_.params();
  // Update locally from the sum of all workers' gradients (dist_sync or local), scaled to
  // their mean.
  const float scale = 1.0f / static_cast<float>(kv_.NumWorkers());
  for (std::size_t i = 0; i < params.size(); ++i) {
    backend_.CopyToDeviceAsync(params[i]->grad.data(), pull_staging_.data() + offsets_[i],
                               params[i]->size() * sizeof(float));
    if (scale != 1.0f) backend_.Scale(params[i]->size(), scale, params[i]->grad.data());
  }
  local_optimizer_->set_learning_rate(LearningRateAt(local_schedule_, ++local_updates_));
  local_optimizer_->Step();
}

EpochResult KVTrainer::TrainEpoch(const Dataset& data, const ShardSampler& sampler, int epoch,
                                  MetricsLog& log) {
  const auto start = Clock::now();
  const std::vector<int> order = sampler.EpochOrder(epoch);
  const auto batch = static_cast<std::size_t>(sampler.batch_size());
  std::vector<float> images(batch * data.sample_size());
  std::vector<std::int32_t> labels(batch);
  const GradReadyHook hook = [this](int layer, const std::vector<Param*>& params) {
    OnGradientsReady(layer, params);
  };
  const WeightsNeededHook weights = [this](int layer, const std::vector<Param*>&) {
    BringInLayer(static_cast<std::size_t>(layer));
  };
  EpochResult result;
  BatchStats interval;  // Speedometer: statistics since the last log line
  auto interval_start = Clock::now();
  for (int b = 0; b < sampler.batches_per_epoch(); ++b) {
    GatherBatch(data, std::span<const int>(order.data() + b * batch, batch), images, labels);
    const auto step_start = Clock::now();
    pull_wait_seconds_ = 0.0;
    const BatchStats stats =
        model_.TrainStep(images.data(), labels.data(), static_cast<int>(batch), hook, weights);
    PushReadyLayers(true);  // the compute ends when the device has every gradient
    const auto computed = Clock::now();
    FinishStep();
    if (config_.stop_on_divergence && !std::isfinite(stats.loss_sum)) {
      // Training on would only spread NaN through the weights: stop and say what to change.
      const long long step = static_cast<long long>(epoch) * sampler.batches_per_epoch() + b + 1;
      const char* loss = std::isnan(stats.loss_sum) ? "nan" : "infinite";  // no "-nan"
      throw DivergenceError(std::string("training diverged: the loss is ") + loss + " at epoch " +
                            std::to_string(epoch) + ", batch " + std::to_string(b + 1) + " (step " +
                            std::to_string(step) + "): lower the learning rate (--lr " +
                            Format("%g", config_.lr) + " now; try " + Format("%g", config_.lr / 2) +
                            ")");
    }
    // The forward pass's waits for weights count as waiting, not computing.
    result.compute_seconds +=
        std::chrono::duration<double>(computed - step_start).count() - pull_wait_seconds_;
    result.wait_seconds += Seconds(computed) + pull_wait_seconds_;
    ++result.batches;
    result.train += stats;
    interval += stats;
    if ((b + 1) % config_.log_interval == 0) {
      const double elapsed = Seconds(interval_start);
      log.Batch(epoch, b + 1, elapsed > 0.0 ? interval.samples / elapsed : 0.0,
                interval.mean_loss(), interval.accuracy());
      interval = BatchStats{};
      interval_start = Clock::now();
    }
  }
  SettleWeights();  // the model holds the epoch's last weights (evaluation, checkpoints)
  backend_.Synchronize();
  result.seconds = Seconds(start);
  return result;
}

}  // namespace ps::worker
