// Collective calls on which the workers disagree, and dist_sync rounds that can no longer
// complete: every case must fail on every worker, naming who and why, and leave nothing
// waiting and no half-made state behind. Real ps-scheduler and ps-server processes; workers
// are threads of this test (KVStores, or bare runtimes that send raw requests).
#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/dist/kv_protocol.h"
#include "ps/runtime.h"
#include "tests/kvstore/kv_cluster.h"
#include "tests/kvstore/kv_rounds.h"

namespace {

using namespace std::chrono_literals;
using ps::test::AllOk;
using ps::test::Expect;
using ps::test::KVCluster;

using ps::test::ErrorKindOf;
using ps::test::ErrorOf;
using ps::test::Has;

}  // namespace

TEST_CASE("dist kvstore: an Init whose sizes differ across ranks fails on every rank, key free",
          "[dist][errors][collective]") {
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    const std::size_t size = kv.Rank() == 0 ? 10 : 12;
    std::vector<float> value(size, 4.0f);
    const std::string error = ErrorOf([&] { kv.Init(5, ps::Tensor(value.data(), size)); });
    Expect(Has(error, "Init failed on every worker") && Has(error, "disagree") &&
               Has(error, "worker 0 called Init key 5 (10 x float32)") &&
               Has(error, "worker 1 called Init key 5 (12 x float32)"),
           "message: " + error);
    // Nothing was stored: the key can be initialized again, and then it works exactly.
    std::vector<float> agreed(10, 1.0f), grad(10, static_cast<float>(kv.Rank() + 1)), out(10);
    kv.Init(5, ps::Tensor(agreed.data(), 10));
    kv.PushPull(5, ps::Tensor(grad.data(), 10), ps::Tensor(out.data(), 10));
    kv.WaitAll();
    Expect(out == std::vector<float>(10, 3.0f), "the sum of both pushes after a fresh Init");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: an Init of many keys names the first key whose size differs",
          "[dist][errors][collective]") {
  // 1000 keys (a call of about 22 KB: longer than the servers' announcement takes, which gets
  // its start): the calls' shown starts read alike, so the key that differs must lead.
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<std::vector<float>> values;
    std::vector<ps::Key> keys;
    std::vector<ps::Tensor> tensors;
    for (ps::Key k = 0; k < 1000; ++k) {
      values.emplace_back(k == 999 && kv.Rank() == 1 ? 2 : 1, 1.0f);
      keys.push_back(k);
    }
    for (auto& value : values) tensors.emplace_back(value.data(), value.size());
    const std::string error = ErrorOf([&] { kv.Init(keys, tensors); });
    Expect(Has(error, "Init failed on every worker: the members disagree (first difference: ") &&
               (Has(error, "worker 0's key 999 (1 x float32), worker 1's key 999 (2 x float32))") ||
                Has(error, "worker 1's key 999 (2 x float32), worker 0's key 999 (1 x float32))")),
           "message: " + error);
    // One worker with a key more: the other has no more.
    keys.resize(kv.Rank() == 0 ? 3 : 4);
    tensors.resize(keys.size());
    const std::string more = ErrorOf([&] { kv.Init(keys, tensors); });
    Expect(Has(more, "worker 0 has no more") && Has(more, "worker 1's key 3 (1 x float32)"),
           "message: " + more);
    // 3000 keys: a call longer than the 64 KiB it shows, the last key different. The shown
    // keys agree, so no key is named as different: the whole calls' counts are.
    std::vector<float> ones(2, 1.0f);
    keys.clear();
    tensors.clear();
    for (ps::Key k = 0; k < 3000; ++k) {
      keys.push_back(k + 10000);
      tensors.emplace_back(ones.data(), k == 2999 && kv.Rank() == 1 ? 2 : 1);
    }
    const std::string past = ErrorOf([&] { kv.Init(keys, tensors); });
    Expect(Has(past, "the members disagree (first difference: past the first ") &&
               Has(past, " items shown, which agree; worker ") &&
               Has(past, "3000 keys of 3000 elements in all; fingerprint ") &&
               Has(past, "3000 keys of 3001 elements in all; fingerprint ") &&
               !Has(past, "first difference: worker"),
           "message: " + past);
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: an Init of the same keys in another order agrees, rank 0's values",
          "[dist][collective]") {
  // Worker 0 declares keys 7 and 3, worker 1 keys 3 and 7: the same call. Rank 0's values are
  // stored, key by key, and both keys then sum both workers' pushes.
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    const float base = kv.Rank() == 0 ? 1.0f : 100.0f;
    std::vector<float> three(4, base), seven(6, base + 1.0f);
    const ps::Tensor t3(three.data(), three.size()), t7(seven.data(), seven.size());
    if (kv.Rank() == 0) {
      kv.Init({7, 3}, {t7, t3});
    } else {
      kv.Init({3, 7}, {t3, t7});
    }
    std::vector<float> out3(4), out7(6);
    kv.Pull({3, 7}, {ps::Tensor(out3.data(), 4), ps::Tensor(out7.data(), 6)});
    kv.WaitAll();
    Expect(out3 == std::vector<float>(4, 1.0f) && out7 == std::vector<float>(6, 2.0f),
           "rank 0's values of both keys");
    kv.PushPull({7, 3}, {t7, t3}, {ps::Tensor(out7.data(), 6), ps::Tensor(out3.data(), 4)});
    kv.WaitAll();
    Expect(out3 == std::vector<float>(4, 101.0f) && out7 == std::vector<float>(6, 103.0f),
           "the sums of both workers' pushes");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: a rank whose own Init checks fail makes Init fail on every rank",
          "[dist][errors][collective]") {
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(4, 2.0f);
    // Rank 0 hands over a GPU tensor that no GPU here can copy (a CPU-only build refuses it
    // at once; a CUDA build fails the copy): rank 1's identical-looking call must fail too.
    const ps::Tensor tensor =
        kv.Rank() == 0 ? ps::Tensor(value.data(), 4, ps::DType::kFloat32, ps::Device::CUDA(0))
                       : ps::Tensor(value.data(), 4);
    const std::string error = ErrorOf([&] { kv.Init(4, tensor); });
    if (kv.Rank() == 1) {
      Expect(Has(error, "Init failed on every worker: worker 0 failed:") && Has(error, "key 4"),
             "rank 1's message: " + error);
    }
    // The key was left free on every rank and on the server.
    kv.Init(4, ps::Tensor(value.data(), 4));
    std::vector<float> out(4);
    kv.Pull(4, ps::Tensor(out.data(), 4));
    kv.WaitAll();
    Expect(out == value, "the value of the second Init");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: ranks in different collectives fail instead of waiting on each other",
          "[dist][errors][collective]") {
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    ps::OptimizerConfig sgd;
    sgd.learning_rate = kv.Rank() == 0 ? 0.1f : 0.2f;
    const std::string optimizer = ErrorOf([&] { kv.SetOptimizer(sgd); });
    // The long votes' first difference is named before them.
    Expect(Has(optimizer,
               "SetOptimizer failed on every worker: the members disagree (first difference: ") &&
               (Has(optimizer, "worker 0's lr=0.100000001, worker 1's lr=0.200000003)") ||
                Has(optimizer, "worker 1's lr=0.200000003, worker 0's lr=0.100000001)")),
           "SetOptimizer message: " + optimizer);
    Expect(Has(optimizer, "max_update=0"), "the schedule's length by its name: " + optimizer);
    // Thrown as the type a program catches to act on it (ps-train names its flags).
    Expect(ErrorKindOf([&] { kv.SetOptimizer(sgd); }) == ps::ErrorKind::kDisagreement,
           "a disagreement is a ps::DisagreementError");
    std::vector<float> value(3, 1.0f);
    const std::string mixed = ErrorOf([&] {
      if (kv.Rank() == 0) {
        kv.Barrier();
      } else {
        kv.Init(9, ps::Tensor(value.data(), 3));
      }
    });
    Expect(Has(mixed, "failed on every worker") && Has(mixed, "called Barrier") &&
               Has(mixed, "called Init key 9"),
           "mixed collectives: " + mixed);
    // The same type in either call (Barrier's own rewording keeps it).
    const auto mixed_kind = ErrorKindOf([&] {
      if (kv.Rank() == 0) {
        kv.Barrier();
      } else {
        kv.Init(9, ps::Tensor(value.data(), 3));
      }
    });
    Expect(mixed_kind == ps::ErrorKind::kDisagreement,
           "rank " + std::to_string(kv.Rank()) + ": a ps::DisagreementError");
    kv.Barrier();  // agreeing again works
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: a collective that waits long for a live worker names it",
          "[dist][collective]") {
  // Worker 1 is still working while worker 0 waits in Barrier: after half of PS_STALL_TIMEOUT
  // (here 2 s of 4) the scheduler names the worker that has not entered it; the job goes on.
  KVCluster cluster(1, 2, {{"PS_STALL_TIMEOUT", "4"}});
  const std::string type = GENERATE("dist_sync", "dist_async");
  INFO(type);
  const auto outcomes = cluster.RunWorkers(type, [&](ps::KVStore& kv) {
    if (kv.Rank() == 1) {
      Expect(cluster.scheduler().WaitForOutput("the workers' collective Barrier has waited", 20s),
             "the scheduler noted the wait");
    }
    kv.Barrier();
  });
  CHECK(AllOk(outcomes) == "");
  const std::string output = cluster.scheduler().Output();
  INFO(output);
  CHECK_THAT(output, Catch::Contains("the workers' collective Barrier has waited 2") &&
                         Catch::Contains(" s for worker 1 (node ") &&
                         Catch::Contains("which has not entered it: still working (the job "
                                         "goes on once it enters)"));
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: a collective's outcome that waits long names the worker doing it",
          "[dist][collective]") {
  // Rank 0 does Init's work (the values reach the servers) while the others wait for its
  // outcome: the scheduler's note says so, not that rank 0 has not entered the call. The server
  // stopped (SIGSTOP) for a while, well within the heartbeat timeout, holds Init up.
  KVCluster cluster(1, 2, {{"PS_STALL_TIMEOUT", "4"}, {"PS_HEARTBEAT_TIMEOUT", "20"}});
  const std::string note = "the workers' collective Init key 3 (16 x float32) has waited 2";
  auto resume = std::async(std::launch::async, [&] {
    const bool noted = cluster.scheduler().WaitForOutput(note, 30s);
    cluster.servers()[0]->Kill(SIGCONT);  // whatever happened: the job must end
    return noted;
  });
  // dist_async: in dist_sync each worker first announces the collective to the servers, which
  // the stopped server would hold up before the workers vote.
  const auto outcomes = cluster.RunWorkers("dist_async", [&](ps::KVStore& kv) {
    std::vector<float> values(16, 1.0F);
    kv.Barrier();  // both workers are up: rank 0 stops the server, then both enter Init
    if (kv.Rank() == 0) cluster.servers()[0]->Kill(SIGSTOP);
    kv.Init(3, ps::Tensor(values.data(), values.size()));
  });
  CHECK(resume.get());
  CHECK(AllOk(outcomes) == "");
  const std::string output = cluster.scheduler().Output();
  INFO(output);
  CHECK_THAT(output, Catch::Contains(" s for the outcome from worker 0 (node ") &&
                         Catch::Contains("which is still doing the call's work") &&
                         !Catch::Contains("has not entered it"));
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: destroyed while another thread is in Barrier, it fails that call",
          "[dist][collective]") {
  // The store used to free the condition variable that thread slept on: the process hung for
  // ever in the destructor. Now that thread's call fails and the destructor returns.
  KVCluster cluster(1, 2, {{"PS_STALL_TIMEOUT", "4"}});
  const std::string type = GENERATE("dist_sync", "dist_async");
  INFO(type);
  std::thread in_barrier;  // worker 0's, joined here once both stores are gone
  std::string barrier_error = "(not thrown)";
  const auto outcomes = cluster.RunWorkers(type, [&](ps::KVStore& kv) {
    if (kv.Rank() == 0) {
      in_barrier =
          std::thread([&kv, &barrier_error] { barrier_error = ErrorOf([&] { kv.Barrier(); }); });
    }
    // Both return, destroying their stores, once worker 0's Barrier is seen waiting.
    Expect(cluster.scheduler().WaitForOutput("the workers' collective Barrier has waited", 20s),
           "worker 0's Barrier waited");
  });
  in_barrier.join();
  CHECK(AllOk(outcomes) == "");
  CHECK_THAT(barrier_error, Catch::Contains("Barrier"));
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_sync: every failed operation reaches a wait on its key, none is lost",
          "[dist][errors]") {
  // Worker 1 leaves after Init, so both of worker 0's rounds fail. The first failure used to be
  // the only one kept: a later Wait(1) returned as if key 1's pull had written its buffer.
  KVCluster cluster(1, 2);
  const bool wait_all = GENERATE(false, true);
  INFO((wait_all ? "WaitAll" : "Wait per key"));
  std::vector<std::string> errors;
  std::vector<float> out1(8, -7.0F), out2(8, -7.0F);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> values(8, 1.0F);
    kv.Init({1, 2}, {ps::Tensor(values.data(), 8), ps::Tensor(values.data(), 8)});
    if (kv.Rank() == 1) return;  // finished: no round of worker 0's can complete
    kv.PushPull(1, ps::Tensor(values.data(), 8), ps::Tensor(out1.data(), 8));
    kv.PushPull(2, ps::Tensor(values.data(), 8), ps::Tensor(out2.data(), 8));
    if (wait_all) {
      errors.push_back(ErrorOf([&] { kv.WaitAll(); }));
      errors.push_back(ErrorOf([&] { kv.Wait(1); }));  // reported by WaitAll already
    } else {
      errors.push_back(ErrorOf([&] { kv.Wait(2); }));  // key 2's own failure first
      // Then the first failure no wait threw, whatever its key: key 1's, when it failed first.
      errors.push_back(ErrorOf([&] { kv.Wait(2); }));
      errors.push_back(ErrorOf([&] { kv.Wait(1); }));  // key 1's own failure, again
      errors.push_back(ErrorOf([&] { kv.Wait(1); }));  // every failure reported
    }
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(out1[0] == -7.0F);  // never written
  const std::string never = "this dist_sync round can never complete";
  if (wait_all) {
    REQUIRE(errors.size() == 2);
    CHECK_THAT(errors[0], Catch::Contains(never) &&
                              Catch::Contains(" (and 1 more operation(s) failed, on key "));
    CHECK(errors[1] == "(no error)");
  } else {
    REQUIRE(errors.size() == 4);
    CHECK_THAT(errors[0], Catch::Contains("key 2: " + never));
    CHECK((errors[1] == "(no error)" || Has(errors[1], "key 1: " + never)));
    CHECK_THAT(errors[2], Catch::Contains("key 1: " + never));
    CHECK(errors[3] == "(no error)");
  }
}

