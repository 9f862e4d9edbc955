// data/subset.h: Subset: evenly strided examples of another dataset (by default a contiguous range), or a number of
// them spread evenly over it, as a Dataset. Used to
// split one synthetic dataset into disjoint train and test parts that share its labelling function, and, spread, for
// data.train_limit / test_limit on image folders (whose examples are sorted by class: a prefix would hold
// only the first classes).
#pragma once

#include <memory>

#include "core/check.h"
#include "data/dataset.h"

namespace dpt::data {

class Subset final : public Dataset {
 public:
  // Examples begin, begin + stride, ..., size of them.
  Subset(std::shared_ptr<Dataset> base, size_t begin, size_t size, size_t stride = 1)
      : base_(std::move(base)), begin_(begin), size_(size), stride_(stride) {
    DPT_CHECK_GE(stride_, 1u);
    if (size_ > 0) DPT_CHECK_LT(begin_ + (size_ - 1) * stride_, base_->size());
  }
  // `size` examples spread evenly over the whole of `base` (size <= base->size()): example i is base's
  // floor(i * base->size() / size), so a sorted base (an image folder's classes) keeps every part's share where an
  // integer stride of base->size() / size would take a prefix (1000 examples, size 600: stride 1, the first 600).
  struct Spread {};
  Subset(std::shared_ptr<Dataset> base, size_t size, Spread) : base_(std::move(base)), begin_(0), size_(size) {
    DPT_CHECK_LE(size_, base_->size());
    spread_of_ = base_->size();
  }
  size_t size() const override { return size_; }
  size_t feature_count() const override { return base_->feature_count(); }
  int num_classes() const override { return base_->num_classes(); }
  std::string name() const override { return base_->name(); }
  std::vector<int64_t> sample_shape() const override { return base_->sample_shape(); }
  void set_epoch(int64_t epoch) override { base_->set_epoch(epoch); }
  int32_t get(size_t index, float* features) const override {
    DPT_CHECK_LT(index, size_);
    return base_->get(base_index(index), features);
  }
  void prefetch(size_t index) const override {
    if (index < size_) base_->prefetch(base_index(index));
  }
  // The base's example that example `index` is.
  size_t base_index(size_t index) const {
    if (spread_of_ == 0) return begin_ + index * stride_;
    __extension__ using Wide = unsigned __int128;  // index * base size may pass 2^64; __extension__: no -Wpedantic
    return static_cast<size_t>(static_cast<Wide>(index) * spread_of_ / size_);
  }

 private:
  std::shared_ptr<Dataset> base_;
  size_t begin_, size_, stride_ = 1;
  size_t spread_of_ = 0;  // Spread: the base's size; 0: begin + index * stride
};

}  // namespace dpt::data
