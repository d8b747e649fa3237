// Optimizer kernels and element-wise helpers. Built with -O3 -fno-math-errno -ffp-contract=off
// (see kvstore/CMakeLists.txt): the loops below are plain contiguous loops over __restrict
// pointers that the compiler vectorizes; no errno lets sqrt vectorize, and no FMA contraction
// keeps results identical across machines and between vector body and scalar tail.
#include "optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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
    const float lr = c.learning_rate;
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
    const float lr_t = static_cast<float>(c.learning_rate * std::sqrt(coef2) / coef1);
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
    const float lr = c.learning_rate;
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

void ValidateOptimizerConfig(const OptimizerConfig& c) {
  if (c.name != "sgd" && c.name != "adam" && c.name != "adagrad") {
    throw Error("optimizer config: name = '" + c.name +
                "' is unknown: accepted names are sgd, adam, adagrad");
  }
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
}

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                         const ParallelOptions& parallel) {
  ValidateOptimizerConfig(config);
  if (config.name == "sgd") return std::make_unique<SgdOptimizer>(config, parallel);
  if (config.name == "adam") return std::make_unique<AdamOptimizer>(config, parallel);
  return std::make_unique<AdagradOptimizer>(config, parallel);
}

// ---- Optimizer base ----

Optimizer::Optimizer(const OptimizerConfig& config, const ParallelOptions& parallel,
                     int num_buffers)
    : config_(config), parallel_(parallel), num_buffers_(num_buffers) {}

Optimizer::Slot& Optimizer::SlotFor(std::uint64_t state_id) {
  std::lock_guard lock(map_mu_);
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
  std::lock_guard lock(slot.mu);
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
    std::lock_guard lock(map_mu_);
    auto it = slots_.find(state_id);
    if (it == slots_.end()) return 0;
    slot = it->second.get();
  }
  std::lock_guard lock(slot->mu);
  return slot->state.count;
}

std::size_t Optimizer::NumStates() const {
  std::lock_guard lock(map_mu_);
  return slots_.size();
}

}  // namespace ps
