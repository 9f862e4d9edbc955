// models/kernels/cuda/precision.cu: low precision: rounding float32 operands into packed bf16 / fp16 copies for
// the 16-bit GEMMs and convolutions (one matrix, or a strided batch of them), and widening 16-bit results back into
// float32; each kernel followed by its launcher.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

// float -> the narrow type, round to nearest even; and back (exact).
template <class T>
__device__ T to_narrow(float x);

template <>
__device__ __nv_bfloat16 to_narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <>
__device__ __half to_narrow<__half>(float x) { return __float2half_rn(x); }

__device__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ float to_float(__half v) { return __half2float(v); }

}  // namespace

static_assert(sizeof(__nv_bfloat16) == kNarrowBytes && sizeof(__half) == kNarrowBytes);

namespace {

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

// Four adjacent values: one 16-byte float load, one 8-byte store of four narrow values (or back), the same
// per-element conversion as the scalar kernels.
template <class T>
struct alignas(8) Narrow4 {
  T v[4];
};

template <class T>
__global__ void narrow4_kernel(const float4* src, Narrow4<T>* dst, size_t quads) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < quads;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float4 f = src[i];
    Narrow4<T> o;
    o.v[0] = to_narrow<T>(f.x);
    o.v[1] = to_narrow<T>(f.y);
    o.v[2] = to_narrow<T>(f.z);
    o.v[3] = to_narrow<T>(f.w);
    dst[i] = o;
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The packed (contiguous) case of narrow, four values a thread where src and dst are aligned for it; false where
// not (the caller runs the scalar kernel).
template <class T>
bool narrow_packed4(const float* src, T* dst, size_t total, cudaStream_t s) {
  if (total < 4 || !aligned(src, 16) || !aligned(dst, 8)) return false;
  const size_t quads = total / 4, done = quads * 4;
  narrow4_kernel<<<blocks_for(quads), kThreads, 0, s>>>(reinterpret_cast<const float4*>(src),
                                                        reinterpret_cast<Narrow4<T>*>(dst), quads);
  if (done < total) {  // the last 1-3 values, as one packed row
    const auto tail = static_cast<int64_t>(total - done);
    narrow_kernel<<<1, kThreads, 0, s>>>(src + done, tail, tail, dst + done, total - done);
  }
  return true;
}

}  // namespace

cudaError_t narrow(const float* src, int64_t rows, int64_t cols, int64_t ld, void* dst, Precision p, cudaStream_t s) {
  if (p == Precision::F32 || rows < 0 || cols < 0 || (rows > 1 && ld < cols)) return cudaErrorInvalidValue;
  const size_t total = static_cast<size_t>(rows * cols);
  if (total == 0) return cudaSuccess;
  const bool packed = ld == cols || rows == 1;  // src's values are contiguous too
  if (packed && (p == Precision::BF16 ? narrow_packed4(src, static_cast<__nv_bfloat16*>(dst), total, s)
                                      : narrow_packed4(src, static_cast<__half*>(dst), total, s)))
    return cudaGetLastError();
  if (p == Precision::BF16)
    narrow_kernel<<<blocks_for(total), kThreads, 0, s>>>(src, cols, ld, static_cast<__nv_bfloat16*>(dst), total);
  else
    narrow_kernel<<<blocks_for(total), kThreads, 0, s>>>(src, cols, ld, static_cast<__half*>(dst), total);
  return cudaGetLastError();
}

namespace {

template <class T>
__global__ void widen_kernel(const T* src, float* dst, size_t n, bool accumulate) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = accumulate ? dst[i] + to_float(src[i]) : to_float(src[i]);
}

template <class T>
__global__ void widen4_kernel(const Narrow4<T>* src, float4* dst, size_t quads, bool accumulate) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < quads;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const Narrow4<T> h = src[i];
    float4 f = make_float4(to_float(h.v[0]), to_float(h.v[1]), to_float(h.v[2]), to_float(h.v[3]));
    if (accumulate) {
      const float4 d = dst[i];
      f = make_float4(d.x + f.x, d.y + f.y, d.z + f.z, d.w + f.w);
    }
    dst[i] = f;
  }
}

// widen, four values a thread where src and dst are aligned for it; false where not.
template <class T>
bool widen_packed4(const T* src, float* dst, size_t n, bool accumulate, cudaStream_t s) {
  if (n < 4 || !aligned(src, 8) || !aligned(dst, 16)) return false;
  const size_t quads = n / 4, done = quads * 4;
  widen4_kernel<<<blocks_for(quads), kThreads, 0, s>>>(reinterpret_cast<const Narrow4<T>*>(src),
                                                       reinterpret_cast<float4*>(dst), quads, accumulate);
  if (done < n) widen_kernel<<<1, kThreads, 0, s>>>(src + done, dst + done, n - done, accumulate);
  return true;
}

}  // namespace

