// models/kernels/cuda/elementwise.cpp: the element-wise operations of the CUDA set (bias + activation, ReLU, add,
// scale, GELU): checks, then the launchers of elementwise.cu on this set's stream.
#include "models/kernels/cuda/cuda_kernels.h"

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

void CudaKernels::bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) {
  DPT_CUDA_CHECK(cuda_launch::bias_act(x, bias, y, rows, cols, relu, stream()));
}

void CudaKernels::bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) {
  DPT_CUDA_CHECK(cuda_launch::bias_grad_accumulate(dy, db, rows, cols, stream()));
}

void CudaKernels::relu_backward(const float* y, const float* dy, float* dx, size_t n) {
  DPT_CUDA_CHECK(cuda_launch::relu_backward(y, dy, dx, n, stream()));
}

void CudaKernels::relu(const float* x, float* y, size_t n) { DPT_CUDA_CHECK(cuda_launch::relu(x, y, n, stream())); }

void CudaKernels::add(const float* a, const float* b, float* y, size_t n, bool relu) {
  DPT_CUDA_CHECK(cuda_launch::add(a, b, y, n, relu, stream()));
}

void CudaKernels::scale(float* x, size_t n, float alpha) { DPT_CUDA_CHECK(cuda_launch::scale(x, n, alpha, stream())); }

void CudaKernels::gelu_forward(const float* x, float* y, size_t n) {
  DPT_CUDA_CHECK(cuda_launch::gelu_forward(x, y, n, stream()));
}

void CudaKernels::gelu_backward(const float* x, const float* dy, float* dx, size_t n) {
  DPT_CUDA_CHECK(cuda_launch::gelu_backward(x, dy, dx, n, stream()));
}

void CudaKernels::add_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n) {
  DPT_CUDA_CHECK(cuda_launch::add_bf16(a, b, y, n, stream()));
}

void CudaKernels::gelu_backward_bf16(const BFloat16* pre, const BFloat16* dy, BFloat16* dx, size_t n) {
  DPT_CUDA_CHECK(cuda_launch::gelu_backward_bf16(pre, dy, dx, n, stream()));
}

}  // namespace dpt::models
