// Optimizer math against scalar references, threading determinism, config validation,
// state bookkeeping, and the AddInto/CopyInto helpers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kvstore/optimizer.h"

namespace {

using Catch::Matchers::Contains;
using Vec = std::vector<float>;

Vec RandomVec(std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Never split: the single-threaded baseline.
ps::ParallelOptions SingleThread() {
  ps::ParallelOptions p;
  p.min_parallel_elements = std::numeric_limits<std::size_t>::max();
  return p;
}

// Split small arrays over 4 threads, whatever the machine.
ps::ParallelOptions ForceThreads() {
  ps::ParallelOptions p;
  p.min_parallel_elements = 1024;
  p.max_threads = 4;
  return p;
}

float ClipRef(float x, float c) { return c < 0 ? x : std::max(-c, std::min(c, x)); }

void RequireNear(const Vec& got, const Vec& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == Approx(want[i]).epsilon(2e-5).margin(1e-6));
  }
}

// Runs `steps` updates of one state with fresh random gradients; returns the weight. The
// reference callback applies the same step to its own copy, element by element.
struct RefState {
  Vec a, b;  // momentum / history / m, v
};
using RefStep = std::function<void(int t, Vec& w, const Vec& g, RefState& s)>;

void CheckAgainstReference(const ps::OptimizerConfig& config, const RefStep& ref, int steps,
                           std::size_t n = 257) {
  auto opt = ps::MakeOptimizer(config, SingleThread());
  Vec w = RandomVec(n, 1, -1.0f, 1.0f);
  Vec w_ref = w;
  RefState s{Vec(n, 0.0f), Vec(n, 0.0f)};
  for (int t = 1; t <= steps; ++t) {
    const Vec g = RandomVec(n, 100 + t, -3.0f, 3.0f);
    opt->Update(7, w.data(), g.data(), n);
    ref(t, w_ref, g, s);
    INFO("step " << t);
    RequireNear(w, w_ref);
  }
  REQUIRE(opt->UpdateCount(7) == static_cast<std::uint64_t>(steps));
}

// Plain SGD as the brief writes it: g' = clip(rescale*g); w -= lr*(g' + wd*w).
RefStep SgdRef(const ps::OptimizerConfig& c) {
  return [c](int, Vec& w, const Vec& g, RefState&) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float gi = ClipRef(c.rescale_grad * g[i], c.clip_gradient) + c.weight_decay * w[i];
      w[i] -= c.learning_rate * gi;
    }
  };
}

// SGD with momentum: g' = clip(rescale*g) + wd*w; mom = momentum*mom - lr*g'; w += mom.
RefStep SgdMomRef(const ps::OptimizerConfig& c) {
  return [c](int, Vec& w, const Vec& g, RefState& s) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float gi = ClipRef(c.rescale_grad * g[i], c.clip_gradient) + c.weight_decay * w[i];
      s.a[i] = c.momentum * s.a[i] - c.learning_rate * gi;
      w[i] += s.a[i];
    }
  };
}

// Adam with bias correction (in double, as MXNet's Python optimizer computes it).
RefStep AdamRef(const ps::OptimizerConfig& c) {
  return [c](int t, Vec& w, const Vec& g, RefState& s) {
    const double lr_t = c.learning_rate * std::sqrt(1.0 - std::pow(double{c.beta2}, t)) /
                        (1.0 - std::pow(double{c.beta1}, t));
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double gi = ClipRef(c.rescale_grad * g[i], c.clip_gradient) + c.weight_decay * w[i];
      s.a[i] = static_cast<float>(c.beta1 * s.a[i] + (1.0 - c.beta1) * gi);
      s.b[i] = static_cast<float>(c.beta2 * s.b[i] + (1.0 - c.beta2) * gi * gi);
      w[i] = static_cast<float>(w[i] - lr_t * s.a[i] / (std::sqrt(double{s.b[i]}) + c.epsilon));
    }
  };
}

