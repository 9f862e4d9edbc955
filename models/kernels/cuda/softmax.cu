// models/kernels/cuda/softmax.cu: the softmax CUDA kernels, each followed by its launcher: softmax cross-entropy
// (the classification loss, its gradient and its deterministic batch sums) and the causal softmax of attention,
// forward and backward (one warp per row).
#include <cfloat>
#include <cmath>

#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

// One warp per row: max (first index on ties, as the CPU's strict >), sum of exp, loss, hit, gradient.
__global__ void xent_rows_kernel(const float* logits, const int32_t* labels, float* dlogits, int64_t rows,
                                 int64_t cols, float* row_loss, float* row_hit) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const float* z = logits + r * cols;
  float zmax = -FLT_MAX;
  int64_t arg = cols;
  for (int64_t c = lane; c < cols; c += 32) {
    if (z[c] > zmax) {
      zmax = z[c];
      arg = c;
    }
  }
  for (int off = 16; off > 0; off /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, zmax, off);
    const int64_t oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (om > zmax || (om == zmax && oa < arg)) {
      zmax = om;
      arg = oa;
    }
  }
  float sum = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) sum += expf(z[c] - zmax);
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float log_sum = logf(sum);
  const int32_t label = labels[r];
  const bool valid = label >= 0 && label < cols, ignored = label == kIgnoreLabel;
  if (lane == 0) {
    row_loss[r] = ignored ? 0.0f : valid ? log_sum - (z[label] - zmax) : NAN;
    row_hit[r] = valid && arg == label ? 1.0f : 0.0f;
  }
  if (dlogits) {
    const float inv_rows = 1.0f / static_cast<float>(rows);
    float* d = dlogits + r * cols;
    for (int64_t c = lane; c < cols; c += 32) {
      const float p = expf(z[c] - zmax - log_sum);
      d[c] = ignored ? 0.0f : valid ? (p - (c == label ? 1.0f : 0.0f)) * inv_rows : NAN;
    }
  }
}

}  // namespace

namespace {

__global__ void count_targets_kernel(const int32_t* labels, int64_t n, double* out) {
  double count = 0.0, none = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) count += labels[i] != kIgnoreLabel ? 1.0 : 0.0;
  block_sum_pair(count, none);
  if (threadIdx.x == 0) out[0] += count;
}

}  // namespace

cudaError_t count_targets(const int32_t* labels, int64_t n, double* out, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  count_targets_kernel<<<1, kThreads, 0, s>>>(labels, n, out);
  return cudaGetLastError();
}

cudaError_t softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                         float* row_loss, float* row_hit, double* stats, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  constexpr int kRowsPerBlock = kThreads / 32;
  const auto grid = static_cast<unsigned int>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  xent_rows_kernel<<<grid, kThreads, 0, s>>>(logits, labels, dlogits, rows, cols, row_loss, row_hit);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  reduce_pair_kernel<float><<<1, kThreads, 0, s>>>(row_loss, row_hit, static_cast<size_t>(rows), stats);
  return cudaGetLastError();
}

namespace {

// The block's threads' states merged in a fixed tree (thread i takes in thread i + w; blockDim.x a power of two):
// the row's, returned to every thread. `part`: the block's shared array, blockDim.x of them.
__device__ elementwise::OnlineSoftmax merge_block(elementwise::OnlineSoftmax* part, const elementwise::OnlineSoftmax& acc) {
  part[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x].merge(part[threadIdx.x + w]);
    __syncthreads();
  }
  return part[0];
}

