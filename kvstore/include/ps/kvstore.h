#pragma once
// ps::KVStore: the worker-side API of the parameter server.
//
// Buffer lifetime rule: Push, Pull and PushPull are asynchronous. The memory a Tensor views
// must stay alive and unmodified (for a push) or untouched (for a pull) until WaitAll()
// returns. Init and SetOptimizer are synchronous and collective.
//
// GPU tensors (Device::CUDA(i)): the data must be complete when Push is called, so
// synchronize the stream that produced it first (the store copies it with cudaMemcpy on the
// legacy default stream, which is not ordered after non-blocking streams). After WaitAll() a
// pulled GPU tensor holds its value in device memory, ready for kernels on any stream. A call
// with a tensor on another GPU than the calling thread's current one makes that GPU current.
//
// Thread safety: Push, Pull, PushPull and WaitAll may be called from several threads at
// once. WaitAll waits for every operation issued so far by any thread; in dist_sync an
// operation completes only when every worker pushed, so threads that each loop "push, then
// WaitAll" can wait on each other across workers: issue from many threads, wait from one.
// Init, SetOptimizer and Barrier are collective: call them from one thread per worker.
//
// Errors: ps::Error, thrown by the call itself (bad arguments) or by the next WaitAll()
// (anything the servers report, a peer that died).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <ps/error.h>
#include <ps/tensor.h>

namespace ps {

struct OptimizerConfig {
  std::string name = "sgd";  // "sgd", "adam", "adagrad"
  float learning_rate = 0.01f;
  float momentum = 0.0f;        // sgd
  float weight_decay = 0.0f;    // all
  float rescale_grad = 1.0f;    // grad is multiplied by this first
  float clip_gradient = -1.0f;  // < 0: off; else grad clipped to [-c, c] after rescale
  float beta1 = 0.9f;           // adam
  float beta2 = 0.999f;         // adam
  float epsilon = 1e-8f;        // adam, adagrad
};

struct ClusterConfig;  // ps/config.h: a validated cluster description

class KVStore {
 public:
  // type: "local", "dist_sync" or "dist_async". The cluster comes from the DMLC_* environment.
  // In a process whose DMLC_ROLE is "server" or "scheduler" this runs that role until the job
  // ends and then exits the process with the role's status.
  static std::unique_ptr<KVStore> Create(const std::string& type);
  // Same, with an explicit cluster configuration (no environment read).
  static std::unique_ptr<KVStore> Create(const std::string& type, const ClusterConfig& config);

  virtual ~KVStore() = default;
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;

  void Init(Key key, const Tensor& value) { InitImpl(One(key), One(value)); }
  void Init(const std::vector<Key>& keys, const std::vector<Tensor>& values) {
    InitImpl(keys, values);
  }
  void Push(Key key, const Tensor& grad, int priority = 0) {
    PushImpl(One(key), One(grad), priority);
  }
  void Push(const std::vector<Key>& keys, const std::vector<Tensor>& grads, int priority = 0) {
    PushImpl(keys, grads, priority);
  }
  void Pull(Key key, const Tensor& out, int priority = 0) {
    PullImpl(One(key), One(out), priority);
  }
  void Pull(const std::vector<Key>& keys, const std::vector<Tensor>& outs, int priority = 0) {
    PullImpl(keys, outs, priority);
  }
  void PushPull(Key key, const Tensor& grad, const Tensor& out, int priority = 0) {
    PushPullImpl(One(key), One(grad), One(out), priority);
  }
  void PushPull(const std::vector<Key>& keys, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& outs, int priority = 0) {
    PushPullImpl(keys, grads, outs, priority);
  }

  virtual void WaitAll() = 0;
  virtual void Barrier() = 0;
  virtual void SetOptimizer(const OptimizerConfig& config) = 0;
  virtual int Rank() const = 0;
  virtual int NumWorkers() const = 0;
  virtual std::string Type() const = 0;
  // Tells the job that this worker failed and why: a distributed job ends at once with an error
  // naming this worker and `why`, instead of when its absence is noticed. Call it before
  // giving up on the store (e.g. when training throws); the store is not used afterwards.
  // Nothing happens on "local".
  virtual void ReportFailure(const std::string& why) { static_cast<void>(why); }

 protected:
  KVStore() = default;
  // The implementations take views, so a single-key call builds no vectors.
  template <class T>
  static std::span<const T> One(const T& item) {
    return {&item, 1};
  }
  virtual void InitImpl(std::span<const Key> keys, std::span<const Tensor> values) = 0;
  virtual void PushImpl(std::span<const Key> keys, std::span<const Tensor> grads, int priority) = 0;
  virtual void PullImpl(std::span<const Key> keys, std::span<const Tensor> outs, int priority) = 0;
  virtual void PushPullImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                            std::span<const Tensor> outs, int priority) = 0;
};

}  // namespace ps
