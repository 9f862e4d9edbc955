// trainer/trainer.h: the training loop of one rank of a process group: data, model, gradient averaging,
// optimizer, evaluation, checkpoints and resume (trainer.cpp: a Trainer whose phases are set up, an epoch's
// steps, evaluate, save, finish). Evaluation of a checkpoint alone: trainer/evaluate.h.
#pragma once

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "trainer/config.h"
#include "trainer/run_result.h"

namespace dpt::trainer {

struct RunOptions {
  // auto: continue from the newest valid checkpoint in checkpoint.dir, if any; never: start fresh, deleting
  // the checkpoints already in checkpoint.dir once the first of this run's is written; any other value: the path of
  // one checkpoint to continue from, or of a checkpoint directory (its newest valid checkpoint).
  std::string resume = "auto";
  // The launcher's restart count (DPT_RESTART_COUNT, torchrun's TORCHELASTIC_RESTART_COUNT; else a Slurm requeue's
  // SLURM_RESTART_COUNT): on a restart (> 0)
  // --resume never and PATH applied to the job's first attempt; the attempt goes on from the job's own newest
  // checkpoint in checkpoint.dir instead (never: as auto; PATH: the newer of PATH and that one), so a restart keeps
  // the failed attempt's progress.
  int restart = 0;
  // The launcher's job, the same in all its attempts (train.cpp's job_identity: Slurm's job id, dprun's job token
  // hashed, torchrun's run id; empty when none): saved in every checkpoint, so a restart knows its job's own.
  std::string job;
  // In a requeued attempt of a Slurm batch script that runs dprun itself ("slurm-ID"; empty elsewhere): a restart's
  // checkpoints are also those of any job "slurm-ID:..." (the earlier attempts' dpruns, each with its own token).
  std::string job_family;
  // Where this rank trains (choose_device()); a CUDA device must be current already.
  Device device = Device::cpu();
};

// The device of train.device = auto | cpu | cuda for the rank with LOCAL_RANK `local_rank`, given
// `device_count` GPUs: auto means cuda:(local_rank mod device_count) when there are GPUs, else cpu; cuda
// without a GPU is a ConfigError quoting `why_none` (cuda::unavailable_reason()).
// `option`: what the user set, named in the error without a GPU (a config key, or a subcommand's --device).
Device choose_device(DeviceChoice requested, int local_rank, int device_count, const std::string& why_none,
                     const std::string& option = "train.device");


// Runs on every rank of `pg` with the same config. Throws on any error (a failed rank; its peers then fail
// their next collective or are torn down by the launcher).
RunResult train(const Config& cfg, const RunOptions& opts, comm::ProcessGroup& pg);

}  // namespace dpt::trainer
