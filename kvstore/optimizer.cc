// Optimizer kernels and element-wise helpers. Built with -O3 -fno-math-errno -ffp-contract=off
// (see kvstore/CMakeLists.txt): the loops below are plain contiguous loops over __restrict
// pointers that the compiler vectorizes; no errno lets sqrt vectorize, and no FMA contraction
// keeps results identical across machines and between vector body and scalar tail.
#include "kvstore/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace ps {
namespace {

bool Overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

// ---- element-wise kernels (one contiguous chunk each) ----

template <typename T>
void AddKernel(T* __restrict acc, const T* __restrict src, std::size_t n) {
  if constexpr (std::is_integral_v<T>) {
    // Wrap instead of signed-overflow UB: the values may come off the network.
    using U = std::make_unsigned_t<T>;
    for (std::size_t i = 0; i < n; ++i) {
      acc[i] = static_cast<T>(static_cast<U>(acc[i]) + static_cast<U>(src[i]));
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] += src[i];
  }
}

// MXNet's clip::Map: NaN passes through unchanged.
inline float Clip(float x, float c) { return x > c ? c : (x < -c ? -c : x); }

// Plain SGD, MXNet SGDKernel: w = (1 - lr*wd)*w - lr*clip(rescale*g)  (or - (lr*rescale)*g).
template <bool kClip>
void SgdKernel(float* __restrict w, const float* __restrict g, std::size_t n, float decay, float lr,
               float rescale, float lr_rescale, float clip) {
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (kClip) {
      w[i] = decay * w[i] - lr * Clip(rescale * g[i], clip);
    } else {
      w[i] = decay * w[i] - lr_rescale * g[i];
    }
  }
}

// SGD with momentum, MXNet SGDMomKernel:
// mom = momentum*mom - (lr*wd)*w - lr*clip(rescale*g)  (or - (lr*rescale)*g);  w = w + mom.
template <bool kClip>
void SgdMomKernel(float* __restrict w, const float* __restrict g, float* __restrict mom,
                  std::size_t n, float momentum, float lr_wd, float lr, float rescale,
                  float lr_rescale, float clip) {
  for (std::size_t i = 0; i < n; ++i) {
    float m;
    if constexpr (kClip) {
      m = momentum * mom[i] - lr_wd * w[i] - lr * Clip(rescale * g[i], clip);
    } else {
      m = momentum * mom[i] - lr_wd * w[i] - lr_rescale * g[i];
    }
    mom[i] = m;
    w[i] = w[i] + m;
  }
}

// NAG, MXNet NAGMomKernel: g' = clip(rescale*g); mom = momentum*mom + g' + wd*w;
// w = w - lr*(g' + wd*w + momentum*mom).
template <bool kClip>
void NagKernel(float* __restrict w, const float* __restrict g, float* __restrict mom, std::size_t n,
               float momentum, float lr, float wd, float rescale, float clip) {
  for (std::size_t i = 0; i < n; ++i) {
    float gi = rescale * g[i];
    if constexpr (kClip) gi = Clip(gi, clip);
    const float decayed = gi + wd * w[i];
    const float m = momentum * mom[i] + decayed;
    mom[i] = m;
    w[i] = w[i] - lr * (decayed + momentum * m);
  }
}

// RMSProp, MXNet's non-centered RMSPropUpdate: g' = clip(rescale*g + wd*w);
// n = (1 - rho)*g'*g' + rho*n; w = w - lr*g' / sqrt(n + eps).
template <bool kClip>
void RmspropKernel(float* __restrict w, const float* __restrict g, float* __restrict sq,
                   std::size_t n, float lr, float wd, float rescale, float clip, float rho,
                   float one_minus_rho, float eps) {
  for (std::size_t i = 0; i < n; ++i) {
    float gi = rescale * g[i] + wd * w[i];
    if constexpr (kClip) gi = Clip(gi, clip);
    const float s = one_minus_rho * gi * gi + rho * sq[i];
    sq[i] = s;
    w[i] = w[i] - lr * gi / std::sqrt(s + eps);
  }
}

