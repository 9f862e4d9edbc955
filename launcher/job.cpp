// launcher/job.cpp: launch(), and the Job's attempts: run them, restart after a failure, tear down (launcher/job.h).
#include "launcher/job.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/check.h"
#include "core/thread_env.h"

namespace dpt::launcher {

namespace {

bool is_loopback(const std::string& addr) {
  return addr.starts_with("127.") || addr == "localhost" || addr == "::1";
}

// With fd 0, 1 or 2 closed, the pipes and files opened below could land on them and be clobbered by the
// child's dup2 calls; /dev/null fills the gaps.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    int got = ::open("/dev/null", O_RDWR);  // the lowest free fd: this one
    if (got < 0) DPT_THROW(IoError, "opening /dev/null failed: {}", std::strerror(errno));
    if (got != fd) {
      ::close(got);
      DPT_THROW(InternalError, "fd {} was closed, but /dev/null opened as fd {}", fd, got);
    }
  }
}

}  // namespace

void note(std::string_view msg) {
  clear_live_line();
  (void)write_fully(STDERR_FILENO, fmt::format("dprun: {}\n", msg));
}

std::string brief(const ExitStatus& st) {
  return st.signaled ? fmt::format("killed by {}", signal_name(st.code)) : fmt::format("exit code {}", st.code);
}

std::string join_ranks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

Job::Job(const Options& opts, Environment inherited, bool port_given)
    : opts_(opts),
      inherited_(std::move(inherited)),
      port_given_(port_given),
      elastic_(is_elastic(opts)),
      rdzv_timeout_(std::chrono::duration_cast<JobClock::duration>(std::chrono::duration<double>(opts.rdzv_timeout_s))),
      keep_alive_every_(std::min<JobClock::duration>(kKeepAliveEvery, rdzv_timeout_ / 3)),
      watch_(rdzv_timeout_),
      stdout_(STDOUT_FILENO, "stdout"),
      stderr_(STDERR_FILENO, "stderr"),
      placement_(static_placement(opts_)) {}

Job::~Job() {
  for (Rank& r : ranks_) {
    if (r.pid <= 0 || r.reaped) continue;
    try {
      (void)signal_group(r.pid, SIGKILL);
      reap(r.pid);
    } catch (...) {  // nothing more to do in a destructor; PR_SET_PDEATHSIG remains as the last resort
    }
  }
  if (!reason_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(reason_dir_, ec);
  }
}

int Job::run() {
  announce();
  open_stdin();
  make_reason_dir();
  if (!elastic_) return ended(run_attempts());
  try {
    connect_rendezvous();
    if (stop_requested_) return ended(128 + received_signal_);  // a stop signal while it looked at node 0's store
    if (std::optional<int> end = enter_round(rdzv_->is_master() ? 0 : rdzv_->current_round(), 0)) return ended(*end);
    return ended(run_attempts());
  } catch (const CommError& e) {
    // Node 0's own errors are its own (one that cannot host the store, its port taken, was once "lost the
    // rendezvous at node 0 ...; requeue the job").
    if (opts_.node_rank == 0 || !store_) throw;  // or it never joined: connect_rendezvous says why
    // Node 0 hosts the rendezvous and rank 0: without it there is no job (the ranks are SIGKILLed on the way out).
    DPT_THROW(CommError,
              "lost the rendezvous at node 0 ({}:{}): {}. An elastic job cannot go on without its master node "
              "(node 0); requeue the job (Slurm: sbatch --requeue)",
              *opts_.master_addr, *opts_.master_port, e.what());
  }
}

int Job::run_attempts() {
  for (;;) {
    ranks_.reserve(static_cast<std::size_t>(opts_.nproc_per_node));
    for (int local = 0; local < opts_.nproc_per_node && phase_ == Phase::kRunning; ++local) start(local);
    monitor();
    finish();
    settle_preemption();
    if (!elastic_) print_reason();  // elastic: once the round's failure is known (after_elastic_attempt)
    if (elastic_) {
      if (std::optional<int> code = after_elastic_attempt()) return *code;
      reset_attempt();
    } else if (!restart()) {
      return exit_code_;
    }
  }
}

void Job::reset_attempt() {
  ranks_.clear();
  preempting_ = preempted_exit_ = stopping_for_failure_ = false;
  phase_ = Phase::kRunning;
  exit_code_ = 0;
  failed_rank_.reset();
  early_exit_rank_.reset();
  failure_.clear();
  reported_ = false;
}

bool Job::restart() {
  if (exit_code_ == 0 || !failed_rank_) return false;  // success, or dprun was told to stop
  // Without restarts, leave a late stop signal pending: it is delivered when the signal mask is restored.
  if (opts_.max_restarts == 0) return false;
  // A stop signal that came after the last look (during the final reaping) still forbids a restart.
  for (int sig : signals_.take()) {
    if (sig == SIGCHLD) continue;
    stop_requested_ = true;
    note(fmt::format("received {}", signal_name(sig)));
  }
  const std::string failure = fmt::format("rank {} failed ({})", *failed_rank_, brief(failed_status_));
  if (stop_requested_) {
    note(fmt::format("{}; not restarting: dprun was told to stop", failure));
    return false;
  }
  if (exec_failed_) {
    note(fmt::format("{}; not restarting: the program cannot be started", failure));
    return false;
  }
  if (is_config_error(failed_status_)) {
    note(fmt::format("{}; not restarting: {}", failure, kConfigErrorWhy));
    return false;
  }
  if (restarts_ == opts_.max_restarts) {
    note(fmt::format("{}; all {} restart{} used, giving up", failure, opts_.max_restarts,
                     opts_.max_restarts == 1 ? "" : "s"));
    return false;
  }
  ++restarts_;
  note(fmt::format("{}; restart {} of {}", failure, restarts_, opts_.max_restarts));
  if (!port_given_ && !port_bindable(*opts_.master_port)) {
    // dprun chose the port, and something else has taken it since: choose again rather than fail.
    int old = *opts_.master_port;
    opts_.master_port = find_free_port();  // as resolve() does
    placement_.master_port = *opts_.master_port;
    note(fmt::format("master port {} is taken now; using {}", old, *opts_.master_port));
  }
  reset_attempt();
  return true;
}

