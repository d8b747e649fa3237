// Short local training runs on the CPU: the model math learns (no parameter server involved).
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "worker/cpu_backend.h"
#include "worker/dataset.h"
#include "worker/model.h"
#include "worker/sgd_trainer.h"
#include "worker/sharding.h"

namespace ps::worker {
namespace {

TEST_CASE("mlp learns Fashion-MNIST: one epoch on 10k samples beats 0.7 test accuracy",
          "[training]") {
  auto backend = MakeCpuBackend();
  const Dataset train = Subset(LoadFashionMnist(kDefaultDataDir, Split::kTrain), 10000);
  const Dataset test = LoadFashionMnist(kDefaultDataDir, Split::kTest);
  const int batch = 64;
  auto model = BuildModel("mlp", *backend, batch);
  model->InitParams(1);
  const BatchStats before = EvaluateDataset(*model, test);
  SgdOptimizer sgd(*model, SgdOptions{0.1f, 0.9f, 0.0f});
  const ShardSampler sampler(train.count, 0, 1, batch, 1);

  // Loss over the first and the last 20 batches of the epoch.
  const std::vector<int> order = sampler.EpochOrder(0);
  std::vector<float> images(static_cast<std::size_t>(batch) * train.sample_size());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  std::vector<double> losses;
  for (int b = 0; b < sampler.batches_per_epoch(); ++b) {
    GatherBatch(train, std::span<const int>(order.data() + b * batch, batch), images, labels);
    losses.push_back(model->TrainStep(images.data(), labels.data(), batch).mean_loss());
    sgd.Step();
  }
  REQUIRE(losses.size() == 156);
  const double first = std::accumulate(losses.begin(), losses.begin() + 20, 0.0) / 20;
  const double last = std::accumulate(losses.end() - 20, losses.end(), 0.0) / 20;
  const BatchStats after = EvaluateDataset(*model, test);
  INFO("train loss " << first << " -> " << last << ", test accuracy " << before.accuracy() << " -> "
                     << after.accuracy());
  CHECK(std::isfinite(last));
  CHECK(last < 0.6 * first);
  CHECK(after.samples == 10000);
  CHECK(after.accuracy() > 0.7);
  CHECK(after.mean_loss() < before.mean_loss());
}

TEST_CASE("TrainEpoch runs a sharded epoch and reports its statistics", "[training]") {
  auto backend = MakeCpuBackend();
  const Dataset train = Subset(LoadFashionMnist(kDefaultDataDir, Split::kTrain), 2000);
  auto model = BuildModel("mlp", *backend, 50);
  model->InitParams(5);
  SgdOptimizer sgd(*model, SgdOptions{0.05f, 0.0f, 1e-4f});
  const ShardSampler sampler(train.count, 1, 3, 50, 9);  // rank 1 of 3: 666 samples, 13 batches
  const EpochResult r0 = TrainEpoch(*model, sgd, train, sampler, 0);
  const EpochResult r1 = TrainEpoch(*model, sgd, train, sampler, 1);
  CHECK(r0.train.samples == 13 * 50);
  CHECK(r1.train.samples == 13 * 50);
  CHECK(r1.train.mean_loss() < r0.train.mean_loss());
  CHECK(r0.samples_per_sec() > 0.0);
}

TEST_CASE("cnn loss falls over a few CPU steps", "[training]") {
  auto backend = MakeCpuBackend();
  const Dataset train = Subset(LoadFashionMnist(kDefaultDataDir, Split::kTrain), 640);
  const int batch = 32;
  auto model = BuildModel("cnn", *backend, batch);
  model->InitParams(2);
  SgdOptimizer sgd(*model, SgdOptions{0.02f, 0.9f, 0.0f});
  const ShardSampler sampler(train.count, 0, 1, batch, 3);
  const EpochResult r = TrainEpoch(*model, sgd, train, sampler, 0);  // 20 steps
  CHECK(r.train.samples == 640);
  // Evaluate the same 640 samples before any more training: better than the 2.3 of chance.
  const BatchStats eval = EvaluateDataset(*model, train);
  INFO("epoch mean loss " << r.train.mean_loss() << ", loss after " << eval.mean_loss()
                          << ", accuracy " << eval.accuracy() << ", " << r.samples_per_sec()
                          << " samples/s");
  CHECK(eval.mean_loss() < 1.2);
  CHECK(eval.accuracy() > 0.55);
}

}  // namespace
}  // namespace ps::worker
