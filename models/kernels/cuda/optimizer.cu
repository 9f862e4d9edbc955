// models/kernels/cuda/optimizer.cu: the optimizer updates (SGD, AdamW), each kernel followed by its launcher; the
// per-element arithmetic is elementwise.h's, shared with the CPU set.
#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

__global__ void sgd_kernel(float* param, const float* grad, float* buf, size_t n, SgdParams p) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    elementwise::sgd(param[i], grad[i], buf ? buf + i : nullptr, p);
}

}  // namespace

cudaError_t sgd_update(float* param, const float* grad, float* buf, size_t n, SgdParams p, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  sgd_kernel<<<blocks_for(n), kThreads, 0, s>>>(param, grad, buf, n, p);
  return cudaGetLastError();
}

namespace {

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, size_t n, elementwise::AdamWStep st) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    elementwise::adamw(param[i], grad[i], m[i], v[i], st);
}

}  // namespace

cudaError_t adamw_update(float* param, const float* grad, float* m, float* v, size_t n, elementwise::AdamWStep st,
                         cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(param, grad, m, v, n, st);
  return cudaGetLastError();
}

namespace {

__global__ void adamw_fused_kernel(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                                   elementwise::AdamWStep with, elementwise::AdamWStep without,
                                   const uint64_t* edges, size_t n_edges, const double* grad_ss, double max_norm) {
  const float f = elementwise::clip_factor(grad_ss, max_norm);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const bool decay = edges == nullptr || elementwise::in_decay_range(edges, n_edges, i);
    float p = param[i];
    elementwise::adamw(p, grad[i] * f, m[i], v[i], decay ? with : without);
    param[i] = p;
    if (param16) param16[i] = to_bfloat16(p);
  }
}

}  // namespace

cudaError_t adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                        elementwise::AdamWStep with_decay, elementwise::AdamWStep without_decay,
                        const uint64_t* decay_edges, size_t n_edges, const double* grad_ss, double max_norm,
                        cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  adamw_fused_kernel<<<blocks_for(n), kThreads, 0, s>>>(param, param16, grad, m, v, n, with_decay, without_decay,
                                                        decay_edges, n_edges, grad_ss, max_norm);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
