// data/synthetic.cpp: SyntheticDataset: counter-based normal features, labels from a fixed linear map.
#include "data/synthetic.h"

#include <cmath>
#include <numbers>

#include "core/check.h"
#include "data/random.h"

namespace dpt::data {
namespace {

constexpr uint64_t kWeightStream = 0xD1B54A32D192ED03ull;  // keeps the weights' stream apart from the features'

// A standard normal value that depends only on (key, counter): Box-Muller from two hashed uniforms.
float normal_at(uint64_t key, uint64_t counter) {
  const uint64_t a = mix64(key ^ mix64(2 * counter));
  const uint64_t b = mix64(key ^ mix64(2 * counter + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log is finite
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace

SyntheticDataset::SyntheticDataset(size_t n, size_t features, int classes, uint64_t seed, std::vector<int64_t> shape)
    : n_(n), features_(features), classes_(classes), seed_(seed), shape_(std::move(shape)) {
  if (shape_.empty()) shape_ = {static_cast<int64_t>(features_)};
  int64_t product = 1;
  for (int64_t d : shape_) product *= d;
  if (product != static_cast<int64_t>(features_))
    DPT_THROW(ConfigError, "synthetic data: shape [{}] does not hold {} features", fmt::join(shape_, ", "), features_);
  if (features == 0) DPT_THROW(ConfigError, "synthetic data set: features must be >= 1, got 0");
  if (classes < 1) DPT_THROW(ConfigError, "synthetic data set: classes must be >= 1, got {}", classes);
  weights_.resize(static_cast<size_t>(classes) * features);
  const uint64_t key = mix64(seed ^ kWeightStream);
  for (size_t k = 0; k < weights_.size(); ++k) weights_[k] = normal_at(key, k);
}

int32_t SyntheticDataset::get(size_t index, float* features) const {
  DPT_CHECK(index < n_, "index {} past the end of the synthetic data set ({} examples)", index, n_);
  const uint64_t key = mix64(seed_ ^ mix64(index));
  for (size_t j = 0; j < features_; ++j) features[j] = normal_at(key, j);
  int32_t best = 0;
  double best_score = 0.0;
  for (int c = 0; c < classes_; ++c) {
    const float* w = weights_.data() + static_cast<size_t>(c) * features_;
    double score = 0.0;
    for (size_t j = 0; j < features_; ++j) score += static_cast<double>(w[j]) * features[j];
    if (c == 0 || score > best_score) {
      best = c;
      best_score = score;
    }
  }
  return best;
}

}  // namespace dpt::data
