#include "kvstore/compression.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kvstore/compression_codec.h"

namespace ps::compression {
namespace {

using namespace codec;

// Values per block of the two-pass loops: a code buffer on the stack, and a multiple of every
// codec's values per word, so that blocks start on word boundaries.
constexpr std::size_t kBlock = 4096;

std::size_t Words(std::size_t n, std::size_t per_word) { return (n + per_word - 1) / per_word; }

// What an encoder reads and keeps, per element. A push: acc = residual + grad, and the residual
// keeps acc - sent. A pull: acc = value - mirror, and the mirror moves by what was sent.
struct PushSide {
  const float* __restrict grad;
  float* __restrict residual;
  float Acc(std::size_t i) const { return residual[i] + grad[i]; }
  void Keep(std::size_t i, float acc, float sent) const { residual[i] = acc - sent; }
};
struct PullSide {
  const float* __restrict value;
  float* __restrict mirror;
  float Acc(std::size_t i) const { return value[i] - mirror[i]; }
  void Keep(std::size_t i, float /*acc*/, float sent) const { mirror[i] = mirror[i] + sent; }
};

// The element loops below keep to compares, selects and arithmetic, which the compiler
// vectorizes; the codes go through a small buffer and are packed in a second pass.
template <class Side>
void Encode2Bit(const Side& side, float threshold, std::size_t n, std::byte* out) {
  alignas(64) std::uint8_t codes[kBlock];
  for (std::size_t base = 0; base < n; base += kBlock) {
    const std::size_t m = std::min(kBlock, n - base);
    for (std::size_t i = 0; i < m; ++i) {
      const float acc = side.Acc(base + i);
      const bool positive = acc >= threshold;
      const bool negative = acc <= -threshold;  // never both: threshold > 0
      // +threshold, -threshold or +0, as two flat selects (exact: x - 0 and 0 - x are).
      const float sent = (positive ? threshold : 0.0f) - (negative ? threshold : 0.0f);
      side.Keep(base + i, acc, sent);
      codes[i] = static_cast<std::uint8_t>((positive ? k2BitPositive : 0) |
                                           (negative ? k2BitNegative : 0));
    }
    const std::size_t padded = Words(m, k2BitValuesPerWord) * k2BitValuesPerWord;
    std::fill(codes + m, codes + padded, std::uint8_t{0});
    auto* bytes = reinterpret_cast<std::uint8_t*>(out) + base / 4;
    for (std::size_t b = 0; b < padded / 4; ++b) {
      bytes[b] = static_cast<std::uint8_t>(codes[4 * b] << 6 | codes[4 * b + 1] << 4 |
                                           codes[4 * b + 2] << 2 | codes[4 * b + 3]);
    }
  }
}

// The scale: magnitudes summed in double, in order within groups of kScaleGroup, then the
// groups' sums in order (the order the CUDA kernels follow).
template <class Side>
float Scale(const Side& side, std::size_t n) {
  double total = 0.0;
  for (std::size_t group = 0; group < n; group += kScaleGroup) {
    const std::size_t end = std::min(n, group + kScaleGroup);
    double sum = 0.0;
    for (std::size_t i = group; i < end; ++i) sum += Magnitude(side.Acc(i));
    total += sum;
  }
  return OneBitScale(total, n);
}

template <class Side>
void Encode1Bit(const Side& side, std::size_t n, std::byte* out) {
  const float scale = Scale(side, n);
  std::memcpy(out, &scale, kScaleBytes);
  auto* words = reinterpret_cast<std::uint8_t*>(out + kScaleBytes);
  alignas(64) std::uint8_t bits[kBlock];
  for (std::size_t base = 0; base < n; base += kBlock) {
    const std::size_t m = std::min(kBlock, n - base);
    for (std::size_t i = 0; i < m; ++i) {
      const float acc = side.Acc(base + i);
      const bool positive = OneBitPositive(acc);
      side.Keep(base + i, acc, positive ? scale : -scale);
      bits[i] = positive ? 1 : 0;
    }
    const std::size_t padded = Words(m, k1BitValuesPerWord) * k1BitValuesPerWord;
    std::fill(bits + m, bits + padded, std::uint8_t{0});
    std::uint8_t* bytes = words + base / 8;
    for (std::size_t b = 0; b < padded / 8; ++b) {
      const std::uint8_t* v = bits + 8 * b;
      bytes[b] = static_cast<std::uint8_t>(v[0] << 7 | v[1] << 6 | v[2] << 5 | v[3] << 4 |
                                           v[4] << 3 | v[5] << 2 | v[6] << 1 | v[7]);
    }
  }
}

template <class Side>
void EncodeFp16(const Side& side, std::size_t n, std::byte* out) {
  for (std::size_t i = 0; i < n; ++i) {
    const float acc = side.Acc(i);
    const std::uint16_t h = FloatToHalf(acc);
    side.Keep(i, acc, HalfToFloat(h));
    std::memcpy(out + 2 * i, &h, sizeof(h));
  }
}

template <class Side>
void Encode(Codec codec, float threshold, const Side& side, std::size_t n, std::byte* out) {
  switch (codec) {
    case Codec::k2Bit:
      Encode2Bit(side, threshold, n, out);
      return;
    case Codec::k1Bit:
      Encode1Bit(side, n, out);
      return;
    case Codec::kFp16:
      EncodeFp16(side, n, out);
      return;
    case Codec::kNone:
      break;
  }
  throw Error("gradient compression: no codec to encode with");
}

// The values of every byte of codes: per byte, its `per_byte` values in order (one table
// lookup and a short fixed loop per byte, instead of a shift and a select per value).
template <std::size_t kPerByte>
struct ByteTable {
  float values[256][kPerByte];
};

// Calls put(i, decoded value i) for every value, byte by byte through `table`.
template <std::size_t kPerByte, class Put>
void DecodeBytes(const ByteTable<kPerByte>& table, const std::uint8_t* bytes, std::size_t n,
                 Put put) {
  const std::size_t whole = n / kPerByte;
  for (std::size_t b = 0; b < whole; ++b) {
    const float* values = table.values[bytes[b]];
    for (std::size_t j = 0; j < kPerByte; ++j) put(b * kPerByte + j, values[j]);
  }
  for (std::size_t i = whole * kPerByte; i < n; ++i) {
    put(i, table.values[bytes[whole]][i - whole * kPerByte]);
  }
}

// Calls put(i, decoded value i) for every value, in order.
template <class Put>
void DecodeWith(Codec codec, float threshold, const std::byte* in, std::size_t n, Put put) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(in);
  switch (codec) {
    case Codec::k2Bit: {
      ByteTable<4> table;
      for (unsigned byte = 0; byte < 256; ++byte) {
        for (std::size_t j = 0; j < 4; ++j) {
          table.values[byte][j] = TwoBitValue((byte >> TwoBitShift(j)) & 0x3u, threshold);
        }
      }
      DecodeBytes(table, bytes, n, put);
      return;
    }
    case Codec::k1Bit: {
      float scale;
      std::memcpy(&scale, in, kScaleBytes);
      ByteTable<8> table;
      for (unsigned byte = 0; byte < 256; ++byte) {
        for (std::size_t j = 0; j < 8; ++j) {
          table.values[byte][j] = ((byte >> OneBitShift(j)) & 0x1u) != 0 ? scale : -scale;
        }
      }
      DecodeBytes(table, bytes + kScaleBytes, n, put);
      return;
    }
    case Codec::kFp16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, in + 2 * i, sizeof(h));
        put(i, HalfToFloat(h));
      }
      return;
    case Codec::kNone:
      break;
  }
  throw Error("gradient compression: no codec to decode with");
}

