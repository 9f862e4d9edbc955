// tests/support/reduce_scatter_checks.h: reduce_scatter of any host ProcessGroup against closed-form values (the
// Gloo unit test runs it with ranks as threads, tests/mpi under mpirun on mpi and gloo). Every rank calls
// check_reduce_scatter(pg, fail) with the same group; each difference is reported through `fail`. Header-only,
// test code only.
//
// The input is size() chunks of n elements; at flat index j = q * n + i (chunk q) rank r contributes
// (r + 1) * (j + 1), so rank r must end with S * (r * n + i + 1), S = sum over ranks of (r + 1): every sum is an
// exact integer in any order of additions. What is checked, for n in {0, 1, 4, 100, 1001}:
//  - Sum, Avg (floating point), Max (with even j negated, so the max is -(j + 1) there and size() * (j + 1) else)
//    on float32, float64, int32, int64 (int64 also past 32 bits); Avg on integers refused;
//  - a second call with other values and the same shape (a backend that keeps per-shape state must not keep data);
//  - the output inside the input (this rank's own chunk), as a ZeRO shard may be;
//  - bfloat16 Sum on small integers (exact), and bfloat16 Max refused;
// each refusal without breaking the group (a barrier follows).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>

#include "comm/process_group.h"
#include "core/bfloat16.h"
#include "core/check.h"

namespace dpt::testing {

using RsFailFn = std::function<void(const std::string&)>;

template <class T>
Tensor rs_filled(size_t n, const std::function<T(size_t)>& f) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)}, dtype_of<T>());
  for (size_t i = 0; i < n; ++i) t.data<T>()[i] = f(i);
  return t;
}

// Reports the first element of t that differs from want(i).
template <class T>
void rs_expect(const RsFailFn& fail, const std::string& what, const Tensor& t, const std::function<T(size_t)>& want) {
  for (size_t i = 0; i < t.numel(); ++i) {
    if (t.data<T>()[i] != want(i)) {
      fail(fmt::format("{}: element {} is {}, expected {}", what, i, t.data<T>()[i], want(i)));
      return;
    }
  }
}

template <class T>
void check_reduce_scatter_of(comm::ProcessGroup& pg, const RsFailFn& fail, size_t n) {
  using comm::ReduceOp;
  const int r = pg.rank();
  const int w = pg.size();
  const size_t total = n * static_cast<size_t>(w);
  const auto S = static_cast<T>(w * (w + 1) / 2);
  const std::string tag = fmt::format("{} reduce_scatter {} n={} rank {} of {}", pg.backend(),
                                      dtype_name(dtype_of<T>()), n, r, w);
  // The flat input index of element i of this rank's chunk.
  auto j_of = [&](size_t i) { return static_cast<size_t>(r) * n + i; };
  auto contribution = [&](int rank, size_t j) { return static_cast<T>((rank + 1) * static_cast<T>(j + 1)); };

  Tensor in = rs_filled<T>(total, [&](size_t j) { return contribution(r, j); });
  Tensor out = Tensor::zeros({static_cast<int64_t>(n)}, dtype_of<T>());
  pg.reduce_scatter(in, out, {.op = ReduceOp::Sum})->wait();
  rs_expect<T>(fail, "sum " + tag, out, [&](size_t i) { return static_cast<T>(S * static_cast<T>(j_of(i) + 1)); });

  // The same shape again, other values: twice each contribution.
  in = rs_filled<T>(total, [&](size_t j) { return static_cast<T>(2 * contribution(r, j)); });
  pg.reduce_scatter(in, out, {.op = ReduceOp::Sum})->wait();
  rs_expect<T>(fail, "second sum " + tag, out,
               [&](size_t i) { return static_cast<T>(2 * S * static_cast<T>(j_of(i) + 1)); });

  in = rs_filled<T>(total, [&](size_t j) {
    T v = contribution(r, j);
    return j % 2 == 0 ? static_cast<T>(-v) : v;
  });
  pg.reduce_scatter(in, out, {.op = ReduceOp::Max})->wait();
  rs_expect<T>(fail, "max " + tag, out, [&](size_t i) {
    const size_t j = j_of(i);
    return j % 2 == 0 ? static_cast<T>(-static_cast<T>(j + 1)) : static_cast<T>(w * static_cast<T>(j + 1));
  });

  // The output is this rank's chunk of the input itself.
  in = rs_filled<T>(total, [&](size_t j) { return contribution(r, j); });
  Tensor own = in.view(static_cast<size_t>(r) * n, {static_cast<int64_t>(n)});
  pg.reduce_scatter(in, own, {.op = ReduceOp::Sum})->wait();
  rs_expect<T>(fail, "sum into own chunk " + tag, own,
               [&](size_t i) { return static_cast<T>(S * static_cast<T>(j_of(i) + 1)); });

  if constexpr (std::is_floating_point_v<T>) {
    in = rs_filled<T>(total, [&](size_t j) { return contribution(r, j); });
    pg.reduce_scatter(in, out, {.op = ReduceOp::Avg})->wait();
    rs_expect<T>(fail, "avg " + tag, out,
                 [&](size_t i) { return static_cast<T>(S * static_cast<T>(j_of(i) + 1)) / static_cast<T>(w); });
  } else {
    try {
      pg.reduce_scatter(in, out, {.op = ReduceOp::Avg});
      fail(tag + ": integer avg did not throw");
    } catch (const UnsupportedError& e) {
      if (std::string(e.what()).find("reduce_scatter with op avg") == std::string::npos)
        fail(fmt::format("{}: integer avg said '{}'", tag, e.what()));
    }
    if constexpr (sizeof(T) == 8) {
      in = rs_filled<T>(total, [&](size_t j) { return static_cast<T>((int64_t{r} + 1) << 40) + static_cast<T>(j); });
      pg.reduce_scatter(in, out, {.op = ReduceOp::Sum})->wait();
      rs_expect<T>(fail, "sum past 32 bits " + tag, out, [&](size_t i) {
        return static_cast<T>(static_cast<int64_t>(S) << 40) + static_cast<T>(w) * static_cast<T>(j_of(i));
      });
    }
  }
}

