// models/kernels/cuda/kernels.cu: the CUDA kernels of the GPU kernel set (GEMMs go to cuBLAS and convolutions
// to cuDNN, in cuda_kernels.cpp). Kernels first, launchers after; each launcher takes an explicit stream and
// returns cudaGetLastError(). The per-element arithmetic of the updates, of batch normalisation, of max
// pooling and of GELU is shared with the CPU set (elementwise.h). Every reduction runs in a fixed order, without
// float atomics, so a rerun gives the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>
#include <cmath>

#include <cub/device/device_radix_sort.cuh>

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

__global__ void clip_by_norm_kernel(float* x, size_t n, const double* ss, double max_norm) {
  const double coef = elementwise::clip_coefficient(*ss, max_norm);
  if (coef >= 1.0) return;
  const auto alpha = static_cast<float>(coef);
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

// ---- convolutional networks ---------------------------------------------------------------------------------

__global__ void relu_kernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = elementwise::relu(x[i]);
}

__global__ void add_kernel(const float* a, const float* b, float* y, size_t n, bool relu) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = elementwise::bias_act(a[i], b[i], relu);  // a + b, then max(., 0) when relu
}


// The run of channel `ch`'s values (flattened over (image, position), length n*hw) that block `split` sums.
struct BnRun {
  int64_t begin, end;
};
__device__ BnRun bn_run(int64_t count, int64_t splits, int64_t split) {
  const int64_t len = (count + splits - 1) / splits;
  const int64_t begin = split * len;
  return {begin, begin + len < count ? begin + len : count};
}
// Where value i of channel ch sits in x [n, c, hw].
__device__ int64_t bn_offset(int64_t i, int64_t ch, int64_t c, int64_t hw) {
  const int64_t img = i / hw;
  return (img * c + ch) * hw + (i - img * hw);
}

// grid (c, splits): partials[(ch * splits + split) * 2 + {0, 1}] = the run's sum of x and of x^2.
__global__ void bn_stats_partials_kernel(const float* x, BnShape bs, int64_t splits, double* partials) {
  const int64_t ch = blockIdx.x, split = blockIdx.y;
  const BnRun run = bn_run(bs.n * bs.hw, splits, split);
  double a = 0.0, b = 0.0;
  for (int64_t i = run.begin + threadIdx.x; i < run.end; i += kThreads) {
    const double v = x[bn_offset(i, ch, bs.c, bs.hw)];
    a += v;
    b += v * v;
  }
  block_sum_pair(a, b);
  if (threadIdx.x == 0) {
    partials[(ch * splits + split) * 2] = a;
    partials[(ch * splits + split) * 2 + 1] = b;
  }
}

// grid (c, splits): the run's sum of dy and of dy (x - mean) invstd (in double, as the CPU set).
__global__ void bn_backward_partials_kernel(const float* dy, const float* x, const float* save_mean,
                                            const float* save_invstd, BnShape bs, int64_t splits, double* partials) {
  const int64_t ch = blockIdx.x, split = blockIdx.y;
  const BnRun run = bn_run(bs.n * bs.hw, splits, split);
  const double mean = save_mean[ch], invstd = save_invstd[ch];
  double a = 0.0, b = 0.0;
  for (int64_t i = run.begin + threadIdx.x; i < run.end; i += kThreads) {
    const int64_t at = bn_offset(i, ch, bs.c, bs.hw);
    const double g = dy[at];
    a += g;
    b += g * (x[at] - mean) * invstd;
  }
  block_sum_pair(a, b);
  if (threadIdx.x == 0) {
    partials[(ch * splits + split) * 2] = a;
    partials[(ch * splits + split) * 2 + 1] = b;
  }
}

