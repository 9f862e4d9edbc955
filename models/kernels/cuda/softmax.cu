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

// One block per row, one column at a time (rows whose stride is not a multiple of 8, or unaligned): each thread an
// online softmax (running maximum and sum of exp relative to it) and the first argmax of its columns; the block's
// threads combined in a fixed tree; then the gradient over the row.
__global__ void classifier_bf16_kernel(BFloat16* logits, const int32_t* labels, int64_t vocab, int64_t ld,
                                       float dscale, float* row_loss, float* row_hit) {
  __shared__ elementwise::OnlineSoftmax part[kThreads];
  const int64_t r = blockIdx.x;
  BFloat16* z = logits + r * ld;
  elementwise::OnlineSoftmax acc = elementwise::online_softmax_start(vocab);
  for (int64_t c = threadIdx.x; c < vocab; c += kThreads) acc.push(to_float(z[c]), c);
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
  for (int64_t c = threadIdx.x; c < ld; c += kThreads) {
    float g = 0.0f;
    if (c < vocab && !ignored)
      g = valid ? elementwise::xent_grad(to_float(z[c]), zmax, log_sum, c == label, dscale) : NAN;
    z[c] = to_bfloat16(g);
  }
}

// Rows read eight columns at a time (16-byte aligned, ld a multiple of 8): llm.c's shape (its fused classifier), one
// block of kClassifierThreads per row, at most two blocks an SM (32 registers), so about two rows per SM are in
// flight, some 50 MB in all for GPT-2's 100 KB rows, and pass 2 should find the row that pass 1 read still in L2;
// pass 1 visits each thread's vectors from the last down (elementwise::OnlineSoftmax8), so the row's start, where
// pass 2 begins, is the latest read. Per element about five instructions a pass: a widening, a share of the vector's
// fmaxf, a subtract, a multiply and an ex2 (elementwise::exp2_fast) and an add in pass 1; a widening, two subtracts,
// a multiply, an ex2, a multiply and half a two-to-one rounding in pass 2. Vectors with padding columns or the label
// take a per-column path. The result (relative to the CPU's expf: about 1e-6, far inside a bf16 step) follows
// softmax_xent's and the CPU classifier's rules: the first argmax is the hit, a -inf column adds 0, a NaN or +inf
// column makes the row's loss NaN.
constexpr int kClassifierThreads = 1024;

// The warp's states merged by butterfly shuffles (OnlineSoftmax::merge is symmetric: every lane ends with the same
// bits, the same on every run).
__device__ __forceinline__ elementwise::OnlineSoftmax warp_merge(elementwise::OnlineSoftmax a) {
  for (int off = 16; off > 0; off /= 2) {
    elementwise::OnlineSoftmax o;
    o.m = __shfl_xor_sync(0xffffffffu, a.m, off);
    o.sum = __shfl_xor_sync(0xffffffffu, a.sum, off);
    o.arg = __shfl_xor_sync(0xffffffffu, static_cast<long long>(a.arg), off);
    a.merge(o);
  }
  return a;
}

