// trainer/commands/job.h: what train and eval share: this process becomes one rank of the job its launcher started
// (dprun, mpirun, srun or none), reads its config, chooses its device ("cuda if available else cpu", one GPU per
// local rank), joins the process group, checks that every rank has the same config, and runs its work; an error
// ends the rank at once (the launcher tears the job down).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/env.h"
#include "comm/process_group.h"
#include "trainer/config.h"

namespace dpt::trainer::commands {

struct Job {
  const Config& config;
  const comm::DistEnv& env;
  Device device;
  // The work may close it early (a preempted run shuts the backend down before it exits).
  std::unique_ptr<comm::ProcessGroup>& pg;
};

struct JobSpec {
  std::string name;            // the header line's: "dptrain", "dptrain eval"
  bool stop_handlers = false;  // SIGUSR1 and SIGTERM stop a run cleanly (trainer/preemption.h)
  bool warn_unread_keys = false;  // rank 0 warns of keys set that nothing reads (unread_keys): training's own config
  bool print_config = false;   // print the effective config as TOML and exit
  // eval's and predict's key=value overrides of a checkpoint's config: rank 0 warns of those among unread_keys (a
  // model.hidden for a GPT's checkpoint was once taken without a word), not of the checkpoint's own keys.
  std::vector<std::string> overrides;
  // The config, and where it came from for the header line; ConfigError ends the rank with kExitUsage.
  std::function<Config(std::string& origin)> load_config;
  // The work, on every rank; returns the exit code.
  std::function<int(Job& job)> work;
};

int run_job(const JobSpec& spec);

}  // namespace dpt::trainer::commands
