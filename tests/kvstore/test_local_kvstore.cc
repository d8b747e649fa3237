// LocalKVStore ("local"): exact values, the optimizer path, every user error, concurrency.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kvstore/local_kvstore.h"
#include "kvstore/optimizer.h"
#include "ps/config.h"
#include "ps/kvstore.h"

namespace {

using Catch::Matchers::Contains;
using Vec = std::vector<float>;

std::unique_ptr<ps::KVStore> MakeLocal() { return ps::KVStore::Create("local"); }

}  // namespace

TEST_CASE("Create picks the local store and rejects unknown types", "[kvstore][local]") {
  auto kv = MakeLocal();
  REQUIRE(kv->Type() == "local");
  REQUIRE(kv->Rank() == 0);
  REQUIRE(kv->NumWorkers() == 1);
  REQUIRE_NOTHROW(kv->Barrier());
  REQUIRE_NOTHROW(kv->WaitAll());
  REQUIRE_THROWS_WITH(ps::KVStore::Create("dist_foo"), Contains("dist_foo") && Contains("local") &&
                                                           Contains("dist_sync") &&
                                                           Contains("dist_async"));
  REQUIRE_THROWS_AS(ps::KVStore::Create("device"), ps::Error);
}

TEST_CASE("Create refuses a local store in a process launched as a server or the scheduler",
          "[kvstore][local]") {
  // As launch.py --same-cmd-for-all-roles starts the program for every role: a local store
  // there would train alone, unseen by the job.
  const char* before = std::getenv("DMLC_ROLE");
  const std::string saved = before != nullptr ? before : "";
  for (const char* role : {"server", "scheduler"}) {
    INFO(role);
    ::setenv("DMLC_ROLE", role, 1);
    REQUIRE_THROWS_WITH(ps::KVStore::Create("local"),
                        Contains("type 'local'") && Contains(std::string("DMLC_ROLE=") + role) &&
                            Contains("Create a dist_sync or dist_async store"));
  }
  ::setenv("DMLC_ROLE", "worker", 1);
  CHECK(ps::KVStore::Create("local")->Type() == "local");
  if (before != nullptr) {
    ::setenv("DMLC_ROLE", saved.c_str(), 1);
  } else {
    ::unsetenv("DMLC_ROLE");
  }
  ps::ClusterConfig config;
  config.role = ps::Role::kServer;
  REQUIRE_THROWS_WITH(ps::KVStore::Create("local", config), Contains("DMLC_ROLE=server"));
  config.role = ps::Role::kWorker;
  CHECK(ps::KVStore::Create("local", config)->Type() == "local");
}

TEST_CASE("init, push and pull move exact values", "[kvstore][local]") {
  auto kv = MakeLocal();
  Vec init{1.0f, 2.0f, 3.0f};
  kv->Init(3, ps::Tensor(init.data(), init.size()));
  init[0] = 100.0f;  // the store holds a copy
  Vec out(3, 0.0f);
  kv->Pull(3, ps::Tensor(out.data(), out.size()));
  REQUIRE(out == Vec{1.0f, 2.0f, 3.0f});

  // No optimizer: the stored value becomes the pushed value (dist_sync with one worker).
  Vec pushed{-1.5f, 0.25f, 7.0f};
  kv->Push(3, ps::Tensor(pushed.data(), pushed.size()));
  kv->WaitAll();
  kv->Pull(3, ps::Tensor(out.data(), out.size()));
  REQUIRE(out == pushed);

  SECTION("PushPull returns the pushed value") {
    Vec g{9.0f, 8.0f, 7.0f}, o(3);
    kv->PushPull(3, ps::Tensor(g.data(), 3), ps::Tensor(o.data(), 3));
    REQUIRE(o == g);
  }
  SECTION("PushPull in place (same buffer for grad and out)") {
    Vec g{4.0f, 5.0f, 6.0f};
    kv->PushPull(3, ps::Tensor(g.data(), 3), ps::Tensor(g.data(), 3));
    REQUIRE(g == Vec{4.0f, 5.0f, 6.0f});
  }
}

