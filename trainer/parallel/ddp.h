// trainer/parallel/ddp.h: DDP (dist.zero = 0; every stage on one rank): each rank holds the whole model, its
// gradients and its optimizer state; each bucket of the flat gradient buffer is all-reduced (averaged) in place as
// soon as backward has produced all of its gradients. dist.overlap = false: one all-reduce of the whole buffer after
// backward.
#pragma once

#include "trainer/parallel/data_parallel.h"

namespace dpt::trainer {

class Ddp final : public DataParallel {
 public:
  Ddp(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream, const DataParallelOptions& opts);
  ~Ddp() override;
  std::string name() const override { return "ddp"; }
  void sum_squares_to(models::Kernels& k, Tensor& out) override;
  double sum_squares(models::Kernels& k) override;
  std::vector<std::string> setup_lines() const override;

 private:
  std::vector<std::shared_ptr<comm::Work>> reduce(size_t bucket) override;
  void settle(size_t bucket) override;
  void reduce_after_backward() override;
};

}  // namespace dpt::trainer
