// The same-host shared-memory path: values of 64 KiB or more pass through a worker's
// segment instead of data frames. Exact values through the real ps-server processes, with
// the path on, off, busy (a slot still in use) and refused (a server that cannot map it).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "kvstore/shm/shared_segment.h"
#include "tests/kvstore/kv_cluster.h"
#include "tests/kvstore/kv_rounds.h"

namespace {

using ps::test::AllOk;
using ps::test::Env;
using ps::test::Expect;
using ps::test::KVCluster;
using ps::test::SyncSumRounds;

constexpr const char* kAttached = "attached the shared memory of worker";

// Small keys (frames), keys of 80 KB (one slot each), and a 1.2 MB key sliced over both
// servers in 256 KiB chunks (several slots per server).
const std::vector<std::size_t> kSizes = {5, 20000, 20000, 300000};

Env ShmEnv(const std::string& use_shm) {
  return {{"MXNET_KVSTORE_BIGARRAY_BOUND", "100000"},
          {"PS_CHUNK_BYTES", "262144"},
          {"PS_USE_SHM", use_shm},
          {"PS_VERBOSE", "1"}};
}

bool ServersAttached(KVCluster& cluster) {
  bool all = true;
  for (auto& server : cluster.servers()) {
    all = server->Output().find(kAttached) != std::string::npos && all;
  }
  return all;
}

bool AnyServerAttached(KVCluster& cluster) {
  for (auto& server : cluster.servers()) {
    if (server->Output().find(kAttached) != std::string::npos) return true;
  }
  return false;
}

// The full path of a program in PATH ("" when absent): child processes are started by execve.
std::string FindInPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::filesystem::path candidate = std::filesystem::path(dir) / program;
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

TEST_CASE("shared memory: same-host values pass through it with exact dist_sync sums",
          "[dist][shm]") {
  const bool use_pushpull = GENERATE(false, true);
  INFO((use_pushpull ? "PushPull" : "Push then Pull (the pull finds the slot busy)"));
  KVCluster cluster(2, 2, ShmEnv("1"));
  const auto outcomes = cluster.RunWorkers(
      "dist_sync", [&](ps::KVStore& kv) { SyncSumRounds(kv, kSizes, 10, use_pushpull); });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
  CHECK(ServersAttached(cluster));
}

TEST_CASE("shared memory: a replica reads forwarded updates from the workers' slots",
          "[dist][shm]") {
  // Each server is the other's replica and maps both workers' slots of the other's slices:
  // a round's sum (dist_sync) or a push (dist_async) is forwarded by naming the slot.
  const std::string mode = GENERATE(std::string("dist_sync"), std::string("dist_async"));
  INFO(mode);
  KVCluster cluster(2, 2, ShmEnv("1"));
  const auto outcomes = cluster.RunWorkers(mode, [&](ps::KVStore& kv) {
    if (mode == "dist_sync") {
      SyncSumRounds(kv, kSizes, 10, true);
      return;
    }
    constexpr std::size_t kSize = 300000;  // sliced over both servers, several slots each
    std::vector<float> value(kSize, 0.0f), grad(kSize, static_cast<float>(kv.Rank() + 1));
    kv.Init(3, ps::Tensor(value.data(), kSize));
    ps::OptimizerConfig sgd;
    sgd.learning_rate = 1.0f;
    kv.SetOptimizer(sgd);
    for (int round = 0; round < 10; ++round) {
      kv.Push(3, ps::Tensor(grad.data(), kSize));
      kv.WaitAll();  // the slot is free again: every push goes through it
    }
    kv.Barrier();
    kv.Pull(3, ps::Tensor(value.data(), kSize));
    kv.WaitAll();
    Expect(value == std::vector<float>(kSize, -30.0f),
           "expected -30 everywhere, element 0 is " + std::to_string(value[0]));
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
  for (auto& server : cluster.servers()) {
    const std::string output = server->Output();
    INFO(output);
    CHECK(output.find("forwards from the slots of worker") != std::string::npos);
  }
}

TEST_CASE("shared memory: PS_USE_SHM=0 keeps every value on the socket", "[dist][shm]") {
  KVCluster cluster(2, 2, ShmEnv("0"));
  const auto outcomes =
      cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) { SyncSumRounds(kv, kSizes, 5, true); });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
  CHECK_FALSE(AnyServerAttached(cluster));
}

TEST_CASE("shared memory: pushes issued while the slot is in use fall back to frames",
          "[dist][shm]") {
  KVCluster cluster(1, 2, ShmEnv("1"));
  constexpr int kRounds = 20;
  constexpr std::size_t kSize = 20000;
  const auto outcomes = cluster.RunWorkers("dist_async", [&](ps::KVStore& kv) {
    std::vector<float> value(kSize, 0.0f), grad(kSize, static_cast<float>(kv.Rank() + 1));
    kv.Init(3, ps::Tensor(value.data(), kSize));
    ps::OptimizerConfig sgd;
    sgd.learning_rate = 1.0f;
    kv.SetOptimizer(sgd);
    // No wait in between: most pushes find the slot owned by the one before.
    for (int round = 0; round < kRounds; ++round) kv.Push(3, ps::Tensor(grad.data(), kSize));
    kv.WaitAll();
    kv.Barrier();
    std::vector<float> zero(kSize, 0.0f);
    kv.PushPull(3, ps::Tensor(zero.data(), kSize), ps::Tensor(value.data(), kSize));
    kv.WaitAll();
    const float expected = -static_cast<float>(kRounds * (1 + 2));
    Expect(value == std::vector<float>(kSize, expected), "expected " + std::to_string(expected) +
                                                             " everywhere, element 0 is " +
                                                             std::to_string(value[0]));
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
  CHECK(ServersAttached(cluster));
}

TEST_CASE("shared memory: a server that cannot map the worker's memory gets frames instead",
          "[dist][shm]") {
  // In its own pid namespace the server cannot open /proc/<worker pid>/fd/<fd>.
  const std::string unshare = FindInPath("unshare");
  if (unshare.empty() ||
      std::system(
          (unshare + " --pid --fork --mount-proc --kill-child true >/dev/null 2>&1").c_str()) !=
          0) {
    WARN("skipped: unshare cannot make a pid namespace here (needs util-linux and root)");
    return;
  }
  KVCluster cluster(1, 2, ShmEnv("1"),
                    {unshare, "--pid", "--fork", "--mount-proc", "--kill-child"});
  const auto outcomes =
      cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) { SyncSumRounds(kv, kSizes, 5, true); });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
  CHECK_FALSE(AnyServerAttached(cluster));
}

// A worker makes one segment per server at each Init call, and the server maps each: past
// vm.max_map_count every mmap of the process fails, its allocations included. Each node maps at
// most PS_SHM_MAX_SEGMENTS (default: a quarter of vm.max_map_count); past it, values travel as
// frames and stay exact.
TEST_CASE("shared memory: a node past its most segments sends the rest as frames, exact",
          "[dist][shm]") {
  constexpr int kKeys = 6;
  constexpr std::size_t kElements = 20000;  // 80 KB: a slot each
  // Which node's limit is 3, the other's 1000.
  const bool server_limited = GENERATE(true, false);
  Env env = ShmEnv("1");
  env["PS_SHM_MAX_SEGMENTS"] = server_limited ? "3" : "1000";
  KVCluster cluster(1, 1, env);
  ps::ClusterConfig config = cluster.WorkerConfig();
  config.shm_max_segments = server_limited ? 1000 : 3;
  {
    auto kv = ps::KVStore::Create("dist_sync", config);
    std::vector<std::vector<float>> values(kKeys, std::vector<float>(kElements, 1.0f));
    for (int k = 0; k < kKeys; ++k) {  // one Init call per key: one segment each
      kv->Init(static_cast<ps::Key>(k), ps::Tensor(values[k].data(), kElements));
    }
    std::vector<float> grad(kElements, 2.0f);
    for (int k = 0; k < kKeys; ++k) {
      kv->PushPull(static_cast<ps::Key>(k), ps::Tensor(grad.data(), kElements),
                   ps::Tensor(values[k].data(), kElements));
    }
    kv->WaitAll();
    for (int k = 0; k < kKeys; ++k) {
      INFO("key " << k);
      CHECK(values[k] == std::vector<float>(kElements, 2.0f));  // the round's sum: one push
    }
  }
  CHECK(cluster.EndedCleanly());
  const std::string log = cluster.servers()[0]->Output();
  std::size_t attached = 0;
  for (std::size_t at = log.find(kAttached); at != std::string::npos;
       at = log.find(kAttached, at + 1)) {
    ++attached;
  }
  CHECK(attached == 3);
  if (server_limited) {
    CHECK_THAT(log, Catch::Contains("server 0 maps 3 shared-memory segments, its most "
                                    "(PS_SHM_MAX_SEGMENTS)"));
  }
}

TEST_CASE("shared memory: a segment attaches only to the memfd and token announced", "[shm]") {
  const auto created = ps::SharedSegment::Create(1 << 16);
  const ps::SharedSegment::Descriptor where = created->descriptor();
  {
    const auto attached = ps::SharedSegment::Attach(where);
    std::memcpy(attached->data() + ps::SharedSegment::kHeaderBytes, "hello", 5);
    CHECK(std::memcmp(created->data() + ps::SharedSegment::kHeaderBytes, "hello", 5) == 0);
  }
  ps::SharedSegment::Descriptor wrong_token = where;
  wrong_token.token ^= 1;
  CHECK_THROWS_WITH(ps::SharedSegment::Attach(wrong_token), Catch::Contains("token mismatch"));
  ps::SharedSegment::Descriptor wrong_size = where;
  wrong_size.bytes += 4096;
  CHECK_THROWS_WITH(ps::SharedSegment::Attach(wrong_size),
                    Catch::Contains("is not the shared-memory segment announced"));
  // Any other file, even one the server could open and write, is refused.
  const std::string path = std::filesystem::temp_directory_path() / "ps-shm-test-regular-file";
  {
    std::FILE* file = std::fopen(path.c_str(), "w");
    REQUIRE(file != nullptr);
    std::fputs("not a segment", file);
    std::fclose(file);
  }
  const int fd = open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  ps::SharedSegment::Descriptor regular{getpid(), fd, 13, 0};
  regular.bytes = 8192;
  CHECK_THROWS_WITH(ps::SharedSegment::Attach(regular),
                    Catch::Contains("is not a KVStore shared-memory segment"));
  close(fd);
  std::filesystem::remove(path);
  ps::SharedSegment::Descriptor gone = where;
  gone.fd = 100000;
  CHECK_THROWS_WITH(ps::SharedSegment::Attach(gone), Catch::Contains("cannot open /proc/"));
}