// One thread per channel adds its runs in order: sums[ch], sums[c + ch]; sums[2c] = count (also when c = 0).
// With dgamma/dbeta (backward), they accumulate the second and the first sum.
__global__ void bn_finish_sums_kernel(const double* partials, int64_t c, int64_t splits, double count, double* sums,
                                      float* dgamma, float* dbeta) {
  for (int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; ch < c;
       ch += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double a = 0.0, b = 0.0;
    for (int64_t k = 0; k < splits; ++k) {
      a += partials[(ch * splits + k) * 2];
      b += partials[(ch * splits + k) * 2 + 1];
    }
    sums[ch] = a;
    sums[c + ch] = b;
    if (dgamma) {
      dgamma[ch] += static_cast<float>(b);
      dbeta[ch] += static_cast<float>(a);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) sums[2 * c] = count;
}

// Per channel, from the (possibly all-reduced) sums: the saved and the running statistics, and the scale and
// shift of y = x * coef[2ch] + coef[2ch + 1].
__global__ void bn_train_channels_kernel(const float* gamma, const float* beta, const double* sums, int64_t c,
                                         float eps, float momentum, float* running_mean, float* running_var,
                                         float* save_mean, float* save_invstd, float* coef) {
  for (int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; ch < c;
       ch += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const elementwise::BnMoments m = elementwise::bn_moments(sums[ch], sums[c + ch], sums[2 * c], eps);
    save_mean[ch] = m.mean;
    save_invstd[ch] = m.invstd;
    running_mean[ch] = elementwise::lerp_running(running_mean[ch], m.mean, momentum);
    running_var[ch] = elementwise::lerp_running(running_var[ch], m.unbiased_var, momentum);
    const float a = gamma[ch] * m.invstd;
    coef[2 * ch] = a;
    coef[2 * ch + 1] = beta[ch] - m.mean * a;
  }
}

__global__ void bn_eval_channels_kernel(const float* gamma, const float* beta, const float* running_mean,
                                        const float* running_var, int64_t c, float eps, float* coef) {
  for (int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; ch < c;
       ch += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float invstd = 1.0f / sqrtf(running_var[ch] + eps);
    const float a = gamma[ch] * invstd;
    coef[2 * ch] = a;
    coef[2 * ch + 1] = beta[ch] - running_mean[ch] * a;
  }
}

// y = x * coef[2ch] + coef[2ch + 1] over x [n, c, hw].
__global__ void bn_scale_shift_kernel(const float* x, const float* coef, size_t total, int64_t c, int64_t hw,
                                      float* y) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = static_cast<int64_t>(i) / hw % c;
    y[i] = x[i] * coef[2 * ch] + coef[2 * ch + 1];
  }
}

__global__ void bn_backward_channels_kernel(const float* gamma, const float* save_mean, const float* save_invstd,
                                            const double* sums, int64_t c, float* coef) {
  for (int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; ch < c;
       ch += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const elementwise::BnBackward k = elementwise::bn_backward_coefficients(
        gamma[ch], save_mean[ch], save_invstd[ch], sums[ch], sums[c + ch], sums[2 * c]);
    coef[3 * ch] = k.a;
    coef[3 * ch + 1] = k.b;
    coef[3 * ch + 2] = k.c;
  }
}

__global__ void bn_backward_data_kernel(const float* dy, const float* x, const float* coef, size_t total, int64_t c,
                                        int64_t hw, float* dx) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = static_cast<int64_t>(i) / hw % c;
    const elementwise::BnBackward k{coef[3 * ch], coef[3 * ch + 1], coef[3 * ch + 2]};
    dx[i] = elementwise::bn_backward(dy[i], x[i], k);
  }
}

// One thread per output [n, c, p, q]: its window, r then s.
__global__ void maxpool_forward_kernel(const float* x, float* y, int32_t* argmax, PoolShape ps, size_t total) {
  for (size_t o = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; o < total;
       o += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t q = static_cast<int64_t>(o) % ps.q;
    const int64_t p = static_cast<int64_t>(o) / ps.q % ps.p;
    const int64_t plane = static_cast<int64_t>(o) / (ps.p * ps.q);
    const float* in = x + plane * ps.h * ps.w;
    int32_t at;
    const float best = elementwise::maxpool_window(in, ps, p, q, at);
    y[o] = best;
    argmax[o] = at;
  }
}