TEST_CASE("several keys and dtypes in one call", "[kvstore][local]") {
  auto kv = MakeLocal();
  std::vector<double> d{1.25, -2.5};
  std::vector<std::int32_t> i32{1, -2, 3};
  std::vector<std::int64_t> i64{1LL << 40};
  Vec f{0.5f};
  kv->Init({10, 11, 12, 13}, {ps::Tensor(d.data(), 2), ps::Tensor(i32.data(), 3),
                              ps::Tensor(i64.data(), 1), ps::Tensor(f.data(), 1)});
  std::vector<double> d2{3.0, 4.0};
  std::vector<std::int32_t> i32b{7, 8, 9};
  kv->Push({10, 11}, {ps::Tensor(d2.data(), 2), ps::Tensor(i32b.data(), 3)});
  std::vector<double> d_out(2);
  std::vector<std::int32_t> i32_out(3);
  std::vector<std::int64_t> i64_out(1);
  Vec f_out(1);
  kv->Pull({10, 11, 12, 13}, {ps::Tensor(d_out.data(), 2), ps::Tensor(i32_out.data(), 3),
                              ps::Tensor(i64_out.data(), 1), ps::Tensor(f_out.data(), 1)});
  REQUIRE(d_out == d2);
  REQUIRE(i32_out == i32b);
  REQUIRE(i64_out == i64);
  REQUIRE(f_out == f);

  SECTION("the same key twice in one Pull is refused, as by dist stores") {
    std::vector<double> a(2), b(2);
    REQUIRE_THROWS_WITH(kv->Pull({10, 10}, {ps::Tensor(a.data(), 2), ps::Tensor(b.data(), 2)}),
                        Contains("Pull key 10: given twice in one call"));
  }
}

TEST_CASE("the same key twice in one Push is refused and changes nothing", "[kvstore][local]") {
  // As by the dist stores, whose servers would count the repeat as a second worker's push.
  auto kv = MakeLocal();
  std::vector<std::int64_t> v{0, 0};
  kv->Init(5, ps::Tensor(v.data(), 2));
  std::vector<std::int64_t> a{1, 2}, b{10, 20}, c{100, 200};
  REQUIRE_THROWS_WITH(kv->Push({5, 5, 5}, {ps::Tensor(a.data(), 2), ps::Tensor(b.data(), 2),
                                           ps::Tensor(c.data(), 2)}),
                      Contains("Push key 5: given twice in one call"));
  std::vector<std::int64_t> out(2);
  kv->Pull(5, ps::Tensor(out.data(), 2));
  REQUIRE(out == std::vector<std::int64_t>{0, 0});
}

