// tests/mpi/test_mpi_collectives.cpp: run under mpirun (-np 2, -np 3). Detects the Open MPI environment,
// checks that backend "auto" resolves to mpi, runs every collective against closed-form values (reduce_scatter's in
// tests/support/reduce_scatter_checks.h, ZeRO's in-place allgather in tests/support/allgather_checks.h), then builds
// a gloo group in the same processes (rendezvous port chosen by rank 0, broadcast over MPI) and checks that the two
// backends agree; and that ranks asking for different backends (rank 1 gloo, the others auto: mpi) fail at once, every
// rank with the same ConfigError naming them. Exits non-zero on any failure, printing what differed.

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "comm/env.h"
#include "comm/init.h"
#include "core/check.h"
#include "core/logging.h"
#include "core/net.h"
#include "tests/support/allgather_checks.h"
#include "tests/support/mpi_harness.h"
#include "tests/support/reduce_scatter_checks.h"

using namespace dpt;
using namespace dpt::comm;

namespace {

using test::mpi::fail;

template <class T>
Tensor filled(size_t n, const std::function<T(size_t)>& f) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)}, dtype_of<T>());
  for (size_t i = 0; i < n; ++i) t.data<T>()[i] = f(i);
  return t;
}

template <class T>
void expect(const std::string& what, const Tensor& t, const std::function<T(size_t)>& want) {
  for (size_t i = 0; i < t.numel(); ++i) {
    if (t.data<T>()[i] != want(i)) {
      fail("{}: element {} is {}, expected {}", what, i, t.data<T>()[i], want(i));
      return;
    }
  }
}

template <class T>
void check_allreduce(ProcessGroup& pg, size_t n) {
  const int r = pg.rank();
  const int w = pg.size();
  const auto S = static_cast<T>(w * (w + 1) / 2);
  const std::string tag = fmt::format("{} {} n={}", pg.backend(), dtype_name(dtype_of<T>()), n);
  Tensor t = filled<T>(n, [&](size_t i) { return static_cast<T>((r + 1) * static_cast<T>(i + 1)); });
  pg.allreduce(t, {ReduceOp::Sum})->wait();
  expect<T>("allreduce sum " + tag, t, [&](size_t i) { return static_cast<T>(S * static_cast<T>(i + 1)); });

  t = filled<T>(n, [&](size_t i) {
    T v = static_cast<T>((r + 1) * static_cast<T>(i + 1));
    return i % 2 == 0 ? static_cast<T>(-v) : v;
  });
  pg.allreduce(t, {ReduceOp::Max})->wait();
  expect<T>("allreduce max " + tag, t, [&](size_t i) {
    return i % 2 == 0 ? static_cast<T>(-static_cast<T>(i + 1)) : static_cast<T>(w * static_cast<T>(i + 1));
  });

  if constexpr (std::is_floating_point_v<T>) {
    t = filled<T>(n, [&](size_t i) { return static_cast<T>((r + 1) * static_cast<T>(i + 1)); });
    pg.allreduce(t, {ReduceOp::Avg})->wait();
    expect<T>("allreduce avg " + tag, t,
              [&](size_t i) { return static_cast<T>(S * static_cast<T>(i + 1)) / static_cast<T>(w); });
  } else {
    Tensor a = filled<T>(1, [](size_t) { return T{0}; });
    try {
      pg.allreduce(a, {ReduceOp::Avg});
      fail("{}: integer avg did not throw", tag);
    } catch (const UnsupportedError&) {
    }
    if constexpr (sizeof(T) == 8) {
      t = filled<T>(n, [&](size_t i) { return static_cast<T>((int64_t{r} + 1) << 40) + static_cast<T>(i); });
      pg.allreduce(t)->wait();
      expect<T>("allreduce sum past 32 bits " + tag, t, [&](size_t i) {
        return static_cast<T>(static_cast<int64_t>(S) << 40) + static_cast<T>(w) * static_cast<T>(i);
      });
    }
  }
}

