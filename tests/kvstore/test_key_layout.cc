#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <set>

#include "kvstore/dist/key_layout.h"
#include "kvstore/dist/kv_protocol.h"

TEST_CASE("layout: small keys spread evenly over the servers", "[layout]") {
  for (int servers : {2, 3, 4, 8}) {
    const ps::KeyLayout layout(servers, 1000);
    std::map<int, int> load;
    constexpr int kKeys = 4000;
    for (ps::Key key = 0; key < kKeys; ++key) {
      const auto slices = layout.Slices(key, 10, 4);
      REQUIRE(slices.size() == 1);
      ++load[slices[0].server_rank];
    }
    REQUIRE(load.size() == static_cast<std::size_t>(servers));
    const double mean = static_cast<double>(kKeys) / servers;
    for (const auto& [server, count] : load) {
      INFO(servers << " servers: server " << server << " holds " << count << " keys");
      CHECK(std::abs(count - mean) < 0.1 * mean);
    }
  }
}

TEST_CASE("layout: a big key is cut into contiguous slices, one per server", "[layout]") {
  const ps::KeyLayout layout(3, 1000);
  const auto slices = layout.Slices(42, 1000, 4);
  REQUIRE(slices.size() == 3);
  std::size_t next = 0;
  std::set<int> servers;
  for (const auto& slice : slices) {
    CHECK(slice.offset == next);
    next += slice.length;
    servers.insert(slice.server_rank);
  }
  CHECK(next == 1000);
  CHECK(servers.size() == 3);
  CHECK(layout.Slices(42, 999, 4).size() == 1);  // below the bound: whole on one server
  CHECK(ps::KeyLayout(1, 10).Slices(1, 100, 4).size() == 1);
}

TEST_CASE("layout: big keys are chunked to the chunk size and dealt round-robin", "[layout]") {
  const ps::KeyLayout layout(2, 1000, /*chunk_bytes=*/4000);  // 1000 float32 per chunk
  const auto slices = layout.Slices(7, 4500, 4);
  REQUIRE(slices.size() == 5);  // ceil(4500 / 1000)
  std::size_t next = 0;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    CHECK(slices[i].offset == next);
    CHECK(slices[i].length <= 1000);
    CHECK(slices[i].server_rank == (slices[0].server_rank + static_cast<int>(i)) % 2);
    next += slices[i].length;
  }
  CHECK(next == 4500);
  // Doubles: half as many elements per chunk.
  CHECK(layout.Slices(7, 4500, 8).size() == 9);
}

TEST_CASE("kv protocol: requests round-trip and inconsistent ones are rejected", "[layout]") {
  ps::kv::Request request;
  request.command = ps::kv::kPush;
  request.slices = {{7, 0, 8}, {9, 4, 10}};
  ps::Message msg;
  msg.meta.head = ps::kv::kPush;
  msg.meta.body = ps::kv::EncodeBody(request);
  std::vector<float> values(8);
  msg.data = {ps::Blob::Copy(values.data(), 32, ps::DType::kFloat32),
              ps::Blob::Copy(values.data(), 24, ps::DType::kFloat32)};
  std::string error;
  const auto decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->slices == request.slices);

  msg.data.pop_back();
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("1 value frames for 2 keys"));

  msg.data.push_back(ps::Blob::Copy(values.data(), 32, ps::DType::kFloat32));  // 8 > 10 - 4
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("key 9: slice [4, +8) outside its 10 elements"));

  msg.meta.body = "\xff\xff garbage";
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  msg.meta.head = 77;
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("unknown KVStore command 77"));
}