// AdaGrad: g' = clip(rescale*g); h += g'^2; w -= lr*(g'/(sqrt(h) + eps) + wd*w).
RefStep AdagradRef(const ps::OptimizerConfig& c) {
  return [c](int, Vec& w, const Vec& g, RefState& s) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float gi = ClipRef(c.rescale_grad * g[i], c.clip_gradient);
      s.a[i] += gi * gi;
      w[i] -= c.learning_rate * (gi / (std::sqrt(s.a[i]) + c.epsilon) + c.weight_decay * w[i]);
    }
  };
}

ps::OptimizerConfig Config(const std::string& name) {
  ps::OptimizerConfig c;
  c.name = name;
  return c;
}

}  // namespace

TEST_CASE("sgd without momentum matches the reference", "[optimizer]") {
  ps::OptimizerConfig c = Config("sgd");
  c.learning_rate = 0.1f;
  SECTION("plain") { CheckAgainstReference(c, SgdRef(c), 3); }
  SECTION("weight decay and rescale") {
    c.weight_decay = 0.01f;
    c.rescale_grad = 0.25f;
    CheckAgainstReference(c, SgdRef(c), 3);
  }
  SECTION("clipping on") {
    c.weight_decay = 0.01f;
    c.rescale_grad = 0.5f;
    c.clip_gradient = 0.75f;  // |0.5*g| up to 1.5: about half the elements are clipped
    CheckAgainstReference(c, SgdRef(c), 3);
  }
  SECTION("clip 0 zeroes the gradient, leaving only weight decay") {
    c.weight_decay = 0.5f;
    c.clip_gradient = 0.0f;
    auto opt = ps::MakeOptimizer(c);
    Vec w{2.0f, -4.0f};
    const Vec g{100.0f, -100.0f};
    opt->Update(1, w.data(), g.data(), 2);
    REQUIRE(w[0] == Approx(2.0f * (1 - 0.1f * 0.5f)));
    REQUIRE(w[1] == Approx(-4.0f * (1 - 0.1f * 0.5f)));
  }
}

TEST_CASE("sgd exact values for a hand-computed step", "[optimizer]") {
  ps::OptimizerConfig c = Config("sgd");
  c.learning_rate = 0.5f;
  c.momentum = 0.5f;
  auto opt = ps::MakeOptimizer(c);
  Vec w{1.0f, 2.0f};
  const Vec g{1.0f, -2.0f};
  opt->Update(3, w.data(), g.data(), 2);  // mom = -0.5*g = {-0.5, 1}; w = {0.5, 3}
  REQUIRE(w == Vec{0.5f, 3.0f});
  opt->Update(3, w.data(), g.data(), 2);  // mom = 0.5*mom - 0.5*g = {-0.75, 1.5}
  REQUIRE(w == Vec{-0.25f, 4.5f});
}

TEST_CASE("sgd with momentum matches the reference", "[optimizer]") {
  ps::OptimizerConfig c = Config("sgd");
  c.learning_rate = 0.05f;
  c.momentum = 0.9f;
  SECTION("plain") { CheckAgainstReference(c, SgdMomRef(c), 6); }
  SECTION("weight decay, rescale, clipping off") {
    c.weight_decay = 1e-3f;
    c.rescale_grad = 1.0f / 4;
    CheckAgainstReference(c, SgdMomRef(c), 6);
  }
  SECTION("weight decay, rescale, clipping on") {
    c.weight_decay = 1e-3f;
    c.rescale_grad = 0.5f;
    c.clip_gradient = 1.0f;
    CheckAgainstReference(c, SgdMomRef(c), 6);
  }
}

TEST_CASE("adam with bias correction matches the reference over several steps", "[optimizer]") {
  ps::OptimizerConfig c = Config("adam");
  c.learning_rate = 0.01f;
  SECTION("defaults") { CheckAgainstReference(c, AdamRef(c), 8); }
  SECTION("weight decay, rescale, clipping off") {
    c.weight_decay = 0.01f;
    c.rescale_grad = 0.5f;
    c.beta1 = 0.8f;
    c.beta2 = 0.99f;
    c.epsilon = 1e-6f;
    CheckAgainstReference(c, AdamRef(c), 8);
  }
  SECTION("weight decay, rescale, clipping on") {
    c.weight_decay = 0.01f;
    c.rescale_grad = 0.5f;
    c.clip_gradient = 0.5f;
    CheckAgainstReference(c, AdamRef(c), 8);
  }
  SECTION("first step moves each weight by about lr against the gradient's sign") {
    // t = 1: m = (1-b1)g, v = (1-b2)g^2, lr_1 = lr*sqrt(1-b2)/(1-b1) => step = lr*g/|g|.
    auto opt = ps::MakeOptimizer(c);
    Vec w{1.0f, 1.0f};
    const Vec g{3.0f, -0.2f};
    opt->Update(9, w.data(), g.data(), 2);
    REQUIRE(w[0] == Approx(1.0f - 0.01f).epsilon(1e-5));
    REQUIRE(w[1] == Approx(1.0f + 0.01f).epsilon(1e-5));
  }
}

