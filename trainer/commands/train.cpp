// trainer/commands/train.cpp: `dptrain [--config FILE] [overrides]`: train on every rank of the job
// (trainer/trainer.h), resuming from the newest checkpoint unless told otherwise.
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>

#include "trainer/checkpoint.h"
#include "trainer/commands/commands.h"
#include "trainer/commands/job.h"
#include "trainer/model_registry.h"
#include "trainer/preemption.h"
#include "trainer/schedule.h"
#include "trainer/report/metrics.h"
#include "trainer/trainer.h"

namespace dpt::trainer::commands {
namespace {

struct TrainArgs {
  std::string config_path;
  std::string resume = "auto";
  std::vector<std::string> overrides;
  std::shared_ptr<bool> print_config;
};

// The launcher's job, the same in every attempt of it (RunOptions::job). In a task of an srun step: Slurm's job id
// and step, both kept by a requeue, which reruns the batch script and its sruns in order (the token that
// dptrain.sbatch and dprun.sbatch make up is a new one in each attempt: a requeued --resume never once took the
// preempted attempt's checkpoints for another job's, deleted them and started over); the step tells two sruns of
// one job apart. Elsewhere: dprun's per-job token (a secret: only its FNV-1a 64 hash is kept), so that two dpruns
// in one batch script or salloc shell are two jobs (in a batch script, after Slurm's job id: job_family); else
// torchrun's run id, else Slurm's job id (dptrain in the batch script itself); empty under a launcher that names none.
std::string job_identity(const comm::DistEnv& env) {
  const char* slurm_job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");
  if (slurm_job && *slurm_job && step && *step) return fmt::format("slurm-{}.{}", slurm_job, step);
  if (!env.store_token.empty()) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char c : env.store_token) h = (h ^ c) * 1099511628211ull;
    if (slurm_job && *slurm_job) return fmt::format("slurm-{}:dprun-{:016x}", slurm_job, h);
    return fmt::format("dprun-{:016x}", h);
  }
  for (const auto& [var, name] : {std::pair{"TORCHELASTIC_RUN_ID", "torchrun"}, std::pair{"SLURM_JOB_ID", "slurm"}})
    if (const char* id = std::getenv(var); id && *id) return fmt::format("{}-{}", name, id);
  return {};
}

// RunOptions::job_family: in a requeued attempt (SLURM_RESTART_COUNT > 0) of a batch script that runs dprun itself,
// without srun, "slurm-ID": dprun makes up a new token in each attempt, so the earlier attempts' checkpoints carry
// another job_identity (a requeued --resume never once deleted them and started over), but this Slurm job's id.
std::string job_family() {
  const char* slurm_job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");
  const char* requeues = std::getenv("SLURM_RESTART_COUNT");
  if (!slurm_job || !*slurm_job || (step && *step) || !requeues || !*requeues || std::string(requeues) == "0")
    return {};
  return fmt::format("slurm-{}", slurm_job);
}

// What exit 75 means to the launcher, after "exiting with 75": under torchrun, whose agent counts any non-zero exit as
// a failure, not a stop (it starts every rank again while --max_restarts allow, else exits 1), so that nobody waits
// for a requeue on torchrun's exit code. "" elsewhere.
std::string torchrun_note() {
  const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
  if (!run_id || !*run_id) return "";
  return "; torchrun counts exit 75 as a failure: it starts the ranks again while --max_restarts allow (they go on "
         "from the newest checkpoint), else it exits 1, which a script cannot tell from a failure";
}

// Which attempt of the job this is (RunOptions::restart): the launcher's restart count, else Slurm's
// (SLURM_RESTART_COUNT: a requeue by scontrol, by the batch scripts after a preemption, or by --requeue after a node
// failure), whose --resume never or PATH were the first attempt's too. The same on every rank.
int attempt(const comm::DistEnv& env) {
  if (env.restart_count > 0) return env.restart_count;
  const char* slurm = std::getenv("SLURM_RESTART_COUNT");
  if (!slurm || !*slurm) return 0;
  char* end = nullptr;
  const long n = std::strtol(slurm, &end, 10);
  return *end == '\0' && n > 0 && n < 1000000 ? static_cast<int>(n) : 0;
}

