// models/kernels/cpu/optimizer.cpp: the SGD and AdamW updates on the CPU, through elementwise.h's per-element
// arithmetic (the one the CUDA kernels use).
#include "models/kernels/cpu/cpu_kernels.h"

#include <algorithm>

#include "core/check.h"
#include "models/kernels/elementwise.h"

namespace dpt::models {

namespace {

// SGD's loop with its options fixed at compile time and its constants in a local copy (a write through param could
// otherwise alias the caller's SgdParams, reloading them every element): the loop vectorises, each element the same
// elementwise::sgd. It was a fifth of the Fashion-MNIST MLP's CPU run, one element at a time.
template <bool kMomentum, bool kFirst, bool kNesterov>
void sgd_loop(float* param, const float* grad, float* buf, size_t n, SgdParams q) {
  q.first_step = kFirst;
  q.nesterov = kNesterov;
  if constexpr (!kMomentum) {
    q.momentum = 0.0f;
    for (size_t i = 0; i < n; ++i) elementwise::sgd(param[i], grad[i], nullptr, q);
  } else {
    for (size_t i = 0; i < n; ++i) elementwise::sgd(param[i], grad[i], buf + i, q);
  }
}

}  // namespace

void CpuKernels::sgd_update(float* param, const float* grad, float* buf, size_t n, const SgdParams& p) {
  if (p.momentum == 0.0f) return sgd_loop<false, false, false>(param, grad, buf, n, p);
  DPT_CHECK(buf != nullptr, "sgd_update: momentum {} without a momentum buffer", p.momentum);
  if (p.first_step)
    return p.nesterov ? sgd_loop<true, true, true>(param, grad, buf, n, p)
                      : sgd_loop<true, true, false>(param, grad, buf, n, p);
  return p.nesterov ? sgd_loop<true, false, true>(param, grad, buf, n, p)
                    : sgd_loop<true, false, false>(param, grad, buf, n, p);
}

void CpuKernels::adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) {
  const elementwise::AdamWStep s = elementwise::adamw_step(p);
  for (size_t i = 0; i < n; ++i) elementwise::adamw(param[i], grad[i], m[i], v[i], s);
}

namespace {

// adamw_fused's pass with its constants `st` (from the host, or read from the staged block: the same loop).
void adamw_fused_pass(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                      const elementwise::AdamWSteps& st, const uint64_t* decay_edges, size_t n_edges,
                      const double* grad_ss, double max_norm) {
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

}  // namespace

void CpuKernels::adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                             const AdamWParams& p, const uint64_t* decay_edges, size_t n_edges,
                             const double* grad_ss, double max_norm) {
  DPT_CHECK(n_edges % 2 == 0 && (decay_edges || n_edges == 0), "adamw_fused: {} decay range edges", n_edges);
  adamw_fused_pass(param, param16, grad, m, v, n, elementwise::adamw_steps(p), decay_edges, n_edges, grad_ss, max_norm);
}

void CpuKernels::adamw_fused_staged(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                                    const elementwise::AdamWSteps* steps, const uint64_t* decay_edges, size_t n_edges,
                                    const double* grad_ss, double max_norm) {
  DPT_CHECK(n_edges % 2 == 0 && (decay_edges || n_edges == 0), "adamw_fused: {} decay range edges", n_edges);
  DPT_CHECK(steps != nullptr, "adamw_fused_staged: no staged constants");
  adamw_fused_pass(param, param16, grad, m, v, n, *steps, decay_edges, n_edges, grad_ss, max_norm);
}

}  // namespace dpt::models
