// models/kernels/cuda/optimizer.cpp: the SGD and AdamW updates on the GPU (kernels: optimizer.cu).
#include "models/kernels/cuda/cuda_kernels.h"

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

void CudaKernels::sgd_update(float* param, const float* grad, float* buf, size_t n, const SgdParams& p) {
  DPT_CHECK(p.momentum == 0.0f || buf, "SGD with momentum needs a momentum buffer");
  DPT_CUDA_CHECK(cuda_launch::sgd_update(param, grad, buf, n, p, stream()));
}

void CudaKernels::adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) {
  DPT_CUDA_CHECK(cuda_launch::adamw_update(param, grad, m, v, n, elementwise::adamw_step(p), stream()));
}

}  // namespace dpt::models
