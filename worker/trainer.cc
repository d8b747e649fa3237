#include "worker/trainer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>

#include "worker/device.h"
#include "worker/errors.h"

namespace ps::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// printf-style formatting into a std::string (log lines and JSON numbers).
template <typename... Args>
std::string Format(const char* fmt, Args... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string out(static_cast<std::size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, fmt, args...);
  return out;
}

}  // namespace

void ValidateConfig(const TrainConfig& c) {
  if (c.model != "mlp" && c.model != "cnn") {
    throw ConfigError("unknown --model '" + c.model + "': use " + kModelNames);
  }
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda" &&
      !c.device.starts_with("cuda:")) {
    throw ConfigError("unknown --device '" + c.device + "': use auto, cpu, cuda or cuda:N");
  }
  if (c.kvstore != "local" && c.kvstore != "dist_sync" && c.kvstore != "dist_async") {
    throw ConfigError("unknown --kvstore '" + c.kvstore + "': use local, dist_sync or dist_async");
  }
  if (c.batch_size < 1) throw ConfigError("--batch-size must be >= 1");
  if (c.epochs < 1) throw ConfigError("--epochs must be >= 1");
  if (!(c.lr > 0.0f)) throw ConfigError("--lr must be > 0");
  if (!(c.momentum >= 0.0f && c.momentum < 1.0f)) throw ConfigError("--momentum must be in [0, 1)");
  if (!(c.weight_decay >= 0.0f)) throw ConfigError("--wd must be >= 0");
  if (c.log_interval < 1) throw ConfigError("--log-interval must be >= 1");
}

// ---- MetricsLog ----

MetricsLog::MetricsLog(std::ostream& log, const std::string& metrics_path, int rank)
    : log_(log), rank_(rank) {
  if (!metrics_path.empty() && rank == 0) {
    json_.open(metrics_path, std::ios::out | std::ios::trunc);
    if (!json_) {
      throw ConfigError("cannot write --metrics-out " + metrics_path + ": " + std::strerror(errno));
    }
  }
}

void MetricsLog::Json(const std::string& record) {
  if (json_.is_open()) json_ << record << '\n' << std::flush;
}

void MetricsLog::Batch(int epoch, int batch, double samples_per_sec, double loss, double accuracy) {
  log_ << Format("Epoch[%d] Batch[%d] Speed: %.2f samples/sec loss=%.6f accuracy=%.6f\n", epoch,
                 batch, samples_per_sec, loss, accuracy)
       << std::flush;
  Json(
      Format("{\"event\":\"batch\",\"rank\":%d,\"epoch\":%d,\"batch\":%d,"
             "\"samples_per_sec\":%.2f,\"loss\":%.6f,\"accuracy\":%.6f}",
             rank_, epoch, batch, samples_per_sec, loss, accuracy));
}

void MetricsLog::EpochEnd(int epoch, const EpochResult& train) {
  // Per batch: compute, and the wait for communication that compute did not hide.
  const double batches = std::max(1, train.batches);
  const double compute_ms = 1e3 * train.compute_seconds / batches;
  const double wait_ms = 1e3 * train.wait_seconds / batches;
  log_ << Format("Epoch[%d] Train-loss=%.6f Train-accuracy=%.6f Time cost=%.3f\n", epoch,
                 train.train.mean_loss(), train.train.accuracy(), train.seconds)
       << Format("Epoch[%d] Batch-time compute_ms=%.3f wait_ms=%.3f\n", epoch, compute_ms, wait_ms)
       << std::flush;
  Json(
      Format("{\"event\":\"epoch\",\"rank\":%d,\"epoch\":%d,\"train_loss\":%.6f,"
             "\"train_accuracy\":%.6f,\"time_cost\":%.3f,\"samples_per_sec\":%.2f,"
             "\"compute_ms_per_batch\":%.3f,\"wait_ms_per_batch\":%.3f}",
             rank_, epoch, train.train.mean_loss(), train.train.accuracy(), train.seconds,
             train.samples_per_sec(), compute_ms, wait_ms));
}

void MetricsLog::TestAccuracy(int epoch, double accuracy) {
  log_ << Format("Epoch[%d] test_accuracy=%.4f\n", epoch, accuracy) << std::flush;
  Json(Format("{\"event\":\"test\",\"rank\":%d,\"epoch\":%d,\"test_accuracy\":%.6f}", rank_, epoch,
              accuracy));
}

void MetricsLog::Final(double test_accuracy, double samples_per_sec) {
  log_ << Format("final test_accuracy=%.4f samples_per_sec=%.0f\n", test_accuracy, samples_per_sec)
       << std::flush;
  Json(Format("{\"event\":\"final\",\"rank\":%d,\"test_accuracy\":%.6f,\"samples_per_sec\":%.2f}",
              rank_, test_accuracy, samples_per_sec));
}

// ---- KVTrainer ----

