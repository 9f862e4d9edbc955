// data/subset.h: Subset: a contiguous range [begin, begin + size) of another dataset, as a Dataset. Used to
// split one synthetic dataset into disjoint train and test parts that share its labelling function.
#pragma once

#include <memory>

#include "core/check.h"
#include "data/dataset.h"

namespace dpt::data {

class Subset final : public Dataset {
 public:
  Subset(std::shared_ptr<const Dataset> base, size_t begin, size_t size)
      : base_(std::move(base)), begin_(begin), size_(size) {
    DPT_CHECK_LE(begin_ + size_, base_->size());
  }
  size_t size() const override { return size_; }
  size_t feature_count() const override { return base_->feature_count(); }
  int num_classes() const override { return base_->num_classes(); }
  std::string name() const override { return base_->name(); }
  int32_t get(size_t index, float* features) const override {
    DPT_CHECK_LT(index, size_);
    return base_->get(begin_ + index, features);
  }

 private:
  std::shared_ptr<const Dataset> base_;
  size_t begin_, size_;
};

}  // namespace dpt::data
