// models/kernels/cuda/layernorm.cpp: LayerNorm on the GPU: checks and the backward's scratch, then the launchers of
// layernorm.cu.
#include "models/kernels/cuda/cuda_kernels.h"

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

// The backward's parameter-gradient partial sums: scratch grown to the largest shape so far (the stream runs in order).
float* CudaKernels::ln_partials(int64_t rows, int64_t C) {
  const size_t count = cuda_launch::layernorm_partials_count(rows, C);
  if (ln_partials_.numel() < count) ln_partials_ = Tensor::empty({static_cast<int64_t>(count)}, DType::F32, device());
  return ln_partials_.data<float>();
}

void CudaKernels::layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                    float* rstd, int64_t rows, int64_t C, float eps) {
  check_row_shape(rows, C, "layernorm");
  DPT_CUDA_CHECK(cuda_launch::layernorm_forward(x, gamma, beta, y, mean, rstd, rows, C, eps, stream()));
}

void CudaKernels::layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                                     const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                                     int64_t C) {
  check_row_shape(rows, C, "layernorm backward");
  if (rows == 0) return;  // nothing to accumulate, nothing to write
  DPT_CUDA_CHECK(cuda_launch::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, C,
                                                 static_cast<const float*>(nullptr), ln_partials(rows, C), stream()));
}

void CudaKernels::layernorm_forward_bf16(const BFloat16* x, const float* gamma, const float* beta, BFloat16* y,
                                         float* mean, float* rstd, int64_t rows, int64_t C, float eps) {
  check_row_shape(rows, C, "layernorm");
  DPT_CUDA_CHECK(cuda_launch::layernorm_forward(x, gamma, beta, y, mean, rstd, rows, C, eps, stream()));
}

void CudaKernels::add_layernorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                             const float* beta, BFloat16* y, float* mean, float* rstd, int64_t rows,
                                             int64_t C, float eps) {
  check_row_shape(rows, C, "layernorm");
  DPT_CUDA_CHECK(cuda_launch::add_layernorm_forward(a, b, sum, gamma, beta, y, mean, rstd, rows, C, eps, stream()));
}

void CudaKernels::layernorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* mean,
                                          const float* rstd, BFloat16* dx, float* dgamma, float* dbeta, int64_t rows,
                                          int64_t C, const BFloat16* residual, bool accumulate) {
  check_row_shape(rows, C, "layernorm backward");
  if (rows == 0) {  // no rows: nothing to add, or the sums are 0
    if (!accumulate && C > 0) {
      DPT_CUDA_CHECK(cudaMemsetAsync(dgamma, 0, static_cast<size_t>(C) * sizeof(float), stream()));
      DPT_CUDA_CHECK(cudaMemsetAsync(dbeta, 0, static_cast<size_t>(C) * sizeof(float), stream()));
    }
    return;
  }
  DPT_CUDA_CHECK(cuda_launch::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, C, residual,
                                                 ln_partials(rows, C), stream(), accumulate));
}

}  // namespace dpt::models