// Adam: g' = clip(rescale*g) + wd*w; m = b1*m + (1-b1)*g'; v = b2*v + (1-b2)*g'*g';
// w = w - lr_t*m / (sqrt(v) + eps), lr_t the bias-corrected rate of this step.
template <bool kClip>
void AdamKernel(float* __restrict w, const float* __restrict g, float* __restrict mean,
                float* __restrict var, std::size_t n, float lr_t, float wd, float rescale,
                float clip, float beta1, float beta2, float one_minus_beta1, float one_minus_beta2,
                float eps) {
  for (std::size_t i = 0; i < n; ++i) {
    float gi = rescale * g[i];
    if constexpr (kClip) gi = Clip(gi, clip);
    gi = gi + wd * w[i];
    const float m = beta1 * mean[i] + one_minus_beta1 * gi;
    const float v = beta2 * var[i] + one_minus_beta2 * gi * gi;
    mean[i] = m;
    var[i] = v;
    w[i] = w[i] - lr_t * m / (std::sqrt(v) + eps);
  }
}

// AdaGrad: g' = clip(rescale*g); h = h + g'*g'; w = w - lr*(g'/(sqrt(h) + eps) + wd*w).
template <bool kClip>
void AdagradKernel(float* __restrict w, const float* __restrict g, float* __restrict hist,
                   std::size_t n, float lr, float wd, float rescale, float clip, float eps) {
  for (std::size_t i = 0; i < n; ++i) {
    float gi = rescale * g[i];
    if constexpr (kClip) gi = Clip(gi, clip);
    const float h = hist[i] + gi * gi;
    hist[i] = h;
    w[i] = w[i] - lr * (gi / (std::sqrt(h) + eps) + wd * w[i]);
  }
}

// ---- the three optimizers ----

class SgdOptimizer final : public Optimizer {
 public:
  SgdOptimizer(const OptimizerConfig& c, const ParallelOptions& p)
      : Optimizer(c, p, c.momentum > 0.0f ? 1 : 0) {}

 private:
  void Step(State& state, float* w, const float* g, std::size_t n) override {
    const OptimizerConfig& c = config();
    const float lr = LearningRate(state);
    const float rescale = c.rescale_grad;
    const float clip = c.clip_gradient;
    const float lr_rescale = lr * rescale;
    const bool do_clip = clip >= 0.0f;
    if (c.momentum > 0.0f) {
      float* mom = state.buffers[0].get();
      const float momentum = c.momentum;
      const float lr_wd = lr * c.weight_decay;
      ParallelFor(n, parallel(), [=](std::size_t b, std::size_t e) {
        if (do_clip) {
          SgdMomKernel<true>(w + b, g + b, mom + b, e - b, momentum, lr_wd, lr, rescale, lr_rescale,
                             clip);
        } else {
          SgdMomKernel<false>(w + b, g + b, mom + b, e - b, momentum, lr_wd, lr, rescale,
                              lr_rescale, clip);
        }
      });
    } else {
      const float decay = 1.0f - lr * c.weight_decay;
      ParallelFor(n, parallel(), [=](std::size_t b, std::size_t e) {
        if (do_clip) {
          SgdKernel<true>(w + b, g + b, e - b, decay, lr, rescale, lr_rescale, clip);
        } else {
          SgdKernel<false>(w + b, g + b, e - b, decay, lr, rescale, lr_rescale, clip);
        }
      });
    }
  }
};

class NagOptimizer final : public Optimizer {
 public:
  NagOptimizer(const OptimizerConfig& c, const ParallelOptions& p)
      : Optimizer(c, p, c.momentum > 0.0f ? 1 : 0) {}

 private:
  void Step(State& state, float* w, const float* g, std::size_t n) override {
    const OptimizerConfig& c = config();
    const float lr = LearningRate(state);
    if (c.momentum == 0.0f) {  // MXNet's NAG without momentum is SGD
      const float decay = 1.0f - lr * c.weight_decay;
      const float lr_rescale = lr * c.rescale_grad;
      ParallelFor(n, parallel(), [=, &c](std::size_t b, std::size_t e) {
        if (c.clip_gradient >= 0.0f) {
          SgdKernel<true>(w + b, g + b, e - b, decay, lr, c.rescale_grad, lr_rescale,
                          c.clip_gradient);
        } else {
          SgdKernel<false>(w + b, g + b, e - b, decay, lr, c.rescale_grad, lr_rescale,
                           c.clip_gradient);
        }
      });
      return;
    }
    float* mom = state.buffers[0].get();
    ParallelFor(n, parallel(), [=, &c](std::size_t b, std::size_t e) {
      if (c.clip_gradient >= 0.0f) {
        NagKernel<true>(w + b, g + b, mom + b, e - b, c.momentum, lr, c.weight_decay,
                        c.rescale_grad, c.clip_gradient);
      } else {
        NagKernel<false>(w + b, g + b, mom + b, e - b, c.momentum, lr, c.weight_decay,
                         c.rescale_grad, c.clip_gradient);
      }
    });
  }
};

