// launcher/main.cpp: dprun's command line: parses the options into launcher::Options, runs the job and turns
// the outcome into the exit code (the job's, 2 for a command-line error, 1 for dprun's own failure).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cli_checks.h"
#include "dpt_build_id.h"  // DPT_VERSION, DPT_BUILD_ID: --version (cmake/build_id.cmake)
#include "launcher/launcher.h"

namespace {

using dpt::launcher::Options;

constexpr int kUsageExitCode = 2;
constexpr const char* kUsage = "dprun [OPTIONS] -- PROGRAM [ARGS...]";

constexpr const char* kDescription =
    "dprun: start PROGRAM once per rank on this node, give each rank its place in the job through the\n"
    "environment (the same variables as torchrun), relay their output, and stop them all when one fails\n"
    "(and, with --max-restarts, start them all again).";

constexpr const char* kFooter = R"(Environment of each rank: dprun's own, plus
  RANK                     node_rank * nproc_per_node + local_rank (elastic: see below)
  LOCAL_RANK               0 .. nproc_per_node - 1
  WORLD_SIZE               nnodes * nproc_per_node (elastic: the ranks of the round's nodes)
  LOCAL_WORLD_SIZE         nproc_per_node
  NODE_RANK, GROUP_RANK    --node-rank (elastic: the node's index in the round)
  GROUP_WORLD_SIZE         nnodes (elastic: the round's nodes)
  ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME
                           RANK, WORLD_SIZE and "default", as torchrun's single role
  MASTER_ADDR, MASTER_PORT --master-addr, --master-port (defaults above; elastic: a port the
                           master node's dprun finds free for each round)
  DPT_RESTART_COUNT        0; k in the k-th restart (--max-restarts; elastic: the round)
  DPT_LAUNCHER             dprun: the variables above are dprun's (dptrain then takes them over
                           OMPI_COMM_WORLD_* or SLURM_* inherited from an mpirun or srun around dprun)
  OMP_NUM_THREADS          1, unless it is set already to a count OpenMP takes ('', 'abc' or '0' it
                           ignores); dprun says so on stderr when it sets it
  DPT_RANK_PREFIXED        1 when dprun prefixes the output (no --log-dir)
  DPT_LIVE_LINE            1 when dprun prefixes the output and its stdout is a terminal: rank 0
                           shows its progress as one line redrawn in place (unless already set)
  DPT_STORE_TOKEN          the job's rendezvous token: dprun's own DPT_STORE_TOKEN, else (one node
                           only) 128 random bits in hex, made once per job and kept across restarts
  DPT_REASON_FILE          a file in dprun's private temporary directory: the first rank to fail
                           writes one line there (dptrain: its error, or a hang naming the stuck
                           rank), and dprun prints it once as "dprun: reason: ..." after the teardown
                           (a rank killed by a signal, which cannot write, is named there first).
                           dprun's own DPT_REASON_FILE, if it has one (scripts/slurm/dprun.sbatch's),
                           gets "node N: <the reason>" when the job fails (not on exit 0 or 75)
Standard input of every rank is /dev/null. torchrun's spellings (--nproc_per_node ...) work too.

Rendezvous token: rank 0's store admits only processes presenting the job's DPT_STORE_TOKEN, so a rank
of another job, or a stranger, cannot join or crash the rendezvous. It is passed in the environment
only (never on a command line, never printed). With --nnodes > 1 dprun cannot make it up (each node
would make another): export the same one on every node first, or dprun refuses to start, e.g.
  export DPT_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')

Output: without --log-dir each line a rank writes to stdout (stderr) is printed on dprun's stdout
(stderr) as "[rank R] line"; with --log-dir, rank R's stdout and stderr both go to DIR/rank_R.log,
without prefixes (an elastic job's, as torchrun's, to DIR/nodeN_<UTC time>_<random>/attempt_K/rank_R.log:
a folder per node and run of dprun, and one per round K). dprun's own messages go to stderr and start
with "dprun: ".

Teardown: each rank runs in its own process group and is SIGKILLed if dprun dies, even by kill -9.
A dprun started by mpirun (OMPI_COMM_WORLD_SIZE set) takes mpirun's death (or its orted's) as SIGUSR1:
the ranks checkpoint and exit 75 (below) rather than train on as orphans.
When a rank exits non-zero or is killed by a signal, dprun names it, sends SIGTERM to every rank's
process group, SIGKILL after --grace-period seconds to any rank still running, and exits with that
rank's exit code (128 + N when killed by signal N). A program that cannot be started counts as a rank
that exited with 127. SIGINT and SIGHUP sent to dprun are forwarded to every rank the same way (a
second signal skips the grace period), and dprun exits with 128 + N.

Preemption: SIGUSR1 and SIGTERM sent to dprun (Slurm's --signal=USR1@120, scancel, a spot reclaim) are
forwarded too (to a rank in its first second that neither blocks nor catches it yet, such as dptrain in
the dynamic loader, which it would kill: once it does), but the ranks get --stop-timeout seconds (default 60)
before SIGKILL, and SIGUSR1 again,
or SIGTERM after SIGUSR1, is forwarded instead of cutting that short (SIGTERM twice, SIGINT or SIGHUP
still skip the wait): dptrain's ranks agree on the next
step, rank 0 writes a checkpoint, and each exits 75. A rank that exits 75 on its own (it was signalled
directly) is not a failure: dprun sends the others SIGTERM (one signalled at the rendezvous leaves its peers
waiting there) and waits for them the same way. When every rank exits 0 or 75 after
that, dprun exits 75 if any exited 75 (the job should be requeued; the same command resumes, with
dptrain's --resume auto), 0 if all
exited 0 (the job completed before it stopped: nothing to requeue; an elastic job, whose stop ends the
round on every node, exits 75), otherwise as above.

Restarts (--max-restarts N; on several nodes see "Elastic jobs" below): after a rank fails and the
job has been torn down as above, dprun prints "rank R failed (...); restart k of N" and starts every
rank again with DPT_RESTART_COUNT=k, the same MASTER_ADDR and MASTER_PORT (a port dprun chose itself is
replaced by a new free one if something else has taken it meanwhile). With --log-dir, the new attempt's
output is appended to each rank's log. A program resumes from its own checkpoints (dptrain does: with
--resume auto, and on a restart also with --resume never or PATH, which apply to the first attempt). There is no restart after SIGINT, SIGTERM, SIGHUP or SIGUSR1 to dprun (even during a
teardown), after a preemption (exit 75), when the program cannot be started, or after a configuration
error: a rank that exits 2 (dptrain: a bad option, config key or value, missing data; the usual code of a
command-line error elsewhere too) would meet it again, so dprun prints its message and exits 2 at once
(torchrun restarts it); after the N-th restart fails, dprun exits as without restarts.

Elastic jobs (--nnodes MIN:MAX, or --nnodes M with --max-restarts): node 0's dprun (--node-rank 0, at
--master-addr) hosts the rendezvous at --master-port; every node's dprun, with the same options and
DPT_STORE_TOKEN, joins it in rounds. A round closes when MAX nodes have joined, or --rdzv-timeout after
node 0 joined with at least MIN; its ranks are numbered node after node in --node-rank order (node 0
first, so rank 0 is on the master node). A failure on any node (a rank exits non-zero or is killed by a
signal) is published there: every node tears its ranks down and joins the next round, and the ranks
start again with DPT_RESTART_COUNT = the round (up to --max-restarts rounds after the first; a
configuration error, exit 2, ends the job on every node, with the rank's message). A node not
back within --rdzv-timeout is left out while at least MIN nodes remain; with fewer, the job ends with a
message naming the missing node. A node that starts late joins the next round (after the next failure),
up to MAX: the running nodes do not restart to admit it (dptrain then resumes at the new world size
from the newest checkpoint, mid-epoch included).
Every other node's dprun sends node 0 a keep-alive about once a second; a node silent for --rdzv-timeout
while the ranks run (its host hung or gone, its ranks' peers blocked on it) is declared lost, which is
that round's failure. Losing node 0 (its dprun or its host) ends the job on every node: requeue it
(Slurm's --requeue). After the ranks of node 0 finish, its dprun waits up to --rdzv-timeout for the other
nodes' to finish before it stops serving the rendezvous.

Exit status: 0 when every rank exited 0 (in the last attempt; after SIGUSR1 or SIGTERM too); the failed
rank's code as above; 75 when the ranks stopped for preemption; 2 for a command-line error; 1 when dprun
itself failed.

Examples:
  dprun --nproc-per-node 4 -- build/trainer/dptrain --config configs/fmnist_mlp.toml
  dprun --nproc-per-node 2 --log-dir logs -- sh -c 'echo "rank $RANK of $WORLD_SIZE"'
  # survive up to 3 rank failures; dptrain continues from its newest checkpoint each time:
  dprun --nproc-per-node 4 --max-restarts 3 -- dptrain --config c.toml checkpoint.every_steps=100
  # two nodes with 8 ranks each; run on both, with the same DPT_STORE_TOKEN exported, with
  # --node-rank 0 on 10.0.0.1 and 1 on the other:
  dprun --nproc-per-node 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 -- dptrain --config c.toml
  # the same, elastic: restart both nodes after a failure, go on with one if the other is gone:
  dprun --nproc-per-node 8 --nnodes 1:2 --max-restarts 3 --node-rank 0 --master-addr 10.0.0.1 -- ...)";

// Usage line that shows where the program goes.
class Formatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override { return fmt::format("Usage: {}\n", kUsage); }
};

// torchrun spells its options with underscores (--nproc_per_node); accept those too, without cluttering --help.
std::string dashed(std::string arg) {
  if (!arg.starts_with("--")) return arg;
  std::size_t end = std::min(arg.find('='), arg.size());
  std::replace(arg.begin(), arg.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  return arg;
}

int usage_error(const std::string& msg) {
  fmt::print(stderr, "dprun: error: {}\nusage: {}\nRun 'dprun --help' for the options.\n", msg, kUsage);
  return kUsageExitCode;
}

// torchrun's options that dprun has not (its underscores already dashes): what to write instead; "" for any other.
std::string torchrun_hint(const std::string& word) {
  if (word == "--rdzv-endpoint")
    return "torchrun's --rdzv-endpoint HOST:PORT is dprun's --master-addr HOST --master-port PORT (node 0's dprun "
           "hosts the rendezvous there)";
  if (word == "--rdzv-backend" || word == "--rdzv-id" || word == "--rdzv-conf")
    return fmt::format("dprun has one rendezvous, hosted by node 0's dprun at --master-addr and --master-port "
                       "(--rdzv-timeout, --nnodes MIN:MAX): leave torchrun's {} out", word);
  if (word == "--no-python" || word == "-m" || word == "--module")
    return "dprun runs the program after '--' as it is (dprun --nproc-per-node 2 -- build/trainer/dptrain ...; a "
           "Python module: -- python -m MODULE)";
  for (const char* o : {"--monitor-interval", "--redirects", "--tee", "--role", "--start-method", "--local-addr",
                        "--max-nodes", "--run-path", "--logs-specs", "--local-ranks-filter"})
    if (word == o) return fmt::format("torchrun's {} has no counterpart in dprun: leave it out", word);
  return "";
}

// What the command line gives beyond Options' own fields: the words parsed later, and whether an address or port was
// given at all.
struct RawOptions {
  std::string nproc = "1";
  std::string nnodes = "1";
  std::string master_addr;
  int master_port = 0;
  CLI::Option* addr_opt = nullptr;
  CLI::Option* port_opt = nullptr;
  bool standalone = false;
};

// dprun's options, their help as --help prints it.
void add_options(CLI::App& app, Options& opts, RawOptions& raw) {
  auto formatter = std::make_shared<Formatter>();
  formatter->column_width(22);
  app.formatter(formatter);
  app.footer(kFooter);
  app.allow_extras();  // leftovers are reported by main, with a hint where the program goes
  app.set_version_flag("--version", fmt::format("dprun {} built {}", DPT_VERSION, DPT_BUILD_ID),
                       "print dprun's version and build (its commit)");
  // torchrun --standalone (nanoGPT's README: `torchrun --standalone --nproc_per_node=8 train.py`): one node with its
  // rendezvous on this host, which is what dprun does without --nnodes.
  app.add_flag("--standalone", raw.standalone, "torchrun's: one node, rendezvous on this host (dprun's default)");
  app.add_option("--nproc-per-node", raw.nproc,
                 "ranks to start on this node (default 1), or torchrun's words:\n"
                 "auto: one per CUDA GPU visible, else one per CPU; gpu: one\n"
                 "per GPU (refused without one); cpu: one per CPU (the CPUs\n"
                 "dprun may run on: its affinity, as taskset sets it)")
      ->type_name("N|auto|gpu|cpu");
  app.add_option("--nnodes", raw.nnodes,
                 "nodes in the job, each running a dprun (default 1); MIN:MAX:\n"
                 "an elastic job that goes on with at least MIN nodes")
      ->type_name("M|MIN:MAX");
  app.add_option("--node-rank", opts.node_rank,
                 "this node's index, 0 .. M-1 (default 0; one of several\n"
                 "mpirun processes or srun tasks: its OMPI_COMM_WORLD_RANK\n"
                 "or SLURM_PROCID)")
      ->type_name("R");
  raw.addr_opt = app.add_option("--master-addr", raw.master_addr,
                                "address of node 0, reachable from every node\n"
                                "(default 127.0.0.1; required with --nnodes > 1)")
                     ->type_name("ADDR");
  raw.port_opt = app.add_option("--master-port", raw.master_port,
                                "rendezvous port on the master, 1..65535 (default: a\n"
                                "port found free on 127.0.0.1; 29500 with --nnodes > 1)")
                     ->type_name("PORT");
  app.add_option("--log-dir", opts.log_dir, "write rank R's output to DIR/rank_R.log (DIR is created)\n"
                                            "instead of printing it with [rank R] prefixes (elastic:\n"
                                            "DIR/nodeN_TIME_RANDOM/attempt_K/rank_R.log, K the round)")
      ->type_name("DIR");
  app.add_option("--grace-period", opts.grace_period_s, "seconds from SIGTERM to SIGKILL at teardown (default 5)")
      ->type_name("SEC");
  app.add_option("--stop-timeout", opts.stop_timeout_s,
                 "after SIGUSR1 or SIGTERM to dprun, or a rank exiting 75:\n"
                 "seconds the ranks get to checkpoint and exit (default 60)")
      ->type_name("SEC");
  app.add_option("--max-restarts", opts.max_restarts,
                 "after a rank fails, stop all ranks and start them again,\n"
                 "up to N times (default 0; every node's, with --nnodes > 1)")
      ->type_name("N");
  app.add_option("--rdzv-timeout", opts.rdzv_timeout_s,
                 "elastic jobs: seconds a round waits for MAX nodes before it\n"
                 "goes on with the nodes present, if at least MIN; and the\n"
                 "silence after which node 0 declares a node lost (default 300)")
      ->type_name("SEC");
}

// dprun started by mpirun (one per node, --nnodes N): mpirun, or its orted on another node, is the parent, and when it
// died (kill -9, the OOM killer) dprun and its ranks trained on as orphans; a dprun is no MPI process that Open MPI
// could take down. SIGUSR1 when the parent dies, a preemption as SIGUSR1 to dprun: the ranks checkpoint and exit 75.
// SIGUSR1 and not SIGTERM: the kernel sends the signal again each time dprun is handed to another parent thread as a
// multithreaded mpirun dies, and a second SIGTERM means "now" to dprun (SIGKILL, no checkpoint), where SIGUSR1 again
// is forwarded and changes nothing. (srun takes its tasks down itself.) Asked before launch() takes the signals
// through its signalfd; a parent gone already: SIGUSR1 now, which ends dprun before it starts anything.
void stop_with_mpirun() {
  const char* mpi_world = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!mpi_world || !*mpi_world) return;
  const pid_t parent = ::getppid();
  if (::prctl(PR_SET_PDEATHSIG, SIGUSR1) != 0) return;
  if (::getppid() != parent) ::raise(SIGUSR1);
}

}  // namespace

int main(int argc, char** argv) {
  // Everything after the first "--" belongs to the program, untouched (it may have a --help of its own).
  std::vector<std::string> ours;
  Options opts;
  bool saw_separator = false;
  for (int i = 1; i < argc; ++i) {
    if (saw_separator) {
      opts.command.emplace_back(argv[i]);
    } else if (std::string(argv[i]) == "--") {
      saw_separator = true;
    } else {
      ours.push_back(dashed(argv[i]));
    }
  }

  CLI::App app(kDescription, "dprun");
  RawOptions raw;
  add_options(app, opts, raw);

  try {
    std::reverse(ours.begin(), ours.end());  // CLI11 takes a vector in reverse order
    app.parse(ours);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  std::vector<std::string> extras = app.remaining();
  if (!extras.empty()) {
    if (extras[0].starts_with("-")) {
      // The nearest of dprun's options (--nproc for --nproc-per-node, --max-restart), as dptrain's keys get.
      std::vector<std::string> names;
      for (const CLI::Option* o : app.get_options())
        for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
      const std::string word = extras[0].substr(0, extras[0].find('='));
      if (const std::string hint = torchrun_hint(word); !hint.empty())
        return usage_error(fmt::format("unknown option {}: {}", word, hint));
      std::string nearest = dpt::cli::nearest_name(word, names, 4);
      for (const std::string& n : names)  // a prefix (--nproc, --master) is what was meant before any near name
        if (nearest.empty() && word.size() >= 4 && n.starts_with(word)) nearest = n;
      return usage_error(fmt::format("unknown option {}{}", extras[0],
                                     nearest.empty() ? "" : fmt::format(" (did you mean {}?)", nearest)));
    }
    return usage_error(fmt::format("unexpected argument '{}': options go before '--', the program after it", extras[0]));
  }
  if (raw.standalone && raw.nnodes != "1")
    return usage_error(fmt::format("--standalone is one node: leave out --nnodes {}", raw.nnodes));
  try {
    dpt::launcher::parse_nnodes(raw.nnodes, opts);
    namespace l = dpt::launcher;
    const l::NprocChoice nproc = l::parse_nproc_per_node(raw.nproc, l::visible_gpu_count, l::usable_cpu_count);
    opts.nproc_per_node = nproc.n;
    if (!nproc.why.empty())
      fmt::print(stderr, "dprun: --nproc-per-node {}: {} rank{} ({})\n", raw.nproc, nproc.n, nproc.n == 1 ? "" : "s",
                 nproc.why);
  } catch (const dpt::ConfigError& e) {
    return usage_error(e.what());
  }
  // An empty --log-dir (an unset variable in a script: --log-dir "$LOGS") once printed to the console as if absent.
  if (app.count("--log-dir") > 0 && opts.log_dir.empty())
    return usage_error("--log-dir must not be empty (leave it out to print the ranks' output with [rank R] prefixes)");
  if (raw.addr_opt->count() > 0) opts.master_addr = raw.master_addr;
  if (raw.port_opt->count() > 0) opts.master_port = raw.master_port;

  try {
    auto env = [](const char* name) -> const char* { return std::getenv(name); };
    const std::string derived = dpt::launcher::node_rank_from_launcher(opts, app.count("--node-rank") > 0, env);
    if (!derived.empty()) fmt::print(stderr, "dprun: {}\n", derived);
    dpt::launcher::validate(opts);
    dpt::launcher::check_not_one_of_many(opts, [](const char* name) { return std::getenv(name); });
  } catch (const dpt::ConfigError& e) {
    return usage_error(e.what());
  }
  stop_with_mpirun();
  try {
    return dpt::launcher::launch(opts);
  } catch (const dpt::ConfigError& e) {
    return usage_error(e.what());
  } catch (const dpt::Error& e) {
    fmt::print(stderr, "dprun: error: {}\n", e.what());
    return 1;
  }
}
