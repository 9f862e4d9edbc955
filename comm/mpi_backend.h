// comm/mpi_backend.h: MpiProcessGroup, the ProcessGroup over MPI (a duplicate of MPI_COMM_WORLD, errors
// returned rather than fatal). Collectives run on host memory and complete before they return. MPI cannot
// time a collective out: a rank that never joins hangs the others; TracedGroup's watchdog (init_process_group
// wraps this group in one) reports the hang after dist.timeout_s and ends the process through on_fatal.
//
// MPI is initialised here (MPI_THREAD_SERIALIZED) unless the program already did; it is finalised when the
// last group that initialised it is destroyed, except after a failed collective or while an exception unwinds
// (MPI_Finalize waits for every rank, so finalising while peers are stuck would hang this rank too; exiting
// without it lets mpirun tear the job down).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "comm/env.h"
#include "comm/process_group.h"

namespace dpt::comm {

class MpiProcessGroup : public ProcessGroup {
 public:
  // With `expected`, checks that MPI's rank and size agree with the launcher's environment (ConfigError
  // naming both otherwise: e.g. the mpi backend under a launcher that is not mpirun).
  explicit MpiProcessGroup(const DistEnv* expected = nullptr);
  ~MpiProcessGroup() override;
  // Whether MPI was finalised in this process already (it cannot start again).
  static bool finalized();

  std::string backend() const override { return "mpi"; }
  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts = {}) override;
  std::shared_ptr<Work> allgather(const Tensor& input, Tensor& output, const AllgatherOptions& opts = {}) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> barrier() override;

 private:
  struct Impl;  // holds the MPI handles, so that this header does not need <mpi.h>
  explicit MpiProcessGroup(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Impl> start(const DistEnv* expected);
  template <class F>
  void run(const char* op, F&& f);

  std::unique_ptr<Impl> impl_;
  std::mutex mu_;  // MPI_THREAD_SERIALIZED: one MPI call at a time
};

}  // namespace dpt::comm