void Job::announce() {
  int world = opts_.nnodes * opts_.nproc_per_node;
  int first = global_rank(opts_, 0);
  int last = global_rank(opts_, opts_.nproc_per_node - 1);
  std::string master = fmt::format("{}:{}", *opts_.master_addr, *opts_.master_port);
  if (elastic_) {
    note(fmt::format("node {}: elastic job of {} to {} nodes, {} rank{} each, up to {} restart{}; rendezvous {} {}",
                     opts_.node_rank, min_nodes(opts_), opts_.nnodes, opts_.nproc_per_node,
                     opts_.nproc_per_node == 1 ? "" : "s", opts_.max_restarts, opts_.max_restarts == 1 ? "" : "s",
                     opts_.node_rank == 0 ? "hosted here at" : "at", master));
    first = 0;  // the ranks' numbers come with each round
    last = world - 1;
  } else if (opts_.nnodes == 1) {
    note(fmt::format("starting {} rank{} (world size {}), master {}", world, world == 1 ? "" : "s", world, master));
  } else {
    note(fmt::format("node {} of {}: starting ranks {}..{} of world size {}, master {}", opts_.node_rank,
                     opts_.nnodes, first, last, world, master));
  }
  if (!opts_.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opts_.log_dir, ec);
    if (ec) DPT_THROW(IoError, "cannot create --log-dir {}: {}", opts_.log_dir, ec.message());
    if (elastic_) {
      make_elastic_log_dir();
    } else {
      note(fmt::format("writing each rank's stdout and stderr to {}/rank_{}.log{}", opts_.log_dir, first,
                       first == last ? "" : fmt::format(" .. rank_{}.log", last)));
    }
  }
}

void Job::make_elastic_log_dir() {
  // As torchrun's agent does (<log_dir>/<run id>_<random>/attempt_<k>/): a folder of this node's own for this run of
  // dprun, then one per round. A round's rank numbers are another round's on another node (a node joining late, a
  // node left out), and an earlier job may have left logs under the same --log-dir: one file each appended to
  // mixed them.
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  char stamp[32] = {};
  if (::gmtime_r(&now, &utc)) std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
  std::string path = fmt::format("{}/node{}_{}_XXXXXX", opts_.log_dir, opts_.node_rank, stamp);
  if (!::mkdtemp(path.data())) DPT_THROW(IoError, "cannot create a folder in --log-dir {}: {}", opts_.log_dir,
                                         std::strerror(errno));
  log_run_dir_ = path;
  note(fmt::format("writing each rank's stdout and stderr to {}/attempt_K/rank_R.log, a folder per round K "
                   "(DPT_RESTART_COUNT), R the rank's number in that round",
                   log_run_dir_));
}

void Job::finish() {
  // Every rank has ended. Relay what is left in the pipes without waiting for a grandchild that may hold
  // one open, then make sure such leftovers do not outlive the job: SIGTERM after a clean run, SIGKILL after
  // a teardown (they have had their SIGTERM).
  for (Rank& r : ranks_) {
    if (r.out) r.out->finish();
    if (r.err) r.err->finish();
  }
  signal_all(phase_ == Phase::kRunning ? SIGTERM : SIGKILL);
  for (Rank& r : ranks_) {
    if (r.reaped) continue;
    reap(r.pid);
    r.reaped = true;
  }
}

int launch(const Options& given) {
  Options opts = resolve(given);
  ensure_standard_fds();
  Environment inherited = current_environment();
  // One token for the whole job, every attempt of it: the Job keeps these options across restarts.
  opts.store_token = job_store_token(opts, inherited);
  if (!inherited.contains("OMP_NUM_THREADS")) {
    note("setting OMP_NUM_THREADS=1 for every rank, so that the ranks do not overload the machine; set it "
         "yourself to tune it");
  } else if (!omp_num_threads_valid(inherited.at("OMP_NUM_THREADS"))) {
    note(fmt::format("OMP_NUM_THREADS='{}' is no thread count (OpenMP would ignore it and start a thread per CPU in "
                     "every rank): setting OMP_NUM_THREADS=1 for every rank instead",
                     inherited.at("OMP_NUM_THREADS")));
  }
  if (opts.nnodes > 1 && is_loopback(*opts.master_addr)) {
    note(fmt::format("warning: --master-addr {} is a loopback address: the other nodes cannot reach it unless "
                     "all {} nodes run on this machine",
                     *opts.master_addr, opts.nnodes));
  }
  Job job(opts, std::move(inherited), /*port_given=*/given.master_port.has_value());
  return job.run();
}

}  // namespace dpt::launcher
