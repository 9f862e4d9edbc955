// models/kernels/cuda/common.cuh: what the CUDA kernel files share, for nvcc only (included by the .cu files): the
// block size and grid of the grid-stride kernels, block and warp reductions in a fixed order (so a rerun gives the
// same bits), and the row kernels' launch shape. Everything sits in an anonymous namespace, as it did in the one
// kernels.cu: each .cu gets its own copy of what it uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "models/kernels/cuda/launch.h"
#include "models/kernels/fast_divmod.h"
#include "models/kernels/row_runs.h"
#include "models/kernels/smem_limits.h"

namespace dpt::models::cuda_launch {
namespace {

constexpr int kThreads = 256;

// Enough blocks to cover n with a grid-stride loop, capped so huge n does not launch millions of blocks.
inline unsigned int blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(b < 65535 ? (b == 0 ? 1 : b) : 65535);
}

// The index divisions of the element-wise and reduction kernels (flat index -> image, channel, row, column), as a
// template argument: Div32 (FastDivmod: a multiply-high and a shift) where every numerator is at most
// kFastDivmodMax, else Div64 (the plain 64-bit '/', a long software routine on the GPU). Both give n / d exactly,
// so the kernels' results do not depend on which one ran.
struct Div64 {
  int64_t d;
  explicit Div64(int64_t divisor) : d(divisor) {}
  __device__ __forceinline__ int64_t operator()(int64_t n) const { return n / d; }
};
struct Div32 {
  FastDivmod f;
  explicit Div32(int64_t divisor) : f(divisor) {}
  __device__ __forceinline__ int64_t operator()(int64_t n) const { return f.div(static_cast<uint32_t>(n)); }
};
// Whether Div32 may divide numerators up to `largest`.
inline bool div32_fits(int64_t largest) { return largest <= kFastDivmodMax; }

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

// Activations of either type, as float32: bf16 widened exactly, stored rounded to nearest even (core/bfloat16.h).
__device__ __forceinline__ float load_act(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_act(const BFloat16* p, int64_t i) { return to_float(p[i]); }
__device__ __forceinline__ void store_act(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_act(BFloat16* p, int64_t i, float v) { p[i] = to_bfloat16(v); }

// Eight bf16 in one 16-byte load or store (the fast path's vectorised kernels).
union Bf16x8 {
  uint4 raw;
  BFloat16 v[8];
};

// The two bf16 of a 32-bit word, widened exactly: the low half is the lower address (column c), the high c + 1.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// bf16(lo) | bf16(hi) << 16, each rounded to nearest even: one cvt on sm_80 and later (finite values and infinities
// give to_bfloat16's bits; a NaN stays a NaN, its payload may differ), to_bfloat16 twice before.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
#else
  return static_cast<uint32_t>(to_bfloat16(lo).bits) | static_cast<uint32_t>(to_bfloat16(hi).bits) << 16;
#endif
}

// Eight bf16 (one 16-byte vector, the lowest column first) widened; and eight floats rounded into one.
__device__ __forceinline__ void unpack_bf16x8(const uint4& w, float (&x)[8]) {
  x[0] = bf16_lo(w.x);
  x[1] = bf16_hi(w.x);
  x[2] = bf16_lo(w.y);
  x[3] = bf16_hi(w.y);
  x[4] = bf16_lo(w.z);
  x[5] = bf16_hi(w.z);
  x[6] = bf16_lo(w.w);
  x[7] = bf16_hi(w.w);
}
__device__ __forceinline__ uint4 pack_bf16x8(const float (&y)[8]) {
  return make_uint4(pack_bf16x2(y[0], y[1]), pack_bf16x2(y[2], y[3]), pack_bf16x2(y[4], y[5]),
                    pack_bf16x2(y[6], y[7]));
}

// Whether every pointer is 16-byte aligned: the bf16 kernels' eight-at-a-time path.
template <class... P>
__host__ bool aligned16(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

// y[i] = bf16(f(a[i], b[i])) for i < n (y may be a or b): eight elements per 16-byte load and store when the three
// pointers are 16-byte aligned (the last n % 8 one at a time), else one at a time. The same arithmetic per element
// either way: the same bits.
template <class F>
__global__ void map2_bf16_kernel(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n, bool vec, F f) {
  const size_t first = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t nv = vec ? n / 8 : 0;
  for (size_t v = first; v < nv; v += stride) {
    Bf16x8 x, z, out;
    x.raw = reinterpret_cast<const uint4*>(a)[v];
    z.raw = reinterpret_cast<const uint4*>(b)[v];
#pragma unroll
    for (int i = 0; i < 8; ++i) out.v[i] = to_bfloat16(f(to_float(x.v[i]), to_float(z.v[i])));
    reinterpret_cast<uint4*>(y)[v] = out.raw;
  }
  for (size_t i = nv * 8 + first; i < n; i += stride) y[i] = to_bfloat16(f(to_float(a[i]), to_float(b[i])));
}

template <class F>
cudaError_t map2_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n, F f, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  const bool vec = aligned16(a, b, y);
  map2_bf16_kernel<<<blocks_for(vec ? (n + 7) / 8 : n), kThreads, 0, s>>>(a, b, y, n, vec, f);
  return cudaGetLastError();
}

// The columns c < C of one row that lane `lane` of a warp owns, in the order the lane visits them: with vec (bf16
// rows, C a multiple of 8, 16-byte aligned) eight adjacent columns per 16-byte load, vectors lane, lane + 32, ...;
// else columns lane, lane + 32, ... f(c, a[c], b[c]) for each (b may be a).
template <class T, class F>
__device__ __forceinline__ void for_lane_columns(const T* a, const T* b, int64_t C, int lane, bool vec, F&& f) {
  if constexpr (sizeof(T) == 2) {
    if (vec) {
      const auto* av = reinterpret_cast<const uint4*>(a);
      const auto* bv = reinterpret_cast<const uint4*>(b);
      for (int64_t v = lane; v < C / 8; v += 32) {
        Bf16x8 x, z;
        x.raw = av[v];
        z.raw = bv[v];
#pragma unroll
        for (int i = 0; i < 8; ++i) f(v * 8 + i, to_float(x.v[i]), to_float(z.v[i]));
      }
      return;
    }
  }
  for (int64_t c = lane; c < C; c += 32) f(c, load_act(a, c), load_act(b, c));
}

// out[c] = f(c, a[c], b[c]) over the lane's columns as for_lane_columns walks them; out may alias a or b (each
// vector, or column, is read before the lane writes it).
template <class T, class F>
__device__ __forceinline__ void map_lane_columns(const T* a, const T* b, T* out, int64_t C, int lane, bool vec,
                                                 F&& f) {
  if constexpr (sizeof(T) == 2) {
    if (vec) {
      const auto* av = reinterpret_cast<const uint4*>(a);
      const auto* bv = reinterpret_cast<const uint4*>(b);
      auto* ov = reinterpret_cast<uint4*>(out);
      for (int64_t v = lane; v < C / 8; v += 32) {
        Bf16x8 x, z, o;
        x.raw = av[v];
        z.raw = bv[v];
#pragma unroll
        for (int i = 0; i < 8; ++i) o.v[i] = to_bfloat16(f(v * 8 + i, to_float(x.v[i]), to_float(z.v[i])));
        ov[v] = o.raw;
      }
      return;
    }
  }
  for (int64_t c = lane; c < C; c += 32) store_act(out, c, f(c, load_act(a, c), load_act(b, c)));
}

// Whether rows of C bf16 elements starting at these pointers can be walked eight columns at a time.
template <class T, class... P>
__host__ bool rows_vectorizable(int64_t C, const P*... p) {
  return sizeof(T) == 2 && C % 8 == 0 && aligned16(p...);
}

// The row kernels below give each row one warp: kThreads / 32 rows per block.
constexpr int kWarpsPerBlock = kThreads / 32;
static_assert(kWarpsPerBlock == kRowsPerBlock, "launch.h's kRowsPerBlock is the row kernels' warps per block");
inline unsigned int row_blocks(int64_t rows) {
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

// ---- bf16 rows held in registers: LayerNorm's (layernorm.cu) and RMSNorm's (llama.cu) --------------------------

// A bf16 row in registers: lane `lane` holds the row's vectors lane, lane + 32, ..., lane + 32 (NV - 1) (eight
// columns each; those past the row's nvec vectors are not read), the vectors in for_lane_columns' order.
template <int NV>
__device__ __forceinline__ void load_lane_row(const BFloat16* row, int64_t nvec, int lane, Bf16x8 (&out)[NV]) {
  const auto* p = reinterpret_cast<const uint4*>(row);
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (lane + 32 * k < nvec) out[k].raw = p[lane + 32 * k];
}

// f(k, vi) for each vector the lane holds of a row of nvec (load_lane_row's: vi = lane + 32 k < nvec), k unrolled.
template <int NV, class F>
__device__ __forceinline__ void for_lane_vectors(int64_t nvec, int lane, F&& f) {
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t vi = lane + 32 * k;
    if (vi < nvec) f(k, vi);
  }
}

// The lane's vectors of bf16(x + addend)'s row at `offset` (add_bf16's one rounding), as load_lane_row holds them,
// written to sum's row first: the two rows are in registers before, so sum may alias either. The norms' forward
// after a residual add.
template <int NV>
__device__ __forceinline__ void load_lane_row_sum(const BFloat16* x, const BFloat16* addend, BFloat16* sum,
                                                  int64_t offset, int64_t nvec, int lane, Bf16x8 (&out)[NV]) {
  load_lane_row(x + offset, nvec, lane, out);
  Bf16x8 add[NV];
  load_lane_row(addend + offset, nvec, lane, add);
  auto* row = reinterpret_cast<uint4*>(sum + offset);
  for_lane_vectors<NV>(nvec, lane, [&](int k, int64_t vi) {
    float v[8], w[8];
    unpack_bf16x8(out[k].raw, v);
    unpack_bf16x8(add[k].raw, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] += w[i];
    out[k].raw = pack_bf16x8(v);
    row[vi] = out[k].raw;
  });
}

// The row a norm's forward normalises: x's (load_lane_row), or with kAdd bf16(x + addend)'s, written to sum
// (load_lane_row_sum).
template <bool kAdd, int NV>
__device__ __forceinline__ void load_norm_row(const BFloat16* x, const BFloat16* addend, BFloat16* sum, int64_t offset,
                                              int64_t nvec, int lane, Bf16x8 (&out)[NV]) {
  if constexpr (kAdd)
    load_lane_row_sum(x, addend, sum, offset, nvec, lane, out);
  else
    load_lane_row(x + offset, nvec, lane, out);
}

// The lanes' float32 partial sums of a row of C added over the warp in double, divided by C: the row's mean.
__device__ __forceinline__ float warp_mean(float part, int64_t C) {
  return static_cast<float>(warp_sum(static_cast<double>(part)) / static_cast<double>(C));
}

// The eight values of a vector summed in a fixed tree.
__device__ __forceinline__ float sum8(const float (&a)[8]) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// Eight float32 parameters of columns 8 v .. 8 v + 7 in two 16-byte loads (p 16-byte aligned).
__device__ __forceinline__ void load_params8(const float* p, int64_t v, float (&out)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[2 * v], b = reinterpret_cast<const float4*>(p)[2 * v + 1];
  out[0] = a.x;
  out[1] = a.y;
  out[2] = a.z;
  out[3] = a.w;
  out[4] = b.x;
  out[5] = b.y;
  out[6] = b.z;
  out[7] = b.w;
}

// Calls f(std::integral_constant<int, NV>{}) with the fewest vectors per lane NV (of 1, 2, 3, 4, 6, 8, 12, 16, up to
// kMax) that hold a row of C columns (C a multiple of 8 that kMax vectors per lane hold).
template <int kMax, class F>
cudaError_t with_lane_vectors(int64_t C, F&& f) {
  const int64_t need = (C / 8 + 31) / 32;
  cudaError_t e = cudaErrorInvalidValue;
  bool done = false;
  const auto try_nv = [&](auto nv) {
    if constexpr (decltype(nv)::value <= kMax) {
      if (!done && need <= decltype(nv)::value) {
        done = true;
        e = f(nv);
      }
    }
  };
  try_nv(std::integral_constant<int, 1>{});
  try_nv(std::integral_constant<int, 2>{});
  try_nv(std::integral_constant<int, 3>{});
  try_nv(std::integral_constant<int, 4>{});
  try_nv(std::integral_constant<int, 6>{});
  try_nv(std::integral_constant<int, 8>{});
  try_nv(std::integral_constant<int, 12>{});
  try_nv(std::integral_constant<int, 16>{});
  return e;
}

// Whether a bf16 LayerNorm or RMSNorm of rows of C columns runs on rows held in registers (forward up to
// kLnRowMaxColumns, backward up to kLnBackwardRowMaxColumns: its per-column sums take shared memory), every pointer
// (null ones pass) 16-byte aligned.
template <class T, class... P>
bool rows_in_registers(int64_t C, int64_t max_columns, const P*... p) {
  return rows_vectorizable<T>(C, p...) && C <= max_columns;
}

// out[vi] = bf16(v + res) (res: the residual row's vector vi, read with the row before any of it is written: the
// residual may be out's row), or bf16(v) without a residual. The fused norm backwards' dx.
__device__ __forceinline__ void store_vector_plus(uint4* out, int64_t vi, float (&v)[8], bool has_residual,
                                                  const Bf16x8& res) {
  if (has_residual) {
    float rv[8];
    unpack_bf16x8(res.raw, rv);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] += rv[i];
  }
  out[vi] = pack_bf16x8(v);
}

// The fused norm backwards' per-column sums over a block's rows, kArrays of them per warp, in the block's dynamic
// shared memory (warp_column_sums_bytes): warp w's array a at smem[(w * kArrays + a) * C], element i of the lane's
// vector vi (load_lane_row's) at i * nvec + vi, so a warp's 32 lanes touch 32 banks. Each lane adds to its own
// columns only (no synchronisation until the block's end), the rows of its warp in order, as registers would; they
// free the registers (48 a lane for LayerNorm at 768 columns) for more warps and the residual row in flight.
template <int kArrays>
struct WarpColumnSums {
  float* sums;  // this warp's kArrays * C
  int64_t C, nvec;
  __device__ WarpColumnSums(float* smem, int64_t c)
      : sums(smem + static_cast<int64_t>(threadIdx.x / 32) * kArrays * c), C(c), nvec(c / 8) {}
  __device__ float& at(int a, int i, int64_t vi) { return sums[a * C + i * nvec + vi]; }
  template <int NV>
  __device__ void zero(int lane) {
    for_lane_vectors<NV>(nvec, lane, [&](int, int64_t vi) {
#pragma unroll
      for (int a = 0; a < kArrays; ++a)
#pragma unroll
        for (int i = 0; i < 8; ++i) at(a, i, vi) = 0.0f;
    });
  }
};
inline size_t warp_column_sums_bytes(int arrays, int64_t C) {
  return static_cast<size_t>(kWarpsPerBlock) * static_cast<size_t>(arrays) * static_cast<size_t>(C) * sizeof(float);
}

// How many blocks of `kernel` (kThreads threads, smem bytes of dynamic shared memory, asked for beforehand where past
// the default 48 KB) the current device runs at once: its multiprocessors times
// cudaOccupancyMaxActiveBlocksPerMultiprocessor. Asked once per device, kernel and smem (a mutex-guarded map: ranks
// on threads share the process), then read from the map.
template <class K>
cudaError_t resident_blocks(K* kernel, size_t smem, int64_t& out) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, size_t>, int64_t> known;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel), smem);
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(key); it != known.end()) {
    out = it->second;
    return cudaSuccess;
  }
  int sms = 0, per_sm = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  if (e == cudaSuccess && per_sm < 1) e = cudaErrorInvalidConfiguration;  // the kernel fits no multiprocessor
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // returned, not left for a later launch's check to find
    return e;
  }
  out = static_cast<int64_t>(sms) * per_sm;
  known.emplace(key, out);
  return cudaSuccess;
}

