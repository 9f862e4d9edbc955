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

}  // namespace dpt::models
