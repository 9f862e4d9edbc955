// models/kernels/cuda/llama.cu: the Llama family's layers on the GPU: RMSNorm forward (one warp per row, the sum of
// squares in double as the CPU set) and backward (dx per row; dgamma in a fixed order over runs of rows, as
// layernorm.cu: no atomics; bf16 rows held in registers as layernorm.cu's, read once, summed per lane in float32 and
// over the warp in double, the backward fused into one pass), SwiGLU, and the rotary embeddings (one thread per
// pair); kernels first, then their launchers. The per-element arithmetic is elementwise.h's, shared with the CPU set.
// The kernels are templates over the activations' type: float, or bf16 for the transformer fast path (read widened,
// written rounded once); gamma, rstd and dgamma float32 either way.
#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

template <class T>
__global__ void rmsnorm_forward_kernel(const T* x, const float* gamma, T* y, float* rstd, int64_t rows, int64_t C,
                                       float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  const T* in = x + r * C;
  double ss = 0.0;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = load_act(in, c);
    ss += static_cast<double>(v) * v;
  }
  const float s = static_cast<float>(1.0 / sqrt(warp_sum(ss) / static_cast<double>(C) + eps));
  T* out = y + r * C;
  for (int64_t c = lane; c < C; c += 32) store_act(out, c, load_act(in, c) * s * gamma[c]);
  if (lane == 0) rstd[r] = s;
}

// dx = rstd * (dy * gamma - xhat * mean(dy * gamma * xhat)) (+ residual, null: none, before the one rounding); one
// warp per row. dx may alias dy or residual.
template <class T>
__global__ void rmsnorm_backward_dx_kernel(const T* dy, const T* x, const float* gamma, const float* rstd, T* dx,
                                           int64_t rows, int64_t C, const T* residual) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  const T* g = dy + r * C;
  const T* in = x + r * C;
  const float s = rstd[r];
  double sum = 0.0;
  for (int64_t c = lane; c < C; c += 32)
    sum += static_cast<double>(load_act(g, c)) * gamma[c] * (load_act(in, c) * s);
  const float mean = static_cast<float>(warp_sum(sum) / static_cast<double>(C));
  T* out = dx + r * C;
  const T* res = residual ? residual + r * C : nullptr;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = s * (load_act(g, c) * gamma[c] - load_act(in, c) * s * mean);
    store_act(out, c, res ? v + load_act(res, c) : v);
  }
}

// The bf16 forward over a row held in registers (layernorm_forward_rows_kernel's walk: rows of up to 32 NV vectors,
// gamma 16-byte aligned and read eight at a time, the sum of squares per lane in float32, each vector in a fixed
// tree, then over the warp in double). y = x * rstd * gamma, rounded once. kAdd: the row normalised is sum's =
// bf16(x + addend), written first (load_norm_row; as layernorm_forward_rows_kernel's).
template <int NV, bool kAdd>
__global__ void rmsnorm_forward_rows_kernel(const BFloat16* x, const float* gamma, BFloat16* y, float* rstd,
                                            int64_t rows, int64_t C, float eps, const BFloat16* addend,
                                            BFloat16* sum) {
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
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] *= v[i];
    part += sum8(v);
  });
  const float s = static_cast<float>(1.0 / sqrt(warp_sum(static_cast<double>(part)) / static_cast<double>(C) + eps));
  auto* out = reinterpret_cast<uint4*>(y + r * C);
  for_lane_vectors<NV>(nvec, lane, [&](int k, int64_t vi) {
    float v[8], g[8];
    unpack_bf16x8(in[k].raw, v);
    load_params8(gamma, vi, g);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = v[i] * s * g[i];
    out[vi] = pack_bf16x8(v);
  });
  if (lane == 0) rstd[r] = s;
}

