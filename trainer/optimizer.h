// trainer/optimizer.h: SGD (momentum, Nesterov, weight decay) and AdamW over the model's flat buffers.
//
// Optimizer state lives in flat buffers laid out like the parameters, so one kernel call updates the whole
// model, and state() hands the checkpoint per-parameter views named "<param>.<slot>" (e.g.
// "layers.0.weight.momentum").
// Under ZeRO (trainer/shard.h) the optimizer updates only the pieces of the parameter buffer this rank owns, from
// their (averaged) gradients: its state holds those pieces back to back, a kernel call per piece and weight decay;
// shard() hands the checkpoint that state with its pieces.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/cuda.h"
#include "models/kernels/elementwise.h"

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
  // One update of every parameter from the (already averaged) gradients, at learning rate `lr`. With `grad_ss` (the
  // gradients' sum of squares on the device, DataParallel::sum_squares_to's), each gradient is first multiplied by
  // clip_by_norm's factor for max_norm: AdamW does it inside its one fused pass per owned piece (adamw_fused: one
  // launch for the whole model under DDP, the weight decay per element from its ranges); SGD clips the gradients
  // in place first. Either gives the bits of clip_by_norm and then the per-run update.
  void step(double lr, const double* grad_ss = nullptr, double max_norm = 0.0);

  // The same update in three parts, so that a CUDA graph can replay its device work with each step's learning rate
  // and step count (train.cuda_graph): AdamW over the whole buffer only (can_stage: one rank, no ZeRO).
  //  - stage(lr, stream): the host computes the next step's constants exactly as step() does
  //    (elementwise::adamw_steps for `lr` and step steps() + 1, one set a piece: the scalar block) and enqueues their
  //    copy into the block on the model's device on `stream` (from pinned host memory; on the CPU, written directly);
  //  - step_staged(grad_ss, max_norm): the update's kernels, reading the block when they run
  //    (Kernels::adamw_fused_staged): what a graph captures; no host state changes;
  //  - staged_done(): the host's part, once for each update that ran: the step count, the bf16 copy's state.
  // stage, step_staged, staged_done give step(lr, grad_ss, max_norm)'s bits.
  bool can_stage() const;
  void stage(double lr, StreamHandle stream);
  void step_staged(const double* grad_ss, double max_norm);
  void staged_done();
  // The block's host image as the last stage() wrote it (a set per piece), and its device copy (tests).
  const std::vector<models::elementwise::AdamWSteps>& staged() const { return staged_; }
  const Tensor& staged_block() const { return staged_block_; }
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
  // AdamW's fused pass, one per owned piece: where its parameters, gradients and state start, and its decay ranges
  // (element offsets within the piece, on the model's device; undefined when every element decays).
  struct Piece {
    size_t offset, at, count;
    Tensor decay_edges;  // I64 [2 x ranges]
    size_t n_edges = 0;
    bool all_decay = false;
    // AdamW over the piece: its decay edges (null: every element decays, or none), and `ap` with no weight decay
    // where nothing in it decays.
    const uint64_t* edges() const {
      return all_decay || n_edges == 0 ? nullptr : reinterpret_cast<const uint64_t*>(decay_edges.raw());
    }
    models::AdamWParams adamw(models::AdamWParams ap) const {
      if (!all_decay && n_edges == 0) ap.weight_decay = 0.0f;
      return ap;
    }
  };
  std::vector<Piece> pieces_;
  models::AdamWParams adamw_params(double lr) const;  // step()'s, for step steps_ + 1
  BFloat16* params16() const;                       // where the update writes the bf16 copy (null: nowhere)
  // stage()'s block: its host image, its copy on the model's device, and on a GPU a ring of pinned host slots the
  // copies come from, each reused only once its last copy has run (its event).
  static constexpr size_t kStageSlots = 4;
  std::vector<models::elementwise::AdamWSteps> staged_;
  Tensor staged_block_, staged_pinned_;
  std::vector<std::unique_ptr<cuda::Event>> staged_copied_;
  size_t next_slot_ = 0;
};


}  // namespace dpt::trainer
