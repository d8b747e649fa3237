#pragma once
// Runs each Backend primitive, and whole training steps, on two backends with the same inputs
// and checks the results agree. The CUDA test compares CPU against CUDA; the core tests run the
// same harness CPU against CPU, so the harness itself is exercised on machines without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/worker/test_util.h"
#include "worker/backend.h"
#include "worker/layers.h"
#include "worker/model.h"
#include "worker/sgd_trainer.h"

namespace ps::worker::testing {

// Float results of the two backends may differ by summation order and expf/logf ulps.
inline constexpr double kKernelTol = 1e-5;
inline constexpr double kGemmTol = 1e-5;
inline constexpr double kStepTol = 2e-4;

inline void AgreeGemm(Backend& a, Backend& b) {
  struct Case {
    bool ta, tb;
    int m, n, k;
  };
  for (const Case c :
       {Case{false, false, 7, 5, 3}, Case{false, true, 64, 10, 128}, Case{true, false, 33, 17, 65},
        Case{true, true, 4, 9, 300}, Case{false, false, 64, 196, 800}}) {
    INFO("gemm ta=" << c.ta << " tb=" << c.tb << " m=" << c.m << " n=" << c.n << " k=" << c.k);
    const int lda = c.ta ? c.m : c.k;
    const int ldb = c.tb ? c.k : c.n;
    const auto av = RandomVector(static_cast<std::size_t>(c.m) * c.k, 1);
    const auto bv = RandomVector(static_cast<std::size_t>(c.k) * c.n, 2);
    const auto cv = RandomVector(static_cast<std::size_t>(c.m) * c.n, 3);
    std::vector<float> out[2];
    Backend* backends[2] = {&a, &b};
    for (int i = 0; i < 2; ++i) {
      auto da = Upload(*backends[i], av);
      auto db = Upload(*backends[i], bv);
      auto dc = Upload(*backends[i], cv);
      backends[i]->Gemm(c.ta, c.tb, c.m, c.n, c.k, 0.5f, da.data(), lda, db.data(), ldb, 0.25f,
                        dc.data(), c.n);
      out[i] = dc.ToHost();
    }
    // Entries are sums of k products of magnitude <= 1: scale the bound with k.
    CHECK(MaxScaledDiff(out[0], out[1]) < kGemmTol * c.k);
  }
}

inline void AgreeElementwise(Backend& a, Backend& b) {
  const std::size_t n = 10007;
  const auto x = RandomVector(n, 4);
  const auto y0 = RandomVector(n, 5);
  const auto g = RandomVector(n, 6);
  const auto mom0 = RandomVector(n, 7);
  struct Out {
    std::vector<float> fill, axpy, scale, sgd_w, sgd_mom, sgd_plain, relu, relu_back;
  } out[2];
  Backend* backends[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    Backend& be = *backends[i];
    DeviceArray<float> f(be, n);
    be.Fill(f.data(), n, 0.375f);
    out[i].fill = f.ToHost();
    auto dx = Upload(be, x);
    auto dy = Upload(be, y0);
    be.Axpy(n, -1.5f, dx.data(), dy.data());
    out[i].axpy = dy.ToHost();
    be.Scale(n, 3.0f, dy.data());
    out[i].scale = dy.ToHost();
    auto w = Upload(be, x);
    auto dg = Upload(be, g);
    auto mom = Upload(be, mom0);
    be.SgdUpdate(w.data(), dg.data(), mom.data(), n, 0.1f, 0.9f, 1e-3f);
    out[i].sgd_w = w.ToHost();
    out[i].sgd_mom = mom.ToHost();
    be.SgdUpdate(w.data(), dg.data(), nullptr, n, 0.05f, 0.0f, 0.0f);
    out[i].sgd_plain = w.ToHost();
    DeviceArray<float> r(be, n);
    be.ReluForward(dx.data(), r.data(), n);
    out[i].relu = r.ToHost();
    DeviceArray<float> rb(be, n);
    be.ReluBackward(r.data(), dg.data(), rb.data(), n);
    out[i].relu_back = rb.ToHost();
  }
  CHECK(out[0].fill == out[1].fill);
  CHECK(MaxScaledDiff(out[0].axpy, out[1].axpy) < kKernelTol);
  CHECK(MaxScaledDiff(out[0].scale, out[1].scale) < kKernelTol);
  CHECK(MaxScaledDiff(out[0].sgd_w, out[1].sgd_w) < kKernelTol);
  CHECK(MaxScaledDiff(out[0].sgd_mom, out[1].sgd_mom) < kKernelTol);
  CHECK(MaxScaledDiff(out[0].sgd_plain, out[1].sgd_plain) < kKernelTol);
  CHECK(out[0].relu == out[1].relu);  // exact: a select, no arithmetic
  CHECK(out[0].relu_back == out[1].relu_back);
}

inline void AgreeBias(Backend& a, Backend& b) {
  // Dense (spatial 1) and conv shapes; the larger ones take several blocks per channel on a GPU.
  for (const auto& [batch, spatial] : {std::pair{5, 1}, std::pair{5, 49}, std::pair{5, 784},
                                       std::pair{40, 784}, std::pair{3000, 1}}) {
    INFO("batch=" << batch << " spatial=" << spatial);
    const int channels = 13;
    const std::size_t n = static_cast<std::size_t>(batch) * channels * spatial;
    const auto y0 = RandomVector(n, 8);
    const auto bias = RandomVector(static_cast<std::size_t>(channels), 9);
    std::vector<float> added[2], grad[2];
    Backend* backends[2] = {&a, &b};
    for (int i = 0; i < 2; ++i) {
      auto y = Upload(*backends[i], y0);
      auto db = Upload(*backends[i], bias);
      backends[i]->AddBias(y.data(), db.data(), batch, channels, spatial);
      added[i] = y.ToHost();
      DeviceArray<float> g(*backends[i], static_cast<std::size_t>(channels));
      backends[i]->BiasGrad(y.data(), g.data(), batch, channels, spatial);
      grad[i] = g.ToHost();
    }
    CHECK(MaxScaledDiff(added[0], added[1]) < kKernelTol);
    CHECK(MaxScaledDiff(grad[0], grad[1]) < kKernelTol * batch * spatial);
  }
}

inline void AgreePooling(Backend& a, Backend& b) {
  for (const PoolGeometry g :
       {PoolGeometry{3, 28, 28, 2}, PoolGeometry{2, 7, 9, 2}, PoolGeometry{4, 9, 9, 3}}) {
    INFO("pool " << g.channels << "x" << g.height << "x" << g.width << " window " << g.window);
    const int batch = 3;
    const std::size_t in = static_cast<std::size_t>(batch) * g.channels * g.height * g.width;
    const std::size_t out =
        static_cast<std::size_t>(batch) * g.channels * g.out_height() * g.out_width();
    auto x = RandomVector(in, 10);
    x[0] = x[1] = 2.0f;  // a tie at the window's maximum: both must pick the first one
    const auto dy = RandomVector(out, 11);
    std::vector<float> maxf[2], maxb[2], avgf[2], avgb[2];
    Backend* backends[2] = {&a, &b};
    for (int i = 0; i < 2; ++i) {
      Backend& be = *backends[i];
      auto dx_in = Upload(be, x);
      auto ddy = Upload(be, dy);
      DeviceArray<float> y(be, out);
      DeviceArray<float> dx(be, in);
      be.MaxPoolForward(dx_in.data(), y.data(), batch, g);
      maxf[i] = y.ToHost();
      be.Fill(dx.data(), in, 7.0f);  // backward must overwrite every element
      be.MaxPoolBackward(dx_in.data(), ddy.data(), dx.data(), batch, g);
      maxb[i] = dx.ToHost();
      be.AvgPoolForward(dx_in.data(), y.data(), batch, g);
      avgf[i] = y.ToHost();
      be.Fill(dx.data(), in, 7.0f);
      be.AvgPoolBackward(ddy.data(), dx.data(), batch, g);
      avgb[i] = dx.ToHost();
    }
    CHECK(maxf[0] == maxf[1]);
    CHECK(maxb[0] == maxb[1]);
    CHECK(MaxScaledDiff(avgf[0], avgf[1]) < kKernelTol);
    CHECK(MaxScaledDiff(avgb[0], avgb[1]) < kKernelTol);
  }
}

// Im2Col and Col2Im over a batch of images (each image's columns interleaved per row, as one
// GEMM reads them), and the axis swap that turns the GEMM's result into activations.
inline void AgreeIm2Col(Backend& a, Backend& b) {
  for (const ConvGeometry g :
       {ConvGeometry{1, 28, 28, 5, 5, 2, 2, 1, 1}, ConvGeometry{32, 14, 14, 5, 5, 2, 2, 1, 1},
        ConvGeometry{3, 9, 7, 3, 2, 1, 0, 2, 3}}) {
    for (const int batch : {1, 3}) {
      INFO("conv " << g.channels << "x" << g.height << "x" << g.width << " k" << g.kernel_h << "x"
                   << g.kernel_w << " pad " << g.pad_h << "," << g.pad_w << " stride " << g.stride_h
                   << "," << g.stride_w << " batch " << batch);
      const std::size_t image = static_cast<std::size_t>(g.channels) * g.height * g.width;
      const std::size_t in = image * batch;
      const std::size_t cols = static_cast<std::size_t>(g.col_rows()) * g.col_cols() * batch;
      const auto x = RandomVector(in, 12);
      const auto c = RandomVector(cols, 13);
      std::vector<float> col[2], img[2], swapped[2];
      Backend* backends[2] = {&a, &b};
      for (int i = 0; i < 2; ++i) {
        Backend& be = *backends[i];
        auto dx = Upload(be, x);
        DeviceArray<float> dcol(be, cols);
        be.Im2Col(dx.data(), dcol.data(), batch, g);
        col[i] = dcol.ToHost();
        auto dc = Upload(be, c);
        be.Fill(dx.data(), in, 7.0f);
        be.Col2Im(dc.data(), dx.data(), batch, g);
        img[i] = dx.ToHost();
        // [batch, channels, pixels] -> [channels, batch, pixels]
        auto src = Upload(be, x);
        DeviceArray<float> dst(be, in);
        be.SwapLeadingAxes(src.data(), dst.data(), batch, g.channels, g.height * g.width);
        swapped[i] = dst.ToHost();
      }
      CHECK(col[0] == col[1]);  // exact: copies
      CHECK(swapped[0] == swapped[1]);
      CHECK(MaxScaledDiff(img[0], img[1]) < kKernelTol * g.kernel_h * g.kernel_w);
      // Image n's block of row r is image n's own im2col, at (r * batch + n) * pixels.
      const std::size_t pixels = static_cast<std::size_t>(g.col_cols());
      const std::size_t last = static_cast<std::size_t>(batch) - 1;
      std::vector<float> alone[2];
      for (int i = 0; i < 2; ++i) {
        auto dx = Upload(*backends[i], std::vector<float>(x.begin() + last * image, x.end()));
        DeviceArray<float> dcol(*backends[i], pixels * g.col_rows());
        backends[i]->Im2Col(dx.data(), dcol.data(), 1, g);
        alone[i] = dcol.ToHost();
      }
      CHECK(alone[0] == alone[1]);
      for (std::size_t r = 0; r < static_cast<std::size_t>(g.col_rows()); ++r) {
        const auto from = col[0].begin() + static_cast<std::ptrdiff_t>((r * batch + last) * pixels);
        REQUIRE(std::equal(from, from + static_cast<std::ptrdiff_t>(pixels),
                           alone[0].begin() + static_cast<std::ptrdiff_t>(r * pixels)));
      }
      // The swap by hand: element (n, c, p) of x lands at (c, n, p).
      const std::size_t plane = static_cast<std::size_t>(g.height) * g.width;
      CHECK(swapped[0][(static_cast<std::size_t>(g.channels - 1) * batch + last) * plane + 1] ==
            x[(last * g.channels + static_cast<std::size_t>(g.channels - 1)) * plane + 1]);
    }
  }
}

// A conv layer on `a` with the backend's own chunking against the same layer on `b` running 5
// images as chunks of 2, 2 and 1: outputs, weight, bias and input gradients agree.
inline void AgreeConvChunks(Backend& a, Backend& b) {
  const Shape3 input{3, 9, 9};
  const int batch = 5;
  const std::size_t image_col = 3 * 5 * 5 * 9 * 9;  // rows x output pixels of one image
  Conv2d la(a, "conv", input, 4, 5, 2, 1, InitKind::kHeUniform);
  Conv2d lb(b, "conv", input, 4, 5, 2, 1, InitKind::kHeUniform, 2 * image_col);
  const auto w = RandomVector(4 * 3 * 5 * 5, 30);
  const auto bias = RandomVector(4, 31);
  const auto x = RandomVector(batch * input.size(), 32);
  const std::size_t out = static_cast<std::size_t>(batch) * la.output_shape().size();
  const auto dy = RandomVector(out, 33);
  Conv2d* layers[2] = {&la, &lb};
  Backend* backends[2] = {&a, &b};
  std::vector<float> y[2], dx[2], dw[2], db[2];
  for (int i = 0; i < 2; ++i) {
    Conv2d& l = *layers[i];
    l.Reserve(batch);
    l.params()[0]->value.CopyFrom(std::span<const float>(w));
    l.params()[1]->value.CopyFrom(std::span<const float>(bias));
    auto dev_x = Upload(*backends[i], x);
    auto dev_dy = Upload(*backends[i], dy);
    DeviceArray<float> dev_y(*backends[i], out);
    DeviceArray<float> dev_dx(*backends[i], x.size());
    l.Forward(dev_x.data(), dev_y.data(), batch);
    l.Backward(dev_x.data(), dev_y.data(), dev_dy.data(), dev_dx.data(), batch);
    y[i] = dev_y.ToHost();
    dx[i] = dev_dx.ToHost();
    dw[i] = l.params()[0]->grad.ToHost();
    db[i] = l.params()[1]->grad.ToHost();
  }
  const double sums = 3.0 * 5 * 5;  // products summed per output
  CHECK(MaxScaledDiff(y[0], y[1]) < kGemmTol * sums);
  CHECK(MaxScaledDiff(dx[0], dx[1]) < kGemmTol * sums);
  CHECK(MaxScaledDiff(dw[0], dw[1]) < kGemmTol * batch * 81);
  CHECK(MaxScaledDiff(db[0], db[1]) < kKernelTol * batch * 81);
}

// The asynchronous copies and stream marks: a mark never recorded is reached; one recorded
// after queued work is reached once that work is done (polled, then waited for), and the
// copies moved what the calls before them computed.
inline void CheckQueuedCopies(Backend& backend) {
  CHECK(backend.NewMark()->Reached());
  const std::size_t n = 1 << 20;
  HostArray<float> host(backend, n);
  DeviceArray<float> dev(backend, n);
  for (std::size_t i = 0; i < n; ++i) host.data()[i] = static_cast<float>(i % 1000);
  const auto mark = backend.NewMark();
  backend.CopyToDeviceAsync(dev.data(), host.data(), n * sizeof(float));
  backend.Scale(n, 2.0f, dev.data());
  backend.CopyToHostAsync(host.data(), dev.data(), n * sizeof(float));
  mark->Record();
  for (int polls = 0; polls < 1000 && !mark->Reached(); ++polls) std::this_thread::yield();
  mark->Wait();
  CHECK(mark->Reached());
  CHECK(host.data()[999] == 1998.0f);
  CHECK(host.data()[n - 1] == static_cast<float>((n - 1) % 1000) * 2.0f);
  // Recorded again, the mark waits for the new work only.
  backend.Fill(dev.data(), n, 7.0f);
  backend.CopyToHostAsync(host.data(), dev.data(), n * sizeof(float));
  mark->Record();
  mark->Wait();
  CHECK(host.data()[12345] == 7.0f);
}

inline void AgreeSoftmax(Backend& a, Backend& b) {
  const int batch = 37;
  const int classes = 10;
  const std::size_t n = static_cast<std::size_t>(batch) * classes;
  auto logits = RandomVector(n, 14, -6.0f, 6.0f);
  logits[5] = 1000.0f;    // far past expf's range (~88.7): only max-subtraction survives
  logits[15] = -1000.0f;  // and far below it
  // Row 2 has two equal maxima, and its label is the second: the first maximum is the
  // prediction, so the row counts as wrong on both backends (a ">=" argmax would differ).
  logits[22] = logits[27] = 50.0f;
  auto labels = RandomLabels(static_cast<std::size_t>(batch), classes, 15);
  labels[2] = 7;
  SoftmaxStats stats[2];
  std::vector<float> probs[2], grads[2];
  Backend* backends[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    Backend& be = *backends[i];
    auto dl = Upload(be, logits);
    auto dlab = Upload(be, labels);
    DeviceArray<float> p(be, n);
    DeviceArray<float> d(be, n);
    stats[i] = be.SoftmaxCrossEntropyForward(dl.data(), dlab.data(), p.data(), batch, classes);
    probs[i] = p.ToHost();
    be.SoftmaxCrossEntropyBackward(p.data(), dlab.data(), d.data(), batch, classes, 1.0f / batch);
    grads[i] = d.ToHost();
  }
  CHECK(stats[0].correct == stats[1].correct);
  CHECK(stats[0].loss_sum == Approx(stats[1].loss_sum).epsilon(1e-5));
  CHECK(MaxScaledDiff(probs[0], probs[1]) < kKernelTol);
  CHECK(MaxScaledDiff(grads[0], grads[1]) < kKernelTol);
}

// One full training step (forward, loss, backward, SGD update) of `model_name` on each backend
// from the same seed and batch: loss, accuracy, every gradient and every updated weight agree.
inline void AgreeTrainingStep(Backend& a, Backend& b, const std::string& model_name) {
  const int batch = 16;
  const auto images = RandomVector(static_cast<std::size_t>(batch) * 784, 16, 0.0f, 1.0f);
  const auto labels = RandomLabels(static_cast<std::size_t>(batch), 10, 17);
  auto ma = BuildModel(model_name, a, batch);
  auto mb = BuildModel(model_name, b, batch);
  ma->InitParams(42);
  mb->InitParams(42);
  std::vector<int> hook_order[2];
  const BatchStats sa =
      ma->TrainStep(images.data(), labels.data(), batch,
                    [&](int layer, const std::vector<Param*>&) { hook_order[0].push_back(layer); });
  const BatchStats sb =
      mb->TrainStep(images.data(), labels.data(), batch,
                    [&](int layer, const std::vector<Param*>&) { hook_order[1].push_back(layer); });
  CHECK(hook_order[0] == hook_order[1]);
  CHECK(sa.loss_sum == Approx(sb.loss_sum).epsilon(kStepTol));
  CHECK(sa.correct == sb.correct);
  REQUIRE(ma->params().size() == mb->params().size());
  for (std::size_t i = 0; i < ma->params().size(); ++i) {
    INFO(model_name << " gradient of " << ma->params()[i]->name);
    CHECK(MaxScaledDiff(ma->params()[i]->grad.ToHost(), mb->params()[i]->grad.ToHost()) < kStepTol);
  }
  SgdOptimizer oa(*ma, SgdOptions{0.001f, 0.9f, 1e-4f});
  SgdOptimizer ob(*mb, SgdOptions{0.001f, 0.9f, 1e-4f});
  oa.Step();
  ob.Step();
  for (std::size_t i = 0; i < ma->params().size(); ++i) {
    INFO(model_name << " updated value of " << ma->params()[i]->name);
    CHECK(MaxScaledDiff(ma->params()[i]->value.ToHost(), mb->params()[i]->value.ToHost()) <
          kStepTol);
  }
  // A second forward pass from the updated weights.
  const BatchStats ea = ma->Evaluate(images.data(), labels.data(), batch);
  const BatchStats eb = mb->Evaluate(images.data(), labels.data(), batch);
  CHECK(ea.loss_sum == Approx(eb.loss_sum).epsilon(kStepTol));
  CHECK(ea.loss_sum < sa.loss_sum);  // one step on a batch lowers that batch's loss
}

}  // namespace ps::worker::testing
