#include "worker/sharding.h"

#include <numeric>
#include <span>
#include <string>

#include "worker/errors.h"
#include "worker/random.h"

namespace ps::worker {

ShardSampler::ShardSampler(int num_samples, int rank, int num_workers, int batch_size,
                           std::uint64_t seed)
    : batch_size_(batch_size), seed_(seed) {
  if (num_workers < 1 || rank < 0 || rank >= num_workers) {
    throw ConfigError("invalid worker rank " + std::to_string(rank) + " of " +
                      std::to_string(num_workers) + " workers");
  }
  if (batch_size < 1) {
    throw ConfigError("invalid --batch-size " + std::to_string(batch_size) + ": must be >= 1");
  }
  const auto n = static_cast<std::int64_t>(num_samples);
  begin_ = static_cast<int>(n * rank / num_workers);
  end_ = static_cast<int>(n * (rank + 1) / num_workers);
  const int min_shard = num_samples / num_workers;  // floor(N/W): the smallest rank's shard
  batches_ = min_shard / batch_size;
  if (batches_ == 0) {
    // With no sample per worker no batch size helps: more examples, or fewer workers, do.
    throw ConfigError("--batch-size " + std::to_string(batch_size) +
                      " is larger than a worker's shard of " + std::to_string(min_shard) +
                      " samples (" + std::to_string(num_samples) + " samples over " +
                      std::to_string(num_workers) + " workers): " +
                      (min_shard == 0 ? "give more --num-examples, or use fewer workers"
                                      : "use a smaller batch size, more --num-examples or "
                                        "fewer workers"));
  }
}

std::vector<int> ShardSampler::EpochOrder(int epoch) const {
  std::vector<int> order(static_cast<std::size_t>(shard_size()));
  std::iota(order.begin(), order.end(), begin_);
  // Same seed and epoch -> same order on any machine; a new epoch -> a new order.
  std::mt19937_64 rng(MixSeed(seed_, static_cast<std::uint64_t>(epoch)));
  Shuffle(std::span<int>(order), rng);
  order.resize(static_cast<std::size_t>(batches_) * static_cast<std::size_t>(batch_size_));
  return order;
}

}  // namespace ps::worker