// The windows that contain input row (or column) i: outputs lo..hi (empty when lo > hi).
__device__ void windows_over(int64_t i, int64_t kernel, int64_t stride, int64_t pad, int64_t outs, int64_t& lo,
                             int64_t& hi) {
  // o*stride - pad <= i <= o*stride - pad + kernel - 1
  const int64_t first = i + pad - kernel + 1;  // o*stride >= first
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  hi = (i + pad) / stride;
  if (hi > outs - 1) hi = outs - 1;
}

// One thread per input element [n, c, h, w]: the sum, in (p, q) order, of the dy whose argmax it is.
__global__ void maxpool_backward_kernel(const float* dy, const int32_t* argmax, float* dx, PoolShape ps,
                                        size_t total) {
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t w = static_cast<int64_t>(e) % ps.w;
    const int64_t h = static_cast<int64_t>(e) / ps.w % ps.h;
    const int64_t plane = static_cast<int64_t>(e) / (ps.h * ps.w);
    const auto self = static_cast<int32_t>(h * ps.w + w);
    int64_t p_lo, p_hi, q_lo, q_hi;
    windows_over(h, ps.kernel, ps.stride, ps.pad, ps.p, p_lo, p_hi);
    windows_over(w, ps.kernel, ps.stride, ps.pad, ps.q, q_lo, q_hi);
    const int64_t base = plane * ps.p * ps.q;
    float acc = 0.0f;
    for (int64_t p = p_lo; p <= p_hi; ++p)
      for (int64_t q = q_lo; q <= q_hi; ++q)
        if (argmax[base + p * ps.q + q] == self) acc += dy[base + p * ps.q + q];
    dx[e] = acc;
  }
}

__global__ void avgpool_forward_kernel(const float* x, float* y, int64_t rows, int64_t hw, float inv) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* row = x + i * hw;
    float sum = 0.0f;
    for (int64_t j = 0; j < hw; ++j) sum += row[j];
    y[i] = sum * inv;
  }
}

__global__ void avgpool_backward_kernel(const float* dy, float* dx, size_t total, int64_t hw, float inv) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dx[i] = dy[static_cast<int64_t>(i) / hw] * inv;
}

// ---- low precision ------------------------------------------------------------------------------------------

// float -> the narrow type, round to nearest even; and back (exact).
template <class T>
__device__ T to_narrow(float x);
template <>
__device__ __nv_bfloat16 to_narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __half to_narrow<__half>(float x) { return __float2half_rn(x); }
__device__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ float to_float(__half v) { return __half2float(v); }

// dst[i] for i < rows * cols (packed) from src's row i / cols, column i % cols (row stride ld); the division is
// skipped when the rows are contiguous (ld == cols: every convolution operand, most GEMM operands).
template <class T>
__global__ void narrow_kernel(const float* src, int64_t cols, int64_t ld, T* dst, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    size_t from = i;
    if (ld != cols) {
      const size_t r = i / static_cast<size_t>(cols);
      from = r * static_cast<size_t>(ld) + (i - r * static_cast<size_t>(cols));
    }
    dst[i] = to_narrow<T>(src[from]);
  }
}

template <class T>
__global__ void widen_kernel(const T* src, float* dst, size_t n, bool accumulate) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = accumulate ? dst[i] + to_float(src[i]) : to_float(src[i]);
}


// ---- low precision, batched --------------------------------------------------------------------------------

// dst[i] for i < batch * rows * cols (packed: matrix m at m * rows * cols, row stride cols) from matrix m = i /
// (rows * cols) of src, which starts at src + m * stride, row r at r * ld.
template <class T>
__global__ void narrow_batched_kernel(const float* src, int64_t rows, int64_t cols, int64_t ld, int64_t stride, T* dst,
                                      size_t total) {
  const int64_t per = rows * cols;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t m = static_cast<int64_t>(i) / per;
    const int64_t rem = static_cast<int64_t>(i) - m * per;
    const int64_t r = rem / cols;
    dst[i] = to_narrow<T>(src[m * stride + r * ld + (rem - r * cols)]);
  }
}

// ---- transformers (GPT) ------------------------------------------------------------------------------------