TEST_CASE("adagrad matches the reference", "[optimizer]") {
  ps::OptimizerConfig c = Config("adagrad");
  c.learning_rate = 0.1f;
  c.epsilon = 1e-7f;
  SECTION("plain") { CheckAgainstReference(c, AdagradRef(c), 6); }
  SECTION("weight decay, rescale, clipping on") {
    c.weight_decay = 0.01f;
    c.rescale_grad = 0.5f;
    c.clip_gradient = 1.0f;
    CheckAgainstReference(c, AdagradRef(c), 6);
  }
  SECTION("epsilon is added after the square root (hand-computed)") {
    c.learning_rate = 1.0f;
    c.epsilon = 1.0f;  // big enough to tell sqrt(h) + eps from sqrt(h + eps)
    auto opt = ps::MakeOptimizer(c);
    Vec w{1.0f};
    const Vec g{3.0f};
    opt->Update(1, w.data(), g.data(), 1);  // h = 9; w = 1 - 3/(3+1)
    REQUIRE(w[0] == 0.25f);
    opt->Update(1, w.data(), g.data(), 1);  // h = 18; w = 0.25 - 3/(sqrt(18)+1)
    REQUIRE(w[0] == Approx(0.25 - 3.0 / (std::sqrt(18.0) + 1.0)));
  }
}