TEST_CASE("dist kvstore: a worker that destroyed its store is told it cannot join again",
          "[dist][errors]") {
  KVCluster cluster(1, 2);
  std::promise<void> tried;
  auto other = std::async(std::launch::async, [&] {
    auto kv = ps::KVStore::Create("dist_sync", cluster.WorkerConfig());
    tried.get_future().wait_for(60s);  // stays in the job meanwhile
  });
  { auto kv = ps::KVStore::Create("dist_sync", cluster.WorkerConfig()); }  // this worker finished
  const std::string error =
      ErrorOf([&] { ps::KVStore::Create("dist_sync", cluster.WorkerConfig()); });
  tried.set_value();
  other.get();
  CHECK_THAT(error, Catch::Contains("the job already has all its nodes") &&
                        Catch::Contains("A worker whose KVStore was destroyed has left the job (1 "
                                        "have) and cannot join it again: keep one store for the "
                                        "whole program."));
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist_sync: a push the server rejects fails that round on every worker at once",
          "[dist][errors][collective]") {
  KVCluster cluster(1, 2);
  // Two bare worker runtimes speak the KVStore protocol directly, so one of them can send what
  // a KVStore would refuse locally.
  auto first =
      std::async(std::launch::async, [&] { return ps::Runtime::Start(cluster.WorkerConfig()); });
  auto second = ps::Runtime::Start(cluster.WorkerConfig());
  auto other = first.get();
  ps::Runtime& good = second->rank() == 0 ? *second : *other;
  ps::Runtime& bad = second->rank() == 0 ? *other : *second;
  const int server = good.ServerId(0);
  const auto message = [&](ps::kv::Command command, std::size_t length, float fill) {
    ps::kv::Request request;
    request.command = command;
    request.slices = {{5, 0, length}};
    ps::Message msg = ps::kv::RequestMessage(request, server);
    if (command != ps::kv::kPull) {
      const std::vector<float> values(length, fill);
      msg.data.push_back(
          ps::Blob::Copy(values.data(), values.size() * sizeof(float), ps::DType::kFloat32));
    }
    return msg;
  };
  const auto deadline = [] { return std::chrono::steady_clock::now() + 10s; };
  REQUIRE(good.RequestAndWait(message(ps::kv::kInit, 4, 100.0f), deadline()).ok());

  // Worker 0's push waits for worker 1's; worker 1's push is rejected (wrong size).
  std::promise<ps::RequestResult> waiting;
  std::vector<ps::Message> push{message(ps::kv::kPush, 4, 1.0f)};
  good.Request(
      push, [&](ps::RequestResult&& result) { waiting.set_value(std::move(result)); }, deadline());
  const auto rejected = bad.RequestAndWait(message(ps::kv::kPush, 6, 2.0f), deadline());
  CHECK_THAT(rejected.error, Catch::Contains("size mismatch"));
  auto outcome = waiting.get_future();
  REQUIRE(outcome.wait_for(5s) == std::future_status::ready);  // not left waiting
  const std::string error = outcome.get().error;
  CHECK_THAT(error, Catch::Contains("key 5: this dist_sync round cannot complete: worker 1 (") &&
                        Catch::Contains("push was rejected") &&
                        Catch::Contains("size mismatch: expected 4 elements, given 6"));

  const auto pull = [&](ps::Runtime& worker) {
    const auto pulled = worker.RequestAndWait(message(ps::kv::kPull, 4, 0.0f), deadline());
    std::vector<float> value;
    if (pulled.ok() && pulled.responses.size() == 1 && pulled.responses[0].data.size() == 1 &&
        pulled.responses[0].data[0].bytes() == sizeof(float) * 4) {
      value.resize(4);
      std::memcpy(value.data(), pulled.responses[0].data[0].data(), sizeof(float) * 4);
    }
    return value;
  };
  // The failed round changed nothing (the worker 0 push it held was dropped) ...
  CHECK(pull(good) == std::vector<float>(4, 100.0f));
  // ... and the next round lines up: without an optimizer the value becomes its sum, 3 + 4.
  auto next = std::async(std::launch::async, [&] {
    return good.RequestAndWait(message(ps::kv::kPush, 4, 3.0f), deadline());
  });
  CHECK(bad.RequestAndWait(message(ps::kv::kPush, 4, 4.0f), deadline()).ok());
  CHECK(next.get().ok());
  CHECK(pull(good) == std::vector<float>(4, 7.0f));
  good.FinishWorker();
  bad.FinishWorker();
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: ReportFailure ends the job at once naming the worker and the reason",
          "[dist][errors][collective]") {
  KVCluster cluster(1, 2);
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(4, 0.0f);
    kv.Init(1, ps::Tensor(value.data(), 4));
    if (kv.Rank() == 0) {
      kv.ReportFailure("the data loader found a corrupt file");
      return;
    }
    kv.PushPull(1, ps::Tensor(value.data(), 4), ps::Tensor(value.data(), 4));
    kv.WaitAll();
  });
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK(cluster.scheduler().Wait(15s) == 1);
  CHECK_THAT(
      cluster.scheduler().Output(),
      Catch::Contains("worker 0 (") && Catch::Contains("the data loader found a corrupt file"));
  CHECK_THAT(outcomes[0] + outcomes[1], Catch::Contains("the data loader found a corrupt file"));
}

