// tests/support/bf16_allreduce_checks.h: the bfloat16 sum all-reduce of any ProcessGroup against closed-form
// values, for world sizes 1 to 3 (the Gloo unit test runs it with ranks as threads, tests/mpi under mpirun
// on mpi and gloo). Every rank calls check_bf16_allreduce(pg, fail) with the same group; each difference is
// reported through `fail`. Header-only, test code only.
//
// What is checked, for element counts {0, 1, 4, 100, 1001, 100003} (odd, and past Gloo's ring segments):
//  - small integers: every partial sum exact, so the result is exact whatever the order of additions;
//  - values that need rounding: every rank holds the same x, so the sum of w <= 3 copies is bf16(w * x)
//    in any order (x + x is exact); ties to even included;
//  - inf, -inf and NaN from one rank survive the sum;
//  - rank-specific random values: every rank ends with the same bits (allgather), within the rounding of
//    w - 1 bfloat16 additions of the exact sum;
//  - Avg and Max on bfloat16 are refused (UnsupportedError), without breaking the group.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "comm/process_group.h"
#include "core/bfloat16.h"
#include "core/check.h"

namespace dpt::testing {

using FailFn = std::function<void(const std::string&)>;

// A deterministic value in [-8, 8) for (rank, index), known to every rank.
inline float bf16_check_random(int rank, size_t i) {
  uint64_t x = (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 32;
  return static_cast<float>(static_cast<double>(x % 1000003) / 1000003.0 * 16.0 - 8.0);
}

inline Tensor bf16_filled(size_t n, const std::function<float(size_t)>& f) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)}, DType::BF16);
  for (size_t i = 0; i < n; ++i) t.data<BFloat16>()[i] = to_bfloat16(f(i));
  return t;
}

// Reports the first element whose bits differ from want(i) (NaN matches any NaN).
inline void bf16_expect(const FailFn& fail, const std::string& what, const Tensor& t,
                        const std::function<float(size_t)>& want) {
  for (size_t i = 0; i < t.numel(); ++i) {
    const BFloat16 got = t.data<BFloat16>()[i];
    const BFloat16 exp = to_bfloat16(want(i));
    const bool both_nan = std::isnan(to_float(got)) && std::isnan(to_float(exp));
    if (got.bits != exp.bits && !both_nan) {
      fail(fmt::format("{}: element {} is {} (0x{:04x}), expected {} (0x{:04x})", what, i, to_float(got), got.bits,
                       to_float(exp), exp.bits));
      return;
    }
  }
}

inline void check_bf16_allreduce(comm::ProcessGroup& pg, const FailFn& fail) {
  using comm::ReduceOp;
  const int r = pg.rank();
  const int w = pg.size();
  DPT_CHECK(w <= 3, "the closed forms below hold for up to 3 ranks, not {}", w);
  const std::string who = fmt::format("{} bf16 rank {} of {}", pg.backend(), r, w);

  for (size_t n : {size_t{0}, size_t{1}, size_t{4}, size_t{100}, size_t{1001}, size_t{100003}}) {
    // Small integers: rank r holds (r + 1) * k, k = i % 7 + 1; the sum k * w(w+1)/2 <= 42 is exact in bf16.
    Tensor t = bf16_filled(n, [&](size_t i) { return static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1)); });
    pg.allreduce(t, {.op = ReduceOp::Sum})->wait();
    bf16_expect(fail, fmt::format("{} n={}: integers", who, n), t,
                [&](size_t i) { return static_cast<float>(static_cast<int>(i % 7 + 1) * w * (w + 1) / 2); });

    // Rounding: x = +-(1 + m 2^-7) * 2^e (m = i % 128, e in -3..3) on every rank: the sum is bf16(w x). With
    // w = 3 and odd m that lands halfway between two bfloat16s or off them: ties to even, or plain rounding.
    auto x_of = [](size_t i) {
      const float m = static_cast<float>(i % 128);
      const float v = std::ldexp(1.0f + m * 0x1p-7f, static_cast<int>(i % 7) - 3);
      return i % 2 ? -v : v;
    };
    t = bf16_filled(n, x_of);
    pg.allreduce(t, {.op = ReduceOp::Sum})->wait();
    bf16_expect(fail, fmt::format("{} n={}: rounding", who, n), t,
                [&](size_t i) { return static_cast<float>(w) * x_of(i); });  // w * x is exact in float32

    // Random values per rank: the same bits everywhere, and close to the exact sum.
    t = bf16_filled(n, [&](size_t i) { return bf16_check_random(r, i); });
    pg.allreduce(t, {.op = ReduceOp::Sum})->wait();
    Tensor all = Tensor::zeros({static_cast<int64_t>(n * static_cast<size_t>(w))}, DType::BF16);
    pg.allgather(t, all)->wait();
    for (size_t i = 0; i < n; ++i) {
      bool same = true;
      for (int q = 0; q < w; ++q) same = same && all.data<BFloat16>()[static_cast<size_t>(q) * n + i].bits == t.data<BFloat16>()[i].bits;
      if (!same) {
        fail(fmt::format("{} n={}: random values: ranks disagree at element {}", who, n, i));
        break;
      }
      double exact = 0.0, magnitude = 0.0;
      for (int q = 0; q < w; ++q) {
        const double v = to_float(to_bfloat16(bf16_check_random(q, i)));
        exact += v;
        magnitude += std::fabs(v);
      }
      const double got = to_float(t.data<BFloat16>()[i]);
      // Each of the w - 1 additions rounds to 8 significant bits: at most 2^-8 of its result, whose magnitude is
      // at most the sum of magnitudes (times 1 + 2^-8 after one rounding: hence 1.01).
      if (std::fabs(got - exact) > (w - 1) * 0x1p-8 * magnitude * 1.01) {
        fail(fmt::format("{} n={}: random values: element {} is {}, the exact sum {} (|sum of |x|| {})", who, n, i,
                         got, exact, magnitude));
        break;
      }
    }
  }

  // Infinities and NaN from single ranks.
  Tensor s = bf16_filled(4, [&](size_t i) {
    if (i == 0 && r == 0) return INFINITY;
    if (i == 1 && r == w - 1) return NAN;
    if (i == 2) return r == 0 ? INFINITY : (r == 1 ? -INFINITY : 1.0f);  // inf - inf = NaN with two ranks or more
    return 1.0f;
  });
  pg.allreduce(s, {.op = ReduceOp::Sum})->wait();
  bf16_expect(fail, who + ": inf and NaN", s, [&](size_t i) {
    if (i == 0) return INFINITY;
    if (i == 1) return NAN;
    if (i == 2) return w == 1 ? INFINITY : NAN;
    return static_cast<float>(w);
  });

  // Only Sum: the others are refused before any communication, and the group stays usable.
  for (ReduceOp op : {ReduceOp::Avg, ReduceOp::Max}) {
    Tensor a = bf16_filled(3, [](size_t) { return 1.0f; });
    try {
      pg.allreduce(a, {.op = op});
      fail(fmt::format("{}: op {} on bfloat16 did not throw", who, reduce_op_name(op)));
    } catch (const UnsupportedError& e) {
      if (std::string(e.what()).find("bfloat16") == std::string::npos)
        fail(fmt::format("{}: op {} on bfloat16 said '{}'", who, reduce_op_name(op), e.what()));
    }
  }
  Tensor last = bf16_filled(5, [](size_t) { return 0.5f; });
  pg.allreduce(last, {.op = ReduceOp::Sum})->wait();
  bf16_expect(fail, who + ": after the refusals", last, [&](size_t) { return 0.5f * static_cast<float>(w); });
}

}  // namespace dpt::testing
