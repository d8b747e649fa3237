// Dataset sharding: equal batch counts on every rank, disjoint shards covering the dataset,
// deterministic per-epoch shuffles.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "worker/errors.h"
#include "worker/sharding.h"

namespace ps::worker {
namespace {

TEST_CASE("shards are disjoint, cover the dataset and give every rank the same batch count",
          "[sharding]") {
  for (const int n : {60000, 10007, 100, 7}) {
    for (const int workers : {1, 2, 3, 7}) {
      for (const int batch : {1, 32, 64}) {
        if (n / workers < batch) continue;
        INFO("n=" << n << " workers=" << workers << " batch=" << batch);
        std::vector<int> owner(static_cast<std::size_t>(n), -1);
        int batches = -1;
        for (int rank = 0; rank < workers; ++rank) {
          const ShardSampler s(n, rank, workers, batch, 5);
          if (batches < 0) batches = s.batches_per_epoch();
          CHECK(s.batches_per_epoch() == batches);
          CHECK(s.batches_per_epoch() == (n / workers) / batch);
          CHECK(s.shard_size() >= n / workers);
          CHECK(s.shard_size() <= n / workers + 1);
          for (int i = s.shard_begin(); i < s.shard_end(); ++i) {
            REQUIRE(owner[static_cast<std::size_t>(i)] == -1);  // disjoint
            owner[static_cast<std::size_t>(i)] = rank;
          }
          for (const int epoch : {0, 1}) {
            const std::vector<int> order = s.EpochOrder(epoch);
            REQUIRE(order.size() == static_cast<std::size_t>(batches) * batch);
            std::set<int> unique(order.begin(), order.end());
            CHECK(unique.size() == order.size());  // no sample twice in an epoch
            CHECK(*unique.begin() >= s.shard_begin());
            CHECK(*unique.rbegin() < s.shard_end());
          }
        }
        CHECK(std::count(owner.begin(), owner.end(), -1) == 0);  // covering
      }
    }
  }
}

TEST_CASE("epoch order is reshuffled per epoch and reproducible from the seed", "[sharding]") {
  const ShardSampler a(1000, 1, 2, 10, 42);
  const ShardSampler same(1000, 1, 2, 10, 42);
  const ShardSampler other_seed(1000, 1, 2, 10, 43);
  CHECK(a.EpochOrder(0) == same.EpochOrder(0));
  CHECK(a.EpochOrder(3) == same.EpochOrder(3));
  CHECK(a.EpochOrder(0) != a.EpochOrder(1));
  CHECK(a.EpochOrder(0) != other_seed.EpochOrder(0));
  // The whole shard is visited over an epoch when it divides evenly into batches.
  std::vector<int> order = a.EpochOrder(2);
  std::sort(order.begin(), order.end());
  for (std::size_t i = 0; i < order.size(); ++i) CHECK(order[i] == 500 + static_cast<int>(i));
}

TEST_CASE("samples dropped by the batch cut differ between epochs", "[sharding]") {
  // 105 samples, batch 10: 5 left out each epoch, but not the same 5.
  const ShardSampler s(105, 0, 1, 10, 1);
  std::set<int> seen;
  for (int epoch = 0; epoch < 10; ++epoch) {
    for (const int i : s.EpochOrder(epoch)) seen.insert(i);
  }
  CHECK(seen.size() == 105);
}

TEST_CASE("sharding rejects impossible configurations", "[sharding]") {
  CHECK_THROWS_AS(ShardSampler(100, 2, 2, 10, 0), ConfigError);
  CHECK_THROWS_AS(ShardSampler(100, -1, 2, 10, 0), ConfigError);
  CHECK_THROWS_AS(ShardSampler(100, 0, 0, 10, 0), ConfigError);
  CHECK_THROWS_AS(ShardSampler(100, 0, 1, 0, 0), ConfigError);
  CHECK_THROWS_WITH(ShardSampler(100, 0, 3, 64, 0),
                    Catch::Contains("larger than a worker's shard of 33 samples") &&
                        Catch::EndsWith("use a smaller batch size, more --num-examples or "
                                        "fewer workers"));
  // No sample for a worker: no batch size helps.
  CHECK_THROWS_WITH(ShardSampler(1, 0, 2, 1, 0),
                    Catch::EndsWith("shard of 0 samples (1 samples over 2 workers): give more "
                                    "--num-examples, or use fewer workers"));
}

}  // namespace
}  // namespace ps::worker
