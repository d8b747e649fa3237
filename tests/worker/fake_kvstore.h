#pragma once
// A single-worker, in-process stand-in for ps::KVStore with MXNet's `local` semantics, for
// testing the trainer without servers. Push/Pull are deferred until WaitAll, or a Wait naming
// their key, as a real store's may be, and the fake checks the buffer lifetime rule: a pushed
// buffer must be unchanged at that wait, and a pulled buffer is only written there. WaitPulls
// answers the pulls of its keys and applies the pushes before them, but leaves those pushes
// unanswered (as a replicated store does), their buffers still checked at their Wait.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ps/kvstore.h"

namespace ps::worker::testing {

class FakeKVStore final : public KVStore {
 public:
  struct Op {
    enum Kind { kPush, kPull } kind;
    Key key;
    int priority;
  };

  void WaitAll() override {
    ++wait_alls;
    for (const Pending& p : pending_) Complete(p);
    pending_.clear();
  }
  void Barrier() override { ++barriers; }
  void SetOptimizer(const OptimizerConfig& config) override {
    if (!set_optimizer_error.empty()) ThrowError(set_optimizer_error_kind, set_optimizer_error);
    optimizer = config;
    has_optimizer = true;
  }
  int Rank() const override { return 0; }
  int NumWorkers() const override { return 1; }
  std::string Type() const override { return "local"; }
  void SaveCheckpoint(const std::string&) override { throw Error("FakeKVStore: no checkpoints"); }
  void LoadCheckpoint(const std::string&) override { throw Error("FakeKVStore: no checkpoints"); }

  std::vector<Op> ops;                       // every push and pull, in call order
  std::vector<std::vector<Key>> waits;       // every Wait's keys, in call order
  std::vector<std::vector<Key>> pull_waits;  // every WaitPulls' keys, in call order
  std::vector<Key> init_keys;
  OptimizerConfig optimizer;
  bool has_optimizer = false;
  int wait_alls = 0;
  int barriers = 0;
  std::string set_optimizer_error;  // when set, SetOptimizer throws it (a failed collective)
  ErrorKind set_optimizer_error_kind = ErrorKind::kOther;  // ... as this kind

 protected:
  void InitImpl(std::span<const Key> keys, std::span<const Tensor> values) override {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto* data = static_cast<const float*>(values[i].data());
      store_[keys[i]].assign(data, data + values[i].size());
      init_keys.push_back(keys[i]);
    }
  }
  void PushImpl(std::span<const Key> keys, std::span<const Tensor> grads, int priority) override {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      REQUIRE(store_.count(keys[i]) == 1);
      REQUIRE(grads[i].dtype() == DType::kFloat32);
      REQUIRE_FALSE(grads[i].device().is_cuda());
      const auto* data = static_cast<const float*>(grads[i].data());
      ops.push_back({Op::kPush, keys[i], priority});
      pending_.push_back({ops.back(), grads[i], std::vector<float>(data, data + grads[i].size())});
    }
  }
  void PullImpl(std::span<const Key> keys, std::span<const Tensor> outs, int priority) override {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      REQUIRE(store_.count(keys[i]) == 1);
      ops.push_back({Op::kPull, keys[i], priority});
      pending_.push_back({ops.back(), outs[i], {}});
    }
  }
  void PushPullImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                    std::span<const Tensor> outs, int priority) override {
    PushImpl(keys, grads, priority);
    PullImpl(keys, outs, priority);
  }
  // Completes only the operations on `keys`, in call order; the others stay pending.
  void WaitImpl(std::span<const Key> keys) override {
    waits.emplace_back(keys.begin(), keys.end());
    CompleteKeys(keys, false);
  }
  void WaitPullsImpl(std::span<const Key> keys) override {
    pull_waits.emplace_back(keys.begin(), keys.end());
    CompleteKeys(keys, true);
  }

 private:
  struct Pending {
    Op op;
    Tensor tensor;
    std::vector<float> snapshot;  // a push's data as it was at Push time
    bool applied = false;         // a push that a WaitPulls applied already
  };

  // Completes the operations on `keys` in call order; with `pulls_only`, their pushes are
  // applied (later pulls see them) but stay pending, unanswered.
  void CompleteKeys(std::span<const Key> keys, bool pulls_only) {
    std::vector<Pending> later;
    for (Pending& p : pending_) {
      if (std::find(keys.begin(), keys.end(), p.op.key) == keys.end()) {
        later.push_back(std::move(p));
      } else if (pulls_only && p.op.kind == Op::kPush) {
        if (!p.applied) ApplyPush(p.op.key, p.snapshot);
        p.applied = true;
        later.push_back(std::move(p));
      } else {
        Complete(p);
      }
    }
    pending_ = std::move(later);
  }

  void Complete(const Pending& p) {
    if (p.op.kind == Op::kPush) {
      INFO("key " << p.op.key << ": pushed buffer modified before its wait");
      REQUIRE(std::memcmp(p.tensor.data(), p.snapshot.data(), p.snapshot.size() * 4) == 0);
      if (!p.applied) ApplyPush(p.op.key, p.snapshot);
    } else {
      const std::vector<float>& v = store_.at(p.op.key);
      REQUIRE(v.size() == p.tensor.size());
      std::memcpy(p.tensor.data(), v.data(), v.size() * sizeof(float));
    }
  }

  // MXNet's local store: with an optimizer, update the stored weight (sgd_mom_update); without,
  // the stored value becomes the pushed value (the sum over this single worker).
  void ApplyPush(Key key, const std::vector<float>& grad) {
    std::vector<float>& w = store_.at(key);
    if (!has_optimizer) {
      w = grad;
      return;
    }
    std::vector<float>& mom = momentum_[key];
    mom.resize(w.size(), 0.0f);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float g = optimizer.rescale_grad * grad[i] + optimizer.weight_decay * w[i];
      mom[i] = optimizer.momentum * mom[i] - optimizer.learning_rate * g;
      w[i] += mom[i];
    }
  }

  std::map<Key, std::vector<float>> store_;
  std::map<Key, std::vector<float>> momentum_;
  std::vector<Pending> pending_;
};

}  // namespace ps::worker::testing
