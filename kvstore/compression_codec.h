#pragma once
// The per-element rules of the gradient compression codecs (docs/kvstore.md, "Gradient
// compression"), shared by the CPU loops (compression.cc) and the CUDA kernels
// (compression_kernels.cuh), so both encode every value alike. C++17 and plain integer and
// float operations only: nvcc compiles this for the device, and the host emulation of the
// kernels (tests/worker/cuda_host_emulation.h) for the host.
//
// Wire layouts, per key slice of n float32 values (little-endian, as every payload):
//   2bit  ceil(n / 16) 32-bit words. Byte b holds values 4b..4b+3, the first in the two most
//         significant bits: 11 = +threshold, 10 = -threshold, 00 = 0 (MXNet's codes and layout).
//   1bit  a float32 scale, then ceil(n / 32) 32-bit words. Byte b holds values 8b..8b+7, the
//         first in the most significant bit: 1 = +scale, 0 = -scale.
//   fp16  n IEEE half-precision values.
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PS_CODEC_FN __host__ __device__ inline
#else
#define PS_CODEC_FN inline
#endif

namespace ps::compression {

enum class Codec : std::uint8_t { kNone = 0, k2Bit = 1, k1Bit = 2, kFp16 = 3 };

}  // namespace ps::compression

namespace ps::compression::codec {

constexpr std::size_t k2BitValuesPerWord = 16;
constexpr std::size_t k1BitValuesPerWord = 32;
constexpr std::size_t kWordBytes = 4;
constexpr std::size_t kScaleBytes = 4;  // 1bit: the scale before the bits
// 1bit: the scale's sum of magnitudes runs over groups of this many values, each summed in
// order in double precision, and then over the groups' sums in order: a fixed order that a
// GPU (one thread per group) and the CPU both follow, so that the scale is bit-identical.
constexpr std::size_t kScaleGroup = 1024;

constexpr std::uint8_t k2BitPositive = 0x3;  // 11
constexpr std::uint8_t k2BitNegative = 0x2;  // 10
constexpr std::uint8_t k2BitZero = 0x0;      // 00

PS_CODEC_FN std::uint32_t FloatBits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

PS_CODEC_FN float BitsFloat(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// 2bit: the code of an accumulated value (residual + gradient), and what the residual keeps.
// MXNet's rule: >= threshold sends +threshold, <= -threshold sends -threshold, else 0.
PS_CODEC_FN std::uint8_t TwoBitCode(float acc, float threshold, float* rest) {
  const bool positive = acc >= threshold;
  const bool negative = acc <= -threshold;
  *rest = positive ? acc - threshold : (negative ? acc + threshold : acc);
  return positive ? k2BitPositive : (negative ? k2BitNegative : k2BitZero);
}

// 2bit: a code's value (01, which no encoder writes, reads as 0, as in MXNet).
PS_CODEC_FN float TwoBitValue(unsigned code, float threshold) {
  return code == k2BitPositive ? threshold : (code == k2BitNegative ? -threshold : 0.0f);
}

// Where value i's code sits in its byte.
PS_CODEC_FN unsigned TwoBitShift(std::size_t i) { return 6u - 2u * static_cast<unsigned>(i & 3u); }
PS_CODEC_FN unsigned OneBitShift(std::size_t i) { return 7u - static_cast<unsigned>(i & 7u); }

// 1bit: |acc| as the scale's sum adds it.
PS_CODEC_FN double Magnitude(float acc) {
  return static_cast<double>(BitsFloat(FloatBits(acc) & 0x7fffffffu));
}

// 1bit: the scale from the sum of magnitudes of n values (0 for none).
PS_CODEC_FN float OneBitScale(double sum, std::size_t n) {
  return n == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(n));
}

// 1bit: the sign bit of an accumulated value (1: acc >= 0, which -0 is; NaN reads as negative).
PS_CODEC_FN bool OneBitPositive(float acc) { return acc >= 0.0f; }

// fp16: round to nearest, ties to even; finite values beyond the largest half (65504) saturate
// to it instead of becoming infinite (error feedback keeps the rest); infinities stay infinite
// and every NaN becomes the quiet NaN 0x7e00 with its sign.
PS_CODEC_FN std::uint16_t FloatToHalf(float f) {
  const std::uint32_t x = FloatBits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u)
    return static_cast<std::uint16_t>(sign | (a == 0x7f800000u ? 0x7c00u : 0x7e00u));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7bffu);  // >= 65520: saturate
  if (a >= 0x38800000u) {  // a normal half (>= 2^-14): rebias the exponent, round 13 bits away
    std::uint32_t h = (a - 0x38000000u) >> 13;
    const std::uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // a carry is right too
    return static_cast<std::uint16_t>(sign | h);
  }
  const std::uint32_t exponent = a >> 23;
  if (exponent < 102) return static_cast<std::uint16_t>(sign);  // below 2^-25: rounds to 0
  // A subnormal half: the value in units of 2^-24 is mantissa * 2^(exponent - 126).
  const std::uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - exponent;  // 14..24
  std::uint32_t h = mantissa >> shift;
  const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (h & 1u) != 0)) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

PS_CODEC_FN float HalfToFloat(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsFloat(sign);
  std::uint32_t biased = 113;  // a subnormal half: normalize it
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --biased;
  }
  return BitsFloat(sign | (biased << 23) | ((mantissa & 0x3ffu) << 13));
}

}  // namespace ps::compression::codec