TEST_CASE("the optimizer is applied on push", "[kvstore][local][optimizer]") {
  auto kv = MakeLocal();
  Vec w{1.0f, -2.0f, 0.5f, 4.0f};
  kv->Init(1, ps::Tensor(w.data(), w.size()));

  SECTION("sgd, exactly representable values") {
    ps::OptimizerConfig c;
    c.name = "sgd";
    c.learning_rate = 0.5f;
    kv->SetOptimizer(c);
    Vec g{1.0f, 1.0f, -1.0f, 2.0f};
    Vec out(4);
    kv->PushPull(1, ps::Tensor(g.data(), 4), ps::Tensor(out.data(), 4));
    REQUIRE(out == Vec{0.5f, -2.5f, 1.0f, 3.0f});
  }

  SECTION("adam with momentum state, same as a standalone optimizer") {
    ps::OptimizerConfig c;
    c.name = "adam";
    c.learning_rate = 0.01f;
    c.weight_decay = 0.001f;
    kv->SetOptimizer(c);
    auto ref = ps::MakeOptimizer(c);
    Vec w_ref = w;
    for (int step = 0; step < 5; ++step) {
      Vec g{0.1f * step, -0.3f, 2.0f, -1.0f + step};
      kv->Push(1, ps::Tensor(g.data(), 4));
      ref->Update(1, w_ref.data(), g.data(), 4);
    }
    Vec out(4);
    kv->Pull(1, ps::Tensor(out.data(), 4));
    REQUIRE(out == w_ref);
  }

  SECTION("a new optimizer starts with fresh state") {
    ps::OptimizerConfig c;
    c.name = "sgd";
    c.learning_rate = 1.0f;
    c.momentum = 0.5f;
    kv->SetOptimizer(c);
    Vec g{1.0f, 1.0f, 1.0f, 1.0f};
    kv->Push(1, ps::Tensor(g.data(), 4));  // mom = -1
    kv->SetOptimizer(c);                   // mom reset to 0
    kv->Push(1, ps::Tensor(g.data(), 4));  // mom = -1 again (not -1.5)
    Vec out(4);
    kv->Pull(1, ps::Tensor(out.data(), 4));
    REQUIRE(out == Vec{-1.0f, -4.0f, -1.5f, 2.0f});
  }

  SECTION("an invalid config is rejected and the old optimizer kept") {
    ps::OptimizerConfig c;
    c.learning_rate = 1.0f;
    kv->SetOptimizer(c);
    ps::OptimizerConfig bad;
    bad.momentum = 1.5f;
    REQUIRE_THROWS_WITH(kv->SetOptimizer(bad), Contains("momentum"));
    Vec g{1.0f, 1.0f, 1.0f, 1.0f};
    Vec out(4);
    kv->PushPull(1, ps::Tensor(g.data(), 4), ps::Tensor(out.data(), 4));
    REQUIRE(out == Vec{0.0f, -3.0f, -0.5f, 3.0f});
  }
}

