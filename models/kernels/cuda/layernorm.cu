// models/kernels/cuda/layernorm.cu: LayerNorm forward (one warp per row) and backward (dx per row; dgamma and dbeta
// in a fixed order over runs of rows: no atomics); kernels first, then their launcher. The kernels are templates over
// the activations' type (x, y, dy, dx): float, or bf16 for the transformer fast path (read widened, written rounded
// once); gamma, beta, mean, rstd and the parameter gradients are float32 either way.
#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

// One warp per row. The sums are doubles (C / 32 additions per lane, then the warp): the CPU set's arithmetic, so
// mean and rstd almost always round to the same floats. y = (x - mean) * rstd * gamma + beta; y may alias x (each
// lane reads and writes only its own columns, the last pass after the shuffles). vec: bf16 rows read and written
// eight columns at a time (for_lane_columns).
template <class T>
__global__ void layernorm_forward_kernel(const T* x, const float* gamma, const float* beta, T* y, float* mean,
                                         float* rstd, int64_t rows, int64_t C, float eps, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;  // the whole warp: r is the warp's
  const T* in = x + r * C;
  double sum = 0.0;
  for_lane_columns(in, in, C, lane, vec, [&](int64_t, float v, float) { sum += v; });
  const float m = static_cast<float>(warp_sum(sum) / static_cast<double>(C));
  double var = 0.0;
  for_lane_columns(in, in, C, lane, vec, [&](int64_t, float v, float) {
    const float d = v - m;
    var += static_cast<double>(d) * d;
  });
  const float s = static_cast<float>(1.0 / sqrt(warp_sum(var) / static_cast<double>(C) + eps));
  T* out = y + r * C;
  map_lane_columns(in, in, out, C, lane, vec,
                   [&](int64_t c, float v, float) { return (v - m) * s * gamma[c] + beta[c]; });
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

}  // namespace

template <class T>
cudaError_t layernorm_forward(const T* x, const float* gamma, const float* beta, T* y, float* mean, float* rstd,
                              int64_t rows, int64_t C, float eps, cudaStream_t s) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const bool vec = rows_vectorizable<T>(C, x, y);
  layernorm_forward_kernel<T><<<row_blocks(rows), kThreads, 0, s>>>(x, gamma, beta, y, mean, rstd, rows, C, eps, vec);
  return cudaGetLastError();
}
template cudaError_t layernorm_forward<float>(const float*, const float*, const float*, float*, float*, float*,
                                              int64_t, int64_t, float, cudaStream_t);
template cudaError_t layernorm_forward<BFloat16>(const BFloat16*, const float*, const float*, BFloat16*, float*,
                                                 float*, int64_t, int64_t, float, cudaStream_t);

namespace {

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma; one warp per row, the two
// means summed in double (as the CPU set). dx may alias dy (a lane's columns are read before it writes them). vec:
// bf16 rows eight columns at a time (for_lane_columns).
template <class T>
__global__ void layernorm_backward_dx_kernel(const T* dy, const T* x, const float* gamma, const float* mean,
                                             const float* rstd, T* dx, int64_t rows, int64_t C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  const T* g = dy + r * C;
  const T* in = x + r * C;
  const float m = mean[r], s = rstd[r];
  double sum_d = 0.0, sum_dx = 0.0;
  for_lane_columns(g, in, C, lane, vec, [&](int64_t c, float gv, float xv) {
    const float xhat = (xv - m) * s;
    const float d = gv * gamma[c];
    sum_d += d;
    sum_dx += static_cast<double>(d) * xhat;
  });
  const float mean_d = static_cast<float>(warp_sum(sum_d) / static_cast<double>(C));
  const float mean_dx = static_cast<float>(warp_sum(sum_dx) / static_cast<double>(C));
  T* out = dx + r * C;
  map_lane_columns(g, in, out, C, lane, vec, [&](int64_t c, float gv, float xv) {
    const float xhat = (xv - m) * s;
    return s * (gv * gamma[c] - mean_d - xhat * mean_dx);
  });
}

// grid (ceil(C / 32), splits), block 32 x 32: run `split` of the rows (layernorm_splits), 32 columns. Thread (x, y)
// sums rows y, y + 32, ... of the run in column c; then row y = 0 adds the 32 partials of its column in order.
// partials[split * C + c] = the run's sum of dy * xhat, partials[(splits + split) * C + c] its sum of dy.
template <class T>
__global__ void layernorm_param_partials_kernel(const T* dy, const T* x, const float* mean, const float* rstd,
                                                int64_t rows, int64_t C, int64_t splits, float* partials) {
  __shared__ float part_g[32][33], part_b[32][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x, split = blockIdx.y;
  const int64_t len = (rows + splits - 1) / splits, begin = split * len;
  const int64_t end = begin + len < rows ? begin + len : rows;
  float acc_g = 0.0f, acc_b = 0.0f;
  if (c < C)
    for (int64_t r = begin + threadIdx.y; r < end; r += 32) {
      const float g = load_act(dy, r * C + c);
      acc_g += g * ((load_act(x, r * C + c) - mean[r]) * rstd[r]);
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

}  // namespace

template <class T>
cudaError_t layernorm_backward(const T* dy, const T* x, const float* gamma, const float* mean, const float* rstd,
                               T* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C, float* partials,
                               cudaStream_t s) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  // dgamma and dbeta first: they read dy, which dx may alias.
  const int64_t splits = layernorm_splits(rows);
  const dim3 grid(static_cast<unsigned int>((C + 31) / 32), static_cast<unsigned int>(splits));
  layernorm_param_partials_kernel<T><<<grid, dim3(32, 32), 0, s>>>(dy, x, mean, rstd, rows, C, splits, partials);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  layernorm_param_finish_kernel<<<blocks_for(static_cast<size_t>(C)), kThreads, 0, s>>>(partials, C, splits, dgamma,
                                                                                         dbeta);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const bool vec = rows_vectorizable<T>(C, dy, x, dx);
  layernorm_backward_dx_kernel<T><<<row_blocks(rows), kThreads, 0, s>>>(dy, x, gamma, mean, rstd, dx, rows, C, vec);
  return cudaGetLastError();
}
template cudaError_t layernorm_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                               float*, float*, float*, int64_t, int64_t, float*, cudaStream_t);
template cudaError_t layernorm_backward<BFloat16>(const BFloat16*, const BFloat16*, const float*, const float*,
                                                  const float*, BFloat16*, float*, float*, int64_t, int64_t, float*,
                                                  cudaStream_t);

}  // namespace dpt::models::cuda_launch