// The row kernels below give each row one warp: kThreads / 32 rows per block.
constexpr int kWarpsPerBlock = kThreads / 32;
static_assert(kWarpsPerBlock == kRowsPerBlock, "launch.h's kRowsPerBlock is the row kernels' warps per block");
unsigned int row_blocks(int64_t rows) {
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

// y[r, c] = wte[tokens[r], c] + wpe[r mod T, c]; NaN for the whole row when the token is outside [0, vocab).
__global__ void embedding_forward_kernel(const int32_t* tokens, const float* wte, const float* wpe, float* y,
                                         size_t total, int64_t T, int64_t C, int64_t vocab) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t r = static_cast<int64_t>(i) / C, c = static_cast<int64_t>(i) - r * C;
    const int32_t tok = tokens[r];
    y[i] = tok >= 0 && tok < vocab ? wte[static_cast<int64_t>(tok) * C + c] + wpe[(r % T) * C + c] : NAN;
  }
}

// dwpe[t, c] += dy[t, c] + dy[T + t, c] + ..., added one by one onto the old value, as the CPU's row loop does.
// i < total = min(T, rows) * C indexes dwpe [T, C] directly.
__global__ void embedding_dwpe_kernel(const float* dy, float* dwpe, int64_t rows, int64_t T, int64_t C, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t t = static_cast<int64_t>(i) / C, c = static_cast<int64_t>(i) - t * C;
    float acc = dwpe[i];
    for (int64_t r = t; r < rows; r += T) acc += dy[r * C + c];
    dwpe[i] = acc;
  }
}

__global__ void iota_kernel(int32_t* ids, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    ids[i] = static_cast<int32_t>(i);
}

// With the rows sorted by token (stable: a token's rows in row order), the thread of (position, c) whose position
// starts a run of one token adds that run's dy[row, c], in order, onto dwte[token, c]. Other threads do nothing;
// a negative token (forward wrote NaN for its row) adds nothing.
__global__ void embedding_dwte_kernel(const int32_t* sorted_tokens, const int32_t* sorted_rows, const float* dy,
                                      float* dwte, int64_t rows, int64_t C, int64_t vocab, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t pos = static_cast<int64_t>(i) / C, c = static_cast<int64_t>(i) - pos * C;
    const int32_t tok = sorted_tokens[pos];
    if (tok < 0 || tok >= vocab || (pos > 0 && sorted_tokens[pos - 1] == tok)) continue;
    float* w = dwte + static_cast<int64_t>(tok) * C + c;
    float acc = *w;
    for (int64_t j = pos; j < rows && sorted_tokens[j] == tok; ++j)
      acc += dy[static_cast<int64_t>(sorted_rows[j]) * C + c];
    *w = acc;
  }
}

// One warp per row. The sums are doubles (C / 32 additions per lane, then the warp): the CPU set's arithmetic, so
// mean and rstd almost always round to the same floats. y = (x - mean) * rstd * gamma + beta; y may alias x (each
// lane reads and writes only its own columns, the last pass after the shuffles).
__global__ void layernorm_forward_kernel(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                         float* rstd, int64_t rows, int64_t C, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;  // the whole warp: r is the warp's
  const float* in = x + r * C;
  double sum = 0.0;
  for (int64_t c = lane; c < C; c += 32) sum += in[c];
  const float m = static_cast<float>(warp_sum(sum) / static_cast<double>(C));
  double var = 0.0;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = in[c] - m;
    var += static_cast<double>(d) * d;
  }
  const float s = static_cast<float>(1.0 / sqrt(warp_sum(var) / static_cast<double>(C) + eps));
  float* out = y + r * C;
  for (int64_t c = lane; c < C; c += 32) out[c] = (in[c] - m) * s * gamma[c] + beta[c];
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma; one warp per row, the two
// means summed in double (as the CPU set). dx may alias dy (a lane's columns are read before it writes them).
__global__ void layernorm_backward_dx_kernel(const float* dy, const float* x, const float* gamma, const float* mean,
                                             const float* rstd, float* dx, int64_t rows, int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  const float* g = dy + r * C;
  const float* in = x + r * C;
  const float m = mean[r], s = rstd[r];
  double sum_d = 0.0, sum_dx = 0.0;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (in[c] - m) * s;
    const float d = g[c] * gamma[c];
    sum_d += d;
    sum_dx += static_cast<double>(d) * xhat;
  }
  const float mean_d = static_cast<float>(warp_sum(sum_d) / static_cast<double>(C));
  const float mean_dx = static_cast<float>(warp_sum(sum_dx) / static_cast<double>(C));
  float* out = dx + r * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (in[c] - m) * s;
    out[c] = s * (g[c] * gamma[c] - mean_d - xhat * mean_dx);
  }
}

