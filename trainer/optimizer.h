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
  Optimizer(const TrainConfig& cfg, models::Model& model);
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
};

}  // namespace dpt::trainer
