// Finite-difference gradient checks of every layer on the CPU backend.
//
// Each check uses the scalar objective L = sum_k r_k * y_k with fixed random r, so dL/dy = r.
// The analytic gradients (Backward with dy = r) are compared with central differences
// (L(v + eps) - L(v - eps)) / (2 eps) for every input and parameter element, the objective being
// accumulated in double from the float forward pass. Inputs are kept away from the kinks of ReLU
// and max pooling by more than eps, so the differences are taken where the layer is smooth.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "tests/worker/test_util.h"
#include "worker/cpu_backend.h"
#include "worker/init.h"
#include "worker/layers.h"
#include "worker/model.h"
#include "worker/random.h"

namespace ps::worker {
namespace {

using testing::RandomVector;

constexpr float kEps = 1e-2f;
constexpr double kRelTol = 1e-2;   // per element, relative to the larger magnitude
constexpr double kAbsTol = 1e-3;   // per element, for gradients near zero
constexpr double kNormTol = 2e-3;  // ||analytic - numeric|| / ||analytic + numeric||

void CompareGradients(const std::vector<double>& analytic, const std::vector<double>& numeric,
                      const std::string& what) {
  REQUIRE(analytic.size() == numeric.size());
  double diff2 = 0.0;
  double sum2 = 0.0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    const double a = analytic[i];
    const double n = numeric[i];
    INFO(what << "[" << i << "]: analytic " << a << " numeric " << n);
    CHECK(std::fabs(a - n) <= kAbsTol + kRelTol * std::max(std::fabs(a), std::fabs(n)));
    diff2 += (a - n) * (a - n);
    sum2 += (a + n) * (a + n);
  }
  INFO(what << ": relative error of the whole gradient");
  CHECK(std::sqrt(diff2) <= kNormTol * std::sqrt(sum2) + 1e-9);
}

// Central differences of `objective` with respect to each element of `values` (perturbed in
// place and restored).
std::vector<double> NumericGradient(float* values, std::size_t n,
                                    const std::function<double()>& objective) {
  std::vector<double> grad(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float saved = values[i];
    values[i] = saved + kEps;
    const double plus = objective();
    values[i] = saved - kEps;
    const double minus = objective();
    values[i] = saved;
    grad[i] = (plus - minus) / (2.0 * static_cast<double>(kEps));
  }
  return grad;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Checks dL/dx and dL/dparam of one layer for input x (CPU memory: the CPU backend's device
// pointers are host pointers, so the test perturbs them directly).
void CheckLayer(Layer& layer, std::vector<float> x, int batch, std::uint64_t seed) {
  layer.Reserve(batch);
  const std::size_t out_size = static_cast<std::size_t>(batch) * layer.output_shape().size();
  REQUIRE(x.size() == static_cast<std::size_t>(batch) * layer.input_shape().size());
  const std::vector<float> r = RandomVector(out_size, seed + 1);
  std::vector<float> y(out_size);
  const auto objective = [&] {
    layer.Forward(x.data(), y.data(), batch);
    double sum = 0.0;
    for (std::size_t k = 0; k < out_size; ++k) sum += static_cast<double>(r[k]) * y[k];
    return sum;
  };

  objective();
  std::vector<float> dx(x.size(), 123.0f);  // Backward must overwrite it
  layer.Backward(x.data(), y.data(), r.data(), dx.data(), batch);
  std::vector<std::vector<double>> param_grads;
  for (Param* p : layer.params()) param_grads.push_back(ToDouble(p->grad.ToHost()));

  CompareGradients(ToDouble(dx), NumericGradient(x.data(), x.size(), objective),
                   layer.name() + " dx");
  const std::vector<Param*> params = layer.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    CompareGradients(param_grads[i],
                     NumericGradient(params[i]->value.data(), params[i]->size(), objective),
                     params[i]->name);
  }
}

// Random parameter values (biases too, so their effect is not trivially zero).
void RandomizeParams(Layer& layer, std::uint64_t seed) {
  for (Param* p : layer.params()) {
    const auto v = RandomVector(p->size(), seed++, -0.5f, 0.5f);
    std::copy(v.begin(), v.end(), p->value.data());
  }
}

// Values in [-1, -0.05] U [0.05, 1]: at least 5 eps from ReLU's kink at 0.
std::vector<float> AwayFromZero(std::size_t n, std::uint64_t seed) {
  auto v = RandomVector(n, seed);
  for (float& x : v) x = std::copysign(0.05f + 0.95f * std::fabs(x), x);
  return v;
}

// A permutation of evenly spaced values 0.1 apart: every pooling window has a unique maximum
// that a perturbation of eps cannot change.
std::vector<float> DistinctValues(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = -1.0f + 0.1f * static_cast<float>(i);
  std::mt19937_64 rng(seed);
  Shuffle(std::span<float>(v), rng);
  return v;
}

TEST_CASE("dense layer gradients match finite differences", "[gradcheck]") {
  auto backend = MakeCpuBackend();
  Dense dense(*backend, "dense", Shape3{5, 1, 1}, 4, InitKind::kHeUniform);
  RandomizeParams(dense, 10);
  CheckLayer(dense, RandomVector(3 * 5, 11), 3, 12);
}

TEST_CASE("dense layer over an image input flattens it", "[gradcheck]") {
  auto backend = MakeCpuBackend();
  Dense dense(*backend, "dense", Shape3{2, 3, 2}, 3, InitKind::kXavierUniform);
  REQUIRE(dense.params()[0]->shape == std::vector<int>{3, 12});
  RandomizeParams(dense, 20);
  CheckLayer(dense, RandomVector(2 * 12, 21), 2, 22);
}

TEST_CASE("relu gradients match finite differences", "[gradcheck]") {
  auto backend = MakeCpuBackend();
  Relu relu(*backend, "relu", Shape3{3, 2, 2});
  CheckLayer(relu, AwayFromZero(2 * 12, 30), 2, 31);
}

TEST_CASE("conv layer gradients match finite differences", "[gradcheck]") {
  auto backend = MakeCpuBackend();
  SECTION("5x5 kernel, pad 2 (the cnn's shape, scaled down)") {
    Conv2d conv(*backend, "conv", Shape3{2, 6, 6}, 3, 5, 2, 1, InitKind::kHeUniform);
    REQUIRE(conv.output_shape() == Shape3{3, 6, 6});
    RandomizeParams(conv, 40);
    CheckLayer(conv, RandomVector(2 * 2 * 36, 41), 2, 42);
  }
  SECTION("3x3 kernel, no padding, stride 2") {
    Conv2d conv(*backend, "conv", Shape3{3, 7, 7}, 2, 3, 0, 2, InitKind::kHeUniform);
    REQUIRE(conv.output_shape() == Shape3{2, 3, 3});
    RandomizeParams(conv, 50);
    CheckLayer(conv, RandomVector(2 * 3 * 49, 51), 2, 52);
  }
  SECTION("a batch in chunks: room for 2 images per GEMM, 3 images (2, then 1)") {
    const std::size_t image_col = 2 * 5 * 5 * 6 * 6;  // rows x output pixels of one image
    Conv2d conv(*backend, "conv", Shape3{2, 6, 6}, 3, 5, 2, 1, InitKind::kHeUniform, 2 * image_col);
    RandomizeParams(conv, 45);
    CheckLayer(conv, RandomVector(3 * 2 * 36, 46), 3, 47);
  }
}

TEST_CASE("max pool gradients match finite differences", "[gradcheck]") {
  auto backend = MakeCpuBackend();
  SECTION("even size") {
    Pool2d pool(*backend, "maxpool", Shape3{2, 4, 4}, PoolKind::kMax, 2);
    CheckLayer(pool, DistinctValues(2 * 2 * 16, 60), 2, 61);
  }
  SECTION("odd size: the last row and column belong to no window") {
    Pool2d pool(*backend, "maxpool", Shape3{1, 5, 5}, PoolKind::kMax, 2);
    REQUIRE(pool.output_shape() == Shape3{1, 2, 2});
    CheckLayer(pool, DistinctValues(2 * 25, 62), 2, 63);
  }
}

TEST_CASE("avg pool gradients match finite differences", "[gradcheck]") {
  auto backend = MakeCpuBackend();
  Pool2d pool(*backend, "avgpool", Shape3{2, 6, 6}, PoolKind::kAvg, 3);
  CheckLayer(pool, RandomVector(2 * 2 * 36, 70), 2, 71);
}

TEST_CASE("softmax cross-entropy gradients match finite differences", "[gradcheck]") {
  auto backend = MakeCpuBackend();
  const int batch = 4;
  const int classes = 5;
  SoftmaxCrossEntropy loss(*backend, classes);
  loss.Reserve(batch);
  auto logits = RandomVector(static_cast<std::size_t>(batch) * classes, 80, -3.0f, 3.0f);
  const std::vector<std::int32_t> labels = {0, 4, 2, 2};
  const auto mean_loss = [&] {
    return loss.Forward(logits.data(), labels.data(), batch).loss_sum / batch;
  };
  mean_loss();
  std::vector<float> dlogits(logits.size());
  loss.Backward(labels.data(), dlogits.data(), batch, 1.0f / batch);
  CompareGradients(ToDouble(dlogits), NumericGradient(logits.data(), logits.size(), mean_loss),
                   "softmax dlogits");
}

TEST_CASE("softmax cross-entropy forward values", "[gradcheck]") {
  auto backend = MakeCpuBackend();
  SoftmaxCrossEntropy loss(*backend, 3);
  loss.Reserve(2);
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f, 1000.0f, 0.0f, -1000.0f};
  const std::vector<std::int32_t> labels = {1, 0};
  const SoftmaxStats s = loss.Forward(logits.data(), labels.data(), 2);
  // Uniform row: loss log(3), argmax 0 (first maximum) != label 1. Saturated row: loss 0.
  CHECK(s.loss_sum == Approx(std::log(3.0)).epsilon(1e-6));
  CHECK(s.correct == 1);
  const auto p = loss.probs().ToHost();
  CHECK(p[0] == Approx(1.0 / 3));
  CHECK(p[3] == Approx(1.0));
  CHECK(std::isfinite(p[5]));
}

// The whole chain through Model::Backward: a small conv net's loss gradient with respect to
// every parameter, against central differences of Model::Forward's mean loss.
TEST_CASE("model gradients match finite differences end to end", "[gradcheck]") {
  auto backend = MakeCpuBackend();
  const int batch = 3;
  Model model(*backend, "tiny", Shape3{1, 6, 6}, 4, batch);
  model.Add<Conv2d>("conv0", 2, 3, 1, 1, InitKind::kHeUniform);
  model.Add<Relu>("relu0");
  model.Add<Pool2d>("pool0", PoolKind::kMax, 2);
  model.Add<Dense>("dense0", 5, InitKind::kHeUniform);
  model.Add<Relu>("relu1");
  model.Add<Dense>("dense1", 4, InitKind::kXavierUniform);
  model.Finalize();
  model.InitParams(7);
  const auto images = RandomVector(static_cast<std::size_t>(batch) * 36, 90, 0.0f, 1.0f);
  const std::vector<std::int32_t> labels = {3, 0, 1};
  model.LoadBatch(images.data(), labels.data(), batch);
  model.Forward();
  model.Backward();
  // Small steps: ReLU and max-pool kinks may lie anywhere here, so probe gently.
  constexpr float kStep = 1e-3f;
  for (Param* p : model.params()) {
    const auto analytic = p->grad.ToHost();
    float* v = p->value.data();
    double diff2 = 0.0;
    double sum2 = 0.0;
    for (std::size_t i = 0; i < p->size(); ++i) {
      const float saved = v[i];
      v[i] = saved + kStep;
      const double plus = model.Forward().mean_loss();
      v[i] = saved - kStep;
      const double minus = model.Forward().mean_loss();
      v[i] = saved;
      const double numeric = (plus - minus) / (2.0 * kStep);
      diff2 += (analytic[i] - numeric) * (analytic[i] - numeric);
      sum2 += (analytic[i] + numeric) * (analytic[i] + numeric);
    }
    INFO(p->name << ": |analytic - numeric| / |analytic + numeric|");
    CHECK(std::sqrt(diff2) <= 2e-2 * std::sqrt(sum2) + 1e-6);
  }
}

}  // namespace
}  // namespace ps::worker
