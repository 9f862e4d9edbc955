// models/kernels/cuda/gemm.cpp: the GEMMs through cuBLAS: strict FP32 (no TF32) by default; under BF16 / F16 the
// operands rounded into 16-bit scratch (precision.cpp), multiplied on tensor cores with float32 accumulation.
#include "models/kernels/cuda/cuda_kernels.h"

#include <cublas_v2.h>
#include <library_types.h>

#include <limits>

namespace dpt::models {

void CudaKernels::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                       int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  DPT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm shape {}x{}x{}", M, N, K);
  if (M == 0 || N == 0) return;
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  DPT_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
            "gemm dimensions exceed cuBLAS's int range");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep the flags.
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  if (precision_ == Precision::F32 || K == 0) {  // K = 0: C = beta C, nothing to round
    DPT_CUBLAS_CHECK(cublasSgemm(handle_, op_b, op_a, i(N), i(M), i(K), &alpha, B, i(ldb), A, i(lda), &beta, C,
                                 i(ldc)));
    return;
  }
  // op(A) is M x K, stored as (trans_a ? K x M : M x K) with row stride lda; likewise B. Rounded into packed
  // 16-bit copies, whose row strides are then their row lengths.
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const void* a16 = narrowed(A, a_rows, a_cols, lda, 0);
  const void* b16 = narrowed(B, b_rows, b_cols, ldb, 1);
  const cudaDataType_t type = precision_ == Precision::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  DPT_CUBLAS_CHECK(cublasGemmEx(handle_, op_b, op_a, i(N), i(M), i(K), &alpha, b16, type, i(b_cols), a16, type,
                                i(a_cols), &beta, C, CUDA_R_32F, i(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// One cuBLAS call for the whole batch, row-major to column-major as gemm (operands swapped, flags kept). The
// strides are cuBLAS's own (long long): matrices may be interleaved (the heads within one row of q, k and v:
// stride hs, row stride 3C), which is fine for the operands and for C as long as no two C matrices overlap.
void CudaKernels::gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                       const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                                       int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                                       int64_t batch) {
  DPT_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0, "gemm_strided_batched shape {}x{}x{}, batch {}", M, N, K,
            batch);
  DPT_CHECK(stride_a >= 0 && stride_b >= 0 && stride_c >= 0, "gemm_strided_batched strides {}, {}, {}", stride_a,
            stride_b, stride_c);
  if (M == 0 || N == 0 || batch == 0) return;
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  DPT_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax && batch <= kMax,
            "gemm_strided_batched dimensions exceed cuBLAS's int range");
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  const auto ll = [](int64_t v) { return static_cast<long long>(v); };
  if (precision_ == Precision::F32 || K == 0) {  // K = 0: C = beta C, nothing to round
    DPT_CUBLAS_CHECK(cublasSgemmStridedBatched(handle_, op_b, op_a, i(N), i(M), i(K), &alpha, B, i(ldb),
                                               ll(stride_b), A, i(lda), ll(stride_a), &beta, C, i(ldc),
                                               ll(stride_c), i(batch)));
    return;
  }
  // Each operand matrix (stored a_rows x a_cols, row stride lda, stride_a apart, maybe interleaved with the
  // others) is rounded into a packed 16-bit copy: matrix m at m * a_rows * a_cols, row stride a_cols. Only the
  // elements the GEMMs read are converted.
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const void* a16 = narrowed_batched(A, batch, a_rows, a_cols, lda, stride_a, 0);
  const void* b16 = narrowed_batched(B, batch, b_rows, b_cols, ldb, stride_b, 1);
  const cudaDataType_t type = precision_ == Precision::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  DPT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle_, op_b, op_a, i(N), i(M), i(K), &alpha, b16, type, i(b_cols),
                                              ll(b_rows * b_cols), a16, type, i(a_cols), ll(a_rows * a_cols), &beta,
                                              C, CUDA_R_32F, i(ldc), ll(stride_c), i(batch), CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
}

}  // namespace dpt::models
