// comm/staging.cpp: HostStagedGroup: GPU tensors through pinned host buffers for the host backends.
#include "comm/staging.h"

#include "core/cuda.h"

namespace dpt::comm {
namespace {

// The copy back to the device, still running on a stream: an event after it.
class StagedWork final : public Work {
 public:
  explicit StagedWork(StreamHandle stream) { copied_.record(stream); }
  void wait(std::chrono::milliseconds) override { copied_.synchronize(); }
  void block(StreamHandle stream) override {
    if (stream)
      copied_.block(stream);
    else
      copied_.synchronize();
  }
  bool completed() const override { return copied_.query(); }

 private:
  cuda::Event copied_;
};

}  // namespace

HostStagedGroup::HostStagedGroup(std::unique_ptr<ProcessGroup> inner)
    : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}

Tensor HostStagedGroup::host_buffer(const Tensor& like, int slot) {
  Tensor& buf = buffers_[{slot, like.dtype()}];
  if (!buf.defined() || buf.numel() < like.numel())
    buf = Tensor::empty_pinned({static_cast<int64_t>(std::max<size_t>(like.numel(), 1))}, like.dtype());
  return buf.view(0, like.shape());
}

void HostStagedGroup::wait_for_copy_back() {
  if (pending_valid_) {
    cuda::stream_synchronize(pending_);
    pending_valid_ = false;
  }
}

Tensor HostStagedGroup::stage_in(const Tensor& device, StreamHandle stream, int slot) {
  wait_for_copy_back();  // it may still be reading the buffer we are about to overwrite
  Tensor host = host_buffer(device, slot);
  host.copy_from(device, stream);
  cuda::stream_synchronize(stream);
  return host;
}

std::shared_ptr<Work> HostStagedGroup::stage_out(Tensor& device, const Tensor& host, StreamHandle stream) {
  device.copy_from(host, stream);  // synchronous without a stream
  pending_ = stream;
  pending_valid_ = stream != nullptr;
  if (!stream) return std::make_shared<CompletedWork>();
  return std::make_shared<StagedWork>(stream);
}

std::shared_ptr<Work> HostStagedGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  if (!tensor.device().is_cuda()) return inner_->allreduce(tensor, opts);
  Tensor host = stage_in(tensor, opts.stream, 0);
  inner_->allreduce(host, {.op = opts.op})->wait();
  return stage_out(tensor, host, opts.stream);
}

std::shared_ptr<Work> HostStagedGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  if (!tensor.device().is_cuda()) return inner_->broadcast(tensor, opts);
  Tensor host = stage_in(tensor, opts.stream, 0);
  inner_->broadcast(host, {.root = opts.root})->wait();
  return stage_out(tensor, host, opts.stream);
}

std::shared_ptr<Work> HostStagedGroup::allgather(const Tensor& input, Tensor& output, const AllgatherOptions& opts) {
  if (!input.device().is_cuda() && !output.device().is_cuda()) return inner_->allgather(input, output, opts);
  // As reduce_scatter does: wait for opts.stream, gather on the host, copy the result back on opts.stream. An input
  // that is this rank's slot of the output (in place) is staged on its own and gathered out of place on the host;
  // the copy back rewrites the slot with the values it held.
  wait_for_copy_back();  // it may still read the buffer the output is staged in, when the input is not staged
  const Tensor in = input.device().is_cuda() ? stage_in(input, opts.stream, 0) : input;
  Tensor out = output.device().is_cuda() ? host_buffer(output, 1) : output;
  inner_->allgather(in, out, {.what = opts.what})->wait();
  if (output.device().is_cuda()) return stage_out(output, out, opts.stream);
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> HostStagedGroup::reduce_scatter(const Tensor& input, Tensor& output,
                                                      const AllreduceOptions& opts) {
  if (!input.device().is_cuda() && !output.device().is_cuda()) return inner_->reduce_scatter(input, output, opts);
  // As allreduce does: wait for opts.stream, reduce on the host, copy the result back on opts.stream. The last copy
  // back may still read the buffer the output is staged in (stage_in waits for it only when the input is staged).
  wait_for_copy_back();
  const Tensor in = input.device().is_cuda() ? stage_in(input, opts.stream, 0) : input;
  Tensor out = output.device().is_cuda() ? host_buffer(output, 1) : output;
  inner_->reduce_scatter(in, out, {.op = opts.op, .what = opts.what})->wait();
  if (output.device().is_cuda()) return stage_out(output, out, opts.stream);
  return std::make_shared<CompletedWork>();
}

}  // namespace dpt::comm
