// comm/staging.h: HostStagedGroup: lets a host backend (Gloo, MPI) take GPU tensors, by staging them
// through pinned host memory. This is how several ranks share one GPU (NCCL refuses two ranks on a device).
//
// For a GPU tensor a collective waits for opts.stream, copies the tensor to a pinned buffer, runs the inner
// backend's collective on it, and copies the result back on opts.stream, asynchronously; the Work holds an
// event after that copy: wait() waits for it, block(s) orders stream s after it. Host tensors go straight to
// the inner group. Nothing outside comm/ needs to know.
#pragma once

#include <map>
#include <memory>

#include "comm/process_group.h"

namespace dpt::comm {

class HostStagedGroup final : public ProcessGroup {
 public:
  explicit HostStagedGroup(std::unique_ptr<ProcessGroup> inner);

  std::string backend() const override { return inner_->backend(); }
  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts = {}) override;
  std::shared_ptr<Work> allgather(const Tensor& input, Tensor& output, const AllgatherOptions& opts = {}) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> barrier() override { return inner_->barrier(); }

  ProcessGroup& inner() { return *inner_; }

 private:
  // A pinned host tensor shaped like `like`; slot 0 and 1 let allgather stage input and output at once.
  Tensor host_buffer(const Tensor& like, int slot);
  // Waits for the last copy back to the device (stage_out on a stream), which may still read a host buffer.
  void wait_for_copy_back();
  // Copies `device` into a host buffer after `stream`'s work, waiting for the copy.
  Tensor stage_in(const Tensor& device, StreamHandle stream, int slot);
  // Copies the host result back on `stream` (asynchronously when a stream is given); the Work follows it.
  std::shared_ptr<Work> stage_out(Tensor& device, const Tensor& host, StreamHandle stream);

  std::unique_ptr<ProcessGroup> inner_;
  std::map<std::pair<int, DType>, Tensor> buffers_;  // grown, never shrunk: pinned allocations are slow
  StreamHandle pending_ = nullptr;  // the stream of the last copy back, which may still read a buffer
  bool pending_valid_ = false;
};

}  // namespace dpt::comm
