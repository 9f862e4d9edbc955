// trainer/trainer.h: the training loop: data, model, gradient averaging, optimizer, evaluation,
// checkpoints and resume, for one rank of a process group.
#pragma once

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "trainer/checkpoint.h"
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
  std::string last_checkpoint;     // rank 0: the last checkpoint written
  // SIGUSR1 or SIGTERM when the run stopped early for one (trainer/preemption.h): the checkpoint of `steps` is
  // written; 0 otherwise.
  int stop_signal = 0;
};

// Runs on every rank of `pg` with the same config. Throws on any error (a failed rank; its peers then fail
// their next collective or are torn down by the launcher).
RunResult train(const Config& cfg, const RunOptions& opts, comm::ProcessGroup& pg);

// `dptrain eval` and `generate`: the checkpoint at `path` (a step-N/ directory, or the newest valid one in a
// checkpoint directory) and its effective config with `overrides` applied (data.dir=...,
// train.eval_batch_size=...). ConfigError when there is no valid checkpoint.
struct EvalTarget {
  LoadedCheckpoint checkpoint;  // the checkpoint chosen, loaded and validated
  Config config;
};
EvalTarget eval_target(const std::string& path, const std::vector<std::string>& overrides);

struct EvalReport {
  double loss = 0, acc = 0;  // mean loss and accuracy over every test example (image) or token
  double rows = 0;           // how many: each test example or window counted once across the ranks
  std::string unit;          // "samples" | "tokens"
  std::string model;         // the model's summary
};
// Evaluates the checkpoint's model on its config's test split (val shards for a GPT) on every rank of `pg`,
// each rank its exact share, the sums reduced: the same numbers on any number of ranks.
EvalReport evaluate_checkpoint(const EvalTarget& target, comm::ProcessGroup& pg, Device device);

}  // namespace dpt::trainer
