// data/augmented.h: AugmentedDataset: an in-memory image data set (ImageClassDataset: Fashion-MNIST, MNIST)
// read through a Transform, so small-image training can use the same pad + random crop + flip (or any other
// transform) as the image folders, from one implementation (data/transforms.h).
#pragma once

#include <atomic>
#include <memory>

#include "data/idx.h"
#include "data/transforms.h"

namespace dpt::data {

class AugmentedDataset : public Dataset {
 public:
  // `transform.channels` must be 1 (the base images are grey). Throws ConfigError otherwise.
  AugmentedDataset(std::shared_ptr<const ImageClassDataset> base, TransformOptions transform);

  // torchvision's RandomCrop(H, padding) + RandomHorizontalFlip for `base`: output size = the base's own,
  // normalised with the base's mean and std.
  static TransformOptions crop_flip(const ImageClassDataset& base, int64_t padding, uint64_t seed);

  size_t size() const override { return base_->size(); }
  size_t feature_count() const override { return feature_count_; }
  int num_classes() const override { return base_->num_classes(); }
  std::string name() const override;
  std::vector<int64_t> sample_shape() const override { return shape_; }
  void set_epoch(int64_t epoch) override { epoch_.store(epoch, std::memory_order_relaxed); }
  int32_t get(size_t index, float* features) const override;
  void prefetch(size_t index) const override { base_->prefetch(index); }

  const ImageClassDataset& base() const { return *base_; }
  const Transform& transform() const { return transform_; }

 private:
  std::shared_ptr<const ImageClassDataset> base_;
  Transform transform_;
  std::vector<int64_t> shape_;
  size_t feature_count_ = 0;
  std::atomic<int64_t> epoch_{0};
};

}  // namespace dpt::data
