// The server must survive anything a peer sends: a worker runtime of this test sends the real
// ps-server thousands of random KVStore requests (random commands, keys, slices, totals,
// dtypes, frame sizes, shared-memory references, bodies of random bytes), every one of which
// must be answered, with success or an error, and none of which may touch a key it does not
// validly address. A canary key's value is tracked exactly throughout.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvstore/dist/kv_protocol.h"
#include "kvstore/server/kv_server.h"
#include "kvstore/shm/shared_segment.h"
#include "ps/runtime.h"
#include "tests/kvstore/kv_cluster.h"

namespace {

using namespace std::chrono_literals;
using ps::kv::Request;

constexpr ps::Key kCanary = 1;
constexpr std::size_t kCanaryLength = 8;
constexpr int kRequests = 3000;

class Fuzzer {
 public:
  Fuzzer(std::uint32_t seed, int server, const ps::SharedSegment& segment)
      : random_(seed), server_(server), segment_(segment) {}

  // A request that may or may not be valid; never one that addresses the canary key, never
  // a valid SetOptimizer (it would change the canary's update rule), never an attach of a
  // real segment other than the test's own.
  ps::Message Next() {
    Request request;
    // Commands 1..7 and SetCompression (10); never the checkpoint commands, which write files.
    const int command = Pick(1, 8);
    request.command =
        static_cast<ps::kv::Command>(command == 8 ? ps::kv::kSetCompression : command);
    request.sync = Pick(0, 1) == 1;
    const int slices = Pick(0, 3);
    for (int i = 0; i < slices; ++i) {
      const ps::Key key = Key();
      request.slices.push_back({key, Pick(0, 4) == 0 ? Small() : 0, Total(key)});
    }
    for (int i = 0; i < slices; ++i) {
      if (Pick(0, 3) != 0) continue;
      const std::uint64_t bytes = Pick(0, 3) == 0 ? Small() : request.slices[i].total * 4;
      request.shm.push_back({static_cast<std::uint32_t>(Pick(0, 4) == 0 ? Pick(0, slices) : i),
                             static_cast<std::uint32_t>(Pick(0, 4) == 0 ? 1 : 0),
                             Pick(0, 4) == 0 ? Small() * 8192 : 4096 + Small() * 64, bytes});
    }
    if (request.command == ps::kv::kSetOptimizer) {
      request.optimizer.name = Pick(0, 1) ? "" : "fuzz";
      request.optimizer.learning_rate = -1.0f;
    }
    if (request.command == ps::kv::kSetCompression) {
      // Often valid: compressed pushes of the fuzz keys then decode (the canary's pushes are
      // plain float32, which a server with compression still takes).
      static const char* const kTypes[] = {"2bit", "1bit", "fp16", "none", "", "7bit"};
      request.compression.type = kTypes[Pick(0, 5)];
      request.compression.pull_type = kTypes[Pick(0, 5)];
      const float thresholds[] = {0.5f, 1.0f, 0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()};
      request.compression.threshold = thresholds[Pick(0, 4)];
    }
    if ((request.command == ps::kv::kPull || request.command == ps::kv::kPushPull ||
         Pick(0, 20) == 0) &&
        Pick(0, 2) == 0) {
      // Compressed pulls: one state per slice, or a list of the wrong length.
      const int states = Pick(0, 4) == 0 ? Pick(0, 4) : slices;
      for (int i = 0; i < states; ++i) {
        request.pulls.push_back({Small(), Pick(0, 3) == 0 ? 0 : Small() + 1});
      }
    }
    if (request.command == ps::kv::kShmAttach) {
      request.segment_id = static_cast<std::uint32_t>(Pick(1, 2));  // segment 0 stays the real one
      request.segment = segment_.descriptor();
      switch (Pick(0, 3)) {  // all but one wrong in some way
        case 0:
          request.segment.token ^= 1;
          break;
        case 1:
          request.segment.bytes += 4096;
          break;
        case 2:
          request.segment.pid = 0x7ffffff0;  // no such process
          break;
        default:
          break;
      }
    }
    ps::Message msg = ps::kv::RequestMessage(request, server_);
    if (Pick(0, 30) == 0) msg.meta.app_id = Pick(2, 9);
    if (Pick(0, 30) == 0) msg.meta.head = Pick(-2, ps::kv::kLastCommand + 2);
    if (Pick(0, 20) == 0) {  // a body of random bytes
      msg.meta.body.resize(static_cast<std::size_t>(Pick(0, 40)));
      for (char& c : msg.meta.body) c = static_cast<char>(Pick(0, 255));
    }
    const bool carries_values = request.command == ps::kv::kInit ||
                                request.command == ps::kv::kPush ||
                                request.command == ps::kv::kPushPull;
    const int frames = Pick(0, 10) == 0 ? Pick(0, 3) : carries_values ? slices : 0;
    for (int i = 0; i < frames; ++i) {
      // Mostly float32; uint8 (a compressed gradient) often enough to reach the decoders.
      const auto dtype = Pick(0, 6) == 0   ? static_cast<ps::DType>(Pick(0, 6))
                         : Pick(0, 5) == 0 ? ps::DType::kUInt8
                                           : ps::DType::kFloat32;
      // Mostly the length of the frame's slice, the size a valid request would give; empty
      // when the slice travels through shared memory.
      std::size_t count = Small();
      if (dtype == ps::DType::kUInt8 && Pick(0, 1) == 0) count = Small() * 4;  // 2bit-like sizes
      if (i < slices && Pick(0, 5) != 0) {
        const auto& slice = request.slices[static_cast<std::size_t>(i)];
        const bool in_shm = std::any_of(
            request.shm.begin(), request.shm.end(),
            [&](const auto& ref) { return ref.slice == static_cast<std::uint32_t>(i); });
        count = in_shm ? 0 : slice.total - std::min(slice.offset, slice.total);
      }
      std::vector<std::byte> bytes(count * ps::DTypeSize(dtype), std::byte{1});
      msg.data.push_back(ps::Blob::FromVector(std::move(bytes), dtype));
    }
    return msg;
  }

