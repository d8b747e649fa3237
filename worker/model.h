#pragma once
// A feed-forward classifier: a chain of layers plus a softmax cross-entropy head, on one backend.
//
// The model owns its layers (and through them the parameters), the activations of every layer
// and their gradients, sized for up to max_batch samples. Parameters are exposed as a flat list
// of named buffers, params()[i] being KVStore key i.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/backend.h"
#include "worker/layers.h"

namespace ps::worker {

// Called during Backward for each layer that has parameters, in reverse layer order, as soon as
// that layer's backward has been issued on the backend. Its gradients are final once those
// calls have run: the backend's own calls made in the hook (a copy to the host) come after
// them, and a StreamMark recorded in the hook tells the host when (Backward never waits for the
// device, so the GPU goes on with the layers before while the hook's layer is sent).
// layer_index counts parametric layers from the input (0 = first layer), so a natural KVStore
// priority is -layer_index: the first layer's weights, needed first by the next forward pass,
// go out last but are served first.
using GradReadyHook = std::function<void(int layer_index, const std::vector<Param*>& params)>;

// Called during Forward for each layer that has parameters, in layer order, before that layer's
// forward is issued: the hook puts the layer's weights in place (waits for their pull and
// queues their copy to the device), while the layers before it already run.
using WeightsNeededHook = std::function<void(int layer_index, const std::vector<Param*>& params)>;

struct BatchStats {
  double loss_sum = 0.0;  // summed cross-entropy over the batch
  int correct = 0;
  int samples = 0;
  double mean_loss() const { return samples > 0 ? loss_sum / samples : 0.0; }
  double accuracy() const { return samples > 0 ? static_cast<double>(correct) / samples : 0.0; }
  BatchStats& operator+=(const BatchStats& o) {
    loss_sum += o.loss_sum;
    correct += o.correct;
    samples += o.samples;
    return *this;
  }
};

class Model {
 public:
  Model(Backend& backend, std::string name, Shape3 input, int num_classes, int max_batch);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Builder: appends a layer whose input shape is output_shape() of the model so far.
  template <typename L, typename... Args>
  L& Add(std::string layer_name, Args&&... args) {
    auto layer = std::make_unique<L>(backend_, std::move(layer_name), output_shape(),
                                     std::forward<Args>(args)...);
    L& ref = *layer;
    Append(std::move(layer));
    return ref;
  }
  // Completes the model: checks the last layer yields num_classes, allocates activations and
  // gradients for max_batch samples and numbers the parameters. Call once, after the last Add.
  void Finalize();

  const std::string& name() const { return name_; }
  Backend& backend() { return backend_; }
  Shape3 input_shape() const { return input_; }
  Shape3 output_shape() const;
  int num_classes() const { return loss_.classes(); }
  int max_batch() const { return max_batch_; }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  // Parameters in forward order (weight, bias of each parametric layer): KVStore key = index.
  const std::vector<Param*>& params() const { return params_; }
  int num_param_layers() const { return num_param_layers_; }
  std::size_t num_weights() const;

  // Deterministic initialization from seed (He/Xavier uniform weights, zero biases).
  void InitParams(std::uint64_t seed);

  // Copies a host batch (batch <= max_batch) into device memory for the next Forward.
  void LoadBatch(const float* images, const std::int32_t* labels, int batch);
  // Forward pass and loss over the loaded batch; `weights`, when set, runs per parametric layer
  // before it.
  BatchStats Forward(const WeightsNeededHook& weights = {});
  // Backward pass over the loaded batch (after Forward), for the mean loss over the batch. Every
  // parameter's grad is overwritten; `hook`, when set, runs per parametric layer as it finishes.
  void Backward(const GradReadyHook& hook = {});
  // LoadBatch + Forward + Backward; the loss is waited for only after the backward pass is
  // issued.
  BatchStats TrainStep(const float* images, const std::int32_t* labels, int batch,
                       const GradReadyHook& hook = {}, const WeightsNeededHook& weights = {});
  // LoadBatch + Forward, no gradients.
  BatchStats Evaluate(const float* images, const std::int32_t* labels, int batch);

  // The last Forward's logits, [batch, num_classes], on the host (for tests).
  std::vector<float> LogitsToHost() const;

 private:
  void Append(std::unique_ptr<Layer> layer);
  // Forward through the layers (not the loss); returns the logits.
  const float* ForwardLayers(const WeightsNeededHook& weights);

  Backend& backend_;  // not owned; outlives the model
  std::string name_;
  Shape3 input_;
  int max_batch_;
  int batch_ = 0;  // samples in the loaded batch
  bool finalized_ = false;
  std::vector<std::unique_ptr<Layer>> layers_;
  SoftmaxCrossEntropy loss_;
  std::vector<Param*> params_;  // into layers_
  int num_param_layers_ = 0;
  std::vector<int> param_layer_of_;  // per layer: its parametric index, or -1
  DeviceArray<float> input_data_;
  DeviceArray<std::int32_t> labels_;
  std::vector<DeviceArray<float>> outputs_;       // outputs_[i]: output of layer i
  std::vector<DeviceArray<float>> output_grads_;  // output_grads_[i]: dL/d(output of layer i)
};

inline constexpr const char* kModelNames = "mlp or cnn";

// "mlp": 784-256-128-10 with ReLU. "cnn": conv5x5(32, pad 2)-ReLU-maxpool2, conv5x5(64, pad 2)-
// ReLU-maxpool2, dense 128-ReLU, dense 10. Both for 1x28x28 inputs and 10 classes. Throws
// ConfigError for an unknown name. Parameters are allocated but not initialized (call InitParams or
// pull them).
std::unique_ptr<Model> BuildModel(const std::string& name, Backend& backend, int max_batch,
                                  Shape3 input = {1, 28, 28}, int num_classes = 10);

}  // namespace ps::worker
