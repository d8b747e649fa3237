#pragma once
// Server-side optimizers (MXNet semantics) and the element-wise helpers the server uses to
// merge pushes. The formulas, exactly as implemented, are in docs/optimizers.md.
//
// Threading: arrays of at least ParallelOptions::min_parallel_elements are split over threads
// (ParallelFor, kvstore/parallel.h). Every operation here is element-wise, so the result is
// bit-for-bit the same whatever the split.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kvstore/parallel.h"
#include "ps/kvstore.h"
#include "ps/mutex.h"
#include "ps/tensor.h"
#include "ps/thread_annotations.h"

namespace ps {

// acc[i] += src[i] for i < n. The ranges must not overlap (ps::Error).
void AddInto(float* acc, const float* src, std::size_t n, const ParallelOptions& options = {});
// Same for any summable dtype (float32, float64, int32, int64); integers wrap on overflow
// (two's complement) instead of invoking undefined behaviour. Other dtypes: ps::Error.
void AddInto(DType dtype, void* acc, const void* src, std::size_t n,
             const ParallelOptions& options = {});
// True for the dtypes AddInto sums.
bool IsSummableDType(DType dtype);
// memcpy, split over threads for big buffers (bytes, not elements).
void CopyInto(void* dst, const void* src, std::size_t bytes, const ParallelOptions& options = {});

// ValidateOptimizerConfig (ps/kvstore.h) checks a config before it is used.

// A float32 optimizer holding per-state buffers (momentum; Adam's m and v; AdaGrad's
// history) and a per-state update count.
//
// State ids are opaque to the optimizer: the caller picks one per independently updated
// array (the whole key in the local store; one id per key slice on a server). A state is
// created, zero-filled, at its first update and sized then; every later update of that id
// must pass the same length (ps::Error otherwise, and nothing changes).
//
// Thread safety: Update may be called from several threads at once, for the same or different
// state ids (each state has its own lock; updates of one id are applied one at a time).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // weight[i] <- update(weight[i], grad[i]) for i < n. weight and grad must not overlap.
  void Update(std::uint64_t state_id, float* weight, const float* grad, std::size_t n);
  // Checked form for untyped buffers: both float32 (else ps::Error "optimizer supports
  // float32 only ..."), both on the CPU, same size.
  void Update(std::uint64_t state_id, const Tensor& weight, const Tensor& grad);

  const OptimizerConfig& config() const { return config_; }
  const ParallelOptions& parallel() const { return parallel_; }
  // Updates applied to state_id so far (0 for an id never updated).
  std::uint64_t UpdateCount(std::uint64_t state_id) const;
  // Number of state ids with state.
  std::size_t NumStates() const;
  // Float buffers per state, each as long as the weight (SGD with momentum 1, Adam 2, ...).
  int num_buffers() const { return num_buffers_; }

  // A state as a checkpoint keeps it: the updates applied and the buffers, num_buffers() of
  // `length` floats one after the other. Export gives nullopt for an id never updated.
  struct SavedState {
    std::size_t length = 0;
    std::uint64_t count = 0;
    std::vector<float> buffers;
  };
  std::optional<SavedState> ExportState(std::uint64_t state_id) const;
  // Replaces state_id's state (ps::Error when saved.buffers is not num_buffers() x length).
  void ImportState(std::uint64_t state_id, const SavedState& saved);

 protected:
  // num_buffers: float buffers per state (0, 1 or 2), each as long as the weight.
  Optimizer(const OptimizerConfig& config, const ParallelOptions& parallel, int num_buffers);

  struct State {
    std::size_t length = 0;
    std::uint64_t count = 0;  // updates applied, the running one included (Adam's t)
    std::unique_ptr<float[]> buffers[2];
  };
  // The scheduled rate of the update `state` is applying (its count, already incremented).
  float LearningRate(const State& state) const;
  // Applies one step to weight[0, n) (n == state.length, count already incremented). Runs with
  // the state's lock held; splits the work itself with ParallelFor.
  virtual void Step(State& state, float* weight, const float* grad, std::size_t n) = 0;

 private:
  struct Slot {
    mutable Mutex mu;
    bool created PS_GUARDED_BY(mu) = false;
    State state PS_GUARDED_BY(mu);
  };
  Slot& SlotFor(std::uint64_t state_id);

  const OptimizerConfig config_;
  const ParallelOptions parallel_;
  const int num_buffers_;
  mutable Mutex map_mu_;
  // Slots are never erased while the optimizer lives, so a Slot& stays valid outside map_mu_.
  std::unordered_map<std::uint64_t, std::unique_ptr<Slot>> slots_ PS_GUARDED_BY(map_mu_);
};

// Validates config (ValidateOptimizerConfig) and builds the optimizer it names.
std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                         const ParallelOptions& parallel = {});

}  // namespace ps
