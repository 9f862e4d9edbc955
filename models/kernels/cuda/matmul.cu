// models/kernels/cuda/matmul.cu: what cuBLASLt's epilogues compute, as kernels of our own for the shapes cuBLASLt
// has no epilogue algorithm for (matmul.cpp falls back to them), each kernel followed by its launcher.
#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

__global__ void bias_epilogue_bf16_kernel(const float* acc, BFloat16* d, int64_t ldd, const BFloat16* bias,
                                          BFloat16* aux, int64_t M, int64_t N, bool gelu) {
  const size_t total = static_cast<size_t>(M) * static_cast<size_t>(N);
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t i = static_cast<int64_t>(e / N), j = static_cast<int64_t>(e % N);
    BFloat16& out = d[i * ldd + j];
    const float pre = acc[e] + to_float(bias[j]);
    if (!gelu) {
      out = to_bfloat16(pre);
      continue;
    }
    if (aux) aux[i * N + j] = to_bfloat16(pre);
    out = to_bfloat16(elementwise::gelu(pre));
  }
}

__global__ void bias_grad_bf16_kernel(const BFloat16* a, int64_t stride_i, int64_t stride_k, int64_t M, int64_t K,
                                      float* bias_grad) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) sum += to_float(a[i * stride_i + k * stride_k]);
    bias_grad[i] += sum;
  }
}

}  // namespace

cudaError_t bias_epilogue_bf16(const float* acc, BFloat16* d, int64_t ldd, const BFloat16* bias, BFloat16* aux,
                               int64_t M, int64_t N, bool gelu, cudaStream_t s) {
  if (M == 0 || N == 0) return cudaSuccess;
  bias_epilogue_bf16_kernel<<<blocks_for(static_cast<size_t>(M * N)), kThreads, 0, s>>>(acc, d, ldd, bias, aux, M, N,
                                                                                        gelu);
  return cudaGetLastError();
}

cudaError_t bias_grad_bf16(const BFloat16* a, int64_t stride_i, int64_t stride_k, int64_t M, int64_t K,
                           float* bias_grad, cudaStream_t s) {
  if (M == 0) return cudaSuccess;
  bias_grad_bf16_kernel<<<blocks_for(static_cast<size_t>(M)), kThreads, 0, s>>>(a, stride_i, stride_k, M, K,
                                                                                 bias_grad);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
