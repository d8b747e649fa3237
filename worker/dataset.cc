#include "worker/dataset.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <filesystem>

#include "worker/errors.h"
#include "worker/idx_reader.h"

namespace ps::worker {

namespace {

// The file as distributed (gzip), or unpacked under its usual name when only that is there.
std::string DataFile(const std::string& data_dir, const char* name) {
  const std::string packed = data_dir + "/" + name + ".gz";
  const std::string plain = data_dir + "/" + name;
  std::error_code error;
  return !std::filesystem::exists(packed, error) && std::filesystem::exists(plain, error) ? plain
                                                                                          : packed;
}

}  // namespace

std::string ImagesPath(const std::string& data_dir, Split split) {
  return DataFile(data_dir,
                  split == Split::kTrain ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte");
}

std::string LabelsPath(const std::string& data_dir, Split split) {
  return DataFile(data_dir,
                  split == Split::kTrain ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte");
}

Dataset LoadIdxDataset(const std::string& images_path, const std::string& labels_path,
                       int num_classes) {
  const IdxImages images = ReadIdxImages(images_path);
  const IdxLabels labels = ReadIdxLabels(labels_path);
  if (labels.labels.size() != static_cast<std::size_t>(images.count)) {
    throw DataError(labels_path, "mismatched data files: " + labels_path + " holds " +
                                     std::to_string(labels.labels.size()) + " labels but " +
                                     images_path + " holds " + std::to_string(images.count) +
                                     " images");
  }
  Dataset data;
  data.count = images.count;
  data.channels = 1;
  data.height = images.rows;
  data.width = images.cols;
  data.num_classes = num_classes;
  data.images.resize(images.pixels.size());
  constexpr float kScale = 1.0f / 255.0f;
  std::transform(images.pixels.begin(), images.pixels.end(), data.images.begin(),
                 [](std::uint8_t p) { return static_cast<float>(p) * kScale; });
  data.labels.resize(labels.labels.size());
  for (std::size_t i = 0; i < labels.labels.size(); ++i) {
    const int label = labels.labels[i];
    if (label >= num_classes) {
      throw DataError(labels_path, "corrupt file " + labels_path + ": label " +
                                       std::to_string(label) + " of sample " + std::to_string(i) +
                                       " is out of range 0.." + std::to_string(num_classes - 1));
    }
    data.labels[i] = label;
  }
  return data;
}

Dataset LoadFashionMnist(const std::string& data_dir, Split split) {
  return LoadIdxDataset(ImagesPath(data_dir, split), LabelsPath(data_dir, split), 10);
}

Dataset Subset(const Dataset& full, int count) {
  Dataset out;
  out.count = std::clamp(count, 0, full.count);
  out.channels = full.channels;
  out.height = full.height;
  out.width = full.width;
  out.num_classes = full.num_classes;
  const auto n = static_cast<std::size_t>(out.count);
  out.images.assign(full.images.begin(),
                    full.images.begin() + static_cast<std::ptrdiff_t>(n * full.sample_size()));
  out.labels.assign(full.labels.begin(), full.labels.begin() + static_cast<std::ptrdiff_t>(n));
  return out;
}

void GatherBatch(const Dataset& data, std::span<const int> indices, std::span<float> images_out,
                 std::span<std::int32_t> labels_out) {
  const std::size_t sample = data.sample_size();
  assert(images_out.size() >= indices.size() * sample);
  assert(labels_out.size() >= indices.size());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const auto idx = static_cast<std::size_t>(indices[i]);
    assert(idx < static_cast<std::size_t>(data.count));
    std::memcpy(images_out.data() + i * sample, data.images.data() + idx * sample,
                sample * sizeof(float));
    labels_out[i] = data.labels[idx];
  }
}

}  // namespace ps::worker
