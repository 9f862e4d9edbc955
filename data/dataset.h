// data/dataset.h: the Dataset interface: a fixed number of (features, label) examples with random access.
//
// Features are float32, already normalised, flattened to feature_count() values (an image is C*H*W, in
// that order: channels outermost, as PyTorch's NCHW). sample_shape() says how they fold: {C, H, W} for an
// image, {F} for a plain vector. get() must be safe to call from several threads at once.
// Random training transforms (crops, flips) are drawn from (seed, epoch, index), so every rank and every run
// sees the same augmented example: set_epoch(e) is called before an epoch's batches are read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dpt::data {

// The label get() returns for an example it leaves out (an evaluation split's image that could not be decoded, under
// data.skip_bad_images): its features are zeros, and the loss and accuracy count it nowhere (it is the loss
// kernels' models::kIgnoreLabel, a masked target).
inline constexpr int32_t kLeftOut = -1;

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  virtual size_t feature_count() const = 0;
  virtual int num_classes() const = 0;
  virtual std::string name() const = 0;
  // How the features of one example fold: {C, H, W} for images; the default is the flat {feature_count()}.
  virtual std::vector<int64_t> sample_shape() const { return {static_cast<int64_t>(feature_count())}; }
  // The epoch whose random transforms get() applies (no effect on data sets without random transforms).
  // Called between epochs, never while get() runs.
  virtual void set_epoch(int64_t epoch) {}
  // Writes feature_count() floats to `features` and returns the label of example `index` (< size()), or kLeftOut.
  virtual int32_t get(size_t index, float* features) const = 0;
  // A hint that get(index) comes soon: a data set held in memory starts bringing the example's bytes into the
  // cache, so that get() does not wait for them (the Loader gives it two rows ahead). Reads nothing, changes
  // nothing, never throws; an index past the end is ignored. The default does nothing.
  virtual void prefetch(size_t index) const {}
};

}  // namespace dpt::data