void check_collectives(ProcessGroup& pg) {
  const int r = pg.rank();
  const int w = pg.size();
  for (size_t n : {size_t{0}, size_t{1}, size_t{4}, size_t{100}, size_t{1001}}) {
    check_allreduce<float>(pg, n);
    check_allreduce<double>(pg, n);
    check_allreduce<int32_t>(pg, n);
    check_allreduce<int64_t>(pg, n);

    for (int root : {0, w - 1}) {
      Tensor t = filled<float>(n, [&](size_t i) { return static_cast<float>(r * 10000 + static_cast<int>(i)); });
      pg.broadcast(t, {root})->wait();
      expect<float>(fmt::format("{} broadcast root {} n={}", pg.backend(), root, n), t,
                    [&](size_t i) { return static_cast<float>(root * 10000 + static_cast<int>(i)); });
    }

    const size_t d = n ? n : 1;
    Tensor in = filled<int32_t>(n, [&](size_t i) { return r * 100000 + static_cast<int32_t>(i); });
    Tensor out = Tensor::zeros({static_cast<int64_t>(n * static_cast<size_t>(w))}, DType::I32);
    pg.allgather(in, out)->wait();
    expect<int32_t>(fmt::format("{} allgather n={}", pg.backend(), n), out, [&](size_t j) {
      return static_cast<int32_t>(j / d) * 100000 + static_cast<int32_t>(j % d);
    });
    Tensor out2 = Tensor::zeros({static_cast<int64_t>(n * static_cast<size_t>(w))}, DType::F64);
    Tensor slot = out2.view(static_cast<size_t>(r) * n, {static_cast<int64_t>(n)});
    for (size_t i = 0; i < n; ++i) slot.data<double>()[i] = r + 0.25 * static_cast<double>(i);
    pg.allgather(slot, out2)->wait();
    expect<double>(fmt::format("{} allgather in place n={}", pg.backend(), n), out2, [&](size_t j) {
      return static_cast<double>(j / d) + 0.25 * static_cast<double>(j % d);
    });
  }
  pg.barrier()->wait();

  dpt::testing::check_reduce_scatter(pg, [](const std::string& what) { fail("{}", what); });
  dpt::testing::check_allgather(pg, [](const std::string& what) { fail("{}", what); });

  // Wrong sizes are refused before any communication, with the same words on every backend.
  Tensor in = Tensor::zeros({static_cast<int64_t>(w + 1)});
  Tensor out = Tensor::zeros({1});
  try {
    pg.reduce_scatter(in, out);
    fail("{}: reduce_scatter of {} elements into 1 on {} ranks did not throw", pg.backend(), w + 1, w);
  } catch (const InternalError& e) {
    std::string want = fmt::format("{} reduce_scatter: input has {} elements, expected {} (group size {} x output's 1)",
                                   pg.backend(), w + 1, w, w);
    if (std::string(e.what()).find(want) == std::string::npos) fail("reduce_scatter said '{}'", e.what());
  }
  pg.barrier()->wait();
}