cudaError_t widen(const void* src, float* dst, size_t n, Precision p, bool accumulate, cudaStream_t s) {
  if (p == Precision::F32) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (p == Precision::BF16 ? widen_packed4(static_cast<const __nv_bfloat16*>(src), dst, n, accumulate, s)
                           : widen_packed4(static_cast<const __half*>(src), dst, n, accumulate, s))
    return cudaGetLastError();
  if (p == Precision::BF16)
    widen_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(src), dst, n, accumulate);
  else
    widen_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const __half*>(src), dst, n, accumulate);
  return cudaGetLastError();
}

namespace {

constexpr int kTile = 32, kTileRows = 8;  // a 32x32 tile per block of 32x8 threads, 4 rows each

// Block (x, y) of matrix b, for b = blockIdx.z, blockIdx.z + gridDim.z, ...: rows r0 .. r0 + 31 and columns
// c0 .. c0 + 31 of src (rows x cols, float) read along the columns into the tile, then written along the rows as
// columns of dst (cols x padded, narrow; zeros past row `rows`).
template <class T>
__global__ void narrow_transposed_kernel(const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t padded,
                                         T* dst) {
  __shared__ float tile[kTile][kTile + 1];  // +1: the column reads hit 32 different banks
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const float* in = src + b * rows * cols;
    T* out = dst + b * padded * cols;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[j][threadIdx.x] = in[r * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (r < padded && c < cols) out[c * padded + r] = to_narrow<T>(r < rows ? tile[threadIdx.x][j] : 0.0f);
    }
    __syncthreads();  // the tile is rewritten for the next b
  }
}

// The inverse: src (cols x padded, narrow) read along the rows (the first `rows` of each), dst (rows x cols,
// float) written along the columns.
template <class T>
__global__ void widen_transposed_kernel(const T* src, int64_t padded, int64_t batch, int64_t rows, int64_t cols,
                                        float* dst, bool accumulate) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const T* in = src + b * padded * cols;
    float* out = dst + b * rows * cols;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (r < rows && c < cols) tile[threadIdx.x][j] = to_float(in[c * padded + r]);
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) {
        const float v = tile[j][threadIdx.x];
        out[r * cols + c] = accumulate ? out[r * cols + c] + v : v;
      }
    }
    __syncthreads();
  }
}

// The grid of both: tiles along x (columns) and y (rows), matrices along z (capped; the kernels stride over b).
bool transpose_grid(int64_t batch, int64_t rows, int64_t cols, dim3& grid) {
  const int64_t gx = (cols + kTile - 1) / kTile, gy = (rows + kTile - 1) / kTile;
  if (gx > 0x7fffffff || gy > 65535) return false;
  grid = dim3(static_cast<unsigned int>(gx), static_cast<unsigned int>(gy),
              static_cast<unsigned int>(batch < 65535 ? batch : 65535));
  return true;
}

}  // namespace

cudaError_t narrow_transposed(const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t padded, void* dst,
                              Precision p, cudaStream_t s) {
  if (p == Precision::F32 || batch < 0 || rows < 0 || cols < 0 || padded < rows) return cudaErrorInvalidValue;
  if (batch == 0 || padded == 0 || cols == 0) return cudaSuccess;
  dim3 grid;
  if (!transpose_grid(batch, padded, cols, grid)) return cudaErrorInvalidValue;
  const dim3 block(kTile, kTileRows);
  if (p == Precision::BF16)
    narrow_transposed_kernel<<<grid, block, 0, s>>>(src, batch, rows, cols, padded, static_cast<__nv_bfloat16*>(dst));
  else
    narrow_transposed_kernel<<<grid, block, 0, s>>>(src, batch, rows, cols, padded, static_cast<__half*>(dst));
  return cudaGetLastError();
}

cudaError_t widen_transposed(const void* src, int64_t padded, float* dst, int64_t batch, int64_t rows, int64_t cols,
                             Precision p, bool accumulate, cudaStream_t s) {
  if (p == Precision::F32 || batch < 0 || rows < 0 || cols < 0 || padded < rows) return cudaErrorInvalidValue;
  if (batch == 0 || rows == 0 || cols == 0) return cudaSuccess;
  dim3 grid;
  if (!transpose_grid(batch, rows, cols, grid)) return cudaErrorInvalidValue;
  const dim3 block(kTile, kTileRows);
  if (p == Precision::BF16)
    widen_transposed_kernel<<<grid, block, 0, s>>>(static_cast<const __nv_bfloat16*>(src), padded, batch, rows, cols,
                                                   dst, accumulate);
  else
    widen_transposed_kernel<<<grid, block, 0, s>>>(static_cast<const __half*>(src), padded, batch, rows, cols, dst,
                                                   accumulate);
  return cudaGetLastError();
}

namespace {

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

}  // namespace

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

}  // namespace dpt::models::cuda_launch
