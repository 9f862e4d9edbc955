// data/synthetic.h: a deterministic, learnable, in-memory-free data set for fast tests and benchmarks.
//
// Example i's features are standard normal values drawn from a counter-based generator keyed by
// (seed, i, feature), so get(i) is a pure function: the same on every rank, every thread and every run.
// Its label is the argmax of a fixed random linear map (drawn from the seed) of its features, so a linear
// model can reach 100% accuracy and a small MLP learns it in a few hundred steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace dpt::data {

class SyntheticDataset : public Dataset {
 public:
  // features >= 1 and classes >= 1, else ConfigError. n may be 0. `shape` folds the features (e.g. {3, 32, 32}
  // for images; its product must be `features`); empty: the flat {features}.
  SyntheticDataset(size_t n, size_t features, int classes, uint64_t seed, std::vector<int64_t> shape = {});

  size_t size() const override { return n_; }
  size_t feature_count() const override { return features_; }
  int num_classes() const override { return classes_; }
  std::string name() const override { return "synthetic"; }
  std::vector<int64_t> sample_shape() const override { return shape_; }
  int32_t get(size_t index, float* features) const override;

 private:
  size_t n_;
  size_t features_;
  int classes_;
  uint64_t seed_;
  std::vector<float> weights_;
  std::vector<int64_t> shape_;  // [classes, features], the labelling map
};

}  // namespace dpt::data