__global__ void __launch_bounds__(kClassifierThreads, 2)
    classifier_bf16_vec_kernel(BFloat16* logits, const int32_t* labels, int vocab, int ld, float dscale,
                               float* row_loss, float* row_hit) {
  constexpr int T = kClassifierThreads, kWarps = T / 32;
  __shared__ elementwise::OnlineSoftmax warp_states[kWarps];
  __shared__ elementwise::OnlineSoftmax row_state;
  const int64_t r = blockIdx.x;
  BFloat16* z = logits + r * ld;
  auto* zv = reinterpret_cast<uint4*>(z);
  const int nvec = (vocab + 7) / 8;  // the vectors holding real columns
  const int tid = static_cast<int>(threadIdx.x);

  elementwise::OnlineSoftmax8 acc;
  acc.arg = vocab;  // none
  if (tid < nvec) {
    // The thread's last vector, then down by T; two loads in flight.
    for (int v0 = tid + (nvec - 1 - tid) / T * T; v0 >= 0; v0 -= 2 * T) {
      const int v1 = v0 - T;
      uint4 w0 = zv[v0], w1;
      if (v1 >= 0) w1 = zv[v1];
      float x[8];
      unpack_bf16x8(w0, x);
      if (vocab - v0 * 8 < 8) {  // the row's last vector, part padding
#pragma unroll
        for (int i = 1; i < 8; ++i)
          if (v0 * 8 + i >= vocab) x[i] = -INFINITY;
      }
      acc.push(x, v0 * 8);
      if (v1 < 0) break;
      unpack_bf16x8(w1, x);
      acc.push(x, v1 * 8);  // below the last vector: all real
    }
  }
  elementwise::OnlineSoftmax st = warp_merge(acc.state());
  if (tid % 32 == 0) warp_states[tid / 32] = st;
  __syncthreads();
  if (tid < 32) {
    st = warp_merge(warp_states[tid]);  // kWarps == 32: one state a lane
    if (tid == 0) row_state = st;
  }
  __syncthreads();
  const elementwise::OnlineSoftmax all = row_state;
  const float zmax = all.m, log_sum = logf(all.sum);
  const int32_t label = labels[r];
  const bool valid = label >= 0 && label < vocab, ignored = label == kIgnoreLabel;
  if (tid == 0) {
    row_loss[r] = ignored ? 0.0f : valid ? log_sum - (to_float(z[label]) - zmax) : NAN;
    row_hit[r] = valid && all.arg == label ? 1.0f : 0.0f;
  }
  if (dscale == 0.0f) return;
  __syncthreads();  // thread 0 has read z[label] before the row is overwritten
  const int lvec = ld / 8;
  if (ignored || !valid) {  // zeros; NaN in the real columns for a label outside the vocabulary
    for (int v = tid; v < lvec; v += T) {
      float g[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) g[i] = !ignored && v * 8 + i < vocab ? NAN : 0.0f;
      zv[v] = pack_bf16x8(g);
    }
    return;
  }
  // p = exp(x - zmax - log_sum) (the CPU's float argument) = 2^(that kLog2e); the gradient dscale (p - [label]).
  using elementwise::exp2_fast;
  using elementwise::kLog2e;
  const int full = vocab / 8;  // vectors whose eight columns are real
  const auto grad = [&](const uint4& w, int v) {
    float x[8], g[8];
    unpack_bf16x8(w, x);
    const int c0 = v * 8;
    if (v < full && (label < c0 || label >= c0 + 8)) {
#pragma unroll
      for (int i = 0; i < 8; ++i) g[i] = dscale * exp2_fast((x[i] - zmax - log_sum) * kLog2e);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int c = c0 + i;
        const float p = exp2_fast((x[i] - zmax - log_sum) * kLog2e);
        g[i] = c < vocab ? dscale * (p - (c == label ? 1.0f : 0.0f)) : 0.0f;
      }
    }
    return pack_bf16x8(g);
  };
  for (int v0 = tid; v0 < lvec; v0 += 2 * T) {  // two loads in flight, then their two stores
    const int v1 = v0 + T;
    const uint4 w0 = zv[v0];
    uint4 w1;
    if (v1 < lvec) w1 = zv[v1];
    zv[v0] = grad(w0, v0);
    if (v1 < lvec) zv[v1] = grad(w1, v1);
  }
}

}  // namespace

cudaError_t classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld,
                            float dscale, float* row_loss, float* row_hit, double* stats, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  if (rows > 2147483647LL) return cudaErrorInvalidValue;
  const auto grid = static_cast<unsigned int>(rows);
  // The vector kernel indexes a row's columns in int (labels are int32 already).
  const bool vec = ld % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0 && ld <= 2147483647LL;
  if (vec)
    classifier_bf16_vec_kernel<<<grid, kClassifierThreads, 0, s>>>(logits, labels, static_cast<int>(vocab),
                                                                    static_cast<int>(ld), dscale, row_loss, row_hit);
  else
    classifier_bf16_kernel<<<grid, kThreads, 0, s>>>(logits, labels, vocab, ld, dscale, row_loss, row_hit);
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