class RmspropOptimizer final : public Optimizer {
 public:
  RmspropOptimizer(const OptimizerConfig& c, const ParallelOptions& p) : Optimizer(c, p, 1) {}

 private:
  void Step(State& state, float* w, const float* g, std::size_t n) override {
    const OptimizerConfig& c = config();
    const float lr = LearningRate(state);
    float* sq = state.buffers[0].get();
    const float one_minus_rho = 1.0f - c.rho;
    ParallelFor(n, parallel(), [=, &c](std::size_t b, std::size_t e) {
      if (c.clip_gradient >= 0.0f) {
        RmspropKernel<true>(w + b, g + b, sq + b, e - b, lr, c.weight_decay, c.rescale_grad,
                            c.clip_gradient, c.rho, one_minus_rho, c.epsilon);
      } else {
        RmspropKernel<false>(w + b, g + b, sq + b, e - b, lr, c.weight_decay, c.rescale_grad,
                             c.clip_gradient, c.rho, one_minus_rho, c.epsilon);
      }
    });
  }
};

class AdamOptimizer final : public Optimizer {
 public:
  AdamOptimizer(const OptimizerConfig& c, const ParallelOptions& p) : Optimizer(c, p, 2) {}

 private:
  void Step(State& state, float* w, const float* g, std::size_t n) override {
    const OptimizerConfig& c = config();
    // Bias correction folded into the rate, as MXNet's Python Adam does (in double, then
    // rounded once): lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t), t = this state's count.
    const double t = static_cast<double>(state.count);
    const double coef1 = 1.0 - std::pow(static_cast<double>(c.beta1), t);
    const double coef2 = 1.0 - std::pow(static_cast<double>(c.beta2), t);
    const float lr_t = static_cast<float>(LearningRate(state) * std::sqrt(coef2) / coef1);
    const float wd = c.weight_decay;
    const float rescale = c.rescale_grad;
    const float clip = c.clip_gradient;
    const float b1 = c.beta1;
    const float b2 = c.beta2;
    const float omb1 = 1.0f - b1;
    const float omb2 = 1.0f - b2;
    const float eps = c.epsilon;
    float* mean = state.buffers[0].get();
    float* var = state.buffers[1].get();
    ParallelFor(n, parallel(), [=](std::size_t b, std::size_t e) {
      if (clip >= 0.0f) {
        AdamKernel<true>(w + b, g + b, mean + b, var + b, e - b, lr_t, wd, rescale, clip, b1, b2,
                         omb1, omb2, eps);
      } else {
        AdamKernel<false>(w + b, g + b, mean + b, var + b, e - b, lr_t, wd, rescale, clip, b1, b2,
                          omb1, omb2, eps);
      }
    });
  }
};

class AdagradOptimizer final : public Optimizer {
 public:
  AdagradOptimizer(const OptimizerConfig& c, const ParallelOptions& p) : Optimizer(c, p, 1) {}

 private:
  void Step(State& state, float* w, const float* g, std::size_t n) override {
    const OptimizerConfig& c = config();
    const float lr = LearningRate(state);
    const float wd = c.weight_decay;
    const float rescale = c.rescale_grad;
    const float clip = c.clip_gradient;
    const float eps = c.epsilon;
    float* hist = state.buffers[0].get();
    ParallelFor(n, parallel(), [=](std::size_t b, std::size_t e) {
      if (clip >= 0.0f) {
        AdagradKernel<true>(w + b, g + b, hist + b, e - b, lr, wd, rescale, clip, eps);
      } else {
        AdagradKernel<false>(w + b, g + b, hist + b, e - b, lr, wd, rescale, clip, eps);
      }
    });
  }
};

std::string FieldError(const char* field, float value, const char* rule) {
  std::ostringstream os;
  os << "optimizer config: " << field << " = " << value << " is invalid: " << rule;
  return os.str();
}

}  // namespace

