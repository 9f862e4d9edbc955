// data/augmented.cpp: AugmentedDataset: ImageClassDataset pixels through a Transform.
#include "data/augmented.h"

#include "core/check.h"

namespace dpt::data {

AugmentedDataset::AugmentedDataset(std::shared_ptr<const ImageClassDataset> base, TransformOptions transform)
    : base_(std::move(base)), transform_(std::move(transform)) {
  DPT_CHECK(base_ != nullptr);
  if (transform_.options().channels != 1) {
    DPT_THROW(ConfigError, "{}: grey images, so the transform needs channels = 1, not {}", base_->name(),
              transform_.options().channels);
  }
  shape_ = transform_.output_shape(static_cast<int64_t>(base_->height()), static_cast<int64_t>(base_->width()));
  feature_count_ = static_cast<size_t>(shape_[0] * shape_[1] * shape_[2]);
}

TransformOptions AugmentedDataset::crop_flip(const ImageClassDataset& base, int64_t padding, uint64_t seed) {
  TransformOptions t;
  t.mode = TransformMode::crop_flip;
  t.size = 0;  // the base's own size
  t.padding = padding;
  t.channels = 1;
  t.mean = {base.mean()};
  t.std = {base.stddev()};
  t.seed = seed;
  return t;
}

std::string AugmentedDataset::name() const {
  return fmt::format("{}+{}", base_->name(), to_string(transform_.options().mode));
}

int32_t AugmentedDataset::get(size_t index, float* features) const {
  DPT_CHECK(index < size(), "index {} past the end of {} ({} examples)", index, name(), size());
  const ImageView view{base_->image(index), static_cast<int64_t>(base_->height()), static_cast<int64_t>(base_->width()), 1};
  transform_.apply(view, epoch_.load(std::memory_order_relaxed), index, features);
  return base_->label(index);
}

}  // namespace dpt::data
