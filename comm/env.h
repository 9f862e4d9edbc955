// comm/env.h: who am I in the job? Detects rank, world size and the rendezvous address from the launcher's
// environment: dprun/torchrun variables, Open MPI's OMPI_COMM_WORLD_*, or Slurm's SLURM_*.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dpt::comm {

// None: a single process started by hand. Torchrun: dprun's variables (which are torchrun's), set by torchrun's
// elastic agent (TORCHELASTIC_RUN_ID is set). Hydra: the mpiexec (or mpirun) of MPICH, Intel MPI or MVAPICH, whose
// PMI_RANK/PMI_SIZE and MPI_LOCALRANKID/MPI_LOCALNRANKS place the process; this build's MPI (Open MPI's) cannot
// start under it, so its ranks use gloo.
enum class Launcher { None, Dprun, Torchrun, OpenMPI, Slurm, Hydra };
const char* launcher_name(Launcher l);

struct DistEnv {
  Launcher launcher = Launcher::None;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Whether MASTER_ADDR / MASTER_PORT were set in the environment, rather than defaulted (under mpirun, rank 0 then
  // chooses them and tells the other ranks by MPI: init_process_group).
  bool master_addr_set = false;
  bool master_port_set = false;
  int restart_count = 0;  // DPT_RESTART_COUNT (torchrun: TORCHELASTIC_RESTART_COUNT)
  // torchrun's agent hosts the job's store, a c10d TCPStore at MASTER_ADDR:MASTER_PORT, and says so
  // (TORCHELASTIC_USE_AGENT_STORE=True): the ranks join it as clients (comm/c10d_store.h) instead of rank 0
  // hosting dptrain's own TcpStore there.
  bool agent_store = false;
  bool mpi_available = false;  // launched so that MPI_Init will find its peers (mpirun, or srun with PMI)
  // DPT_STORE_TOKEN (empty when unset), whatever the launcher: the job's rendezvous token, which rank 0's
  // TcpStore asks of every client. A secret: never log or print it.
  std::string store_token;
  // Something about the placement the user should hear (rank 0 logs it as a warning), e.g. Slurm's batch script
  // run as a single process although the job has several tasks. Empty when there is nothing to say.
  std::string warning;
};

using EnvMap = std::map<std::string, std::string>;

// Pure function over a recorded environment; throws ConfigError on inconsistent or malformed values
// (e.g. RANK >= WORLD_SIZE, a non-numeric port, WORLD_SIZE without RANK), naming the variable. RANK and WORLD_SIZE
// come first when dprun (DPT_LAUNCHER=dprun) or torchrun (TORCHELASTIC_RUN_ID) set them, even inside mpirun or
// srun; set otherwise (by hand, or left over) next to OMPI_COMM_WORLD_* or SLURM_*, they must agree with those
// (then the launcher is that one) or ConfigError names both. SLURM_* count only in a task that srun started (with
// SLURM_STEP_ID): Slurm's batch script has SLURM_PROCID=0 and SLURM_NTASKS too, but is one process. Hydra's variables
// count after all those; its ranks on several hosts need MASTER_ADDR (ConfigError otherwise: it has no address for
// rank 0 to give, and the 127.0.0.1 default would leave the other hosts' ranks waiting until dist.timeout_s).
DistEnv detect_env(const EnvMap& env);
// The current process's environment.
EnvMap process_env();

// How many threads each CPU library of a rank (OpenMP, which oneDNN runs on; OpenBLAS) should run when no variable
// chose: left alone, both start one per CPU in the rank's affinity mask, so `local_ranks` ranks of one host started
// unbound (mpirun --bind-to none, srun without CPU binding, a script) run local_ranks x CPUs threads, which spin at
// their barriers: 2 ranks on 2 CPUs trained 3x slower. Slurm's --cpus-per-task (`cpus_per_task` > 0, from
// SLURM_CPUS_PER_TASK) is the task's own CPUs: that many, at most the mask's. Otherwise the mask's CPUs shared by
// the ranks that share the mask: all the host's where the mask is the launcher's (`launcher_cpus`, the CPUs in the
// parent process's mask; 0: unknown, the same), else as many as spreading the host's ranks evenly over the
// launcher's CPUs puts in one mask (mpirun --bind-to socket: 4 ranks on 2 sockets of 8 CPUs, 2 a socket, 4 threads
// each; --map-by ...:PE=4 or srun's binding: the rank's own CPUs). At least 1; a rank bound to one CPU keeps 1.
int cpu_threads_per_rank(int local_ranks, int cpus_in_mask, int launcher_cpus = 0, int cpus_per_task = 0);

// What a rank sets: a count for OpenMP and one for OpenBLAS, 0 where the library is left as it is: a single rank on
// its host, a count not below the mask's CPUs (what the library starts anyway), or a variable the library reads set
// by the user (OMP_NUM_THREADS for OpenMP; OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS for OpenBLAS),
// with a value the library takes (core/thread_env.h: libgomp ignores OMP_NUM_THREADS='' or 'abc').
struct CpuThreads {
  int openmp = 0;
  int openblas = 0;
  int per_rank = 0;  // cpu_threads_per_rank's answer, for the note
};
CpuThreads choose_cpu_threads(const DistEnv& d, const EnvMap& env, int cpus_in_mask, int launcher_cpus = 0);

// Expands a Slurm hostlist expression: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5.
std::vector<std::string> expand_hostlist(const std::string& expr);

}  // namespace dpt::comm