TEST_CASE("user errors name the key, the expected and the given value", "[kvstore][local]") {
  auto kv = MakeLocal();
  Vec w{1.0f, 2.0f, 3.0f};
  kv->Init(7, ps::Tensor(w.data(), 3));
  Vec w8{5.0f};
  kv->Init(8, ps::Tensor(w8.data(), 1));

  SECTION("double init") {
    REQUIRE_THROWS_WITH(kv->Init(7, ps::Tensor(w.data(), 3)),
                        Contains("key 7") && Contains("already initialized"));
    Vec a{1.0f};
    REQUIRE_THROWS_WITH(kv->Init({20, 20}, {ps::Tensor(a.data(), 1), ps::Tensor(a.data(), 1)}),
                        Contains("key 20") && Contains("twice"));
  }
  SECTION("unknown key") {
    Vec x(3);
    REQUIRE_THROWS_WITH(kv->Push(99, ps::Tensor(x.data(), 3)),
                        Contains("Push") && Contains("key 99") && Contains("unknown key"));
    REQUIRE_THROWS_WITH(kv->Pull(98, ps::Tensor(x.data(), 3)),
                        Contains("Pull") && Contains("key 98") && Contains("unknown key"));
  }
  SECTION("size mismatch") {
    Vec x(4);
    REQUIRE_THROWS_WITH(kv->Push(7, ps::Tensor(x.data(), 4)),
                        Contains("key 7") && Contains("size mismatch") && Contains("expected 3") &&
                            Contains("given 4"));
    REQUIRE_THROWS_WITH(kv->Pull(7, ps::Tensor(x.data(), 2)),
                        Contains("key 7") && Contains("expected 3") && Contains("given 2"));
  }
  SECTION("dtype mismatch") {
    std::vector<double> x(3);
    REQUIRE_THROWS_WITH(kv->Push(7, ps::Tensor(x.data(), 3)),
                        Contains("key 7") && Contains("dtype mismatch") &&
                            Contains("expected float32") && Contains("given float64"));
    std::vector<std::int32_t> y(3);
    REQUIRE_THROWS_WITH(kv->Pull(7, ps::Tensor(y.data(), 3)), Contains("key 7") &&
                                                                  Contains("expected float32") &&
                                                                  Contains("given int32"));
  }
  SECTION("keys and tensors of different counts") {
    Vec x(3);
    REQUIRE_THROWS_WITH(kv->Push(std::vector<ps::Key>{7, 8}, {ps::Tensor(x.data(), 3)}),
                        Contains("2 keys but 1 tensors"));
  }
  SECTION("unsupported and invalid tensors") {
    std::vector<std::uint8_t> bytes(4);
    REQUIRE_THROWS_WITH(kv->Init(30, ps::Tensor(bytes.data(), 4, ps::DType::kUInt8)),
                        Contains("key 30") && Contains("uint8"));
    // A GPU that does not exist: without CUDA in the build the checks refuse it, with CUDA the
    // copy fails; either way the error names the key and the device, and nothing changes.
    Vec x(3, 100.0f);
    const ps::Device missing = ps::Device::CUDA(99);
    REQUIRE_THROWS_WITH(kv->Push(7, ps::Tensor(x.data(), 3, ps::DType::kFloat32, missing)),
                        Contains("Push key 7") && Contains("cuda:99"));
    // On a machine without a driver CUDA speaks of the driver's version: the message says
    // what that means (a CUDA build here; elsewhere the refusal or the device count).
    try {
      kv->Push(7, ps::Tensor(x.data(), 3, ps::DType::kFloat32, missing));
    } catch (const ps::Error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK((what.find("driver version is insufficient") == std::string::npos ||
             what.find("no NVIDIA driver is loaded on this machine") != std::string::npos));
      // The store and the call are named once, at the front.
      CHECK(what.rfind("local kvstore: Push key 7: ", 0) == 0);
      CHECK(what.find("KVStore") == std::string::npos);
    }
    REQUIRE_THROWS_WITH(kv->PushPull(7, ps::Tensor(x.data(), 3),
                                     ps::Tensor(x.data(), 3, ps::DType::kFloat32, missing)),
                        Contains("key 7") && Contains("cuda:99"));
    REQUIRE_THROWS_WITH(kv->Init(31, ps::Tensor(x.data(), 3, ps::DType::kFloat32, missing)),
                        Contains("Init key 31") && Contains("cuda:99"));
    REQUIRE_THROWS_WITH(kv->Pull(31, ps::Tensor(x.data(), 3)), Contains("unknown key"));
    Vec out(3);
    kv->Pull(7, ps::Tensor(out.data(), 3));
    REQUIRE(out == w);
    REQUIRE_THROWS_WITH(kv->Pull(7, ps::Tensor(nullptr, 3, ps::DType::kFloat32)),
                        Contains("key 7") && Contains("null"));
    // Sizes no buffer has (-1, a size that wraps around in bytes, one past the memory).
    for (const std::size_t size : {SIZE_MAX, std::size_t{1} << 62, std::size_t{1} << 45}) {
      INFO(size);
      REQUIRE_THROWS_WITH(kv->Init(32, ps::Tensor(x.data(), size)),
                          Contains("Init key 32: a tensor of " + std::to_string(size) +
                                   " float32 elements is larger than this machine's memory") &&
                              Contains("pass the tensor's element count"));
      REQUIRE_THROWS_WITH(kv->Push(7, ps::Tensor(x.data(), size)), Contains("is larger than"));
    }
    REQUIRE_THROWS_WITH(kv->Pull(32, ps::Tensor(x.data(), 3)), Contains("unknown key"));
  }
  SECTION("optimizer on a non-float32 key") {
    std::vector<std::int32_t> iv{1, 2};
    kv->Init(40, ps::Tensor(iv.data(), 2));
    kv->SetOptimizer(ps::OptimizerConfig{});
    REQUIRE_THROWS_WITH(kv->Push(40, ps::Tensor(iv.data(), 2)),
                        Contains("key 40") && Contains("float32 keys only") && Contains("int32"));
  }
  SECTION("a failing call changes nothing") {
    Vec good{9.0f, 9.0f, 9.0f};
    Vec bad(2);
    REQUIRE_THROWS_AS(kv->Push({7, 8}, {ps::Tensor(good.data(), 3), ps::Tensor(bad.data(), 2)}),
                      ps::Error);
    Vec out(3);
    kv->Pull(7, ps::Tensor(out.data(), 3));
    REQUIRE(out == w);
    // A failing Init stores none of its keys.
    Vec a{1.0f};
    REQUIRE_THROWS_AS(kv->Init({21, 7}, {ps::Tensor(a.data(), 1), ps::Tensor(a.data(), 1)}),
                      ps::Error);
    REQUIRE_THROWS_WITH(kv->Pull(21, ps::Tensor(a.data(), 1)), Contains("unknown key"));
    // A failing PushPull (bad pull side) does not push.
    Vec pushed{0.0f, 0.0f, 0.0f};
    Vec wrong_out(5);
    REQUIRE_THROWS_AS(
        kv->PushPull(7, ps::Tensor(pushed.data(), 3), ps::Tensor(wrong_out.data(), 5)), ps::Error);
    kv->Pull(7, ps::Tensor(out.data(), 3));
    REQUIRE(out == w);
  }
}

