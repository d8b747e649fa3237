// Gradient compression on the CPU: the store's codec loops (kvstore/compression.cc) against the
// hand-worked vectors and, bit for bit, against a plain reference implementation written from
// the definitions (compression_reference.h), over several rounds with their residuals; the
// settings' checks; and "local" refusing compression as MXNet does.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvstore/compression.h"
#include "ps/kvstore.h"
#include "tests/kvstore/compression_reference.h"
#include "tests/kvstore/compression_vectors.h"

namespace {

using ps::compression::Codec;
using ps::test::Bits;
using ps::test::CodecOf;
namespace reference = ps::test::reference;

std::vector<std::uint8_t> Encode(Codec codec, float threshold, const std::vector<float>& grad,
                                 std::vector<float>& residual) {
  std::vector<std::byte> out(ps::compression::EncodedBytes(codec, grad.size()), std::byte{0xAA});
  ps::compression::EncodePush(codec, threshold, grad.data(), residual.data(), grad.size(),
                              out.data());
  std::vector<std::uint8_t> bytes(out.size());
  std::memcpy(bytes.data(), out.data(), out.size());
  return bytes;
}

// Gradients that reach every branch: plain values, exact thresholds and their negatives,
// zeros of both signs, tiny and huge magnitudes (fp16's subnormals and saturation).
std::vector<float> Gradient(std::mt19937& random, std::size_t n, float threshold) {
  std::uniform_real_distribution<float> plain(-2.0f, 2.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<float> grad(n);
  for (float& g : grad) {
    switch (kind(random)) {
      case 0:
        g = threshold;
        break;
      case 1:
        g = -threshold;
        break;
      case 2:
        g = kind(random) < 5 ? 0.0f : -0.0f;
        break;
      case 3:
        g = plain(random) * 1e-6f;
        break;
      case 4:
        g = plain(random) * 5e4f;
        break;
      case 5:
        g = static_cast<float>(kind(random) - 5) * 0.125f;
        break;
      default:
        g = plain(random);
    }
  }
  return grad;
}

}  // namespace

TEST_CASE("compression: the hand-worked vectors, round by round, residuals included",
          "[compression]") {
  for (const ps::test::HandVector& vector : ps::test::HandVectors()) {
    INFO(vector.type);
    const Codec codec = CodecOf(vector.type);
    std::vector<float> residual(vector.rounds.front().grad.size(), 0.0f);
    std::vector<float> ref_residual = residual;
    for (std::size_t r = 0; r < vector.rounds.size(); ++r) {
      INFO("round " << r + 1);
      const ps::test::VectorRound& round = vector.rounds[r];
      CHECK(Encode(codec, vector.threshold, round.grad, residual) == round.codes);
      CHECK(residual == round.residual);
      // The reference agrees with the hand (and so the vectors check it too).
      CHECK(reference::EncodePush(vector.type, vector.threshold, round.grad, ref_residual) ==
            round.codes);
      CHECK(ref_residual == round.residual);
      // Decoding gives what the hand says each code means.
      std::vector<float> decoded(round.grad.size());
      std::vector<std::byte> codes(round.codes.size());
      std::memcpy(codes.data(), round.codes.data(), codes.size());
      ps::compression::Decode(codec, vector.threshold, codes.data(), decoded.size(),
                              decoded.data());
      CHECK(Bits(decoded) ==
            Bits(reference::Decode(vector.type, vector.threshold, round.codes, round.grad.size())));
    }
  }
}

TEST_CASE("compression: 2bit decodes to MXNet's values and is 16x smaller", "[compression]") {
  const std::vector<std::uint8_t> codes = {0xE4, 0x00, 0x00, 0x00};  // 11 10 01 00
  std::vector<std::byte> bytes(4);
  std::memcpy(bytes.data(), codes.data(), 4);
  std::vector<float> out(4);
  ps::compression::Decode(Codec::k2Bit, 0.5f, bytes.data(), 4, out.data());
  CHECK(out == std::vector<float>{0.5f, -0.5f, 0.0f, 0.0f});  // 01 is no code: 0, as MXNet
  CHECK(ps::compression::EncodedBytes(Codec::k2Bit, 1 << 20) == (std::size_t{1} << 20) * 4 / 16);
  CHECK(ps::compression::EncodedBytes(Codec::k2Bit, 17) == 8);
  CHECK(ps::compression::EncodedBytes(Codec::k1Bit, 33) == 4 + 8);
  CHECK(ps::compression::EncodedBytes(Codec::kFp16, 5) == 10);
}

TEST_CASE("compression: a NaN or an infinity stays in the residual, as kvstore.md says",
          "[compression]") {
  // Round 1 sends [NaN, +inf, -inf, 0.25]; rounds 2 and 3 send 1 everywhere. What each value
  // decodes to in round 3 is what the docs say each codec sends from then on.
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const auto third_round = [](Codec codec) {
    std::vector<float> residual(4, 0.0f), decoded(4);
    for (const std::vector<float>& grad :
         {std::vector<float>{kNan, kInf, -kInf, 0.25f}, std::vector<float>(4, 1.0f),
          std::vector<float>(4, 1.0f)}) {
      const std::vector<std::uint8_t> codes = Encode(codec, 0.5f, grad, residual);
      std::vector<std::byte> bytes(codes.size());
      std::memcpy(bytes.data(), codes.data(), bytes.size());
      ps::compression::Decode(codec, 0.5f, bytes.data(), decoded.size(), decoded.data());
    }
    return decoded;
  };
  // 2bit: NaN sends 0 for ever, +-inf +-threshold whatever the gradient; nothing non-finite.
  CHECK(third_round(Codec::k2Bit) == std::vector<float>{0.0f, 0.5f, -0.5f, 0.5f});
  // 1bit: the slice's scale is no longer finite: every value of the slice is NaN.
  for (const float value : third_round(Codec::k1Bit)) CHECK(std::isnan(value));
  // fp16: a NaN or an infinity leaves a NaN residual (inf - inf), sent every push.
  const std::vector<float> fp16 = third_round(Codec::kFp16);
  CHECK(std::isnan(fp16[0]));
  CHECK(std::isnan(fp16[1]));
  CHECK(std::isnan(fp16[2]));
  CHECK(fp16[3] == 1.0f);
}

TEST_CASE("compression: every codec matches the reference bit for bit over several rounds",
          "[compression]") {
  std::mt19937 random(20240611);
  for (const char* type : {"2bit", "1bit", "fp16"}) {
    const Codec codec = CodecOf(type);
    for (const float threshold : {0.5f, 0.125f, 1.0f}) {
      for (const std::size_t n :
           {1u, 3u, 15u, 16u, 17u, 31u, 32u, 33u, 1000u, 1025u, 4097u, 10000u}) {
        INFO(type << " threshold " << threshold << " n " << n);
        std::vector<float> residual(n, 0.0f), ref_residual(n, 0.0f);
        for (int round = 0; round < 4; ++round) {
          INFO("round " << round + 1);
          const std::vector<float> grad = Gradient(random, n, threshold);
          const auto codes = Encode(codec, threshold, grad, residual);
          REQUIRE(codes == reference::EncodePush(type, threshold, grad, ref_residual));
          REQUIRE(Bits(residual) == Bits(ref_residual));
          std::vector<std::byte> raw(codes.size());
          std::memcpy(raw.data(), codes.data(), raw.size());
          std::vector<float> decoded(n);
          ps::compression::Decode(codec, threshold, raw.data(), n, decoded.data());
          REQUIRE(Bits(decoded) == Bits(reference::Decode(type, threshold, codes, n)));
        }
      }
    }
  }
}

TEST_CASE("compression: a pulled change moves the receiver's copy exactly as the mirror",
          "[compression]") {
  std::mt19937 random(7);
  for (const char* type : {"2bit", "1bit", "fp16"}) {
    const Codec codec = CodecOf(type);
    for (const std::size_t n : {5u, 33u, 5000u}) {
      INFO(type << " n " << n);
      std::vector<float> value = Gradient(random, n, 0.5f);
      std::vector<float> mirror = value, ref_mirror = value, copy = value;
      for (int round = 0; round < 5; ++round) {
        const std::vector<float> step = Gradient(random, n, 0.5f);
        for (std::size_t i = 0; i < n; ++i) value[i] -= step[i];
        std::vector<std::byte> change(ps::compression::EncodedBytes(codec, n));
        ps::compression::EncodeDelta(codec, 0.5f, value.data(), mirror.data(), n, change.data());
        const auto expected = reference::EncodeDelta(type, 0.5f, value, ref_mirror);
        std::vector<std::uint8_t> bytes(change.size());
        std::memcpy(bytes.data(), change.data(), change.size());
        REQUIRE(bytes == expected);
        REQUIRE(Bits(mirror) == Bits(ref_mirror));
        ps::compression::ApplyDelta(codec, 0.5f, change.data(), n, copy.data());
        REQUIRE(Bits(copy) == Bits(mirror));
      }
    }
  }
}

TEST_CASE("compression: half-precision conversion matches the reference", "[compression]") {
  using ps::compression::codec::FloatToHalf;
  using ps::compression::codec::HalfToFloat;
  // Plain loops (millions of values), the first difference reported.
  std::string first_difference;
  const auto differ = [&](const std::string& what) {
    if (first_difference.empty()) first_difference = what;
  };
  // Every half: to float like the reference, and back to itself (NaNs to the quiet one).
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto half = static_cast<std::uint16_t>(h);
    const float f = HalfToFloat(half);
    const float expected = reference::HalfToFloat(half);
    if (std::isnan(expected)) {
      if (!std::isnan(f) || FloatToHalf(f) != ((h & 0x8000) | 0x7e00)) {
        differ("NaN half " + std::to_string(h));
      }
      continue;
    }
    if (Bits({f}) != Bits({expected}) || FloatToHalf(f) != half)
      differ("half " + std::to_string(h));
  }
  // Floats: every 257th bit pattern, and each exponent's edges and rounding midpoints.
  const auto check = [&](std::uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    if (FloatToHalf(f) != reference::FloatToHalf(f)) differ("float bits " + std::to_string(bits));
  };
  for (std::uint64_t bits = 0; bits <= 0xffffffffu; bits += 257) {
    check(static_cast<std::uint32_t>(bits));
  }
  for (std::uint32_t exponent = 0; exponent < 256; ++exponent) {
    for (const std::uint32_t mantissa :
         {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7fffffu, 0x400000u, 0x401000u}) {
      check(exponent << 23 | mantissa);
      check(0x80000000u | exponent << 23 | mantissa);
    }
  }
  CHECK(first_difference == "");
}

