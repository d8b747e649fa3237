#include "worker/layers.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "worker/errors.h"

namespace ps::worker {
namespace {

std::size_t Product(const std::vector<int>& shape) {
  std::size_t n = 1;
  for (int d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

}  // namespace

Param::Param(Backend& backend, std::string param_name, std::vector<int> param_shape, InitKind kind,
             int in, int out)
    : name(std::move(param_name)),
      shape(std::move(param_shape)),
      init(kind),
      fan_in(in),
      fan_out(out),
      value(backend, Product(shape)),
      grad(backend, Product(shape)) {}

// ---- Dense ----

Dense::Dense(Backend& backend, std::string name, Shape3 input, int units, InitKind init)
    : Layer(backend, std::move(name), input),
      in_features_(static_cast<int>(input.size())),
      units_(units),
      weight_(backend, this->name() + ".weight", {units, in_features_}, init, in_features_, units),
      bias_(backend, this->name() + ".bias", {units}, InitKind::kZero, in_features_, units) {
  if (units < 1) throw ConfigError("dense layer " + this->name() + ": units must be >= 1");
}

void Dense::Forward(const float* x, float* y, int batch) {
  // y[batch, units] = x[batch, in] * W^T[in, units]
  backend_.Gemm(false, true, batch, units_, in_features_, 1.0f, x, in_features_,
                weight_.value.data(), in_features_, 0.0f, y, units_);
  backend_.AddBias(y, bias_.value.data(), batch, units_, 1);
}

void Dense::Backward(const float* x, const float* /*y*/, const float* dy, float* dx, int batch) {
  // dW[units, in] = dy^T[units, batch] * x[batch, in]
  backend_.Gemm(true, false, units_, in_features_, batch, 1.0f, dy, units_, x, in_features_, 0.0f,
                weight_.grad.data(), in_features_);
  backend_.BiasGrad(dy, bias_.grad.data(), batch, units_, 1);
  if (dx != nullptr) {
    // dx[batch, in] = dy[batch, units] * W[units, in]
    backend_.Gemm(false, false, batch, in_features_, units_, 1.0f, dy, units_, weight_.value.data(),
                  in_features_, 0.0f, dx, in_features_);
  }
}

// ---- Relu ----

void Relu::Forward(const float* x, float* y, int batch) {
  backend_.ReluForward(x, y, static_cast<std::size_t>(batch) * input_shape().size());
}

void Relu::Backward(const float* /*x*/, const float* y, const float* dy, float* dx, int batch) {
  if (dx != nullptr) {
    backend_.ReluBackward(y, dy, dx, static_cast<std::size_t>(batch) * input_shape().size());
  }
}

// ---- Conv2d ----

Conv2d::Conv2d(Backend& backend, std::string name, Shape3 input, int filters, int kernel, int pad,
               int stride, InitKind init, std::size_t max_workspace_floats)
    : Layer(backend, std::move(name), input),
      filters_(filters),
      geometry_{input.channels, input.height, input.width, kernel, kernel, pad, pad,
                stride,         stride},
      weight_(backend, this->name() + ".weight", {filters, input.channels, kernel, kernel}, init,
              input.channels * kernel * kernel, filters * kernel * kernel),
      bias_(backend, this->name() + ".bias", {filters}, InitKind::kZero,
            input.channels * kernel * kernel, filters * kernel * kernel),
      max_workspace_floats_(max_workspace_floats) {
  if (filters < 1 || kernel < 1 || pad < 0 || stride < 1 || geometry_.out_height() < 1 ||
      geometry_.out_width() < 1) {
    throw ConfigError("conv layer " + this->name() + ": invalid geometry");
  }
}

Shape3 Conv2d::output_shape() const {
  return {filters_, geometry_.out_height(), geometry_.out_width()};
}

void Conv2d::Reserve(int max_batch) {
  const auto image_col = static_cast<std::size_t>(geometry_.col_rows()) * geometry_.col_cols();
  // As many images per GEMM as the workspace cap allows, at least one.
  const std::size_t cap =
      max_workspace_floats_ > 0 ? max_workspace_floats_ : backend_.ConvWorkspaceFloats();
  const std::size_t fit = std::max<std::size_t>(1, cap / image_col);
  chunk_ = static_cast<int>(std::min<std::size_t>(fit, static_cast<std::size_t>(max_batch)));
  const std::size_t col_size = image_col * chunk_;
  if (col_.size() < col_size) col_ = DeviceArray<float>(backend_, col_size);
  // One image's product is already in the activations' layout: no swap buffer.
  const std::size_t swap_size =
      chunk_ > 1 ? static_cast<std::size_t>(filters_) * geometry_.col_cols() * chunk_ : 0;
  if (swap_.size() < swap_size) swap_ = DeviceArray<float>(backend_, swap_size);
}

void Conv2d::Forward(const float* x, float* y, int batch) {
  assert(chunk_ > 0 && "Reserve() before Forward()");
  const int rows = geometry_.col_rows();  // C*k*k
  const int cols = geometry_.col_cols();  // out_h*out_w
  const std::size_t in_size = input_shape().size();
  const std::size_t out_size = static_cast<std::size_t>(filters_) * cols;
  for (int first = 0; first < batch; first += chunk_) {
    const int n = std::min(chunk_, batch - first);
    float* y_chunk = y + first * out_size;
    backend_.Im2Col(x + first * in_size, col_.data(), n, geometry_);
    // out[filters, n*cols] = W[filters, rows] * col[rows, n*cols], then [n, filters, cols].
    backend_.Gemm(false, false, filters_, n * cols, rows, 1.0f, weight_.value.data(), rows,
                  col_.data(), n * cols, 0.0f, n == 1 ? y_chunk : swap_.data(), n * cols);
    if (n > 1) backend_.SwapLeadingAxes(swap_.data(), y_chunk, filters_, n, cols);
  }
  backend_.AddBias(y, bias_.value.data(), batch, filters_, cols);
}

void Conv2d::Backward(const float* x, const float* /*y*/, const float* dy, float* dx, int batch) {
  assert(chunk_ > 0 && "Reserve() before Backward()");
  const int rows = geometry_.col_rows();
  const int cols = geometry_.col_cols();
  const std::size_t in_size = input_shape().size();
  const std::size_t out_size = static_cast<std::size_t>(filters_) * cols;
  backend_.BiasGrad(dy, bias_.grad.data(), batch, filters_, cols);
  for (int first = 0; first < batch; first += chunk_) {
    const int n = std::min(chunk_, batch - first);
    // dy as [filters, n*cols], the layout the GEMMs below read (one image's already is).
    const float* dy_t = dy + first * out_size;
    if (n > 1) {
      backend_.SwapLeadingAxes(dy_t, swap_.data(), n, filters_, cols);
      dy_t = swap_.data();
    }
    // Recomputed rather than kept from Forward: a chunk of workspace instead of a batch.
    backend_.Im2Col(x + first * in_size, col_.data(), n, geometry_);
    // dW[filters, rows] (+)= dy[filters, n*cols] * col^T[n*cols, rows]
    backend_.Gemm(false, true, filters_, rows, n * cols, 1.0f, dy_t, n * cols, col_.data(),
                  n * cols, first == 0 ? 0.0f : 1.0f, weight_.grad.data(), rows);
    if (dx != nullptr) {
      // Made at the first use: a model's first layer never computes dx.
      if (dcol_.size() < col_.size()) dcol_ = DeviceArray<float>(backend_, col_.size());
      // dcol[rows, n*cols] = W^T[rows, filters] * dy[filters, n*cols]
      backend_.Gemm(true, false, rows, n * cols, filters_, 1.0f, weight_.value.data(), rows, dy_t,
                    n * cols, 0.0f, dcol_.data(), n * cols);
      backend_.Col2Im(dcol_.data(), dx + first * in_size, n, geometry_);
    }
  }
}

// ---- Pool2d ----

Pool2d::Pool2d(Backend& backend, std::string name, Shape3 input, PoolKind kind, int window)
    : Layer(backend, std::move(name), input),
      kind_(kind),
      geometry_{input.channels, input.height, input.width, window} {
  if (window < 1 || geometry_.out_height() < 1 || geometry_.out_width() < 1) {
    throw ConfigError("pool layer " + this->name() + ": invalid window");
  }
}

Shape3 Pool2d::output_shape() const {
  return {geometry_.channels, geometry_.out_height(), geometry_.out_width()};
}

void Pool2d::Forward(const float* x, float* y, int batch) {
  if (kind_ == PoolKind::kMax) {
    backend_.MaxPoolForward(x, y, batch, geometry_);
  } else {
    backend_.AvgPoolForward(x, y, batch, geometry_);
  }
}

void Pool2d::Backward(const float* x, const float* /*y*/, const float* dy, float* dx, int batch) {
  if (dx == nullptr) return;
  if (kind_ == PoolKind::kMax) {
    backend_.MaxPoolBackward(x, dy, dx, batch, geometry_);
  } else {
    backend_.AvgPoolBackward(dy, dx, batch, geometry_);
  }
}

// ---- SoftmaxCrossEntropy ----

void SoftmaxCrossEntropy::Reserve(int max_batch) {
  const auto size = static_cast<std::size_t>(max_batch) * classes_;
  if (probs_.size() < size) probs_ = DeviceArray<float>(backend_, size);
}

SoftmaxStats SoftmaxCrossEntropy::Forward(const float* logits, const std::int32_t* labels,
                                          int batch) {
  assert(probs_.size() >= static_cast<std::size_t>(batch) * classes_);
  return backend_.SoftmaxCrossEntropyForward(logits, labels, probs_.data(), batch, classes_);
}

void SoftmaxCrossEntropy::QueueForward(const float* logits, const std::int32_t* labels, int batch) {
  assert(probs_.size() >= static_cast<std::size_t>(batch) * classes_);
  backend_.QueueSoftmaxCrossEntropyForward(logits, labels, probs_.data(), batch, classes_);
}

SoftmaxStats SoftmaxCrossEntropy::TakeStats() { return backend_.TakeSoftmaxStats(); }

void SoftmaxCrossEntropy::Backward(const std::int32_t* labels, float* dlogits, int batch,
                                   float scale) {
  backend_.SoftmaxCrossEntropyBackward(probs_.data(), labels, dlogits, batch, classes_, scale);
}

}  // namespace ps::worker