// Lets `kernel` launch with `smem` bytes of dynamic shared memory on the current device: past the default 48 KB,
// cudaFuncSetAttribute(MaxDynamicSharedMemorySize) once per device, kernel and larger size (SmemLimits: the limit
// only rises), not before every launch. Mutex-guarded: ranks on threads share the process.
template <class K>
cudaError_t allow_dynamic_smem(K* kernel, size_t smem) {
  if (smem <= SmemLimits::kDefaultBytes) return cudaSuccess;
  static std::mutex mutex;
  static SmemLimits limits;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const void* key = reinterpret_cast<const void*>(kernel);
  const std::lock_guard<std::mutex> lock(mutex);
  if (!limits.needs_raise(device, key, smem)) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e == cudaSuccess) limits.raised(device, key, smem);
  return e;
}

// The fused norm backwards' runs over `rows` rows (row_runs.h): kLnRowsPerBlock rows a run at least, at most the
// blocks of `kernel` the device holds at once, so that one wave takes every row. Launches index the grid in 32 bits.
template <class K>
cudaError_t norm_backward_runs(K* kernel, size_t smem, int64_t rows, int64_t& runs) {
  int64_t resident = 0;
  if (const cudaError_t e = resident_blocks(kernel, smem, resident); e != cudaSuccess) return e;
  runs = row_runs(rows, kLnRowsPerBlock, resident);
  return runs > 2147483647LL ? cudaErrorInvalidValue : cudaSuccess;
}

