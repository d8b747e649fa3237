#pragma once
// ps::KVStore: the worker-side API of the parameter server.
//
// Buffer lifetime rule: Push, Pull and PushPull are asynchronous. The memory a Tensor views
// must stay alive and unmodified (for a push) or untouched (for a pull) until WaitAll()
// returns, or a Wait naming its key. Init and SetOptimizer are synchronous and collective.
//
// GPU tensors (Device::CUDA(i)): the data must be complete when Push is called, so
// synchronize the stream that produced it first (the store copies it with cudaMemcpy on the
// legacy default stream, which is not ordered after non-blocking streams). After WaitAll() a
// pulled GPU tensor holds its value in device memory, ready for kernels on any stream. A call
// with a tensor on another GPU than the calling thread's current one makes that GPU current.
//
// Thread safety: Push, Pull, PushPull, WaitAll and Wait may be called from several threads at
// once. WaitAll waits for every operation issued so far by any thread; in dist_sync an
// operation completes only when every worker pushed, so threads that each loop "push, then
// WaitAll" can wait on each other across workers: issue from many threads, wait from one.
// Init, SetOptimizer and Barrier are collective: call them from one thread per worker (a second
// one on another thread while the first waits throws).
//
// Errors: ps::Error, thrown by the call itself (bad arguments) or by the next WaitAll()
// (anything the servers report, a peer that died); for the failures a program may act on, a
// subclass of it (ps/error.h): DisagreementError when the workers' collective calls differ,
// CheckpointMismatchError when LoadCheckpoint finds another model's parameters.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ps/error.h"
#include "ps/tensor.h"

namespace ps {

// A learning-rate schedule, as MXNet's lr_scheduler: the rate of the t-th update (t = 1, 2, ...,
// counted per key where the optimizer runs: on the servers, or on the worker) is
//   t < warmup_steps:   warmup_begin_lr + (learning_rate - warmup_begin_lr) * t / warmup_steps
//   then, by type:
//   ""             learning_rate
//   "factor"       max(learning_rate * factor^floor((t - 1) / step), stop_factor_lr)
//   "multifactor"  learning_rate * factor^(number of steps[i] < t)
//   "cosine"       final_lr + (learning_rate - final_lr) * (1 + cos(pi * (t - warmup_steps) /
//                  (max_update - warmup_steps))) / 2, and final_lr after max_update
// Formulas and worked values: docs/optimizers.md.
struct LRSchedule {
  std::string type;                  // "", "factor", "multifactor", "cosine"
  std::uint64_t step = 0;            // factor: updates per drop (>= 1)
  std::vector<std::uint64_t> steps;  // multifactor: increasing update counts of the drops
  float factor = 1.0f;               // factor, multifactor: multiplier per drop, in (0, 1]
  float stop_factor_lr = 1e-8f;      // factor: the floor
  std::uint64_t max_update = 0;      // cosine: the update at which final_lr is reached
  float final_lr = 0.0f;             // cosine
  std::uint64_t warmup_steps = 0;    // any type: linear warm-up over this many updates
  float warmup_begin_lr = 0.0f;      // the warm-up's first rate
};

struct OptimizerConfig {
  std::string name = "sgd";  // "sgd", "nag", "adam", "adagrad", "rmsprop"
  float learning_rate = 0.01f;
  LRSchedule schedule;          // all
  float momentum = 0.0f;        // sgd, nag
  float weight_decay = 0.0f;    // all
  float rescale_grad = 1.0f;    // grad is multiplied by this first
  float clip_gradient = -1.0f;  // < 0: off; else grad clipped to [-c, c] after rescale
  float beta1 = 0.9f;           // adam
  float beta2 = 0.999f;         // adam
  float epsilon = 1e-8f;        // adam, adagrad, rmsprop
  float rho = 0.9f;             // rmsprop: decay of the mean square (MXNet's gamma1)
};

// Throws ps::Error naming the first invalid field of config (and its value):
// name not in {sgd, nag, adam, adagrad, rmsprop}; learning_rate < 0 or not finite; momentum, beta1,
// beta2 outside [0, 1); weight_decay < 0 or not finite; rescale_grad <= 0 or not finite;
// clip_gradient NaN; epsilon <= 0 or not finite; rho outside [0, 1); a schedule
// whose fields do not fit its type. Every field is checked whatever the name.
void ValidateOptimizerConfig(const OptimizerConfig& config);

// The learning rate of config's num_update-th update (1, 2, ...) under its schedule.
float LearningRateAt(const OptimizerConfig& config, std::uint64_t num_update);

// Gradient compression (SetGradientCompression; docs/kvstore.md, "Gradient compression").
// type: what pushes carry. "2bit" is MXNet's: each worker adds the gradient to a residual it
// keeps per key, sends +threshold where that is >= threshold, -threshold where it is
// <= -threshold, 0 elsewhere (16 values per 32-bit word), and keeps the difference. "1bit": the
// sign of residual + gradient, times one scale per slice (their mean magnitude), with the same
// error feedback. "fp16": half precision, with the same error feedback. "none": full float32.
// pull_type: what pulls carry ("none" is MXNet's: full values). Otherwise each server sends
// the change of the value since this worker's last pull, encoded like a push, keeping what it
// could not send (so both directions shrink). Only float32 keys are compressed.
struct GradientCompression {
  std::string type = "none";  // "2bit", "1bit", "fp16", "none"
  float threshold = 0.5f;     // 2bit: the magnitude sent (> 0)
  std::string pull_type = "none";
};

// What this process's transport sent and received (headers and payload frames, every peer),
// since the store was created. Values that take the same-host shared-memory path never touch
// the socket and are not counted.
struct TrafficStats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
};

