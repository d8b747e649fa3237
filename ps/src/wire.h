#pragma once
// The one encoder and the one decoder of the wire header. Decoding validates every field;
// a header that fails is described in `error` and must be dropped by the caller.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ps/message.h"

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

// Serializes `meta` plus one descriptor per payload buffer.
std::string EncodeHeader(const Meta& meta, const std::vector<Blob>& data);

struct DecodedHeader {
  Meta meta;
  std::vector<DataDesc> data;
};
struct DecodeResult {
  std::optional<DecodedHeader> header;
  std::string error;  // set when !header
};
DecodeResult DecodeHeader(const void* bytes, std::size_t size);

// Checks received frame sizes against the descriptors; "" when they agree.
std::string CheckFrames(const std::vector<DataDesc>& descs, const std::vector<std::size_t>& sizes);

}  // namespace ps::wire
