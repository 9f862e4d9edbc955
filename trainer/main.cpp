// trainer/main.cpp: the dptrain program: parse the command line, find this rank in the job, join the
// process group, train. The only place that decides how the process dies: an error is logged with the rank
// and the process exits non-zero at once, so the launcher (dprun, mpirun, srun) tears the job down.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <iostream>

#include "comm/env.h"
#include "comm/init.h"
#include "core/check.h"
#include "core/cuda.h"
#include "core/logging.h"
#include "trainer/config.h"
#include "trainer/trainer.h"

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

[[noreturn]] void die(int code, const std::string& what) { dpt::exit_with_error(code, what); }
}  // namespace

int main(int argc, char** argv) {
  using namespace dpt;
  CLI::App app{
      "dptrain: data-parallel training, one process per GPU or CPU slot.\n"
      "Start N copies with `dprun --nproc-per-node N -- dptrain ...`, `mpirun -np N dptrain ...` or `srun`; each\n"
      "finds its rank from the environment (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, OMPI_COMM_WORLD_*, or\n"
      "SLURM_*). A single process started by hand trains alone."};
  std::string config_path;
  std::string resume = "auto";
  bool print_config = false;
  std::vector<std::string> overrides;
  app.add_option("-c,--config", config_path, "TOML experiment file (e.g. configs/fmnist_mlp.toml); without it, the defaults below")
      ->check(CLI::ExistingFile);
  app.add_option("--resume", resume,
                 "auto: continue from the newest valid checkpoint in checkpoint.dir if there is one; never: start "
                 "fresh and DELETE the checkpoints in checkpoint.dir; PATH: continue from that checkpoint")
      ->capture_default_str();
  app.add_flag("--print-config", print_config, "print the effective config as TOML and exit");
  app.add_option("overrides", overrides, "config overrides, key=value (e.g. train.lr=0.1 model.hidden=[256,256])");
  app.footer("Config keys (section.key  type  default  meaning):\n" + trainer::config_keys_help());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help (rc 0) or the error and usage
    return rc == 0 ? 0 : kExitUsage;
  }

  comm::DistEnv env;
  try {
    env = comm::detect_env(comm::process_env());
    init_logging(env.rank, env.world_size);
  } catch (const Error& e) {
    std::cerr << "dptrain: " << e.what() << "\n";
    return kExitUsage;
  }

  trainer::Config cfg;
  try {
    cfg = trainer::load_config(config_path, overrides);
    if (print_config) {
      std::cout << trainer::to_toml(cfg);
      return 0;
    }
    if (!std::getenv("DPT_LOG_LEVEL")) spdlog::set_level(parse_log_level(cfg.log.level));
  } catch (const Error& e) {
    die(kExitUsage, e.what());
  }

  try {
    if (env.rank == 0)
      spdlog::info("dptrain: {} rank(s) via {}; config {} (hash {}):\n{}", env.world_size,
                   comm::launcher_name(env.launcher), config_path.empty() ? "<defaults>" : config_path,
                   trainer::config_hash(cfg), trainer::to_toml(cfg));
    // The device first: "cuda if available else cpu", one GPU per local rank; the backend follows from it.
    const Device device = trainer::choose_device(cfg.train.device, env.local_rank, cuda::device_count(),
                                                 cuda::unavailable_reason());
    if (device.is_cuda()) {
      cuda::set_device(device.index);
      spdlog::info("device {}: {}", device.str(), cuda::device_description(device.index));
    } else if (cfg.train.device == "auto" && env.rank == 0) {
      spdlog::warn("no GPU ({}): training on the CPU", cuda::unavailable_reason());
    }
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
    auto pg = comm::init_process_group(
        env, {.backend = cfg.dist.backend, .timeout = timeout, .device = device,
              .on_fatal = [](const std::string& why) { die(kExitError, "collective failed: " + why); }});
    auto result = trainer::train(cfg, {.resume = resume, .device = device}, *pg);
    if (env.rank == 0)
      spdlog::info("done: {} steps, test_acc {:.4f}, test_loss {:.4f}{}", result.steps, result.final_test_acc,
                   result.final_test_loss,
                   result.last_checkpoint.empty() ? "" : ", checkpoint " + result.last_checkpoint);
    pg.reset();  // orderly shutdown of the backend (MPI_Finalize and the like)
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    die(kExitError, e.what());
  }
  return 0;
}
