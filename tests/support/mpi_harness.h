// tests/support/mpi_harness.h: the frame every program of tests/mpi shares. Each runs under mpirun (-np 2, -np 3),
// builds an mpi group and a gloo group in the same processes, counts its failures (printing the first 20 with the
// rank), and exits with the same code on every rank: the failures are summed over MPI before anyone exits.
// Header-only, test code only.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "comm/env.h"
#include "comm/init.h"
#include "core/logging.h"
#include "core/net.h"
#include "core/tensor.h"

namespace dpt::test::mpi {

struct State {
  int failures = 0;
  int rank = -1;
};
inline State& state() {
  static State s;
  return s;
}

// One failure, printed with the rank (the first 20 only).
inline void fail_text(const std::string& what) {
  State& s = state();
  ++s.failures;
  if (s.failures <= 20) std::fprintf(stderr, "[rank %d] FAILED: %s\n", s.rank, what.c_str());
}
template <class... A>
void fail(fmt::format_string<A...> f, A&&... args) {
  fail_text(fmt::format(f, std::forward<A>(args)...));
}

// This process under mpirun: its environment (a failure unless Open MPI's) and logging.
inline comm::DistEnv start() {
  comm::DistEnv env = comm::detect_env(comm::process_env());
  state().rank = env.rank;
  init_logging(env.rank, env.world_size);
  if (env.launcher != comm::Launcher::OpenMPI)
    fail("launcher is {}, expected openmpi (run me under mpirun)", comm::launcher_name(env.launcher));
  return env;
}

// A gloo group in the same processes as `mpi`: under mpirun there is no MASTER_PORT, so rank 0 picks a free one and
// tells the others over MPI.
inline std::unique_ptr<comm::ProcessGroup> gloo_beside(comm::ProcessGroup& mpi, const comm::DistEnv& env) {
  Tensor port = Tensor::zeros({1}, DType::I32);
  if (env.rank == 0) port.data<int32_t>()[0] = find_free_port();
  mpi.broadcast(port)->wait();
  comm::DistEnv genv = env;
  genv.master_addr = "127.0.0.1";
  genv.master_port = port.data<int32_t>()[0];
  return comm::init_process_group(genv, {"gloo", std::chrono::seconds(60)});
}

// Every rank's failures summed over `mpi`, both groups shut down in order (MPI_Finalize last), the verdict printed
// by rank 0; the exit code, the same on every rank.
inline int finish(const char* program, const comm::DistEnv& env, std::unique_ptr<comm::ProcessGroup>& mpi,
                  std::unique_ptr<comm::ProcessGroup>& gloo) {
  Tensor bad = Tensor::zeros({1}, DType::I32);
  bad.data<int32_t>()[0] = state().failures;
  mpi->allreduce(bad)->wait();
  gloo->barrier()->wait();
  gloo.reset();
  mpi->barrier()->wait();
  mpi.reset();  // MPI_Finalize
  const int total = bad.data<int32_t>()[0];
  if (env.rank == 0) {
    if (total == 0)
      std::printf("%s: all checks passed on %d ranks (mpi and gloo)\n", program, env.world_size);
    else
      std::printf("%s: %d failures across %d ranks (mpi and gloo)\n", program, total, env.world_size);
  }
  return total == 0 ? 0 : 1;
}

// main(): `run`, and an exception as a failure of this rank.
inline int main_of(const char* program, int (*run)()) {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", state().rank, program, e.what());
    return 1;
  }
}

}  // namespace dpt::test::mpi
