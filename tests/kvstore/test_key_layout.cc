#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>

#include "kvstore/dist/key_layout.h"
#include "kvstore/dist/kv_protocol.h"
#include "kvstore/dist/server_ring.h"

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

TEST_CASE("layout: server weights set each server's share of big and small keys", "[layout]") {
  // Weights as PS_SERVER_WEIGHTS=1,1,1,0.25 scales them: the last server on a slow host.
  const std::vector<std::uint32_t> weights = {1000, 1000, 1000, 250};
  const ps::KeyLayout layout(4, 1000, /*chunk_bytes=*/4 << 20, weights);
  // A 16 MB key of float32 (4 chunks of 4 MB): cut finer so that server 3 takes a quarter of
  // what each other server takes, the slices contiguous and in order.
  for (ps::Key key : {0, 1, 2, 3, 7}) {
    const std::size_t length = 4 << 20;
    const auto slices = layout.Slices(key, length, 4);
    REQUIRE(slices.size() >= 26);  // two pieces for the lightest: 2 * 3250 / 250
    std::vector<std::size_t> held(4, 0);
    std::size_t next = 0;
    for (const auto& slice : slices) {
      CHECK(slice.offset == next);
      next += slice.length;
      held[static_cast<std::size_t>(slice.server_rank)] += slice.length;
    }
    CHECK(next == length);
    for (std::size_t server = 0; server < 4; ++server) {
      const double expected = static_cast<double>(length) * weights[server] / 3250;
      INFO("key " << key << ", server " << server << " holds " << held[server]);
      // Within one piece of its share.
      CHECK(std::abs(static_cast<double>(held[server]) - expected) <=
            static_cast<double>(length) / slices.size() + 1);
    }
  }
  // Small keys: server 3 takes about 250/3250 of them.
  std::map<int, int> load;
  constexpr int kKeys = 13000;
  for (ps::Key key = 0; key < kKeys; ++key) ++load[layout.Slices(key, 10, 4)[0].server_rank];
  CHECK(std::abs(load[3] - 1000) < 150);
  CHECK(std::abs(load[0] - 4000) < 400);
  // Alike weights deal exactly as no weights.
  const ps::KeyLayout even(3, 1000, 4000);
  const ps::KeyLayout alike(3, 1000, 4000, {5, 5, 5});
  for (ps::Key key = 0; key < 20; ++key) {
    const auto a = even.Slices(key, 7777, 4);
    const auto b = alike.Slices(key, 7777, 4);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].server_rank == b[i].server_rank);
      CHECK(a[i].offset == b[i].offset);
    }
  }
  // A tiny weight asks for thousands of pieces: at most 64 per server, and the tiny server
  // then holds none of this key.
  const ps::KeyLayout tiny(4, 1000, 4 << 20, {1000, 1000, 1000, 1});
  const auto pieces = tiny.Slices(5, 1 << 20, 4);
  CHECK(pieces.size() == 256);
  CHECK(std::none_of(pieces.begin(), pieces.end(),
                     [](const ps::KeySlice& slice) { return slice.server_rank == 3; }));
  CHECK_THROWS(ps::KeyLayout(2, 1000, 4000, {1, 0}));
  CHECK_THROWS(ps::KeyLayout(2, 1000, 4000, {1, 2, 3}));
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

TEST_CASE("server ring: a dead server's ranges go to the server holding their copy", "[layout]") {
  ps::ServerRing ring(4, /*replicated=*/true);
  for (int home = 0; home < 4; ++home) {
    CHECK(ring.Primary(home) == home);
    CHECK(ring.Replica(home) == (home + 1) % 4);
  }
  ring.MarkDead(1);
  CHECK(ring.Primary(1) == 2);  // its replica serves them
  CHECK(ring.Replica(1) == 3);  // and copies them to the next
  CHECK(ring.Replica(0) == 2);  // server 0 lost its replica: the next live one
  CHECK(ring.Primary(0) == 0);
  CHECK(ring.Replica(3) == 0);  // unchanged
  ring.MarkDead(2);
  CHECK(ring.Primary(1) == 3);
  CHECK(ring.Primary(2) == 3);
  CHECK(ring.Replica(2) == 0);
  ring.MarkDead(0);
  CHECK(ring.Primary(0) == 3);
  CHECK(ring.Replica(0) == -1);  // the last server: no replica
  ring.MarkDead(3);
  CHECK(ring.Primary(0) == -1);

  ps::ServerRing single(1, true);
  CHECK(single.Replica(0) == -1);
  ps::ServerRing off(3, /*replicated=*/false);
  CHECK(off.Replica(0) == -1);
  off.MarkDead(0);
  CHECK(off.Primary(0) == 1);
}

