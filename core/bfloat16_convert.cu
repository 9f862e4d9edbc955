// core/bfloat16_convert.cu: the float32 <-> bfloat16 conversion kernels, one element per thread in a
// grid-stride loop, with the rounding of core/bfloat16.h (the same function the CPU loops call).
#include "core/bfloat16_launch.h"

namespace dpt::cuda_launch {
namespace {

constexpr int kThreads = 256;

// Enough blocks to cover n with a grid-stride loop, capped so that huge n does not launch millions of them.
unsigned int blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(b < 65535 ? (b == 0 ? 1 : b) : 65535);
}

__global__ void to_bfloat16_kernel(const float* src, BFloat16* dst, size_t n, float divisor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = ::dpt::to_bfloat16(src[i] / divisor);
}

__global__ void from_bfloat16_kernel(const BFloat16* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = ::dpt::to_float(src[i]);
}

}  // namespace

cudaError_t to_bfloat16(const float* src, BFloat16* dst, size_t n, float divisor, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  to_bfloat16_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, dst, n, divisor);
  return cudaGetLastError();
}

cudaError_t from_bfloat16(const BFloat16* src, float* dst, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  from_bfloat16_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, dst, n);
  return cudaGetLastError();
}

}  // namespace dpt::cuda_launch