 private:
  int Pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random_); }
  std::uint64_t Small() { return static_cast<std::uint64_t>(Pick(0, 12)); }
  ps::Key Key() {
    if (Pick(0, 20) == 0) return static_cast<ps::Key>(random_()) << 32 | random_();
    return static_cast<ps::Key>(100 + Pick(0, 3));  // the fuzz keys, often initialized
  }
  // Mostly the one length a fuzz key is initialized with, so that many requests are valid.
  std::uint64_t Total(ps::Key key) { return Pick(0, 5) == 0 ? Small() : 4 * (key % 4 + 1); }

  std::mt19937 random_;
  int server_;
  const ps::SharedSegment& segment_;
};

// One request answered in time; returns its error ("" on success).
std::string Ask(ps::Runtime& runtime, ps::Message msg) {
  const auto result =
      runtime.RequestAndWait(std::move(msg), std::chrono::steady_clock::now() + 10s);
  return result.error;
}

ps::Message Canary(ps::kv::Command command, int server, const std::vector<float>& values) {
  Request request;
  request.command = command;
  request.slices = {{kCanary, 0, kCanaryLength}};
  ps::Message msg = ps::kv::RequestMessage(request, server);
  if (command != ps::kv::kPull) {
    msg.data.push_back(
        ps::Blob::Copy(values.data(), values.size() * sizeof(float), ps::DType::kFloat32));
  }
  return msg;
}

}  // namespace

