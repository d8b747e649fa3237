// The IDX loader on small files written by the test (gzip and plain), and on the real dataset.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/worker/test_util.h"
#include "worker/dataset.h"
#include "worker/errors.h"
#include "worker/idx_reader.h"

namespace ps::worker {
namespace {

using Bytes = std::vector<unsigned char>;

void PutBigEndian32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<unsigned char>(v >> shift));
}

Bytes ImagesFile(std::uint32_t magic, std::uint32_t count, std::uint32_t rows, std::uint32_t cols,
                 std::size_t pixel_bytes) {
  Bytes b;
  PutBigEndian32(b, magic);
  PutBigEndian32(b, count);
  PutBigEndian32(b, rows);
  PutBigEndian32(b, cols);
  for (std::size_t i = 0; i < pixel_bytes; ++i) b.push_back(static_cast<unsigned char>(i * 37));
  return b;
}

Bytes LabelsFile(std::uint32_t magic, std::uint32_t count, const Bytes& labels) {
  Bytes b;
  PutBigEndian32(b, magic);
  PutBigEndian32(b, count);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

void WriteGzip(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

void WritePlain(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Asserts that `fn` throws DataError naming `path`, with `fragment` in a one-line message.
template <typename Fn>
void RequireDataError(Fn&& fn, const std::string& path, const std::string& fragment) {
  try {
    fn();
    FAIL("expected a DataError mentioning '" << fragment << "'");
  } catch (const DataError& e) {
    const std::string what = e.what();
    INFO("message: " << what);
    CHECK(e.path() == path);
    CHECK(what.find(path) != std::string::npos);
    CHECK(what.find(fragment) != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
}

TEST_CASE("idx reader loads a good gzip images and labels file", "[idx]") {
  testing::TempDir dir;
  const auto images_path = dir.file("images.gz");
  const auto labels_path = dir.file("labels.gz");
  WriteGzip(images_path, ImagesFile(kIdxImagesMagic, 3, 2, 4, 3 * 2 * 4));
  WriteGzip(labels_path, LabelsFile(kIdxLabelsMagic, 3, {9, 0, 4}));

  const IdxImages images = ReadIdxImages(images_path);
  CHECK(images.count == 3);
  CHECK(images.rows == 2);
  CHECK(images.cols == 4);
  REQUIRE(images.pixels.size() == 24);
  CHECK(images.pixels[1] == 37);
  CHECK(ReadIdxLabels(labels_path).labels == std::vector<std::uint8_t>{9, 0, 4});

  const Dataset data = LoadIdxDataset(images_path, labels_path);
  CHECK(data.count == 3);
  CHECK(data.sample_size() == 8);
  CHECK(data.labels == std::vector<std::int32_t>{9, 0, 4});
  CHECK(data.images[1] == Approx(37.0 / 255.0));
  CHECK(*std::max_element(data.images.begin(), data.images.end()) <= 1.0f);
}

TEST_CASE("idx reader also reads uncompressed files", "[idx]") {
  testing::TempDir dir;
  const auto path = dir.file("labels");
  WritePlain(path, LabelsFile(kIdxLabelsMagic, 2, {1, 2}));
  CHECK(ReadIdxLabels(path).labels == std::vector<std::uint8_t>{1, 2});
}

TEST_CASE("idx reader rejects bad files with one-line errors naming the file", "[idx]") {
  testing::TempDir dir;
  const auto path = dir.file("bad.gz");

  SECTION("missing file") {
    RequireDataError([&] { ReadIdxImages(dir.file("nope.gz")); }, dir.file("nope.gz"),
                     "cannot open data file");
  }
  SECTION("bad magic: a labels file read as images") {
    WriteGzip(path, LabelsFile(kIdxLabelsMagic, 2, {1, 2}));
    RequireDataError([&] { ReadIdxImages(path); }, path, "bad magic number 0x00000801");
  }
  SECTION("bad magic: not an IDX file at all") {
    WriteGzip(path, Bytes{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!'});
    RequireDataError([&] { ReadIdxLabels(path); }, path, "bad magic number");
  }
  SECTION("truncated header") {
    WriteGzip(path, Bytes{0, 0, 8, 3, 0, 0});
    RequireDataError([&] { ReadIdxImages(path); }, path, "corrupt or truncated");
  }
  SECTION("truncated pixel data") {
    WriteGzip(path, ImagesFile(kIdxImagesMagic, 3, 2, 2, 8));  // header says 12 bytes
    RequireDataError([&] { ReadIdxImages(path); }, path, "expected 12 bytes of pixel data, got 8");
  }
  SECTION("truncated label data, uncompressed") {
    WritePlain(path, LabelsFile(kIdxLabelsMagic, 5, {1, 2, 3}));
    RequireDataError([&] { ReadIdxLabels(path); }, path, "expected 5 bytes of label data, got 3");
  }
  SECTION("gzip stream cut short") {
    const auto whole = dir.file("whole.gz");
    WriteGzip(whole, ImagesFile(kIdxImagesMagic, 50, 28, 28, 50 * 28 * 28));
    const auto size = std::filesystem::file_size(whole);
    std::filesystem::copy_file(whole, path);
    std::filesystem::resize_file(path, size / 2);
    RequireDataError([&] { ReadIdxImages(path); }, path, "corrupt or truncated file");
  }
  SECTION("trailing data after the declared size") {
    WriteGzip(path, LabelsFile(kIdxLabelsMagic, 2, {1, 2, 3}));
    RequireDataError([&] { ReadIdxLabels(path); }, path, "trailing data");
  }
  SECTION("zero count") {
    WriteGzip(path, LabelsFile(kIdxLabelsMagic, 0, {}));
    RequireDataError([&] { ReadIdxLabels(path); }, path, "label count 0 is out of range");
  }
  SECTION("absurd dimensions are not allocated") {
    WriteGzip(path, ImagesFile(kIdxImagesMagic, 0xffffffffu, 28, 28, 0));
    RequireDataError([&] { ReadIdxImages(path); }, path, "image count 4294967295 is out of range");
  }
}

TEST_CASE("dataset loader checks that images and labels agree", "[idx]") {
  testing::TempDir dir;
  const auto images_path = dir.file("images.gz");
  const auto labels_path = dir.file("labels.gz");
  WriteGzip(images_path, ImagesFile(kIdxImagesMagic, 3, 2, 2, 12));

  SECTION("count mismatch") {
    WriteGzip(labels_path, LabelsFile(kIdxLabelsMagic, 2, {1, 2}));
    RequireDataError([&] { LoadIdxDataset(images_path, labels_path); }, labels_path,
                     "holds 2 labels but");
  }
  SECTION("label out of range") {
    WriteGzip(labels_path, LabelsFile(kIdxLabelsMagic, 3, {1, 10, 2}));
    RequireDataError([&] { LoadIdxDataset(images_path, labels_path); }, labels_path,
                     "label 10 of sample 1 is out of range 0..9");
  }
  SECTION("a directory without the dataset") {
    RequireDataError([&] { LoadFashionMnist(dir.path(), Split::kTest); },
                     ImagesPath(dir.path(), Split::kTest), "cannot open data file");
    CHECK(ImagesPath(dir.path(), Split::kTest) == dir.file("t10k-images-idx3-ubyte.gz"));
  }
  SECTION("unpacked files under their usual names") {
    WritePlain(dir.file("t10k-images-idx3-ubyte"), ImagesFile(kIdxImagesMagic, 3, 2, 2, 12));
    WritePlain(dir.file("t10k-labels-idx1-ubyte"), LabelsFile(kIdxLabelsMagic, 3, {1, 2, 3}));
    CHECK(ImagesPath(dir.path(), Split::kTest) == dir.file("t10k-images-idx3-ubyte"));
    const Dataset data = LoadFashionMnist(dir.path(), Split::kTest);
    CHECK(data.count == 3);
    CHECK(data.labels == std::vector<std::int32_t>{1, 2, 3});
    // Both there: the packed one, as shipped.
    WriteGzip(dir.file("t10k-images-idx3-ubyte.gz"), ImagesFile(kIdxImagesMagic, 3, 2, 2, 12));
    CHECK(ImagesPath(dir.path(), Split::kTest) == dir.file("t10k-images-idx3-ubyte.gz"));
  }
}

TEST_CASE("the real Fashion-MNIST dataset loads with the expected shape", "[idx][dataset]") {
  const std::string dir = kDefaultDataDir;
  INFO("needs Debian's dataset-fashion-mnist package in " << dir);
  REQUIRE(std::filesystem::exists(ImagesPath(dir, Split::kTrain)));
  for (const auto& [split, count] : {std::pair{Split::kTrain, 60000}, {Split::kTest, 10000}}) {
    const Dataset data = LoadFashionMnist(dir, split);
    CHECK(data.count == count);
    CHECK(data.channels == 1);
    CHECK(data.height == 28);
    CHECK(data.width == 28);
    CHECK(data.images.size() == static_cast<std::size_t>(count) * 784);
    REQUIRE(data.labels.size() == static_cast<std::size_t>(count));
    std::array<int, 10> per_class{};
    int out_of_range = 0;
    for (const std::int32_t label : data.labels) {
      if (label < 0 || label > 9) {
        ++out_of_range;
      } else {
        ++per_class[static_cast<std::size_t>(label)];
      }
    }
    CHECK(out_of_range == 0);
    for (const int n : per_class) CHECK(n == count / 10);  // Fashion-MNIST is balanced
    const auto [lo, hi] = std::minmax_element(data.images.begin(), data.images.end());
    CHECK(*lo == 0.0f);
    CHECK(*hi == 1.0f);
  }
}

}  // namespace
}  // namespace ps::worker
