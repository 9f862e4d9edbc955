// trainer/optimizer.h: SGD (momentum, Nesterov, weight decay) and AdamW over the model's flat buffers.
//
// Optimizer state lives in flat buffers laid out like the parameters, so one kernel call updates the whole
// model, and state() hands the checkpoint per-parameter views named "<param>.<slot>" (e.g.
// "layers.0.weight.momentum").
#pragma once

#include <string>
#include <vector>

#include "models/model.h"
#include "trainer/config.h"

namespace dpt::trainer {

class Optimizer {
 public:
  // decay_matrices_only: train.weight_decay applies only to parameters of 2 or more dimensions (weights and
  // embeddings), not to biases and normalisation gains (nanoGPT's configure_optimizers); else to all.
  Optimizer(const TrainConfig& cfg, models::Model& model, bool decay_matrices_only = false);
  // One update of every parameter from the (already averaged) gradients, at learning rate `lr`.
  void step(double lr);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  // Per-parameter views of the state buffers, for checkpoints (empty for plain SGD without momentum).
  std::vector<NamedTensor> state() const;

 private:
  const TrainConfig& cfg_;
  models::Model& model_;
  int64_t steps_ = 0;
  std::vector<std::pair<std::string, Tensor>> slots_;  // slot name -> flat buffer
  struct Run {  // consecutive parameters [offset, offset + count) updated with one weight decay
    size_t offset, count;
    bool decay;
  };
  std::vector<Run> runs_;
};

// Clips the global L2 norm (the square root of `sum_squares`) of the (averaged, so identical on every rank)
// gradients to max_norm, as torch.nn.utils.clip_grad_norm_: scaled by max_norm / (norm + 1e-6) when that is
// below 1. Returns the norm.
double clip_gradients(models::Model& model, double max_norm, double sum_squares);

}  // namespace dpt::trainer
