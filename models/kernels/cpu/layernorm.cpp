// models/kernels/cpu/layernorm.cpp: LayerNorm forward and backward on the CPU (row sums in double).
#include "models/kernels/cpu/cpu_kernels.h"

#include <cmath>

namespace dpt::models {

void CpuKernels::layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                   float* rstd, int64_t rows, int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * C;
    double sum = 0.0;
    for (int64_t c = 0; c < C; ++c) sum += in[c];
    const float m = static_cast<float>(sum / static_cast<double>(C));
    double var = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double d = in[c] - m;
      var += d * d;
    }
    const float s = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(C) + eps));
    float* out = y + r * C;
    for (int64_t c = 0; c < C; ++c) out[c] = (in[c] - m) * s * gamma[c] + beta[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void CpuKernels::layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                                    const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                                    int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = dy + r * C;
    const float* in = x + r * C;
    const float m = mean[r], s = rstd[r];
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma
    double sum_d = 0.0, sum_dx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (in[c] - m) * s;
      const float d = g[c] * gamma[c];
      sum_d += d;
      sum_dx += static_cast<double>(d) * xhat;
      dgamma[c] += g[c] * xhat;
      dbeta[c] += g[c];
    }
    const float mean_d = static_cast<float>(sum_d / static_cast<double>(C));
    const float mean_dx = static_cast<float>(sum_dx / static_cast<double>(C));
    float* out = dx + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (in[c] - m) * s;
      out[c] = s * (g[c] * gamma[c] - mean_d - xhat * mean_dx);
    }
  }
}

}  // namespace dpt::models
