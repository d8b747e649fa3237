#pragma once
// An in-memory image classification dataset (Fashion-MNIST), pixels scaled to [0, 1].
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ps::worker {

struct Dataset {
  int count = 0;
  int channels = 1;
  int height = 0;
  int width = 0;
  int num_classes = 10;
  std::vector<float> images;         // count x channels x height x width, values in [0, 1]
  std::vector<std::int32_t> labels;  // count, each in [0, num_classes)

  std::size_t sample_size() const { return static_cast<std::size_t>(channels) * height * width; }
};

enum class Split { kTrain, kTest };

inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// File paths inside a Fashion-MNIST directory: train-images-idx3-ubyte.gz etc., as Debian's
// dataset-fashion-mnist ships them, or the same names without .gz (unpacked) when only those
// are there.
std::string ImagesPath(const std::string& data_dir, Split split);
std::string LabelsPath(const std::string& data_dir, Split split);

// Loads an images/labels pair of IDX files and checks they agree (count) and that every label
// is below num_classes. Throws DataError naming the bad file.
Dataset LoadIdxDataset(const std::string& images_path, const std::string& labels_path,
                       int num_classes = 10);

// Loads the train (60000) or test (10000) split from data_dir.
Dataset LoadFashionMnist(const std::string& data_dir, Split split);

// The first `count` samples of `full` (count is clamped to full.count): for quick tests.
Dataset Subset(const Dataset& full, int count);

// Copies the samples named by `indices` into a contiguous batch (row-major, sample by sample).
// images_out holds indices.size() * sample_size() floats, labels_out indices.size() labels.
void GatherBatch(const Dataset& data, std::span<const int> indices, std::span<float> images_out,
                 std::span<std::int32_t> labels_out);

}  // namespace ps::worker
