// models/kernels/cpu/layernorm.cpp: LayerNorm forward and backward on the CPU (row sums in double, row_sums.h), on
// float32 or bf16 activations (one template: bf16 read widened, written rounded once).
#include "models/kernels/cpu/cpu_kernels.h"
#include "models/kernels/cpu/activation_io.h"
#include "models/kernels/cpu/row_sums.h"

#include <algorithm>
#include <cmath>

namespace dpt::models {

namespace {

using cpu_act::ld;
using cpu_act::st;
using cpu_sums::sum8;

template <class T>
void layernorm_forward_rows(const T* x, const float* gamma, const float* beta, T* y, float* mean, float* rstd,
                            int64_t rows, int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * C;
    const double sum = sum8(C, [in](int64_t c) { return static_cast<double>(ld(in, c)); });
    const float m = static_cast<float>(sum / static_cast<double>(C));
    const double var = sum8(C, [in, m](int64_t c) {
      const double d = ld(in, c) - m;
      return d * d;
    });
    const float s = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(C) + eps));
    T* out = y + r * C;
    for (int64_t c = 0; c < C; ++c) st(out, c, (ld(in, c) - m) * s * gamma[c] + beta[c]);
    mean[r] = m;
    rstd[r] = s;
  }
}

// residual (null: none): added to dx in float32 before its one rounding; it may alias dx (each column read before it
// is written).
template <class T>
void layernorm_backward_rows(const T* dy, const T* x, const float* gamma, const float* mean, const float* rstd, T* dx,
                             float* dgamma, float* dbeta, int64_t rows, int64_t C, const T* residual) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = dy + r * C;
    const T* in = x + r * C;
    const float m = mean[r], s = rstd[r];
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma
    for (int64_t c = 0; c < C; ++c) {
      const float gc = ld(g, c);
      dgamma[c] += gc * ((ld(in, c) - m) * s);
      dbeta[c] += gc;
    }
    const double sum_d = sum8(C, [&](int64_t c) { return static_cast<double>(ld(g, c) * gamma[c]); });
    const double sum_dx =
        sum8(C, [&](int64_t c) { return static_cast<double>(ld(g, c) * gamma[c]) * ((ld(in, c) - m) * s); });
    const float mean_d = static_cast<float>(sum_d / static_cast<double>(C));
    const float mean_dx = static_cast<float>(sum_dx / static_cast<double>(C));
    T* out = dx + r * C;
    const T* res = residual ? residual + r * C : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (ld(in, c) - m) * s;
      const float v = s * (ld(g, c) * gamma[c] - mean_d - xhat * mean_dx);
      st(out, c, res ? v + ld(res, c) : v);
    }
  }
}

}  // namespace

void CpuKernels::layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                   float* rstd, int64_t rows, int64_t C, float eps) {
  layernorm_forward_rows(x, gamma, beta, y, mean, rstd, rows, C, eps);
}

void CpuKernels::layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                                    const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                                    int64_t C) {
  layernorm_backward_rows(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, C, static_cast<const float*>(nullptr));
}

void CpuKernels::layernorm_forward_bf16(const BFloat16* x, const float* gamma, const float* beta, BFloat16* y,
                                        float* mean, float* rstd, int64_t rows, int64_t C, float eps) {
  layernorm_forward_rows(x, gamma, beta, y, mean, rstd, rows, C, eps);
}

void CpuKernels::layernorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* mean,
                                         const float* rstd, BFloat16* dx, float* dgamma, float* dbeta, int64_t rows,
                                         int64_t C, const BFloat16* residual, bool accumulate) {
  if (!accumulate) {  // overwritten: the sums from 0, as after zero_grad (the same bits)
    std::fill_n(dgamma, C, 0.0f);
    std::fill_n(dbeta, C, 0.0f);
  }
  layernorm_backward_rows(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, C, residual);
}

}  // namespace dpt::models
