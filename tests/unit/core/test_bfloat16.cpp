// tests/unit/core/test_bfloat16.cpp: the one float32 -> bfloat16 rounding (ties to even, inf and NaN kept,
// overflow to inf, subnormals), the bfloat16 addition of the compressed all-reduce, and the whole-tensor
// conversions on the CPU, against bit patterns worked out by hand.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>

#include "core/bfloat16.h"
#include "core/bfloat16_convert.h"
#include "core/check.h"
#include "core/tensor.h"

using namespace dpt;

namespace {

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
uint16_t bits_of(float x) { return to_bfloat16(x).bits; }

}  // namespace

TEST_CASE("bfloat16: round to nearest, ties to even", "[core][bf16]") {
  // bfloat16 keeps 7 mantissa bits: next to 1 the spacing is 2^-7.
  CHECK(bits_of(1.0f) == 0x3F80);
  CHECK(bits_of(1.0f + 0x1p-7f) == 0x3F81);                 // representable
  CHECK(bits_of(1.0f + 0x1p-8f) == 0x3F80);                 // halfway between 0x3F80 (even) and 0x3F81
  CHECK(bits_of(1.0f + 3 * 0x1p-8f) == 0x3F82);             // halfway between 0x3F81 and 0x3F82 (even)
  CHECK(bits_of(1.0f + 0x1p-8f + 0x1p-20f) == 0x3F81);      // just above halfway: up
  CHECK(bits_of(1.0f + 0x1p-8f - 0x1p-20f) == 0x3F80);      // just below: down
  CHECK(bits_of(-(1.0f + 3 * 0x1p-8f)) == 0xBF82);          // the sign does not change the magnitude's rounding
  CHECK(bits_of(0.0f) == 0x0000);
  CHECK(bits_of(-0.0f) == 0x8000);
  CHECK(bits_of(3.0f + 3 * 0x1p-7f) == 0x4042);             // 3.0234375: halfway in [2, 4) -> 3.03125 (even)
  CHECK(to_float(BFloat16{0x4042}) == 3.03125f);
}

TEST_CASE("bfloat16: infinities, NaN, overflow and subnormals", "[core][bf16]") {
  CHECK(bits_of(INFINITY) == 0x7F80);
  CHECK(bits_of(-INFINITY) == 0xFF80);
  CHECK(std::isnan(to_float(to_bfloat16(NAN))));
  CHECK(std::isnan(to_float(to_bfloat16(-NAN))));
  // A NaN whose payload lies only in the low 16 bits must not truncate into an infinity.
  CHECK(std::isnan(to_float(to_bfloat16(from_bits(0x7F800001u)))));
  CHECK(std::isnan(to_float(to_bfloat16(from_bits(0xFF800001u)))));
  CHECK(bits_of(FLT_MAX) == 0x7F80);                       // past the largest bfloat16's halfway point
  CHECK(bits_of(from_bits(0x7F7F0000u)) == 0x7F7F);        // the largest bfloat16 itself
  CHECK(bits_of(from_bits(0x7F7F7FFFu)) == 0x7F7F);        // just below halfway to 2^128: stays finite
  CHECK(bits_of(from_bits(0x00000001u)) == 0x0000);        // the smallest subnormal: down to 0
  CHECK(bits_of(from_bits(0x00018000u)) == 0x0002);        // halfway, odd below: up to even
  CHECK(bits_of(from_bits(0x00028000u)) == 0x0002);        // halfway, even below: stays
  CHECK(to_float(BFloat16{0x0001}) == from_bits(0x00010000u));  // widening is exact, subnormals too
}

TEST_CASE("bfloat16: round_to_bf16 and bf16_add", "[core][bf16]") {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-100.0f, 100.0f);
  for (int i = 0; i < 1000; ++i) {
    const float x = u(gen);
    const float r = round_to_bf16(x);
    CHECK(std::fabs(r - x) <= std::fabs(x) * 0x1p-8f);  // half a unit in the last of 8 significant bits
    CHECK(round_to_bf16(r) == r);                       // idempotent
  }
  const BFloat16 one_and_a_bit = to_bfloat16(1.0f + 0x1p-7f);
  CHECK(to_float(bf16_add(one_and_a_bit, one_and_a_bit)) == 2.0f + 0x1p-6f);  // exact
  CHECK(bf16_add(to_bfloat16(1.0f), to_bfloat16(0x1p-8f)).bits == 0x3F80);     // 1 + 2^-8: tie, to even (1)
  CHECK(bf16_add(to_bfloat16(256.0f), to_bfloat16(1.0f)).bits == to_bfloat16(256.0f).bits);  // 257: tie -> 256
  CHECK(bf16_add(to_bfloat16(256.0f), to_bfloat16(3.0f)).bits == to_bfloat16(260.0f).bits);  // 259: tie -> 260
  CHECK(to_float(bf16_add(to_bfloat16(INFINITY), to_bfloat16(1.0f))) == INFINITY);
  CHECK(std::isnan(to_float(bf16_add(to_bfloat16(INFINITY), to_bfloat16(-INFINITY)))));
}

TEST_CASE("bfloat16 tensors: dtype, and the CPU conversions", "[core][bf16]") {
  CHECK(dtype_size(DType::BF16) == 2);
  CHECK(std::string(dtype_name(DType::BF16)) == "bfloat16");
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}}) {
    Tensor x = Tensor::empty({static_cast<int64_t>(n)});
    std::mt19937 gen(static_cast<unsigned>(n));
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) x.data<float>()[i] = d(gen);
    if (n > 3) {
      x.data<float>()[0] = INFINITY;
      x.data<float>()[1] = NAN;
      x.data<float>()[2] = 3.0f;
    }
    Tensor b = Tensor::empty({static_cast<int64_t>(n)}, DType::BF16);
    Tensor back = Tensor::empty({static_cast<int64_t>(n)});
    for (float divisor : {1.0f, 2.0f, 3.0f}) {
      to_bfloat16(x, b, divisor);
      from_bfloat16(b, back);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = to_bfloat16(x.data<float>()[i] / divisor).bits;  // divide in fp32, round once
        REQUIRE(b.data<BFloat16>()[i].bits == want);
        const float w = to_float(BFloat16{want});
        REQUIRE((std::isnan(w) ? std::isnan(back.data<float>()[i]) : back.data<float>()[i] == w));
      }
      if (n > 3) CHECK(back.data<float>()[2] == 3.0f / divisor);  // 3/3 = 1 and 3/2 = 1.5 are exact
    }
  }
  Tensor f = Tensor::zeros({4});
  Tensor b3 = Tensor::zeros({3}, DType::BF16);
  CHECK_THROWS_AS(to_bfloat16(f, b3), InternalError);   // sizes differ
  CHECK_THROWS_AS(to_bfloat16(f, f), InternalError);    // not a bfloat16 destination
  CHECK_THROWS_AS(from_bfloat16(f, f), InternalError);  // not a bfloat16 source
}