void AddInto(float* acc, const float* src, std::size_t n, const ParallelOptions& options) {
  AddInto(DType::kFloat32, acc, src, n, options);
}

bool IsSummableDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kInt32 ||
         dtype == DType::kInt64;
}

void AddInto(DType dtype, void* acc, const void* src, std::size_t n,
             const ParallelOptions& options) {
  if (!IsSummableDType(dtype)) {
    throw Error("AddInto: dtype " + DTypeName(dtype) +
                " cannot be summed (supported: float32, float64, int32, int64)");
  }
  const std::size_t bytes = n * DTypeSize(dtype);
  if (n != 0 && (acc == nullptr || src == nullptr)) throw Error("AddInto: null buffer");
  if (Overlap(acc, bytes, src, bytes)) throw Error("AddInto: accumulator and source overlap");
  auto run = [&](auto* a, const auto* s) {
    ParallelFor(n, options,
                [a, s](std::size_t b, std::size_t e) { AddKernel(a + b, s + b, e - b); });
  };
  switch (dtype) {
    case DType::kFloat32:
      run(static_cast<float*>(acc), static_cast<const float*>(src));
      break;
    case DType::kFloat64:
      run(static_cast<double*>(acc), static_cast<const double*>(src));
      break;
    case DType::kInt32:
      run(static_cast<std::int32_t*>(acc), static_cast<const std::int32_t*>(src));
      break;
    case DType::kInt64:
      run(static_cast<std::int64_t*>(acc), static_cast<const std::int64_t*>(src));
      break;
    default:
      break;  // rejected above
  }
}

void CopyInto(void* dst, const void* src, std::size_t bytes, const ParallelOptions& options) {
  if (bytes == 0) return;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // Split in 4-byte units so the threshold means the same as for float arrays.
  ParallelOptions byte_options = options;
  byte_options.min_parallel_elements = options.min_parallel_elements * sizeof(float);
  ParallelFor(bytes, byte_options,
              [d, s](std::size_t b, std::size_t e) { std::memcpy(d + b, s + b, e - b); });
}

// ---- config validation and factory ----

float LearningRateAt(const OptimizerConfig& config, std::uint64_t num_update) {
  const LRSchedule& s = config.schedule;
  const float base = config.learning_rate;
  const auto t = static_cast<double>(num_update);
  if (num_update < s.warmup_steps) {
    return static_cast<float>(s.warmup_begin_lr +
                              (base - s.warmup_begin_lr) * t / static_cast<double>(s.warmup_steps));
  }
  if (s.type == "factor") {
    const auto drops = static_cast<double>((num_update - 1) / s.step);
    return std::max(static_cast<float>(base * std::pow(static_cast<double>(s.factor), drops)),
                    s.stop_factor_lr);
  }
  if (s.type == "multifactor") {
    const auto drops = std::count_if(s.steps.begin(), s.steps.end(),
                                     [&](std::uint64_t at) { return at < num_update; });
    return static_cast<float>(base *
                              std::pow(static_cast<double>(s.factor), static_cast<double>(drops)));
  }
  if (s.type == "cosine") {
    if (num_update >= s.max_update) return s.final_lr;
    const double progress = (t - static_cast<double>(s.warmup_steps)) /
                            static_cast<double>(s.max_update - s.warmup_steps);
    return static_cast<float>(s.final_lr + (base - s.final_lr) *
                                               (1.0 + std::cos(std::numbers::pi * progress)) / 2.0);
  }
  return base;
}

float Optimizer::LearningRate(const State& state) const {
  return LearningRateAt(config_, state.count);
}

