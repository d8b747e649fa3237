#pragma once
// A plain reference implementation of the gradient compression codecs, written from their
// definitions (docs/kvstore.md, "Gradient compression") and sharing no code with the store:
// the CPU loops (kvstore/compression.cc) and the CUDA kernels (kvstore/compression_kernels.cuh)
// must produce exactly its bytes and residuals. One value at a time, no tricks.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ps::test::reference {

using Bytes = std::vector<std::uint8_t>;

// ---- 2bit (MXNet) ----
// residual += grad; >= threshold: code 11, residual -= threshold; <= -threshold: code 10,
// residual += threshold; else code 00. 16 codes per 32-bit word; byte b holds values 4b..4b+3,
// the first in the top two bits.
inline Bytes Encode2Bit(const std::vector<float>& grad, std::vector<float>& residual,
                        float threshold) {
  const std::size_t n = grad.size();
  Bytes out((n + 15) / 16 * 4, 0);
  for (std::size_t i = 0; i < n; ++i) {
    residual[i] += grad[i];
    unsigned code = 0;
    if (residual[i] >= threshold) {
      code = 3;
      residual[i] -= threshold;
    } else if (residual[i] <= -threshold) {
      code = 2;
      residual[i] -= -threshold;
    }
    out[i / 4] = static_cast<std::uint8_t>(out[i / 4] | code << (6 - 2 * (i % 4)));
  }
  return out;
}

inline std::vector<float> Decode2Bit(const Bytes& in, std::size_t n, float threshold) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned code = (in[i / 4] >> (6 - 2 * (i % 4))) & 3u;
    out[i] = code == 3 ? threshold : code == 2 ? -threshold : 0.0f;
  }
  return out;
}

// ---- 1bit ----
// acc = residual + grad; scale = the mean of |acc| over the slice, summed in double: in order
// within groups of 1024 values, then the groups' sums in order; the float of sum / n. Sends
// the scale, then one bit per value (1: acc >= 0), 32 per 32-bit word, byte b holding values
// 8b..8b+7 from its top bit down; the residual keeps acc - (+scale or -scale).
inline Bytes Encode1Bit(const std::vector<float>& grad, std::vector<float>& residual) {
  const std::size_t n = grad.size();
  std::vector<float> acc(n);
  for (std::size_t i = 0; i < n; ++i) acc[i] = residual[i] + grad[i];
  double total = 0.0;
  for (std::size_t group = 0; group < n; group += 1024) {
    double sum = 0.0;
    for (std::size_t i = group; i < n && i < group + 1024; ++i) {
      sum += std::fabs(static_cast<double>(acc[i]));
    }
    total += sum;
  }
  const float scale = n == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(n));
  Bytes out(4 + (n + 31) / 32 * 4, 0);
  std::memcpy(out.data(), &scale, 4);
  for (std::size_t i = 0; i < n; ++i) {
    const bool positive = acc[i] >= 0.0f;
    if (positive) out[4 + i / 8] = static_cast<std::uint8_t>(out[4 + i / 8] | 1u << (7 - i % 8));
    residual[i] = acc[i] - (positive ? scale : -scale);
  }
  return out;
}

inline std::vector<float> Decode1Bit(const Bytes& in, std::size_t n) {
  float scale;
  std::memcpy(&scale, in.data(), 4);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = (in[4 + i / 8] >> (7 - i % 8) & 1u) != 0 ? scale : -scale;
  }
  return out;
}

// ---- fp16 ----
// IEEE half precision, round to nearest with ties to even, computed in double: finite values
// of 65520 or more in magnitude (which would round to infinity) saturate to 65504; infinities
// stay; NaN becomes 0x7e00 with its sign.
inline std::uint16_t FloatToHalf(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return static_cast<std::uint16_t>(sign | 0x7e00);
  if (std::isinf(f)) return static_cast<std::uint16_t>(sign | 0x7c00);
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return static_cast<std::uint16_t>(sign | 0x7bff);
  // The spacing of halves around a: 2^-24 below 2^-14, else 2^(e - 10) for a in [2^e, 2^(e+1)).
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): a in [2^(e-1), 2^e)
  const int exponent = a == 0.0 ? -15 : e - 1;
  const double ulp = exponent < -14 ? std::ldexp(1.0, -24) : std::ldexp(1.0, exponent - 10);
  const double units = std::nearbyint(a / ulp);  // ties to even (the default rounding mode)
  const double value = units * ulp;
  if (value < std::ldexp(1.0, -14))
    return static_cast<std::uint16_t>(sign | static_cast<int>(units));
  int ve = 0;
  const double m = std::frexp(value, &ve);  // value = m * 2^ve, m in [0.5, 1)
  const int biased = ve - 1 + 15;
  const int mantissa = static_cast<int>((m * 2.0 - 1.0) * 1024.0);
  return static_cast<std::uint16_t>(sign | biased << 10 | mantissa);
}

inline float HalfToFloat(std::uint16_t h) {
  const bool negative = (h & 0x8000) != 0;
  const int biased = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double value;
  if (biased == 0x1f) {
    value = mantissa == 0 ? INFINITY : NAN;
  } else if (biased == 0) {
    value = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    value = std::ldexp(1.0 + mantissa / 1024.0, biased - 15);
  }
  return static_cast<float>(negative ? -value : value);
}

// acc = residual + grad; sends the half nearest acc; the residual keeps acc - that half.
inline Bytes EncodeFp16(const std::vector<float>& grad, std::vector<float>& residual) {
  Bytes out(2 * grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i) {
    const float acc = residual[i] + grad[i];
    const std::uint16_t h = FloatToHalf(acc);
    std::memcpy(out.data() + 2 * i, &h, 2);
    residual[i] = acc - HalfToFloat(h);
  }
  return out;
}

inline std::vector<float> DecodeFp16(const Bytes& in, std::size_t n) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in.data() + 2 * i, 2);
    out[i] = HalfToFloat(h);
  }
  return out;
}

// ---- by name ----
inline Bytes EncodePush(const char* type, float threshold, const std::vector<float>& grad,
                        std::vector<float>& residual) {
  const std::string name = type;
  if (name == "2bit") return Encode2Bit(grad, residual, threshold);
  if (name == "1bit") return Encode1Bit(grad, residual);
  return EncodeFp16(grad, residual);
}

inline std::vector<float> Decode(const char* type, float threshold, const Bytes& in,
                                 std::size_t n) {
  const std::string name = type;
  if (name == "2bit") return Decode2Bit(in, n, threshold);
  if (name == "1bit") return Decode1Bit(in, n);
  return DecodeFp16(in, n);
}

// A compressed pull: the change acc = value - mirror is encoded (as a push of `value` whose
// residual is -mirror: -mirror + value is exactly value - mirror), and the mirror, like the
// receiver's copy, adds what the change decodes to.
inline Bytes EncodeDelta(const char* type, float threshold, const std::vector<float>& value,
                         std::vector<float>& mirror) {
  std::vector<float> negated(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) negated[i] = -mirror[i];
  const Bytes codes = EncodePush(type, threshold, value, negated);
  const std::vector<float> sent = Decode(type, threshold, codes, value.size());
  for (std::size_t i = 0; i < value.size(); ++i) mirror[i] = mirror[i] + sent[i];
  return codes;
}

}  // namespace ps::test::reference
