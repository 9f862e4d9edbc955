// trainer/commands/job.cpp: a rank of a job (trainer/commands/job.h).
#include "trainer/commands/job.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <optional>

#include <sched.h>
#include <unistd.h>

#include "comm/init.h"
#include "core/check.h"
#include "core/cuda.h"
#include "core/logging.h"
#include "models/kernels/cpu/cpu_info.h"
#include "trainer/commands/commands.h"
#include "trainer/config_check.h"
#include "trainer/preemption.h"
#include "trainer/trainer.h"

namespace dpt::trainer::commands {
namespace {

// Rank 0 says which OpenBLAS kernels run (main() may have restarted the process for faster ones).
void log_blas_kernels() {
  if (const char* from = std::getenv("DPT_BLAS_REEXEC_FROM"))
    spdlog::info("OpenBLAS: {} kernels (OPENBLAS_CORETYPE; it had chosen {} for this CPU)", models::blas_core(), from);
  else if (const std::string better = models::blas_core_upgrade(); !better.empty())
    spdlog::warn("OpenBLAS runs {} kernels on a CPU that supports {}: set OPENBLAS_CORETYPE={} for faster GEMMs",
                 models::blas_core(), better, better);
}

// Ranks that share a host, started with no thread count (mpirun --bind-to none, srun without CPU binding, a script
// of one's own; dprun and torchrun set OMP_NUM_THREADS=1): each would run one OpenMP and one OpenBLAS thread per CPU
// of its affinity mask, and the host's ranks together many times its CPUs. Each rank lowers the counts itself, as
// comm::choose_cpu_threads says, and rank 0 says so on stderr, as torchrun says it sets OMP_NUM_THREADS.
// A mask narrower than the launcher's (the parent: mpirun's, orted's, slurmstepd's) is a binding, which
// choose_cpu_threads takes as the launcher's CPUs dealt out among the ranks.
void limit_cpu_threads(const comm::DistEnv& env) {
  auto cpus_of = [](pid_t pid) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    return ::sched_getaffinity(pid, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : 0;
  };
  const int cpus = cpus_of(0);
  if (cpus == 0) return;
  const comm::CpuThreads t = comm::choose_cpu_threads(env, comm::process_env(), cpus, cpus_of(::getppid()));
  if (!models::limit_cpu_threads(t.openmp, t.openblas) || env.rank != 0) return;
  // Anything lowered means OMP_NUM_THREADS is unset or ignored, so OpenMP was; OpenBLAS too unless
  // OPENBLAS_NUM_THREADS is set.
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const std::string why = omp ? fmt::format("OMP_NUM_THREADS='{}' is no thread count (OpenMP ignores it)", omp)
                              : "OMP_NUM_THREADS is unset";
  std::cerr << fmt::format("dptrain: {} ranks share this host and {}: {} run {} thread{} per rank (each may run on "
                           "{} CPUs), so that the ranks do not overload the machine; set OMP_NUM_THREADS yourself to "
                           "tune it\n",
                           env.local_world_size, why,
                           t.openblas > 0 ? "OpenMP (oneDNN) and OpenBLAS" : "OpenMP (oneDNN)",
                           t.per_rank, t.per_rank == 1 ? "" : "s", cpus);
}

// `doing`: what runs there, for the warning without a GPU ("training"; eval and predict train nothing).
Device choose_and_set_device(const Config& cfg, const comm::DistEnv& env, std::string_view doing) {
  const Device device =
      choose_device(cfg.train.device, env.local_rank, cuda::device_count(), cuda::unavailable_reason());
  if (device.is_cuda()) {
    cuda::set_device(device.index);
    spdlog::info("device {}: {}", device.str(), cuda::device_description(device.index));
  } else if (cfg.train.device == DeviceChoice::automatic && env.rank == 0) {
    spdlog::warn("no GPU ({}): {} on the CPU", cuda::unavailable_reason(), doing);
  }
  // Rank 0's thread counts: a product's or convolution's last bits can change with them (cpu_info.h).
  if (device.is_cpu() && env.rank == 0) spdlog::info("device cpu: {} (rank 0)", models::describe_cpu_threads());
  return device;
}

// A stop signal before the first step (trainer/preemption.h's RendezvousStopWatch): nothing trained, nothing to
// checkpoint, so this rank leaves at once, with 75 as a stop after training began would: the same command starts
// the run again (and resumes from the newest checkpoint as usual).
[[noreturn]] void exit_stopped_before_training(int sig, const comm::DistEnv& env) {
  const std::string name = sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : fmt::format("signal {}", sig);
  exit_with_note(kExitPreempted,
                 fmt::format("stopped by {} {} (before the first step: nothing to checkpoint); exiting with {}: the "
                             "same command starts the run again",
                             name, env.world_size > 1 ? "while waiting for the rendezvous with the other ranks"
                                                      : "while starting", kExitPreempted));
}

}  // namespace

int run_job(const JobSpec& spec) {
  // --print-config: stdout holds the TOML alone, so that `dptrain --print-config > run.toml` reads back with --config;
  // every log line (the OpenBLAS note below, a warning, the error that refuses the config) goes to stderr.
  if (spec.print_config) spdlog::set_default_logger(spdlog::stderr_color_mt("dptrain-print-config"));
  comm::DistEnv env;
  try {
    env = comm::detect_env(comm::process_env());
    init_logging(env.rank, env.world_size);
    if (env.rank == 0) log_blas_kernels();
    limit_cpu_threads(env);
  } catch (const Error& e) {
    std::cerr << "dptrain: " << e.what() << "\n";
    return kExitUsage;
  }
  // main() has held SIGUSR1 and SIGTERM since it began; one that came meanwhile is recorded now.
  if (spec.stop_handlers) install_stop_handlers();

  Config cfg;
  std::string origin;
  try {
    cfg = spec.load_config(origin);
    if (spec.print_config) {
      std::cout << to_toml(cfg);
      return 0;
    }
    if (!std::getenv("DPT_LOG_LEVEL")) spdlog::set_level(parse_log_level(cfg.log.level));
  } catch (const Error& e) {
    die(kExitUsage, e.what());
  }

  // The process group outlives the try block: the error that ends this rank is logged (and the process gone, by
  // _Exit) before anything closes its connections. Were it destroyed during unwinding, the peers would see the
  // connection drop first, fail with "connection reset", and could be reported, and the launcher could stop this
  // rank, before the real cause was printed.
  std::unique_ptr<comm::ProcessGroup> pg;
  int rc = 0;
  bool waiting_for_peers = spec.stop_handlers;  // until the process group exists: a stop then ends the rank at once
  try {
    if (env.rank == 0)
      spdlog::info("{}: {} rank(s) via {}; config {} (hash {}):\n{}", spec.name, env.world_size,
                   comm::launcher_name(env.launcher), origin, config_hash(cfg), to_toml(cfg));
    if (env.rank == 0 && !env.warning.empty()) spdlog::warn("{}", env.warning);
    if (env.rank == 0 && spec.warn_unread_keys)
      for (const std::string& line : unread_keys(cfg)) spdlog::warn("config: {}", line);
    if (env.rank == 0 && !spec.warn_unread_keys)
      for (const std::string& line : unread_keys(cfg))
        for (const std::string& o : spec.overrides)
          if (line.starts_with(o.substr(0, o.find('=')) + " = ")) spdlog::warn("override {}: {}", o, line);
    const Device device = choose_and_set_device(cfg, env, spec.name == "dptrain" ? "training" : "running");
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
    std::optional<RendezvousStopWatch> watch;
    if (waiting_for_peers) watch.emplace([&env](int sig) { exit_stopped_before_training(sig, env); });
    pg = comm::init_process_group(
        env, {.backend = cfg.dist.backend, .timeout = timeout, .device = device, .interface = cfg.dist.interface,
              .on_fatal = [](const std::string& why) {
                if (why.starts_with(comm::kHangPrefix)) die(kExitHang, why);
                die(kExitError, "collective failed: " + why);
              }});
    if (watch) watch->disarm();
    check_same_config(cfg, *pg);  // every rank: the same config and build, or ConfigError (exit 2)
    // Its collective fails if a peer stopped inside the rendezvous just as this rank left it: a stop here too.
    waiting_for_peers = false;
    Job job{.config = cfg, .env = env, .device = device, .pg = pg};
    rc = spec.work(job);
    pg.reset();  // orderly shutdown of the backend (MPI_Finalize and the like)
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    // A peer that stopped first (its store or connection gone) before this rank's watch saw its own signal.
    if (waiting_for_peers && stop_signal()) exit_stopped_before_training(stop_signal(), env);
    die(kExitError, e.what());
  }
  return rc;
}

}  // namespace dpt::trainer::commands
