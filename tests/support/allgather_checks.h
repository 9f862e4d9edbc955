// tests/support/allgather_checks.h: allgather of any host ProcessGroup in the form ZeRO uses it (the Gloo unit test
// runs it with ranks as threads, tests/mpi under mpirun on mpi and gloo). Every rank calls check_allgather(pg, fail)
// with the same group; each difference is reported through `fail`. Header-only, test code only.
//
// ZeRO gathers each parameter bucket in place: the output is a view inside one flat buffer (not at its start) and the
// input is this rank's slot of it. Rank r's element i in round k is r * 8 + i % 29 + 64 * k + 0.5 * (i % 2) (int64 and
// bfloat16 round it, the expectation alike: an allgather moves bits); the flat buffer has sentinels before and after
// the output, which must stay as they were. What is checked, for n in {0, 1, 4, 100, 1001} and float32, int64,
// bfloat16:
//  - in place, with a label (AllgatherOptions::what), twice with other values (a backend keeping per-buffer state
//    must not keep data);
//  - out of place into the same view;
//  - an input that overlaps the output elsewhere than this rank's slot is refused (InternalError) before any
//    communication, without breaking the group (a barrier follows).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>

#include "comm/process_group.h"
#include "core/bfloat16.h"
#include "core/check.h"

namespace dpt::testing {

using AgFailFn = std::function<void(const std::string&)>;

template <class T>
T ag_of(float v) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return to_bfloat16(v);
  else
    return static_cast<T>(v);
}

template <class T>
bool ag_same(T a, T b) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return a.bits == b.bits;
  else
    return a == b;
}

template <class T>
float ag_float(T v) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return to_float(v);
  else
    return static_cast<float>(v);
}

template <class T>
void check_allgather_of(comm::ProcessGroup& pg, const AgFailFn& fail, size_t n) {
  const int r = pg.rank();
  const int w = pg.size();
  const size_t total = n * static_cast<size_t>(w);
  constexpr size_t kLead = 3, kTail = 2;  // sentinels around the output
  const std::string tag =
      fmt::format("{} allgather {} n={} rank {} of {}", pg.backend(), dtype_name(dtype_of<T>()), n, r, w);
  // Round `round` of rank q's element i.
  auto value = [](int q, size_t i, int round) {
    return static_cast<float>(q * 8 + static_cast<int>(i % 29) + round * 64) + 0.5f * static_cast<float>(i % 2);
  };
  const float sentinel = -7.0f;

  Tensor flat = Tensor::empty({static_cast<int64_t>(kLead + total + kTail)}, dtype_of<T>());
  for (size_t j = 0; j < flat.numel(); ++j) flat.data<T>()[j] = ag_of<T>(sentinel);
  Tensor out = flat.view(kLead, {static_cast<int64_t>(total)});
  Tensor slot = out.view(static_cast<size_t>(r) * n, {static_cast<int64_t>(n)});

  // Every element of `flat`: sentinels outside the output, rank j / n's value(j % n) inside.
  auto expect_flat = [&](const std::string& what, int round) {
    for (size_t j = 0; j < flat.numel(); ++j) {
      const bool inside = j >= kLead && j < kLead + total;
      const float want =
          inside ? value(static_cast<int>((j - kLead) / n), (j - kLead) % n, round) : sentinel;
      if (!ag_same(flat.data<T>()[j], ag_of<T>(want))) {
        fail(fmt::format("{} {}: element {} of the flat buffer (output starts at {}) is {}, expected {}", what, tag, j,
                         kLead, ag_float(flat.data<T>()[j]), want));
        return;
      }
    }
  };

  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < n; ++i) slot.data<T>()[i] = ag_of<T>(value(r, i, round));
    pg.allgather(slot, out, {.what = "params bucket 3"})->wait();
    expect_flat(fmt::format("in place, round {},", round), round);
  }

  // Out of place into the same view: the input a separate tensor.
  Tensor in = Tensor::empty({static_cast<int64_t>(n)}, dtype_of<T>());
  for (size_t i = 0; i < n; ++i) in.data<T>()[i] = ag_of<T>(value(r, i, 2));
  for (size_t j = 0; j < total; ++j) out.data<T>()[j] = ag_of<T>(sentinel);
  pg.allgather(in, out)->wait();
  expect_flat("out of place", 2);

  // One element past this rank's slot (n >= 2: still inside the output): refused on every rank alike.
  if (n >= 2) {
    Tensor shifted = flat.view(kLead + static_cast<size_t>(r) * n + 1, {static_cast<int64_t>(n)});
    try {
      pg.allgather(shifted, out);
      fail(tag + ": an input overlapping other slots of the output did not throw");
    } catch (const InternalError& e) {
      const std::string want = fmt::format("{} allgather on rank {}: the input starts at byte {} of the output, "
                                           "overlapping it, but this rank's slot starts at byte {}",
                                           pg.backend(), r, (static_cast<size_t>(r) * n + 1) * sizeof(T),
                                           static_cast<size_t>(r) * n * sizeof(T));
      if (std::string(e.what()).find(want) == std::string::npos)
        fail(fmt::format("{}: the overlapping input said '{}'", tag, e.what()));
    }
  }
}

inline void check_allgather(comm::ProcessGroup& pg, const AgFailFn& fail) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4}, size_t{100}, size_t{1001}}) {
    check_allgather_of<float>(pg, fail, n);
    check_allgather_of<int64_t>(pg, fail, n);
    check_allgather_of<BFloat16>(pg, fail, n);
  }
  pg.barrier()->wait();
}

}  // namespace dpt::testing
