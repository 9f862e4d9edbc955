// trainer/checkpoint.h: atomic checkpoints, written by rank 0 (or, under ZeRO, by every rank its optimizer
// shard, in parallel), loadable by every rank.
//
// Layout: DIR/step-00000469/ holding model.safetensors (weights, PyTorch names), the optimizer state, state.json
// (step, epoch, sampler position, RNG, effective config, class names) and COMPLETE (the CRC32 of each file). The optimizer state
// is either optimizer.safetensors (momentum / Adam moments per parameter, "<param>.<slot>": save, DDP) or, from
// save_sharded (dist.zero >= 1), optimizer-rank-R-of-N.safetensors for R = 0..N-1: rank R's OptimizerShard, each
// slot by its name ("exp_avg") as one 1-D tensor of its ranges' state back to back, and "ranges", I64 [k, 2]
// (offset, count in the flat parameter buffer); COMPLETE then records "optimizer_shards": N. A checkpoint is
// written under a temporary name, every file fsynced, marked COMPLETE last, and then renamed into place in one
// step (an existing checkpoint of the same step is swapped out atomically). Loading checks the mark, every file's
// CRC and every tensor's CRC: a checkpoint is either whole and valid or it is skipped with a warning, and resume
// falls back to the previous one. A write that fails (a full disk, permissions) removes its temporary directory and
// prunes nothing: the checkpoints already there stay as they were. load_optimizer_shard reads either layout into
// any sharding (another world size or ZeRO stage than the one that wrote it).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "trainer/shard.h"

namespace dpt::comm {
class ProcessGroup;
}
namespace dpt::models {
struct NamedParam;
}

namespace dpt::trainer {

// An epoch whose training ended at a checkpoint written for a stop signal (its last step was the stop's), with its
// figures but the evaluation's: the resumed run evaluates it and prints its line first, so that the stopped run
// leaves within its grace period and the epoch's line is not lost. epoch 0: none.
struct PendingEpoch {
  int64_t epoch = 0;  // 1-based, as printed
  double train_loss = 0, samples_per_s = 0, compute_s = 0, comm_s = 0, data_s = 0, lr = 0, epoch_s = 0;
};

struct TrainState {
  int64_t step = 0;            // optimizer steps done
  int64_t epoch = 0;           // the epoch to continue (0-based); == epochs when training is finished
  int64_t batch_in_epoch = 0;  // the next batch of that epoch, in the writer's geometry (informative)
  // The sampler's position: the examples of the epoch's global order the job has consumed (data/sampler.h). A resume
  // at any world size and batch goes on from it. -1 (checkpoints written before it): batch_in_epoch x batch_size x
  // world_size, which it was then.
  int64_t samples_in_epoch = -1;
  int64_t world_size = 1;
  int64_t batch_size = 0;      // per rank
  int64_t step_samples = -1;   // the global batch: samples per optimizer step (-1: not recorded)
  // What the sampler position means: a mid-epoch resume needs the same order (seed and data set).
  int64_t seed = 0;
  int64_t dataset_size = 0;
  bool drop_last = false;
  std::string rng;             // the trainer's RNG state (std::mt19937_64 text form)
  int64_t optimizer_steps = -1;  // updates applied (fewer than `step` when fp16 steps were skipped); -1: = step
  double loss_scale = 0;         // fp16's dynamic loss scale (0: none)
  int64_t scale_growth_tracker = 0;
  int64_t skipped_steps = 0;
  std::string config_toml;     // the effective config
  std::string config_hash;
  // The class names in label order (trainer/datasets.h's class_names; `dptrain predict` prints them); empty for a
  // GPT, and in checkpoints written before they were saved.
  std::vector<std::string> classes;
  // Mid-epoch (samples_in_epoch > 0): the epoch's summed training loss and the targets it counts, over every rank's
  // steps so far, so the resumed epoch's train_loss covers the whole epoch; 0 at an epoch's end and in checkpoints
  // written before it was saved (the epoch's figure then covers the steps after the resume).
  double epoch_loss_sum = 0, epoch_loss_count = 0;
  // The launcher's job that wrote it (RunOptions::job: the same across the job's restarts; empty when unknown and in
  // checkpoints written before it was saved): a restart goes on only from its own job's checkpoints.
  std::string job;
  PendingEpoch pending_epoch;  // absent (epoch 0) but after a stop signal at an epoch's last step
};

struct LoadedCheckpoint {
  std::string path;
  SafetensorsFile model;
  // The optimizer state in one of two layouts (read it with load_optimizer_shard): per parameter
  // (optimizer.safetensors; empty when the checkpoint is sharded), or the shards of the N ranks that wrote it
  // (optimizer-rank-R-of-N.safetensors, in rank order; empty when it is not).
  SafetensorsFile optimizer;
  std::vector<SafetensorsFile> optimizer_shards;
  TrainState state;
};

class CheckpointManager {
 public:
  CheckpointManager(std::string dir, int64_t keep);

