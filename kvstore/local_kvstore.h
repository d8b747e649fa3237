#pragma once
// LocalKVStore (type "local"): the whole store in this process, no servers. Gives the same
// values as dist_sync with one worker:
//   Init  stores a copy; a key is initialized once.
//   Push  with an optimizer set: weight <- optimizer step(weight, pushed gradient);
//         without: the stored value becomes the pushed value (dist_sync with no optimizer
//         stores the sum of the workers' pushes; with one worker that is the pushed value).
//         A key may appear once per call, as in every store type (kvstore/call_checks.h).
//   Pull  copies the stored value out.
// Every operation is synchronous (WaitAll is a no-op). A call that throws has changed nothing:
// all keys of a call are checked before any value is written.
//
// Stored dtypes: float32, float64, int32, int64 (the ones a dist server can sum); the
// optimizer needs float32. GPU tensors are staged through host memory during the call.
//
// Thread safety: every public call may come from any thread; one mutex serializes them (the
// optimizer still spreads one big update over threads).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvstore/call_checks.h"
#include "kvstore/optimizer.h"
#include "kvstore/staging_pool.h"
#include "ps/kvstore.h"
#include "ps/mutex.h"
#include "ps/thread_annotations.h"

namespace ps {

class LocalKVStore final : public KVStore {
 public:
  // parallel: how the optimizer and the copies split big arrays.
  explicit LocalKVStore(const ParallelOptions& parallel = {});
  ~LocalKVStore() override;

  void WaitAll() override {}
  void Barrier() override {}
  // Validates config (ps::Error naming the field) and replaces the optimizer; the new one
  // starts with fresh state (momentum, Adam moments, update counts).
  void SetOptimizer(const OptimizerConfig& config) override;
  int Rank() const override { return 0; }
  int NumWorkers() const override { return 1; }
  std::string Type() const override { return "local"; }
  // The same files as a dist store's (as server 0 of 1), so either loads the other's.
  void SaveCheckpoint(const std::string& dir) override;
  void LoadCheckpoint(const std::string& dir) override;

 protected:
  void InitImpl(std::span<const Key> keys, std::span<const Tensor> values) override;
  void PushImpl(std::span<const Key> keys, std::span<const Tensor> grads, int priority) override;
  void PullImpl(std::span<const Key> keys, std::span<const Tensor> outs, int priority) override;
  void PushPullImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                    std::span<const Tensor> outs, int priority) override;
  // Nothing to wait for (every call is synchronous); an unknown key is refused as elsewhere.
  void WaitImpl(std::span<const Key> keys) override;
  void WaitPullsImpl(std::span<const Key> keys) override;

 private:
  struct Entry {
    DType dtype = DType::kFloat32;
    std::size_t size = 0;               // elements
    std::unique_ptr<std::byte[]> data;  // size * DTypeSize(dtype) bytes, owned by the store
  };
  // Every check of a Push, Pull or PushPull (checks::Operation, as the dist store runs them),
  // before anything changes; returns each key's entry, in call order.
  std::vector<Entry*> CheckLocked(checks::Op op, std::span<const Key> keys,
                                  std::span<const Tensor> sends, std::span<const Tensor> outs)
      PS_REQUIRES(mu_);
  void ApplyPushLocked(std::span<Entry* const> entries, std::span<const Key> keys,
                       std::span<const Tensor> grads) PS_REQUIRES(mu_);
  void DoPullLocked(std::span<Entry* const> entries, std::span<const Key> keys,
                    std::span<const Tensor> outs, std::string_view op) PS_REQUIRES(mu_);

  const ParallelOptions parallel_;
  // Page-locked host copies of pushed GPU tensors.
  const std::shared_ptr<StagingPool> staging_ = StagingPool::Create();
  void CheckWaited(std::string_view op, std::span<const Key> keys);
  // The checkpoint calls without their "local kvstore: <call>: " prefix.
  void SaveCheckpointTo(const std::string& dir);
  void LoadCheckpointFrom(const std::string& dir);

  Mutex mu_;
  std::unordered_map<Key, Entry> store_ PS_GUARDED_BY(mu_);
  std::unique_ptr<Optimizer> optimizer_ PS_GUARDED_BY(mu_);  // null: pushes replace the value
};

}  // namespace ps
