// data/dataset.h: the Dataset interface: a fixed number of (features, label) examples with random access.
//
// Features are float32, already normalised, flattened to feature_count() values (an image is C*H*W).
// Implementations keep their data in memory; get() must be safe to call from several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dpt::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  virtual size_t feature_count() const = 0;
  virtual int num_classes() const = 0;
  virtual std::string name() const = 0;
  // Writes feature_count() floats to `features` and returns the label of example `index` (< size()).
  virtual int32_t get(size_t index, float* features) const = 0;
};

}  // namespace dpt::data