inline void check_reduce_scatter(comm::ProcessGroup& pg, const RsFailFn& fail) {
  using comm::ReduceOp;
  const int r = pg.rank();
  const int w = pg.size();
  for (size_t n : {size_t{0}, size_t{1}, size_t{4}, size_t{100}, size_t{1001}}) {
    check_reduce_scatter_of<float>(pg, fail, n);
    check_reduce_scatter_of<double>(pg, fail, n);
    check_reduce_scatter_of<int32_t>(pg, fail, n);
    check_reduce_scatter_of<int64_t>(pg, fail, n);

    // bfloat16 sum of small integers, exact: rank r contributes (r + 1) * (j % 8 + 1), at most 6 * 8 summed.
    const size_t total = n * static_cast<size_t>(w);
    Tensor in = Tensor::empty({static_cast<int64_t>(total)}, DType::BF16);
    for (size_t j = 0; j < total; ++j) in.data<BFloat16>()[j] = to_bfloat16(static_cast<float>((r + 1) * (j % 8 + 1)));
    Tensor out = Tensor::zeros({static_cast<int64_t>(n)}, DType::BF16);
    pg.reduce_scatter(in, out, {.op = ReduceOp::Sum})->wait();
    for (size_t i = 0; i < n; ++i) {
      const size_t j = static_cast<size_t>(r) * n + i;
      const float want = static_cast<float>(w * (w + 1) / 2 * static_cast<int>(j % 8 + 1));
      if (out.data<BFloat16>()[i].bits != to_bfloat16(want).bits) {
        fail(fmt::format("{} reduce_scatter bf16 n={} rank {}: element {} is {}, expected {}", pg.backend(), n, r, i,
                         to_float(out.data<BFloat16>()[i]), want));
        break;
      }
    }
  }
  Tensor in = Tensor::zeros({static_cast<int64_t>(w)}, DType::BF16);
  Tensor out = Tensor::zeros({1}, DType::BF16);
  try {
    pg.reduce_scatter(in, out, {.op = ReduceOp::Max});
    fail(fmt::format("{} rank {}: bfloat16 max reduce_scatter did not throw", pg.backend(), r));
  } catch (const UnsupportedError& e) {
    if (std::string(e.what()).find("reduce_scatter with op max on bfloat16") == std::string::npos)
      fail(fmt::format("{} rank {}: bfloat16 max reduce_scatter said '{}'", pg.backend(), r, e.what()));
  }
  pg.barrier()->wait();
}

}  // namespace dpt::testing
