// dist_sync and dist_async over the real ps-server and ps-scheduler processes, with exact
// values (integer-valued gradients keep float sums exact).
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <thread>

#include "kvstore/dist/key_layout.h"
#include "kvstore/dist/shm_slots.h"
#include "tests/kvstore/kv_cluster.h"
#include "tests/kvstore/kv_rounds.h"

namespace {

using ps::test::AllOk;
using ps::test::ErrorOf;
using ps::test::Expect;
using ps::test::Has;
using ps::test::KeySizes;
using ps::test::KVCluster;
using ps::test::SyncSumRounds;
using namespace std::chrono_literals;

}  // namespace

TEST_CASE("dist_sync: exact sums for 1 to 4 workers over 1 to 3 servers with a chunked key",
          "[dist]") {
  const auto shape =
      GENERATE(std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}, std::pair{3, 3}, std::pair{4, 3});
  const auto [workers, servers] = shape;
  INFO(workers << " workers, " << servers << " servers");
  // The 2501-element key is sliced over all servers, in chunks of at most 1024 floats: several
  // messages per server, pipelined.
  KVCluster cluster(servers, workers,
                    {{"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"}, {"PS_CHUNK_BYTES", "4096"}});
  const auto sizes = KeySizes(10, 33, 2501);
  const auto outcomes = cluster.RunWorkers(
      "dist_sync", [&](ps::KVStore& kv) { SyncSumRounds(kv, sizes, 5, workers % 2 == 0); });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: zero-length keys work beside others with replicas", "[dist]") {
  // As on `local` and one server: an empty key is a key. With 2 servers each slice also goes
  // to a replica, which must take an empty copy too (and no server may die of it).
  const std::string type = GENERATE("dist_sync", "dist_async");
  INFO(type);
  KVCluster cluster(2, 2);
  const auto outcomes = cluster.RunWorkers(type, [&](ps::KVStore& kv) {
    std::vector<float> value(10, 1.0f);
    std::vector<float> grad(10, 2.0f);
    const std::vector<ps::Key> empty_keys{20, 21, 22, 23, 24, 25};
    kv.Init(empty_keys, std::vector<ps::Tensor>(empty_keys.size(), ps::Tensor(value.data(), 0)));
    kv.Init(1, ps::Tensor(value.data(), value.size()));
    ps::OptimizerConfig sgd;
    sgd.learning_rate = 1.0f;
    kv.SetOptimizer(sgd);
    for (const ps::Key key : empty_keys) {
      kv.PushPull(key, ps::Tensor(grad.data(), 0), ps::Tensor(value.data(), 0));
    }
    kv.PushPull(1, ps::Tensor(grad.data(), grad.size()), ps::Tensor(value.data(), value.size()));
    kv.WaitAll();
    kv.Barrier();
    kv.Pull(1, ps::Tensor(value.data(), value.size()));
    kv.WaitAll();
    // Both workers' pushes of 2 applied with learning rate 1 (dist_sync: their sum at once).
    Expect(value == std::vector<float>(10, 1.0f - 2 * 2.0f), "key 1 after both pushes");
  });
  CHECK(AllOk(outcomes) == "");
  for (auto& server : cluster.servers())
    CHECK_THAT(server->Output(), !Catch::Contains("malformed"));
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_sync: push then pull of the same key sees that round", "[dist]") {
  KVCluster cluster(2, 3);
  const auto outcomes = cluster.RunWorkers(
      "dist_sync", [&](ps::KVStore& kv) { SyncSumRounds(kv, KeySizes(3, 5, 0), 20, false); });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_async: every push is applied exactly once", "[dist]") {
  KVCluster cluster(2, 3, {{"MXNET_KVSTORE_BIGARRAY_BOUND", "100"}});
  constexpr int kRounds = 30;
  const auto outcomes = cluster.RunWorkers("dist_async", [&](ps::KVStore& kv) {
    std::vector<ps::Key> keys = {1, 2, 3};
    std::vector<std::vector<float>> values = {std::vector<float>(10, 0.0f),
                                              std::vector<float>(250, 0.0f),  // sliced
                                              std::vector<float>(1, 0.0f)};
    std::vector<ps::Tensor> views;
    for (auto& v : values) views.emplace_back(v.data(), v.size());
    kv.Init(keys, views);
    ps::OptimizerConfig sgd;
    sgd.learning_rate = 1.0f;
    kv.SetOptimizer(sgd);
    std::vector<std::vector<float>> grads;
    std::vector<ps::Tensor> grad_views;
    for (auto& v : values) grads.emplace_back(v.size(), static_cast<float>(kv.Rank() + 1));
    for (auto& g : grads) grad_views.emplace_back(g.data(), g.size());
    for (int round = 0; round < kRounds; ++round) kv.Push(keys, grad_views);
    kv.WaitAll();
    kv.Barrier();
    kv.Pull(keys, views);
    kv.WaitAll();
    const float expected = -static_cast<float>(kRounds * (1 + 2 + 3));
    for (const auto& v : values) Expect(v == std::vector<float>(v.size(), expected), "async sum");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_sync: server-side optimizers match a reference computed here", "[dist]") {
  const std::string name =
      GENERATE(std::string("sgd"), std::string("adam"), std::string("adagrad"));
  INFO(name);
  constexpr std::size_t kSize = 1500;  // sliced over both servers (bound 1000)
  constexpr int kRounds = 6;
  ps::OptimizerConfig config;
  config.name = name;
  config.learning_rate = 0.05f;
  config.momentum = name == "sgd" ? 0.9f : 0.0f;
  config.weight_decay = 0.01f;
  config.rescale_grad = 0.5f;
  config.clip_gradient = 2.0f;
  const auto gradient = [](int rank, int round, std::size_t i) {
    return static_cast<float>((static_cast<int>(i % 7) - 3) * (rank + 1) + round) * 0.25f;
  };
  const auto initial = [](std::size_t i) { return static_cast<float>(i % 11) * 0.1f - 0.5f; };

  // The reference: MXNet's update rules, in double, on the sum of both workers' gradients.
  std::vector<double> w(kSize), state1(kSize, 0.0), state2(kSize, 0.0);
  for (std::size_t i = 0; i < kSize; ++i) w[i] = initial(i);
  for (int round = 1; round <= kRounds; ++round) {
    for (std::size_t i = 0; i < kSize; ++i) {
      double g = (static_cast<double>(gradient(0, round, i)) + gradient(1, round, i)) *
                 config.rescale_grad;
      g = std::clamp(g, -2.0, 2.0);
      if (name == "sgd") {
        state1[i] = 0.9 * state1[i] - 0.05 * (g + 0.01 * w[i]);
        w[i] += state1[i];
      } else if (name == "adam") {
        g += 0.01 * w[i];
        state1[i] = 0.9 * state1[i] + 0.1 * g;
        state2[i] = 0.999 * state2[i] + 0.001 * g * g;
        const double lr_t =
            0.05 * std::sqrt(1 - std::pow(0.999, round)) / (1 - std::pow(0.9, round));
        w[i] -= lr_t * state1[i] / (std::sqrt(state2[i]) + 1e-8);
      } else {
        state1[i] += g * g;
        w[i] -= 0.05 * (g / (std::sqrt(state1[i]) + 1e-8) + 0.01 * w[i]);
      }
    }
  }

  KVCluster cluster(2, 2, {{"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"}});
  std::vector<float> result(kSize);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(kSize), grad(kSize);
    for (std::size_t i = 0; i < kSize; ++i) value[i] = initial(i);
    kv.Init(9, ps::Tensor(value.data(), kSize));
    kv.SetOptimizer(config);
    for (int round = 1; round <= kRounds; ++round) {
      for (std::size_t i = 0; i < kSize; ++i) grad[i] = gradient(kv.Rank(), round, i);
      kv.PushPull(9, ps::Tensor(grad.data(), kSize), ps::Tensor(value.data(), kSize));
      kv.WaitAll();
    }
    if (kv.Rank() == 0) result = value;
  });
  REQUIRE(AllOk(outcomes) == "");
  for (std::size_t i = 0; i < kSize; ++i) {
    INFO("element " << i);
    REQUIRE(result[i] == Approx(w[i]).epsilon(1e-4).margin(1e-5));
  }
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_sync: a value kept as a round's received sum updates right after SetOptimizer",
          "[dist]") {
  // Without an optimizer a server keeps a big round's sum as the received frame itself; an
  // optimizer set later must update that value (copy-on-write while a reply still references
  // it), and pulls issued right behind each push must see their own round's value.
  const std::string use_shm = GENERATE(std::string("0"), std::string("1"));
  INFO("PS_USE_SHM=" << use_shm);
  constexpr std::size_t kSize = 100000;  // 2 slices of 200 KB: frames of 64 KiB and more
  KVCluster cluster(2, 2, {{"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"}, {"PS_USE_SHM", use_shm}});
  const auto grad_of = [](int rank, int round, std::size_t i) {
    return static_cast<float>(static_cast<int>(i % 13) - 6 + 3 * rank + round);
  };
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(kSize, 0.0f), grad(kSize), out(kSize), again(kSize);
    kv.Init(3, ps::Tensor(value.data(), kSize));
    std::vector<float> expected(kSize, 0.0f);
    for (int round = 1; round <= 6; ++round) {
      if (round == 4) {  // plain SGD, learning rate 1: w <- w - (g0 + g1), exact in floats
        ps::OptimizerConfig sgd;
        sgd.name = "sgd";
        sgd.learning_rate = 1.0f;
        sgd.momentum = 0.0f;
        kv.SetOptimizer(sgd);
      }
      for (std::size_t i = 0; i < kSize; ++i) {
        grad[i] = grad_of(kv.Rank(), round, i);
        const float sum = grad_of(0, round, i) + grad_of(1, round, i);
        expected[i] = round < 4 ? sum : expected[i] - sum;
      }
      kv.PushPull(3, ps::Tensor(grad.data(), kSize), ps::Tensor(out.data(), kSize));
      kv.Pull(3, ps::Tensor(again.data(), kSize));  // no wait in between
      kv.WaitAll();
      if (out != expected || again != expected) {
        throw ps::Error("round " + std::to_string(round) + ": wrong value");
      }
    }
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_sync: pushes and pulls issued from several threads of each worker", "[dist]") {
  KVCluster cluster(2, 2);
  constexpr int kThreads = 4;
  constexpr int kRounds = 10;
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<std::vector<float>> values(kThreads, std::vector<float>(64, 0.0f));
    std::vector<std::vector<float>> grads, outs(kThreads, std::vector<float>(64));
    std::vector<ps::Key> keys;
    std::vector<ps::Tensor> views;
    for (int t = 0; t < kThreads; ++t) {
      keys.push_back(static_cast<ps::Key>(t));
      views.emplace_back(values[static_cast<std::size_t>(t)].data(), 64);
      grads.emplace_back(64, static_cast<float>(t + 1));
    }
    kv.Init(keys, views);
    for (int round = 1; round <= kRounds; ++round) {
      // Each thread issues its own key's operations concurrently with the others...
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          const auto index = static_cast<std::size_t>(t);
          kv.Push(keys[index], ps::Tensor(grads[index].data(), 64));
          kv.Pull(keys[index], ps::Tensor(outs[index].data(), 64));
        });
      }
      for (auto& thread : threads) thread.join();
      // ...and one WaitAll covers all of them (see the thread-safety note in kvstore.h).
      kv.WaitAll();
      for (int t = 0; t < kThreads; ++t) {
        Expect(outs[static_cast<std::size_t>(t)] ==
                   std::vector<float>(64, static_cast<float>(2 * (t + 1))),
               "thread " + std::to_string(t) + " round " + std::to_string(round));
      }
    }
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_sync: Wait on one key returns while another key's round is still open", "[dist]") {
  // Key 1 is sliced over both servers in several chunks; key 2's round stays open until rank
  // 1 pushes it, which it does only once rank 0's Wait(1) has returned (or after a bound, to
  // fail instead of hanging).
  KVCluster cluster(2, 2, {{"MXNET_KVSTORE_BIGARRAY_BOUND", "100"}, {"PS_CHUNK_BYTES", "4096"}});
  std::promise<void> waited;
  std::shared_future<void> waited_seen = waited.get_future().share();
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    const std::vector<ps::Key> keys = {1, 2};
    std::vector<std::vector<float>> values = {std::vector<float>(2501, 0.0f),
                                              std::vector<float>(7, 0.0f)};
    std::vector<ps::Tensor> views;
    for (auto& v : values) views.emplace_back(v.data(), v.size());
    kv.Init(keys, views);
    std::vector<std::vector<float>> grads = {std::vector<float>(2501, 1.0f + kv.Rank()),
                                             std::vector<float>(7, 10.0f * (1 + kv.Rank()))};
    const auto push_pull = [&](std::size_t i) {
      kv.Push(keys[i], ps::Tensor(grads[i].data(), grads[i].size()));
      kv.Pull(keys[i], views[i]);
    };
    if (kv.Rank() == 0) {
      push_pull(0);
      push_pull(1);
      kv.Wait(keys[0]);
      waited.set_value();
      Expect(values[0] == std::vector<float>(2501, 3.0f), "key 1 after its own Wait");
      kv.Wait(std::vector<ps::Key>{2});
      Expect(values[1] == std::vector<float>(7, 30.0f), "key 2 after its own Wait");
    } else {
      push_pull(0);
      const bool seen = waited_seen.wait_for(20s) == std::future_status::ready;
      push_pull(1);  // lets rank 0 go on either way
      kv.WaitAll();
      Expect(seen, "rank 0's Wait(1) returned while key 2's round was open");
      Expect(values[1] == std::vector<float>(7, 30.0f), "key 2 after WaitAll");
    }
    kv.Wait(std::vector<ps::Key>{1, 2});  // nothing in flight: at once
    // A key never initialized (a mistyped one) is refused, not waited for as if done.
    Expect(Has(ErrorOf([&] {
                 kv.Wait(std::vector<ps::Key>{1, 99});
               }),
               "dist kvstore: Wait key 99: unknown key (never initialized: call Init first)"),
           "Wait on key 99");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: bad input raises ps::Error naming key and values and changes nothing",
          "[dist][errors]") {
  KVCluster cluster(2, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(10, 3.0f), out(10), wrong_size(11, 1.0f);
    std::vector<double> wrong_dtype(10, 1.0);
    kv.Init(3, ps::Tensor(value.data(), 10));
    const auto error_of = [](const std::function<void()>& call) -> std::string {
      try {
        call();
      } catch (const ps::Error& e) {
        return e.what();
      }
      return "no error";
    };
    std::string e = error_of([&] { kv.Push(3, ps::Tensor(wrong_size.data(), 11)); });
    Expect(e.find("key 3") != std::string::npos && e.find("expected 10") != std::string::npos &&
               e.find("given 11") != std::string::npos,
           "size mismatch message: " + e);
    e = error_of([&] { kv.Push(3, ps::Tensor(wrong_dtype.data(), 10)); });
    Expect(e.find("key 3: dtype mismatch: expected float32") != std::string::npos &&
               e.find("given float64") != std::string::npos,
           "dtype mismatch message: " + e);
    e = error_of([&] { kv.Pull(99, ps::Tensor(out.data(), 10)); });
    Expect(
        e.find("key 99") != std::string::npos && e.find("never initialized") != std::string::npos,
        "unknown key message: " + e);
    e = error_of([&] { kv.Init(3, ps::Tensor(value.data(), 10)); });
    Expect(
        e.find("key 3") != std::string::npos && e.find("already initialized") != std::string::npos,
        "double init message: " + e);
    // A GPU that does not exist: refused by a build without CUDA, a failed copy with CUDA;
    // either way an error naming the key and the device, before anything is sent.
    e = error_of([&] {
      kv.Push(3, ps::Tensor(value.data(), 10, ps::DType::kFloat32, ps::Device::CUDA(99)));
    });
    Expect(e.find("key 3") != std::string::npos && e.find("cuda:99") != std::string::npos,
           "GPU tensor message: " + e);
    // Nothing changed, and the servers still serve.
    kv.Pull(3, ps::Tensor(out.data(), 10));
    kv.WaitAll();
    Expect(out == std::vector<float>(10, 3.0f), "value untouched after errors");
    std::vector<float> grad(10, 1.0f);
    kv.PushPull(3, ps::Tensor(grad.data(), 10), ps::Tensor(out.data(), 10));
    kv.WaitAll();
    Expect(out == std::vector<float>(10, 2.0f), "servers still serve");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_async: a push before SetOptimizer is an error", "[dist][errors]") {
  KVCluster cluster(1, 1);
  const auto outcomes = cluster.RunWorkers("dist_async", [&](ps::KVStore& kv) {
    std::vector<float> value(4, 1.0f);
    kv.Init(1, ps::Tensor(value.data(), 4));
    try {
      kv.Push(1, ps::Tensor(value.data(), 4));
      Expect(false, "push accepted without an optimizer");
    } catch (const ps::Error& e) {
      Expect(std::string(e.what()).find("SetOptimizer") != std::string::npos, e.what());
    }
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_sync: a worker that finishes early fails the round it left open instead of a hang",
          "[dist][errors]") {
  const bool per_key = GENERATE(false, true);  // WaitAll, or Wait on the key
  // Push then Pull (MXNet's way, ps-train's too), on two servers: with replication, a pull
  // that came after worker 0 finished once waited for its round for ever.
  const bool separate = GENERATE(false, true);
  const int servers = GENERATE(1, 2);
  INFO((per_key ? "Wait(1)" : "WaitAll()")
       << (separate ? ", Push then Pull" : ", PushPull") << ", " << servers << " server(s)");
  KVCluster cluster(servers, 2, {{"PS_VERBOSE", "1"}});  // servers log "... has finished"
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(8, 0.0f), grad(8, 1.0f);
    kv.Init(1, ps::Tensor(value.data(), 8));
    const int rounds = kv.Rank() == 0 ? 3 : 4;  // rank 1 pushes one round more
    for (int round = 0; round < rounds; ++round) {
      if (round == 3 && separate) {  // after every server heard that worker 0 finished
        for (auto& server : cluster.servers()) {
          Expect(server->WaitForOutput("has finished: dist_sync rounds that wait", 20s),
                 "a server heard that worker 0 finished");
        }
      }
      if (separate) {
        kv.Push(1, ps::Tensor(grad.data(), 8));
        kv.Pull(1, ps::Tensor(value.data(), 8));
      } else {
        kv.PushPull(1, ps::Tensor(grad.data(), 8), ps::Tensor(value.data(), 8));
      }
      if (per_key) {
        kv.Wait(1);
      } else {
        kv.WaitAll();
      }
    }
  });
  CHECK(outcomes[0].empty() != outcomes[1].empty());  // exactly the rank-1 thread failed
  const std::string error = outcomes[0].empty() ? outcomes[1] : outcomes[0];
  CHECK_THAT(error, Catch::Contains("worker 0 (") && Catch::Contains("has finished") &&
                        Catch::Contains("every worker must push each key equally often"));
  // Rank 1 let its error escape, so the job ends as failed (at once, not by a timeout).
  CHECK(cluster.scheduler().Wait(15s) == 1);
  CHECK_THAT(cluster.scheduler().Output(),
             Catch::Contains("worker 1 (") && Catch::Contains("failed"));
}

TEST_CASE("dist_sync: a worker killed mid-round makes the others fail naming it",
          "[dist][errors]") {
  KVCluster cluster(2, 2);
  using ps::test::ChildProcess;
  const auto check = ps::test::BinPath("ps-kvstore-check");
  auto env = cluster.env();
  env["DMLC_ROLE"] = "worker";
  ChildProcess victim({check, "--rounds", "50", "--pause_at_round", "5"}, env);
  ChildProcess survivor({check, "--rounds", "50"}, env);
  REQUIRE(victim.WaitForOutput("paused at round 5", 30s));
  victim.Kill(SIGKILL);
  REQUIRE(victim.Wait(5s) == 128 + SIGKILL);
  CHECK(survivor.Wait(15s) == 1);
  CHECK_THAT(survivor.Output(),
             Catch::Contains("kvstore-check: error:") && Catch::Contains("died"));
  // Cut off, not a program that pushed unequally: no hint of that.
  CHECK_THAT(survivor.Output(), !Catch::Contains("push each key equally often"));
  CHECK(cluster.scheduler().Wait(15s) == 1);
  for (auto& server : cluster.servers()) CHECK(server->Wait(15s) == 1);
}

namespace {

long RssKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

}  // namespace

TEST_CASE("dist_sync: 4 workers run 1000 rounds over 16 keys exactly with flat server memory",
          "[dist][soak]") {
  // Under AddressSanitizer (the asan preset) freed memory waits in a quarantine instead of
  // being reused, so every process's RSS grows with its traffic whatever the code does. These
  // processes turn the quarantine off (other builds ignore the variable) so that the RSS check
  // still means something there.
  KVCluster cluster(2, 4, {{"ASAN_OPTIONS", "quarantine_size_mb=0"}});
  auto env = cluster.env();
  env["DMLC_ROLE"] = "worker";
  std::vector<std::unique_ptr<ps::test::ChildProcess>> workers;
  for (int w = 0; w < 4; ++w) {
    workers.push_back(std::make_unique<ps::test::ChildProcess>(
        std::vector<std::string>{ps::test::BinPath("ps-kvstore-check"), "--rounds", "1000",
                                 "--keys", "16", "--size", "256", "--report_every", "100"},
        env));
  }
  REQUIRE(workers[0]->WaitForOutput("kvstore-check: round 200", 120s));
  std::vector<long> early;
  for (auto& server : cluster.servers()) early.push_back(RssKiB(server->pid()));
  REQUIRE(workers[0]->WaitForOutput("kvstore-check: round 900", 120s));
  std::vector<long> late;
  for (auto& server : cluster.servers()) late.push_back(RssKiB(server->pid()));
  for (auto& worker : workers) {
    CHECK(worker->Wait(120s) == 0);
    CHECK_THAT(worker->Output(),
               Catch::Contains("kvstore-check: ok") && Catch::Contains("rounds=1000"));
  }
  for (std::size_t s = 0; s < early.size(); ++s) {
    INFO("server " << s << " RSS " << early[s] << " KiB at round 200, " << late[s] << " at 900");
    CHECK(early[s] > 0);
    CHECK(late[s] - early[s] < 2048);  // 700 rounds may not grow a server by 2 MiB
  }
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: a worker that leaves through the store's error tells the job which",
          "[dist][errors]") {
  // The other nodes cannot see the exception that unwinds a worker's store, but the last error
  // the store raised is most often it: the job's failure quotes it.
  KVCluster cluster(1, 2);
  std::string errors;  // worker 1's
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(4, 0.0f);
    kv.Init(1, ps::Tensor(value.data(), 4));
    if (kv.Rank() == 0) {
      kv.Push(1, ps::Tensor(value.data(), 4));  // worker 1 never pushes: the round cannot close
      kv.WaitAll();                             // fails once worker 1 is in Barrier; not caught
    }
    for (int call = 0; call < 2; ++call) {
      try {
        kv.Barrier();  // fails: the round, then worker 0's end (in either order)
      } catch (const ps::Error& e) {
        errors += std::string(e.what()) + "\n";
      }
    }
  });
  // Outcomes are the threads', and a thread's rank is the order it registered in.
  const std::size_t rank0 = outcomes[1].empty() ? 0 : 1;
  CHECK_THAT(outcomes[rank0], Catch::Contains("key 1: this dist_sync round can never complete"));
  CHECK(outcomes[1 - rank0] == "");
  const std::string quoted =
      "its program left the KVStore through an exception (the last error the store raised to "
      "it: key 1: this dist_sync round can never complete";
  CHECK_THAT(errors, Catch::Contains("the job failed: worker 0 (") && Catch::Contains(quoted));
  CHECK(cluster.scheduler().Wait(15s) == 1);
  CHECK_THAT(cluster.scheduler().Output(), Catch::Contains(quoted));
}

