// trainer/trainer.h: the training loop of one rank of a process group: data, model, gradient averaging,
// optimizer, evaluation, checkpoints and resume (trainer.cpp: a Trainer whose phases are set up, an epoch's
// steps, evaluate, save, finish). Evaluation of a checkpoint alone: trainer/evaluate.h.
#pragma once

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "trainer/config.h"

namespace dpt::trainer {

struct RunOptions {
  // auto: continue from the newest valid checkpoint in checkpoint.dir, if any; never: start fresh, deleting
  // the checkpoints already in checkpoint.dir; any other value: the path of one checkpoint to continue from.
  std::string resume = "auto";
  // Where this rank trains (choose_device()); a CUDA device must be current already.
  Device device = Device::cpu();
};

// The device of train.device = auto | cpu | cuda for the rank with LOCAL_RANK `local_rank`, given
// `device_count` GPUs: auto means cuda:(local_rank mod device_count) when there are GPUs, else cpu; cuda
// without a GPU is a ConfigError quoting `why_none` (cuda::unavailable_reason()).
Device choose_device(const std::string& requested, int local_rank, int device_count, const std::string& why_none);

struct EpochStats {
  int64_t epoch = 0;  // 1-based, as printed
  double train_loss = 0, test_loss = 0, test_acc = 0;
  double samples_per_s = 0;
  // Rank 0's split of the epoch's step time. On a GPU, compute and comm come from CUDA events (device time);
  // data wait is host time blocked on the Loader.
  double compute_s = 0, comm_s = 0, data_s = 0;
};

struct RunResult {
  std::vector<EpochStats> epochs;  // the epochs run by this invocation
  int64_t steps = 0;               // optimizer steps done in total (including those before a resume)
  int64_t resumed_from_step = -1;  // -1: started fresh
  double final_test_acc = 0, final_test_loss = 0;
  std::string last_checkpoint;     // rank 0: the last checkpoint this invocation wrote (empty: none)
  int64_t last_checkpoint_step = -1;
  // checkpoint.on_error = warn: the checkpoint writes that failed in this invocation (rank 0 counts them; under
  // dist.zero every rank does), and the last failure's step and cause.
  int64_t checkpoint_failures = 0;
  int64_t failed_checkpoint_step = -1;
  std::string checkpoint_error;
  // SIGUSR1 or SIGTERM when the run stopped early for one (trainer/preemption.h): the checkpoint of `steps` is
  // written (under checkpoint.on_error = warn it may have failed: failed_checkpoint_step == steps); 0 otherwise.
  int stop_signal = 0;
};

// Rank 0's account of the checkpoint writes that failed under checkpoint.on_error = warn, for the line that ends the
// run: how many, the last one's step and cause, and the newest checkpoint, said to be older than the run's end when
// the last write failed. Empty when none failed.
std::string checkpoint_failure_summary(const RunResult& r);
// The newest checkpoint as a phrase: r.last_checkpoint and its step, or the one the run resumed from, or none.
std::string newest_checkpoint(const RunResult& r);

// Runs on every rank of `pg` with the same config. Throws on any error (a failed rank; its peers then fail
// their next collective or are torn down by the launcher).
RunResult train(const Config& cfg, const RunOptions& opts, comm::ProcessGroup& pg);

}  // namespace dpt::trainer