// The fused bf16 backward over rows held in registers, layernorm_backward_rows_kernel's walk (block `split` the
// split-th of gridDim.x runs, row_runs.h; per row dy, x and the residual (null: none, else 16-byte aligned) read once,
// together, gamma eight at a time): dx (+ residual; it and dy may be dx) written, and the columns' dy xhat added to
// the warp's sums in shared memory (WarpColumnSums, dynamic: warp_column_sums_bytes(1, C)), then the block's warps'
// in warp order into partials[split * C + t] (write_warp_column_sums' order; column_runs_reduce_kernel adds the runs).
template <int NV>
__global__ void __launch_bounds__(kThreads, 3)
    rmsnorm_backward_rows_kernel(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* rstd,
                                 BFloat16* dx, int64_t rows, int64_t C, float* partials, const BFloat16* residual) {
  static_assert(NV <= kLnBackwardMaxLaneVectors);
  // One array a warp within the default 48 KB of dynamic shared memory (LayerNorm's two ask for more).
  static_assert(kWarpsPerBlock * kLnBackwardRowMaxColumns * sizeof(float) <= 48 * 1024);
  extern __shared__ float warp_sums[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t split = blockIdx.x, splits = gridDim.x, nvec = C / 8;
  WarpColumnSums<1> acc(warp_sums, C);  // per column: the sum of dy xhat
  acc.zero<NV>(lane);
  const int64_t end = run_begin(split + 1, splits, rows);
  for (int64_t r = run_begin(split, splits, rows) + warp; r < end; r += kWarpsPerBlock) {
    Bf16x8 g[NV], in[NV], res[NV];
    load_lane_row(dy + r * C, nvec, lane, g);
    load_lane_row(x + r * C, nvec, lane, in);
    if (residual) load_lane_row(residual + r * C, nvec, lane, res);
    const float s = rstd[r];
    float part = 0.0f;
    for_lane_vectors<NV>(nvec, lane, [&](int k, int64_t vi) {
      float gv[8], xh[8], gm[8], t[8];
      unpack_bf16x8(g[k].raw, gv);
      unpack_bf16x8(in[k].raw, xh);
      load_params8(gamma, vi, gm);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        xh[i] *= s;
        t[i] = gv[i] * gm[i] * xh[i];
        acc.at(0, i, vi) += gv[i] * xh[i];
      }
      part += sum8(t);
    });
    const float mean = warp_mean(part, C);
    auto* out = reinterpret_cast<uint4*>(dx + r * C);
    for_lane_vectors<NV>(nvec, lane, [&](int k, int64_t vi) {
      float gv[8], xv[8], gm[8];
      unpack_bf16x8(g[k].raw, gv);
      unpack_bf16x8(in[k].raw, xv);
      load_params8(gamma, vi, gm);
#pragma unroll
      for (int i = 0; i < 8; ++i) gv[i] = s * (gv[i] * gm[i] - xv[i] * s * mean);
      store_vector_plus(out, vi, gv, residual != nullptr, res[k]);
    });
  }
  write_warp_column_sums<1>(warp_sums, C, split, splits, partials);  // a block per run
}

// grid (ceil(C / 32), splits), block 32 x 32: the run's sum of dy * xhat per column into partials[split * C + c].
template <class T>
__global__ void rmsnorm_param_partials_kernel(const T* dy, const T* x, const float* rstd, int64_t rows, int64_t C,
                                              int64_t splits, float* partials) {
  __shared__ float part[32][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x, split = blockIdx.y;
  const int64_t len = (rows + splits - 1) / splits, begin = split * len;
  const int64_t end = begin + len < rows ? begin + len : rows;
  float acc = 0.0f;
  if (c < C)
    for (int64_t r = begin + threadIdx.y; r < end; r += 32)
      acc += load_act(dy, r * C + c) * (load_act(x, r * C + c) * rstd[r]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sum = 0.0f;
    for (int k = 0; k < 32; ++k) sum += part[k][threadIdx.x];
    partials[split * C + c] = sum;
  }
}

// dgamma[c] += its runs' sums in order (= without `accumulate`).
__global__ void rmsnorm_param_finish_kernel(const float* partials, int64_t C, int64_t splits, float* dgamma,
                                            bool accumulate) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = 0; k < splits; ++k) sum += partials[k * C + c];
    dgamma[c] = accumulate ? dgamma[c] + sum : sum;
  }
}