struct ClusterConfig;  // ps/config.h: a validated cluster description

class KVStore {
 public:
  // type: "local", "dist_sync" or "dist_async". The cluster comes from the DMLC_* environment.
  // In a process whose DMLC_ROLE is "server" or "scheduler" this runs that role until the job
  // ends and then exits the process with the role's status; "local" throws ps::Error there.
  static std::unique_ptr<KVStore> Create(const std::string& type);
  // Same, with an explicit cluster configuration (no environment read).
  static std::unique_ptr<KVStore> Create(const std::string& type, const ClusterConfig& config);

  // Waits for this worker's operations and tells the job it finished. Destroy a store after
  // every other thread's calls into it returned: a dist store fails a call still in progress
  // and waits for it to return (docs/kvstore.md), and a call begun afterwards throws.
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

  // Waits for every operation issued so far, by any thread. Throws the first failure no wait
  // has thrown yet, naming how many more operations failed and on which keys.
  virtual void WaitAll() = 0;
  // Waits for the operations issued so far, by any thread, that involve any of `keys`; others
  // may still be in flight. Afterwards a pulled key's value is in place and a pushed key's
  // buffer may change again: the buffer lifetime rule, per key. It throws the failure of an
  // operation on one of `keys` that no wait threw yet (even if a wait for other keys threw
  // it), else the first failure no wait threw yet, whatever its key. A store may
  // wait for more than asked ("local", whose operations are synchronous, waits for nothing).
  // A key never initialized throws ps::Error, as Push would.
  void Wait(Key key) { WaitImpl(One(key)); }
  void Wait(const std::vector<Key>& keys) { WaitImpl(keys); }
  // Waits for the Pull and PushPull calls issued so far, by any thread, that involve any of
  // `keys`, not for their Push calls: afterwards the pulled values are in place, but a pushed
  // buffer of those keys must stay unmodified until a Wait naming its key (or WaitAll). With
  // replication a server answers a plain pull as soon as it applied the round (the replica
  // applies it meanwhile), while a push's answer waits for the replica: this returns a
  // replica's round trip sooner than Wait. It throws what Wait would. ps-train waits so for
  // each layer's weights just before that layer's forward pass.
  void WaitPulls(Key key) { WaitPullsImpl(One(key)); }
  void WaitPulls(const std::vector<Key>& keys) { WaitPullsImpl(keys); }
  virtual void Barrier() = 0;
  virtual void SetOptimizer(const OptimizerConfig& config) = 0;
  // Collective, before the first Push of any key; dist_sync and dist_async only ("local"
  // refuses it, as MXNet's local store does). An unknown type, a threshold <= 0, a call after
  // a push, or workers that ask for different settings throw ps::Error (on every worker).
  virtual void SetGradientCompression(const GradientCompression& config);
  // Bytes on the wire so far (all zero for "local").
  virtual TrafficStats Traffic() const { return {}; }
  virtual int Rank() const = 0;
  virtual int NumWorkers() const = 0;
  virtual std::string Type() const = 0;
  // Checkpoints (collective: every worker calls them, after its own pushes; they wait for
  // them). SaveCheckpoint writes every key's value and the optimizer state kept beside it
  // (momentum, Adam moments, update counts) into directory `dir`, created if missing: each
  // server one file, atomically, then worker 0 a MANIFEST naming them with their checksums,
  // so a checkpoint is complete or absent. A relative `dir` is taken from the calling worker's
  // working directory (the servers get it absolute). With push compression each worker also
  // writes its residuals there (worker-R.psres) before SaveCheckpoint returns, and
  // LoadCheckpoint restores them: call SetGradientCompression before LoadCheckpoint. On several
  // hosts `dir` must be one directory that every server and worker sees (a shared file system).
  // LoadCheckpoint restores a checkpoint into the keys this job initialized (Init them first,
  // and SetOptimizer first when the checkpoint holds optimizer state), whatever the number of
  // servers that saved it. A missing or corrupt file, a key missing from the checkpoint or of
  // another size (CheckpointMismatchError), or another optimizer is a ps::Error on every
  // worker, and no key changes (every server checks its slices before any loads them).
  virtual void SaveCheckpoint(const std::string& dir) = 0;
  virtual void LoadCheckpoint(const std::string& dir) = 0;
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
  // Wait(keys); by default WaitAll.
  virtual void WaitImpl(std::span<const Key> keys) {
    static_cast<void>(keys);
    WaitAll();
  }
  // WaitPulls(keys); by default Wait(keys).
  virtual void WaitPullsImpl(std::span<const Key> keys) { WaitImpl(keys); }
};

}  // namespace ps
