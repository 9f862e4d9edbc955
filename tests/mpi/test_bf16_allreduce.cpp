// tests/mpi/test_bf16_allreduce.cpp: run under mpirun (-np 2, -np 3). The bfloat16 sum all-reduce (what
// dist.grad_dtype = bf16 sends) on the mpi backend and on a gloo group built in the same processes, against
// the closed-form values of tests/support/bf16_allreduce_checks.h; then, with two ranks, the two backends must
// agree bit for bit on rank-specific random values. Exits non-zero on any failure, printing what differed.

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "comm/env.h"
#include "comm/init.h"
#include "core/check.h"
#include "core/logging.h"
#include "core/net.h"
#include "tests/support/bf16_allreduce_checks.h"
#include "tests/support/mpi_harness.h"

using namespace dpt;
using namespace dpt::comm;

namespace {

using test::mpi::fail;
using test::mpi::fail_text;

// Two ranks, rank-specific values whose sums need rounding: both backends must give the same bits (a + b
// rounded equals b + a rounded). With three ranks each backend adds in its own order, and rounded additions
// do not associate: the closed-form checks above cover that case.
void check_agreement(ProcessGroup& a, ProcessGroup& b) {
  if (a.size() != 2) return;
  const size_t n = 4099;
  auto value = [&](size_t i) { return dpt::testing::bf16_check_random(a.rank(), i) * 3.0f; };
  Tensor x = dpt::testing::bf16_filled(n, value);
  Tensor y = dpt::testing::bf16_filled(n, value);
  a.allreduce(x, {.op = ReduceOp::Sum})->wait();
  b.allreduce(y, {.op = ReduceOp::Sum})->wait();
  for (size_t i = 0; i < n; ++i) {
    if (x.data<BFloat16>()[i].bits != y.data<BFloat16>()[i].bits) {
      fail("bf16 sum: {} gives 0x{:04x} but {} gives 0x{:04x} at element {}", a.backend(), x.data<BFloat16>()[i].bits,
           b.backend(), y.data<BFloat16>()[i].bits, i);
      break;
    }
  }
}

int run() {
  const DistEnv env = test::mpi::start();
  auto mpi = init_process_group(env, {"mpi", std::chrono::seconds(60)});
  if (mpi->backend() != "mpi") fail("init_process_group(mpi) built backend {}", mpi->backend());
  dpt::testing::check_bf16_allreduce(*mpi, fail_text);
  auto gloo = test::mpi::gloo_beside(*mpi, env);
  dpt::testing::check_bf16_allreduce(*gloo, fail_text);
  check_agreement(*mpi, *gloo);
  return test::mpi::finish("test_bf16_allreduce", env, mpi, gloo);
}

}  // namespace

int main() { return dpt::test::mpi::main_of("test_bf16_allreduce", run); }
