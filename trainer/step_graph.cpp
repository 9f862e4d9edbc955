// trainer/step_graph.cpp: see step_graph.h.
#include "trainer/step_graph.h"

#include <fmt/format.h>

#include "core/check.h"

namespace dpt::trainer {

std::string cuda_graph_refusal(const Device& device, int world, int64_t accum_steps) {
  if (!device.is_cuda())
    return fmt::format("a CUDA graph replays a GPU step, and this run trains on {}", device.str());
  if (world > 1)
    return fmt::format("{} ranks: the gradient buckets' collectives run from the host while backward runs, which a "
                       "graph cannot replay; it applies to one rank only", world);
  if (accum_steps > 1)
    return fmt::format("{} micro-batches a step (train.accum_steps, or train.global_batch_size at this world "
                       "size): the graph replays one whole step; it applies to one micro-batch a step", accum_steps);
  return "";
}

StepGraphPlan::Action StepGraphPlan::next(int64_t rows, bool reads_copy, bool eager_only) {
  if (eager_only) invalidate();
  const bool same = rows == rows_ && reads_copy == reads_copy_;
  if (graph_ && same) return Action::launch;
  if (!graph_ && primed_ && same) {
    graph_ = true;
    return Action::capture;
  }
  // The first step, one after an invalidation, or another shape or choice: eagerly, priming the next capture.
  graph_ = false;
  primed_ = true;
  rows_ = rows;
  reads_copy_ = reads_copy;
  return Action::eager;
}

void StepGraphPlan::invalidate() {
  graph_ = primed_ = false;
  rows_ = -1;
}

void StepGraph::invalidate() {
  plan_.invalidate();
  graph_ = cuda::Graph();
}

void StepGraph::run(models::Model& model, StreamHandle stream, int64_t rows, bool eager_only,
                    const std::function<void()>& work) {
  const bool reads_copy = model.params16_current();  // what the forward decides: fixed in a graph
  switch (plan_.next(rows, reads_copy, eager_only)) {
    case StepGraphPlan::Action::eager:
      graph_ = cuda::Graph();
      work();
      ++eager_;
      return;
    case StepGraphPlan::Action::capture:
      try {
        graph_ = cuda::Graph::capture(stream, work);
      } catch (const DeviceError& e) {
        plan_.invalidate();
        DPT_THROW(DeviceError, "train.cuda_graph = true: capturing the step: {} (train.cuda_graph = false runs it "
                  "without a graph)", e.what());
      }
      ++captures_;
      nodes_ = graph_.nodes();
      // Capturing ran nothing, but the captured forward marked the copy used: the update's copy is still the one
      // this first launch reads.
      if (reads_copy) model.params16_written();
      [[fallthrough]];
    case StepGraphPlan::Action::launch:
      graph_.launch(stream);
      ++launches_;
      model.params_written();  // as the eager forward leaves it: the update's copy served this step
      return;
  }
}

}  // namespace dpt::trainer