namespace {

void ValidateSchedule(const LRSchedule& s, float learning_rate) {
  const auto bad = [](const std::string& field, const std::string& why) {
    return Error("optimizer config: schedule." + field + " " + why);
  };
  if (!s.type.empty() && s.type != "factor" && s.type != "multifactor" && s.type != "cosine") {
    throw bad("type", "= '" + s.type +
                          "' is unknown: accepted are factor, multifactor, cosine "
                          "(or empty for a constant rate)");
  }
  if ((s.type == "factor" || s.type == "multifactor") && !(s.factor > 0.0f && s.factor <= 1.0f)) {
    throw bad("factor", "= " + std::to_string(s.factor) + " must be in (0, 1]");
  }
  if (s.type == "factor" && s.step == 0) throw bad("step", "must be >= 1 update");
  if (s.type == "factor" && !(std::isfinite(s.stop_factor_lr) && s.stop_factor_lr >= 0.0f)) {
    throw bad("stop_factor_lr", "must be finite and >= 0");
  }
  if (s.type == "multifactor") {
    if (s.steps.empty()) throw bad("steps", "must list at least one update count");
    for (std::size_t i = 1; i < s.steps.size(); ++i) {
      if (s.steps[i] <= s.steps[i - 1]) throw bad("steps", "must be increasing");
    }
  }
  if (s.type == "cosine") {
    if (s.max_update <= s.warmup_steps) {
      throw bad("max_update", "(" + std::to_string(s.max_update) +
                                  ") must be larger than warmup_steps (" +
                                  std::to_string(s.warmup_steps) + ")");
    }
    if (!(std::isfinite(s.final_lr) && s.final_lr >= 0.0f && s.final_lr <= learning_rate)) {
      throw bad("final_lr", "must be in [0, learning_rate]");
    }
  }
  if (!(std::isfinite(s.warmup_begin_lr) && s.warmup_begin_lr >= 0.0f)) {
    throw bad("warmup_begin_lr", "must be finite and >= 0");
  }
}

}  // namespace

void ValidateOptimizerConfig(const OptimizerConfig& c) {
  if (c.name != "sgd" && c.name != "nag" && c.name != "adam" && c.name != "adagrad" &&
      c.name != "rmsprop") {
    throw Error("optimizer config: name = '" + c.name +
                "' is unknown: accepted names are sgd, nag, adam, adagrad, rmsprop");
  }
  ValidateSchedule(c.schedule, c.learning_rate);
  auto unit = [](float v) { return v >= 0.0f && v < 1.0f; };  // false for NaN
  if (!std::isfinite(c.learning_rate) || c.learning_rate < 0.0f) {
    throw Error(FieldError("learning_rate", c.learning_rate, "must be finite and >= 0"));
  }
  if (!unit(c.momentum)) {
    throw Error(FieldError("momentum", c.momentum, "must be in [0, 1)"));
  }
  if (!std::isfinite(c.weight_decay) || c.weight_decay < 0.0f) {
    throw Error(FieldError("weight_decay", c.weight_decay, "must be finite and >= 0"));
  }
  if (!std::isfinite(c.rescale_grad) || c.rescale_grad <= 0.0f) {
    throw Error(FieldError("rescale_grad", c.rescale_grad, "must be finite and > 0"));
  }
  if (std::isnan(c.clip_gradient)) {
    throw Error(
        FieldError("clip_gradient", c.clip_gradient, "must be a number (< 0 turns clipping off)"));
  }
  if (!unit(c.beta1)) throw Error(FieldError("beta1", c.beta1, "must be in [0, 1)"));
  if (!unit(c.beta2)) throw Error(FieldError("beta2", c.beta2, "must be in [0, 1)"));
  if (!std::isfinite(c.epsilon) || c.epsilon <= 0.0f) {
    throw Error(FieldError("epsilon", c.epsilon, "must be finite and > 0"));
  }
  if (!unit(c.rho)) throw Error(FieldError("rho", c.rho, "must be in [0, 1)"));
}

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                         const ParallelOptions& parallel) {
  ValidateOptimizerConfig(config);
  if (config.name == "sgd") return std::make_unique<SgdOptimizer>(config, parallel);
  if (config.name == "nag") return std::make_unique<NagOptimizer>(config, parallel);
  if (config.name == "adam") return std::make_unique<AdamOptimizer>(config, parallel);
  if (config.name == "rmsprop") return std::make_unique<RmspropOptimizer>(config, parallel);
  return std::make_unique<AdagradOptimizer>(config, parallel);
}

// ---- Optimizer base ----

Optimizer::Optimizer(const OptimizerConfig& config, const ParallelOptions& parallel,
                     int num_buffers)
    : config_(config), parallel_(parallel), num_buffers_(num_buffers) {}

Optimizer::Slot& Optimizer::SlotFor(std::uint64_t state_id) {
  MutexLock lock(map_mu_);
  auto& slot = slots_[state_id];
  if (!slot) slot = std::make_unique<Slot>();
  return *slot;
}