TEST_CASE("server ring: with weights a light server keeps no copies of heavier ones' ranges",
          "[layout]") {
  // Rank 2 on a slow host (PS_SERVER_WEIGHTS 1,1,0.05,1 scales to 1000,1000,50,1000).
  ps::ServerRing ring(4, /*replicated=*/true, {1000, 1000, 50, 1000});
  CHECK(ring.Replica(0) == 1);
  CHECK(ring.Replica(1) == 3);  // not the light rank 2
  CHECK(ring.Replica(2) == 3);  // its own ranges: the next live server
  CHECK(ring.Replica(3) == 0);
  // A heavy server's ranges go to its replica, never to the light one.
  ring.MarkDead(1);
  CHECK(ring.Primary(1) == 3);
  CHECK(ring.Replica(1) == 0);
  CHECK(ring.Replica(0) == 3);
  ring.MarkDead(3);
  CHECK(ring.Primary(1) == 0);
  CHECK(ring.Primary(3) == 0);
  CHECK(ring.Primary(2) == 2);
  // Only the light server left beside server 0: it is the replica all the same.
  CHECK(ring.Replica(0) == 2);
  ring.MarkDead(0);
  CHECK(ring.Primary(0) == 2);
  CHECK(ring.Primary(1) == 2);
  CHECK(ring.Replica(2) == -1);
}

TEST_CASE("server ring: a server that takes a dead one's rank mirrors the one before it",
          "[layout]") {
  ps::ServerRing ring(3, /*replicated=*/true);
  ring.MarkDead(1);
  CHECK(ring.Primary(1) == 2);
  CHECK(ring.Replica(0) == 2);
  ring.MarkJoined(1);
  CHECK_FALSE(ring.dead(1));
  CHECK(ring.rejoined(1));
  CHECK_FALSE(ring.rejoined(0));
  // It owns nothing: rank 1's ranges stay with the server that took them over...
  CHECK(ring.Primary(1) == 2);
  CHECK(ring.Primary(0) == 0);
  CHECK(ring.Primary(2) == 2);
  // ...but it is the replica of the server before it, which copies its ranges to it.
  CHECK(ring.Replica(0) == 1);
  CHECK(ring.Replica(1) == 0);  // server 2's ranges (home 1 and 2) keep their replica
  CHECK(ring.Replica(2) == 0);
  // The server before it dies: its ranges move to the new server, which holds their copies.
  ring.MarkDead(0);
  CHECK(ring.Primary(0) == 1);
  CHECK(ring.Replica(0) == 2);
  CHECK(ring.Primary(1) == 2);
  CHECK(ring.Replica(1) == 1);
  // Then the last server of the job's start: the new one serves everything, alone.
  ring.MarkDead(2);
  for (int home = 0; home < 3; ++home) {
    CHECK(ring.Primary(home) == 1);
    CHECK(ring.Replica(home) == -1);
  }
  ring.MarkJoined(0);  // and another one joins: it mirrors the server before it
  CHECK(ring.Replica(2) == 0);
  CHECK(ring.Primary(0) == 1);
  ring.MarkJoined(1);  // a live rank cannot be taken
  CHECK(ring.Primary(1) == 1);
}

