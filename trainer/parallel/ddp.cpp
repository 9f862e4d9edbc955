// trainer/parallel/ddp.cpp: DDP's bucketed all-reduce.
#include "trainer/parallel/ddp.h"

#include <fmt/format.h>

namespace dpt::trainer {

Ddp::Ddp(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream, const DataParallelOptions& opts)
    : DataParallel(pg, model, stream, opts) {
  flat_bucket_views();
  owned_ = {{0, grads_.numel()}};
  owned_grads_ = {grads_};
  start_comm();
}

Ddp::~Ddp() { stop_comm(); }

// Persistent: each bucket's memory stays put for the group's lifetime.
std::vector<std::shared_ptr<comm::Work>> Ddp::reduce(size_t bucket) {
  codec_.encode(views_[bucket], wire_views_[bucket]);
  return {pg_.allreduce(codec_.on_wire(views_[bucket], wire_views_[bucket]),
                        codec_.options(bucket_label(bucket), /*persistent=*/true))};
}

void Ddp::settle(size_t bucket) { codec_.decode(wire_views_[bucket], views_[bucket]); }

void Ddp::reduce_after_backward() {
  codec_.encode(grads_, wire_);
  pg_.allreduce(codec_.on_wire(grads_, wire_), codec_.options("all gradients", /*persistent=*/true))->block(stream_);
  codec_.decode(wire_, grads_);
}

void Ddp::sum_squares_to(models::Kernels& k, Tensor& out) {
  k.sum_squares_to(grads_.data<float>(), grads_.numel(), out.data<double>());
}

double Ddp::sum_squares(models::Kernels& k) { return k.sum_squares(grads_.data<float>(), grads_.numel()); }

std::vector<std::string> Ddp::setup_lines() const {
  std::vector<std::string> lines = DataParallel::setup_lines();
  if (opts_.zero > 0 && pg_.size() == 1)
    lines.push_back(fmt::format("zero: dist.zero = {} has no effect with one rank (nothing to shard)", opts_.zero));
  return lines;
}

}  // namespace dpt::trainer
