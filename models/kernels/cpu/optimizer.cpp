// models/kernels/cpu/optimizer.cpp: the SGD and AdamW updates on the CPU, through elementwise.h's per-element
// arithmetic (the one the CUDA kernels use).
#include "models/kernels/cpu/cpu_kernels.h"

#include <algorithm>

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
  // Run by run between the decay ranges' edges, so that each run's loop has one set of constants and vectorises
  // (the same per-element arithmetic: the same bits as one element at a time).
  for (size_t i0 = 0; i0 < n;) {
    size_t end = n;
    bool decay = true;
    if (decay_edges) {
      const size_t after = elementwise::decay_edge_after(decay_edges, n_edges, i0);
      if (after < n_edges) end = std::min<size_t>(n, decay_edges[after]);
      decay = (after & 1u) != 0;
    }
    const elementwise::AdamWStep& s = decay ? st.with_decay : st.without_decay;
    for (size_t i = i0; i < end; ++i) elementwise::adamw(param[i], grad[i] * f, m[i], v[i], s);
    if (param16)
      for (size_t i = i0; i < end; ++i) param16[i] = to_bfloat16(param[i]);
    i0 = end;
  }
}

}  // namespace dpt::models
