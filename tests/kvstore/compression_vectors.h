#pragma once
// Gradient compression test vectors worked out by hand from the definitions (docs/kvstore.md,
// "Gradient compression"): several rounds of one slice each, with the bytes that must go on
// the wire and the residual that must stay behind, and the helpers every test of them uses.
// Shared by the CPU test (tests/kvstore/test_compression.cc) and the CUDA kernels' tests
// (tests/worker).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvstore/compression_codec.h"

namespace ps::test {

// The codec a vector's type names ("2bit", "1bit" or "fp16").
inline compression::Codec CodecOf(const std::string& type) {
  if (type == "2bit") return compression::Codec::k2Bit;
  if (type == "1bit") return compression::Codec::k1Bit;
  return compression::Codec::kFp16;
}

// The bytes of the codes of n values, worked out from the wire layouts, not taken from the
// store: 2bit 16 values per 4-byte word, 1bit a 4-byte scale and 32 values per word, fp16 2
// bytes a value.
inline std::size_t ExpectedEncodedBytes(compression::Codec codec, std::size_t n) {
  if (codec == compression::Codec::k2Bit) return (n + 15) / 16 * 4;
  if (codec == compression::Codec::k1Bit) return 4 + (n + 31) / 32 * 4;
  return 2 * n;
}

// The bit patterns of float values, so that residuals compare bit for bit (-0 and NaN too).
inline std::vector<std::uint32_t> Bits(const std::vector<float>& values) {
  std::vector<std::uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

struct VectorRound {
  std::vector<float> grad;
  std::vector<std::uint8_t> codes;  // the encoded slice, byte by byte
  std::vector<float> residual;      // after this round
};

struct HandVector {
  const char* type;
  float threshold;
  std::vector<VectorRound> rounds;  // from a zero residual
};

inline std::vector<HandVector> HandVectors() {
  // 2bit, threshold 0.5, 18 values (two words, the second padded). Codes per byte, first value
  // in the top bits: 11 = +0.5, 10 = -0.5, 00 = 0.
  const std::vector<float> g2 = {0.75f,   -0.25f, 0.5f,    -0.5f,    0.0f,   1.25f,
                                 -1.625f, 0.25f,  0.375f,  -0.375f,  2.0f,   -0.625f,
                                 0.125f,  0.0f,   0.4375f, -0.4375f, 0.625f, -3.0f};
  const std::vector<float> zeros2(18, 0.0f);
  HandVector two_bit{"2bit", 0.5f, {}};
  // Round 1: 11 00 11 10 | 00 11 10 00 | 00 00 11 10 | 00 00 00 00 | 11 10 (pad) ...
  two_bit.rounds.push_back(
      {g2,
       {0xCE, 0x38, 0x0E, 0x00, 0xE0, 0x00, 0x00, 0x00},
       {0.25f, -0.25f, 0.0f, 0.0f, 0.0f, 0.75f, -1.125f, 0.25f, 0.375f, -0.375f, 1.5f, -0.125f,
        0.125f, 0.0f, 0.4375f, -0.4375f, 0.125f, -2.5f}});
  // Round 2, the same gradient on top of the residual.
  two_bit.rounds.push_back({g2,
                            {0xEE, 0x3B, 0xEE, 0x0E, 0xE0, 0x00, 0x00, 0x00},
                            {0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 1.5f, -2.25f, 0.0f, 0.25f, -0.25f, 3.0f,
                             -0.25f, 0.25f, 0.0f, 0.375f, -0.375f, 0.25f, -5.0f}});
  // Round 3, no gradient: the residual alone drains.
  two_bit.rounds.push_back({zeros2,
                            {0xC0, 0x38, 0x0C, 0x00, 0x20, 0x00, 0x00, 0x00},
                            {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f, -1.75f, 0.0f, 0.25f, -0.25f, 2.5f,
                             -0.25f, 0.25f, 0.0f, 0.375f, -0.375f, 0.25f, -4.5f}});

  // 1bit, 10 values: the scale (float32, little-endian), then the signs, first value in the
  // top bit. Round 1: mean |acc| = 15 / 10 = 1.5; round 2: 20 / 10 = 2.
  const std::vector<float> g1 = {1.0f, -2.0f, 3.0f, -4.0f, 0.5f, -0.5f, 0.0f, 2.0f, -1.0f, 1.0f};
  HandVector one_bit{"1bit", 0.5f, {}};
  one_bit.rounds.push_back({g1,
                            {0x00, 0x00, 0xC0, 0x3F, 0xAB, 0x40, 0x00, 0x00},
                            {-0.5f, -0.5f, 1.5f, -2.5f, -1.0f, 1.0f, -1.5f, 0.5f, 0.5f, -0.5f}});
  one_bit.rounds.push_back({g1,
                            {0x00, 0x00, 0x00, 0x40, 0xA5, 0x40, 0x00, 0x00},
                            {-1.5f, -0.5f, 2.5f, -4.5f, 1.5f, -1.5f, 0.5f, 0.5f, 1.5f, -1.5f}});

  // fp16, 10 values: exact ones, ties (to even), saturation above 65504, a subnormal tie, a
  // value below half the smallest subnormal, and -0 (which 0 + -0 makes +0).
  const float tie = 1.0f + 0x1p-11f;         // halfway between 1 and 1 + 2^-10: to 1
  const float tie_up = 1.0f + 3 * 0x1p-11f;  // halfway between 1 + 2^-10 and 1 + 2^-9: up
  const float tiny = 1e-8f;
  const std::vector<float> g16 = {1.0f,     -2.5f,        tie,  tie_up, 65504.0f,
                                  70000.0f, 3 * 0x1p-25f, tiny, -0.0f,  -tie};
  HandVector fp16{"fp16", 0.5f, {}};
  fp16.rounds.push_back(
      {g16,
       {0x00, 0x3C, 0x00, 0xC1, 0x00, 0x3C, 0x02, 0x3C, 0xFF, 0x7B,
        0xFF, 0x7B, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xBC},
       {0.0f, 0.0f, 0x1p-11f, -0x1p-11f, 0.0f, 4496.0f, -0x1p-25f, tiny, 0.0f, -0x1p-11f}});
  fp16.rounds.push_back({g16,
                         {0x00, 0x3C, 0x00, 0xC1, 0x01, 0x3C, 0x01, 0x3C, 0xFF, 0x7B,
                          0xFF, 0x7B, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xBC},
                         {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 8992.0f, 0.0f, 2 * tiny, 0.0f, 0.0f}});
  return {two_bit, one_bit, fp16};
}

}  // namespace ps::test
