#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "ps.pb.h"
#include "ps/src/wire.h"

namespace {

ps::Meta FullMeta() {
  ps::Meta meta;
  meta.sender = 3;
  meta.recipient = 7;
  meta.control = ps::Control::kBarrierRelease;
  meta.request = true;
  meta.app_id = 11;
  meta.customer_id = 12;
  meta.timestamp = 0x1234567890ULL;
  meta.head = 42;
  meta.body = std::string("body\0bytes", 10);
  meta.nodes = {{0, ps::Role::kScheduler, "sched.example", 9000, 0, "", "", "0123456789abcdef"},
                {1, ps::Role::kServer, "10.0.0.2", 4001, 0, "", "", ""},
                {2, ps::Role::kWorker, "10.0.0.3", 4002, 1, "boot/4026531992", "ipc://@ps-12-4002",
                 "fedcba9876543210"}};
  meta.barrier_group = ps::kWorkerGroup | ps::kServerGroup;
  meta.error = "something failed";
  meta.error_kind = ps::ErrorKind::kCheckpointMismatch;
  meta.priority = -5;
  return meta;
}

ps::wire::DecodeResult Decode(const std::string& bytes) {
  return ps::wire::DecodeHeader(bytes.data(), bytes.size());
}

std::string Encode(const ps::pb::Header& header) { return header.SerializeAsString(); }

ps::pb::Header ValidHeader() {
  ps::pb::Header header;
  header.set_version(ps::kProtocolVersion);
  header.set_sender(1);
  header.set_recipient(2);
  return header;
}

}  // namespace

TEST_CASE("wire: every header field survives a round trip", "[wire]") {
  const ps::Meta meta = FullMeta();
  std::vector<float> values = {1, 2, 3};
  const std::vector<ps::Blob> data = {
      ps::Blob::Copy(values.data(), values.size() * sizeof(float), ps::DType::kFloat32),
      ps::Blob::FromVector(std::vector<std::uint64_t>{5, 6}, ps::DType::kUInt64),
      ps::Blob(),  // an empty frame
  };
  const std::string bytes = ps::wire::EncodeHeader(meta, data);
  const auto decoded = Decode(bytes);
  REQUIRE(decoded.header);
  CHECK(decoded.error.empty());
  CHECK(decoded.header->meta == meta);
  REQUIRE(decoded.header->data.size() == 3);
  CHECK(decoded.header->data[0].dtype == ps::DType::kFloat32);
  CHECK(decoded.header->data[0].count == 3);
  CHECK(decoded.header->data[1].dtype == ps::DType::kUInt64);
  CHECK(decoded.header->data[1].count == 2);
  CHECK(decoded.header->data[2].count == 0);
  CHECK(ps::wire::CheckFrames(decoded.header->data, {12, 16, 0}).empty());
}

TEST_CASE("wire: an error kind this build does not know decodes as a plain error", "[wire]") {
  // A newer peer's kind: the message still counts (a wait must not hang on a dropped release).
  auto header = ValidHeader();
  header.set_error("failed");
  header.set_error_kind(ps::kErrorKinds);
  const auto decoded = Decode(Encode(header));
  REQUIRE(decoded.error.empty());
  CHECK(decoded.header->meta.error == "failed");
  CHECK(decoded.header->meta.error_kind == ps::ErrorKind::kOther);
}

TEST_CASE("wire: a message's debug line shows a peer's text escaped and bounded", "[wire]") {
  // Logged for every dropped message: bytes a peer chose must not forge log lines or send
  // terminal escapes, nor fill the log.
  ps::Message msg;
  msg.meta.error = std::string("bad\n[sch] forged\x1b[31m\0\\end", 26);
  CHECK_THAT(msg.DebugString(),
             Catch::EndsWith(" error=\"bad\\x0a[sch] forged\\x1b[31m\\x00\\x5cend\""));
  msg.meta.error = std::string(1000, 'x');
  CHECK_THAT(msg.DebugString(), Catch::EndsWith(" error=\"" + std::string(300, 'x') + "...\""));
}

TEST_CASE("wire: each control command round-trips", "[wire]") {
  for (int raw = 0; raw <= 9; ++raw) {
    ps::Meta meta;
    meta.control = static_cast<ps::Control>(raw);
    const auto decoded = Decode(ps::wire::EncodeHeader(meta, {}));
    REQUIRE(decoded.header);
    CHECK(decoded.header->meta.control == meta.control);
  }
}

