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

using namespace dpt;
using namespace dpt::comm;

namespace {

int g_failures = 0;
int g_rank = -1;

void fail(const std::string& what) {
  ++g_failures;
  if (g_failures <= 20) std::fprintf(stderr, "[rank %d] FAILED: %s\n", g_rank, what.c_str());
}

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
      fail(fmt::format("bf16 sum: {} gives 0x{:04x} but {} gives 0x{:04x} at element {}", a.backend(),
                       x.data<BFloat16>()[i].bits, b.backend(), y.data<BFloat16>()[i].bits, i));
      break;
    }
  }
}

int run() {
  DistEnv env = detect_env(process_env());
  g_rank = env.rank;
  init_logging(env.rank, env.world_size);
  if (env.launcher != Launcher::OpenMPI) fail(fmt::format("launcher is {}, expected openmpi (run me under mpirun)", launcher_name(env.launcher)));

  auto mpi = init_process_group(env, {"mpi", std::chrono::seconds(60)});
  if (mpi->backend() != "mpi") fail(fmt::format("init_process_group(mpi) built backend {}", mpi->backend()));
  dpt::testing::check_bf16_allreduce(*mpi, fail);

  Tensor port = Tensor::zeros({1}, DType::I32);
  if (env.rank == 0) port.data<int32_t>()[0] = find_free_port();
  mpi->broadcast(port)->wait();
  DistEnv genv = env;
  genv.master_addr = "127.0.0.1";
  genv.master_port = port.data<int32_t>()[0];
  auto gloo = init_process_group(genv, {"gloo", std::chrono::seconds(60)});
  dpt::testing::check_bf16_allreduce(*gloo, fail);
  check_agreement(*mpi, *gloo);

  Tensor bad = Tensor::zeros({1}, DType::I32);
  bad.data<int32_t>()[0] = g_failures;
  mpi->allreduce(bad)->wait();
  gloo->barrier()->wait();
  gloo.reset();
  mpi->barrier()->wait();
  mpi.reset();  // MPI_Finalize
  const int total = bad.data<int32_t>()[0];
  if (env.rank == 0)
    std::printf("test_bf16_allreduce: %s on %d ranks (mpi and gloo)\n",
                total == 0 ? "all checks passed" : fmt::format("{} failures", total).c_str(), env.world_size);
  return total == 0 ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] test_bf16_allreduce: %s\n", g_rank, e.what());
    return 1;
  }
}
