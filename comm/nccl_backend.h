// comm/nccl_backend.h: NcclProcessGroup: collectives on GPU tensors over NCCL, one GPU per rank.
//
// Every collective is enqueued on the group's own communication stream after the caller's stream
// (opts.stream) has produced the tensor, and returns at once; the Work's block(stream) makes the caller's
// stream wait for it (no host synchronisation), wait() blocks the host. Gradient averaging uses ncclAvg.
//
// Failure: a watchdog thread follows every outstanding collective. When one outlives the timeout, or NCCL
// reports an asynchronous error (a peer died, a network error), it records why, calls NcclOptions::on_fatal
// (main() ends the process there, so the launcher tears the job down), then aborts the communicator
// (ncclCommAbort) so nothing waits on it forever: on_fatal first, as the abort can itself wait for a device that
// never finishes. Every later call throws CommError with that reason. Errors carry NCCL's own message and the
// rank.
//
// allreduce and broadcast also take host tensors, for small bookkeeping values: they go to the device and
// back, and the call returns when they are done. The other collectives need tensors on this rank's GPU.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/process_group.h"

namespace dpt::comm {

struct NcclOptions {
  std::chrono::milliseconds timeout = kDefaultTimeout;  // per collective, enforced by the watchdog
  // Called (from the watchdog thread) after the communicator was aborted, with the reason.
  std::function<void(const std::string&)> on_fatal;
};

// A new ncclUniqueId (128 bytes) for rank 0 to hand to the others (through a Store or MPI).
std::string nccl_unique_id();
// NCCL's version, "2.27.7".
std::string nccl_version();

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Joins the communicator identified by `unique_id` on CUDA device `device`. `keep_alive` (the store or MPI
  // group that carried the id) lives as long as the group. Throws CommError with NCCL's message.
  NcclProcessGroup(int rank, int size, int device, const std::string& unique_id, const NcclOptions& opts = {},
                   std::shared_ptr<void> keep_alive = nullptr);
  ~NcclProcessGroup() override;

  std::string backend() const override { return "nccl"; }
  bool asynchronous() const override { return true; }
  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts = {}) override;
  std::shared_ptr<Work> allgather(const Tensor& input, Tensor& output, const AllgatherOptions& opts = {}) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> barrier() override;

  struct Impl;  // the communicator, its stream and the watchdog; shared with outstanding Work

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace dpt::comm
