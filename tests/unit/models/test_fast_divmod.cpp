// tests/unit/models/test_fast_divmod.cpp: FastDivmod (models/kernels/fast_divmod.h), the multiply-high division the
// CUDA batch-norm and pooling kernels use for their index arithmetic, against '/' and '%' on the CPU (the same code
// nvcc compiles, but for __umulhi): every divisor up to 4096 and the ResNet shapes' (hw, h, w, c), each with random
// numerators and the edges (0, multiples of d and their neighbours, 2^31 - 1); powers of two up to 2^31.
#include <catch2/catch.hpp>

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "models/kernels/fast_divmod.h"

using dpt::models::FastDivmod;
using dpt::models::kFastDivmodMax;

namespace {

// The first numerator FastDivmod(d) gets wrong among the edges and `randoms` draws, or -1.
int64_t first_wrong(int64_t d, std::mt19937_64& rng, int randoms) {
  const FastDivmod f(d);
  std::vector<int64_t> ns = {0, 1, d - 1, d, d + 1, kFastDivmodMax, kFastDivmodMax - 1, kFastDivmodMax - d};
  for (int64_t k : {int64_t{2}, int64_t{3}, kFastDivmodMax / d, kFastDivmodMax / d - 1})
    for (int64_t off : {int64_t{-1}, int64_t{0}, int64_t{1}}) ns.push_back(k * d + off);
  std::uniform_int_distribution<int64_t> any(0, kFastDivmodMax);
  for (int i = 0; i < randoms; ++i) ns.push_back(any(rng));
  for (const int64_t n : ns) {
    if (n < 0 || n > kFastDivmodMax) continue;
    const auto u = static_cast<uint32_t>(n);
    if (f.div(u) != static_cast<uint32_t>(n / d) || f.mod(u) != static_cast<uint32_t>(n % d)) return n;
  }
  return -1;
}

}  // namespace

TEST_CASE("FastDivmod divides every 31-bit numerator as '/' and '%' do", "[models][kernels]") {
  std::mt19937_64 rng(2026);
  for (int64_t d = 1; d <= 4096; ++d) {
    CAPTURE(d);
    REQUIRE(first_wrong(d, rng, 200) == -1);
  }
  // ResNet's planes and channel counts (hw 112^2, 56^2, 28^2, 14^2, 7^2; c up to 2048), odd and large divisors.
  const std::initializer_list<int64_t> resnet = {12544,    3136,    784,     196,      49,
                                                2048,     100003,  65535,   65536,    65537,
                                                1 << 20,  12345679, 1 << 30, (int64_t{1} << 30) + 1,
                                                kFastDivmodMax, int64_t{1} << 31};
  for (const int64_t d : resnet) {
    CAPTURE(d);
    REQUIRE(first_wrong(d, rng, 100000) == -1);
  }
  for (int shift = 0; shift <= 31; ++shift) {
    CAPTURE(shift);
    REQUIRE(first_wrong(int64_t{1} << shift, rng, 1000) == -1);
  }
  // d = 0 (an empty shape's, never divided by) is taken as 1, not a division by zero when the plan is made.
  REQUIRE(FastDivmod(0).div(7) == 7);
}

TEST_CASE("FastDivmod exhaustively for small numerators and divisors", "[models][kernels]") {
  for (uint32_t d = 1; d <= 300; ++d) {
    const FastDivmod f(d);
    for (uint32_t n = 0; n < 70000; ++n)
      if (f.div(n) != n / d || f.mod(n) != n % d) FAIL("d " << d << " n " << n << ": " << f.div(n) << " " << f.mod(n));
  }
}