void Optimizer::Update(std::uint64_t state_id, float* weight, const float* grad, std::size_t n) {
  if (n != 0 && (weight == nullptr || grad == nullptr)) {
    throw Error("optimizer: state " + std::to_string(state_id) + ": null weight or gradient");
  }
  if (Overlap(weight, n * sizeof(float), grad, n * sizeof(float))) {
    throw Error("optimizer: state " + std::to_string(state_id) +
                ": weight and gradient buffers overlap");
  }
  Slot& slot = SlotFor(state_id);
  // The per-state lock serializes updates of one id; other ids proceed in parallel.
  MutexLock lock(slot.mu);
  State& state = slot.state;
  if (!slot.created) {
    for (int i = 0; i < num_buffers_; ++i) state.buffers[i] = std::make_unique<float[]>(n);
    state.length = n;
    slot.created = true;
  } else if (state.length != n) {
    throw Error("optimizer: state " + std::to_string(state_id) + ": length mismatch: expected " +
                std::to_string(state.length) +
                " elements (the length of its first update), given " + std::to_string(n));
  }
  ++state.count;
  Step(state, weight, grad, n);
}

void Optimizer::Update(std::uint64_t state_id, const Tensor& weight, const Tensor& grad) {
  const std::string where = "optimizer: state " + std::to_string(state_id) + ": ";
  if (weight.dtype() != DType::kFloat32 || grad.dtype() != DType::kFloat32) {
    throw Error(where + "optimizer supports float32 only, given weight " +
                DTypeName(weight.dtype()) + " and gradient " + DTypeName(grad.dtype()));
  }
  if (weight.device().is_cuda() || grad.device().is_cuda()) {
    throw Error(where + "optimizer runs on CPU memory only, given weight on " +
                weight.device().ToString() + " and gradient on " + grad.device().ToString());
  }
  if (weight.size() != grad.size()) {
    throw Error(where + "size mismatch: weight has " + std::to_string(weight.size()) +
                " elements, gradient " + std::to_string(grad.size()));
  }
  Update(state_id, static_cast<float*>(weight.data()), static_cast<const float*>(grad.data()),
         weight.size());
}

std::uint64_t Optimizer::UpdateCount(std::uint64_t state_id) const {
  const Slot* slot = nullptr;
  {
    MutexLock lock(map_mu_);
    auto it = slots_.find(state_id);
    if (it == slots_.end()) return 0;
    slot = it->second.get();
  }
  MutexLock lock(slot->mu);
  return slot->state.count;
}

std::optional<Optimizer::SavedState> Optimizer::ExportState(std::uint64_t state_id) const {
  const Slot* slot = nullptr;
  {
    MutexLock lock(map_mu_);
    auto it = slots_.find(state_id);
    if (it == slots_.end()) return std::nullopt;
    slot = it->second.get();
  }
  MutexLock lock(slot->mu);
  if (!slot->created) return std::nullopt;
  const State& state = slot->state;
  SavedState saved{state.length, state.count, {}};
  saved.buffers.reserve(static_cast<std::size_t>(num_buffers_) * state.length);
  for (int b = 0; b < num_buffers_; ++b) {
    saved.buffers.insert(saved.buffers.end(), state.buffers[b].get(),
                         state.buffers[b].get() + state.length);
  }
  return saved;
}

void Optimizer::ImportState(std::uint64_t state_id, const SavedState& saved) {
  if (saved.buffers.size() != static_cast<std::size_t>(num_buffers_) * saved.length) {
    throw Error("optimizer: state " + std::to_string(state_id) + ": " + config_.name + " keeps " +
                std::to_string(num_buffers_) + " buffer(s) of " + std::to_string(saved.length) +
                " elements, the saved state has " + std::to_string(saved.buffers.size()) +
                " values (saved with other settings, "
                "e.g. SGD with momentum against SGD without?)");
  }
  Slot& slot = SlotFor(state_id);
  MutexLock lock(slot.mu);
  State& state = slot.state;
  state.length = saved.length;
  state.count = saved.count;
  for (int b = 0; b < num_buffers_; ++b) {
    state.buffers[b] = std::make_unique<float[]>(saved.length);
    std::copy_n(saved.buffers.data() + static_cast<std::size_t>(b) * saved.length, saved.length,
                state.buffers[b].get());
  }
  slot.created = true;
}

std::size_t Optimizer::NumStates() const {
  MutexLock lock(map_mu_);
  return slots_.size();
}

}  // namespace ps
