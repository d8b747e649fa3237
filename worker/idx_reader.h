#pragma once
// Reader for the IDX format of (Fashion-)MNIST, gzip-compressed or plain (zlib reads both).
//
// Layout: a big-endian magic 0x0000TTDD (TT = 0x08: unsigned byte, DD = number of dimensions),
// DD big-endian uint32 sizes, then the row-major data. Every field is validated; a bad file
// raises DataError with a one-line message naming the file.
#include <cstdint>
#include <string>
#include <vector>

namespace ps::worker {

inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;  // ubyte, 3 dims
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;  // ubyte, 1 dim

struct IdxImages {
  int count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols, row-major
};

struct IdxLabels {
  std::vector<std::uint8_t> labels;
};

// Sanity limits: anything bigger is treated as a corrupt header rather than allocated.
inline constexpr std::uint32_t kIdxMaxCount = 10'000'000;
inline constexpr std::uint32_t kIdxMaxSide = 4096;

IdxImages ReadIdxImages(const std::string& path);
IdxLabels ReadIdxLabels(const std::string& path);

}  // namespace ps::worker