TEST_CASE("kv protocol: collective stamps and calls round-trip, overlong calls are rejected",
          "[layout]") {
  ps::kv::Request push;
  push.command = ps::kv::kPush;
  push.slices = {{7, 0, 2}};
  push.collectives = 41;
  ps::Message msg;
  msg.meta.head = ps::kv::kPush;
  msg.meta.body = ps::kv::EncodeBody(push);
  std::vector<float> values(2);
  msg.data = {ps::Blob::Copy(values.data(), 8, ps::DType::kFloat32)};
  std::string error;
  auto decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->collectives == 41u);
  CHECK(decoded->call.empty());  // only a Collective carries one

  ps::kv::Request entering;
  entering.command = ps::kv::kCollective;
  entering.collectives = 3;
  entering.call = "Barrier";
  entering.membership = 2;  // a server that knows of fewer deaths holds it until it does
  msg = ps::kv::RequestMessage(entering, 1);
  decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->command == ps::kv::kCollective);
  CHECK(decoded->collectives == 3u);
  CHECK(decoded->call == "Barrier");
  CHECK(decoded->membership == 2u);
  CHECK(ps::kv::CommandName(ps::kv::kCollective) == "Collective");

  ps::kv::Request stalled;
  stalled.command = ps::kv::kStalled;
  stalled.stall = 7;
  stalled.membership = 1;
  stalled.slices = {{4, 0, 0}, {9, 0, 0}};  // the keys it waits for
  msg = ps::kv::RequestMessage(stalled, 1);
  decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->command == ps::kv::kStalled);
  CHECK(decoded->stall == 7u);
  CHECK(decoded->membership == 1u);
  CHECK(decoded->slices == stalled.slices);
  CHECK(ps::kv::CommandName(ps::kv::kStalled) == "Stalled");

  entering.call = std::string(5000, 'x');
  msg = ps::kv::RequestMessage(entering, 1);
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("a Collective request's call is longer than 4096 bytes"));
}

TEST_CASE("kv protocol: replication fields round-trip, malformed ones are rejected", "[layout]") {
  std::string error;
  ps::kv::Request push;
  push.command = ps::kv::kPushPull;
  push.slices = {{7, 0, 2}, {9, 0, 2}};
  push.homes = {2, 0};
  push.seqs = {5, 11};
  ps::Message msg;
  msg.meta.head = ps::kv::kPushPull;
  msg.meta.body = ps::kv::EncodeBody(push);
  const float values[2] = {1, 2};
  msg.data = {ps::Blob::Copy(values, 8, ps::DType::kFloat32),
              ps::Blob::Copy(values, 8, ps::DType::kFloat32)};
  auto decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->homes == push.homes);
  CHECK(decoded->seqs == push.seqs);

  // A full copy's state rides in a frame after the value frames, however big (here 2 MiB, past
  // the 1 MiB header cap: an Adam state of a 262144-float slice).
  ps::kv::Request replicate;
  replicate.command = ps::kv::kReplicate;
  replicate.slices = {{7, 0, 2}, {9, 0, 2}};
  std::string big_state(std::size_t{2} << 20, 's');
  big_state[1] = '\0';
  replicate.replica_ops = {{ps::kv::ReplicaKind::kRound, 4, 0, ""},
                           {ps::kv::ReplicaKind::kState, 1, 0, big_state}};
  replicate.membership = 3;
  ps::kv::Request sent = replicate;
  ps::Message copy = ps::kv::RequestMessage(sent, 0);
  copy.data = msg.data;
  ps::kv::AttachReplicaStates(sent, copy);
  CHECK(copy.meta.body.size() < 1024);
  REQUIRE(copy.data.size() == 4);
  CHECK(copy.data[2].bytes() == 0);
  CHECK(copy.data[3].bytes() == big_state.size());
  decoded = ps::kv::DecodeRequest(copy, &error);
  REQUIRE(decoded);
  CHECK(decoded->replica_ops == replicate.replica_ops);
  CHECK(decoded->membership == 3);

  copy.data.pop_back();  // a state frame missing
  CHECK_FALSE(ps::kv::DecodeRequest(copy, &error));
  CHECK_THAT(error, Catch::Contains("Replicate request with 3 value frames for 2 keys"));
  copy.data.push_back(ps::Blob::Copy(values, 8, ps::DType::kFloat32));  // not bytes
  CHECK_FALSE(ps::kv::DecodeRequest(copy, &error));
  CHECK_THAT(error, Catch::Contains("state frame is not of bytes"));

  replicate.replica_ops.pop_back();  // one op for two slices
  msg.meta.head = ps::kv::kReplicate;
  msg.meta.body = ps::kv::EncodeBody(replicate);
  msg.data.push_back(ps::Blob::Copy(values, 0, ps::DType::kUInt8));
  msg.data.push_back(ps::Blob::Copy(values, 0, ps::DType::kUInt8));
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("malformed replication lists in a Replicate request"));
  msg.data.resize(2);

  push.seqs = {5};  // one number for two slices
  msg.meta.head = ps::kv::kPushPull;
  msg.meta.body = ps::kv::EncodeBody(push);
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("malformed replication lists in a PushPull request"));

  push.seqs = {5, 11};
  push.homes = {-1, 0};
  msg.meta.body = ps::kv::EncodeBody(push);
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("a negative home server rank"));

  // A checkpoint request names the servers its sender knows dead (the server waits to know).
  ps::kv::Request save;
  save.command = ps::kv::kSave;
  save.path = "/tmp/checkpoint";
  save.dead_servers = {0, 2};
  msg.meta.head = ps::kv::kSave;
  msg.meta.body = ps::kv::EncodeBody(save);
  msg.data.clear();
  decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->dead_servers == save.dead_servers);
  save.dead_servers = {-1};
  msg.meta.body = ps::kv::EncodeBody(save);
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("a negative dead server rank in a SaveCheckpoint request"));

  // A load goes in steps (stage, apply, discard); only a LoadCheckpoint carries one.
  ps::kv::Request load = save;
  load.command = ps::kv::kLoad;
  load.dead_servers.clear();
  load.load_step = ps::kv::LoadStep::kApply;
  msg.meta.head = ps::kv::kLoad;
  msg.meta.body = ps::kv::EncodeBody(load);
  decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->load_step == ps::kv::LoadStep::kApply);
  msg.meta.head = ps::kv::kSave;
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("load step 1 in a SaveCheckpoint request"));
}

