// models/kernels/cuda/llama.cu: the Llama family's layers on the GPU: RMSNorm forward (one warp per row, the sum of
// squares in double as the CPU set) and backward (dx per row; dgamma in a fixed order over runs of rows, as
// layernorm.cu: no atomics), SwiGLU, and the rotary embeddings (one thread per pair); kernels first, then their
// launchers. The per-element arithmetic is elementwise.h's, shared with the CPU set. The kernels are templates over the
// activations' type: float, or bf16 for the transformer fast path (read widened, written rounded once); gamma, rstd and
// dgamma float32 either way.
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

// dx = rstd * (dy * gamma - xhat * mean(dy * gamma * xhat)); one warp per row. dx may alias dy.
template <class T>
__global__ void rmsnorm_backward_dx_kernel(const T* dy, const T* x, const float* gamma, const float* rstd, T* dx,
                                           int64_t rows, int64_t C) {
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
  for (int64_t c = lane; c < C; c += 32)
    store_act(out, c, s * (load_act(g, c) * gamma[c] - load_act(in, c) * s * mean));
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

__global__ void rmsnorm_param_finish_kernel(const float* partials, int64_t C, int64_t splits, float* dgamma) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = 0; k < splits; ++k) sum += partials[k * C + c];
    dgamma[c] += sum;
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
  rmsnorm_forward_kernel<T><<<row_blocks(rows), kThreads, 0, s>>>(x, gamma, y, rstd, rows, C, eps);
  return cudaGetLastError();
}

template <class T>
cudaError_t rmsnorm_backward(const T* dy, const T* x, const float* gamma, const float* rstd, T* dx, float* dgamma,
                             int64_t rows, int64_t C, float* partials, cudaStream_t s) {
  if (rows < 0 || C < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t splits = layernorm_splits(rows);  // dgamma first: it reads dy, which dx may alias
  const dim3 grid(static_cast<unsigned int>((C + 31) / 32), static_cast<unsigned int>(splits));
  rmsnorm_param_partials_kernel<T><<<grid, dim3(32, 32), 0, s>>>(dy, x, rstd, rows, C, splits, partials);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  rmsnorm_param_finish_kernel<<<blocks_for(static_cast<size_t>(C)), kThreads, 0, s>>>(partials, C, splits, dgamma);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  rmsnorm_backward_dx_kernel<T><<<row_blocks(rows), kThreads, 0, s>>>(dy, x, gamma, rstd, dx, rows, C);
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
                                           int64_t, float*, cudaStream_t);                                            \
  template cudaError_t swiglu_forward<T>(const T*, const T*, T*, size_t, cudaStream_t);                               \
  template cudaError_t swiglu_backward<T>(const T*, const T*, const T*, T*, T*, size_t, cudaStream_t);                \
  template cudaError_t rope<T>(T*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,  \
                               bool, cudaStream_t);
DPT_LLAMA_INSTANTIATE(float)
DPT_LLAMA_INSTANTIATE(BFloat16)
#undef DPT_LLAMA_INSTANTIATE

}  // namespace dpt::models::cuda_launch
