// models/kernels/cpu/reductions.cpp: the sum of squares (in double) and global-norm clipping on the CPU.
#include "models/kernels/cpu/cpu_kernels.h"

#include "models/kernels/elementwise.h"

namespace dpt::models {

double CpuKernels::sum_squares(const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void CpuKernels::clip_by_norm(float* x, size_t n, const double* ss, double max_norm) {
  const double coef = elementwise::clip_coefficient(*ss, max_norm);
  if (coef < 1.0) scale(x, n, static_cast<float>(coef));
}

}  // namespace dpt::models
