// tests/unit/models/model_testing.h: helpers shared by the model tests.
#pragma once

#include <random>
#include <vector>

#include "core/tensor.h"
#include "models/module.h"

namespace dpt::test {

// A host float tensor of `shape`, uniform in [-scale, scale) from `rng`.
inline Tensor random_tensor(std::vector<int64_t> shape, std::mt19937_64& rng, float scale = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape));
  for (size_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = models::uniform(rng, -scale, scale);
  return t;
}

}  // namespace dpt::test
