// data/idx.h: the IDX file format (MNIST, Fashion-MNIST) and an in-memory image classification data set.
//
// read_idx() reads one IDX file, gzip-compressed or plain (zlib reads both), and validates it completely:
// magic, type code (only 0x08, unsigned bytes), dimension count (1..4) and a data length of exactly the
// product of the dimensions. Every failure is a dpt::IoError whose message starts with the file's path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace dpt::data {

inline constexpr uint8_t kIdxUbyte = 0x08;  // the only IDX type code we read

// One IDX file: its type code, its dimensions (outermost first) and its elements, row-major.
struct IdxArray {
  uint8_t type_code = kIdxUbyte;
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

IdxArray read_idx(const std::string& path);

// Fashion-MNIST as Debian's dataset-fashion-mnist installs it, and its training-set pixel statistics
// (of x/255 over all 60000 x 28 x 28 training pixels; checked against the real data in the unit tests).
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// Grey-scale images (N, H, W) of uint8 kept in memory with one label each; get() returns the pixels
// normalised as (x/255 - mean)/stddev, flattened to H*W floats. Immutable after construction, so get() is
// thread safe.
class ImageClassDataset : public Dataset {
 public:
  // `images` holds n*height*width bytes, `labels` n bytes, each < num_classes; stddev > 0.
  ImageClassDataset(std::string name, size_t height, size_t width, std::vector<uint8_t> images,
                    std::vector<uint8_t> labels, int num_classes, float mean, float stddev);

  size_t size() const override { return labels_.size(); }
  size_t feature_count() const override { return height_ * width_; }
  int num_classes() const override { return num_classes_; }
  std::string name() const override { return name_; }
  std::vector<int64_t> sample_shape() const override {
    return {1, static_cast<int64_t>(height_), static_cast<int64_t>(width_)};
  }
  int32_t get(size_t index, float* features) const override;
  void prefetch(size_t index) const override;  // the image's cache lines (a shuffled epoch's reads miss them)

  size_t height() const { return height_; }
  size_t width() const { return width_; }
  float mean() const { return mean_; }
  float stddev() const { return stddev_; }
  const uint8_t* image(size_t index) const;  // the raw H*W pixels of example `index`
  int32_t label(size_t index) const;

 private:
  std::string name_;
  size_t height_ = 0;
  size_t width_ = 0;
  std::vector<uint8_t> images_;
  std::vector<uint8_t> labels_;
  int num_classes_ = 0;
  float mean_ = 0.0f;
  float stddev_ = 1.0f;
  float normalised_[256] = {};  // (v/255 - mean)/stddev for every byte value v
};

// Reads an images file (N, H, W) and a labels file (N) and checks that they belong together. The class
// count is the largest label + 1 over the whole labels file (so `limit` does not change it). limit > 0
// keeps only the first `limit` examples.
std::unique_ptr<ImageClassDataset> load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                                                    std::string name, float mean, float stddev, size_t limit = 0);

// Fashion-MNIST's training (60000) or test (10000) split from `dir`, normalised with the training-set
// statistics, 10 classes. A missing directory or file says how to install the data set.
std::unique_ptr<ImageClassDataset> load_fashion_mnist(const std::string& dir, bool train, size_t limit = 0);

}  // namespace dpt::data
