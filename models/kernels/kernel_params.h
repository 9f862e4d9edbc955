// models/kernels/kernel_params.h: the optimizer hyper-parameters the update kernels take, by value. Plain
// structs with no includes, so CUDA sources (compiled by nvcc) share them with the C++ side.
#pragma once

#include <cstdint>

namespace dpt::models {

struct SgdParams {
  float lr = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // momentum buffer is initialised to the gradient on the first step (as PyTorch)
};

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  int64_t step = 1;  // 1-based, for bias correction
};

}  // namespace dpt::models