int train_job(const TrainArgs& a) {
  std::string resolved;  // what the model family took from elsewhere (a llama's config.json), said by rank 0
  return run_job({
      .name = "dptrain",
      .stop_handlers = true,
      .warn_unread_keys = true,
      .print_config = *a.print_config,
      .load_config =
          [&](std::string& origin) {
            origin = a.config_path.empty() ? "<defaults>" : a.config_path;
            Config cfg = load_config(a.config_path, a.overrides);
            resolved = resolve_model_config(cfg.model);
            return cfg;
          },
      .work =
          [&](Job& job) {
            const bool lead = job.env.rank == 0;
            if (lead && !resolved.empty()) spdlog::info("{}", resolved);
            // A --resume PATH that is no directory, said before the data and the model are built (the trainer
            // checks it too, as late as that); a restart may go on from the job's own checkpoints instead.
            std::error_code ec;
            if (a.resume != "auto" && a.resume != "never" && attempt(job.env) == 0 &&
                !std::filesystem::is_directory(a.resume, ec))
              DPT_THROW(ConfigError, "--resume {}: no such checkpoint directory (--resume takes auto, never, or the "
                        "path of a step-N checkpoint or of a checkpoint directory){}", a.resume,
                        ec ? ": " + ec.message() : std::string());
            // A train.global_batch_size that does not divide among the ranks: refused before checkpoint.dir is made.
            (void)with_step_geometry(job.config.train, job.env.world_size);
            // An unusable checkpoint.dir (a file, a read-only folder): said now, not at the first checkpoint.
            if (lead) CheckpointManager::check_dir(job.config.checkpoint.dir);
            if (lead) check_metrics_dir(job.config);  // the same for the metrics file's folder
            RunResult result;
            try {
              result = train(job.config,
                             {.resume = a.resume, .restart = attempt(job.env), .job = job_identity(job.env),
                              .job_family = job_family(), .device = job.device},
                             *job.pg);
            } catch (const StoppedBeforeTraining& e) {  // a wait at start-up gave up on a stop signal
              job.pg.reset();
              if (lead)
                spdlog::warn("stopping before the first step: {}; nothing trained, no checkpoint to write; exiting "
                             "with {} (the same command starts again){}", e.what(), kExitPreempted, torchrun_note());
              spdlog::default_logger()->flush();
              return kExitPreempted;
            }
            if (result.stop_signal) {
              job.pg.reset();
              // --resume never or PATH would apply again to a rerun of this very command (a launcher's restart
              // excepted: it goes on from the job's own newest checkpoint); --resume auto goes on from the newest.
              const char* slurm_job = std::getenv("SLURM_JOB_ID");
              const std::string how =
                  a.resume == "auto" || attempt(job.env) > 0 ? "the same command resumes"
                  : slurm_job && *slurm_job
                      ? fmt::format("a requeue of Slurm job {}, or a new job of the same command with --resume auto "
                                    "(not --resume {}, which it would apply again), resumes", slurm_job, a.resume)
                      : fmt::format("the same command with --resume auto (not --resume {}, which a rerun would apply "
                                    "again) resumes", a.resume);
              if (lead && result.failed_checkpoint_step == result.steps)
                spdlog::warn("preempted at step {}, whose checkpoint was not written ({}); exiting with {}: {} from "
                             "the newest checkpoint: {}{}",
                             result.steps, result.checkpoint_error, kExitPreempted, how, newest_checkpoint(result),
                             torchrun_note());
              else if (lead)
                spdlog::info("preempted: checkpoint of step {} written; exiting with {} ({} from it){}", result.steps,
                             kExitPreempted, how, torchrun_note());
              spdlog::default_logger()->flush();
              return kExitPreempted;
            }
            if (lead) {
              spdlog::info("done: {} steps, test_acc {:.4f}, test_loss {:.4f}{}", result.steps, result.final_test_acc,
                           result.final_test_loss,
                           result.last_checkpoint.empty() ? "" : ", checkpoint " + result.last_checkpoint);
              if (result.checkpoint_failures > 0) spdlog::warn("{}", checkpoint_failure_summary(result));
            }
            return 0;
          },
  });
}

}  // namespace

Command add_train(CLI::App& root, std::shared_ptr<bool> print_config) {
  auto a = std::make_shared<TrainArgs>();
  a->print_config = print_config;
  root.add_option("-c,--config", a->config_path,
                  "TOML experiment file (e.g. configs/fmnist_mlp.toml); without it, the defaults below")
      ->check(CLI::ExistingFile);
  root.add_option("--resume", a->resume,
                  "auto: continue from the newest valid checkpoint in checkpoint.dir if there is one; never: start "
                  "fresh and DELETE the checkpoints in checkpoint.dir once this run's first checkpoint is written (a "
                  "run that fails before then leaves them); PATH: continue from that checkpoint, or from the newest "
                  "valid one in the checkpoint directory PATH. On a launcher's restart (DPT_RESTART_COUNT > 0) never "
                  "and PATH were the first attempt's: the job goes on from its own newest checkpoint")
      ->capture_default_str();
  root.add_flag("--print-config", *print_config, "print the effective config as TOML and exit");
  root.add_option("overrides", a->overrides, "config overrides, key=value (e.g. train.lr=0.1 model.hidden=[256,256])");
  root.footer("Config keys (section.key  type  default  meaning):\n" + config_keys_help());
  return {&root, [a] { return train_job(*a); }};
}

}  // namespace dpt::trainer::commands