TEST_CASE("server: Forget drops an initialized slice, and the key can be initialized again",
          "[dist][errors][collective]") {
  KVCluster cluster(1, 1);
  auto worker = ps::Runtime::Start(cluster.WorkerConfig());
  const int server = worker->ServerId(0);
  const auto deadline = [] { return std::chrono::steady_clock::now() + 10s; };
  const auto send = [&](ps::kv::Command command, ps::Key key, float value = 1.0f) {
    ps::kv::Request request;
    request.command = command;
    request.slices = {{key, 0, 2}};
    ps::Message msg = ps::kv::RequestMessage(request, server);
    if (command == ps::kv::kInit || command == ps::kv::kPush) {
      const std::vector<float> values(2, value);
      msg.data.push_back(ps::Blob::Copy(values.data(), sizeof(float) * 2, ps::DType::kFloat32));
    }
    return worker->RequestAndWait(std::move(msg), deadline()).error;
  };
  CHECK(send(ps::kv::kInit, 3) == "");
  // The same values again: worker 0's Init sent once more after a server died.
  CHECK(send(ps::kv::kInit, 3) == "");
  CHECK_THAT(send(ps::kv::kInit, 3, 2.0f), Catch::Contains("already initialized"));
  CHECK(send(ps::kv::kForget, 3) == "");
  CHECK_THAT(send(ps::kv::kPull, 3), Catch::Contains("never initialized"));
  CHECK(send(ps::kv::kInit, 3) == "");        // free again
  CHECK(send(ps::kv::kForget, 42) == "");     // a slice this server never had: nothing to do
  CHECK(send(ps::kv::kPush, 3, 5.0f) == "");  // one worker: its rounds close at once
  // Not the values of the Init any more: the same Init again is refused.
  CHECK_THAT(send(ps::kv::kInit, 3), Catch::Contains("already initialized"));
  worker->FinishWorker();
  CHECK(cluster.EndedCleanly());
}
