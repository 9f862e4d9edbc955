// models/kernels/cuda/elementwise.cu: the element-wise CUDA kernels, each followed by its launcher: bias + activation
// and the bias gradient, ReLU, the residual add, scaling, GELU. The per-element arithmetic is elementwise.h's, shared
// with the CPU set; the bias gradient sums its columns in a fixed order (no atomics).
#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

__global__ void bias_act_kernel(const float* x, const float* bias, float* y, size_t n, int64_t cols, bool relu) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = elementwise::bias_act(x[i], bias[i % cols], relu);
}

}  // namespace

cudaError_t bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu,
                     cudaStream_t s) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  if (n == 0) return cudaSuccess;
  bias_act_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, bias, y, n, cols, relu);
  return cudaGetLastError();
}

namespace {

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

}  // namespace

cudaError_t bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 block(32, 32);
  const dim3 grid(static_cast<unsigned int>((cols + 31) / 32));
  bias_grad_kernel<<<grid, block, 0, s>>>(dy, db, rows, cols);
  return cudaGetLastError();
}

namespace {

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dx[i] = elementwise::relu_backward(y[i], dy[i]);
}

}  // namespace

cudaError_t relu_backward(const float* y, const float* dy, float* dx, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, dy, dx, n);
  return cudaGetLastError();
}

namespace {

__global__ void relu_kernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = elementwise::relu(x[i]);
}

}  // namespace

cudaError_t relu(const float* x, float* y, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  relu_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  return cudaGetLastError();
}

namespace {

__global__ void add_kernel(const float* a, const float* b, float* y, size_t n, bool relu) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = elementwise::bias_act(a[i], b[i], relu);  // a + b, then max(., 0) when relu
}

}  // namespace

cudaError_t add(const float* a, const float* b, float* y, size_t n, bool relu, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n, relu);
  return cudaGetLastError();
}

namespace {

__global__ void scale_kernel(float* x, size_t n, float alpha) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] *= alpha;
}

}  // namespace

cudaError_t scale(float* x, size_t n, float alpha, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, alpha);
  return cudaGetLastError();
}

namespace {

__global__ void gelu_forward_kernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = elementwise::gelu(x[i]);
}

}  // namespace

cudaError_t gelu_forward(const float* x, float* y, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  return cudaGetLastError();
}

namespace {

__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dx[i] = dy[i] * elementwise::gelu_grad(x[i]);
}

}  // namespace

cudaError_t gelu_backward(const float* x, const float* dy, float* dx, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, dy, dx, n);
  return cudaGetLastError();
}

namespace {

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
// (pre, dy) -> dy * gelu'(pre)
struct GeluBackwardOp {
  __device__ float operator()(float pre, float dy) const { return dy * elementwise::gelu_grad(pre); }
};

}  // namespace

cudaError_t add_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n, cudaStream_t s) {
  return map2_bf16(a, b, y, n, AddOp{}, s);
}

cudaError_t gelu_backward_bf16(const BFloat16* pre, const BFloat16* dy, BFloat16* dx, size_t n, cudaStream_t s) {
  return map2_bf16(pre, dy, dx, n, GeluBackwardOp{}, s);
}

}  // namespace dpt::models::cuda_launch