TEST_CASE("wire: malformed headers are rejected with a reason", "[wire]") {
  SECTION("garbage bytes") {
    const std::string garbage = "\xff\xff\xff\xff\x0f garbage that is not protobuf";
    const auto decoded = Decode(garbage);
    CHECK_FALSE(decoded.header);
    CHECK_THAT(decoded.error, Catch::Contains("not a valid protobuf"));
  }
  SECTION("a truncated header") {
    const std::string bytes = ps::wire::EncodeHeader(FullMeta(), {});
    const auto decoded = Decode(bytes.substr(0, bytes.size() / 2));
    CHECK_FALSE(decoded.header);
  }
  SECTION("an empty frame has the wrong version") {
    const auto decoded = Decode("");
    CHECK_FALSE(decoded.header);
    CHECK_THAT(decoded.error, Catch::Contains("protocol version 0"));
  }
  SECTION("a future protocol version") {
    auto header = ValidHeader();
    header.set_version(ps::kProtocolVersion + 1);
    CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("protocol version"));
  }
  SECTION("an unknown control command") {
    auto header = ValidHeader();
    header.set_control(static_cast<ps::pb::Control>(77));
    CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("unknown control command 77"));
  }
  SECTION("a negative node id") {
    auto header = ValidHeader();
    header.set_sender(-9);
    CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("negative node id"));
  }
  SECTION("an unknown dtype") {
    auto header = ValidHeader();
    auto* desc = header.add_data();
    desc->set_dtype(99);
    desc->set_count(1);
    CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("unknown dtype 99"));
  }
  SECTION("an absurd element count") {
    auto header = ValidHeader();
    auto* desc = header.add_data();
    desc->set_dtype(static_cast<std::uint32_t>(ps::DType::kFloat64));
    desc->set_count(std::uint64_t{1} << 62);  // count * 8 would overflow
    CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("absurd"));
  }
  SECTION("too many data frames") {
    auto header = ValidHeader();
    for (std::size_t i = 0; i <= ps::wire::kMaxDataFrames; ++i) header.add_data();
    CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("data frames"));
  }
  SECTION("a barrier group out of range") {
    auto header = ValidHeader();
    header.set_barrier_group(1 << 20);
    CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("barrier group"));
  }
  SECTION("an ipc endpoint outside the abstract namespace") {
    auto header = ValidHeader();
    auto* node = header.add_nodes();
    node->set_role(ps::pb::WORKER);
    node->set_ipc_endpoint("ipc:///etc/passwd");
    CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("invalid ipc endpoint"));
  }
  SECTION("a host name that is not printable ASCII") {
    for (const std::string& host : {std::string("a\nb"), std::string("\xff\xfe"),
                                    std::string("has space"), std::string(300, 'h')}) {
      auto header = ValidHeader();
      auto* node = header.add_nodes();
      node->set_role(ps::pb::WORKER);
      node->set_host(host);
      CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("malformed host name"));
    }
  }
  SECTION("an invalid node entry") {
    auto header = ValidHeader();
    auto* node = header.add_nodes();
    node->set_role(ps::pb::SERVER);
    node->set_port(70000);
    CHECK_THAT(Decode(Encode(header)).error, Catch::Contains("invalid node entry"));
  }
}

TEST_CASE("wire: frame sizes must match the descriptors", "[wire]") {
  const std::vector<ps::wire::DataDesc> descs = {{ps::DType::kFloat32, 4}, {ps::DType::kUInt8, 3}};
  CHECK(ps::wire::CheckFrames(descs, {16, 3}).empty());
  CHECK_THAT(ps::wire::CheckFrames(descs, {16}), Catch::Contains("describes 2 data frames but 1"));
  CHECK_THAT(ps::wire::CheckFrames(descs, {15, 3}),
             Catch::Contains("has 15 bytes, header claims 16"));
}

