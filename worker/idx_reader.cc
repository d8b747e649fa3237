#include "worker/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>

#include "worker/errors.h"

namespace ps::worker {
namespace {

// Owns a gzFile; closes it on scope exit.
struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

GzFile Open(const std::string& path) {
  errno = 0;
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) {
    const int err = errno;
    throw DataError(path, "cannot open data file " + path + ": " +
                              (err != 0 ? std::strerror(err) : "out of memory"));
  }
  return file;
}

// Reads exactly `bytes` bytes or throws naming what was expected.
void ReadExactly(gzFile file, const std::string& path, void* dst, std::size_t bytes,
                 const char* what) {
  auto* out = static_cast<unsigned char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    const std::size_t want = std::min<std::size_t>(bytes - done, INT_MAX / 2);
    const int got = gzread(file, out + done, static_cast<unsigned>(want));
    if (got <= 0) {
      // got < 0: zlib failed (bad gzip stream, or one cut short); got == 0: plain end of file.
      std::string detail;
      if (got < 0) {
        int code = 0;
        detail = std::string(" (zlib: ") + gzerror(file, &code) + ")";
      }
      throw DataError(path, "corrupt or truncated file " + path + ": expected " +
                                std::to_string(bytes) + " bytes of " + what + ", got " +
                                std::to_string(done) + detail);
    }
    done += static_cast<std::size_t>(got);
  }
}

std::uint32_t ReadBigEndian32(gzFile file, const std::string& path, const char* what) {
  unsigned char b[4];
  ReadExactly(file, path, b, sizeof b, what);
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         std::uint32_t{b[3]};
}

std::string Hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

void CheckMagic(std::uint32_t got, std::uint32_t want, const std::string& path, const char* kind) {
  if (got != want) {
    throw DataError(path, "corrupt file " + path + ": bad magic number " + Hex(got) +
                              " (expected " + Hex(want) + ", an IDX " + kind + " file)");
  }
}

void CheckDim(std::uint32_t value, std::uint32_t max, const std::string& path, const char* what) {
  if (value == 0 || value > max) {
    throw DataError(path, "corrupt file " + path + ": " + what + " " + std::to_string(value) +
                              " is out of range 1.." + std::to_string(max));
  }
}

// The data must end where the header says; extra bytes mean a mismatched or damaged file.
void CheckAtEnd(gzFile file, const std::string& path) {
  unsigned char extra;
  const int got = gzread(file, &extra, 1);
  if (got < 0) {
    int code = 0;
    throw DataError(path, "corrupt file " + path + ": " + gzerror(file, &code));
  }
  if (got > 0) {
    throw DataError(path, "corrupt file " + path +
                              ": trailing data after the size the header "
                              "declares");
  }
}

}  // namespace

IdxImages ReadIdxImages(const std::string& path) {
  GzFile file = Open(path);
  CheckMagic(ReadBigEndian32(file.get(), path, "header"), kIdxImagesMagic, path, "images");
  const std::uint32_t count = ReadBigEndian32(file.get(), path, "header");
  const std::uint32_t rows = ReadBigEndian32(file.get(), path, "header");
  const std::uint32_t cols = ReadBigEndian32(file.get(), path, "header");
  CheckDim(count, kIdxMaxCount, path, "image count");
  CheckDim(rows, kIdxMaxSide, path, "row count");
  CheckDim(cols, kIdxMaxSide, path, "column count");
  IdxImages images;
  images.count = static_cast<int>(count);
  images.rows = static_cast<int>(rows);
  images.cols = static_cast<int>(cols);
  images.pixels.resize(std::size_t{count} * rows * cols);
  ReadExactly(file.get(), path, images.pixels.data(), images.pixels.size(), "pixel data");
  CheckAtEnd(file.get(), path);
  return images;
}

IdxLabels ReadIdxLabels(const std::string& path) {
  GzFile file = Open(path);
  CheckMagic(ReadBigEndian32(file.get(), path, "header"), kIdxLabelsMagic, path, "labels");
  const std::uint32_t count = ReadBigEndian32(file.get(), path, "header");
  CheckDim(count, kIdxMaxCount, path, "label count");
  IdxLabels labels;
  labels.labels.resize(count);
  ReadExactly(file.get(), path, labels.labels.data(), labels.labels.size(), "label data");
  CheckAtEnd(file.get(), path);
  return labels;
}

}  // namespace ps::worker