TEST_CASE("server: answers thousands of random requests and keeps its values exact",
          "[dist][errors][fuzz]") {
  ps::test::KVCluster cluster(1, 1);
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  int failures_seen = 0;
  {
    auto runtime = ps::Runtime::Start(cluster.WorkerConfig());
    const int server = runtime->ServerId(0);
    const auto segment = ps::SharedSegment::Create(64 << 10);
    Request attach;
    attach.command = ps::kv::kShmAttach;
    attach.segment_id = 0;
    attach.segment = segment->descriptor();
    REQUIRE(Ask(*runtime, ps::kv::RequestMessage(attach, server)).empty());
    Request sgd;
    sgd.command = ps::kv::kSetOptimizer;
    sgd.optimizer.name = "sgd";
    sgd.optimizer.learning_rate = 1.0f;
    REQUIRE(Ask(*runtime, ps::kv::RequestMessage(sgd, server)).empty());
    // Compression on, so that random compressed pushes and pulls of the fuzz keys reach the
    // decoders and the mirrors (the canary's plain float32 requests are unaffected).
    Request compress;
    compress.command = ps::kv::kSetCompression;
    compress.compression = {.type = "2bit", .threshold = 0.5f, .pull_type = "fp16"};
    REQUIRE(Ask(*runtime, ps::kv::RequestMessage(compress, server)).empty());
    std::vector<float> expected(kCanaryLength, 5.0f);
    REQUIRE(Ask(*runtime, Canary(ps::kv::kInit, server, expected)).empty());

    Fuzzer fuzzer(seed, server, *segment);
    for (int i = 0; i < kRequests; ++i) {
      ps::Message msg = fuzzer.Next();
      const std::string error = Ask(*runtime, std::move(msg));
      INFO("request " << i);
      REQUIRE_THAT(error, !Catch::Contains("timed out"));
      if (!error.empty()) ++failures_seen;
      if (i % 500 == 0) {  // the canary still updates exactly: value -= gradient
        const std::vector<float> gradient(kCanaryLength, static_cast<float>(i % 7 + 1));
        REQUIRE(Ask(*runtime, Canary(ps::kv::kPush, server, gradient)).empty());
        for (float& v : expected) v -= static_cast<float>(i % 7 + 1);
      }
    }
    ps::RequestResult pulled = runtime->RequestAndWait(Canary(ps::kv::kPull, server, {}),
                                                       std::chrono::steady_clock::now() + 10s);
    REQUIRE(pulled.ok());
    REQUIRE(pulled.responses.size() == 1);
    REQUIRE(pulled.responses[0].data.size() == 1);
    std::vector<float> value(kCanaryLength);
    REQUIRE(pulled.responses[0].data[0].bytes() == value.size() * sizeof(float));
    std::memcpy(value.data(), pulled.responses[0].data[0].data(), value.size() * sizeof(float));
    CHECK(value == expected);
    runtime->FinishWorker();
  }
  // Most random requests are wrong in some way; the server said so and kept serving.
  CHECK(failures_seen > kRequests / 2);
  CHECK(cluster.EndedCleanly());
  // ... and logged a sample of them, not thousands of lines.
  const std::string log = cluster.servers()[0]->Output();
  CHECK_THAT(log, Catch::Contains("rejected a request (#1) from worker 0"));
  CHECK_THAT(log, Catch::Contains("rejected a request (#1000) from worker 0"));
  CHECK(std::count(log.begin(), log.end(), '\n') < 40);
}

TEST_CASE("server: an out-of-memory error names the part of the key it could not allocate",
          "[server]") {
  // The user knows the key's size; the server holds a slice of it, which the error places.
  CHECK(ps::OutOfMemory(7, 1000, 500, 4000, 2000, "for the value this Init stores") ==
        "key 7: out of memory: this server could not allocate 2000 bytes for the value this "
        "Init stores (elements 1000 to 1500 of the key's 4000, its part on this server); "
        "nothing was changed (give the server more memory, or spread the keys over more "
        "servers)");
  // The whole key: its size is the one given.
  CHECK_THAT(ps::OutOfMemory(7, 0, 4000, 4000, 16000, "for its updated value"),
             Catch::StartsWith("key 7: out of memory: this server could not allocate 16000 "
                               "bytes for its updated value; nothing was changed"));
}
