// models/kernels/cuda/reductions.cu: the sum of squares (gradient norms), in a fixed order without atomics, and the
// global-norm clipping that reads it on the device; each kernel followed by its launcher.
#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

// Each block writes the sum of squares of its grid-stride share to partials[blockIdx.x].
__global__ void sum_squares_kernel(const float* x, size_t n, double* partials) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * kThreads)
    acc += static_cast<double>(x[i]) * x[i];
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

}  // namespace

cudaError_t sum_squares(const float* x, size_t n, double* partials, double* out, cudaStream_t s) {
  // partials is fully written (blocks past n write 0), then summed in a fixed order into *out (set, not added).
  if (const cudaError_t e = cudaMemsetAsync(out, 0, sizeof(double), s); e != cudaSuccess) return e;
  sum_squares_kernel<<<kSumSquaresBlocks, kThreads, 0, s>>>(x, n, partials);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  reduce_pair_kernel<double><<<1, kThreads, 0, s>>>(partials, nullptr, kSumSquaresBlocks, out);
  return cudaGetLastError();
}

namespace {

__global__ void clip_by_norm_kernel(float* x, size_t n, const double* ss, double max_norm) {
  const double coef = elementwise::clip_coefficient(*ss, max_norm);
  if (coef >= 1.0) return;
  const auto alpha = static_cast<float>(coef);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] *= alpha;
}

}  // namespace

cudaError_t clip_by_norm(float* x, size_t n, const double* ss, double max_norm, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  clip_by_norm_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, ss, max_norm);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