TEST_CASE("threaded updates equal single-threaded ones bit for bit", "[optimizer][threads]") {
  // Odd length: the last chunk is short and the vector loops have scalar tails.
  const std::size_t n = (1u << 20) + 7;
  REQUIRE(ps::ParallelThreads(n, ForceThreads()) == 4);
  REQUIRE(ps::ParallelThreads(n, SingleThread()) == 1);
  for (const char* name : {"sgd", "adam", "adagrad"}) {
    for (float momentum : {0.0f, 0.9f}) {
      for (float clip : {-1.0f, 0.5f}) {
        ps::OptimizerConfig c = Config(name);
        c.momentum = momentum;
        c.clip_gradient = clip;
        c.weight_decay = 1e-4f;
        c.rescale_grad = 0.5f;
        INFO(name << " momentum " << momentum << " clip " << clip);
        auto single = ps::MakeOptimizer(c, SingleThread());
        auto threaded = ps::MakeOptimizer(c, ForceThreads());
        Vec w1 = RandomVec(n, 5, -1.0f, 1.0f);
        Vec w2 = w1;
        for (int t = 0; t < 3; ++t) {
          const Vec g = RandomVec(n, 50 + t, -2.0f, 2.0f);
          single->Update(1, w1.data(), g.data(), n);
          threaded->Update(1, w2.data(), g.data(), n);
        }
        REQUIRE(std::memcmp(w1.data(), w2.data(), n * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("state length is fixed by the first update and checked after", "[optimizer]") {
  auto opt = ps::MakeOptimizer(Config("adam"));
  Vec w(10, 1.0f);
  const Vec g(10, 0.5f);
  opt->Update(42, w.data(), g.data(), 10);
  const Vec before = w;
  REQUIRE_THROWS_AS(opt->Update(42, w.data(), g.data(), 9), ps::Error);
  REQUIRE_THROWS_WITH(opt->Update(42, w.data(), g.data(), 9),
                      Contains("state 42") && Contains("expected 10") && Contains("given 9"));
  REQUIRE(w == before);  // a rejected update changes nothing
  REQUIRE(opt->UpdateCount(42) == 1);
  // Another id is an independent state with its own length and count.
  opt->Update(43, w.data(), g.data(), 5);
  REQUIRE(opt->UpdateCount(43) == 1);
  REQUIRE(opt->UpdateCount(44) == 0);
  REQUIRE(opt->NumStates() == 2);
}

TEST_CASE("states of different ids do not interact", "[optimizer]") {
  ps::OptimizerConfig c = Config("sgd");
  c.momentum = 0.9f;
  auto opt = ps::MakeOptimizer(c);
  auto fresh = ps::MakeOptimizer(c);
  Vec a(4, 1.0f), b(4, 1.0f), ref(4, 1.0f);
  const Vec g(4, 1.0f);
  opt->Update(1, a.data(), g.data(), 4);
  opt->Update(1, a.data(), g.data(), 4);
  opt->Update(2, b.data(), g.data(), 4);  // its momentum starts at zero
  fresh->Update(2, ref.data(), g.data(), 4);
  REQUIRE(b == ref);
}

TEST_CASE("the tensor form accepts float32 only", "[optimizer]") {
  auto opt = ps::MakeOptimizer(Config("sgd"));
  std::vector<double> wd(4, 1.0), gd(4, 1.0);
  REQUIRE_THROWS_WITH(opt->Update(1, ps::Tensor(wd.data(), 4), ps::Tensor(gd.data(), 4)),
                      Contains("float32 only") && Contains("float64"));
  Vec w(4, 1.0f), g(3, 1.0f);
  REQUIRE_THROWS_WITH(opt->Update(1, ps::Tensor(w.data(), 4), ps::Tensor(g.data(), 3)),
                      Contains("size mismatch"));
  Vec g4(4, 1.0f);
  opt->Update(1, ps::Tensor(w.data(), 4), ps::Tensor(g4.data(), 4));
  REQUIRE(w[0] == Approx(1.0f - 0.01f));
  REQUIRE(opt->NumStates() == 1);  // the rejected calls created no state
}

TEST_CASE("overlapping weight and gradient are rejected", "[optimizer]") {
  auto opt = ps::MakeOptimizer(Config("sgd"));
  Vec w(8, 1.0f);
  REQUIRE_THROWS_WITH(opt->Update(1, w.data(), w.data() + 2, 4), Contains("overlap"));
}

TEST_CASE("config validation names the field", "[optimizer][config]") {
  struct Case {
    const char* field;
    std::function<void(ps::OptimizerConfig&)> set;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases = {
      {"name", [](auto& c) { c.name = "lamb"; }},
      {"name", [](auto& c) { c.name = "SGD"; }},
      {"learning_rate", [](auto& c) { c.learning_rate = -0.1f; }},
      {"learning_rate", [&](auto& c) { c.learning_rate = nan; }},
      {"learning_rate", [&](auto& c) { c.learning_rate = inf; }},
      {"momentum", [](auto& c) { c.momentum = 1.0f; }},
      {"momentum", [](auto& c) { c.momentum = -0.1f; }},
      {"momentum", [&](auto& c) { c.momentum = nan; }},
      {"weight_decay", [](auto& c) { c.weight_decay = -1e-4f; }},
      {"rescale_grad", [](auto& c) { c.rescale_grad = 0.0f; }},
      {"rescale_grad", [&](auto& c) { c.rescale_grad = inf; }},
      {"clip_gradient", [&](auto& c) { c.clip_gradient = nan; }},
      {"beta1", [](auto& c) { c.beta1 = 1.0f; }},
      {"beta1", [](auto& c) { c.beta1 = -0.5f; }},
      {"beta2", [](auto& c) { c.beta2 = 1.5f; }},
      {"epsilon", [](auto& c) { c.epsilon = 0.0f; }},
      {"epsilon", [](auto& c) { c.epsilon = -1e-8f; }},
  };
  for (const auto& tc : cases) {
    ps::OptimizerConfig c;
    tc.set(c);
    INFO("field " << tc.field);
    REQUIRE_THROWS_AS(ps::ValidateOptimizerConfig(c), ps::Error);
    REQUIRE_THROWS_WITH(ps::MakeOptimizer(c), Contains(tc.field));
  }
  // Valid edge values pass.
  ps::OptimizerConfig ok;
  ok.learning_rate = 0.0f;
  ok.momentum = 0.0f;
  ok.clip_gradient = 0.0f;
  ok.beta1 = 0.0f;
  ok.beta2 = 0.0f;
  for (const char* name : {"sgd", "nag", "adam", "adagrad", "rmsprop"}) {
    ok.name = name;
    REQUIRE_NOTHROW(ps::MakeOptimizer(ok));
  }
  REQUIRE_THROWS_WITH(ps::MakeOptimizer(Config("lamb")),
                      Contains("sgd") && Contains("nag") && Contains("adam") &&
                          Contains("adagrad") && Contains("rmsprop"));
}

TEST_CASE("AddInto sums the supported dtypes", "[optimizer][addinto]") {
  SECTION("float32, threaded equals single-threaded") {
    const std::size_t n = 300001;
    const Vec src = RandomVec(n, 3, -1.0f, 1.0f);
    Vec a = RandomVec(n, 4, -1.0f, 1.0f);
    Vec b = a;
    ps::AddInto(a.data(), src.data(), n, SingleThread());
    ps::AddInto(b.data(), src.data(), n, ForceThreads());
    REQUIRE(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
    const Vec orig = RandomVec(n, 4, -1.0f, 1.0f);
    for (std::size_t i = 0; i < n; i += 9973) REQUIRE(a[i] == orig[i] + src[i]);
  }
  SECTION("float64") {
    std::vector<double> acc{1.5, 2.5}, src{0.25, -3.0};
    ps::AddInto(ps::DType::kFloat64, acc.data(), src.data(), 2);
    REQUIRE(acc == std::vector<double>{1.75, -0.5});
  }
  SECTION("int32 wraps instead of overflowing") {
    std::vector<std::int32_t> acc{std::numeric_limits<std::int32_t>::max(), -5};
    std::vector<std::int32_t> src{1, 7};
    ps::AddInto(ps::DType::kInt32, acc.data(), src.data(), 2);
    REQUIRE(acc == std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), 2});
  }
  SECTION("int64") {
    std::vector<std::int64_t> acc{1LL << 40, 3}, src{1LL << 40, -4};
    ps::AddInto(ps::DType::kInt64, acc.data(), src.data(), 2);
    REQUIRE(acc == std::vector<std::int64_t>{1LL << 41, -1});
  }
  SECTION("other dtypes are rejected by name") {
    std::vector<std::uint8_t> acc(4), src(4);
    REQUIRE_THROWS_WITH(ps::AddInto(ps::DType::kUInt8, acc.data(), src.data(), 4),
                        Contains("uint8"));
    REQUIRE_THROWS_WITH(ps::AddInto(ps::DType::kFloat16, acc.data(), src.data(), 2),
                        Contains("float16"));
  }
  SECTION("overlap is rejected") {
    Vec a(8, 1.0f);
    REQUIRE_THROWS_WITH(ps::AddInto(a.data(), a.data() + 1, 4), Contains("overlap"));
  }
}

TEST_CASE("CopyInto copies big buffers over threads", "[optimizer][addinto]") {
  const std::size_t n = 500003;
  const Vec src = RandomVec(n, 8, -1.0f, 1.0f);
  Vec dst(n, 0.0f);
  ps::CopyInto(dst.data(), src.data(), n * sizeof(float), ForceThreads());
  REQUIRE(dst == src);
}

TEST_CASE("ParallelFor covers the range once with aligned chunks", "[optimizer][threads]") {
  const std::size_t n = 100003;
  std::vector<int> hits(n, 0);
  std::mutex mu;
  std::vector<std::pair<std::size_t, std::size_t>> chunks;
  ps::ParallelFor(n, ForceThreads(), [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) ++hits[i];
    std::lock_guard lock(mu);
    chunks.emplace_back(b, e);
  });
  REQUIRE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  REQUIRE(chunks.size() == 4);
  for (const auto& [b, e] : chunks) REQUIRE(b % 16 == 0);
}

TEST_CASE("a ParallelPool runs many calls exactly, from several threads, and its updates match",
          "[optimizer][threads]") {
  ps::ParallelPool pool(3);
  REQUIRE(pool.helpers() == 3);
  ps::ParallelOptions options = ForceThreads();
  options.pool = &pool;
  REQUIRE(ps::ParallelThreads(100003, options) == 4);
  // Many calls in a row, from two threads at once: every element is covered exactly once.
  const auto cover = [&](std::size_t n) {
    std::vector<int> hits(n, 0);
    ps::ParallelFor(n, options, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) ++hits[i];
    });
    return std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; });
  };
  bool other_ok = true;
  std::thread other([&] {
    for (int call = 0; call < 200; ++call) other_ok = cover(4096 + 17 * call) && other_ok;
  });
  bool ok = true;
  for (int call = 0; call < 200; ++call) ok = cover(100003 - 13 * call) && ok;
  other.join();
  CHECK(ok);
  CHECK(other_ok);
  // The pool's optimizer updates are the single-threaded ones, bit for bit.
  ps::OptimizerConfig c = Config("sgd");
  c.momentum = 0.9f;
  auto single = ps::MakeOptimizer(c, SingleThread());
  auto pooled = ps::MakeOptimizer(c, options);
  const std::size_t n = (1u << 18) + 5;
  Vec w1 = RandomVec(n, 7, -1.0f, 1.0f);
  Vec w2 = w1;
  for (int t = 0; t < 3; ++t) {
    const Vec g = RandomVec(n, 70 + t, -2.0f, 2.0f);
    single->Update(1, w1.data(), g.data(), n);
    pooled->Update(1, w2.data(), g.data(), n);
  }
  CHECK(std::memcmp(w1.data(), w2.data(), n * sizeof(float)) == 0);
}

TEST_CASE("a ParallelPool call whose own chunk throws still waits for its helpers",
          "[optimizer][threads]") {
  ps::ParallelPool pool(2);
  ps::ParallelOptions options = ForceThreads();
  options.pool = &pool;
  std::vector<int> hits(30000, 0);
  REQUIRE_THROWS_AS(ps::ParallelFor(hits.size(), options,
                                    [&](std::size_t b, std::size_t e) {
                                      if (b == 0) throw std::runtime_error("chunk 0");
                                      for (std::size_t i = b; i < e; ++i) ++hits[i];
                                    }),
                    std::runtime_error);
  // The pool serves the next call normally.
  std::vector<int> again(30000, 0);
  ps::ParallelFor(again.size(), options, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) ++again[i];
  });
  CHECK(std::all_of(again.begin(), again.end(), [](int h) { return h == 1; }));
}

