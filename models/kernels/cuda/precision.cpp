// models/kernels/cuda/precision.cpp: CudaKernels's precision (which GEMMs round their operands) and the 16-bit scratch
// that gemm and the convolutions round their operands into under BF16 / F16 (the kernels: precision.cu).
#include "models/kernels/cuda/cuda_kernels.h"

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

// Per kernel set (the model sets it before each pass): which GEMMs and convolutions round their operands to 16 bits.
// cuBLAS's math mode is one for every precision (the constructor's: kCublasMath).
void CudaKernels::set_precision(Precision p) {
  DPT_CHECK(p == Precision::F32 || p == Precision::BF16 || p == Precision::F16, "precision {}",
            static_cast<int>(p));
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