KVTrainer::KVTrainer(const TrainConfig& config, KVStore& kv, Model& model)
    : config_(config),
      kv_(kv),
      model_(model),
      backend_(model.backend()),
      on_device_(model.backend().kind() != DeviceKind::kCPU) {
  std::size_t offset = 0;
  for (const Param* p : model_.params()) {
    offsets_.push_back(offset);
    offset += p->size();
  }
  if (on_device_) push_staging_ = HostArray<float>(backend_, offset);
  // Pulled values need their own buffer on a GPU, and summed gradients always do (they must
  // not overwrite the gradients being pushed).
  if (on_device_ || !config_.update_on_kvstore) pull_staging_ = HostArray<float>(backend_, offset);
  if (!config_.update_on_kvstore) {
    local_optimizer_ = std::make_unique<SgdOptimizer>(
        model_, SgdOptions{config_.lr, config_.momentum, config_.weight_decay});
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

void KVTrainer::Start() {
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
  if (config_.update_on_kvstore) {
    OptimizerConfig opt;
    opt.name = "sgd";
    opt.learning_rate = config_.lr;
    opt.momentum = config_.momentum;
    opt.weight_decay = config_.weight_decay;
    // Each worker pushes its batch-mean gradient; a synchronous round sums num_workers of them.
    opt.rescale_grad =
        kv_.Type() == "dist_async" ? 1.0f : 1.0f / static_cast<float>(kv_.NumWorkers());
    kv_.SetOptimizer(opt);
  }
  // Everyone starts from the stored (rank 0's) weights.
  std::vector<Tensor> outs;
  for (std::size_t i = 0; i < params.size(); ++i) {
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
}

void KVTrainer::OnGradientsReady(int layer_index, const std::vector<Param*>& params) {
  std::vector<Key> keys;
  std::vector<Tensor> grads;
  std::vector<Tensor> outs;
  for (Param* p : params) {
    const auto i = static_cast<std::size_t>(p->index);
    if (on_device_) {
      // The one copy on the way out: device memory to the pinned staging buffer.
      backend_.CopyToHost(push_staging_.data() + offsets_[i], p->grad.data(),
                          p->size() * sizeof(float));
    }
    keys.push_back(static_cast<Key>(i));
    grads.push_back(PushSource(i));
    outs.push_back(PullTarget(i));
  }
  // Later layers finish first; the first layer's keys get the highest priority.
  kv_.Push(keys, grads, -layer_index);
  kv_.Pull(keys, outs, -layer_index);
}

void KVTrainer::FinishStep() {
  kv_.WaitAll();
  const std::vector<Param*>& params = model_.params();
  if (config_.update_on_kvstore) {
    if (on_device_) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        backend_.CopyToDevice(params[i]->value.data(), pull_staging_.data() + offsets_[i],
                              params[i]->size() * sizeof(float));
      }
    }
    return;
  }
  // Update locally from the sum of all workers' gradients, scaled to their mean.
  const float scale =
      kv_.Type() == "dist_async" ? 1.0f : 1.0f / static_cast<float>(kv_.NumWorkers());
  for (std::size_t i = 0; i < params.size(); ++i) {
    backend_.CopyToDevice(params[i]->grad.data(), pull_staging_.data() + offsets_[i],
                          params[i]->size() * sizeof(float));
    if (scale != 1.0f) backend_.Scale(params[i]->size(), scale, params[i]->grad.data());
  }
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
  EpochResult result;
  BatchStats interval;  // Speedometer: statistics since the last log line
  auto interval_start = Clock::now();
  for (int b = 0; b < sampler.batches_per_epoch(); ++b) {
    GatherBatch(data, std::span<const int>(order.data() + b * batch, batch), images, labels);
    const auto step_start = Clock::now();
    const BatchStats stats =
        model_.TrainStep(images.data(), labels.data(), static_cast<int>(batch), hook);
    const auto computed = Clock::now();
    FinishStep();
    result.compute_seconds += std::chrono::duration<double>(computed - step_start).count();
    result.wait_seconds += Seconds(computed);
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
  backend_.Synchronize();
  result.seconds = Seconds(start);
  return result;
}

// ---- RunTraining ----

TrainSummary RunTraining(const TrainConfig& config, KVStore& kv, std::ostream& log) {
  ValidateConfig(config);
  const int rank = kv.Rank();
  const int workers = kv.NumWorkers();
  MetricsLog metrics(log, config.metrics_out, rank);
  // Several workers on one machine spread over its GPUs.
  std::unique_ptr<Backend> backend =
      CreateBackend(config.device, config.local_rank >= 0 ? config.local_rank : rank);
  const Dataset train = LoadFashionMnist(config.data_dir, Split::kTrain);
  // Only rank 0 evaluates.
  const Dataset test = rank == 0 ? LoadFashionMnist(config.data_dir, Split::kTest) : Dataset{};
  const ShardSampler sampler(train.count, rank, workers, config.batch_size, config.seed);
  std::unique_ptr<Model> model = BuildModel(config.model, *backend, config.batch_size);
  model->InitParams(config.seed);
  log << "ps-train: rank " << rank << " of " << workers << ", model " << config.model << " ("
      << model->num_weights() << " weights in " << model->params().size() << " keys), device "
      << backend->Name() << ", kvstore " << kv.Type()
      << (config.update_on_kvstore ? ", update on kvstore" : ", update on worker") << ", "
      << sampler.batches_per_epoch() << " batches of " << config.batch_size << " per epoch\n"
      << std::flush;

  KVTrainer trainer(config, kv, *model);
  trainer.Start();
  TrainSummary summary;
  double train_seconds = 0.0;
  for (int epoch = 0; epoch < config.epochs; ++epoch) {
    const EpochResult r = trainer.TrainEpoch(train, sampler, epoch, metrics);
    train_seconds += r.seconds;
    metrics.EpochEnd(epoch, r);
    if (rank == 0) {
      summary.test_accuracy = EvaluateDataset(*model, test).accuracy();
      metrics.TestAccuracy(epoch, summary.test_accuracy);
    }
  }
  const double samples = static_cast<double>(workers) * sampler.batches_per_epoch() *
                         config.batch_size * config.epochs;
  summary.samples_per_sec = train_seconds > 0.0 ? samples / train_seconds : 0.0;
  if (rank == 0) metrics.Final(summary.test_accuracy, summary.samples_per_sec);
  kv.Barrier();  // no worker leaves while rank 0 still evaluates
  return summary;
}

}  // namespace ps::worker
