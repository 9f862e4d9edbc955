// trainer/optimizer.h: SGD (momentum, Nesterov, weight decay) and AdamW over the model's flat buffers.
//
// Optimizer state lives in flat buffers laid out like the parameters, so one kernel call updates the whole
// model, and state() hands the checkpoint per-parameter views named "<param>.<slot>" (e.g.
// "layers.0.weight.momentum").
// Under ZeRO (trainer/shard.h) the optimizer updates only the pieces of the parameter buffer this rank owns, from
// their (averaged) gradients: its state holds those pieces back to back, a kernel call per piece and weight decay;
// shard() hands the checkpoint that state with its pieces.
#pragma once

#include <string>
#include <vector>

#include "models/model.h"
#include "trainer/config.h"
#include "trainer/shard.h"

namespace dpt::trainer {

class Optimizer {
 public:
  // decay_matrices_only: train.weight_decay applies only to parameters of 2 or more dimensions (weights and
  // embeddings), not to biases and normalisation gains (nanoGPT's configure_optimizers); else to all.
  // `owned`: the pieces of the parameter buffer this optimizer updates (empty: all of it). `shard_grads`: their
  // gradients back to back, as the state (ZeRO stage 2: DataParallel::shard_grads()); undefined: Model::grads(), laid out
  // like the parameters. `shard_params`: the same for the parameters (ZeRO stage 3: DataParallel::shard_params()).
  Optimizer(const TrainConfig& cfg, models::Model& model, bool decay_matrices_only = false,
            std::vector<FlatRange> owned = {}, Tensor shard_grads = {}, Tensor shard_params = {});
  // One update of every parameter from the (already averaged) gradients, at learning rate `lr`.
  void step(double lr);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  // Per-parameter views of the state buffers, for checkpoints (empty for plain SGD without momentum). Only when
  // the optimizer updates the whole buffer (!sharded()).
  std::vector<NamedTensor> state() const;
  // The state as its pieces (views on the model's device): under DDP one piece, the whole buffer.
  OptimizerShard shard() const;
  bool sharded() const { return sharded_; }
  // Bytes of optimizer state on this rank.
  size_t state_bytes() const;

 private:
  const TrainConfig& cfg_;
  models::Model& model_;
  int64_t steps_ = 0;
  std::vector<FlatRange> owned_;
  Tensor shard_grads_, shard_params_;
  bool sharded_ = false;
  std::vector<std::pair<std::string, Tensor>> slots_;  // slot name -> the state of owned_, back to back
  struct Run {  // parameters (and gradients) [offset, offset + count) updated with one weight decay; their state at `at`
    size_t offset, at, count;
    bool decay;
  };
  std::vector<Run> runs_;
};


}  // namespace dpt::trainer
