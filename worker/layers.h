#pragma once
// Layers of the worker's models, written once against Backend. Activations are [batch, C, H, W]
// (a dense layer's [batch, features] is the same memory as C = features, H = W = 1).
//
// Each layer owns its parameters (weights and biases as named flat float buffers in device
// memory, with a gradient buffer of the same size) and any workspace; the model owns the
// activations and their gradients and passes them in.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/backend.h"

namespace ps::worker {

// The shape of one sample.
struct Shape3 {
  int channels = 1;
  int height = 1;
  int width = 1;
  std::size_t size() const { return static_cast<std::size_t>(channels) * height * width; }
  friend bool operator==(const Shape3&, const Shape3&) = default;
};

enum class InitKind {
  kZero,           // biases
  kHeUniform,      // U(-sqrt(6/fan_in), +): layers followed by ReLU
  kXavierUniform,  // U(-sqrt(6/(fan_in+fan_out)), +): the classifier layer
};

// A learnable tensor: its value and gradient live in the backend's memory. One KVStore key each.
struct Param {
  std::string name;        // e.g. "conv0.weight"; unique within a model
  std::vector<int> shape;  // e.g. {out, in} for a dense weight (MXNet's FullyConnected layout)
  InitKind init = InitKind::kZero;
  int fan_in = 0;
  int fan_out = 0;
  int layer = -1;  // index of the owning layer among the model's parametric layers
  int index = -1;  // position in Model::params(), which is also its KVStore key
  DeviceArray<float> value;
  DeviceArray<float> grad;

  Param(Backend& backend, std::string param_name, std::vector<int> param_shape, InitKind kind,
        int in, int out);
  std::size_t size() const { return value.size(); }
};

class Layer {
 public:
  Layer(Backend& backend, std::string name, Shape3 input)
      : backend_(backend), name_(std::move(name)), input_(input) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  Shape3 input_shape() const { return input_; }
  virtual Shape3 output_shape() const = 0;

  // Prepares workspace for batches of up to max_batch samples (called before Forward).
  virtual void Reserve(int /*max_batch*/) {}
  // y = f(x) for `batch` samples.
  virtual void Forward(const float* x, float* y, int batch) = 0;
  // Given dy = dL/dy (and the forward's x and y), writes the parameter gradients (overwriting
  // them: one batch's gradient) and, when dx is not null, dx = dL/dx.
  virtual void Backward(const float* x, const float* y, const float* dy, float* dx, int batch) = 0;
  // The layer's parameters in a fixed order (weight, then bias); empty for parameter-free layers.
  virtual std::vector<Param*> params() { return {}; }

 protected:
  Backend& backend_;  // not owned; outlives the layer

 private:
  std::string name_;
  Shape3 input_;
};

// y = x W^T + b; W is [units, in_features].
class Dense final : public Layer {
 public:
  Dense(Backend& backend, std::string name, Shape3 input, int units, InitKind init);
  Shape3 output_shape() const override { return {units_, 1, 1}; }
  void Forward(const float* x, float* y, int batch) override;
  void Backward(const float* x, const float* y, const float* dy, float* dx, int batch) override;
  std::vector<Param*> params() override { return {&weight_, &bias_}; }

 private:
  int in_features_;
  int units_;
  Param weight_;
  Param bias_;
};

class Relu final : public Layer {
 public:
  Relu(Backend& backend, std::string name, Shape3 input) : Layer(backend, std::move(name), input) {}
  Shape3 output_shape() const override { return input_shape(); }
  void Forward(const float* x, float* y, int batch) override;
  void Backward(const float* x, const float* y, const float* dy, float* dx, int batch) override;
};

// 2-D convolution (cross-correlation, as in every framework) by im2col + GEMM over a chunk of
// images at once: one GEMM per chunk rather than one per image, which on a GPU is what keeps
// the chip busy. A chunk is as many images as the workspace cap holds (at least one): on a GPU
// the whole batch, on a CPU what stays in the caches. W is [filters, in_channels, k, k].
class Conv2d final : public Layer {
 public:
  // max_workspace_floats caps each im2col buffer; 0: the backend's ConvWorkspaceFloats() (tests
  // give a small cap to get several chunks).
  Conv2d(Backend& backend, std::string name, Shape3 input, int filters, int kernel, int pad,
         int stride, InitKind init, std::size_t max_workspace_floats = 0);
  Shape3 output_shape() const override;
  void Reserve(int max_batch) override;
  void Forward(const float* x, float* y, int batch) override;
  void Backward(const float* x, const float* y, const float* dy, float* dx, int batch) override;
  std::vector<Param*> params() override { return {&weight_, &bias_}; }
  const ConvGeometry& geometry() const { return geometry_; }

 private:
  int filters_;
  ConvGeometry geometry_;
  Param weight_;
  Param bias_;
  std::size_t max_workspace_floats_;
  int chunk_ = 0;            // images per GEMM (set by Reserve)
  DeviceArray<float> col_;   // a chunk's im2col matrix [rows, chunk, cols]
  DeviceArray<float> dcol_;  // its gradient (made by the first Backward that needs dx)
  DeviceArray<float> swap_;  // a chunk's output (gradient) as [filters, chunk, cols]
};

enum class PoolKind { kMax, kAvg };

// Non-overlapping window x window pooling (stride = window).
class Pool2d final : public Layer {
 public:
  Pool2d(Backend& backend, std::string name, Shape3 input, PoolKind kind, int window);
  Shape3 output_shape() const override;
  void Forward(const float* x, float* y, int batch) override;
  void Backward(const float* x, const float* y, const float* dy, float* dx, int batch) override;

 private:
  PoolKind kind_;
  PoolGeometry geometry_;
};

// The loss head: softmax over classes, then mean cross-entropy against integer labels.
// Keeps the probabilities of the last Forward for Backward.
class SoftmaxCrossEntropy {
 public:
  SoftmaxCrossEntropy(Backend& backend, int classes) : backend_(backend), classes_(classes) {}
  int classes() const { return classes_; }
  void Reserve(int max_batch);
  SoftmaxStats Forward(const float* logits, const std::int32_t* labels, int batch);
  // Forward without waiting for the statistics: TakeStats returns them (Backend's
  // QueueSoftmaxCrossEntropyForward). The probabilities are in place for Backward either way.
  void QueueForward(const float* logits, const std::int32_t* labels, int batch);
  SoftmaxStats TakeStats();
  // dlogits = scale * (softmax - onehot); scale = 1/batch gives the mean loss's gradient.
  void Backward(const std::int32_t* labels, float* dlogits, int batch, float scale);
  const DeviceArray<float>& probs() const { return probs_; }

 private:
  Backend& backend_;  // not owned
  int classes_;
  DeviceArray<float> probs_;
};

}  // namespace ps::worker
