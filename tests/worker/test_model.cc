// Model construction, parameter naming, seeded initialization, the gradient-ready hook, device
// selection, and the backend-agreement harness run CPU against CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tests/worker/backend_agreement.h"
#include "tests/worker/forwarding_backend.h"
#include "tests/worker/test_util.h"
#include "worker/cpu_backend.h"
#include "worker/device.h"
#include "worker/errors.h"
#include "worker/init.h"
#include "worker/model.h"

namespace ps::worker {
namespace {

std::vector<std::string> ParamNames(const Model& m) {
  std::vector<std::string> names;
  for (const Param* p : m.params()) names.push_back(p->name);
  return names;
}

TEST_CASE("mlp has the 784-256-128-10 parameters", "[model]") {
  auto backend = MakeCpuBackend();
  auto mlp = BuildModel("mlp", *backend, 8);
  CHECK(ParamNames(*mlp) == std::vector<std::string>{"dense0.weight", "dense0.bias",
                                                     "dense1.weight", "dense1.bias",
                                                     "dense2.weight", "dense2.bias"});
  CHECK(mlp->params()[0]->shape == std::vector<int>{256, 784});
  CHECK(mlp->params()[2]->shape == std::vector<int>{128, 256});
  CHECK(mlp->params()[4]->shape == std::vector<int>{10, 128});
  CHECK(mlp->num_param_layers() == 3);
  CHECK(mlp->params()[5]->layer == 2);
  CHECK(mlp->num_weights() == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
}

TEST_CASE("cnn has two conv+pool stages and a hidden dense layer", "[model]") {
  auto backend = MakeCpuBackend();
  auto cnn = BuildModel("cnn", *backend, 4);
  CHECK(ParamNames(*cnn) == std::vector<std::string>{"conv0.weight", "conv0.bias", "conv1.weight",
                                                     "conv1.bias", "dense0.weight", "dense0.bias",
                                                     "dense1.weight", "dense1.bias"});
  CHECK(cnn->params()[0]->shape == std::vector<int>{32, 1, 5, 5});
  CHECK(cnn->params()[2]->shape == std::vector<int>{64, 32, 5, 5});
  CHECK(cnn->params()[4]->shape == std::vector<int>{128, 64 * 7 * 7});
  CHECK(cnn->params()[6]->shape == std::vector<int>{10, 128});
  CHECK(cnn->num_param_layers() == 4);
  CHECK(cnn->params()[7]->index == 7);
  CHECK(cnn->params()[7]->layer == 3);
}

TEST_CASE("unknown model names are a clear configuration error", "[model]") {
  auto backend = MakeCpuBackend();
  CHECK_THROWS_AS(BuildModel("resnet", *backend, 4), ConfigError);
  CHECK_THROWS_WITH(BuildModel("resnet", *backend, 4), "unknown --model 'resnet': use mlp or cnn");
}

TEST_CASE("initialization is deterministic from the seed and scaled by fan-in", "[model]") {
  auto backend = MakeCpuBackend();
  auto a = BuildModel("mlp", *backend, 2);
  auto b = BuildModel("mlp", *backend, 2);
  auto c = BuildModel("mlp", *backend, 2);
  a->InitParams(1);
  b->InitParams(1);
  c->InitParams(2);
  for (std::size_t i = 0; i < a->params().size(); ++i) {
    CHECK(a->params()[i]->value.ToHost() == b->params()[i]->value.ToHost());
  }
  CHECK(a->params()[0]->value.ToHost() != c->params()[0]->value.ToHost());
  // Two weights of one model draw different streams.
  CHECK(a->params()[0]->value.ToHost()[0] != a->params()[2]->value.ToHost()[0]);
  // He uniform for dense0: |w| <= sqrt(6/784); biases start at zero.
  const auto w = a->params()[0]->value.ToHost();
  const float limit = std::sqrt(6.0f / 784.0f);
  float max_abs = 0.0f;
  for (const float v : w) max_abs = std::max(max_abs, std::fabs(v));
  CHECK(max_abs <= limit);
  CHECK(max_abs > 0.9f * limit);
  for (const float v : a->params()[1]->value.ToHost()) CHECK(v == 0.0f);
}

TEST_CASE("gradient-ready hook runs per parametric layer in reverse order", "[model]") {
  auto backend = MakeCpuBackend();
  auto mlp = BuildModel("mlp", *backend, 4);
  mlp->InitParams(3);
  const auto images = testing::RandomVector(4 * 784, 1, 0.0f, 1.0f);
  const std::vector<std::int32_t> labels = {1, 2, 3, 4};
  // Poison the gradients so the hook can tell they were written before it ran.
  for (Param* p : mlp->params()) backend->Fill(p->grad.data(), p->size(), NAN);
  std::vector<int> order;
  mlp->TrainStep(images.data(), labels.data(), 4,
                 [&](int layer, const std::vector<Param*>& params) {
                   order.push_back(layer);
                   REQUIRE(params.size() == 2);
                   for (const Param* p : params) {
                     CHECK(p->layer == layer);
                     for (const float g : p->grad.ToHost()) REQUIRE(std::isfinite(g));
                   }
                 });
  CHECK(order == std::vector<int>{2, 1, 0});
}

// Records when the loss is queued and taken: a GPU must not wait for the loss before the host
// has issued the backward pass.
class LossOrderBackend final : public testing::ForwardingBackend {
 public:
  void QueueSoftmaxCrossEntropyForward(const float* logits, const std::int32_t* labels,
                                       float* probs, int batch, int classes) override {
    events.push_back("queue loss");
    ForwardingBackend::QueueSoftmaxCrossEntropyForward(logits, labels, probs, batch, classes);
  }
  SoftmaxStats TakeSoftmaxStats() override {
    events.push_back("take loss");
    return ForwardingBackend::TakeSoftmaxStats();
  }
  std::vector<std::string> events;
};

TEST_CASE("a training step takes its loss only after issuing the backward pass", "[model]") {
  LossOrderBackend backend;
  auto mlp = BuildModel("mlp", backend, 4);
  mlp->InitParams(3);
  const auto images = testing::RandomVector(4 * 784, 1, 0.0f, 1.0f);
  const std::vector<std::int32_t> labels = {1, 2, 3, 4};
  const BatchStats evaluated = mlp->Evaluate(images.data(), labels.data(), 4);
  backend.events.clear();
  const BatchStats trained =
      mlp->TrainStep(images.data(), labels.data(), 4, [&](int layer, const std::vector<Param*>&) {
        backend.events.push_back("gradients of layer " + std::to_string(layer));
      });
  CHECK(backend.events == std::vector<std::string>{"queue loss", "gradients of layer 2",
                                                   "gradients of layer 1", "gradients of layer 0",
                                                   "take loss"});
  // The same loss as a forward pass that waits for it (the weights did not change).
  CHECK(trained.loss_sum == evaluated.loss_sum);
  CHECK(trained.correct == evaluated.correct);
  CHECK(trained.samples == 4);
}

TEST_CASE("a partial batch evaluates and the batch limit is enforced", "[model]") {
  auto backend = MakeCpuBackend();
  auto mlp = BuildModel("mlp", *backend, 4);
  mlp->InitParams(3);
  const auto images = testing::RandomVector(5 * 784, 1, 0.0f, 1.0f);
  const std::vector<std::int32_t> labels = {1, 2, 3, 4, 5};
  const BatchStats s = mlp->Evaluate(images.data(), labels.data(), 3);
  CHECK(s.samples == 3);
  CHECK(std::isfinite(s.mean_loss()));
  CHECK(mlp->LogitsToHost().size() == 30);
  CHECK_THROWS_AS(mlp->Evaluate(images.data(), labels.data(), 5), ConfigError);
}

TEST_CASE("device selection: auto falls back to the CPU, cuda without a GPU is an error",
          "[device]") {
  CHECK(CreateBackend("cpu")->kind() == DeviceKind::kCPU);
  CHECK_THROWS_WITH(CreateBackend("tpu"), "unknown --device 'tpu': use auto, cpu, cuda or cuda:N");
  CHECK_THROWS_AS(CreateBackend("cuda:x"), ConfigError);
  const CudaProbe probe = ProbeCuda();
  if (probe.devices == 0 && probe.gpu_absent) {
    INFO("no GPU here (" << probe.why << "), as on the CI machines");
    CHECK(CreateBackend("auto")->kind() == DeviceKind::kCPU);
    CHECK_THROWS_AS(CreateBackend("cuda"), DeviceError);
    CHECK_THROWS_WITH(CreateBackend("cuda"), Catch::Contains("no CUDA device found") &&
                                                 Catch::EndsWith("use --device cpu"));
  } else if (probe.devices == 0) {
    INFO("a GPU CUDA cannot use (" << probe.why << ")");
    CHECK_THROWS_WITH(CreateBackend("auto"),
                      Catch::Contains("CUDA cannot use it") && Catch::EndsWith("use --device cpu"));
  } else {
    CHECK(CreateBackend("auto")->kind() == DeviceKind::kCUDA);
    CHECK(CreateBackend("cuda")->kind() == DeviceKind::kCUDA);
  }
}

// The CPU-vs-CUDA harness, run CPU against CPU: its comparisons must hold trivially, which
// checks the harness (and each CPU kernel's determinism) on machines without a GPU.
TEST_CASE("backend agreement harness, CPU against CPU", "[agreement]") {
  auto a = MakeCpuBackend();
  auto b = MakeCpuBackend();
  testing::AgreeGemm(*a, *b);
  testing::AgreeElementwise(*a, *b);
  testing::AgreeBias(*a, *b);
  testing::AgreePooling(*a, *b);
  testing::AgreeIm2Col(*a, *b);
  testing::AgreeConvChunks(*a, *b);
  testing::CheckQueuedCopies(*a);
  testing::AgreeSoftmax(*a, *b);
  testing::AgreeTrainingStep(*a, *b, "mlp");
  testing::AgreeTrainingStep(*a, *b, "cnn");
}

}  // namespace
}  // namespace ps::worker