// grid (ceil(C / 32), splits), block 32 x 32: run `split` of the rows (layernorm_splits), 32 columns. Thread (x, y)
// sums rows y, y + 32, ... of the run in column c; then row y = 0 adds the 32 partials of its column in order.
// partials[split * C + c] = the run's sum of dy * xhat, partials[(splits + split) * C + c] its sum of dy.
__global__ void layernorm_param_partials_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
                                                int64_t rows, int64_t C, int64_t splits, float* partials) {
  __shared__ float part_g[32][33], part_b[32][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x, split = blockIdx.y;
  const int64_t len = (rows + splits - 1) / splits, begin = split * len;
  const int64_t end = begin + len < rows ? begin + len : rows;
  float acc_g = 0.0f, acc_b = 0.0f;
  if (c < C)
    for (int64_t r = begin + threadIdx.y; r < end; r += 32) {
      const float g = dy[r * C + c];
      acc_g += g * ((x[r * C + c] - mean[r]) * rstd[r]);
      acc_b += g;
    }
  part_g[threadIdx.y][threadIdx.x] = acc_g;
  part_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sg = 0.0f, sb = 0.0f;
    for (int k = 0; k < 32; ++k) {
      sg += part_g[k][threadIdx.x];
      sb += part_b[k][threadIdx.x];
    }
    partials[split * C + c] = sg;
    partials[(splits + split) * C + c] = sb;
  }
}

// One thread per column adds its runs in order: dgamma[c] += the sum of dy * xhat, dbeta[c] += the sum of dy.
__global__ void layernorm_param_finish_kernel(const float* partials, int64_t C, int64_t splits, float* dgamma,
                                              float* dbeta) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sg = 0.0f, sb = 0.0f;
    for (int64_t k = 0; k < splits; ++k) {
      sg += partials[k * C + c];
      sb += partials[(splits + k) * C + c];
    }
    dgamma[c] += sg;
    dbeta[c] += sb;
  }
}

__global__ void split_token_windows_kernel(const float* windows, int32_t* input, int32_t* next, int64_t T,
                                           size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t r = static_cast<int64_t>(i) / T, t = static_cast<int64_t>(i) - r * T;
    const float* w = windows + r * (T + 1) + t;
    input[i] = static_cast<int32_t>(w[0]);
    next[i] = static_cast<int32_t>(w[1]);
  }
}

__global__ void gelu_forward_kernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = elementwise::gelu(x[i]);
}

__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dx[i] = dy[i] * elementwise::gelu_grad(x[i]);
}

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

cudaError_t clip_by_norm(float* x, size_t n, const double* ss, double max_norm, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  clip_by_norm_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, ss, max_norm);
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

// ---- low precision ------------------------------------------------------------------------------------------

static_assert(sizeof(__nv_bfloat16) == kNarrowBytes && sizeof(__half) == kNarrowBytes);

cudaError_t narrow(const float* src, int64_t rows, int64_t cols, int64_t ld, void* dst, Precision p, cudaStream_t s) {
  if (p == Precision::F32 || rows < 0 || cols < 0 || (rows > 1 && ld < cols)) return cudaErrorInvalidValue;
  const size_t total = static_cast<size_t>(rows * cols);
  if (total == 0) return cudaSuccess;
  if (p == Precision::BF16)
    narrow_kernel<<<blocks_for(total), kThreads, 0, s>>>(src, cols, ld, static_cast<__nv_bfloat16*>(dst), total);
  else
    narrow_kernel<<<blocks_for(total), kThreads, 0, s>>>(src, cols, ld, static_cast<__half*>(dst), total);
  return cudaGetLastError();
}