  // Rank 0 only. Writes step-<state.step>, then deletes all but the newest `keep` complete checkpoints.
  // Returns the checkpoint's path. A write that fails throws CheckpointError ("checkpoint of step N not written:"
  // and why), its temporary directory removed, no checkpoint of that step written and none pruned.
  std::string save(const std::vector<NamedTensor>& model, const std::vector<NamedTensor>& optimizer,
                   const TrainState& state) const;
  // Collective over `pg` (dist.zero >= 1): every rank calls it with its own OptimizerShard, on the host. Rank 0
  // creates the temporary directory; then every rank writes its shard (optimizer-rank-R-of-N.safetensors) in
  // parallel while rank 0 writes model.safetensors (`model`: read on rank 0 only, others may pass {}) and
  // state.json; rank 0 then marks it COMPLETE, renames it into place and prunes, as save does. Every rank returns
  // the path once the checkpoint is in place. When any rank fails (a write, a shard that does not add up, a rank
  // that cannot see the temporary directory: checkpoint.dir not on a filesystem every rank shares), every rank
  // throws the same CheckpointError naming the failed rank(s) and why, and no checkpoint of that step appears
  // (rank 0 removes the temporary directory; none is pruned).
  std::string save_sharded(const std::vector<NamedTensor>& model, const OptimizerShard& shard, const TrainState& state,
                           comm::ProcessGroup& pg) const;

  // Paths of the checkpoints marked COMPLETE, oldest first (not yet validated).
  std::vector<std::string> complete() const;
  // The newest checkpoint that loads and validates; invalid ones are skipped with a warning naming what is
  // wrong. nullopt when there is none.
  std::optional<LoadedCheckpoint> load_latest() const;
  // The newest checkpoint written by `job` (TrainState::job; its state.json read first) that loads and validates;
  // with a `family` ("slurm-ID"), also one written by a job "slurm-ID" or "slurm-ID:...".
  std::optional<LoadedCheckpoint> load_latest_of_job(const std::string& job, const std::string& family = "") const;
  // The complete checkpoint of `step` in dir as it is named there (step-36 or step-00000036), else path_for_step.
  std::string path_of_step(int64_t step) const;
  // What a run killed while writing left (kill -9, the OOM killer, a launcher that died), which nothing else removes
  // but a later write of that very step (or --resume never): the temporary directories (.tmp-step-N) of writes that
  // never finished, and, once a complete checkpoint is in dir, the earlier run's checkpoints that a --resume never
  // run had hidden (.old-step-N) but not yet deleted. Removed; their names returned, sorted. Only by the run that
  // holds the directory's lock (dir_lock.h), at start, when no write is under way.
  std::vector<std::string> remove_leftovers() const;
  // Deletes every checkpoint (and leftover temporary directory) in dir but `except` (a path); returns how many
  // checkpoints were removed.
  size_t remove_all(const std::string& except = {}) const;
  // --resume never: the next checkpoint this manager writes replaces every other one in dir, an earlier run's: they are
  // renamed ".old-step-N" (never loaded) just before it goes into place and deleted once it is (remove_all, logged),
  // before pruning; a run that fails before its first checkpoint leaves them as they were, and a kill between never
  // leaves an earlier run's checkpoint that --resume auto would take over this run's.
  void replace_earlier_on_next_write() { replace_earlier_ = true; }
  // Renames every checkpoint newer than `step` (complete or not) to "<reason>-step-N" ("<reason>-step-N.K", the
  // first K free, when an earlier set-aside has that name), so that a run continuing from `step` is not overtaken by
  // checkpoints of the run it abandons: they keep their data but are never loaded or pruned. Returns how many were
  // moved.
  size_t set_aside_after(int64_t step, const std::string& reason) const;

