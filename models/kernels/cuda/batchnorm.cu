// models/kernels/cuda/batchnorm.cu: batch normalisation, split as SyncBatchNorm needs it (statistics, element-wise
// pass, backward reduction, backward data); kernels first within each step, then its launcher. The per-channel sums
// run in a fixed order (bn_splits runs per channel, then one thread per channel), so a rerun gives the same bits.
#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

// The run of channel `ch`'s values (flattened over (image, position), length n*hw) that block `split` sums.
struct BnRun {
  int64_t begin, end;
};

__device__ BnRun bn_run(int64_t count, int64_t splits, int64_t split) {
  const int64_t len = (count + splits - 1) / splits;
  const int64_t begin = split * len;
  return {begin, begin + len < count ? begin + len : count};
}

// Where value i of channel ch sits in x [n, c, hw]; div_hw divides by hw.
template <class Div>
__device__ __forceinline__ int64_t bn_offset(int64_t i, int64_t ch, int64_t c, int64_t hw, Div div_hw) {
  const int64_t img = div_hw(i);
  return (img * c + ch) * hw + (i - img * hw);
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

// One thread per channel: enough blocks of kThreads (bounded by blocks_for's cap; the kernels stride).
unsigned int channel_blocks(int64_t c) { return blocks_for(static_cast<size_t>(c)); }
size_t bn_total(const BnShape& bs) { return static_cast<size_t>(bs.n * bs.c * bs.hw); }
// Whether every index of x fits Div32 (then the kernels divide by hw and c with it).
bool bn_div32(const BnShape& bs) { return div32_fits(bs.n * bs.c * bs.hw); }

// grid (c, splits): partials[(ch * splits + split) * 2 + {0, 1}] = the run's sum of x and of x^2.
template <class Div>
__global__ void bn_stats_partials_kernel(const float* x, BnShape bs, int64_t splits, double* partials, Div div_hw) {
  const int64_t ch = blockIdx.x, split = blockIdx.y;
  const BnRun run = bn_run(bs.n * bs.hw, splits, split);
  double a = 0.0, b = 0.0;
  for (int64_t i = run.begin + threadIdx.x; i < run.end; i += kThreads) {
    const double v = x[bn_offset(i, ch, bs.c, bs.hw, div_hw)];
    a += v;
    b += v * v;
  }
  block_sum_pair(a, b);
  if (threadIdx.x == 0) {
    partials[(ch * splits + split) * 2] = a;
    partials[(ch * splits + split) * 2 + 1] = b;
  }
}

}  // namespace

cudaError_t bn_stats(const float* x, const BnShape& bs, double* partials, double* sums, cudaStream_t s) {
  const int64_t splits = bn_splits(bs);
  if (bs.c > 0) {
    const dim3 grid(static_cast<unsigned int>(bs.c), static_cast<unsigned int>(splits));
    if (bn_div32(bs))
      bn_stats_partials_kernel<<<grid, kThreads, 0, s>>>(x, bs, splits, partials, Div32(bs.hw));
    else
      bn_stats_partials_kernel<<<grid, kThreads, 0, s>>>(x, bs, splits, partials, Div64(bs.hw));
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  bn_finish_sums_kernel<<<channel_blocks(bs.c), kThreads, 0, s>>>(partials, bs.c, splits,
                                                                   static_cast<double>(bs.n * bs.hw), sums, nullptr,
                                                                   nullptr);
  return cudaGetLastError();
}

namespace {

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

// The channel of element i of x [n, c, hw]: (i / hw) % c, with div_hw and div_c dividing by hw and c.
template <class Div>
__device__ __forceinline__ int64_t bn_channel(int64_t i, int64_t c, Div div_hw, Div div_c) {
  const int64_t row = div_hw(i);  // image * c + channel
  return row - div_c(row) * c;
}

// y = x * coef[2ch] + coef[2ch + 1] over x [n, c, hw].
template <class Div>
__global__ void bn_scale_shift_kernel(const float* x, const float* coef, size_t total, int64_t c, Div div_hw,
                                      Div div_c, float* y) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = bn_channel(static_cast<int64_t>(i), c, div_hw, div_c);
    y[i] = x[i] * coef[2 * ch] + coef[2 * ch + 1];
  }
}