cudaError_t widen(const void* src, float* dst, size_t n, Precision p, bool accumulate, cudaStream_t s) {
  if (p == Precision::F32) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (p == Precision::BF16)
    widen_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(src), dst, n, accumulate);
  else
    widen_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const __half*>(src), dst, n, accumulate);
  return cudaGetLastError();
}

cudaError_t narrow_batched(const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                           void* dst, Precision p, cudaStream_t s) {
  if (p == Precision::F32 || batch < 0 || rows < 0 || cols < 0 || stride < 0 || (rows > 1 && ld < cols))
    return cudaErrorInvalidValue;
  const size_t total = static_cast<size_t>(batch * rows * cols);
  if (total == 0) return cudaSuccess;
  if (p == Precision::BF16)
    narrow_batched_kernel<<<blocks_for(total), kThreads, 0, s>>>(src, rows, cols, ld, stride,
                                                                 static_cast<__nv_bfloat16*>(dst), total);
  else
    narrow_batched_kernel<<<blocks_for(total), kThreads, 0, s>>>(src, rows, cols, ld, stride,
                                                                 static_cast<__half*>(dst), total);
  return cudaGetLastError();
}

// ---- convolutional networks ---------------------------------------------------------------------------------

cudaError_t relu(const float* x, float* y, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  relu_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t add(const float* a, const float* b, float* y, size_t n, bool relu, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n, relu);
  return cudaGetLastError();
}

namespace {
// One thread per channel: enough blocks of kThreads (bounded by blocks_for's cap; the kernels stride).
unsigned int channel_blocks(int64_t c) { return blocks_for(static_cast<size_t>(c)); }
size_t bn_total(const BnShape& bs) { return static_cast<size_t>(bs.n * bs.c * bs.hw); }
}  // namespace

cudaError_t bn_stats(const float* x, const BnShape& bs, double* partials, double* sums, cudaStream_t s) {
  const int64_t splits = bn_splits(bs);
  if (bs.c > 0) {
    const dim3 grid(static_cast<unsigned int>(bs.c), static_cast<unsigned int>(splits));
    bn_stats_partials_kernel<<<grid, kThreads, 0, s>>>(x, bs, splits, partials);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  bn_finish_sums_kernel<<<channel_blocks(bs.c), kThreads, 0, s>>>(partials, bs.c, splits,
                                                                   static_cast<double>(bs.n * bs.hw), sums, nullptr,
                                                                   nullptr);
  return cudaGetLastError();
}

cudaError_t bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums,
                             const BnShape& bs, float eps, float momentum, float* running_mean, float* running_var,
                             float* save_mean, float* save_invstd, float* y, float* coef, cudaStream_t s) {
  if (bs.c == 0) return cudaSuccess;
  bn_train_channels_kernel<<<channel_blocks(bs.c), kThreads, 0, s>>>(gamma, beta, sums, bs.c, eps, momentum,
                                                                      running_mean, running_var, save_mean,
                                                                      save_invstd, coef);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const size_t total = bn_total(bs);
  if (total == 0) return cudaSuccess;
  bn_scale_shift_kernel<<<blocks_for(total), kThreads, 0, s>>>(x, coef, total, bs.c, bs.hw, y);
  return cudaGetLastError();
}

cudaError_t bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, const BnShape& bs, float eps, float* y, float* coef,
                            cudaStream_t s) {
  const size_t total = bn_total(bs);
  if (total == 0) return cudaSuccess;
  bn_eval_channels_kernel<<<channel_blocks(bs.c), kThreads, 0, s>>>(gamma, beta, running_mean, running_var, bs.c,
                                                                     eps, coef);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  bn_scale_shift_kernel<<<blocks_for(total), kThreads, 0, s>>>(x, coef, total, bs.c, bs.hw, y);
  return cudaGetLastError();
}

