#include "worker/sgd_trainer.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <span>

namespace ps::worker {

SgdOptimizer::SgdOptimizer(Model& model, SgdOptions options) : model_(model), options_(options) {
  if (options_.momentum != 0.0f) {
    for (const Param* p : model_.params()) {
      DeviceArray<float>& m = momentum_.emplace_back(model_.backend(), p->size());
      model_.backend().Fill(m.data(), m.size(), 0.0f);
    }
  }
}

void SgdOptimizer::Step() {
  const std::vector<Param*>& params = model_.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    float* mom = momentum_.empty() ? nullptr : momentum_[i].data();
    model_.backend().SgdUpdate(params[i]->value.data(), params[i]->grad.data(), mom,
                               params[i]->size(), options_.learning_rate, options_.momentum,
                               options_.weight_decay);
  }
}

EpochResult TrainEpoch(Model& model, SgdOptimizer& optimizer, const Dataset& data,
                       const ShardSampler& sampler, int epoch) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int> order = sampler.EpochOrder(epoch);
  const auto batch = static_cast<std::size_t>(sampler.batch_size());
  std::vector<float> images(batch * data.sample_size());
  std::vector<std::int32_t> labels(batch);
  EpochResult result;
  for (int b = 0; b < sampler.batches_per_epoch(); ++b) {
    const std::span<const int> indices(order.data() + b * batch, batch);
    GatherBatch(data, indices, images, labels);
    result.train += model.TrainStep(images.data(), labels.data(), static_cast<int>(batch));
    optimizer.Step();
  }
  model.backend().Synchronize();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

BatchStats EvaluateDataset(Model& model, const Dataset& data) {
  const int max_batch = model.max_batch();
  std::vector<float> images(static_cast<std::size_t>(max_batch) * data.sample_size());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(max_batch));
  std::vector<int> indices(static_cast<std::size_t>(max_batch));
  BatchStats total;
  for (int begin = 0; begin < data.count; begin += max_batch) {
    const int n = std::min(max_batch, data.count - begin);
    std::iota(indices.begin(), indices.begin() + n, begin);
    GatherBatch(data, std::span<const int>(indices.data(), static_cast<std::size_t>(n)), images,
                labels);
    total += model.Evaluate(images.data(), labels.data(), n);
  }
  return total;
}

}  // namespace ps::worker
