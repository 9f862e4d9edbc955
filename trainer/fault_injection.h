// trainer/fault_injection.h: failures on purpose, for the tests of failure handling, resume, replica checks, loss
// scaling and straggler reports. Read once from the environment; every field off by default.
#pragma once

#include <cstdint>
#include <vector>

namespace dpt::trainer {

// Fault injection for tests of failure handling and resume: DPT_DEBUG_FAIL_AT_STEP=N makes rank
// DPT_DEBUG_FAIL_RANK (default 0) throw once it has finished optimizer step N.
// DPT_DEBUG_DIVERGE_RANK=R makes rank R nudge one parameter after its first step, so that the replica
// check has something to find; DPT_DEBUG_PERTURB_BUFFERS_RANK=R makes rank R scale its buffers before the
// initial broadcast, which must undo it; DPT_DEBUG_INF_AT_STEP=N makes rank 0 put an inf into the loss
// gradient of optimizer step N (1-based), an overflow that fp16 loss scaling must skip (tests only).
// DPT_DEBUG_SLOW_RANK=R with DPT_DEBUG_SLOW_MS=M makes rank R sleep M ms in each step's compute (a straggler).
// DPT_DEBUG_CKPT_FAIL_STEPS=N[,M...] makes rank DPT_DEBUG_CKPT_FAIL_RANK's (default 0) write of the checkpoints of
// those steps fail midway, after its first file, as a full disk would (CheckpointManager::fail_writes_at).
struct FailureInjection {
  int64_t step = -1;
  int rank = 0;
  int diverge_rank = -1;
  int perturb_buffers_rank = -1;
  int64_t inf_step = -1;
  int slow_rank = -1;
  int slow_ms = 0;
  std::vector<int64_t> ckpt_fail_steps;
  int ckpt_fail_rank = 0;
  static FailureInjection from_env();
};

}  // namespace dpt::trainer