cudaError_t bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                               const BnShape& bs, double* partials, double* sums, float* dgamma, float* dbeta,
                               cudaStream_t s) {
  const int64_t splits = bn_splits(bs);
  if (bs.c > 0) {
    const dim3 grid(static_cast<unsigned int>(bs.c), static_cast<unsigned int>(splits));
    bn_backward_partials_kernel<<<grid, kThreads, 0, s>>>(dy, x, save_mean, save_invstd, bs, splits, partials);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  bn_finish_sums_kernel<<<channel_blocks(bs.c), kThreads, 0, s>>>(partials, bs.c, splits,
                                                                   static_cast<double>(bs.n * bs.hw), sums, dgamma,
                                                                   dbeta);
  return cudaGetLastError();
}

cudaError_t bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                             const float* save_invstd, const double* sums, const BnShape& bs, float* dx, float* coef,
                             cudaStream_t s) {
  const size_t total = bn_total(bs);
  if (total == 0) return cudaSuccess;
  bn_backward_channels_kernel<<<channel_blocks(bs.c), kThreads, 0, s>>>(gamma, save_mean, save_invstd, sums, bs.c,
                                                                         coef);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  bn_backward_data_kernel<<<blocks_for(total), kThreads, 0, s>>>(dy, x, coef, total, bs.c, bs.hw, dx);
  return cudaGetLastError();
}

cudaError_t maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps, cudaStream_t s) {
  const size_t total = static_cast<size_t>(ps.n * ps.c * ps.p * ps.q);
  if (total == 0) return cudaSuccess;
  maxpool_forward_kernel<<<blocks_for(total), kThreads, 0, s>>>(x, y, argmax, ps, total);
  return cudaGetLastError();
}

cudaError_t maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps,
                               cudaStream_t s) {
  const size_t total = static_cast<size_t>(ps.n * ps.c * ps.h * ps.w);
  if (total == 0) return cudaSuccess;
  maxpool_backward_kernel<<<blocks_for(total), kThreads, 0, s>>>(dy, argmax, dx, ps, total);
  return cudaGetLastError();
}

cudaError_t avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  const float inv = 1.0f / static_cast<float>(hw);  // as the CPU set: a product by the rounded 1/hw
  avgpool_forward_kernel<<<blocks_for(static_cast<size_t>(rows)), kThreads, 0, s>>>(x, y, rows, hw, inv);
  return cudaGetLastError();
}

cudaError_t avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw, cudaStream_t s) {
  const size_t total = static_cast<size_t>(rows * hw);
  if (total == 0) return cudaSuccess;
  const float inv = 1.0f / static_cast<float>(hw);
  avgpool_backward_kernel<<<blocks_for(total), kThreads, 0, s>>>(dy, dx, total, hw, inv);
  return cudaGetLastError();
}


// ---- transformers (GPT) -------------------------------------------------------------------------------------

namespace {
// The embedding backward's scratch: row ids, sorted tokens, sorted row ids (rows int32 each), then CUB's temporary
// storage, each region 256-byte aligned.
constexpr size_t kScratchAlign = 256;
size_t align_up(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// CUB's temporary storage for sorting n (token, row) pairs; nothing runs on the device.
cudaError_t sort_temp_bytes(int n, size_t& bytes) {
  return cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr), n);
}
}  // namespace

cudaError_t embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows,
                              int64_t T, int64_t C, int64_t vocab, cudaStream_t s) {
  if (rows < 0 || T < 1 || C < 0) return cudaErrorInvalidValue;
  const size_t total = static_cast<size_t>(rows * C);
  if (total == 0) return cudaSuccess;
  embedding_forward_kernel<<<blocks_for(total), kThreads, 0, s>>>(tokens, wte, wpe, y, total, T, C, vocab);
  return cudaGetLastError();
}

cudaError_t embedding_backward_scratch_bytes(int64_t rows, size_t& bytes) {
  if (rows < 0 || rows > INT_MAX) return cudaErrorInvalidValue;
  size_t temp = 0;
  if (const cudaError_t e = sort_temp_bytes(static_cast<int>(rows), temp); e != cudaSuccess) return e;
  bytes = 3 * align_up(static_cast<size_t>(rows) * sizeof(int32_t)) + align_up(temp);
  return cudaSuccess;
}

