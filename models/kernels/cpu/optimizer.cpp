// models/kernels/cpu/optimizer.cpp: the SGD and AdamW updates on the CPU, through elementwise.h's per-element
// arithmetic (the one the CUDA kernels use).
#include "models/kernels/cpu/cpu_kernels.h"

#include "models/kernels/elementwise.h"

namespace dpt::models {

void CpuKernels::sgd_update(float* param, const float* grad, float* buf, size_t n, const SgdParams& p) {
  for (size_t i = 0; i < n; ++i) elementwise::sgd(param[i], grad[i], buf ? buf + i : nullptr, p);
}

void CpuKernels::adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) {
  const elementwise::AdamWStep s = elementwise::adamw_step(p);
  for (size_t i = 0; i < n; ++i) elementwise::adamw(param[i], grad[i], m[i], v[i], s);
}

void CpuKernels::adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                             const AdamWParams& p, const uint64_t* decay_edges, size_t n_edges,
                             const double* grad_ss, double max_norm) {
  DPT_CHECK(n_edges % 2 == 0 && (decay_edges || n_edges == 0), "adamw_fused: {} decay range edges", n_edges);
  const elementwise::AdamWSteps st = elementwise::adamw_steps(p);
  const float f = elementwise::clip_factor(grad_ss, max_norm);
  for (size_t i = 0; i < n; ++i) {
    const bool decay = !decay_edges || elementwise::in_decay_range(decay_edges, n_edges, i);
    elementwise::adamw(param[i], grad[i] * f, m[i], v[i], decay ? st.with_decay : st.without_decay);
    if (param16) param16[i] = to_bfloat16(param[i]);
  }
}

}  // namespace dpt::models