// bn_scale_shift_kernel over x [n, c, hw], with Div32 where the indices allow.
cudaError_t bn_scale_shift(const float* x, const float* coef, const BnShape& bs, float* y, cudaStream_t s) {
  const size_t total = bn_total(bs);
  if (bn_div32(bs))
    bn_scale_shift_kernel<<<blocks_for(total), kThreads, 0, s>>>(x, coef, total, bs.c, Div32(bs.hw), Div32(bs.c), y);
  else
    bn_scale_shift_kernel<<<blocks_for(total), kThreads, 0, s>>>(x, coef, total, bs.c, Div64(bs.hw), Div64(bs.c), y);
  return cudaGetLastError();
}

}  // namespace

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
  return bn_scale_shift(x, coef, bs, y, s);
}

namespace {

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

}  // namespace

cudaError_t bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, const BnShape& bs, float eps, float* y, float* coef,
                            cudaStream_t s) {
  const size_t total = bn_total(bs);
  if (total == 0) return cudaSuccess;
  bn_eval_channels_kernel<<<channel_blocks(bs.c), kThreads, 0, s>>>(gamma, beta, running_mean, running_var, bs.c,
                                                                     eps, coef);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return bn_scale_shift(x, coef, bs, y, s);
}

namespace {

// grid (c, splits): the run's sum of dy and of dy (x - mean) invstd (in double, as the CPU set).
template <class Div>
__global__ void bn_backward_partials_kernel(const float* dy, const float* x, const float* save_mean,
                                            const float* save_invstd, BnShape bs, int64_t splits, double* partials,
                                            Div div_hw) {
  const int64_t ch = blockIdx.x, split = blockIdx.y;
  const BnRun run = bn_run(bs.n * bs.hw, splits, split);
  const double mean = save_mean[ch], invstd = save_invstd[ch];
  double a = 0.0, b = 0.0;
  for (int64_t i = run.begin + threadIdx.x; i < run.end; i += kThreads) {
    const int64_t at = bn_offset(i, ch, bs.c, bs.hw, div_hw);
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

}  // namespace

cudaError_t bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                               const BnShape& bs, double* partials, double* sums, float* dgamma, float* dbeta,
                               cudaStream_t s) {
  const int64_t splits = bn_splits(bs);
  if (bs.c > 0) {
    const dim3 grid(static_cast<unsigned int>(bs.c), static_cast<unsigned int>(splits));
    if (bn_div32(bs))
      bn_backward_partials_kernel<<<grid, kThreads, 0, s>>>(dy, x, save_mean, save_invstd, bs, splits, partials,
                                                            Div32(bs.hw));
    else
      bn_backward_partials_kernel<<<grid, kThreads, 0, s>>>(dy, x, save_mean, save_invstd, bs, splits, partials,
                                                            Div64(bs.hw));
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  bn_finish_sums_kernel<<<channel_blocks(bs.c), kThreads, 0, s>>>(partials, bs.c, splits,
                                                                   static_cast<double>(bs.n * bs.hw), sums, dgamma,
                                                                   dbeta);
  return cudaGetLastError();
}

namespace {

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

template <class Div>
__global__ void bn_backward_data_kernel(const float* dy, const float* x, const float* coef, size_t total, int64_t c,
                                        Div div_hw, Div div_c, float* dx) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = bn_channel(static_cast<int64_t>(i), c, div_hw, div_c);
    const elementwise::BnBackward k{coef[3 * ch], coef[3 * ch + 1], coef[3 * ch + 2]};
    dx[i] = elementwise::bn_backward(dy[i], x[i], k);
  }
}

}  // namespace

cudaError_t bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                             const float* save_invstd, const double* sums, const BnShape& bs, float* dx, float* coef,
                             cudaStream_t s) {
  const size_t total = bn_total(bs);
  if (total == 0) return cudaSuccess;
  bn_backward_channels_kernel<<<channel_blocks(bs.c), kThreads, 0, s>>>(gamma, save_mean, save_invstd, sums, bs.c,
                                                                         coef);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (bn_div32(bs))
    bn_backward_data_kernel<<<blocks_for(total), kThreads, 0, s>>>(dy, x, coef, total, bs.c, Div32(bs.hw),
                                                                    Div32(bs.c), dx);
  else
    bn_backward_data_kernel<<<blocks_for(total), kThreads, 0, s>>>(dy, x, coef, total, bs.c, Div64(bs.hw),
                                                                    Div64(bs.c), dx);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
