// core/bfloat16.h: bfloat16, the upper 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa bits), and the
// one rounding from float32 to it that the project uses: round to nearest, ties to even; infinities kept,
// NaN kept (as a quiet NaN), values past the largest bfloat16 rounded to infinity, subnormals kept.
//
// Header-only and free of the project's other headers: nvcc compiles it into the CUDA kernels (as
// __host__ __device__) and g++ into the CPU loops, so both round the same way. Widening back to float32 is
// exact. bf16_add is one addition as NCCL does it for ncclBfloat16: in float32, rounded back to bfloat16.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DPT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DPT_HOST_DEVICE inline
#endif

namespace dpt {

// One bfloat16 value: its bits. A tensor of DType::BF16 holds these.
struct BFloat16 {
  uint16_t bits;
};
static_assert(sizeof(BFloat16) == 2, "BFloat16 is two bytes");

DPT_HOST_DEVICE uint32_t bf16_float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

DPT_HOST_DEVICE float bf16_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// The nearest bfloat16 (ties to even). Adding 0x7FFF plus the lowest kept bit and truncating rounds the
// magnitude correctly for every finite float32, overflowing into the infinity encoding where it should.
DPT_HOST_DEVICE BFloat16 to_bfloat16(float x) {
  uint32_t u = bf16_float_bits(x);
  if ((u & 0x7F800000u) == 0x7F800000u) {
    // Infinity: its top half. NaN: its top half with the quiet bit set, so a payload that lived only in the
    // low 16 bits cannot truncate into an infinity.
    const bool nan = (u & 0x007FFFFFu) != 0;
    return BFloat16{static_cast<uint16_t>((u >> 16) | (nan ? 0x0040u : 0u))};
  }
  u += 0x7FFFu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

// Exact.
DPT_HOST_DEVICE float to_float(BFloat16 b) { return bf16_bits_float(static_cast<uint32_t>(b.bits) << 16); }

// x rounded to the nearest bfloat16, as a float32 (what a conversion to bfloat16 and back does).
DPT_HOST_DEVICE float round_to_bf16(float x) { return to_float(to_bfloat16(x)); }

// a + b in float32, rounded to bfloat16: one step of a bfloat16 sum reduction.
DPT_HOST_DEVICE BFloat16 bf16_add(BFloat16 a, BFloat16 b) { return to_bfloat16(to_float(a) + to_float(b)); }

}  // namespace dpt
