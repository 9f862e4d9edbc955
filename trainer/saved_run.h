// trainer/saved_run.h: what a checkpoint holds for the tools that take a trained model (eval, predict, generate,
// export-weights): the checkpoint itself, loaded and validated, and the effective config its run trained with.
#pragma once

#include <string>
#include <vector>

#include "trainer/checkpoint.h"
#include "trainer/config.h"

namespace dpt::trainer {

struct SavedRun {
  LoadedCheckpoint checkpoint;  // the checkpoint chosen, loaded and validated
  Config config;                // its run's effective config, with the overrides applied
};

// The checkpoint at `path` (a step-N/ directory, or the newest valid one in a checkpoint directory) and its effective
// config with `overrides` applied (data.dir=..., train.eval_batch_size=...). ConfigError when there is no valid
// checkpoint.
SavedRun load_saved_run(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace dpt::trainer
