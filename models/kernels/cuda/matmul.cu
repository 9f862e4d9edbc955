// models/kernels/cuda/matmul.cu: what cuBLASLt's epilogues compute, as kernels of our own for the shapes cuBLASLt
// has no epilogue algorithm for (matmul.cpp falls back to them), each kernel followed by its launcher.
#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

__global__ void bias_epilogue_bf16_kernel(const float* acc, BFloat16* d, int64_t ldd, const BFloat16* bias,
                                          BFloat16* aux, int64_t M, int64_t N, bool gelu) {
  const size_t total = static_cast<size_t>(M) * static_cast<size_t>(N);
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t i = static_cast<int64_t>(e / N), j = static_cast<int64_t>(e % N);
    BFloat16& out = d[i * ldd + j];
    const float pre = acc[e] + to_float(bias[j]);
    if (!gelu) {
      out = to_bfloat16(pre);
      continue;
    }
    if (aux) aux[i * N + j] = to_bfloat16(pre);
    out = to_bfloat16(elementwise::gelu(pre));
  }
}

__global__ void dgelu_epilogue_bf16_kernel(const float* acc, BFloat16* d, int64_t ldd, const BFloat16* aux,
                                           int64_t M, int64_t N) {
  const size_t total = static_cast<size_t>(M) * static_cast<size_t>(N);
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t i = static_cast<int64_t>(e / N), j = static_cast<int64_t>(e % N);
    d[i * ldd + j] = to_bfloat16(acc[e] * elementwise::gelu_grad(to_float(aux[e])));
  }
}

// Stage 1 of the bias gradient: a block of 32 x 8 threads owns 32 outputs i and the run of k of its split
// (blockIdx.y). Thread (x, y) adds a[i, k] for k = start + y, + 8, ... in order; then row y = 0 adds the 8 partials in
// y order into part[split * M + i]. With stride_i 1 (a weight gradient's dy, row-major) a warp reads 32 adjacent
// values per k.
__global__ void bias_grad_partial_kernel(const BFloat16* a, int64_t stride_i, int64_t stride_k, int64_t M, int64_t K,
                                         int64_t run, float* part) {
  __shared__ float acc_s[8][33];
  const int64_t i = blockIdx.x * 32 + threadIdx.x;
  const int64_t k0 = blockIdx.y * run, k1 = k0 + run < K ? k0 + run : K;
  float acc = 0.0f;
  if (i < M)
    for (int64_t k = k0 + threadIdx.y; k < k1; k += 8) acc += to_float(a[i * stride_i + k * stride_k]);
  acc_s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || i >= M) return;
  float sum = 0.0f;
  for (int y = 0; y < 8; ++y) sum += acc_s[y][threadIdx.x];
  part[blockIdx.y * M + i] = sum;
}

// Stage 1 eight columns at a time, where stride_i is 1 and a, stride_k and M are multiples of 8 elements (16-byte
// loads; a weight gradient's dy): thread (x, y) owns the 8 outputs i = (blockIdx.x * 32 + x) * 8 .. + 7 and adds
// their values for k = start + y, + 8, ... in order, as 8 threads of the kernel above would; then the block's 256
// columns each add their 8 partials in y order: the same additions in the same order, so the same bits.
__global__ void bias_grad_partial_x8_kernel(const BFloat16* a, int64_t stride_k, int64_t M, int64_t K, int64_t run,
                                            float* part) {
  __shared__ float acc_s[8][32][9];  // [y][x][column of x's 8], padded against bank conflicts
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * 8;
  const int64_t k0 = blockIdx.y * run, k1 = k0 + run < K ? k0 + run : K;
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  if (i0 < M) {
#pragma unroll 4
    for (int64_t k = k0 + threadIdx.y; k < k1; k += 8) {
      // One 16-byte load into a register copy (a reference into global memory would be read field by field: two
      // 8-byte loads).
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(a + k * stride_k + i0));
      float x[8];
      unpack_bf16x8(w, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += x[j];
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) acc_s[threadIdx.y][threadIdx.x][j] = acc[j];
  __syncthreads();
  const int t = static_cast<int>(threadIdx.y * 32 + threadIdx.x);  // the block's column t
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + t;
  if (i >= M) return;
  float sum = 0.0f;
  for (int y = 0; y < 8; ++y) sum += acc_s[y][t / 8][t % 8];
  part[blockIdx.y * M + i] = sum;
}

// Stage 2: bias_grad[i] += the splits' partials, in split order (= without `accumulate`).
__global__ void bias_grad_finish_kernel(const float* part, int64_t M, int64_t splits, float* bias_grad,
                                        bool accumulate) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
#pragma unroll 16
    for (int64_t sp = 0; sp < splits; ++sp) sum += part[sp * M + i];  // the loads ahead, the additions in order
    bias_grad[i] = accumulate ? bias_grad[i] + sum : sum;
  }
}

// d[i * ldd + j] (+)= float(src[i * N + j]): a weight gradient computed into packed bf16 scratch, widened (exact)
// into the float32 gradient. One thread per element.
__global__ void widen_rows_bf16_kernel(const BFloat16* src, int64_t M, int64_t N, float* d, int64_t ldd,
                                       bool accumulate) {
  const size_t total = static_cast<size_t>(M) * static_cast<size_t>(N);
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t i = static_cast<int64_t>(e / N), j = static_cast<int64_t>(e % N);
    float& out = d[i * ldd + j];
    out = accumulate ? out + to_float(src[e]) : to_float(src[e]);
  }
}

