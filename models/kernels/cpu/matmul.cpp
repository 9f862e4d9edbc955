// models/kernels/cpu/matmul.cpp: the bf16 matmul with its epilogues on the CPU, the reference of the CUDA set's
// cuBLASLt one: the bf16 operands widened (exactly) into float32 copies, multiplied in float32 by detail::sgemm
// (whatever the thread's precision: the operands are already bf16), then the epilogue per element in float32 and one
// rounding of each bf16 output.
#include "models/kernels/cpu/cpu_kernels.h"

#include <vector>

#include "models/kernels/elementwise.h"

namespace dpt::models {

namespace {

// The rows x cols matrix at `src` (row stride ld), widened and packed.
std::vector<float> widened(const BFloat16* src, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(r * cols + c)] = to_float(src[r * ld + c]);
  return out;
}

}  // namespace

void CpuKernels::matmul_bf16(const MatmulShape& s, const MatmulOperands& o) {
  check_matmul(s, o);
  if (s.M == 0 || s.N == 0) return;
  const int64_t a_rows = s.trans_a ? s.K : s.M, a_cols = s.trans_a ? s.M : s.K;
  const int64_t b_rows = s.trans_b ? s.N : s.K, b_cols = s.trans_b ? s.K : s.N;
  std::vector<float> d(static_cast<size_t>(s.M * s.N), 0.0f);
  std::vector<float> a;
  if (s.K > 0) {
    a = widened(o.a, a_rows, a_cols, s.lda);
    const std::vector<float> b = widened(o.b, b_rows, b_cols, s.ldb);
    detail::sgemm(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, a.data(), a_cols, b.data(), b_cols, 0.0f, d.data(), s.N);
  }
  for (int64_t i = 0; i < s.M; ++i)
    for (int64_t j = 0; j < s.N; ++j) {
      const float acc = d[static_cast<size_t>(i * s.N + j)];
      if (s.d_f32) {
        float& out = static_cast<float*>(o.d)[i * s.ldd + j];
        out = s.accumulate ? out + acc : acc;
        continue;
      }
      BFloat16& out = static_cast<BFloat16*>(o.d)[i * s.ldd + j];
      if (s.epilogue == MatmulEpilogue::None) {
        out = to_bfloat16(acc);
        continue;
      }
      if (s.epilogue == MatmulEpilogue::DGelu) {
        out = to_bfloat16(acc * elementwise::gelu_grad(to_float(o.aux[i * s.N + j])));
        continue;
      }
      const float pre = acc + to_float(o.bias[j]);
      if (s.epilogue == MatmulEpilogue::Bias) {
        out = to_bfloat16(pre);
        continue;
      }
      if (o.aux) o.aux[i * s.N + j] = to_bfloat16(pre);
      out = to_bfloat16(elementwise::gelu(pre));
    }
  if (s.epilogue == MatmulEpilogue::BiasGrad) {
    // bias_grad[i] += sum over k of op(A)[i, k] (= when D is overwritten), summed in float32 in k order.
    for (int64_t i = 0; i < s.M; ++i) {
      float sum = 0.0f;
      for (int64_t k = 0; k < s.K; ++k) sum += s.trans_a ? a[static_cast<size_t>(k * a_cols + i)] : a[static_cast<size_t>(i * a_cols + k)];
      o.bias_grad[i] = s.accumulate ? o.bias_grad[i] + sum : sum;
    }
  }
}

}  // namespace dpt::models
