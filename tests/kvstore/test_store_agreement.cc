// "local" and "dist_sync" reject the same bad calls with the same message (docs/kvstore.md: a
// bad call fails everywhere alike; kvstore/call_checks.h): every call below is made on both stores
// and the messages are compared, all but the store's name ("local kvstore: ", "dist kvstore: ").
// The dist store runs against the real ps-scheduler and ps-server, as one worker.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/kvstore/kv_cluster.h"

namespace {

using ps::test::KVCluster;
using Vec = std::vector<float>;

struct BadCall {
  std::string name;
  std::function<void(ps::KVStore&)> call;
};

// The stored state every call starts from: keys 7 (3 x float32), 8 (1 x float32) and 40
// (2 x int32). The calls run in order; none of them may change anything.
void SetUp(ps::KVStore& kv) {
  Vec w7{1.0f, 2.0f, 3.0f}, w8{5.0f};
  std::vector<std::int32_t> w40{1, 2};
  kv.Init({7, 8, 40},
          {ps::Tensor(w7.data(), 3), ps::Tensor(w8.data(), 1), ps::Tensor(w40.data(), 2)});
}

std::vector<BadCall> BadCalls() {
  // Buffers live as long as the process: the calls fail before anything could use them.
  static Vec a(3, 1.0f), b(3, 2.0f), four(4, 1.0f), one(1, 1.0f);
  static std::vector<double> d3(3, 1.0);
  static std::vector<std::int32_t> i2(2, 1);
  static std::vector<std::uint8_t> bytes(4, 0);
  const ps::Tensor t3(a.data(), 3), u3(b.data(), 3), t4(four.data(), 4), t1(one.data(), 1);
  const ps::Tensor f64(d3.data(), 3), int2(i2.data(), 2);
  const ps::Tensor null3(nullptr, 3, ps::DType::kFloat32);
  return {
      {"the same key twice in one Push",
       [=](ps::KVStore& kv) {
         kv.Push({7, 7}, {t3, u3});
       }},
      {"the same key twice in one Pull",
       [=](ps::KVStore& kv) {
         kv.Pull({7, 7}, {t3, u3});
       }},
      {"the same key twice in one PushPull",
       [=](ps::KVStore& kv) {
         kv.PushPull({8, 7, 7}, {t1, t3, u3}, {t1, t3, u3});
       }},
      {"a repeat with a wrong size: the repeat is named",
       [=](ps::KVStore& kv) {
         kv.Push({7, 7}, {t3, t4});
       }},
      {"Push of an unknown key", [=](ps::KVStore& kv) { kv.Push(99, t3); }},
      {"Pull of an unknown key", [=](ps::KVStore& kv) { kv.Pull(98, t3); }},
      {"PushPull of an unknown key", [=](ps::KVStore& kv) { kv.PushPull(97, t3, u3); }},
      {"Wait on an unknown key", [=](ps::KVStore& kv) { kv.Wait(94); }},
      {"WaitPulls on an unknown key after a good one",
       [=](ps::KVStore& kv) {
         kv.WaitPulls(std::vector<ps::Key>{7, 93});
       }},
      {"an unknown key after a good one",
       [=](ps::KVStore& kv) {
         kv.Push({7, 96}, {t3, t3});
       }},
      {"an unknown key before a repeat",
       [=](ps::KVStore& kv) {
         kv.Push({7, 95, 7}, {t3, t3, t3});
       }},
      {"Push size mismatch", [=](ps::KVStore& kv) { kv.Push(7, t4); }},
      {"Pull dtype mismatch", [=](ps::KVStore& kv) { kv.Pull(7, f64); }},
      {"PushPull with a wrong output", [=](ps::KVStore& kv) { kv.PushPull(7, t3, t4); }},
      {"PushPull with a wrong gradient and a wrong output",
       [=](ps::KVStore& kv) { kv.PushPull(7, f64, t4); }},
      {"Push with a null pointer", [=](ps::KVStore& kv) { kv.Push(7, null3); }},
      {"Init with a size no buffer has",
       [=](ps::KVStore& kv) { kv.Init(33, ps::Tensor(t3.data(), SIZE_MAX, ps::DType::kFloat32)); }},
      {"Push: more keys than tensors",
       [=](ps::KVStore& kv) {
         kv.Push(std::vector<ps::Key>{7, 8}, {t3});
       }},
      {"PushPull: more keys than outputs",
       [=](ps::KVStore& kv) {
         kv.PushPull({7, 8}, {t3, t1}, {t3});
       }},
      {"PushPull: more keys than gradients and outputs",
       [=](ps::KVStore& kv) {
         kv.PushPull({7, 8}, {t3}, {t3});
       }},
      {"Init of an initialized key", [=](ps::KVStore& kv) { kv.Init(7, t3); }},
      {"the same key twice in one Init",
       [=](ps::KVStore& kv) {
         kv.Init({20, 20}, {t1, t1});
       }},
      {"Init with an unsupported dtype",
       [=](ps::KVStore& kv) { kv.Init(30, ps::Tensor(bytes.data(), 4, ps::DType::kUInt8)); }},
      {"Init with a null pointer", [=](ps::KVStore& kv) { kv.Init(31, null3); }},
      {"Init: more keys than tensors",
       [=](ps::KVStore& kv) {
         kv.Init(std::vector<ps::Key>{32, 33}, {t1});
       }},
      {"SetOptimizer with a negative learning rate",
       [=](ps::KVStore& kv) {
         ps::OptimizerConfig config;
         config.learning_rate = -1.0f;
         kv.SetOptimizer(config);
       }},
      {"Push to an int32 key with an optimizer set",
       [=](ps::KVStore& kv) {
         kv.SetOptimizer(ps::OptimizerConfig{});
         kv.Push(40, int2);
       }},
  };
}

// Makes every bad call; returns each message ("no error" when a call was accepted).
std::vector<std::string> Messages(ps::KVStore& kv) {
  SetUp(kv);
  std::vector<std::string> messages;
  for (const BadCall& bad : BadCalls()) {
    try {
      bad.call(kv);
      kv.WaitAll();
      messages.push_back("no error");
    } catch (const ps::Error& e) {
      messages.push_back(e.what());
    }
  }
  // Nothing changed: the values are as initialized.
  Vec out7(3), out8(1);
  kv.Pull({7, 8}, {ps::Tensor(out7.data(), 3), ps::Tensor(out8.data(), 1)});
  kv.WaitAll();
  if (out7 != Vec{1.0f, 2.0f, 3.0f} || out8 != Vec{5.0f}) messages.push_back("values changed");
  return messages;
}

// The message without its store's name; "" (and a failed check) when the name is not there.
std::string WithoutStore(const std::string& message, const std::string& store) {
  const std::string prefix = store + ": ";
  if (message.rfind(prefix, 0) != 0) return "(does not start with '" + prefix + "') " + message;
  return message.substr(prefix.size());
}

}  // namespace