TEST_CASE("compression: settings are checked with clear errors", "[compression][errors]") {
  const auto error = [](const ps::GradientCompression& config) -> std::string {
    try {
      ps::compression::Parse(config);
    } catch (const ps::Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error({.type = "3bit"}),
             Catch::Contains("unknown type '3bit' (accepted: 2bit, 1bit, fp16, none)"));
  CHECK_THAT(error({.type = "2bit", .threshold = 0.0f}),
             Catch::Contains("threshold must be a finite number greater than 0, given 0"));
  CHECK_THAT(error({.type = "2bit", .threshold = -0.5f}), Catch::Contains("given -0.5"));
  CHECK_THAT(error({.type = "2bit", .threshold = std::numeric_limits<float>::quiet_NaN()}),
             Catch::Contains("threshold must be"));
  // Only 2bit reads the threshold: 1bit and fp16 ignore it, whatever it is.
  CHECK(error({.type = "1bit", .threshold = std::numeric_limits<float>::quiet_NaN()}).empty());
  CHECK(error({.type = "fp16", .threshold = -1.0f, .pull_type = "1bit"}).empty());
  CHECK_THAT(error({.type = "fp16", .threshold = 0.0f, .pull_type = "2bit"}),
             Catch::Contains("threshold must be"));
  CHECK_THAT(error({.type = "2bit", .threshold = 0.5f, .pull_type = "4bit"}),
             Catch::Contains("unknown pull_type '4bit'"));
  CHECK(error({.type = "2bit", .threshold = 0.5f}).empty());
  const auto settings =
      ps::compression::Parse({.type = "1bit", .threshold = 2.0f, .pull_type = "fp16"});
  CHECK(settings.push == Codec::k1Bit);
  CHECK(settings.pull == Codec::kFp16);
  CHECK(settings.threshold == 2.0f);
}

TEST_CASE("local kvstore: SetGradientCompression is refused, as in MXNet",
          "[compression][errors]") {
  auto kv = ps::KVStore::Create("local");
  try {
    kv->SetGradientCompression({.type = "2bit", .threshold = 0.5f});
    FAIL("no error");
  } catch (const ps::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("local kvstore: SetGradientCompression: gradient "
                                         "compression is for the distributed stores"));
  }
  // A bad setting is named first.
  try {
    kv->SetGradientCompression({.type = "fp8"});
    FAIL("no error");
  } catch (const ps::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("local kvstore: SetGradientCompression: unknown type"));
  }
  CHECK(kv->Traffic().bytes_sent == 0);
}
