// models/kernels/cuda/kernels.cu: the CUDA kernels of the GPU kernel set (GEMMs go to cuBLAS, in
// cuda_kernels.cpp). Kernels first, launchers after; each launcher takes an explicit stream and returns
// cudaGetLastError(). The per-element arithmetic of the updates is shared with the CPU set (elementwise.h).
#include <cfloat>
#include <cmath>

#include "models/kernels/cuda/launch.h"

namespace dpt::models::cuda_launch {
namespace {

constexpr int kThreads = 256;

// Enough blocks to cover n with a grid-stride loop, capped so huge n does not launch millions of blocks.
unsigned int blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(b < 65535 ? (b == 0 ? 1 : b) : 65535);
}

__global__ void bias_act_kernel(const float* x, const float* bias, float* y, size_t n, int64_t cols, bool relu) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = elementwise::bias_act(x[i], bias[i % cols], relu);
}

// db[c] += sum_r dy[r, c]. A block owns 32 columns; its 32x32 threads stride over rows (coalesced along c),
// then sum the 32 partials of each column in a fixed order: deterministic, unlike atomics.
__global__ void bias_grad_kernel(const float* dy, float* db, int64_t rows, int64_t cols) {
  __shared__ float part[32][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 32) acc += dy[r * cols + c];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float s = 0.0f;
    for (int k = 0; k < 32; ++k) s += part[k][threadIdx.x];
    db[c] += s;
  }
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dx[i] = elementwise::relu_backward(y[i], dy[i]);
}

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
  const bool valid = label >= 0 && label < cols;
  if (lane == 0) {
    row_loss[r] = valid ? log_sum - (z[label] - zmax) : NAN;
    row_hit[r] = valid && arg == label ? 1.0f : 0.0f;
  }
  if (dlogits) {
    const float inv_rows = 1.0f / static_cast<float>(rows);
    float* d = dlogits + r * cols;
    for (int64_t c = lane; c < cols; c += 32) {
      const float p = expf(z[c] - zmax - log_sum);
      d[c] = valid ? (p - (c == label ? 1.0f : 0.0f)) * inv_rows : NAN;
    }
  }
}

// One block adds a and b (n each) in a fixed order into out[0] and out[1] (doubles).
template <class T>
__global__ void reduce_pair_kernel(const T* a, const T* b, size_t n, double* out) {
  __shared__ double sa[kThreads], sb[kThreads];
  double x = 0.0, y = 0.0;
  for (size_t i = threadIdx.x; i < n; i += kThreads) {
    x += static_cast<double>(a[i]);
    if (b) y += static_cast<double>(b[i]);
  }
  sa[threadIdx.x] = x;
  sb[threadIdx.x] = y;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      sa[threadIdx.x] += sa[threadIdx.x + w];
      sb[threadIdx.x] += sb[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[0] += sa[0];
    if (b) out[1] += sb[0];
  }
}

__global__ void sgd_kernel(float* param, const float* grad, float* buf, size_t n, SgdParams p) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    elementwise::sgd(param[i], grad[i], buf ? buf + i : nullptr, p);
}

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, size_t n, elementwise::AdamWStep st) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    elementwise::adamw(param[i], grad[i], m[i], v[i], st);
}

__global__ void scale_kernel(float* x, size_t n, float alpha) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] *= alpha;
}

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

cudaError_t bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu,
                     cudaStream_t s) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  if (n == 0) return cudaSuccess;
  bias_act_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, bias, y, n, cols, relu);
  return cudaGetLastError();
}

cudaError_t bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 block(32, 32);
  const dim3 grid(static_cast<unsigned int>((cols + 31) / 32));
  bias_grad_kernel<<<grid, block, 0, s>>>(dy, db, rows, cols);
  return cudaGetLastError();
}

cudaError_t relu_backward(const float* y, const float* dy, float* dx, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, dy, dx, n);
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

cudaError_t sgd_update(float* param, const float* grad, float* buf, size_t n, SgdParams p, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  sgd_kernel<<<blocks_for(n), kThreads, 0, s>>>(param, grad, buf, n, p);
  return cudaGetLastError();
}

cudaError_t adamw_update(float* param, const float* grad, float* m, float* v, size_t n, elementwise::AdamWStep st,
                         cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(param, grad, m, v, n, st);
  return cudaGetLastError();
}

cudaError_t scale(float* x, size_t n, float alpha, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, alpha);
  return cudaGetLastError();
}

cudaError_t sum_squares(const float* x, size_t n, double* partials, double* out, cudaStream_t s) {
  // partials is fully written (blocks past n write 0), then summed in a fixed order into *out (set, not added).
  if (const cudaError_t e = cudaMemsetAsync(out, 0, sizeof(double), s); e != cudaSuccess) return e;
  sum_squares_kernel<<<kSumSquaresBlocks, kThreads, 0, s>>>(x, n, partials);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  reduce_pair_kernel<double><<<1, kThreads, 0, s>>>(partials, nullptr, kSumSquaresBlocks, out);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
