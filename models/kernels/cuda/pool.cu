// models/kernels/cuda/pool.cu: max pooling (with its argmax, and a gather backward that needs no atomics) and
// global average pooling; each kernel followed by its launcher.
#include <algorithm>

#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

// One thread per output [n, c, p, q]: its window, r then s. `div_q` and `div_p` divide by ps.q and ps.p.
template <class Div>
__global__ void maxpool_forward_kernel(const float* x, float* y, int32_t* argmax, PoolShape ps, size_t total,
                                       Div div_q, Div div_p) {
  for (size_t o = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; o < total;
       o += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t row = div_q(static_cast<int64_t>(o));  // plane * p + p
    const int64_t q = static_cast<int64_t>(o) - row * ps.q;
    const int64_t plane = div_p(row);
    const int64_t p = row - plane * ps.p;
    const float* in = x + plane * ps.h * ps.w;
    int32_t at;
    const float best = elementwise::maxpool_window(in, ps, p, q, at);
    y[o] = best;
    argmax[o] = at;
  }
}

}  // namespace

cudaError_t maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps, cudaStream_t s) {
  const size_t total = static_cast<size_t>(ps.n * ps.c * ps.p * ps.q);
  if (total == 0) return cudaSuccess;
  if (div32_fits(static_cast<int64_t>(total)))
    maxpool_forward_kernel<<<blocks_for(total), kThreads, 0, s>>>(x, y, argmax, ps, total, Div32(ps.q), Div32(ps.p));
  else
    maxpool_forward_kernel<<<blocks_for(total), kThreads, 0, s>>>(x, y, argmax, ps, total, Div64(ps.q), Div64(ps.p));
  return cudaGetLastError();
}

namespace {

// The windows that contain input row (or column) i: outputs lo..hi (empty when lo > hi). div_stride divides by
// `stride`.
template <class Div>
__device__ void windows_over(int64_t i, int64_t kernel, int64_t stride, int64_t pad, int64_t outs, Div div_stride,
                             int64_t& lo, int64_t& hi) {
  // o*stride - pad <= i <= o*stride - pad + kernel - 1
  const int64_t first = i + pad - kernel + 1;  // o*stride >= first
  lo = first <= 0 ? 0 : div_stride(first + stride - 1);
  hi = div_stride(i + pad);
  if (hi > outs - 1) hi = outs - 1;
}

// One thread per input element [n, c, h, w]: the sum, in (p, q) order, of the dy whose argmax it is (a gather:
// no atomics, and the CPU's order of additions). `div_w`, `div_h` and `div_stride` divide by ps.w, ps.h and
// ps.stride.
template <class Div>
__global__ void maxpool_backward_kernel(const float* dy, const int32_t* argmax, float* dx, PoolShape ps,
                                        size_t total, Div div_w, Div div_h, Div div_stride) {
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t row = div_w(static_cast<int64_t>(e));  // plane * h + h
    const int64_t w = static_cast<int64_t>(e) - row * ps.w;
    const int64_t plane = div_h(row);
    const int64_t h = row - plane * ps.h;
    const auto self = static_cast<int32_t>(h * ps.w + w);
    int64_t p_lo, p_hi, q_lo, q_hi;
    windows_over(h, ps.kernel, ps.stride, ps.pad, ps.p, div_stride, p_lo, p_hi);
    windows_over(w, ps.kernel, ps.stride, ps.pad, ps.q, div_stride, q_lo, q_hi);
    const int64_t base = plane * ps.p * ps.q;
    float acc = 0.0f;
    for (int64_t p = p_lo; p <= p_hi; ++p)
      for (int64_t q = q_lo; q <= q_hi; ++q)
        if (argmax[base + p * ps.q + q] == self) acc += dy[base + p * ps.q + q];
    dx[e] = acc;
  }
}

}  // namespace

cudaError_t maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps,
                               cudaStream_t s) {
  const size_t total = static_cast<size_t>(ps.n * ps.c * ps.h * ps.w);
  if (total == 0) return cudaSuccess;
  // The stride's numerators reach h + pad + stride (or w's): within Div32's range whenever the total is.
  if (div32_fits(static_cast<int64_t>(total)) && div32_fits(std::max(ps.h, ps.w) + ps.pad + ps.stride))
    maxpool_backward_kernel<<<blocks_for(total), kThreads, 0, s>>>(dy, argmax, dx, ps, total, Div32(ps.w),
                                                                    Div32(ps.h), Div32(ps.stride));
  else
    maxpool_backward_kernel<<<blocks_for(total), kThreads, 0, s>>>(dy, argmax, dx, ps, total, Div64(ps.w),
                                                                    Div64(ps.h), Div64(ps.stride));
  return cudaGetLastError();
}

namespace {

__global__ void avgpool_forward_kernel(const float* x, float* y, int64_t rows, int64_t hw, float inv) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* row = x + i * hw;
    float sum = 0.0f;
    for (int64_t j = 0; j < hw; ++j) sum += row[j];
    y[i] = sum * inv;
  }
}

}  // namespace

cudaError_t avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  const float inv = 1.0f / static_cast<float>(hw);  // as the CPU set: a product by the rounded 1/hw
  avgpool_forward_kernel<<<blocks_for(static_cast<size_t>(rows)), kThreads, 0, s>>>(x, y, rows, hw, inv);
  return cudaGetLastError();
}

namespace {

__global__ void avgpool_backward_kernel(const float* dy, float* dx, size_t total, int64_t hw, float inv) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dx[i] = dy[static_cast<int64_t>(i) / hw] * inv;
}

}  // namespace

cudaError_t avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw, cudaStream_t s) {
  const size_t total = static_cast<size_t>(rows * hw);
  if (total == 0) return cudaSuccess;
  const float inv = 1.0f / static_cast<float>(hw);
  avgpool_backward_kernel<<<blocks_for(total), kThreads, 0, s>>>(dy, dx, total, hw, inv);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
