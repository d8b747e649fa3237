#pragma once
// The one encoder and the one decoder of the wire header. Decoding validates every field;
// a header that fails is described by the error returned and must be dropped by the caller.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ps/message.h"

namespace ps::pb {
class Header;  // generated from proto/ps.proto
}  // namespace ps::pb

namespace ps::wire {

// Upper bounds on what a header may claim; anything beyond is malformed, not a request to
// allocate.
constexpr std::size_t kMaxDataFrames = 4096;
constexpr std::size_t kMaxNodes = 1 << 17;
constexpr std::uint64_t kMaxFrameBytes = std::uint64_t{1} << 40;
constexpr std::size_t kMaxBodyBytes = std::size_t{64} << 20;

struct DataDesc {
  DType dtype = DType::kUInt8;
  std::uint64_t count = 0;
  std::uint64_t bytes() const { return count * DTypeSize(dtype); }
};

struct DecodedHeader {
  Meta meta;
  std::vector<DataDesc> data;
};

// Encodes headers into one reused protobuf message and output buffer, so that a steady stream
// of messages allocates nothing here. One thread at a time.
class HeaderEncoder {
 public:
  HeaderEncoder();
  ~HeaderEncoder();
  HeaderEncoder(const HeaderEncoder&) = delete;
  HeaderEncoder& operator=(const HeaderEncoder&) = delete;
  // Serializes `meta` plus one descriptor per payload buffer; valid until the next call.
  const std::string& Encode(const Meta& meta, const std::vector<Blob>& data);

 private:
  std::unique_ptr<pb::Header> scratch_;
  std::string out_;
};

// Decodes headers through one reused protobuf message. One thread at a time.
class HeaderDecoder {
 public:
  HeaderDecoder();
  ~HeaderDecoder();
  HeaderDecoder(const HeaderDecoder&) = delete;
  HeaderDecoder& operator=(const HeaderDecoder&) = delete;
  // Fills `header`, reusing the memory its containers hold. Returns "" or why the header is
  // malformed (`header` is then unspecified).
  std::string Decode(const void* bytes, std::size_t size, DecodedHeader& header);

 private:
  std::unique_ptr<pb::Header> scratch_;
};

// One-off forms of the above.
std::string EncodeHeader(const Meta& meta, const std::vector<Blob>& data);
struct DecodeResult {
  std::optional<DecodedHeader> header;
  std::string error;  // set when !header
};
DecodeResult DecodeHeader(const void* bytes, std::size_t size);

// Checks received frame sizes against the descriptors; "" when they agree.
std::string CheckFrames(const std::vector<DataDesc>& descs, const std::vector<std::size_t>& sizes);

// A server's answer to a WAIT_PROBE (its body). Decoding returns nothing for a malformed
// report or one beyond the bounds below.
constexpr std::size_t kMaxWaitEdges = 1 << 16;
constexpr std::size_t kMaxWaitTextBytes = 1024;
std::string EncodeWaitReport(std::span<const WaitEdge> edges);
std::optional<std::vector<WaitEdge>> DecodeWaitReport(const std::string& body);

// A STALLED notice's body (Runtime::ReportStall): the stall number, and whether the worker's
// pushes come from other threads than the waiting one, which may still push (the scheduler
// then only suspects a deadlock): "7" or "7 threads".
struct StalledNotice {
  std::uint64_t stall = 0;
  bool several_threads = false;
};
std::string EncodeStalled(const StalledNotice& notice);
// nullopt when malformed or the number is 0.
std::optional<StalledNotice> DecodeStalled(std::string_view body);
// A number as a worker's WAIT_PROBE answer carries it (its stall, 0: none); nullopt when
// malformed.
std::optional<std::uint64_t> DecodeStallNumber(std::string_view text);

// A PEER_UNREACHABLE notice's body (Runtime::ReportUnreachablePeers): how long the reporter's
// connection to the peer has been closed, in milliseconds, and whether it never opened (the
// reporter could not connect at all): "12000" or "12000 never".
struct UnreachableNotice {
  std::uint64_t closed_ms = 0;
  bool never_connected = false;
};
std::string EncodeUnreachable(const UnreachableNotice& notice);
std::optional<UnreachableNotice> DecodeUnreachable(std::string_view body);  // nullopt: malformed

}  // namespace ps::wire
