// models/kernels/cpu/cpu_kernels.cpp: the CPU kernel set.
#include "models/kernels/cpu/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "models/kernels/elementwise.h"

namespace dpt::models {

void CpuKernels::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                      int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  DPT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm shape {}x{}x{}", M, N, K);
  if (M == 0 || N == 0) return;
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  DPT_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
            "gemm dimensions exceed the BLAS int range");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

void CpuKernels::bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    if (relu) {
      for (int64_t c = 0; c < cols; ++c) yr[c] = elementwise::bias_act(xr[c], bias[c], true);
    } else {
      for (int64_t c = 0; c < cols; ++c) yr[c] = elementwise::bias_act(xr[c], bias[c], false);
    }
  }
}

void CpuKernels::bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) db[c] += dyr[c];
  }
}

void CpuKernels::relu_backward(const float* y, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) dx[i] = elementwise::relu_backward(y[i], dy[i]);
}

void CpuKernels::softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                              double* stats) {
  double loss = 0.0;
  int64_t hits = 0;
  const float inv_rows = rows > 0 ? 1.0f / static_cast<float>(rows) : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * cols;
    const int32_t label = labels[r];
    DPT_CHECK(label >= 0 && label < cols, "label {} outside [0, {})", label, cols);
    int64_t argmax = 0;
    float zmax = z[0];
    for (int64_t c = 1; c < cols; ++c) {
      if (z[c] > zmax) {
        zmax = z[c];
        argmax = c;
      }
    }
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
    const double log_sum = std::log(sum);
    loss += log_sum - static_cast<double>(z[label] - zmax);
    hits += argmax == label;
    if (dlogits) {
      float* d = dlogits + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const double p = std::exp(static_cast<double>(z[c] - zmax) - log_sum);
        d[c] = static_cast<float>(p - (c == label ? 1.0 : 0.0)) * inv_rows;
      }
    }
  }
  stats[0] += loss;
  stats[1] += static_cast<double>(hits);
}

void CpuKernels::sgd_update(float* param, const float* grad, float* buf, size_t n, const SgdParams& p) {
  for (size_t i = 0; i < n; ++i) elementwise::sgd(param[i], grad[i], buf ? buf + i : nullptr, p);
}

void CpuKernels::adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) {
  const elementwise::AdamWStep s = elementwise::adamw_step(p);
  for (size_t i = 0; i < n; ++i) elementwise::adamw(param[i], grad[i], m[i], v[i], s);
}

void CpuKernels::scale(float* x, size_t n, float alpha) {
  for (size_t i = 0; i < n; ++i) x[i] *= alpha;
}

double CpuKernels::sum_squares(const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace dpt::models
