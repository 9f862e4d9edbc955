// models/kernels/cuda/layernorm.cu: LayerNorm forward (one warp per row) and backward (dx per row; dgamma and dbeta
// in a fixed order over runs of rows: no atomics); kernels first, then their launcher. The kernels are templates over
// the activations' type (x, y, dy, dx): float, or bf16 for the transformer fast path (read widened, written rounded
// once); gamma, beta, mean, rstd and the parameter gradients are float32 either way. Bf16 rows of up to 4096
// columns (a multiple of 8, 16-byte aligned) are held in registers: each read once, forward and backward (the
// backward's dx and its parameter sums in one pass), gamma and beta read eight at a time, the row sums per lane in
// float32 (a few float ulps from the double sums of the kernels that walk the row again per pass).
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

// The bf16 forward over a row read once (rows of up to 32 NV vectors; gamma and beta 16-byte aligned, read eight at
// a time). Each lane sums its columns in float32 (each vector in a fixed tree, the vectors in order: a few float
// ulps from a sum in double, and no float-to-double conversion per element, which runs at an eighth of the float
// rate), the warp the lanes' sums in double. Both passes over the registers: the mean, then the squared deviations.
// kAdd: the row normalised is sum's = bf16(x + addend) (16-byte aligned), written first (add_bf16's one rounding;
// the rows of x and addend are in registers before it: sum may alias either); a separate instance, so that the plain
// norm keeps its registers (ptxas, sm_90: 40 both at 768 columns, 94 and 164 at 4096).
template <int NV, bool kAdd>
__global__ void layernorm_forward_rows_kernel(const BFloat16* x, const float* gamma, const float* beta, BFloat16* y,
                                              float* mean, float* rstd, int64_t rows, int64_t C, float eps,
                                              const BFloat16* addend, BFloat16* sum) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  const int64_t nvec = C / 8;
  Bf16x8 in[NV];
  load_norm_row<kAdd>(x, addend, sum, r * C, nvec, lane, in);
  float part = 0.0f;
  for_lane_vectors<NV>(nvec, lane, [&](int k, int64_t) {
    float v[8];
    unpack_bf16x8(in[k].raw, v);
    part += sum8(v);
  });
  const float m = warp_mean(part, C);
  part = 0.0f;
  for_lane_vectors<NV>(nvec, lane, [&](int k, int64_t) {
    float v[8];
    unpack_bf16x8(in[k].raw, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = (v[i] - m) * (v[i] - m);
    part += sum8(v);
  });
  const float s = static_cast<float>(1.0 / sqrt(warp_sum(static_cast<double>(part)) / static_cast<double>(C) + eps));
  auto* out = reinterpret_cast<uint4*>(y + r * C);
  for_lane_vectors<NV>(nvec, lane, [&](int k, int64_t vi) {
    float v[8], g[8], b[8];
    unpack_bf16x8(in[k].raw, v);
    load_params8(gamma, vi, g);
    load_params8(beta, vi, b);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = (v[i] - m) * s * g[i] + b[i];
    out[vi] = pack_bf16x8(v);
  });
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
  if constexpr (sizeof(T) == 2) {
    if (rows_in_registers<T>(C, kLnRowMaxColumns, x, y, gamma, beta))
      return with_lane_vectors<kLnMaxLaneVectors>(C, [&](auto nv) {
        layernorm_forward_rows_kernel<decltype(nv)::value, false>
            <<<row_blocks(rows), kThreads, 0, s>>>(x, gamma, beta, y, mean, rstd, rows, C, eps, nullptr, nullptr);
        return cudaGetLastError();
      });
  }
  const bool vec = rows_vectorizable<T>(C, x, y);
  layernorm_forward_kernel<T><<<row_blocks(rows), kThreads, 0, s>>>(x, gamma, beta, y, mean, rstd, rows, C, eps, vec);
  return cudaGetLastError();
}

cudaError_t add_layernorm_forward(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                  const float* beta, BFloat16* y, float* mean, float* rstd, int64_t rows, int64_t C,
                                  float eps, cudaStream_t s) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (rows_in_registers<BFloat16>(C, kLnRowMaxColumns, a, b, sum, y, gamma, beta))
    return with_lane_vectors<kLnMaxLaneVectors>(C, [&](auto nv) {
      layernorm_forward_rows_kernel<decltype(nv)::value, true>
          <<<row_blocks(rows), kThreads, 0, s>>>(a, gamma, beta, y, mean, rstd, rows, C, eps, b, sum);
      return cudaGetLastError();
    });
  if (const cudaError_t e = add_bf16(a, b, sum, static_cast<size_t>(rows * C), s); e != cudaSuccess) return e;
  return layernorm_forward<BFloat16>(sum, gamma, beta, y, mean, rstd, rows, C, eps, s);
}
template cudaError_t layernorm_forward<float>(const float*, const float*, const float*, float*, float*, float*,
                                              int64_t, int64_t, float, cudaStream_t);
