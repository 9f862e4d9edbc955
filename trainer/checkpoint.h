// trainer/checkpoint.h: atomic checkpoints, written by rank 0, loadable by every rank.
//
// Layout: DIR/step-00000469/ holding model.safetensors (weights, PyTorch names), optimizer.safetensors
// (momentum / Adam moments, per parameter), state.json (step, epoch, sampler position, RNG, effective
// config) and COMPLETE (the CRC32 of each of those files). A checkpoint is written under a temporary name,
// every file fsynced, marked COMPLETE last, and then renamed into place in one step (an existing checkpoint
// of the same step is swapped out atomically). Loading checks the mark, every file's CRC and every tensor's
// CRC: a checkpoint is either whole and valid or it is skipped with a warning, and resume falls back to the
// previous one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/safetensors.h"

namespace dpt::trainer {

struct TrainState {
  int64_t step = 0;            // optimizer steps done
  int64_t epoch = 0;           // the epoch to continue (0-based); == epochs when training is finished
  int64_t batch_in_epoch = 0;  // the next batch of that epoch (the sampler position)
  int64_t world_size = 1;
  int64_t batch_size = 0;      // per rank
  // What the sampler position means: a mid-epoch resume needs the same order and shard geometry.
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
};

struct LoadedCheckpoint {
  std::string path;
  SafetensorsFile model;
  SafetensorsFile optimizer;
  TrainState state;
};

class CheckpointManager {
 public:
  CheckpointManager(std::string dir, int64_t keep);

  // Rank 0 only. Writes step-<state.step>, then deletes all but the newest `keep` complete checkpoints.
  // Returns the checkpoint's path.
  std::string save(const std::vector<NamedTensor>& model, const std::vector<NamedTensor>& optimizer,
                   const TrainState& state) const;

  // Paths of the checkpoints marked COMPLETE, oldest first (not yet validated).
  std::vector<std::string> complete() const;
  // The newest checkpoint that loads and validates; invalid ones are skipped with a warning naming what is
  // wrong. nullopt when there is none.
  std::optional<LoadedCheckpoint> load_latest() const;
  // Deletes every checkpoint (and leftover temporary directory) in dir; returns how many were removed.
  size_t remove_all() const;
  // Renames every checkpoint newer than `step` (complete or not) to "<reason>-step-N", so that a run
  // continuing from `step` is not overtaken by checkpoints of the run it abandons: they keep their data
  // but are never loaded or pruned. Returns how many were moved.
  size_t set_aside_after(int64_t step, const std::string& reason) const;

  std::string path_for_step(int64_t step) const;
  const std::string& dir() const { return dir_; }

  // Loads and validates one checkpoint directory; throws CheckpointError naming the file and the problem.
  static LoadedCheckpoint load(const std::string& path);
  // What a user's --checkpoint PATH means: the checkpoint PATH (one holding COMPLETE), or else the newest
  // valid checkpoint in the checkpoint directory PATH. ConfigError when there is neither.
  static LoadedCheckpoint load_given(const std::string& path);

 private:
  static LoadedCheckpoint load_unchecked(const std::string& path);
  std::string save_unchecked(const std::vector<NamedTensor>& model, const std::vector<NamedTensor>& optimizer,
                             const TrainState& state) const;
  std::string dir_;
  int64_t keep_;
};

// Copies each tensor of `from` into the tensor of the same name in `into` (a model's or optimizer's state);
// CheckpointError naming `path` and `what` (the file) when a name, shape or dtype differs or the counts do.
void copy_named(const std::vector<NamedTensor>& into, const SafetensorsFile& from, const std::string& what,
                const std::string& path);

// Host copies of device tensors, for the checkpoint writer (host tensors pass through).
std::vector<NamedTensor> on_host(std::vector<NamedTensor> tensors);

}  // namespace dpt::trainer