  // Tests only (DPT_DEBUG_CKPT_FAIL_STEPS, trainer/fault_injection.h): a write of one of these steps fails midway,
  // after this process's first file is written, as a full disk would make it fail.
  void fail_writes_at(std::vector<int64_t> steps) { fail_steps_ = std::move(steps); }

  std::string path_for_step(int64_t step) const;
  const std::string& dir() const { return dir_; }

  // At start-up, before anything is computed (rank 0): checkpoint.dir `dir` is a directory, created if need be, in
  // which a file can be created (one is, and removed). ConfigError saying why not, so that an unusable one is not
  // found at the first checkpoint, an epoch of training later.
  static void check_dir(const std::string& dir);

  // Loads and validates one checkpoint directory; throws CheckpointError naming the file and the problem.
  static LoadedCheckpoint load(const std::string& path);
  // What a user's --checkpoint PATH means: the checkpoint PATH (one holding COMPLETE, or a step-N folder), or else
  // the newest valid checkpoint in the checkpoint directory PATH. ConfigError when there is neither, or when the
  // checkpoint PATH is invalid (damaged, or a step-N whose write did not finish: load's reason).
  static LoadedCheckpoint load_given(const std::string& path);

 private:
  static LoadedCheckpoint load_unchecked(const std::string& path);
  std::string save_unchecked(const std::vector<NamedTensor>& model, const std::vector<NamedTensor>& optimizer,
                             const TrainState& state) const;
  // What save and save_sharded share. begin_write: a fresh temporary directory for `step` (a leftover of a crashed
  // write removed), its path. commit: once every file is in `tmp`, fsynced: COMPLETE (each file's CRC32, and
  // "optimizer_shards" when non-zero), the rename into place, the pruning; returns the checkpoint's path.
  std::string begin_write(int64_t step) const;
  std::string commit(const std::string& tmp, int64_t step, const std::vector<std::pair<std::string, std::string>>& file_crcs,
                     int64_t optimizer_shards) const;
  void inject_failure(int64_t step, const std::string& file) const;
  std::string dir_;
  int64_t keep_;
  std::vector<int64_t> fail_steps_;
  mutable bool replace_earlier_ = false;  // replace_earlier_on_next_write(); cleared by the write that does it
};

// Copies each tensor of `from` into the tensor of the same name in `into` (a model's or optimizer's state);
// CheckpointError naming `path` and `what` (the file) when a name, shape or dtype differs or the counts do.
void copy_named(const std::vector<NamedTensor>& into, const SafetensorsFile& from, const std::string& what,
                const std::string& path);

// Fills into.slots (allocated by the optimizer, host or device) with the checkpoint's optimizer state for
// into.ranges, from either layout and whatever sharding wrote it: the per-parameter tensors "<param>.<slot>" placed
// at params[i].offset, or the shards placed by their "ranges" (shards may overlap, as the bucket remainders every
// rank owns do: the values are the same, either is taken). CheckpointError naming the checkpoint when a slot is
// missing or not expected (the optimizer changed: as copy_named), a range is not covered, or sizes disagree.
// Plain SGD without momentum has no slots: nothing is read. Every rank reads the whole optimizer state onto the
// host (all shards are in `loaded`): simple, and a rank's host memory holds it for now.
void load_optimizer_shard(const LoadedCheckpoint& loaded, const std::vector<models::NamedParam>& params,
                          OptimizerShard& into);

// Host copies of device tensors, for the checkpoint writer (host tensors pass through).
std::vector<NamedTensor> on_host(std::vector<NamedTensor> tensors);

// The name of the first floating-point host tensor holding an infinity or a NaN, and how many such values it holds;
// an empty name when every value is finite. A diverged run's weights (train.lr too high) are not checkpointed.
std::pair<std::string, size_t> first_nonfinite(const std::vector<NamedTensor>& tensors);

// A classifier's checkpoint meets the data set it goes on with (a resume, eval): ConfigError when both name their
// classes and the lists differ, since label i would then mean another class (an image folder's class folders renamed,
// added or removed). `path` is the checkpoint's, `now` the data set's classes.
void check_same_classes(const std::string& path, const std::vector<std::string>& saved,
                        const std::vector<std::string>& now);

}  // namespace dpt::trainer
