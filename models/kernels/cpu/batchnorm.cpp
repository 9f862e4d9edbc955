// models/kernels/cpu/batchnorm.cpp: batch normalisation on the CPU, split as SyncBatchNorm needs it (statistics,
// element-wise pass, backward reduction, backward data); the sums in double.
#include "models/kernels/cpu/cpu_kernels.h"

#include <cmath>

#include "models/kernels/elementwise.h"

namespace dpt::models {

void CpuKernels::bn_stats(const float* x, const BnShape& bs, double* sums) {
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    double s = 0, ss = 0;
    for (int64_t n = 0; n < bs.n; ++n) {
      const float* p = x + (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) {
        const double v = p[i];
        s += v;
        ss += v * v;
      }
    }
    sums[ch] = s;
    sums[bs.c + ch] = ss;
  }
  sums[2 * bs.c] = static_cast<double>(bs.n * bs.hw);
}

void CpuKernels::bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums,
                                  const BnShape& bs, float eps, float momentum, float* running_mean,
                                  float* running_var, float* save_mean, float* save_invstd, float* y) {
  const double count = sums[2 * bs.c];
  DPT_CHECK(count > 0, "batch norm over an empty batch");
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    const elementwise::BnMoments m = elementwise::bn_moments(sums[ch], sums[bs.c + ch], count, eps);
    save_mean[ch] = m.mean;
    save_invstd[ch] = m.invstd;
    running_mean[ch] = elementwise::lerp_running(running_mean[ch], m.mean, momentum);
    running_var[ch] = elementwise::lerp_running(running_var[ch], m.unbiased_var, momentum);
    const float a = gamma[ch] * m.invstd, b = beta[ch] - m.mean * a;
    for (int64_t n = 0; n < bs.n; ++n) {
      const int64_t off = (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) y[off + i] = x[off + i] * a + b;
    }
  }
}

void CpuKernels::bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                                 const float* running_var, const BnShape& bs, float eps, float* y) {
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    const float invstd = 1.0f / std::sqrt(running_var[ch] + eps);
    const float a = gamma[ch] * invstd, b = beta[ch] - running_mean[ch] * a;
    for (int64_t n = 0; n < bs.n; ++n) {
      const int64_t off = (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) y[off + i] = x[off + i] * a + b;
    }
  }
}

void CpuKernels::bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                                    const BnShape& bs, double* sums, float* dgamma, float* dbeta) {
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    double sdy = 0, sdyx = 0;
    const double mean = save_mean[ch], invstd = save_invstd[ch];
    for (int64_t n = 0; n < bs.n; ++n) {
      const int64_t off = (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) {
        const double g = dy[off + i];
        sdy += g;
        sdyx += g * (x[off + i] - mean) * invstd;
      }
    }
    sums[ch] = sdy;
    sums[bs.c + ch] = sdyx;
    dbeta[ch] += static_cast<float>(sdy);
    dgamma[ch] += static_cast<float>(sdyx);
  }
  sums[2 * bs.c] = static_cast<double>(bs.n * bs.hw);
}

void CpuKernels::bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                                  const float* save_invstd, const double* sums, const BnShape& bs, float* dx) {
  const double count = sums[2 * bs.c];
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    const elementwise::BnBackward k =
        elementwise::bn_backward_coefficients(gamma[ch], save_mean[ch], save_invstd[ch], sums[ch], sums[bs.c + ch], count);
    for (int64_t n = 0; n < bs.n; ++n) {
      const int64_t off = (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) dx[off + i] = elementwise::bn_backward(dy[off + i], x[off + i], k);
    }
  }
}

}  // namespace dpt::models