// Data only this rank has (a hash of rank and index), integer-valued so that sums are exact in any order.
Tensor rank_data(int rank, size_t n) {
  return filled<double>(n, [&](size_t i) {
    uint64_t x = (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    return static_cast<double>(static_cast<int64_t>(x % 2001) - 1000);
  });
}

// The two backends give the same answers to the same questions.
void check_agreement(ProcessGroup& a, ProcessGroup& b) {
  const size_t n = 777;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
    Tensor x = rank_data(a.rank(), n);
    Tensor y = rank_data(b.rank(), n);
    a.allreduce(x, {op})->wait();
    b.allreduce(y, {op})->wait();
    for (size_t i = 0; i < n; ++i) {
      if (x.data<double>()[i] != y.data<double>()[i]) {
        fail("allreduce {}: {} gives {} but {} gives {} at element {}", reduce_op_name(op), a.backend(),
             x.data<double>()[i], b.backend(), y.data<double>()[i], i);
        break;
      }
    }
  }
  Tensor in = rank_data(a.rank(), n);
  Tensor ga = Tensor::zeros({static_cast<int64_t>(n * static_cast<size_t>(a.size()))}, DType::F64);
  Tensor gb = Tensor::zeros({static_cast<int64_t>(n * static_cast<size_t>(a.size()))}, DType::F64);
  a.allgather(in, ga)->wait();
  b.allgather(in, gb)->wait();
  for (size_t i = 0; i < ga.numel(); ++i) {
    if (ga.data<double>()[i] != gb.data<double>()[i]) {
      fail("allgather: {} and {} differ at element {}", a.backend(), b.backend(), i);
      break;
    }
  }
  // reduce_scatter of size() chunks of n: each rank's chunk the same from both.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
    Tensor whole = rank_data(a.rank(), n * static_cast<size_t>(a.size()));
    Tensor x = Tensor::zeros({static_cast<int64_t>(n)}, DType::F64);
    Tensor y = Tensor::zeros({static_cast<int64_t>(n)}, DType::F64);
    a.reduce_scatter(whole, x, {op})->wait();
    b.reduce_scatter(whole, y, {op})->wait();
    for (size_t i = 0; i < n; ++i) {
      if (x.data<double>()[i] != y.data<double>()[i]) {
        fail("reduce_scatter {}: {} gives {} but {} gives {} at element {}", reduce_op_name(op), a.backend(),
             x.data<double>()[i], b.backend(), y.data<double>()[i], i);
        break;
      }
    }
  }
}

// Rank 1 asks for gloo, the others for auto (mpi under mpirun): they once waited, rank 1 at a TcpStore nobody hosted
// and the others in MPI, until the timeout. Now every rank throws the same ConfigError at once.
void check_backend_mismatch(const DistEnv& env) {
  const std::string want = env.world_size == 2
                               ? "(rank 0: mpi (dist.backend = auto); rank 1: gloo)"
                               : "(ranks 0, 2: mpi (dist.backend = auto); rank 1: gloo)";
  try {
    auto pg = init_process_group(env, {env.rank == 1 ? "gloo" : "auto", std::chrono::seconds(60)});
    fail("ranks with backends gloo and mpi built a group: {}", pg->backend());
  } catch (const ConfigError& e) {
    if (std::string(e.what()).find(want) == std::string::npos)
      fail("backend mismatch: '{}' lacks '{}'", e.what(), want);
  } catch (const std::exception& e) {
    fail("backend mismatch: not a ConfigError: {}", e.what());
  }
}

int run() {
  const DistEnv env = test::mpi::start();
  if (!env.mpi_available) fail("mpi_available is false under mpirun");
  if (resolve_backend("auto", env) != "mpi") fail("backend auto resolves to {}", resolve_backend("auto", env));

  auto mpi = init_process_group(env, {"auto", std::chrono::seconds(60)});
  if (mpi->backend() != "mpi") fail("init_process_group(auto) built backend {}", mpi->backend());
  if (mpi->rank() != env.rank || mpi->size() != env.world_size) {
    fail("mpi group is rank {} of {}, the environment says {} of {}", mpi->rank(), mpi->size(), env.rank, env.world_size);
  }
  check_collectives(*mpi);
  check_backend_mismatch(env);

  auto gloo = test::mpi::gloo_beside(*mpi, env);
  if (gloo->backend() != "gloo") fail("init_process_group(gloo) built backend {}", gloo->backend());
  check_collectives(*gloo);
  check_agreement(*mpi, *gloo);
  return test::mpi::finish("test_mpi_collectives", env, mpi, gloo);
}

}  // namespace

int main() { return dpt::test::mpi::main_of("test_mpi_collectives", run); }