TEST_CASE("wire: mutated headers are rejected or decode to a header that round-trips",
          "[wire][fuzz]") {
  // Byte flips, truncations and insertions of a full header, through one reused decoder as on
  // the receive thread: the decoder never crashes, every rejection has a reason, and whatever
  // it accepts encodes and decodes back to itself (no state leaks from an earlier header).
  const std::vector<float> values = {1, 2, 3};
  const std::string valid = ps::wire::EncodeHeader(
      FullMeta(),
      {ps::Blob::Copy(values.data(), values.size() * sizeof(float), ps::DType::kFloat32)});
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 random(seed);
  const auto pick = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(random);
  };
  ps::wire::HeaderDecoder decoder;
  ps::wire::DecodedHeader header;
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = valid;
    for (std::size_t edits = 1 + pick(4); edits > 0 && !bytes.empty(); --edits) {
      switch (pick(4)) {
        case 0:
          bytes[pick(bytes.size())] = static_cast<char>(pick(256));
          break;
        case 1:
          bytes[pick(bytes.size())] ^= static_cast<char>(1 << pick(8));
          break;
        case 2:
          bytes.resize(pick(bytes.size()));
          break;
        default:
          bytes.insert(pick(bytes.size() + 1), 1, static_cast<char>(pick(256)));
          break;
      }
    }
    const std::string error = decoder.Decode(bytes.data(), bytes.size(), header);
    if (!error.empty()) continue;
    ++accepted;
    std::vector<ps::Blob> frames;
    for (const auto& desc : header.data) {
      if (desc.bytes() > (1 << 20)) continue;  // a plausible-looking but huge frame: skip
      frames.push_back(ps::Blob::FromVector(std::vector<std::byte>(desc.bytes()), desc.dtype));
    }
    if (frames.size() != header.data.size()) continue;
    const auto again = Decode(ps::wire::EncodeHeader(header.meta, frames));
    INFO("mutant " << i);
    REQUIRE(again.header);
    CHECK(again.header->meta == header.meta);
    REQUIRE(again.header->data.size() == header.data.size());
    for (std::size_t d = 0; d < header.data.size(); ++d) {
      CHECK(again.header->data[d].dtype == header.data[d].dtype);
      CHECK(again.header->data[d].count == header.data[d].count);
    }
  }
  CHECK(accepted > 0);  // the mutations do reach the accepting path too
  CHECK(decoder.Decode(valid.data(), valid.size(), header).empty());  // and it still decodes
  CHECK(header.meta == FullMeta());
}

TEST_CASE("wire: a wait report round-trips, a malformed or oversized one is refused", "[wire]") {
  const std::vector<ps::WaitEdge> edges{{3, 1, 4, 2, "round 1 of key 0"},
                                        {4, 2, 3, 1, std::string("key\0 7", 6)}};
  const auto decoded = ps::wire::DecodeWaitReport(ps::wire::EncodeWaitReport(edges));
  REQUIRE(decoded);
  CHECK(*decoded == edges);
  CHECK(ps::wire::DecodeWaitReport("")->empty());  // a server with nothing to report
  CHECK_FALSE(ps::wire::DecodeWaitReport("\xff\xff\xff"));
  ps::pb::WaitReport long_text;
  long_text.add_edges()->set_what(std::string(ps::wire::kMaxWaitTextBytes + 1, 'x'));
  CHECK_FALSE(ps::wire::DecodeWaitReport(long_text.SerializeAsString()));
  ps::pb::WaitReport many;
  for (std::size_t i = 0; i <= ps::wire::kMaxWaitEdges; ++i) many.add_edges();
  CHECK_FALSE(ps::wire::DecodeWaitReport(many.SerializeAsString()));
}

TEST_CASE("wire: a stall notice round-trips, a malformed one is refused", "[wire]") {
  for (const bool threads : {false, true}) {
    const auto decoded = ps::wire::DecodeStalled(ps::wire::EncodeStalled({42, threads}));
    REQUIRE(decoded);
    CHECK(decoded->stall == 42);
    CHECK(decoded->several_threads == threads);
  }
  CHECK(ps::wire::EncodeStalled({7, true}) == "7 threads");
  for (const char* bad : {"", "0", "0 threads", " threads", "7 thread", "-1", "7x", "x7"}) {
    INFO("'" << bad << "'");
    CHECK_FALSE(ps::wire::DecodeStalled(bad));
  }
  CHECK(ps::wire::DecodeStallNumber("0") == 0u);  // a worker that no longer stalls
  CHECK_FALSE(ps::wire::DecodeStallNumber("1 threads"));
}

TEST_CASE("wire: an unreachable-peer notice round-trips, a malformed one is refused", "[wire]") {
  for (const bool never : {false, true}) {
    const auto decoded = ps::wire::DecodeUnreachable(ps::wire::EncodeUnreachable({12000, never}));
    REQUIRE(decoded);
    CHECK(decoded->closed_ms == 12000u);
    CHECK(decoded->never_connected == never);
  }
  CHECK(ps::wire::EncodeUnreachable({3000, true}) == "3000 never");
  for (const char* bad : {"", " never", "3000 nver", "-1", "3000x", "x3000", "3000 never never"}) {
    INFO("'" << bad << "'");
    CHECK_FALSE(ps::wire::DecodeUnreachable(bad));
  }
}