template <class T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const auto k = static_cast<int64_t>(i);
    store_act(y, k, elementwise::swiglu(load_act(gate, k), load_act(up, k)));
  }
}

template <class T>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* dy, T* dgate, T* dup, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const auto k = static_cast<int64_t>(i);
    float dg, du;
    elementwise::swiglu_grad(load_act(gate, k), load_act(up, k), load_act(dy, k), dg, du);
    store_act(dgate, k, dg);
    store_act(dup, k, du);
  }
}

// One thread per (row, head, pair): rows * heads * half of them.
template <class A>
__global__ void rope_kernel(A* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0,
                            int64_t heads, int64_t half, int64_t stride, float sign) {
  const int64_t n = rows * heads * half;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, h = (k / half) % heads, r = k / (half * heads);
    const int64_t p = pos0 + r % T;
    A* v = x + r * stride + h * 2 * half;
    float a = load_act(v, i), b = load_act(v, i + half);
    elementwise::rope_pair(a, b, cos[p * half + i], sign * sin[p * half + i]);
    store_act(v, i, a);
    store_act(v, i + half, b);
  }
}

}  // namespace

template <class T>
cudaError_t rmsnorm_forward(const T* x, const float* gamma, T* y, float* rstd, int64_t rows, int64_t C, float eps,
                            cudaStream_t s) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if constexpr (sizeof(T) == 2) {
    if (rows_in_registers<T>(C, kLnRowMaxColumns, x, y, gamma))
      return with_lane_vectors<kLnMaxLaneVectors>(C, [&](auto nv) {
        rmsnorm_forward_rows_kernel<decltype(nv)::value, false>
            <<<row_blocks(rows), kThreads, 0, s>>>(x, gamma, y, rstd, rows, C, eps, nullptr, nullptr);
        return cudaGetLastError();
      });
  }
  rmsnorm_forward_kernel<T><<<row_blocks(rows), kThreads, 0, s>>>(x, gamma, y, rstd, rows, C, eps);
  return cudaGetLastError();
}

cudaError_t add_rmsnorm_forward(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma, BFloat16* y,
                                float* rstd, int64_t rows, int64_t C, float eps, cudaStream_t s) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (rows_in_registers<BFloat16>(C, kLnRowMaxColumns, a, b, sum, y, gamma))
    return with_lane_vectors<kLnMaxLaneVectors>(C, [&](auto nv) {
      rmsnorm_forward_rows_kernel<decltype(nv)::value, true>
          <<<row_blocks(rows), kThreads, 0, s>>>(a, gamma, y, rstd, rows, C, eps, b, sum);
      return cudaGetLastError();
    });
  if (const cudaError_t e = add_bf16(a, b, sum, static_cast<size_t>(rows * C), s); e != cudaSuccess) return e;
  return rmsnorm_forward<BFloat16>(sum, gamma, y, rstd, rows, C, eps, s);
}

cudaError_t rmsnorm_backward_runs(int64_t rows, int64_t C, int64_t& runs) {
  runs = 0;
  if (rows < 1 || C < 1 || C % 8 != 0 || C > kLnBackwardRowMaxColumns) return cudaSuccess;
  return with_lane_vectors<kLnBackwardMaxLaneVectors>(C, [&](auto nv) {
    return norm_backward_runs(rmsnorm_backward_rows_kernel<decltype(nv)::value>, warp_column_sums_bytes(1, C), rows,
                              runs);
  });
}