template cudaError_t layernorm_forward<BFloat16>(const BFloat16*, const float*, const float*, BFloat16*, float*,
                                                 float*, int64_t, int64_t, float, cudaStream_t);

namespace {

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma; one warp per row, the two
// means summed in double (as the CPU set); residual (null: none) added before the one rounding. dx may alias dy or
// residual (a lane's columns are read before it writes them). vec: bf16 rows eight columns at a time
// (for_lane_columns).
template <class T>
__global__ void layernorm_backward_dx_kernel(const T* dy, const T* x, const float* gamma, const float* mean,
                                             const float* rstd, T* dx, int64_t rows, int64_t C, bool vec,
                                             const T* residual) {
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
  const T* res = residual ? residual + r * C : nullptr;
  map_lane_columns(g, in, out, C, lane, vec, [&](int64_t c, float gv, float xv) {
    const float xhat = (xv - m) * s;
    const float v = s * (gv * gamma[c] - mean_d - xhat * mean_dx);
    return res ? v + load_act(res, c) : v;
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

// One thread per column adds its runs in order: dgamma[c] += the sum of dy * xhat, dbeta[c] += the sum of dy (=
// without `accumulate`).
__global__ void layernorm_param_finish_kernel(const float* partials, int64_t C, int64_t splits, float* dgamma,
                                              float* dbeta, bool accumulate) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sg = 0.0f, sb = 0.0f;
    for (int64_t k = 0; k < splits; ++k) {
      sg += partials[k * C + c];
      sb += partials[(splits + k) * C + c];
    }
    dgamma[c] = accumulate ? dgamma[c] + sg : sg;
    dbeta[c] = accumulate ? dbeta[c] + sb : sb;
  }
}

// The fused bf16 backward over rows held in registers (launch.h: block `split` the split-th of `splits` runs,
// row_runs.h's run_begin). Each warp: the run's first row + warp, + kWarpsPerBlock, ...; per row dy, x and the
// residual (null: none, else 16-byte aligned) read once, together, gamma eight at a time (16-byte aligned), the two
// means summed as the forward's (float32 per lane, each vector in a fixed tree; double over the warp), dx written (it
// may alias dy or the residual: the lane's vectors are in registers first) with the residual added before its
// rounding, and its columns' dy xhat and dy added to the warp's sums in shared memory (WarpColumnSums, dynamic:
// warp_column_sums_bytes(2, C)). Then the block adds its warps' sums in warp order and writes the run's partials,
// partials[split * C + t] (dy xhat) and partials[(splits + split) * C + t] (dy) in write_warp_column_sums' order.
// Launch bounds ask three blocks' registers per SM (24 warps streaming rows; the sums' 48 KB a block at 768 columns
// let four; at four vectors a lane, 1024 columns, 80 registers spill 8 bytes on sm_90, and two blocks' 128 spilled
// 68).
template <int NV>
__global__ void __launch_bounds__(kThreads, 3)
    layernorm_backward_rows_kernel(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* mean,
                                   const float* rstd, BFloat16* dx, int64_t rows, int64_t C, int64_t splits,
                                   float* partials, const BFloat16* residual) {
  static_assert(NV <= kLnBackwardMaxLaneVectors);
  extern __shared__ float warp_sums[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t split = blockIdx.x, nvec = C / 8;
  WarpColumnSums<2> acc(warp_sums, C);  // per column: the sums of dy xhat (0), of dy (1)
  acc.zero<NV>(lane);
  const int64_t end = run_begin(split + 1, splits, rows);
  for (int64_t r = run_begin(split, splits, rows) + warp; r < end; r += kWarpsPerBlock) {
    Bf16x8 g[NV], in[NV], res[NV];
    load_lane_row(dy + r * C, nvec, lane, g);
    load_lane_row(x + r * C, nvec, lane, in);
    if (residual) load_lane_row(residual + r * C, nvec, lane, res);
    const float m = mean[r], s = rstd[r];
    float part_d = 0.0f, part_dx = 0.0f;
    for_lane_vectors<NV>(nvec, lane, [&](int k, int64_t vi) {
      float gv[8], xh[8], gm[8], d[8], dxh[8];
      unpack_bf16x8(g[k].raw, gv);
      unpack_bf16x8(in[k].raw, xh);
      load_params8(gamma, vi, gm);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        xh[i] = (xh[i] - m) * s;
        d[i] = gv[i] * gm[i];
        dxh[i] = d[i] * xh[i];
        acc.at(0, i, vi) += gv[i] * xh[i];
        acc.at(1, i, vi) += gv[i];
      }
      part_d += sum8(d);
      part_dx += sum8(dxh);
    });
    const float mean_d = warp_mean(part_d, C), mean_dx = warp_mean(part_dx, C);
    auto* out = reinterpret_cast<uint4*>(dx + r * C);
    for_lane_vectors<NV>(nvec, lane, [&](int k, int64_t vi) {
      float gv[8], xh[8], gm[8];
      unpack_bf16x8(g[k].raw, gv);
      unpack_bf16x8(in[k].raw, xh);
      load_params8(gamma, vi, gm);
#pragma unroll
      for (int i = 0; i < 8; ++i) gv[i] = s * (gv[i] * gm[i] - mean_d - (xh[i] - m) * s * mean_dx);
      store_vector_plus(out, vi, gv, residual != nullptr, res[k]);
    });
  }
  write_warp_column_sums<2>(warp_sums, C, split, splits, partials);
}

// The fused backward's shared memory allowed where past the default 48 KB (64 KB at 1024 columns; allow_dynamic_smem:
// the host call once per device, kernel and larger size, not per launch), then its runs over `rows`
// (norm_backward_runs: one wave of the blocks the GPU holds).
template <class K>
cudaError_t layernorm_backward_rows_ready(K* kernel, size_t smem, int64_t rows, int64_t& runs) {
  if (const cudaError_t a = allow_dynamic_smem(kernel, smem); a != cudaSuccess) return a;
  return norm_backward_runs(kernel, smem, rows, runs);
}

}  // namespace

cudaError_t layernorm_backward_runs(int64_t rows, int64_t C, int64_t& runs) {
  runs = 0;
  if (rows < 1 || C < 1 || C % 8 != 0 || C > kLnBackwardRowMaxColumns) return cudaSuccess;
  return with_lane_vectors<kLnBackwardMaxLaneVectors>(C, [&](auto nv) {
    return layernorm_backward_rows_ready(layernorm_backward_rows_kernel<decltype(nv)::value>,
                                         warp_column_sums_bytes(2, C), rows, runs);
  });
}

template <class T>
cudaError_t layernorm_backward(const T* dy, const T* x, const float* gamma, const float* mean, const float* rstd,
                               T* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C, const T* residual,
                               float* partials, cudaStream_t s, bool accumulate) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if constexpr (sizeof(T) == 2) {
    if (rows_in_registers<T>(C, kLnBackwardRowMaxColumns, dy, x, dx, gamma, residual)) {  // null: aligned
      const size_t smem = warp_column_sums_bytes(2, C);
      int64_t splits = 0;
      const cudaError_t e = with_lane_vectors<kLnBackwardMaxLaneVectors>(C, [&](auto nv) {
        const auto kernel = layernorm_backward_rows_kernel<decltype(nv)::value>;
        if (const cudaError_t a = layernorm_backward_rows_ready(kernel, smem, rows, splits); a != cudaSuccess)
          return a;
        kernel<<<static_cast<unsigned int>(splits), kThreads, smem, s>>>(dy, x, gamma, mean, rstd, dx, rows, C, splits,
                                                                          partials, residual);
        return cudaGetLastError();
      });
      if (e != cudaSuccess) return e;
      column_runs_reduce_kernel<><<<dim3(static_cast<unsigned int>((C + 31) / 32), 2), dim3(32, 32), 0, s>>>(
          partials, C, splits, dgamma, dbeta, accumulate);
      return cudaGetLastError();
    }
  }
  // dgamma and dbeta first: they read dy, which dx may alias.
  const int64_t splits = layernorm_splits(rows);
  const dim3 grid(static_cast<unsigned int>((C + 31) / 32), static_cast<unsigned int>(splits));
  layernorm_param_partials_kernel<T><<<grid, dim3(32, 32), 0, s>>>(dy, x, mean, rstd, rows, C, splits, partials);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  layernorm_param_finish_kernel<<<blocks_for(static_cast<size_t>(C)), kThreads, 0, s>>>(partials, C, splits, dgamma,
                                                                                         dbeta, accumulate);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const bool vec = rows_vectorizable<T>(C, dy, x, dx);
  layernorm_backward_dx_kernel<T>
      <<<row_blocks(rows), kThreads, 0, s>>>(dy, x, gamma, mean, rstd, dx, rows, C, vec, residual);
  return cudaGetLastError();
}
template cudaError_t layernorm_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                               float*, float*, float*, int64_t, int64_t, const float*, float*,
                                               cudaStream_t, bool);
template cudaError_t layernorm_backward<BFloat16>(const BFloat16*, const BFloat16*, const float*, const float*,
                                                  const float*, BFloat16*, float*, float*, int64_t, int64_t,
                                                  const BFloat16*, float*, cudaStream_t, bool);

}  // namespace dpt::models::cuda_launch