// The same eight elements a thread (widen_rows_bf16_x8 says where): one 16-byte load of src, two of d when
// accumulating, two 16-byte stores. The same one addition per element: the same bits.
__global__ void widen_rows_bf16_x8_kernel(const BFloat16* src, int64_t M, int64_t N, float* d, int64_t ldd,
                                          bool accumulate) {
  const int64_t per_row = N / 8;
  const size_t total = static_cast<size_t>(M) * static_cast<size_t>(per_row);
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t i = static_cast<int64_t>(v / per_row), j = static_cast<int64_t>(v % per_row) * 8;
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(src + i * N + j));
    float x[8];
    unpack_bf16x8(w, x);
    auto* out = reinterpret_cast<float4*>(d + i * ldd + j);
    float4 lo = make_float4(x[0], x[1], x[2], x[3]), hi = make_float4(x[4], x[5], x[6], x[7]);
    if (accumulate) {
      const float4 a = out[0], b = out[1];
      lo = make_float4(a.x + lo.x, a.y + lo.y, a.z + lo.z, a.w + lo.w);
      hi = make_float4(b.x + hi.x, b.y + hi.y, b.z + hi.z, b.w + hi.w);
    }
    out[0] = lo;
    out[1] = hi;
  }
}

}  // namespace

bool widen_rows_bf16_x8(const BFloat16* src, int64_t N, const float* d, int64_t ldd) {
  return N % 8 == 0 && ldd % 4 == 0 && aligned16(src) && aligned16(d);
}

cudaError_t widen_rows_bf16(const BFloat16* src, int64_t M, int64_t N, float* d, int64_t ldd, bool accumulate,
                            cudaStream_t s) {
  if (M == 0 || N == 0) return cudaSuccess;
  if (widen_rows_bf16_x8(src, N, d, ldd))
    widen_rows_bf16_x8_kernel<<<blocks_for(static_cast<size_t>(M * (N / 8))), kThreads, 0, s>>>(src, M, N, d, ldd,
                                                                                                accumulate);
  else
    widen_rows_bf16_kernel<<<blocks_for(static_cast<size_t>(M * N)), kThreads, 0, s>>>(src, M, N, d, ldd, accumulate);
  return cudaGetLastError();
}

cudaError_t bias_epilogue_bf16(const float* acc, BFloat16* d, int64_t ldd, const BFloat16* bias, BFloat16* aux,
                               int64_t M, int64_t N, bool gelu, cudaStream_t s) {
  if (M == 0 || N == 0) return cudaSuccess;
  bias_epilogue_bf16_kernel<<<blocks_for(static_cast<size_t>(M * N)), kThreads, 0, s>>>(acc, d, ldd, bias, aux, M, N,
                                                                                        gelu);
  return cudaGetLastError();
}

cudaError_t dgelu_epilogue_bf16(const float* acc, BFloat16* d, int64_t ldd, const BFloat16* aux, int64_t M, int64_t N,
                                cudaStream_t s) {
  if (M == 0 || N == 0) return cudaSuccess;
  dgelu_epilogue_bf16_kernel<<<blocks_for(static_cast<size_t>(M * N)), kThreads, 0, s>>>(acc, d, ldd, aux, M, N);
  return cudaGetLastError();
}

int64_t bias_grad_bf16_splits(int64_t K) {
  const int64_t splits = (K + kBiasGradRun - 1) / kBiasGradRun;
  return splits < 1 ? 1 : splits > kBiasGradMaxSplits ? kBiasGradMaxSplits : splits;
}

bool bias_grad_bf16_x8(const BFloat16* a, int64_t stride_i, int64_t stride_k, int64_t M) {
  return stride_i == 1 && stride_k % 8 == 0 && M % 8 == 0 && aligned16(a);
}

cudaError_t bias_grad_bf16(const BFloat16* a, int64_t stride_i, int64_t stride_k, int64_t M, int64_t K,
                           float* bias_grad, float* scratch, bool accumulate, cudaStream_t s) {
  if (M == 0) return cudaSuccess;
  if (K == 0)  // no rows: nothing to add, or the sums are 0
    return accumulate ? cudaSuccess : cudaMemsetAsync(bias_grad, 0, static_cast<size_t>(M) * sizeof(float), s);
  const int64_t splits = bias_grad_bf16_splits(K), run = (K + splits - 1) / splits;
  const dim3 block(32, 8);
  if (bias_grad_bf16_x8(a, stride_i, stride_k, M)) {
    const dim3 grid(static_cast<unsigned int>((M + 255) / 256), static_cast<unsigned int>(splits));
    bias_grad_partial_x8_kernel<<<grid, block, 0, s>>>(a, stride_k, M, K, run, scratch);
  } else {
    const dim3 grid(static_cast<unsigned int>((M + 31) / 32), static_cast<unsigned int>(splits));
    bias_grad_partial_kernel<<<grid, block, 0, s>>>(a, stride_i, stride_k, M, K, run, scratch);
  }
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  bias_grad_finish_kernel<<<blocks_for(static_cast<size_t>(M)), kThreads, 0, s>>>(scratch, M, splits, bias_grad,
                                                                                    accumulate);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
