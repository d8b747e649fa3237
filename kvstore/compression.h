#pragma once
// Gradient compression (KVStore::SetGradientCompression): the settings, and the codecs' CPU
// loops. The per-element rules and the wire layouts are in compression_codec.h; the CUDA
// kernels that encode a GPU tensor in place are in compression_kernels.cuh.
//
// Every encoder works with error feedback: it encodes acc = (what is kept) + (what is new) and
// keeps acc - decoded(code) for the next call, so nothing is lost, only delayed.
//   Push (worker): acc = residual + gradient; the residual keeps the rest.
//   Pull (server): acc = value - mirror, where the mirror is what the worker holds; the mirror
//   moves by the decoded change (ApplyDelta), exactly as the worker's copy does on arrival.
//
// Threads: the functions are pure; the caller owns the arrays.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvstore/compression_codec.h"
#include "ps/kvstore.h"

namespace ps::compression {

// "none", "2bit", "1bit", "fp16".
const char* CodecName(Codec codec);

// A validated GradientCompression.
struct Settings {
  Codec push = Codec::kNone;
  Codec pull = Codec::kNone;
  float threshold = 0.5f;  // 2bit: the magnitude sent
  friend bool operator==(const Settings&, const Settings&) = default;
};

// Validates `config`; throws ps::Error naming the field, the value and the accepted ones.
Settings Parse(const GradientCompression& config);
// The call as the workers state it to each other ("type=2bit threshold=0.5 pull_type=none").
std::string Describe(const GradientCompression& config);

// The push compression alone, as its residuals depend on it ("type=2bit threshold=0.5",
// "type=fp16").
std::string DescribePush(const Settings& settings);

// Bytes of n float32 values encoded with `codec` (n * 4 for kNone).
std::size_t EncodedBytes(Codec codec, std::size_t n);

// Push: encodes n gradients with the residual into out (EncodedBytes bytes, every byte
// written, the padding zero); the residual keeps what was not sent.
void EncodePush(Codec codec, float threshold, const float* grad, float* residual, std::size_t n,
                std::byte* out);
// Pull: encodes the change value - mirror into out, and moves the mirror by what it carries
// (the mirror then equals what the receiver holds after ApplyDelta).
void EncodeDelta(Codec codec, float threshold, const float* value, float* mirror, std::size_t n,
                 std::byte* out);
// out[i] = decoded value i (a push, on the server).
void Decode(Codec codec, float threshold, const std::byte* in, std::size_t n, float* out);
// target[i] += decoded value i (a pulled change, on the worker and the server's mirror alike).
void ApplyDelta(Codec codec, float threshold, const std::byte* in, std::size_t n, float* target);

}  // namespace ps::compression