TEST_CASE("local and dist_sync refuse the same bad calls with the same words",
          "[kvstore][dist][errors]") {
  auto local = ps::KVStore::Create("local");
  const std::vector<std::string> local_messages = Messages(*local);

  KVCluster cluster(1, 1);
  std::vector<std::string> dist_messages;
  const auto outcomes =
      cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) { dist_messages = Messages(kv); });
  REQUIRE(outcomes == std::vector<std::string>{""});
  CHECK(cluster.EndedCleanly());

  const std::vector<BadCall> calls = BadCalls();
  REQUIRE(local_messages.size() == calls.size());  // and no "values changed"
  REQUIRE(dist_messages.size() == calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    INFO(calls[i].name << "\n  local: " << local_messages[i] << "\n  dist:  " << dist_messages[i]);
    CHECK(local_messages[i] != "no error");
    CHECK(WithoutStore(local_messages[i], "local kvstore") ==
          WithoutStore(dist_messages[i], "dist kvstore"));
  }
}

TEST_CASE("the shared checks name the key and what is wrong", "[kvstore][local][errors]") {
  auto kv = ps::KVStore::Create("local");
  const std::vector<std::string> messages = Messages(*kv);
  const std::vector<BadCall> calls = BadCalls();
  REQUIRE(messages.size() == calls.size());
  const auto message_of = [&](const std::string& name) {
    for (std::size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].name == name) return messages[i];
    }
    FAIL("no call named " << name);
    return std::string();
  };
  using Catch::Matchers::Equals;
  CHECK_THAT(message_of("the same key twice in one Push"),
             Equals("local kvstore: Push key 7: given twice in one call (a key may appear once)"));
  CHECK_THAT(message_of("the same key twice in one PushPull"),
             Equals("local kvstore: PushPull key 7: given twice in one call (a key may appear "
                    "once)"));
  CHECK_THAT(message_of("Pull of an unknown key"),
             Equals("local kvstore: Pull key 98: unknown key (never initialized: call Init "
                    "first)"));
  CHECK_THAT(message_of("Wait on an unknown key"),
             Equals("local kvstore: Wait key 94: unknown key (never initialized: call Init "
                    "first)"));
  CHECK_THAT(message_of("WaitPulls on an unknown key after a good one"),
             Equals("local kvstore: WaitPulls key 93: unknown key (never initialized: call Init "
                    "first)"));
  CHECK_THAT(message_of("an unknown key before a repeat"),
             Equals("local kvstore: Push key 95: unknown key (never initialized: call Init "
                    "first)"));
  CHECK_THAT(message_of("PushPull with a wrong output"),
             Equals("local kvstore: PushPull key 7: size mismatch: expected 3 elements (as "
                    "initialized), given 4"));
  CHECK_THAT(message_of("PushPull: more keys than outputs"),
             Equals("local kvstore: PushPull: 2 keys but 1 tensors (need one tensor per key)"));
  CHECK_THAT(message_of("Init of an initialized key"),
             Equals("local kvstore: Init key 7: already initialized (holds 3 float32 elements; a "
                    "key is initialized once)"));
  CHECK_THAT(message_of("the same key twice in one Init"),
             Equals("local kvstore: Init key 20: given twice in one call"));
  CHECK_THAT(message_of("SetOptimizer with a negative learning rate"),
             Catch::Matchers::StartsWith("local kvstore: SetOptimizer: ") &&
                 Catch::Matchers::Contains("learning_rate"));
  CHECK_THAT(message_of("Push to an int32 key with an optimizer set"),
             Equals("local kvstore: Push key 40: optimizers update float32 keys only, this key "
                    "holds int32"));
}
