// The gradient compression kernels (kvstore/compression_kernels.cuh), compiled for the host
// under cuda_host_emulation.h (PS_CUDA_HOST_EMULATION is defined for this target): the very
// kernel bodies a GPU runs, checked on every machine against the hand-worked vectors and, bit
// for bit, against the plain reference implementation, over several rounds with their
// residuals. test_compression_gpu.cc runs the same checks on a GPU when there is one.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

// First: it defines what the kernels' CUDA keywords mean on the host.
#include "tests/worker/cuda_host_emulation.h"

#include "kvstore/compression_kernels.cuh"
#include "tests/kvstore/compression_reference.h"
#include "tests/kvstore/compression_vectors.h"

namespace {

namespace kernels = ps::compression::kernels;
namespace reference = ps::test::reference;
using ps::compression::Codec;
using ps::test::Bits;
using ps::test::CodecOf;
using ps::test::ExpectedEncodedBytes;

// The kernels' launch as compression_cuda.cu makes it, on host memory.
std::vector<std::uint8_t> Encode(Codec codec, float threshold, const std::vector<float>& grad,
                                 std::vector<float>& residual) {
  std::vector<std::uint8_t> out(ExpectedEncodedBytes(codec, grad.size()), 0xAA);
  std::vector<double> partials(kernels::ScaleGroups(grad.size()), -1.0);
  REQUIRE(kernels::Encode(codec, threshold, grad.data(), residual.data(), grad.size(), out.data(),
                          partials.data(), nullptr) == cudaSuccess);
  return out;
}

}  // namespace

TEST_CASE("compression kernels (host emulation): the hand-worked vectors, round by round",
          "[compression][cuda_emulation]") {
  for (const ps::test::HandVector& vector : ps::test::HandVectors()) {
    INFO(vector.type);
    std::vector<float> residual(vector.rounds.front().grad.size(), 0.0f);
    for (std::size_t r = 0; r < vector.rounds.size(); ++r) {
      INFO("round " << r + 1);
      const ps::test::VectorRound& round = vector.rounds[r];
      CHECK(Encode(CodecOf(vector.type), vector.threshold, round.grad, residual) == round.codes);
      CHECK(residual == round.residual);
    }
  }
}

TEST_CASE("compression kernels (host emulation): bit for bit the reference, several rounds",
          "[compression][cuda_emulation]") {
  std::mt19937 random(99);
  std::uniform_real_distribution<float> plain(-2.0f, 2.0f);
  std::uniform_int_distribution<int> kind(0, 7);
  for (const char* type : {"2bit", "1bit", "fp16"}) {
    // Lengths around words, blocks of threads and the 1bit scale's groups (1024).
    for (const std::size_t n : {1u, 15u, 16u, 17u, 33u, 255u, 1023u, 1025u, 3000u}) {
      INFO(type << " n " << n);
      std::vector<float> residual(n, 0.0f), ref_residual(n, 0.0f);
      for (int round = 0; round < 3; ++round) {
        std::vector<float> grad(n);
        for (float& g : grad) {
          const int k = kind(random);
          g = k == 0   ? 0.5f
              : k == 1 ? -0.5f
              : k == 2 ? -0.0f
              : k == 3 ? plain(random) * 4e4f
                       : plain(random);
        }
        const auto codes = Encode(CodecOf(type), 0.5f, grad, residual);
        REQUIRE(codes == reference::EncodePush(type, 0.5f, grad, ref_residual));
        REQUIRE(Bits(residual) == Bits(ref_residual));
      }
    }
  }
}