cudaError_t embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows,
                               int64_t T, int64_t C, int64_t vocab, void* scratch, size_t scratch_bytes,
                               cudaStream_t s) {
  if (rows < 0 || rows > INT_MAX || T < 1 || C < 0) return cudaErrorInvalidValue;
  if (rows == 0 || C == 0) return cudaSuccess;
  const int64_t positions = rows < T ? rows : T;  // the rows of dwpe that get anything
  const size_t npe = static_cast<size_t>(positions * C);
  embedding_dwpe_kernel<<<blocks_for(npe), kThreads, 0, s>>>(dy, dwpe, rows, T, C, npe);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  const int n = static_cast<int>(rows);
  size_t temp = 0;
  if (const cudaError_t e = sort_temp_bytes(n, temp); e != cudaSuccess) return e;
  const size_t ids_bytes = align_up(static_cast<size_t>(rows) * sizeof(int32_t));
  if (scratch_bytes < 3 * ids_bytes + temp) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(scratch);
  auto* ids = reinterpret_cast<int32_t*>(base);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(base + ids_bytes);
  auto* sorted_ids = reinterpret_cast<int32_t*>(base + 2 * ids_bytes);
  iota_kernel<<<blocks_for(static_cast<size_t>(rows)), kThreads, 0, s>>>(ids, rows);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  // All 32 bits of the key: negative (invalid) tokens sort first and are skipped.
  if (const cudaError_t e = cub::DeviceRadixSort::SortPairs(base + 3 * ids_bytes, temp, tokens, sorted_tokens, ids,
                                                            sorted_ids, n, 0, 32, s);
      e != cudaSuccess)
    return e;
  const size_t total = static_cast<size_t>(rows * C);
  embedding_dwte_kernel<<<blocks_for(total), kThreads, 0, s>>>(sorted_tokens, sorted_ids, dy, dwte, rows, C, vocab,
                                                               total);
  return cudaGetLastError();
}

cudaError_t layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                              float* rstd, int64_t rows, int64_t C, float eps, cudaStream_t s) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  layernorm_forward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(x, gamma, beta, y, mean, rstd, rows, C, eps);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                               const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C,
                               float* partials, cudaStream_t s) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  // dgamma and dbeta first: they read dy, which dx may alias.
  const int64_t splits = layernorm_splits(rows);
  const dim3 grid(static_cast<unsigned int>((C + 31) / 32), static_cast<unsigned int>(splits));
  layernorm_param_partials_kernel<<<grid, dim3(32, 32), 0, s>>>(dy, x, mean, rstd, rows, C, splits, partials);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  layernorm_param_finish_kernel<<<blocks_for(static_cast<size_t>(C)), kThreads, 0, s>>>(partials, C, splits, dgamma,
                                                                                         dbeta);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  layernorm_backward_dx_kernel<<<row_blocks(rows), kThreads, 0, s>>>(dy, x, gamma, mean, rstd, dx, rows, C);
  return cudaGetLastError();
}

cudaError_t split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T,
                                cudaStream_t s) {
  if (n < 0 || T < 1) return cudaErrorInvalidValue;
  const size_t total = static_cast<size_t>(n * T);
  if (total == 0) return cudaSuccess;
  split_token_windows_kernel<<<blocks_for(total), kThreads, 0, s>>>(windows, input, next, T, total);
  return cudaGetLastError();
}

cudaError_t gelu_forward(const float* x, float* y, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t gelu_backward(const float* x, const float* dy, float* dx, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale,
                                   cudaStream_t st) {
  if (count < 0 || rows < 1 || rows > cols) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const int64_t total_rows = count * rows;
  causal_softmax_forward_kernel<<<row_blocks(total_rows), kThreads, 0, st>>>(s, total_rows, rows, cols, scale);
  return cudaGetLastError();
}

cudaError_t causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale,
                                    cudaStream_t st) {
  if (count < 0 || T < 1) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const int64_t total_rows = count * T;
  causal_softmax_backward_kernel<<<row_blocks(total_rows), kThreads, 0, st>>>(p, dp, total_rows, T, scale);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