TEST_CASE("kv protocol: a slot's mirror and a forwarded slot's owner round-trip", "[layout]") {
  std::string error;
  // A worker's push names the server that maps its slot besides the slice's own.
  ps::kv::Request push;
  push.command = ps::kv::kPush;
  push.slices = {{7, 0, 1 << 20}};
  push.shm = {{0, 3, 4096, 4 << 20, ps::kNoNode, 12}};
  ps::Message msg;
  msg.meta.head = ps::kv::kPush;
  msg.meta.body = ps::kv::EncodeBody(push);
  msg.data = {ps::Blob(nullptr, nullptr, 0, ps::DType::kFloat32)};  // the value is in the slot
  auto decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->shm == push.shm);

  // Only a Replicate names another node's segment: the worker's slot holding the update.
  push.shm[0].owner = 5;
  msg.meta.body = ps::kv::EncodeBody(push);
  CHECK_FALSE(ps::kv::DecodeRequest(msg, &error));
  CHECK_THAT(error, Catch::Contains("malformed shared-memory owner or mirror in a Push request"));

  ps::kv::Request replicate;
  replicate.command = ps::kv::kReplicate;
  replicate.slices = {{7, 0, 1 << 20}};
  replicate.replica_ops = {{ps::kv::ReplicaKind::kRound, 4, 0, ""}};
  replicate.shm = {{0, 3, 4096, 4 << 20, 9, ps::kNoNode}};
  msg.meta.head = ps::kv::kReplicate;
  msg.meta.body = ps::kv::EncodeBody(replicate);
  ps::kv::AttachReplicaStates(replicate, msg);
  decoded = ps::kv::DecodeRequest(msg, &error);
  REQUIRE(decoded);
  CHECK(decoded->shm == replicate.shm);
  CHECK(decoded->shm[0].owner == 9);
}
