// models/kernels/cuda/precision.cpp: CudaKernels's precision (cuBLAS's math mode follows it) and the 16-bit scratch
// that gemm and the convolutions round their operands into under BF16 / F16 (the kernels: precision.cu).
#include "models/kernels/cuda/cuda_kernels.h"

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

// Per kernel set (the model sets it before each pass). cuBLAS's math mode follows: the default mode for F32, which
// keeps float32's precision (no TF32: that needs CUBLAS_TF32_TENSOR_OP_MATH), as PyTorch's handle does without
// allow_tf32; for the 16-bit GEMMs the default mode too (tensor cores, accumulation in float32 as
// CUBLAS_COMPUTE_32F asks), their split-K parts added in float32. Not the pedantic mode, which prescribes the
// arithmetic of every phase and which cuBLAS's documentation describes as meant for numerical studies and
// debugging rather than speed; until 2026-11-28 F32 ran in it. A call already queued keeps the mode it was queued
// with.
void CudaKernels::set_precision(Precision p) {
  DPT_CHECK(p == Precision::F32 || p == Precision::BF16 || p == Precision::F16, "precision {}",
            static_cast<int>(p));
  if (p == precision_) return;
  DPT_CUBLAS_CHECK(cublasSetMathMode(
      handle_, p == Precision::F32 ? CUBLAS_DEFAULT_MATH
                                   : static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                               CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  precision_ = p;
}

// 16-bit scratch `slot` (0 to 2: the operands of one gemm or convolution, and a convolution's output) with room
// for `count` values, grown on demand like the rest (never per call). The stream's order makes reusing a slot
// from one call to the next safe.
void* CudaKernels::narrow_scratch(int slot, size_t count) {
  Tensor& t = narrow_[static_cast<size_t>(slot)];
  const size_t bytes = count * cuda_launch::kNarrowBytes;
  if (t.bytes() < bytes) t = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device());
  return t.raw();
}

// `batch` matrices of rows x cols floats (row stride ld, matrix m at src + m * stride) rounded to this precision,
// packed one after the other, in scratch `slot`.
const void* CudaKernels::narrowed_batched(const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                                          int64_t stride, int slot) {
  void* dst = narrow_scratch(slot, static_cast<size_t>(batch * rows * cols));
  DPT_CUDA_CHECK(cuda_launch::narrow_batched(src, batch, rows, cols, ld, stride, dst, precision_, stream()));
  return dst;
}

// The rows x cols floats at `src` (row stride ld) rounded to this precision, packed, in scratch `slot`.
const void* CudaKernels::narrowed(const float* src, int64_t rows, int64_t cols, int64_t ld, int slot) {
  void* dst = narrow_scratch(slot, static_cast<size_t>(rows * cols));
  DPT_CUDA_CHECK(cuda_launch::narrow(src, rows, cols, ld, dst, precision_, stream()));
  return dst;
}

}  // namespace dpt::models