// The block's warps' sums (WarpColumnSums) added in warp order (the same sums on every run) and written as run
// `split` of `splits` in their transposed order: partials[(a * splits + split) * C + i * nvec + v] for column 8 v + i
// (column_runs_reduce_kernel's layout): consecutive threads read consecutive words and write consecutive floats.
// Every thread of the block calls it.
template <int kArrays>
__device__ __forceinline__ void write_warp_column_sums(const float* smem, int64_t C, int64_t split, int64_t splits,
                                                       float* partials) {
  __syncthreads();
  for (int64_t j = threadIdx.x; j < kArrays * C; j += kThreads) {
    float sum = smem[j];
#pragma unroll
    for (int w = 1; w < kWarpsPerBlock; ++w) sum += smem[w * kArrays * C + j];
    const int64_t a = j / C;
    partials[(a * splits + split) * C + (j - a * C)] = sum;
  }
}

// The per-column sums of runs of rows, added up: partials holds gridDim.y arrays of `splits` runs of C columns in
// write_warp_column_sums' order (partials[(y * splits + k) * C + t], t = i * nvec + v for column 8 v + i, nvec =
// C / 8); grid (ceil(C / 32), 1 or 2), block 32 x 32: block y the array into out0 (y = 0: LayerNorm's dgamma,
// RMSNorm's) or out1 (y = 1: LayerNorm's dbeta). Thread (x, y) adds runs y, y + 32, ... of entry t in order (four
// loads in flight), then row y = 0 the 32 sums in order: out[column] += the runs' sum (= without `accumulate`). A
// fixed tree: the same bits on every run. C a multiple of 8 (the register rows': rows_in_registers).
// (A template only so that the .cu files that include this and do not launch it compile no copy.)
template <class = void>
__global__ void column_runs_reduce_kernel(const float* partials, int64_t C, int64_t splits, float* dgamma,
                                          float* dbeta, bool accumulate) {
  __shared__ float part[32][33];
  const int64_t t = blockIdx.x * 32 + threadIdx.x, nvec = C / 8;
  const float* p = partials + (blockIdx.y == 0 ? 0 : splits * C);
  float sum = 0.0f;
  if (t < C) {
#pragma unroll 4
    for (int64_t k = threadIdx.y; k < splits; k += 32) sum += p[k * C + t];
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && t < C) {
    float total = 0.0f;
    for (int k = 0; k < 32; ++k) total += part[k][threadIdx.x];
    float& out = (blockIdx.y == 0 ? dgamma : dbeta)[(t % nvec) * 8 + t / nvec];
    out = accumulate ? out + total : total;
  }
}

}  // namespace
}  // namespace dpt::models::cuda_launch
