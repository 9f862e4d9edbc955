// models/kernels/cpu/cpu_kernels.h: the CPU kernel set: GEMMs through OpenBLAS (cblas), convolutions through
// oneDNN (onednn_conv.h; im2col + OpenBLAS GEMMs where oneDNN has no kernel, as for fp16), the rest as plain
// loops the compiler vectorises. Stateless but for a per-thread
// im2col workspace, so one instance serves every thread. One class, its members defined by operation family in
// this folder: gemm.cpp, precision.cpp, elementwise.cpp, softmax.cpp, optimizer.cpp, reductions.cpp, conv.cpp,
// batchnorm.cpp, pool.cpp, embedding.cpp, layernorm.cpp, matmul.cpp, attention.cpp.
#pragma once

#include <string>

#include "models/kernels/cpu/cpu_info.h"
#include "models/kernels/kernels.h"

namespace dpt::models {

// x rounded to the nearest fp16 value (ties to even), as a float: exactly static_cast<float>(static_cast<
// _Float16>(x)), inf beyond fp16's range, NaN kept; the F16 operand rounding.
float round_to_fp16(float x);

// What gemm.cpp and conv.cpp share with precision.cpp, the CPU set's low-precision emulation.
namespace detail {
// The calling thread's precision (CpuKernels::set_precision sets it per thread).
Precision thread_precision();
// A copy of the rows x cols matrix at `src` (row stride ld) with every value rounded to `p`, packed (stride
// cols), in one of two per-thread buffers (`which`: 0 or 1, one per operand).
const float* rounded(const float* src, int64_t rows, int64_t cols, int64_t ld, Precision p, int which);
// The float32 product C = alpha op(A) op(B) + beta C, row-major (BLAS's rules: beta 0 never reads C; K 0 scales C),
// in oneDNN's sgemm when OpenMP runs one thread (dprun's and the benchmarks' default; its JIT kernels for the CPU's
// own ISA: on this project's AVX-512 EPYC 1.7-2.1x OpenBLAS's Haswell kernels, which OpenBLAS runs there, on the
// shapes of the MLP and the small transformers; 3-6x on one row), signals held for the call (gemm.cpp says why);
// in OpenBLAS with more threads or DPT_CPU_GEMM=openblas. set_gemm_onednn overrides DPT_CPU_GEMM for the calling
// thread (tests).
bool gemm_onednn();
void set_gemm_onednn(bool on);
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
}  // namespace detail

class CpuKernels final : public Kernels {
 public:
  Device device() const override { return Device::cpu(); }
  // BF16 and F16: gemm operands are rounded to the low precision, then multiplied in float32 (detail::sgemm): the
  // numerics of low-precision GEMMs, the speed of float32. The convolutions run in oneDNN's bf16 kernels where the
  // CPU has them, else likewise emulated. Per thread.
  void set_precision(Precision p) override;
  Precision precision() const override;
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override;
  void bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) override;
  void bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) override;
  void relu_backward(const float* y, const float* dy, float* dx, size_t n) override;
  void count_targets(const int32_t* labels, int64_t n, double* out) override;
  void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                    double* stats) override;
  void sgd_update(float* param, const float* grad, float* momentum_buf, size_t n, const SgdParams& p) override;
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) override;
  void scale(float* x, size_t n, float alpha) override;
  double sum_squares(const float* x, size_t n) override;
  void sum_squares_to(const float* x, size_t n, double* out) override { *out = sum_squares(x, n); }
  void clip_by_norm(float* x, size_t n, const double* ss, double max_norm) override;

  void conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs) override;
  void conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs) override;
  void conv2d_backward_weight(const float* dy, const float* x, float* dw, const ConvShape& cs) override;
  void bn_stats(const float* x, const BnShape& bs, double* sums) override;
  void bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums, const BnShape& bs,
                        float eps, float momentum, float* running_mean, float* running_var, float* save_mean,
                        float* save_invstd, float* y) override;
  void bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                       const float* running_var, const BnShape& bs, float eps, float* y) override;
  void bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                          const BnShape& bs, double* sums, float* dgamma, float* dbeta) override;
  void bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                        const float* save_invstd, const double* sums, const BnShape& bs, float* dx) override;
  void relu(const float* x, float* y, size_t n) override;
  void add(const float* a, const float* b, float* y, size_t n, bool relu) override;
  void maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps) override;
  void maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps) override;
  void avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw) override;
  void avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw) override;

  void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows, int64_t T,
                         int64_t C, int64_t vocab) override;
  void split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T) override;
  void embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows, int64_t T,
                          int64_t C, int64_t vocab) override;
  void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                         int64_t rows, int64_t C, float eps) override;
  void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                          float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C) override;
  void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C,
                       float eps) override;
  void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                        float* dgamma, int64_t rows, int64_t C) override;
  void swiglu_forward(const float* gate, const float* up, float* y, size_t n) override;
  void swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, float* dup,
                       size_t n) override;
  void rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0, int64_t heads,
            int64_t head_dim, int64_t stride, bool inverse) override;
  void rmsnorm_forward_bf16(const BFloat16* x, const float* gamma, BFloat16* y, float* rstd, int64_t rows, int64_t C,
                            float eps) override;
  using Kernels::rmsnorm_backward_bf16;
  void rmsnorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* rstd, BFloat16* dx,
                             float* dgamma, int64_t rows, int64_t C, const BFloat16* residual,
                             bool accumulate) override;
  void swiglu_forward_bf16(const BFloat16* gate, const BFloat16* up, BFloat16* y, size_t n) override;
  void swiglu_backward_bf16(const BFloat16* gate, const BFloat16* up, const BFloat16* dy, BFloat16* dgate, BFloat16* dup,
                            size_t n) override;
  void rope_bf16(BFloat16* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0, int64_t heads,
                 int64_t head_dim, int64_t stride, bool inverse) override;
  void gelu_forward(const float* x, float* y, size_t n) override;
  void gelu_backward(const float* x, const float* dy, float* dx, size_t n) override;
  void causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale) override;
  void causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale) override;

  // The transformer fast path, the reference the CUDA set is tested against: bf16 operands widened (exactly) to
  // float32, products summed in float32, outputs rounded to bf16 once at the end.
  void matmul_bf16(const MatmulShape& s, const MatmulOperands& o) override;                     // matmul.cpp
  void attention_forward(const BFloat16* qkv, BFloat16* out, float* stats, const AttentionShape& s) override;  // attention.cpp
  void attention_backward(const BFloat16* qkv, const BFloat16* out, const BFloat16* dout, const float* stats,
                          BFloat16* dqkv, const AttentionShape& s) override;                   // attention.cpp
  void classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld, float dscale,
                       double* stats) override;                                                 // softmax.cpp
  void adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                   const AdamWParams& p, const uint64_t* decay_edges, size_t n_edges, const double* grad_ss,
                   double max_norm) override;                                                   // optimizer.cpp
  void adamw_fused_staged(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                          const elementwise::AdamWSteps* steps, const uint64_t* decay_edges, size_t n_edges,
                          const double* grad_ss, double max_norm) override;
  // layernorm.cpp, elementwise.cpp
  void layernorm_forward_bf16(const BFloat16* x, const float* gamma, const float* beta, BFloat16* y, float* mean,
                              float* rstd, int64_t rows, int64_t C, float eps) override;
  using Kernels::layernorm_backward_bf16;
  void layernorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* mean,
                               const float* rstd, BFloat16* dx, float* dgamma, float* dbeta, int64_t rows,
                               int64_t C, const BFloat16* residual, bool accumulate) override;
  void add_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n) override;
  void gelu_backward_bf16(const BFloat16* pre, const BFloat16* dy, BFloat16* dx, size_t n) override;
};

}  // namespace dpt::models