// One block per row: each thread an online softmax (running maximum and sum of exp relative to it) and the first
// argmax of its columns; the block's threads combined in a fixed tree; then the gradient over the row. kVec: the row
// is read and written eight columns at a time (16-byte aligned rows, ld a multiple of 8), each thread's vectors in
// increasing order, two loads in flight; else one column at a time.
template <bool kVec>
__global__ void classifier_bf16_kernel(BFloat16* logits, const int32_t* labels, int64_t vocab, int64_t ld,
                                       float dscale, float* row_loss, float* row_hit) {
  __shared__ elementwise::OnlineSoftmax part[kThreads];
  const int64_t r = blockIdx.x;
  BFloat16* z = logits + r * ld;
  elementwise::OnlineSoftmax acc = elementwise::online_softmax_start(vocab);
  if constexpr (kVec) {
    const auto* zv = reinterpret_cast<const uint4*>(z);
    const int64_t nvec = (vocab + 7) / 8;  // the vectors holding real columns
    for (int64_t v0 = threadIdx.x; v0 < nvec; v0 += 2 * kThreads) {
      Bf16x8 in[2];
      const int64_t v1 = v0 + kThreads;
      in[0].raw = zv[v0];
      if (v1 < nvec) in[1].raw = zv[v1];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (u == 1 && v1 >= nvec) break;
        float x[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = to_float(in[u].v[i]);
        acc.push8(x, (u == 0 ? v0 : v1) * 8, vocab);
      }
    }
  } else {
    for (int64_t c = threadIdx.x; c < vocab; c += kThreads) acc.push(to_float(z[c]), c);
  }
  const elementwise::OnlineSoftmax all = merge_block(part, acc);
  const float zmax = all.m, log_sum = logf(all.sum);
  const int32_t label = labels[r];
  const bool valid = label >= 0 && label < vocab, ignored = label == kIgnoreLabel;
  if (threadIdx.x == 0) {
    row_loss[r] = ignored ? 0.0f : valid ? log_sum - (to_float(z[label]) - zmax) : NAN;
    row_hit[r] = valid && all.arg == label ? 1.0f : 0.0f;
  }
  if (dscale == 0.0f) return;
  __syncthreads();  // every thread has read z[label] and the merged state before the row is overwritten
  const auto grad = [&](float x, int64_t c) {
    if (c >= vocab || ignored) return 0.0f;
    return valid ? elementwise::xent_grad(x, zmax, log_sum, c == label, dscale) : NAN;
  };
  if constexpr (kVec) {
    auto* zv = reinterpret_cast<uint4*>(z);
    for (int64_t v = threadIdx.x; v < ld / 8; v += kThreads) {
      Bf16x8 io;
      io.raw = zv[v];
#pragma unroll
      for (int i = 0; i < 8; ++i) io.v[i] = to_bfloat16(grad(to_float(io.v[i]), v * 8 + i));
      zv[v] = io.raw;
    }
  } else {
    for (int64_t c = threadIdx.x; c < ld; c += kThreads) z[c] = to_bfloat16(c < vocab ? grad(to_float(z[c]), c) : 0.0f);
  }
}

}  // namespace

cudaError_t classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld,
                            float dscale, float* row_loss, float* row_hit, double* stats, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  if (rows > 2147483647LL) return cudaErrorInvalidValue;
  const auto grid = static_cast<unsigned int>(rows);
  const bool vec = ld % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  if (vec)
    classifier_bf16_kernel<true><<<grid, kThreads, 0, s>>>(logits, labels, vocab, ld, dscale, row_loss, row_hit);
  else
    classifier_bf16_kernel<false><<<grid, kThreads, 0, s>>>(logits, labels, vocab, ld, dscale, row_loss, row_hit);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  reduce_pair_kernel<float><<<1, kThreads, 0, s>>>(row_loss, row_hit, static_cast<size_t>(rows), stats);
  return cudaGetLastError();
}

namespace {

// One warp per row of count * rows rows; row i (of its matrix) keeps columns j <= i + cols - rows. The exponent
// scale * s - max is rounded as the CPU rounds it (__fmul_rn: no fused multiply-add), so the maximum gives exactly
// exp(0) = 1. Pass 2 stores exp(.) in place, pass 3 scales it; each lane touches only its own columns.
__global__ void causal_softmax_forward_kernel(float* s, int64_t total_rows, int64_t rows, int64_t cols, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (row >= total_rows) return;
  const int64_t last = row % rows + cols - rows;  // the last column this row sees
  float* p = s + row * cols;
  float mx = -INFINITY;
  for (int64_t j = lane; j <= last; j += 32) mx = fmaxf(mx, __fmul_rn(scale, p[j]));
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int64_t j = lane; j <= last; j += 32) {
    const float e = expf(__fmul_rn(scale, p[j]) - mx);
    p[j] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int64_t j = lane; j <= last; j += 32) p[j] *= inv;
  for (int64_t j = last + 1 + lane; j < cols; j += 32) p[j] = 0.0f;
}

}  // namespace

cudaError_t causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale,
                                   cudaStream_t st) {
  if (count < 0 || rows < 1 || rows > cols) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const int64_t total_rows = count * rows;
  causal_softmax_forward_kernel<<<row_blocks(total_rows), kThreads, 0, st>>>(s, total_rows, rows, cols, scale);
  return cudaGetLastError();
}

namespace {

// One warp per row of count * T rows of T: dot = sum_{j <= i} p dp, then dp = scale p (dp - dot) for j <= i, 0 after.
__global__ void causal_softmax_backward_kernel(const float* p, float* dp, int64_t total_rows, int64_t T, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (row >= total_rows) return;
  const int64_t i = row % T;
  const float* pr = p + row * T;
  float* dr = dp + row * T;
  float dot = 0.0f;
  for (int64_t j = lane; j <= i; j += 32) dot += pr[j] * dr[j];
  dot = warp_sum(dot);
  for (int64_t j = lane; j <= i; j += 32) dr[j] = scale * pr[j] * (dr[j] - dot);
  for (int64_t j = i + 1 + lane; j < T; j += 32) dr[j] = 0.0f;
}

}  // namespace

cudaError_t causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale,
                                    cudaStream_t st) {
  if (count < 0 || T < 1) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const int64_t total_rows = count * T;
  causal_softmax_backward_kernel<<<row_blocks(total_rows), kThreads, 0, st>>>(p, dp, total_rows, T, scale);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
