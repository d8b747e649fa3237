// dist_sync with 2 workers at batch b against local SGD at batch 2b, through the real
// ps-scheduler and ps-server processes: after a few steps every weight agrees up to float
// rounding. Step t of the local run trains on the union of both workers' step-t batches.
#include <catch2/catch.hpp>

#include <functional>
#include <sstream>
#include <thread>

#include "tests/kvstore/kv_cluster.h"
#include "tests/worker/test_util.h"
#include "worker/cpu_backend.h"
#include "worker/sgd_trainer.h"
#include "worker/trainer.h"

namespace ps::worker {
namespace {

constexpr int kBatch = 20;
constexpr int kSamples = 400;  // 200 per worker: 10 steps of 20

TrainConfig EquivalenceConfig(bool update_on_kvstore) {
  TrainConfig c;
  c.kvstore = "dist_sync";
  c.update_on_kvstore = update_on_kvstore;
  c.batch_size = kBatch;
  c.lr = 0.05f;
  c.momentum = 0.9f;
  c.weight_decay = 1e-4f;
  c.log_interval = 1000;
  return c;
}

// What one worker's thread ended with: "" when it returned.
struct Outcome {
  std::string error;
  bool disagreement = false;  // a ps::DisagreementError
};

// Runs `work` on both workers of `cluster`, each on a thread of its own with its own
// dist_sync store and mlp (initialized with seed 11).
std::vector<Outcome> RunTwoWorkers(ps::test::KVCluster& cluster,
                                   const std::function<void(KVStore&, Model&)>& work) {
  std::vector<Outcome> outcomes(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      Outcome& outcome = outcomes[static_cast<std::size_t>(t)];
      try {
        auto kv = KVStore::Create("dist_sync", cluster.WorkerConfig());
        auto backend = MakeCpuBackend();
        auto model = BuildModel("mlp", *backend, kBatch);
        model->InitParams(11);
        work(*kv, *model);
      } catch (const DisagreementError& e) {
        outcome = {e.what(), true};
      } catch (const std::exception& e) {
        outcome = {e.what(), false};
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return outcomes;
}

void CheckTwoWorkersMatchDoubleBatch(bool update_on_kvstore) {
  const Dataset data = Subset(LoadFashionMnist(kDefaultDataDir, Split::kTrain), kSamples);
  const TrainConfig config = EquivalenceConfig(update_on_kvstore);
  constexpr std::uint64_t kSeed = 5;

  ps::test::KVCluster cluster(1, 2);
  std::vector<std::vector<std::vector<float>>> weights(2);  // per rank: every parameter
  const std::vector<Outcome> outcomes = RunTwoWorkers(cluster, [&](KVStore& kv, Model& model) {
    const ShardSampler sampler(data.count, kv.Rank(), 2, kBatch, kSeed);
    std::ostringstream log;
    MetricsLog metrics(log, "", kv.Rank());
    KVTrainer trainer(config, kv, model);
    trainer.Start();
    trainer.TrainEpoch(data, sampler, 0, metrics);
    auto& mine = weights[static_cast<std::size_t>(kv.Rank())];
    for (const Param* p : model.params()) mine.push_back(p->value.ToHost());
  });
  for (const Outcome& outcome : outcomes) REQUIRE(outcome.error.empty());
  CHECK(cluster.EndedCleanly());

  // The same steps locally: batch t = rank 0's batch t followed by rank 1's.
  auto backend = MakeCpuBackend();
  auto local = BuildModel("mlp", *backend, 2 * kBatch);
  local->InitParams(11);
  SgdOptimizer sgd(*local, SgdOptions{config.lr, config.momentum, config.weight_decay});
  const ShardSampler rank0(data.count, 0, 2, kBatch, kSeed);
  const ShardSampler rank1(data.count, 1, 2, kBatch, kSeed);
  const std::vector<int> order0 = rank0.EpochOrder(0);
  const std::vector<int> order1 = rank1.EpochOrder(0);
  std::vector<float> images(2 * kBatch * data.sample_size());
  std::vector<std::int32_t> labels(2 * kBatch);
  for (int step = 0; step < rank0.batches_per_epoch(); ++step) {
    std::vector<int> indices(order0.begin() + step * kBatch, order0.begin() + (step + 1) * kBatch);
    indices.insert(indices.end(), order1.begin() + step * kBatch,
                   order1.begin() + (step + 1) * kBatch);
    GatherBatch(data, indices, images, labels);
    local->TrainStep(images.data(), labels.data(), 2 * kBatch);
    sgd.Step();
  }
  for (std::size_t i = 0; i < local->params().size(); ++i) {
    INFO(local->params()[i]->name);
    const std::vector<float> expected = local->params()[i]->value.ToHost();
    CHECK(testing::MaxScaledDiff(weights[0][i], expected) < 1e-4);
    CHECK(weights[1][i] == weights[0][i]);  // both workers pulled the same values
  }
}

TEST_CASE("dist_sync with 2 workers of batch b gives the weights of local with batch 2b",
          "[trainer][dist]") {
  CheckTwoWorkersMatchDoubleBatch(true);
}

TEST_CASE("the same with updates on the workers (no-update-on-kvstore)", "[trainer][dist]") {
  CheckTwoWorkersMatchDoubleBatch(false);
}

TEST_CASE("workers started with another --update-on-kvstore fail at the start, naming the flag",
          "[trainer][dist]") {
  ps::test::KVCluster cluster(1, 2);
  const std::vector<Outcome> outcomes = RunTwoWorkers(cluster, [](KVStore& kv, Model& model) {
    // Rank 0 updates on the servers, rank 1 on itself.
    KVTrainer trainer(EquivalenceConfig(kv.Rank() == 0), kv, model);
    trainer.Start();
  });
  // The worker on the servers' side names every flag its SetOptimizer compares; the one that
  // updates itself compares only the mode, and says so.
  int itself = 0;
  for (const Outcome& outcome : outcomes) {
    INFO(outcome.error);
    CHECK(outcome.disagreement);
    const bool updates_itself =
        outcome.error.find(
            "this worker updates the weights itself (--no-update-on-kvstore), "
            "another worker set an optimizer on the servers "
            "(--update-on-kvstore)") != std::string::npos;
    itself += updates_itself ? 1 : 0;
    if (!updates_itself) {
      CHECK_THAT(outcome.error, Catch::Contains("--update-on-kvstore or --no-update-on-kvstore"));
    }
  }
  CHECK(itself == 1);
}

TEST_CASE("workers that update the weights themselves with another --lr fail at the start",
          "[trainer][dist]") {
  ps::test::KVCluster cluster(1, 2);
  const std::vector<Outcome> outcomes = RunTwoWorkers(cluster, [](KVStore& kv, Model& model) {
    TrainConfig config = EquivalenceConfig(false);
    if (kv.Rank() == 1) config.lr = 0.1f;  // rank 0 has 0.05
    KVTrainer trainer(config, kv, model);
    trainer.Start();
  });
  for (const Outcome& outcome : outcomes) {
    INFO(outcome.error);
    CHECK(outcome.disagreement);
    CHECK_THAT(outcome.error,
               Catch::StartsWith("the workers update the weights themselves "
                                 "(--no-update-on-kvstore), with other SGD settings: start every "
                                 "worker with the same --lr, --momentum"));
    CHECK_THAT(outcome.error, Catch::Contains("(this worker's: --lr 0."));
  }
}

}  // namespace
}  // namespace ps::worker