TEST_CASE("concurrent updates of distinct and shared states", "[optimizer][threads]") {
  ps::OptimizerConfig c = Config("sgd");
  c.learning_rate = 1.0f;
  auto opt = ps::MakeOptimizer(c);
  constexpr int kThreads = 4;
  constexpr int kSteps = 200;
  std::vector<Vec> weights(kThreads, Vec(64, 0.0f));
  Vec shared(64, 0.0f);
  const Vec g(64, 1.0f);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int s = 0; s < kSteps; ++s) {
          opt->Update(static_cast<std::uint64_t>(t), weights[t].data(), g.data(), 64);
          // One state id shared by all threads: its lock serializes the updates.
          opt->Update(99, shared.data(), g.data(), 64);
        }
      });
    }
  }
  for (const Vec& w : weights) REQUIRE(w == Vec(64, -static_cast<float>(kSteps)));
  for (int t = 0; t < kThreads; ++t) REQUIRE(opt->UpdateCount(t) == kSteps);
  REQUIRE(shared == Vec(64, -static_cast<float>(kThreads * kSteps)));
  REQUIRE(opt->UpdateCount(99) == kThreads * kSteps);
}

// Not run by ctest (hidden tag): the server's aggregation + update speed target. Run with
//   test_optimizer "[.perf]" -s
TEST_CASE("perf: sum 4 x 16 MB pushes and apply sgd momentum", "[.perf]") {
  const std::size_t n = 4u << 20;  // 16 MB of floats
  std::vector<Vec> pushes;
  for (int i = 0; i < 4; ++i) pushes.push_back(RandomVec(n, 20 + i, -1.0f, 1.0f));
  Vec acc(n), w = RandomVec(n, 9, -1.0f, 1.0f), dst(n);
  ps::OptimizerConfig c = Config("sgd");
  c.momentum = 0.9f;
  auto opt = ps::MakeOptimizer(c);
  using Clock = std::chrono::steady_clock;
  auto best = [](auto&& fn) {
    double best_s = 1e9;
    for (int rep = 0; rep < 7; ++rep) {
      const auto t0 = Clock::now();
      fn();
      best_s = std::min(best_s, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best_s;
  };
  const double memcpy_s = best([&] { std::memcpy(dst.data(), pushes[0].data(), n * 4); });
  const double agg_s = best([&] {
    ps::CopyInto(acc.data(), pushes[0].data(), n * 4);
    for (int i = 1; i < 4; ++i) ps::AddInto(acc.data(), pushes[i].data(), n);
    opt->Update(1, w.data(), acc.data(), n);
  });
  // Bytes moved: copy 2x16, three adds 3x(3x16), sgd-mom read w,g,mom + write w,mom 5x16 MB.
  const double mb = 16.0;
  const double memcpy_bw = 2 * mb / memcpy_s;
  const double agg_bw = (2 + 9 + 5) * mb / agg_s;
  std::cout << "threads " << ps::ParallelThreads(n, {}) << ": memcpy 16 MB " << memcpy_s * 1e3
            << " ms (" << memcpy_bw << " MB/s); sum 4 + sgd-mom " << agg_s * 1e3 << " ms ("
            << agg_bw << " MB/s) = " << agg_bw / memcpy_bw << "x memcpy bandwidth\n";
  CHECK(agg_bw >= 0.5 * memcpy_bw);
}

TEST_CASE("nag exact values for two hand-computed steps", "[optimizer]") {
  // momentum 0.5, lr 0.1, wd 0.1, w = 1, g = 2 (rescale 1, no clip):
  // step 1: g' = 2 + 0.1*1 = 2.1; mom = 0.5*0 + 2.1 = 2.1; w = 1 - 0.1*(2.1 + 0.5*2.1) = 0.685
  // step 2: g' = 2 + 0.1*0.685 = 2.0685; mom = 1.05 + 2.0685 = 3.1185;
  //         w = 0.685 - 0.1*(2.0685 + 1.55925) = 0.3222250
  ps::OptimizerConfig c;
  c.name = "nag";
  c.learning_rate = 0.1f;
  c.momentum = 0.5f;
  c.weight_decay = 0.1f;
  auto opt = ps::MakeOptimizer(c, SingleThread());
  float w = 1.0f;
  const float g = 2.0f;
  opt->Update(1, &w, &g, 1);
  CHECK(w == Approx(0.685f).epsilon(1e-6));
  opt->Update(1, &w, &g, 1);
  CHECK(w == Approx(0.322225f).epsilon(1e-6));
  // Without momentum, NAG is plain SGD: w = (1 - lr*wd)*w - lr*g.
  c.momentum = 0.0f;
  auto plain = ps::MakeOptimizer(c, SingleThread());
  float v = 1.0f;
  plain->Update(1, &v, &g, 1);
  CHECK(v == Approx(0.99f - 0.2f).epsilon(1e-6));
}

TEST_CASE("rmsprop exact values for two hand-computed steps", "[optimizer]") {
  // rho 0.9, lr 0.01, eps 1e-8, wd 0, w = 1, g = 2:
  // step 1: n = 0.1*4 = 0.4; w = 1 - 0.01*2/sqrt(0.4) = 0.96837722
  // step 2: n = 0.1*4 + 0.9*0.4 = 0.76; w = 0.96837722 - 0.01*2/sqrt(0.76) = 0.94543568
  ps::OptimizerConfig c;
  c.name = "rmsprop";
  c.learning_rate = 0.01f;
  c.rho = 0.9f;
  auto opt = ps::MakeOptimizer(c, SingleThread());
  float w = 1.0f;
  const float g = 2.0f;
  opt->Update(1, &w, &g, 1);
  CHECK(w == Approx(0.96837722f).epsilon(1e-6));
  opt->Update(1, &w, &g, 1);
  CHECK(w == Approx(0.94543568f).epsilon(1e-6));
}

TEST_CASE("learning-rate schedules give MXNet's rates, update by update", "[optimizer][schedule]") {
  ps::OptimizerConfig c;
  c.learning_rate = 1.0f;
  // factor: halves after every 2 updates, never below 0.2.
  c.schedule.type = "factor";
  c.schedule.step = 2;
  c.schedule.factor = 0.5f;
  c.schedule.stop_factor_lr = 0.2f;
  const std::vector<float> factor{1.0f, 1.0f, 0.5f, 0.5f, 0.25f, 0.25f, 0.2f, 0.2f};
  for (std::size_t t = 1; t <= factor.size(); ++t) {
    INFO("update " << t);
    CHECK(ps::LearningRateAt(c, t) == Approx(factor[t - 1]));
  }
  // multifactor: x0.1 after updates 3 and 5.
  c.schedule = {};
  c.schedule.type = "multifactor";
  c.schedule.steps = {3, 5};
  c.schedule.factor = 0.1f;
  const std::vector<float> multi{1.0f, 1.0f, 1.0f, 0.1f, 0.1f, 0.01f, 0.01f};
  for (std::size_t t = 1; t <= multi.size(); ++t) {
    INFO("update " << t);
    CHECK(ps::LearningRateAt(c, t) == Approx(multi[t - 1]));
  }
  // cosine with a linear warm-up: 0 -> 1 over 4 updates, then down to 0 at update 8.
  // t = 1..3: 0.25 t; t = 4: 1; t = 6: (1 + cos(pi/2))/2 = 0.5; t = 8 and later: 0.
  c.schedule = {};
  c.schedule.type = "cosine";
  c.schedule.warmup_steps = 4;
  c.schedule.max_update = 8;
  const std::vector<float> cosine{0.25f, 0.5f,       0.75f, 1.0f, 0.8535534f,
                                  0.5f,  0.1464466f, 0.0f,  0.0f};
  for (std::size_t t = 1; t <= cosine.size(); ++t) {
    INFO("update " << t);
    CHECK(ps::LearningRateAt(c, t) == Approx(cosine[t - 1]).margin(1e-6));
  }
}

TEST_CASE("a scheduled sgd step uses the rate of its own update count", "[optimizer][schedule]") {
  ps::OptimizerConfig c;
  c.learning_rate = 1.0f;
  c.schedule.type = "factor";
  c.schedule.step = 1;
  c.schedule.factor = 0.5f;
  auto opt = ps::MakeOptimizer(c, SingleThread());
  float w = 0.0f;
  const float g = 1.0f;
  opt->Update(1, &w, &g, 1);  // lr 1
  opt->Update(1, &w, &g, 1);  // lr 0.5
  opt->Update(1, &w, &g, 1);  // lr 0.25
  CHECK(w == -1.75f);
}

TEST_CASE("schedule validation names the field", "[optimizer][config]") {
  ps::OptimizerConfig c;
  c.schedule.type = "step";
  CHECK_THROWS_WITH(ps::ValidateOptimizerConfig(c), Contains("schedule.type = 'step' is unknown"));
  c.schedule.type = "factor";
  c.schedule.factor = 0.5f;
  CHECK_THROWS_WITH(ps::ValidateOptimizerConfig(c), Contains("schedule.step must be >= 1"));
  c.schedule.type = "multifactor";
  c.schedule.steps = {5, 3};
  CHECK_THROWS_WITH(ps::ValidateOptimizerConfig(c), Contains("schedule.steps must be increasing"));
  c.schedule = {};
  c.schedule.type = "cosine";
  c.schedule.warmup_steps = 10;
  c.schedule.max_update = 10;
  CHECK_THROWS_WITH(ps::ValidateOptimizerConfig(c),
                    Contains("schedule.max_update (10) must be larger than warmup_steps (10)"));
  c.schedule = {};
  c.name = "rmsprop";
  c.rho = 1.0f;
  CHECK_THROWS_WITH(ps::ValidateOptimizerConfig(c), Contains("rho"));
}
