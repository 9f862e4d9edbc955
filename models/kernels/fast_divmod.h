// models/kernels/fast_divmod.h: division of a non-negative 31-bit index by a divisor fixed at launch, by one
// multiply-high and a shift (Granlund & Montgomery; CUTLASS's FastDivmod), for the CUDA kernels that turn a flat
// element index into its (image, channel, row, column): a 64-bit '/' or '%' is a software routine of tens of
// instructions on a GPU, and with several per element the batch-norm and pooling kernels over N*C*H*W were bound by
// that arithmetic, not by memory. Compiled into both sets (nvcc and g++), so the CPU unit tests check it against
// '/' (tests/unit/models/test_fast_divmod.cpp).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DPT_FD_HD __host__ __device__ __forceinline__
#else
#define DPT_FD_HD inline
#endif

namespace dpt::models {

// The largest numerator FastDivmod divides exactly: 2^31 - 1 (the launchers take the 64-bit path past it).
inline constexpr int64_t kFastDivmodMax = (int64_t{1} << 31) - 1;

// n / d and n % d for 0 <= n <= kFastDivmodMax and a fixed 1 <= d <= 2^31. With l = ceil(log2 d) and
// m = ceil(2^(31+l) / d) (which fits 32 bits), n / d = (n m) >> (31 + l): m d - 2^(31+l) = e < d <= 2^l, so
// n e < 2^(31+l) and the error term n e / (d 2^(31+l)) < 1/d cannot carry floor(n / d) past the next integer.
// d = 0 (an empty shape, never divided by) is taken as 1.
struct FastDivmod {
  uint32_t d = 1, mul = 0, shr = 0;

  FastDivmod() = default;
  explicit FastDivmod(int64_t divisor) : d(divisor > 1 ? static_cast<uint32_t>(divisor) : 1u) {
    if (d == 1) return;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;  // ceil(log2 d), 1..31
    mul = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + d - 1) / d);
    shr = l - 1;  // (31 + l) - 32: the high word's shift
  }

  DPT_FD_HD uint32_t div(uint32_t n) const { return d == 1 ? n : mulhi(n, mul) >> shr; }
  DPT_FD_HD uint32_t mod(uint32_t n) const { return n - div(n) * d; }

  static DPT_FD_HD uint32_t mulhi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return static_cast<uint32_t>((uint64_t{a} * b) >> 32);
#endif
  }
};

}  // namespace dpt::models
