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

void CudaKernels::adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                              const AdamWParams& p, const uint64_t* decay_edges, size_t n_edges,
                              const double* grad_ss, double max_norm) {
  DPT_CHECK(n_edges % 2 == 0 && (decay_edges || n_edges == 0), "adamw_fused: {} decay range edges", n_edges);
  const elementwise::AdamWSteps st = elementwise::adamw_steps(p);
  DPT_CUDA_CHECK(cuda_launch::adamw_fused(param, param16, grad, m, v, n, st.with_decay, st.without_decay, nullptr,
                                          decay_edges, n_edges, grad_ss, max_norm, stream()));
}

void CudaKernels::adamw_fused_staged(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                                     const elementwise::AdamWSteps* steps, const uint64_t* decay_edges, size_t n_edges,
                                     const double* grad_ss, double max_norm) {
  DPT_CHECK(n_edges % 2 == 0 && (decay_edges || n_edges == 0), "adamw_fused: {} decay range edges", n_edges);
  DPT_CHECK(steps != nullptr, "adamw_fused_staged: no staged constants");
  DPT_CUDA_CHECK(cuda_launch::adamw_fused(param, param16, grad, m, v, n, {}, {}, steps, decay_edges, n_edges, grad_ss,
                                          max_norm, stream()));
}

}  // namespace dpt::models
