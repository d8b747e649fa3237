#pragma once
// Splits a dataset among workers and orders each worker's shard per epoch.
//
// Rank r of W owns the contiguous range [floor(r*N/W), floor((r+1)*N/W)). Every epoch the shard is
// reshuffled from (seed, epoch) and cut into batches_per_epoch() full batches, where
// batches_per_epoch() = floor(min shard size / batch) is the same for every rank, so all workers
// of a synchronous job run the same number of steps. The few samples left over in an epoch are
// not dropped for good: the next epoch's shuffle brings them back.
#include <cstdint>
#include <vector>

namespace ps::worker {

class ShardSampler {
 public:
  // Throws ConfigError for a bad rank/num_workers/batch, or when a shard is smaller than a batch.
  ShardSampler(int num_samples, int rank, int num_workers, int batch_size, std::uint64_t seed);

  int shard_begin() const { return begin_; }
  int shard_end() const { return end_; }
  int shard_size() const { return end_ - begin_; }
  int batch_size() const { return batch_size_; }
  int batches_per_epoch() const { return batches_; }

  // Sample indices (into the full dataset) for `epoch`: batches_per_epoch() * batch_size()
  // entries; batch b is the slice [b * batch_size(), (b + 1) * batch_size()).
  std::vector<int> EpochOrder(int epoch) const;

 private:
  int begin_ = 0;
  int end_ = 0;
  int batch_size_ = 0;
  int batches_ = 0;
  std::uint64_t seed_ = 0;
};

}  // namespace ps::worker
