// launcher/launcher.h: dprun's logic as a library: the options, the environment each rank gets, and
// launch(), which spawns the ranks, relays their output, watches them, tears the job down and, with
// --max-restarts, starts it again.
//
// The contract with the ranks is torchrun's (DESIGN.md, "Environment contract"): RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, NODE_RANK (alias GROUP_RANK), MASTER_ADDR, MASTER_PORT, DPT_RESTART_COUNT, and
// OMP_NUM_THREADS=1 unless the user set it (to a value OpenMP takes); and DPT_STORE_TOKEN, the job's rendezvous
// token (job_store_token), which rank 0's store asks of every process that connects. The token travels only in the
// environment: never on a command line (other users can read those in /proc), never in dprun's messages.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/net.h"  // find_free_port, used for the single-node master port
#include "launcher/process.h"  // kExecFailedCode: what a rank that cannot be started exits with

namespace dpt::launcher {

inline constexpr const char* kLoopbackAddr = "127.0.0.1";
inline constexpr int kDefaultMultiNodePort = 29500;  // torchrun's default: every node must agree on it
inline constexpr double kDefaultGracePeriodS = 5.0;  // SIGTERM -> SIGKILL
inline constexpr double kDefaultStopTimeoutS = 60.0;  // SIGUSR1/SIGTERM to dprun -> SIGKILL: time to checkpoint
inline constexpr double kDefaultRdzvTimeoutS = 300.0;  // elastic: how long a round waits for MAX nodes
inline constexpr int kPreemptedCode = 75;            // a rank that stopped for a stop signal, checkpoint written
// A rank that refused its configuration (dptrain: a bad option, config key or value, missing data; also the usual
// command-line error of other programs: argparse, getopt): a restart would meet it again, so it ends the job.
inline constexpr int kConfigErrorCode = 2;

// What the user asked for. Fields left unset are chosen by resolve().
struct Options {
  int nproc_per_node = 1;                  // ranks on this node
  int nnodes = 1;                          // nodes in the job (with --nnodes MIN:MAX: MAX)
  std::optional<int> min_nnodes;           // --nnodes MIN:MAX: MIN (unset: nnodes)
  int node_rank = 0;                       // this node's index, 0 <= node_rank < nnodes
  std::optional<std::string> master_addr;  // unset: 127.0.0.1 (single node only)
  std::optional<int> master_port;          // unset: a free port (single node) or kDefaultMultiNodePort
  std::string log_dir;                     // empty: relay output with "[rank R] " prefixes
  double grace_period_s = kDefaultGracePeriodS;
  double stop_timeout_s = kDefaultStopTimeoutS;
  int max_restarts = 0;                    // restarts of all ranks (of every node) after a failed attempt
  double rdzv_timeout_s = kDefaultRdzvTimeoutS;  // elastic: a round closes after this with >= MIN nodes
  std::vector<std::string> command;        // the program and its arguments
  // The job's rendezvous token, every rank's DPT_STORE_TOKEN (empty: none set). launch() fills it in with
  // job_store_token(); a restart keeps it. A secret: never printed.
  std::string store_token;
};

// The environment as name -> value. Order does not matter to exec.
using Environment = std::map<std::string, std::string>;

// Throws ConfigError with a one-line message naming the option when the options cannot describe a job.
void validate(const Options& opts);

// dprun started as one of several tasks of srun (SLURM_STEP_ID with SLURM_NTASKS > 1) or mpirun
// (OMPI_COMM_WORLD_SIZE > 1) but with --nnodes 1: every task would start a job of its own, each rank 0 of a world
// of --nproc-per-node, on one checkpoint.dir. Throws ConfigError saying so and how to run one dprun per node.
// `getenv`: the environment to look in (std::getenv in dprun).
void check_not_one_of_many(const Options& opts, const std::function<const char*(const char*)>& getenv);

// dprun started as one of several tasks of mpirun (OMPI_COMM_WORLD_SIZE > 1) or of an srun step (SLURM_STEP_ID with
// SLURM_NTASKS > 1) with --nnodes > 1 but no --node-rank (`node_rank_given` false): every task once took the default 0,
// each acting as node 0 with rank 0, and they waited for the others' ranks until dist.timeout_s. The task's index
// (OMPI_COMM_WORLD_RANK, SLURM_PROCID) is then its node rank, as one dprun per node numbered by the launcher; more
// tasks than --nnodes is a ConfigError naming both. Returns what it did, for dprun to say ("" when nothing).
std::string node_rank_from_launcher(Options& opts, bool node_rank_given,
                                    const std::function<const char*(const char*)>& getenv);

// --nnodes: "N", or "MIN:MAX" (elastic). Sets opts.nnodes (N or MAX) and opts.min_nnodes (MIN; unset for "N").
// Throws ConfigError naming the text when it is neither.
void parse_nnodes(const std::string& text, Options& opts);

// --nproc-per-node: a number, or torchrun's words: auto (one rank per CUDA GPU visible, else one per CPU), gpu (one
// per GPU; ConfigError without one), cpu (one per CPU). `n`: the ranks; `why`: how a word was counted ("" for a
// number). `gpus` and `cpus` give the counts (visible_gpu_count, usable_cpu_count in dprun). ConfigError for
// anything else. A number below 1 is validate()'s to refuse.
struct NprocChoice {
  int n = 1;
  std::string why;
};
NprocChoice parse_nproc_per_node(const std::string& text, const std::function<int()>& gpus,
                                 const std::function<int()>& cpus);
// The CUDA devices this process may use (CUDA_VISIBLE_DEVICES applies), asked of the driver (libcuda.so.1) in a
// child process; 0 without a driver or a device.
int visible_gpu_count();
// The CPUs this process may run on (its affinity mask: Slurm's and taskset's limits apply).
int usable_cpu_count();

// The nodes the job needs at least (MIN, or --nnodes).
inline int min_nodes(const Options& opts) { return opts.min_nnodes.value_or(opts.nnodes); }

// An elastic job: more than one node, and restarts or a node count that may shrink. Its nodes meet in rounds
// at the master node's dprun (launcher/rendezvous.h) rather than each computing its ranks alone.
inline bool is_elastic(const Options& opts) {
  return opts.nnodes > 1 && (opts.max_restarts > 0 || min_nodes(opts) < opts.nnodes);
}

// Where this node's ranks are in the world of one attempt: fixed by --node-rank for a static job, by the
// round's rendezvous for an elastic one.
struct Placement {
  int first_rank = 0;   // global rank of local rank 0
  int world_size = 1;
  int group_rank = 0;   // NODE_RANK, GROUP_RANK: the node's index among the attempt's nodes
  int master_port = 0;  // MASTER_PORT of the ranks
  int group_world_size = 1;  // GROUP_WORLD_SIZE: the attempt's nodes
};
// The placement of a static job (not elastic): from --node-rank, --nnodes and --master-port (resolved).
Placement static_placement(const Options& opts);

// Fills in master_addr and master_port (finding a free port when single-node). Validates first.
Options resolve(Options opts);


// The full environment of one rank: `inherited` with the launcher's variables set on top; DPT_RESTART_COUNT is
// `restart` (0 for the first attempt, k for the k-th restart). `opts` must be resolved. Pure: the same inputs
// give the same environment.
Environment rank_environment(const Options& opts, int local_rank, const Environment& inherited, int restart = 0);
// The same with the ranks placed by `where` (an elastic round's placement).
Environment rank_environment(const Options& opts, const Placement& where, int local_rank,
                             const Environment& inherited, int restart);

// The job's rendezvous token: DPT_STORE_TOKEN from `inherited` when it is set and not empty; otherwise, on one
// node, a fresh random_token(). With --nnodes > 1 and none set it throws ConfigError telling the user to export
// the same DPT_STORE_TOKEN on every node: each node's dprun would invent a different one.
std::string job_store_token(const Options& opts, const Environment& inherited);

// 128 random bits (getrandom, else /dev/urandom) as 32 lowercase hex digits. Throws IoError when neither works.
std::string random_token();

// Could a TCP server bind `port` on every address now, as rank 0's TcpStore does (SO_REUSEADDR, so ports in
// TIME_WAIT count as free)? False while something listens on it.
bool port_bindable(int port);

// The global rank of local rank `local_rank` on this node.
inline int global_rank(const Options& opts, int local_rank) { return opts.node_rank * opts.nproc_per_node + local_rank; }

// This process's environment (environ) as a map.
Environment current_environment();

// Runs the job to completion and returns the exit code dprun should exit with: 0 when every rank exited 0;
// else the first failed rank's exit code (128 + signal when it was killed); 128 + signal when dprun itself
// was told to stop by SIGINT, SIGTERM, SIGHUP or SIGUSR1; kPreemptedCode (75) when the ranks stopped for a
// stop signal (to dprun or to a rank) and every one exited 0 or 75. Never exits the process; throws
// dpt::Error on a failure of its own (after killing whatever it had started).
//
// Preemption: SIGUSR1 and SIGTERM (to dprun, forwarded; or to a rank directly, which then exits 75) give the
// ranks stop_timeout_s to checkpoint and exit before SIGKILL; SIGUSR1 again, or SIGTERM after SIGUSR1, is
// forwarded rather than cutting that short (SIGTERM twice, SIGINT or SIGHUP skip the wait). A rank exiting 75 is
// not a failure (no restart), but the others are stopped as on SIGTERM to dprun: SIGTERM, stop_timeout_s (a rank
// signalled alone at the rendezvous leaves its peers waiting for it there).
//
// With opts.max_restarts = N > 0, an attempt that ends because a rank failed is torn down as usual and then
// every rank is started again (DPT_RESTART_COUNT 1, 2, ...), up to N times; the exit code is then the last
// attempt's. An elastic job (is_elastic) does so on every node at once, in rendezvous rounds
// (launcher/rendezvous.h): a failure on any node restarts them all, with the nodes present. No restart follows a stop signal to dprun (received at any time, teardown included) or a
// program that could not be started. The master port is kept when it can still be bound; one that dprun
// chose itself and that something else has taken meanwhile is replaced by a new free port.
//
// Call it from a single-threaded process: it takes SIGCHLD, SIGINT, SIGTERM, SIGHUP and SIGUSR1 through a signalfd by
// blocking them in the calling thread only (another thread would receive them instead), and the ranks'
// PR_SET_PDEATHSIG fires when the thread that forked them ends. The signal state is restored on return.
int launch(const Options& opts);

}  // namespace dpt::launcher
