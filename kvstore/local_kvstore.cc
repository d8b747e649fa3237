#include "local_kvstore.h"

#include "checks.h"
#include "device_memory.h"

#include <unordered_set>
#include <utility>

namespace ps {
namespace {

constexpr std::string_view kStore = "local kvstore";

std::string Where(const char* op, Key key) { return checks::Where(kStore, op, key); }

}  // namespace

LocalKVStore::LocalKVStore(const ParallelOptions& parallel) : parallel_(parallel) {}

LocalKVStore::~LocalKVStore() = default;

void LocalKVStore::SetOptimizer(const OptimizerConfig& config) {
  auto optimizer = MakeOptimizer(config, parallel_);  // validates; throws before any change
  std::lock_guard lock(mu_);
  optimizer_ = std::move(optimizer);
}

LocalKVStore::Entry& LocalKVStore::FindLocked(const char* op, Key key) {
  auto it = store_.find(key);
  if (it == store_.end()) {
    throw Error(Where(op, key) + "unknown key (not initialized: call Init first)");
  }
  return it->second;
}

void LocalKVStore::InitImpl(std::span<const Key> keys, std::span<const Tensor> values) {
  checks::Counts(kStore, "Init", keys.size(), values.size());
  std::lock_guard lock(mu_);
  // Check every key first so a failing call stores nothing.
  std::unordered_set<Key> seen;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Key key = keys[i];
    const Tensor& v = values[i];
    checks::TensorBasics(kStore, "Init", key, v);
    checks::InitDType(kStore, key, v.dtype());
    if (auto it = store_.find(key); it != store_.end()) {
      throw Error(Where("Init", key) + "already initialized (holds " +
                  std::to_string(it->second.size) + " " + DTypeName(it->second.dtype) +
                  " elements; a key is initialized once)");
    }
    if (!seen.insert(key).second) {
      throw Error(Where("Init", key) + "given twice in one Init call");
    }
  }
  // Copy every value before storing any: a failed GPU copy leaves the store as it was.
  std::vector<Entry> entries(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Tensor& v = values[i];
    Entry& e = entries[i];
    e.dtype = v.dtype();
    e.size = v.size();
    e.data = std::make_unique_for_overwrite<std::byte[]>(v.bytes());
    checks::NamingKey(kStore, "Init", keys[i],
                      [&] { CopyToHost(e.data.get(), v.data(), v.bytes(), v.device()); });
  }
  for (std::size_t i = 0; i < keys.size(); ++i) store_.emplace(keys[i], std::move(entries[i]));
}

std::vector<LocalKVStore::PushGroup> LocalKVStore::PlanPushLocked(std::span<const Key> keys,
                                                                  std::span<const Tensor> grads) {
  checks::Counts(kStore, "Push", keys.size(), grads.size());
  std::vector<PushGroup> plan;
  std::unordered_map<Key, std::size_t> group_of;  // key -> index in plan
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Key key = keys[i];
    Entry& e = FindLocked("Push", key);
    checks::Matches(kStore, "Push", key, grads[i], e.dtype, e.size);
    if (optimizer_ && e.dtype != DType::kFloat32) {
      throw Error(Where("Push", key) + "optimizer supports float32 only, the key holds " +
                  DTypeName(e.dtype));
    }
    auto [it, fresh] = group_of.try_emplace(key, plan.size());
    if (fresh) plan.push_back(PushGroup{key, &e, {}});
    plan[it->second].tensors.push_back(i);
  }
  return plan;
}

void LocalKVStore::ApplyPushLocked(const std::vector<PushGroup>& plan,
                                   std::span<const Tensor> grads) {
  for (const PushGroup& g : plan) {
    Entry& e = *g.entry;
    const std::size_t bytes = e.size * DTypeSize(e.dtype);
    // The value pushed for this key: the tensor itself, or the sum of repeated ones.
    const void* pushed = grads[g.tensors.front()].data();
    std::unique_ptr<std::byte[]> merged;
    if (g.tensors.size() > 1) {
      merged = std::make_unique_for_overwrite<std::byte[]>(bytes);
      CopyInto(merged.get(), pushed, bytes, parallel_);
      for (std::size_t k = 1; k < g.tensors.size(); ++k) {
        AddInto(e.dtype, merged.get(), grads[g.tensors[k]].data(), e.size, parallel_);
      }
      pushed = merged.get();
    }
    if (optimizer_) {
      optimizer_->Update(g.key, reinterpret_cast<float*>(e.data.get()),
                         static_cast<const float*>(pushed), e.size);
    } else {
      CopyInto(e.data.get(), pushed, bytes, parallel_);
    }
  }
}

void LocalKVStore::CheckPullLocked(std::span<const Key> keys, std::span<const Tensor> outs) {
  checks::Counts(kStore, "Pull", keys.size(), outs.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Entry& e = FindLocked("Pull", keys[i]);
    checks::Matches(kStore, "Pull", keys[i], outs[i], e.dtype, e.size);
    // A PushPull must not push when its pull cannot land: check the output's GPU exists.
    if (outs[i].device().is_cuda()) {
      checks::NamingKey(kStore, "Pull", keys[i], [&] { CheckDevice(outs[i].device()); });
    }
  }
}

void LocalKVStore::DoPullLocked(std::span<const Key> keys, std::span<const Tensor> outs) {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Entry& e = store_.find(keys[i])->second;  // checked by CheckPullLocked
    const std::size_t bytes = e.size * DTypeSize(e.dtype);
    if (outs[i].device().is_cuda()) {
      checks::NamingKey(kStore, "Pull", keys[i], [&] {
        CopyToDevice(outs[i].data(), e.data.get(), bytes, outs[i].device());
      });
    } else {
      CopyInto(outs[i].data(), e.data.get(), bytes, parallel_);
    }
  }
}

void LocalKVStore::PushImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                            int /*priority: nothing is queued here*/) {
  std::lock_guard lock(mu_);
  const auto plan = PlanPushLocked(keys, grads);
  // GPU gradients: copied to host memory before anything changes.
  const HostViews host = StageOnHost(kStore, "Push", keys, grads);
  ApplyPushLocked(plan, host.tensors);
}

void LocalKVStore::PullImpl(std::span<const Key> keys, std::span<const Tensor> outs,
                            int /*priority*/) {
  std::lock_guard lock(mu_);
  CheckPullLocked(keys, outs);
  DoPullLocked(keys, outs);
}

void LocalKVStore::PushPullImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                                std::span<const Tensor> outs, int /*priority*/) {
  std::lock_guard lock(mu_);
  // Both halves are checked before anything is written; the pull sees this push's result.
  const auto plan = PlanPushLocked(keys, grads);
  CheckPullLocked(keys, outs);
  const HostViews host = StageOnHost(kStore, "PushPull", keys, grads);
  ApplyPushLocked(plan, host.tensors);
  DoPullLocked(keys, outs);
}

}  // namespace ps
