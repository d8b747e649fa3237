// Gradient compression in real jobs: ps-scheduler and ps-server processes, workers as threads
// of this test (each KVStore with its own runtime and transport). Integer-valued data whose
// results are worked out by hand (2bit, dist_sync and dist_async), the other codecs and
// compressed pulls against a simulation built on the reference codecs, every wrong use, and
// the bytes the transport counts on the wire.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "kvstore/dist/kv_protocol.h"
#include "ps/runtime.h"
#include "tests/kvstore/compression_reference.h"
#include "tests/kvstore/kv_cluster.h"
#include "tests/kvstore/kv_rounds.h"
#include "tests/util/temp_dir.h"

namespace {

using ps::test::AllOk;
using ps::test::Expect;
using ps::test::KVCluster;
namespace reference = ps::test::reference;

using ps::test::ErrorOf;
using ps::test::Has;

// A key of 3000 floats is cut into 3 slices of 1000 over the 2 servers (compressed one by one);
// a key of 5 lives whole on one server.
const ps::test::Env kSliced = {{"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"},
                               {"PS_CHUNK_BYTES", "4096"}};
constexpr std::size_t kBig = 3000;
constexpr std::size_t kSmall = 5;
const std::vector<std::size_t> kBigSlices = {0, 1000, 2000, 3000};  // the slices' bounds

// The hand-worked job: threshold 1, SGD at learning rate 1 (value -= the round's sum), every
// value starting at 10, two workers, gradients by element class c = i % 3:
//   c = 0: both push +1      -> each sends +1 every round: sums 2, 2, 2  -> 8, 6, 4
//   c = 1: +0.5 and -0.5     -> 0 / +1 / 0 and 0 / -1 / 0: sums 0, 0, 0 -> 10, 10, 10
//   c = 2: +0.75 and +3      -> 0 / +1 / +1 and +1 / +1 / +1: sums 1, 2, 2 -> 9, 7, 5
// (worker 0's residual for c = 2: 0.75, 0.5, 0.25; worker 1's: 2, 4, 6).
float HandGradient(int rank, std::size_t i) {
  switch (i % 3) {
    case 0:
      return 1.0f;
    case 1:
      return rank == 0 ? 0.5f : -0.5f;
    default:
      return rank == 0 ? 0.75f : 3.0f;
  }
}
float HandValue(int round, std::size_t i) {  // after `round` rounds (1-based)
  static const float table[3][3] = {{8, 6, 4}, {10, 10, 10}, {9, 7, 5}};
  return table[i % 3][round - 1];
}

ps::OptimizerConfig Sgd() {
  ps::OptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.learning_rate = 1.0f;
  return sgd;
}

// Init keys 3 (kBig) and 4 (kSmall) at 10, SGD at rate 1, then `compression`.
void Setup(ps::KVStore& kv, const ps::GradientCompression& compression) {
  std::vector<float> big(kBig, 10.0f), small(kSmall, 10.0f);
  kv.Init({3, 4}, {ps::Tensor(big.data(), kBig), ps::Tensor(small.data(), kSmall)});
  kv.SetOptimizer(Sgd());
  kv.SetGradientCompression(compression);
}

void RunHandJob(const std::string& type) {
  KVCluster cluster(2, 2, kSliced);
  const auto outcomes = cluster.RunWorkers(type, [&](ps::KVStore& kv) {
    Setup(kv, {.type = "2bit", .threshold = 1.0f});
    std::vector<float> big(kBig), small(kSmall), out_big(kBig), out_small(kSmall);
    for (std::size_t i = 0; i < kBig; ++i) big[i] = HandGradient(kv.Rank(), i);
    for (std::size_t i = 0; i < kSmall; ++i) small[i] = HandGradient(kv.Rank(), i);
    for (int round = 1; round <= 3; ++round) {
      kv.PushPull({3, 4}, {ps::Tensor(big.data(), kBig), ps::Tensor(small.data(), kSmall)},
                  {ps::Tensor(out_big.data(), kBig), ps::Tensor(out_small.data(), kSmall)});
      kv.WaitAll();
      if (type != "dist_sync") continue;  // dist_async: only the end is fixed
      for (std::size_t i = 0; i < kBig; ++i) {
        Expect(out_big[i] == HandValue(round, i), "round " + std::to_string(round) +
                                                      " key 3 element " + std::to_string(i) + ": " +
                                                      std::to_string(out_big[i]));
      }
      for (std::size_t i = 0; i < kSmall; ++i) {
        Expect(out_small[i] == HandValue(round, i), "round " + std::to_string(round) + " key 4");
      }
    }
    kv.Barrier();  // every push is in
    kv.Pull({3, 4}, {ps::Tensor(out_big.data(), kBig), ps::Tensor(out_small.data(), kSmall)});
    kv.WaitAll();
    for (std::size_t i = 0; i < kBig; ++i) {
      Expect(out_big[i] == HandValue(3, i), "final key 3 element " + std::to_string(i));
    }
    for (std::size_t i = 0; i < kSmall; ++i) Expect(out_small[i] == HandValue(3, i), "final key 4");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

// Gradients that change each round and are not integers, for the codecs with scales.
std::vector<float> RoundGradient(int rank, int round) {
  std::vector<float> g(kBig);
  for (std::size_t i = 0; i < kBig; ++i) {
    g[i] = static_cast<float>(
               (static_cast<int>(i * 7 + static_cast<std::size_t>(round) * 13) % 23) - 11) *
           0.0625f * static_cast<float>(rank + 1);
  }
  return g;
}

// Key 3's values as the reference codecs make them, per round: each of two workers encodes its
// RoundGradient per slice (with its residual), the servers add the decoded pushes (with two
// workers the order does not matter) and SGD at rate 1 subtracts the sum. With a pull codec,
// each worker's copy follows the server's value through encoded changes after the first pull,
// which carries the full value. Returns what every worker pulls, per round.
std::vector<std::vector<float>> Simulate(const std::string& type, const std::string& pull_type,
                                         int rounds) {
  constexpr float kThreshold = 0.5f;
  const std::size_t n = kBig;
  std::vector<float> value(n, 10.0f), mirror, copy;
  std::vector<std::vector<float>> residual(2, std::vector<float>(n, 0.0f)), pulled;
  for (int round = 0; round < rounds; ++round) {
    std::vector<float> sum(n, 0.0f);
    for (int w = 0; w < 2; ++w) {
      const std::vector<float> grad = RoundGradient(w, round);
      for (std::size_t s = 0; s + 1 < kBigSlices.size(); ++s) {
        const std::size_t begin = kBigSlices[s], end = kBigSlices[s + 1];
        std::vector<float> sent(grad.begin() + begin, grad.begin() + end);
        if (type != "none") {
          std::vector<float> r(residual[w].begin() + begin, residual[w].begin() + end);
          const auto codes = reference::EncodePush(type.c_str(), kThreshold, sent, r);
          std::copy(r.begin(), r.end(), residual[w].begin() + begin);
          sent = reference::Decode(type.c_str(), kThreshold, codes, end - begin);
        }
        for (std::size_t i = begin; i < end; ++i) {
          sum[i] = w == 0 ? sent[i - begin] : sum[i] + sent[i - begin];
        }
      }
    }
    for (std::size_t i = 0; i < n; ++i) value[i] = value[i] - sum[i];  // SGD at rate 1
    if (pull_type == "none") {
      pulled.push_back(value);
      continue;
    }
    if (round == 0) {
      mirror = value;
      copy = value;
    } else {
      for (std::size_t s = 0; s + 1 < kBigSlices.size(); ++s) {
        const std::size_t begin = kBigSlices[s], end = kBigSlices[s + 1];
        std::vector<float> v(value.begin() + begin, value.begin() + end);
        std::vector<float> m(mirror.begin() + begin, mirror.begin() + end);
        const auto codes = reference::EncodeDelta(pull_type.c_str(), kThreshold, v, m);
        std::copy(m.begin(), m.end(), mirror.begin() + begin);
        const auto change = reference::Decode(pull_type.c_str(), kThreshold, codes, end - begin);
        for (std::size_t i = begin; i < end; ++i) copy[i] = copy[i] + change[i - begin];
      }
    }
    pulled.push_back(copy);
  }
  return pulled;
}

void RunSimulatedJob(const std::string& type, const std::string& pull_type) {
  constexpr int kRounds = 4;
  KVCluster cluster(2, 2, kSliced);
  std::vector<std::vector<std::vector<float>>> seen(2);  // per rank, per round
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    Setup(kv, {.type = type, .threshold = 0.5f, .pull_type = pull_type});
    std::vector<float> out(kBig);
    for (int round = 0; round < kRounds; ++round) {
      std::vector<float> grad = RoundGradient(kv.Rank(), round);
      kv.PushPull(3, ps::Tensor(grad.data(), kBig), ps::Tensor(out.data(), kBig));
      kv.WaitAll();
      seen[static_cast<std::size_t>(kv.Rank())].push_back(out);
    }
  });
  REQUIRE(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
  const auto expected = Simulate(type, pull_type, kRounds);
  for (std::size_t round = 0; round < kRounds; ++round) {
    INFO("round " << round + 1);
    CHECK(seen[0][round] == seen[1][round]);  // identical on every worker
    CHECK(seen[0][round] == expected[round]);
  }
}

}  // namespace

TEST_CASE("dist_sync 2bit: two workers, two servers, values worked out by hand",
          "[dist][compression]") {
  RunHandJob("dist_sync");
}

TEST_CASE("dist_async 2bit: two workers, two servers, the final value worked out by hand",
          "[dist][compression]") {
  RunHandJob("dist_async");
}

namespace {

// The hand-worked job's values per element class (c = i % 3) after each of `rounds`, run from
// round `first` on, by a fresh job that loads the checkpoint in `dir` first (empty: none).
// Both workers pull the same in dist_sync; worker 0's are returned. `after_round(kv, round)`
// runs on each worker once a round is complete; `set_again` sets the compression once more
// after the load.
using RoundHook = std::function<void(ps::KVStore&, int)>;
std::vector<std::vector<float>> HandRounds(const std::string& dir, int first, int last,
                                           const RoundHook& after_round = {},
                                           bool set_again = false) {
  std::vector<std::vector<float>> classes;
  KVCluster cluster(2, 2, kSliced);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    Setup(kv, {.type = "2bit", .threshold = 1.0f});
    if (!dir.empty()) kv.LoadCheckpoint(dir);
    if (set_again) kv.SetGradientCompression({.type = "2bit", .threshold = 1.0f});
    std::vector<float> big(kBig), out(kBig);
    for (std::size_t i = 0; i < kBig; ++i) big[i] = HandGradient(kv.Rank(), i);
    for (int round = first; round <= last; ++round) {
      kv.PushPull(3, ps::Tensor(big.data(), kBig), ps::Tensor(out.data(), kBig));
      kv.WaitAll();
      if (kv.Rank() == 0) classes.push_back({out[0], out[1], out[2]});
      if (after_round) after_round(kv, round);
    }
  });
  REQUIRE(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
  return classes;
}

}  // namespace

TEST_CASE("dist_sync 2bit: a checkpoint keeps each worker's push residuals",
          "[dist][compression]") {
  // The hand-worked job saved after round 1 and resumed goes on exactly as the job that never
  // stopped (8, 10, 9 -> 6, 10, 7 -> 4, 10, 5). Started at zero, the residuals would give
  // 6, 10, 8 after round 2: worker 0's 0.75 of class 2 would be lost.
  namespace fs = std::filesystem;
  ps::test::TempDir one, two, lacking, aside;
  // Left in `one` by an earlier save of 3 workers, one killed while it wrote: they go.
  for (const char* name : {"worker-2.psres", ".worker-0.psres.tmp.4242"}) {
    std::ofstream(one.path() + "/" + name) << "stale";
  }
  const auto unstopped = HandRounds("", 1, 3, [&](ps::KVStore& kv, int round) {
    if (round == 1) {
      kv.SaveCheckpoint(one.path());
      kv.SaveCheckpoint(two.path());
      if (kv.Rank() == 0) fs::copy_file(two.path() + "/worker-0.psres", aside.path() + "/r1");
    }
    if (round == 2) kv.SaveCheckpoint(two.path());  // the round-1 files give way
  });
  REQUIRE(unstopped == std::vector<std::vector<float>>{{8, 10, 9}, {6, 10, 7}, {4, 10, 5}});
  CHECK(fs::exists(one.path() + "/worker-0.psres"));
  CHECK(fs::exists(one.path() + "/worker-1.psres"));
  CHECK_FALSE(fs::exists(one.path() + "/worker-2.psres"));
  CHECK_FALSE(fs::exists(one.path() + "/.worker-0.psres.tmp.4242"));
  CHECK(HandRounds(one.path(), 2, 3) == std::vector<std::vector<float>>{{6, 10, 7}, {4, 10, 5}});
  // The same compression set again after the load keeps what it restored.
  CHECK(HandRounds(one.path(), 2, 2, {}, true) == std::vector<std::vector<float>>{{6, 10, 7}});
  // Worker 1's file lost: its residuals start at zero (class 1: its -0.5 is not sent in round
  // 2, worker 0's restored 0.5 is: 9), worker 0's are restored (class 2 as before: 7).
  fs::copy(one.path(), lacking.path(), fs::copy_options::recursive);
  fs::remove(lacking.path() + "/worker-1.psres");
  CHECK(HandRounds(lacking.path(), 2, 2) == std::vector<std::vector<float>>{{6, 9, 7}});
  // Worker 0's file of the first save into `two`, beside the second save's MANIFEST: not used
  // (worker 0's class-2 residual 0.5 is lost, so round 3 gives 6, not 5).
  fs::copy_file(aside.path() + "/r1", two.path() + "/worker-0.psres",
                fs::copy_options::overwrite_existing);
  CHECK(HandRounds(two.path(), 3, 3) == std::vector<std::vector<float>>{{4, 10, 6}});
}

TEST_CASE("dist_sync 1bit and fp16: every worker gets the reference codecs' values",
          "[dist][compression]") {
  SECTION("1bit") { RunSimulatedJob("1bit", "none"); }
  SECTION("fp16") { RunSimulatedJob("fp16", "none"); }
  SECTION("2bit") { RunSimulatedJob("2bit", "none"); }
}

TEST_CASE("dist_sync compressed pulls: each worker's copy follows the encoded changes",
          "[dist][compression]") {
  SECTION("2bit push, fp16 pull") { RunSimulatedJob("2bit", "fp16"); }
  SECTION("fp16 push, 1bit pull") { RunSimulatedJob("fp16", "1bit"); }
  SECTION("no push compression, 2bit pull") { RunSimulatedJob("none", "2bit"); }
}

TEST_CASE("dist kvstore: a wrong compression setting fails on every worker, then a good one works",
          "[dist][compression][errors]") {
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(4, 1.0f);
    kv.Init(1, ps::Tensor(value.data(), 4));
    const std::string type = ErrorOf([&] { kv.SetGradientCompression({.type = "3bit"}); });
    Expect(Has(type,
               "dist kvstore: SetGradientCompression: unknown type '3bit' (accepted: 2bit, "
               "1bit, fp16, none)"),
           "type: " + type);
    const std::string threshold =
        ErrorOf([&] { kv.SetGradientCompression({.type = "2bit", .threshold = -1.0f}); });
    Expect(Has(threshold, "threshold must be a finite number greater than 0, given -1"),
           "threshold: " + threshold);
    const std::string pull =
        ErrorOf([&] { kv.SetGradientCompression({.type = "2bit", .pull_type = "int8"}); });
    Expect(Has(pull, "unknown pull_type 'int8'"), "pull_type: " + pull);
    // Nothing was set: the store works, and then compresses once it is set.
    kv.SetGradientCompression({.type = "2bit", .threshold = 0.5f});
    std::vector<float> grad(4, 0.75f), out(4);
    kv.PushPull(1, ps::Tensor(grad.data(), 4), ps::Tensor(out.data(), 4));
    kv.WaitAll();
    Expect(out == std::vector<float>(4, 1.0f), "two workers' +0.5 stored as the sum");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE(
    "dist kvstore: workers asking for different compressions fail on every worker, naming "
    "both",
    "[dist][compression][errors][collective]") {
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    const float threshold = kv.Rank() == 0 ? 0.5f : 1.0f;
    const std::string mixed =
        ErrorOf([&] { kv.SetGradientCompression({.type = "2bit", .threshold = threshold}); });
    Expect(Has(mixed, "SetGradientCompression failed on every worker") &&
               Has(mixed,
                   "worker 0 called SetGradientCompression type=2bit threshold=0.5 "
                   "pull_type=none") &&
               Has(mixed,
                   "worker 1 called SetGradientCompression type=2bit threshold=1 "
                   "pull_type=none"),
           "thresholds: " + mixed);
    const std::string types = ErrorOf([&] {
      kv.SetGradientCompression({.type = kv.Rank() == 0 ? "2bit" : "fp16", .threshold = 0.5f});
    });
    Expect(
        Has(types, "failed on every worker") && Has(types, "type=2bit") && Has(types, "type=fp16"),
        "types: " + types);
    // A worker whose own checks fail makes the others fail too.
    const std::string one_bad = ErrorOf([&] {
      kv.SetGradientCompression({.type = kv.Rank() == 0 ? "2bit" : "bogus", .threshold = 0.5f});
    });
    if (kv.Rank() == 0) {
      Expect(Has(one_bad, "SetGradientCompression failed on every worker: worker 1 failed") &&
                 Has(one_bad, "unknown type 'bogus'"),
             "rank 0: " + one_bad);
    }
    kv.SetGradientCompression({.type = "fp16"});  // agreeing works
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: SetGradientCompression after a push fails on every worker",
          "[dist][compression][errors]") {
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(4, 1.0f), out(4);
    kv.Init(1, ps::Tensor(value.data(), 4));
    kv.Push(1, ps::Tensor(value.data(), 4));
    kv.WaitAll();
    const std::string error =
        ErrorOf([&] { kv.SetGradientCompression({.type = "2bit", .threshold = 0.5f}); });
    Expect(Has(error,
               "SetGradientCompression: this worker already pushed: set the compression "
               "before the first Push"),
           "message: " + error);
    // Uncompressed pushes go on.
    kv.PushPull(1, ps::Tensor(value.data(), 4), ps::Tensor(out.data(), 4));
    kv.WaitAll();
    Expect(out == std::vector<float>(4, 2.0f), "the sum of two uncompressed pushes");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("dist kvstore: an empty Push pushes nothing, so the compression may still be set",
          "[dist][compression]") {
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(4, 1.0f), out(4);
    kv.Init(1, ps::Tensor(value.data(), 4));
    kv.Push(std::vector<ps::Key>{}, std::vector<ps::Tensor>{});
    kv.WaitAll();
    kv.SetGradientCompression({.type = "fp16"});
    kv.PushPull(1, ps::Tensor(value.data(), 4), ps::Tensor(out.data(), 4));
    kv.WaitAll();
    Expect(out == std::vector<float>(4, 2.0f), "the sum of two fp16 pushes of 1");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("server: refuses compressed requests it cannot decode, and a late compression change",
          "[dist][compression][errors]") {
  KVCluster cluster(1, 1);
  auto runtime = ps::Runtime::Start(cluster.WorkerConfig());
  const int server = runtime->ServerId(0);
  const auto ask = [&](const ps::kv::Request& request, std::vector<ps::Blob> frames = {}) {
    ps::Message msg = ps::kv::RequestMessage(request, server);
    msg.data = std::move(frames);
    return runtime
        ->RequestAndWait(std::move(msg),
                         std::chrono::steady_clock::now() + std::chrono::seconds(10))
        .error;
  };
  const auto floats = [](std::size_t n, float v) {
    const std::vector<float> values(n, v);
    return ps::Blob::Copy(values.data(), n * sizeof(float), ps::DType::kFloat32);
  };
  const auto bytes = [](std::size_t n, std::uint8_t v) {
    return ps::Blob::FromVector(std::vector<std::uint8_t>(n, v), ps::DType::kUInt8);
  };
  ps::kv::Request init;
  init.command = ps::kv::kInit;
  init.slices = {{7, 0, 20}};
  REQUIRE(ask(init, {floats(20, 1.0f)}) == "");
  ps::kv::Request push;
  push.command = ps::kv::kPush;
  push.slices = {{7, 0, 20}};
  CHECK_THAT(ask(push, {bytes(8, 0xFF)}),
             Catch::Contains("key 7: a compressed push, but no gradient compression is set"));
  ps::kv::Request set;
  set.command = ps::kv::kSetCompression;
  set.compression = {.type = "2bit", .threshold = 0.5f};
  REQUIRE(ask(set) == "");
  CHECK_THAT(ask(push, {bytes(7, 0xFF)}),
             Catch::Contains("key 7: size mismatch: a 2bit push of 20 of its 20 elements is 8 "
                             "bytes, given 7 bytes"));
  ps::kv::Request pull;
  pull.command = ps::kv::kPull;
  pull.slices = {{7, 0, 20}};
  pull.pulls = {{0, 1}};
  CHECK_THAT(ask(pull), Catch::Contains("a compressed pull, but no pull compression is set"));
  ps::kv::Request bad_set = set;
  bad_set.compression.threshold = 0.0f;
  CHECK_THAT(ask(bad_set), Catch::Contains("threshold must be a finite number greater than 0"));
  // A good compressed push: 20 values of +0.5 (all codes 11), then the value is their sum.
  REQUIRE(ask(push, {bytes(8, 0xFF)}) == "");
  ps::kv::Request change = set;
  change.compression.type = "fp16";
  CHECK_THAT(ask(change), Catch::Contains("the compression cannot change after the first push"));
  CHECK(ask(set) == "");  // the same setting again is fine
  const ps::RequestResult pulled =
      runtime->RequestAndWait(ps::kv::RequestMessage(
                                  [&] {
                                    ps::kv::Request plain = pull;
                                    plain.pulls.clear();
                                    return plain;
                                  }(),
                                  server),
                              std::chrono::steady_clock::now() + std::chrono::seconds(10));
  REQUIRE(pulled.ok());
  REQUIRE(pulled.responses.at(0).data.size() == 1);
  const auto value = pulled.responses[0].data[0].as<float>();
  CHECK(std::vector<float>(value.begin(), value.end()) == std::vector<float>(20, 0.5f));
  runtime->FinishWorker();
  runtime.reset();
  CHECK(cluster.EndedCleanly());
}

namespace {

// Bytes one worker's transport sent and received per PushPull of a 4 MiB key, over the
// socket (PS_USE_SHM=0: the same-host path would hide the uncompressed bytes).
struct Wire {
  double sent = 0;
  double received = 0;
};
Wire MeasureWire(const ps::GradientCompression& compression) {
  constexpr std::size_t kValues = std::size_t{1} << 20;
  constexpr int kRounds = 5;
  KVCluster cluster(1, 1, {{"PS_USE_SHM", "0"}});
  Wire wire;
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(kValues, 1.0f), grad(kValues, 0.75f), out(kValues);
    kv.Init(0, ps::Tensor(value.data(), kValues));
    kv.SetOptimizer(Sgd());
    kv.SetGradientCompression(compression);
    // The first round pulls the full value (no copy yet): measure the ones after it.
    kv.PushPull(0, ps::Tensor(grad.data(), kValues), ps::Tensor(out.data(), kValues));
    kv.WaitAll();
    const ps::TrafficStats before = kv.Traffic();
    for (int round = 0; round < kRounds; ++round) {
      kv.PushPull(0, ps::Tensor(grad.data(), kValues), ps::Tensor(out.data(), kValues));
      kv.WaitAll();
    }
    const ps::TrafficStats after = kv.Traffic();
    wire.sent = static_cast<double>(after.bytes_sent - before.bytes_sent) / kRounds;
    wire.received = static_cast<double>(after.bytes_received - before.bytes_received) / kRounds;
  });
  REQUIRE(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
  return wire;
}

}  // namespace

TEST_CASE(
    "dist kvstore: a 2bit push puts at most 1/15 of the bytes on the wire, and so does a "
    "2bit pull",
    "[dist][compression][wire]") {
  const Wire plain = MeasureWire({.type = "none"});
  const Wire compressed = MeasureWire({.type = "2bit", .threshold = 0.5f, .pull_type = "2bit"});
  const Wire half = MeasureWire({.type = "fp16", .pull_type = "fp16"});
  INFO("bytes per push+pull sent / received: none "
       << plain.sent << " / " << plain.received << ", 2bit " << compressed.sent << " / "
       << compressed.received << ", fp16 " << half.sent << " / " << half.received);
  CHECK(plain.sent >= 4.0 * (1 << 20));  // the whole key crossed
  CHECK(compressed.sent <= plain.sent / 15);
  CHECK(compressed.received <= plain.received / 15);
  CHECK(half.sent <= plain.sent / 1.9);
  CHECK(half.received <= plain.received / 1.9);
}

TEST_CASE("dist_sync 2bit: big compressed slices skip shared memory, other keys keep it",
          "[dist][compression]") {
  // Same-host shared memory on (the default): key 1's slices (400 KB) have slots, which its
  // compressed pushes and pulls leave alone; the int32 key 2 beside it still takes its slot. No
  // optimizer: the value is the round's sum (hand values as in the 2bit job above).
  constexpr std::size_t kN = 100000;
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> zeros(kN, 0.0f), grad(kN), out(kN);
    std::vector<std::int32_t> ints(kN, 0), int_grad(kN), int_out(kN);
    kv.Init({1, 2}, {ps::Tensor(zeros.data(), kN), ps::Tensor(ints.data(), kN)});
    kv.SetGradientCompression({.type = "2bit", .threshold = 1.0f});
    for (std::size_t i = 0; i < kN; ++i) {
      grad[i] = HandGradient(kv.Rank(), i);
      int_grad[i] = static_cast<std::int32_t>(i % 1000) * (kv.Rank() + 1);
    }
    const float sums[3][3] = {{2, 2, 2}, {0, 0, 0}, {1, 2, 2}};
    for (int round = 0; round < 3; ++round) {
      kv.PushPull({1, 2}, {ps::Tensor(grad.data(), kN), ps::Tensor(int_grad.data(), kN)},
                  {ps::Tensor(out.data(), kN), ps::Tensor(int_out.data(), kN)});
      kv.WaitAll();
      for (std::size_t i = 0; i < kN; ++i) {
        Expect(out[i] == sums[i % 3][round], "key 1 round " + std::to_string(round));
        Expect(int_out[i] == static_cast<std::int32_t>(i % 1000) * 3, "key 2");
      }
    }
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("kv protocol: compression fields round-trip, malformed ones are rejected",
          "[compression][protocol]") {
  std::string error;
  ps::kv::Request set;
  set.command = ps::kv::kSetCompression;
  set.compression = {.type = "1bit", .threshold = 0.25f, .pull_type = "fp16"};
  ps::Message msg = ps::kv::RequestMessage(set, 1);
  auto decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->command == ps::kv::kSetCompression);
  CHECK(decoded->compression.type == "1bit");
  CHECK(decoded->compression.threshold == 0.25f);
  CHECK(decoded->compression.pull_type == "fp16");
  CHECK(ps::kv::CommandName(ps::kv::kSetCompression) == "SetGradientCompression");

  // A PushPull with one compressed slice (uint8 codes, fewer "elements" than the slice or
  // more: the server checks the size) and one plain one, both pulled compressed.
  ps::kv::Request push;
  push.command = ps::kv::kPushPull;
  push.slices = {{7, 0, 2}, {9, 4, 10}};
  push.pulls = {{0, 1}, {3, 4}};
  msg = ps::kv::RequestMessage(push, 1);
  std::vector<float> values(6);
  msg.data = {ps::Blob::FromVector(std::vector<std::uint8_t>(4, 0xFF), ps::DType::kUInt8),
              ps::Blob::Copy(values.data(), 24, ps::DType::kFloat32)};
  decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->slices == push.slices);
  CHECK(decoded->pulls == push.pulls);

  // Pull states of the wrong count, or on a command that pulls nothing, are rejected.
  push.pulls = {{0, 1}};
  msg.meta.body = ps::kv::EncodeBody(push);
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("malformed compressed-pull list in a PushPull request"));
  ps::kv::Request plain_push = push;
  plain_push.command = ps::kv::kPush;
  plain_push.pulls = {{0, 1}, {0, 2}};
  msg.meta.head = ps::kv::kPush;
  msg.meta.body = ps::kv::EncodeBody(plain_push);
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("malformed compressed-pull list in a Push request"));
  msg.meta.head = ps::kv::kLastCommand + 1;
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("unknown KVStore command " +
                                    std::to_string(ps::kv::kLastCommand + 1)));
}
