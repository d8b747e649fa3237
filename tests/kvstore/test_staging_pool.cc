// StagingPool: host buffers for GPU tensors, reused by size class, the least recently released
// let go past the bound, held alive by their users. CPU buffers here (ordinary memory); the
// page-locked ones run in the cuda-labelled tests on a GPU.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kvstore/staging_pool.h"

namespace {

using ps::Device;
using ps::StagingPool;

TEST_CASE("staging pool: a released buffer serves the next request of its size class",
          "[kvstore][staging]") {
  auto pool = StagingPool::Create();
  std::byte* first = nullptr;
  {
    std::shared_ptr<std::byte> a = pool->Get(100000, Device::CPU());
    first = a.get();
    std::memset(a.get(), 1, 100000);  // all of it is writable
    CHECK(pool->idle_bytes() == 0);
  }
  CHECK(pool->idle_bytes() == 131072);  // 100000 B rounds up to the 128 KiB class
  std::shared_ptr<std::byte> b = pool->Get(131072, Device::CPU());
  CHECK(b.get() == first);
  CHECK(pool->idle_bytes() == 0);
  // A second buffer of the class while the first is in use: a new one.
  std::shared_ptr<std::byte> c = pool->Get(70000, Device::CPU());
  CHECK(c.get() != first);
  // Small requests share the smallest class (64 KiB).
  std::shared_ptr<std::byte> d = pool->Get(1, Device::CPU());
  d.reset();
  CHECK(pool->idle_bytes() == 65536);
  CHECK_FALSE(pool->all_pinned());  // CPU buffers are never page-locked
}

TEST_CASE("staging pool: past the bound the least recently released buffers go",
          "[kvstore][staging]") {
  auto pool = StagingPool::Create(256 << 10);
  std::vector<std::shared_ptr<std::byte>> held;
  for (int i = 0; i < 3; ++i) held.push_back(pool->Get(100 << 10, Device::CPU()));  // 128 KiB
  const std::byte* oldest = held[0].get();
  held[0].reset();
  held[1].reset();
  CHECK(pool->idle_bytes() == 256 << 10);
  held[2].reset();  // over the bound: the first released goes, the two latest stay
  CHECK(pool->idle_bytes() == 256 << 10);
  std::shared_ptr<std::byte> again = pool->Get(128 << 10, Device::CPU());
  std::shared_ptr<std::byte> again2 = pool->Get(128 << 10, Device::CPU());
  CHECK(pool->idle_bytes() == 0);
  CHECK(again.get() != oldest);
  CHECK(again2.get() != oldest);
  // A small buffer released later still finds room: the bound evicts, it does not refuse.
  again.reset();
  again2.reset();
  std::shared_ptr<std::byte> small = pool->Get(1, Device::CPU());
  small.reset();
  CHECK(pool->idle_bytes() == (128 << 10) + (64 << 10));
}

TEST_CASE("staging pool: a request larger than the bound is served but not kept",
          "[kvstore][staging]") {
  auto pool = StagingPool::Create(256 << 10);
  std::shared_ptr<std::byte> big = pool->Get(300 << 10, Device::CPU());
  std::memset(big.get(), 3, 300 << 10);
  big.reset();
  CHECK(pool->idle_bytes() == 0);
}

TEST_CASE("staging pool: a buffer outlives the pool's last other owner", "[kvstore][staging]") {
  std::shared_ptr<std::byte> kept;
  std::weak_ptr<StagingPool> watch;
  {
    auto pool = StagingPool::Create();
    watch = pool;
    kept = pool->Get(4096, Device::CPU());
  }
  CHECK_FALSE(watch.expired());      // the buffer holds its pool
  std::memset(kept.get(), 7, 4096);  // and is still valid
  CHECK(static_cast<int>(kept.get()[4095]) == 7);
  kept.reset();  // returns it to the pool, which then goes with it
  CHECK(watch.expired());
}

TEST_CASE("staging pool: buffers taken and released from several threads", "[kvstore][staging]") {
  auto pool = StagingPool::Create();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 200; ++i) {
        std::shared_ptr<std::byte> buffer =
            pool->Get(static_cast<std::size_t>(1 + i % 3) << 16, Device::CPU());
        buffer.get()[0] = static_cast<std::byte>(t);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  // Each thread held one buffer at a time: at most 4 of each of the 3 classes were made.
  CHECK(pool->idle_bytes() <= 4 * ((64 << 10) + (128 << 10) + (256 << 10)));
  CHECK(pool->idle_bytes() >= (64 << 10) + (128 << 10) + (256 << 10));
}

}  // namespace