TEST_CASE("concurrent pushes and pulls on distinct keys", "[kvstore][local][threads]") {
  constexpr int kThreads = 4;
  constexpr int kSteps = 300;
  constexpr std::size_t kLen = 1000;
  auto kv = MakeLocal();
  for (int t = 0; t < kThreads; ++t) {
    Vec init(kLen, static_cast<float>(t));
    kv->Init(static_cast<ps::Key>(t), ps::Tensor(init.data(), kLen));
  }

  SECTION("no optimizer: every pull sees this thread's last push") {
    std::vector<int> mismatches(kThreads, 0);
    {
      std::vector<std::jthread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          Vec v(kLen), out(kLen);
          for (int s = 0; s < kSteps; ++s) {
            for (std::size_t i = 0; i < kLen; ++i) v[i] = static_cast<float>(t * 100000 + s + i);
            kv->Push(static_cast<ps::Key>(t), ps::Tensor(v.data(), kLen));
            kv->Pull(static_cast<ps::Key>(t), ps::Tensor(out.data(), kLen));
            if (out != v) ++mismatches[t];
          }
        });
      }
    }
    REQUIRE(mismatches == std::vector<int>(kThreads, 0));
  }

  SECTION("sgd: every push is applied exactly once") {
    ps::OptimizerConfig c;
    c.learning_rate = 1.0f;
    kv->SetOptimizer(c);
    {
      std::vector<std::jthread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          Vec g(kLen, 1.0f);
          Vec out(kLen);
          for (int s = 0; s < kSteps; ++s) {
            kv->PushPull(static_cast<ps::Key>(t), ps::Tensor(g.data(), kLen),
                         ps::Tensor(out.data(), kLen));
          }
        });
      }
    }
    for (int t = 0; t < kThreads; ++t) {
      Vec out(kLen);
      kv->Pull(static_cast<ps::Key>(t), ps::Tensor(out.data(), kLen));
      REQUIRE(out == Vec(kLen, static_cast<float>(t - kSteps)));
    }
  }
}

TEST_CASE("the local store constructed directly takes parallel options", "[kvstore][local]") {
  ps::ParallelOptions p;
  p.min_parallel_elements = 64;
  p.max_threads = 3;
  ps::LocalKVStore kv(p);
  ps::OptimizerConfig c;
  c.name = "adagrad";
  kv.SetOptimizer(c);
  Vec w(5000, 1.0f), g(5000, 0.5f), out(5000);
  kv.Init(1, ps::Tensor(w.data(), w.size()));
  kv.PushPull(1, ps::Tensor(g.data(), g.size()), ps::Tensor(out.data(), out.size()));
  auto ref = ps::MakeOptimizer(c);
  ref->Update(1, w.data(), g.data(), w.size());
  REQUIRE(out == w);
}