Codec ParseCodec(const std::string& field, const std::string& name) {
  if (name == "none") return Codec::kNone;
  if (name == "2bit") return Codec::k2Bit;
  if (name == "1bit") return Codec::k1Bit;
  if (name == "fp16") return Codec::kFp16;
  throw Error("SetGradientCompression: unknown " + field + " '" + name +
              "' (accepted: 2bit, 1bit, fp16, none)");
}

// Every digit a float needs to read back the same.
std::string ThresholdText(float threshold) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", static_cast<double>(threshold));
  return text;
}

}  // namespace

const char* CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::k2Bit:
      return "2bit";
    case Codec::k1Bit:
      return "1bit";
    case Codec::kFp16:
      return "fp16";
  }
  return "invalid";
}

Settings Parse(const GradientCompression& config) {
  Settings settings;
  settings.push = ParseCodec("type", config.type);
  settings.pull = ParseCodec("pull_type", config.pull_type);
  // Only 2bit reads it (1bit's step is a mean magnitude; fp16 has none). Written so that NaN
  // fails too.
  const bool two_bit = settings.push == Codec::k2Bit || settings.pull == Codec::k2Bit;
  if (two_bit && (!(config.threshold > 0.0f) || std::isinf(config.threshold))) {
    char text[64];
    std::snprintf(text, sizeof(text), "%g", static_cast<double>(config.threshold));
    throw Error(std::string("SetGradientCompression: threshold must be a finite number greater "
                            "than 0, given ") +
                text + " (2bit sends +threshold or -threshold; MXNet's default is 0.5)");
  }
  settings.threshold = config.threshold;
  return settings;
}

std::string Describe(const GradientCompression& config) {
  // Bounded: a type name is short when valid, and an invalid one only needs to be recognized.
  return "type=" + config.type.substr(0, 40) + " threshold=" + ThresholdText(config.threshold) +
         " pull_type=" + config.pull_type.substr(0, 40);
}

std::string DescribePush(const Settings& settings) {
  std::string text = std::string("type=") + CodecName(settings.push);
  if (settings.push == Codec::k2Bit) text += " threshold=" + ThresholdText(settings.threshold);
  return text;
}

std::size_t EncodedBytes(Codec codec, std::size_t n) {
  switch (codec) {
    case Codec::k2Bit:
      return Words(n, k2BitValuesPerWord) * kWordBytes;
    case Codec::k1Bit:
      return kScaleBytes + Words(n, k1BitValuesPerWord) * kWordBytes;
    case Codec::kFp16:
      return 2 * n;
    case Codec::kNone:
      break;
  }
  return n * sizeof(float);
}

void EncodePush(Codec codec, float threshold, const float* grad, float* residual, std::size_t n,
                std::byte* out) {
  Encode(codec, threshold, PushSide{grad, residual}, n, out);
}

void EncodeDelta(Codec codec, float threshold, const float* value, float* mirror, std::size_t n,
                 std::byte* out) {
  Encode(codec, threshold, PullSide{value, mirror}, n, out);
}

void Decode(Codec codec, float threshold, const std::byte* in, std::size_t n, float* out) {
  DecodeWith(codec, threshold, in, n, [out](std::size_t i, float v) { out[i] = v; });
}

void ApplyDelta(Codec codec, float threshold, const std::byte* in, std::size_t n, float* target) {
  DecodeWith(codec, threshold, in, n,
             [target](std::size_t i, float v) { target[i] = target[i] + v; });
}

}  // namespace ps::compression