TEST_CASE("dist kvstore: a worker that leaves through an exception fails the job at once",
          "[dist][errors]") {
  KVCluster cluster(1, 2);
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(4, 0.0f);
    kv.Init(1, ps::Tensor(value.data(), 4));
    if (kv.Rank() == 0) throw std::runtime_error("the training step blew up");
    kv.PushPull(1, ps::Tensor(value.data(), 4), ps::Tensor(value.data(), 4));
    kv.WaitAll();  // fails: the job ends while this round waits for rank 0
  });
  CHECK(std::chrono::steady_clock::now() - start < 10s);  // well inside the heartbeat timeout
  CHECK(cluster.scheduler().Wait(15s) == 1);
  CHECK_THAT(
      cluster.scheduler().Output(),
      Catch::Contains("worker 0 (") && Catch::Contains("left the KVStore through an exception"));
  const std::string all = outcomes[0] + outcomes[1];
  CHECK_THAT(all, Catch::Contains("the training step blew up"));
  CHECK_THAT(all, Catch::Contains("the job failed: worker 0 ("));
}

// Sends SIGCONT to a stopped process when it goes out of scope.
struct ResumeOnExit {
  ps::test::ChildProcess& process;
  ~ResumeOnExit() { process.Kill(SIGCONT); }
};

