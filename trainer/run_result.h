// trainer/run_result.h: what a training run reports: each epoch's statistics and the run's result (steps,
// final metrics, the last checkpoint, checkpoint failures, the stop signal). The Trainer fills them
// (trainer/trainer.h); the Reporter (trainer/report/reporter.h) and the train command read them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt::trainer {

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
  // train.cuda_graph: the steps launched from a CUDA graph, and the graphs captured (trainer/step_graph.h).
  int64_t cuda_graph_launches = 0, cuda_graph_captures = 0;
};

// Rank 0's account of the checkpoint writes that failed under checkpoint.on_error = warn, for the line that ends the
// run: how many, the last one's step and cause, and the newest checkpoint, said to be older than the run's end when
// the last write failed. Empty when none failed.
std::string checkpoint_failure_summary(const RunResult& r);
// The newest checkpoint as a phrase: r.last_checkpoint and its step, or the one the run resumed from, or none.
std::string newest_checkpoint(const RunResult& r);

}  // namespace dpt::trainer
