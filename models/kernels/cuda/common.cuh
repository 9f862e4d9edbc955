// models/kernels/cuda/common.cuh: what the CUDA kernel files share, for nvcc only (included by the .cu files): the
// block size and grid of the grid-stride kernels, block and warp reductions in a fixed order (so a rerun gives the
// same bits), and the row kernels' launch shape. Everything sits in an anonymous namespace, as it did in the one
// kernels.cu: each .cu gets its own copy of what it uses.
#pragma once

#include <cstddef>
#include <cstdint>

#include "models/kernels/cuda/launch.h"

namespace dpt::models::cuda_launch {
namespace {

constexpr int kThreads = 256;

// Enough blocks to cover n with a grid-stride loop, capped so huge n does not launch millions of blocks.
inline unsigned int blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(b < 65535 ? (b == 0 ? 1 : b) : 65535);
}

// Adds a and b over the threads of the block in a fixed tree (the same pairs whatever the scheduling); every
// thread gets the totals. Every thread of the block must call it.
__device__ void block_sum_pair(double& a, double& b) {
  __shared__ double sa[kThreads], sb[kThreads];
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      sa[threadIdx.x] += sa[threadIdx.x + w];
      sb[threadIdx.x] += sb[threadIdx.x + w];
    }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
}

// One block adds a and b (n each) in a fixed order into out[0] and out[1] (doubles).
template <class T>
__global__ void reduce_pair_kernel(const T* a, const T* b, size_t n, double* out) {
  double x = 0.0, y = 0.0;
  for (size_t i = threadIdx.x; i < n; i += kThreads) {
    x += static_cast<double>(a[i]);
    if (b) y += static_cast<double>(b[i]);
  }
  block_sum_pair(x, y);
  if (threadIdx.x == 0) {
    out[0] += x;
    if (b) out[1] += y;
  }
}

// Activations of either type, as float32: bf16 widened exactly, stored rounded to nearest even (core/bfloat16.h).
__device__ __forceinline__ float load_act(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_act(const BFloat16* p, int64_t i) { return to_float(p[i]); }
__device__ __forceinline__ void store_act(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_act(BFloat16* p, int64_t i, float v) { p[i] = to_bfloat16(v); }

// The row kernels below give each row one warp: kThreads / 32 rows per block.
constexpr int kWarpsPerBlock = kThreads / 32;
static_assert(kWarpsPerBlock == kRowsPerBlock, "launch.h's kRowsPerBlock is the row kernels' warps per block");
inline unsigned int row_blocks(int64_t rows) {
  return static_cast<unsigned int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// Sums and maxima over a warp by butterfly (xor) shuffles: every lane ends with the same bits (each step adds
// the same two values on both lanes of a pair, and float addition is commutative). All 32 lanes must call.
__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ double warp_sum(double v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

}  // namespace
}  // namespace dpt::models::cuda_launch