// Stops `process` with SIGSTOP and returns once every thread of it has stopped: the signal
// takes effect asynchronously, and on a busy machine a thread may serve a request meanwhile.
void StopProcess(ps::test::ChildProcess& process) {
  process.Kill(SIGSTOP);
  const std::string tasks = "/proc/" + std::to_string(process.pid()) + "/task";
  const auto all_stopped = [&] {
    std::error_code error;
    for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
      std::ifstream stat(task.path() / "stat");
      const std::string text((std::istreambuf_iterator<char>(stat)), {});
      const std::size_t name_end = text.rfind(')');  // "pid (name) S ..."
      if (name_end == std::string::npos || name_end + 2 >= text.size()) return false;
      const char state = text[name_end + 2];
      if (state != 'T' && state != 't') return false;
    }
    return !error;
  };
  for (int polls = 0; polls < 5000 && !all_stopped(); ++polls) {
    std::this_thread::sleep_for(1ms);  // polling the kernel's state, bounded
  }
  Expect(all_stopped(), "process " + std::to_string(process.pid()) + " stopped within 5 s");
}

TEST_CASE("replication: a pull is answered once its round is applied, its push once replicated",
          "[dist][replication]") {
  // The stopped replica is never declared dead here: the heartbeat timeout outlasts the test.
  KVCluster cluster(2, 2, {{"PS_VERBOSE", "1"}, {"PS_HEARTBEAT_TIMEOUT", "120"}});
  // A key whose primary is server 0, so that its replica is server 1.
  ps::Key key = 0;
  while (ps::KeyLayout(2, 1000000).ServerOf(key) != 0) ++key;
  // Worker 0's pull reaches the primary before the round closes (worker 1 pushes after it),
  // worker 1's after: both are answered once the round is applied there.
  std::promise<void> first_pulled, second_measured;
  std::shared_future<void> first = first_pulled.get_future().share();
  std::shared_future<void> second = second_measured.get_future().share();
  std::vector<int> pull_early(2, 0), push_waited(2, 0);
  std::vector<std::vector<float>> pulled(2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    const int rank = kv.Rank();
    std::vector<float> value(1000, 0.0f), grad(1000, 2.0f);
    kv.Init(key, ps::Tensor(value.data(), value.size()));
    ps::test::ChildProcess* replica = cluster.ServerOfRank(1);  // every node registered by now
    if (rank == 0) {
      StopProcess(*replica);
    } else {
      Expect(first.wait_for(20s) == std::future_status::ready, "worker 0 pulled");
    }
    kv.Push(key, ps::Tensor(grad.data(), grad.size()));
    kv.Pull(key, ps::Tensor(value.data(), value.size()));
    std::future<void> pull, push;
    // Resumed however this thread leaves, before the futures' destructors wait for the calls
    // (which end only then, or at the heartbeat timeout).
    const ResumeOnExit resume{*replica};
    pull = std::async(std::launch::async, [&] { kv.WaitPulls(key); });
    if (rank == 0) {
      // The round cannot close before worker 1 pushes; meanwhile the pull reaches the primary.
      Expect(pull.wait_for(300ms) == std::future_status::timeout, "worker 0's pull waited");
      first_pulled.set_value();
    }
    pull_early[rank] = pull.wait_for(10s) == std::future_status::ready;
    push = std::async(std::launch::async, [&] { kv.Wait(key); });
    // The push's answer waits for the stopped replica: no wait here can end it sooner.
    push_waited[rank] = push.wait_for(1s) == std::future_status::timeout;
    if (rank == 1) {
      second_measured.set_value();
    } else {
      Expect(second.wait_for(20s) == std::future_status::ready, "worker 1 measured");
      replica->Kill(SIGCONT);
    }
    pull.get();
    push.get();
    pulled[rank] = value;
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(pull_early == std::vector<int>{1, 1});
  CHECK(push_waited == std::vector<int>{1, 1});
  for (const auto& value : pulled) {
    CHECK(value == std::vector<float>(1000, 4.0f));  // no optimizer: the round's sum
  }
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("replication: a dist_async push is applied on arrival, answered once replicated",
          "[dist][replication]") {
  // As without replication, a pull sent after a push sees it: the primary applies the push
  // while it is on its way to the replica. The push's answer waits for the replica's.
  // Frames, and shared memory (the replica reads the push in the worker's slot).
  const std::size_t size = GENERATE(std::size_t{1000}, ps::kShmMinBytes / sizeof(float) + 1000);
  INFO(size << " elements");
  KVCluster cluster(2, 1, {{"PS_VERBOSE", "1"}, {"PS_HEARTBEAT_TIMEOUT", "120"}});
  ps::Key key = 0;  // served by server 0, replicated on server 1
  while (ps::KeyLayout(2, 1000000).ServerOf(key) != 0) ++key;
  bool pull_early = false, push_waited = false;
  std::vector<float> pulled, later;
  const auto outcomes = cluster.RunWorkers("dist_async", [&](ps::KVStore& kv) {
    std::vector<float> value(size, 1.0f), grad(size, 2.0f);
    kv.Init(key, ps::Tensor(value.data(), value.size()));
    ps::OptimizerConfig sgd;
    sgd.learning_rate = 1.0f;
    kv.SetOptimizer(sgd);
    ps::test::ChildProcess& replica = *cluster.ServerOfRank(1);
    StopProcess(replica);
    const ResumeOnExit resume{replica};
    kv.Push(key, ps::Tensor(grad.data(), grad.size()));
    kv.Pull(key, ps::Tensor(value.data(), value.size()));
    std::future<void> pull = std::async(std::launch::async, [&] { kv.WaitPulls(key); });
    pull_early = pull.wait_for(10s) == std::future_status::ready;
    std::future<void> push = std::async(std::launch::async, [&] { kv.Wait(key); });
    // No wait here can end it sooner: the replica is stopped.
    push_waited = push.wait_for(1s) == std::future_status::timeout;
    replica.Kill(SIGCONT);
    pull.get();
    push.get();
    pulled = value;
    // The next push builds on it (that both servers hold the same values after a failover,
    // test_failover checks).
    kv.Push(key, ps::Tensor(grad.data(), grad.size()));
    kv.Pull(key, ps::Tensor(value.data(), value.size()));
    kv.WaitAll();
    later = value;
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(pull_early);
  CHECK(push_waited);
  CHECK(pulled == std::vector<float>(size, -1.0f));  // 1 - 2
  CHECK(later == std::vector<float>(size, -3.0f));
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_sync: a round's sum is added up in rank order, whatever order pushes arrive in",
          "[dist]") {
  // Float addition is not associative: with these gradients the order of the additions shows
  // in the sum. Each round the workers push in another order; the sum must be the rank-order
  // one every time.
  const std::vector<float> gradient = {1.0f, 1e8f, -1e8f, 1.0f};  // worker w pushes gradient[w]
  const std::vector<std::vector<int>> orders = {{1, 2, 0, 3}, {2, 1, 3, 0}, {3, 0, 1, 2},
                                                {0, 2, 1, 3}, {2, 0, 3, 1}, {1, 3, 2, 0}};
  const auto sum_in = [&](const std::vector<int>& order) {
    float sum = 0.0f;
    for (const int w : order) sum = w == order.front() ? gradient[w] : sum + gradient[w];
    return sum;
  };
  const float expected = sum_in({0, 1, 2, 3});
  // The test can fail: most of these orders, summed as they arrive, give another value.
  const auto differs = std::count_if(orders.begin(), orders.end(),
                                     [&](const auto& order) { return sum_in(order) != expected; });
  REQUIRE(differs >= 4);
  const auto servers = GENERATE(1, 2);  // with 2, replicated: the primary sends its sum on
  INFO(servers << " servers");
  KVCluster cluster(servers, 4);
  std::vector<std::vector<float>> pulled(4);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    const int rank = kv.Rank();
    std::vector<float> value(16, 0.0f), grad(16, gradient[static_cast<std::size_t>(rank)]);
    kv.Init(3, ps::Tensor(value.data(), value.size()));
    for (const auto& order : orders) {
      // Staggered so that the pushes tend to arrive in `order` (a stimulus only: the sum
      // must not depend on it, so no outcome rests on this timing).
      const auto position = std::find(order.begin(), order.end(), rank) - order.begin();
      std::this_thread::sleep_for(position * 40ms);
      kv.Push(3, ps::Tensor(grad.data(), grad.size()));
      kv.Pull(3, ps::Tensor(value.data(), value.size()));
      kv.WaitAll();
      pulled[static_cast<std::size_t>(rank)].push_back(value.front());
      Expect(std::all_of(value.begin(), value.end(), [&](float v) { return v == value.front(); }),
             "every element the same sum");
    }
  });
  CHECK(AllOk(outcomes) == "");
  for (const auto& sums : pulled) {
    CHECK(sums == std::vector<float>(orders.size(), expected));  // no optimizer: the sum
  }
  CHECK(cluster.EndedCleanly());
}
