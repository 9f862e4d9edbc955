// trainer/saved_run.cpp: a checkpoint and its run's config.
#include "trainer/saved_run.h"

namespace dpt::trainer {

SavedRun load_saved_run(const std::string& path, const std::vector<std::string>& overrides) {
  LoadedCheckpoint ck = CheckpointManager::load_given(path);
  Config cfg = parse_config(ck.state.config_toml, ck.path + "/state.json", overrides);
  return {std::move(ck), std::move(cfg)};
}

}  // namespace dpt::trainer
