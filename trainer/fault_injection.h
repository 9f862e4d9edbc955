// trainer/fault_injection.h: failures on purpose, for the tests of failure handling, resume, replica checks, loss
// scaling and straggler reports. Read once from the environment; every field off by default. The Trainer calls a
// FaultInjector at the moments of a run, as it calls its Reporter, so that the step reads without the failures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/model.h"
#include "trainer/checkpoint.h"

namespace dpt::trainer {

// Fault injection for tests of failure handling and resume: DPT_DEBUG_FAIL_AT_STEP=N makes rank
// DPT_DEBUG_FAIL_RANK (default 0) throw once it has finished optimizer step N.
// DPT_DEBUG_DIVERGE_RANK=R makes rank R nudge one parameter after its first step, so that the replica
// check has something to find; DPT_DEBUG_PERTURB_BUFFERS_RANK=R makes rank R scale its buffers before the
// initial broadcast, which must undo it; DPT_DEBUG_INF_AT_STEP=N makes rank 0 put an inf into the loss
// gradient of optimizer step N (1-based), an overflow that fp16 loss scaling must skip (tests only).
// DPT_DEBUG_SLOW_RANK=R with DPT_DEBUG_SLOW_MS=M makes rank R sleep M ms in each step's compute (a straggler).
// DPT_DEBUG_SIGNAL_AT_STEP=N makes rank DPT_DEBUG_FAIL_RANK raise SIGUSR1 in itself once it has finished optimizer
// step N (a preemption at a step chosen in advance: on one rank the run stops after that very step; on several,
// after the step at which the ranks next agree, every step once a step takes over 0.2 s: DPT_DEBUG_SLOW_MS).
// DPT_DEBUG_CKPT_FAIL_STEPS=N[,M...] makes rank DPT_DEBUG_CKPT_FAIL_RANK's (default 0) write of the checkpoints of
// those steps fail midway, after its first file, as a full disk would (CheckpointManager::fail_writes_at).
// DPT_DEBUG_SAMPLE_LOG=FILE makes every rank append, for each micro-batch it trains, one line naming the examples
// (a record, not a failure: the resize tests check that an epoch used each example once):
//   round R from F step S epoch E rank K world W: I1 I2 ...
// R is the launcher's restart count (DPT_RESTART_COUNT, or torchrun's TORCHELASTIC_RESTART_COUNT; 0 without), F the
// step the run resumed from (0: none), S the optimizer step (1-based) and E the epoch (0-based). A step trained again
// after a failure (it followed the last checkpoint) appears again with a greater (R, F): the last one is the one that
// counts. Each line is one write() to a file opened O_APPEND, so the
// ranks' lines do not interleave.
struct FailureInjection {
  int64_t step = -1;
  int rank = 0;
  int diverge_rank = -1;
  int perturb_buffers_rank = -1;
  int64_t inf_step = -1;
  int64_t signal_step = -1;
  int slow_rank = -1;
  int slow_ms = 0;
  std::vector<int64_t> ckpt_fail_steps;
  int ckpt_fail_rank = 0;
  std::string sample_log;
  int64_t round = 0;
  static FailureInjection from_env();
};

// The failures of `f` that belong to rank `rank`, each injected at its moment; a no-op unless its variable is set.
class FaultInjector {
 public:
  explicit FaultInjector(int rank, FailureInjection f = FailureInjection::from_env()) : rank_(rank), f_(std::move(f)) {}
  // The run's checkpoint manager is open: DPT_DEBUG_CKPT_FAIL_STEPS (its writes of those steps fail midway).
  void checkpoints_opened(CheckpointManager& ckpt) const;
  // Before the initial broadcast of the replicas: DPT_DEBUG_PERTURB_BUFFERS_RANK (the buffers scaled and shifted).
  void replicas_syncing(models::Model& model) const;
  // The loss gradient of a micro-batch of optimizer step `step` (1-based) is scaled and about to go into backward:
  // DPT_DEBUG_INF_AT_STEP (rank 0's first micro-batch: an inf in its first element, on `stream`).
  void loss_grad_ready(int64_t step, bool first_micro, const Tensor& grad, StreamHandle stream) const;
  // Whether loss_grad_ready writes into the gradient at this micro-batch (train.cuda_graph runs that step eagerly).
  bool poisons_loss_grad(int64_t step, bool first_micro) const {
    return step == f_.inf_step && rank_ == 0 && first_micro;
  }
  // A step's backward is done, before its gradients are reduced: DPT_DEBUG_SLOW_RANK (a sleep of DPT_DEBUG_SLOW_MS).
  void backward_done() const;
  // Optimizer step `step` is done: DPT_DEBUG_DIVERGE_RANK (after step 1: one parameter nudged; not under ZeRO stage
  // 3, whose model holds no flat parameter buffer), DPT_DEBUG_FAIL_AT_STEP (InternalError), DPT_DEBUG_SIGNAL_AT_STEP
  // (SIGUSR1 raised in this process).
  void step_done(int64_t step, models::Model& model) const;
  // DPT_DEBUG_SAMPLE_LOG: whether to call samples_trained, and the line of a micro-batch of optimizer step `step`
  // (1-based) that trained examples indices[0, n).
  bool logs_samples() const { return !f_.sample_log.empty(); }
  void samples_trained(int64_t resumed_from, int64_t step, int64_t epoch, int world, const size_t* indices,
                       size_t n) const;

 private:
  int rank_;
  FailureInjection f_;
};

}  // namespace dpt::trainer
