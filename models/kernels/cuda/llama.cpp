// models/kernels/cuda/llama.cpp: the Llama family's layers on the GPU: checks and the RMSNorm backward's scratch,
// then the launchers of llama.cu.
#include "models/kernels/cuda/cuda_kernels.h"

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

void CudaKernels::rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C,
                                  float eps) {
  check_row_shape(rows, C, "rmsnorm");
  DPT_CUDA_CHECK(cuda_launch::rmsnorm_forward(x, gamma, y, rstd, rows, C, eps, stream()));
}

void CudaKernels::rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                                   float* dgamma, int64_t rows, int64_t C) {
  check_row_shape(rows, C, "rmsnorm backward");
  if (rows == 0) return;
  // ln_partials holds 2 C floats per split: more than the C per split this needs.
  DPT_CUDA_CHECK(cuda_launch::rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, rows, C, static_cast<const float*>(nullptr),
                                               ln_partials(rows, C), stream()));
}

void CudaKernels::swiglu_forward(const float* gate, const float* up, float* y, size_t n) {
  DPT_CUDA_CHECK(cuda_launch::swiglu_forward(gate, up, y, n, stream()));
}

void CudaKernels::swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, float* dup,
                                  size_t n) {
  DPT_CUDA_CHECK(cuda_launch::swiglu_backward(gate, up, dy, dgate, dup, n, stream()));
}

void CudaKernels::rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0,
                       int64_t heads, int64_t head_dim, int64_t stride, bool inverse) {
  DPT_CUDA_CHECK(cuda_launch::rope(x, cos, sin, rows, T, pos0, heads, head_dim, stride, inverse, stream()));
}

void CudaKernels::rmsnorm_forward_bf16(const BFloat16* x, const float* gamma, BFloat16* y, float* rstd, int64_t rows,
                                       int64_t C, float eps) {
  check_row_shape(rows, C, "rmsnorm (bf16)");
  DPT_CUDA_CHECK(cuda_launch::rmsnorm_forward(x, gamma, y, rstd, rows, C, eps, stream()));
}

void CudaKernels::add_rmsnorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                           BFloat16* y, float* rstd, int64_t rows, int64_t C, float eps) {
  check_row_shape(rows, C, "rmsnorm (bf16)");
  DPT_CUDA_CHECK(cuda_launch::add_rmsnorm_forward(a, b, sum, gamma, y, rstd, rows, C, eps, stream()));
}

void CudaKernels::rmsnorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* rstd,
                                        BFloat16* dx, float* dgamma, int64_t rows, int64_t C,
                                        const BFloat16* residual, bool accumulate) {
  check_row_shape(rows, C, "rmsnorm backward (bf16)");
  if (rows == 0) {  // no rows: nothing to add, or the sums are 0
    if (!accumulate && C > 0)
      DPT_CUDA_CHECK(cudaMemsetAsync(dgamma, 0, static_cast<size_t>(C) * sizeof(float), stream()));
    return;
  }
  DPT_CUDA_CHECK(cuda_launch::rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, rows, C, residual,
                                               ln_partials(rows, C), stream(), accumulate));
}

void CudaKernels::swiglu_forward_bf16(const BFloat16* gate, const BFloat16* up, BFloat16* y, size_t n) {
  DPT_CUDA_CHECK(cuda_launch::swiglu_forward(gate, up, y, n, stream()));
}

void CudaKernels::swiglu_backward_bf16(const BFloat16* gate, const BFloat16* up, const BFloat16* dy, BFloat16* dgate,
                                       BFloat16* dup, size_t n) {
  DPT_CUDA_CHECK(cuda_launch::swiglu_backward(gate, up, dy, dgate, dup, n, stream()));
}

void CudaKernels::rope_bf16(BFloat16* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0,
                            int64_t heads, int64_t head_dim, int64_t stride, bool inverse) {
  DPT_CUDA_CHECK(cuda_launch::rope(x, cos, sin, rows, T, pos0, heads, head_dim, stride, inverse, stream()));
}

}  // namespace dpt::models
