// models/kernels/cpu/cpu_kernels.h: the CPU kernel set: GEMMs through OpenBLAS (cblas), the rest as plain
// loops the compiler vectorises.
#pragma once

#include "models/kernels.h"

namespace dpt::models {

class CpuKernels final : public Kernels {
 public:
  Device device() const override { return Device::cpu(); }
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override;
  void bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) override;
  void bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) override;
  void relu_backward(const float* y, const float* dy, float* dx, size_t n) override;
  void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                    double* stats) override;
  void sgd_update(float* param, const float* grad, float* momentum_buf, size_t n, const SgdParams& p) override;
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) override;
  void scale(float* x, size_t n, float alpha) override;
  double sum_squares(const float* x, size_t n) override;
};

}  // namespace dpt::models