template <class T>
cudaError_t rmsnorm_backward(const T* dy, const T* x, const float* gamma, const float* rstd, T* dx, float* dgamma,
                             int64_t rows, int64_t C, const T* residual, float* partials, cudaStream_t s,
                             bool accumulate) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if constexpr (sizeof(T) == 2) {
    if (rows_in_registers<T>(C, kLnBackwardRowMaxColumns, dy, x, dx, gamma, residual)) {  // null: aligned
      int64_t splits = 0;
      const cudaError_t e = with_lane_vectors<kLnBackwardMaxLaneVectors>(C, [&](auto nv) {
        const auto kernel = rmsnorm_backward_rows_kernel<decltype(nv)::value>;
        const size_t smem = warp_column_sums_bytes(1, C);  // within the default 48 KB
        if (const cudaError_t a = norm_backward_runs(kernel, smem, rows, splits); a != cudaSuccess) return a;
        kernel<<<static_cast<unsigned int>(splits), kThreads, smem, s>>>(dy, x, gamma, rstd, dx, rows, C, partials,
                                                                          residual);
        return cudaGetLastError();
      });
      if (e != cudaSuccess) return e;
      column_runs_reduce_kernel<><<<dim3(static_cast<unsigned int>((C + 31) / 32), 1), dim3(32, 32), 0, s>>>(
          partials, C, splits, dgamma, nullptr, accumulate);
      return cudaGetLastError();
    }
  }
  const int64_t splits = layernorm_splits(rows);  // dgamma first: it reads dy, which dx may alias
  const dim3 grid(static_cast<unsigned int>((C + 31) / 32), static_cast<unsigned int>(splits));
  rmsnorm_param_partials_kernel<T><<<grid, dim3(32, 32), 0, s>>>(dy, x, rstd, rows, C, splits, partials);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  rmsnorm_param_finish_kernel<<<blocks_for(static_cast<size_t>(C)), kThreads, 0, s>>>(partials, C, splits, dgamma,
                                                                                       accumulate);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  rmsnorm_backward_dx_kernel<T><<<row_blocks(rows), kThreads, 0, s>>>(dy, x, gamma, rstd, dx, rows, C, residual);
  return cudaGetLastError();
}

template <class T>
cudaError_t swiglu_forward(const T* gate, const T* up, T* y, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  swiglu_forward_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(gate, up, y, n);
  return cudaGetLastError();
}

template <class T>
cudaError_t swiglu_backward(const T* gate, const T* up, const T* dy, T* dgate, T* dup, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  swiglu_backward_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(gate, up, dy, dgate, dup, n);
  return cudaGetLastError();
}

template <class T>
cudaError_t rope(T* x, const float* cos, const float* sin, int64_t rows, int64_t T_, int64_t pos0, int64_t heads,
                 int64_t head_dim, int64_t stride, bool inverse, cudaStream_t s) {
  if (rows < 0 || T_ < 1 || pos0 < 0 || heads < 0 || head_dim < 2 || head_dim % 2) return cudaErrorInvalidValue;
  const size_t n = static_cast<size_t>(rows * heads * (head_dim / 2));
  if (n == 0) return cudaSuccess;
  rope_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(x, cos, sin, rows, T_, pos0, heads, head_dim / 2, stride,
                                                     inverse ? -1.0f : 1.0f);
  return cudaGetLastError();
}

#define DPT_LLAMA_INSTANTIATE(T)                                                                                      \
  template cudaError_t rmsnorm_forward<T>(const T*, const float*, T*, float*, int64_t, int64_t, float, cudaStream_t); \
  template cudaError_t rmsnorm_backward<T>(const T*, const T*, const float*, const float*, T*, float*, int64_t,       \
                                           int64_t, const T*, float*, cudaStream_t, bool);                            \
  template cudaError_t swiglu_forward<T>(const T*, const T*, T*, size_t, cudaStream_t);                               \
  template cudaError_t swiglu_backward<T>(const T*, const T*, const T*, T*, T*, size_t, cudaStream_t);                \
  template cudaError_t rope<T>(T*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,  \
                               bool, cudaStream_t);
DPT_LLAMA_INSTANTIATE(float)
DPT_LLAMA_INSTANTIATE(BFloat16)
#undef DPT_LLAMA_INSTANTIATE

}  // namespace dpt::models::cuda_launch
