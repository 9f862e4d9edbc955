// trainer/step_graph.h: train.cuda_graph: a training step's zero_grad, forward, loss and backward captured once as a
// CUDA graph (cuda::Graph) and launched as one unit at the next steps, so that the fast path's hundreds of kernels a
// step cost one launch. With AdamW (the Trainer's `work`) the graph also holds the gradient clipping's sum of squares
// and the fused update: the clip factor is computed on the device from that sum (elementwise::clip_factor) and the
// update reads its per-step constants (the learning rate and AdamW's bias corrections for the step count, computed on
// the host as an eager step's: elementwise::adamw_steps) from a small device block that Optimizer::stage copies from
// pinned host memory on the stream before each launch, so one launch is the whole step with no host synchronisation.
// SGD's update (its first-step flag and learning rate are kernel arguments) runs after the launch, as without a
// graph. Outside the graph, before it: the batch's split into the task's token buffers (Task::prepare: the feeder's
// two device slots alternate, the task's buffers stay put).
//
// A graph replays the addresses and the host's decisions it saw while captured (core/cuda.h), so:
//  - it is captured only after an eager step of the same batch size whose forward made the same choice about the
//    parameters' bf16 copy (Model::params16_current: read the update's copy, or round afresh): everything the step
//    allocates on first use exists by then;
//  - a batch of another size, or the other choice, runs eagerly and drops the graph;
//  - the Trainer drops it (invalidate) wherever something else may have moved the step's buffers: an epoch's start
//    (a new epoch's loss sums; the evaluation before it), train.autotune's adopted plans, a checkpoint;
//  - after a launch the model's host state is what an eager step leaves (Model::params_written: the copy used).
// Refused (cuda_graph_refusal; the config's own checks are config.cpp's) where the step does more than one rank's
// local work (collectives, ZeRO's buckets) or is more than one graph (gradient accumulation), and on the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/cuda.h"
#include "core/device.h"
#include "models/model.h"

namespace dpt::trainer {

// Why train.cuda_graph = true cannot apply to a run on `device` with `world` ranks and `accum_steps` micro-batches a
// step; empty when it can.
std::string cuda_graph_refusal(const Device& device, int world, int64_t accum_steps);

// When to run a step eagerly, capture it, or launch the graph: bookkeeping only (no CUDA), tested on the CPU.
class StepGraphPlan {
 public:
  enum class Action { eager, capture, launch };
  // The step about to run: `rows`, its batch's loss rows; `reads_copy`, whether its forward would read the update's
  // bf16 copy; `eager_only`, a step that must run eagerly (a test's fault injected between its loss and backward).
  // eager: run the step (any graph is dropped; the step primes the next capture); capture: capture it, then launch;
  // launch: launch the graph captured before.
  Action next(int64_t rows, bool reads_copy, bool eager_only = false);
  // The graph (and the priming step) may no longer match the step's buffers: the next step runs eagerly.
  void invalidate();
  bool has_graph() const { return graph_; }

 private:
  bool graph_ = false, primed_ = false;
  int64_t rows_ = -1;       // of the graph, or of the priming step
  bool reads_copy_ = false;  // likewise
};

// The Trainer's step graph: StepGraphPlan's decisions carried out on the model's stream.
class StepGraph {
 public:
  // One step's gradients: `work` (zero_grad, forward, loss, backward, all enqueued on `stream`) run eagerly, or
  // captured and launched, or the graph launched (see StepGraphPlan::next).
  void run(models::Model& model, StreamHandle stream, int64_t rows, bool eager_only, const std::function<void()>& work);
  void invalidate();
  int64_t captures() const { return captures_; }
  int64_t launches() const { return launches_; }
  int64_t eager_steps() const { return eager_; }
  size_t nodes() const { return nodes_; }  // of the last graph captured

 private:
  StepGraphPlan plan_;
  cuda::Graph graph_;
  int64_t captures_ = 0, launches_ = 0, eager_ = 0;
  size_t nodes_ = 0;
};

}  // namespace dpt::trainer
