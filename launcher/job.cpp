// launcher/job.cpp: launch(): spawn the ranks, relay their output, watch them, tear the job down, and with
// --max-restarts start them all again after a failure.
//
// One thread, one poll loop over a signalfd (SIGCHLD and the stop signals) and the ranks' output pipes; each
// wake-up serves the signals first and reads each ready pipe at most once, so no rank can starve the loop.
// Ranks that end are observed with waitid(WNOWAIT) and reaped only at the very end: a zombie keeps its pid,
// hence its process group id, reserved, so signalling a rank's group can never hit an unrelated process.
// A restart begins only after every rank of the failed attempt has been reaped, with a fresh set of ranks.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/check.h"
#include "launcher/launcher.h"
#include "launcher/output.h"
#include "launcher/process.h"

namespace dpt::launcher {

namespace {

using Clock = std::chrono::steady_clock;

// dprun's own messages: one line on stderr, best effort.
void note(std::string_view msg) {
  clear_live_line();
  (void)write_fully(STDERR_FILENO, fmt::format("dprun: {}\n", msg));
}

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

// "exit code 3", "killed by SIGKILL": how a rank ended, for the restart line.
std::string brief(const ExitStatus& st) {
  return st.signaled ? fmt::format("killed by {}", signal_name(st.code)) : fmt::format("exit code {}", st.code);
}

std::string join_ranks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

struct Rank {
  int local = 0;
  int global = 0;
  pid_t pid = -1;            // also its process group id
  bool ended = false;        // seen ended (a zombie until reaped)
  bool reaped = false;
  ExitStatus status;
  std::string log_path;      // with --log-dir
  std::unique_ptr<RankStream> out, err;  // without --log-dir
};

class Job {
 public:
  // `port_given`: the user chose opts.master_port (a restart keeps it whatever happens).
  Job(const Options& opts, Environment inherited, bool port_given)
      : opts_(opts),
        inherited_(std::move(inherited)),
        port_given_(port_given),
        stdout_(STDOUT_FILENO, "stdout"),
        stderr_(STDERR_FILENO, "stderr") {}

  // The safety net: whatever happened (an exception included), nothing dprun started outlives it.
  ~Job() {
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

  int run() {
    announce();
    open_stdin();
    make_reason_dir();
    for (;;) {
      ranks_.reserve(static_cast<std::size_t>(opts_.nproc_per_node));
      for (int local = 0; local < opts_.nproc_per_node && phase_ == Phase::kRunning; ++local) start(local);
      monitor();
      finish();
      settle_preemption();
      print_reason();
      if (!restart()) return exit_code_;
    }
  }

 private:
  enum class Phase { kRunning, kStopping, kKilling };

  // After an attempt has ended and every rank is reaped: starts the next one if it should be (a rank failed,
  // dprun was not told to stop, restarts are left) and returns true; otherwise returns false.
  bool restart() {
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
      note(fmt::format("master port {} is taken now; using {}", old, *opts_.master_port));
    }
    ranks_.clear();
    preempting_ = preempted_exit_ = false;
    phase_ = Phase::kRunning;
    exit_code_ = 0;
    failed_rank_.reset();
    return true;
  }

  void announce() {
    int world = opts_.nnodes * opts_.nproc_per_node;
    int first = global_rank(opts_, 0);
    int last = global_rank(opts_, opts_.nproc_per_node - 1);
    std::string master = fmt::format("{}:{}", *opts_.master_addr, *opts_.master_port);
    if (opts_.nnodes == 1) {
      note(fmt::format("starting {} rank{} (world size {}), master {}", world, world == 1 ? "" : "s", world, master));
    } else {
      note(fmt::format("node {} of {}: starting ranks {}..{} of world size {}, master {}", opts_.node_rank,
                       opts_.nnodes, first, last, world, master));
    }
    if (!opts_.log_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(opts_.log_dir, ec);
      if (ec) DPT_THROW(IoError, "cannot create --log-dir {}: {}", opts_.log_dir, ec.message());
      note(fmt::format("writing each rank's stdout and stderr to {}/rank_{}.log{}", opts_.log_dir, first,
                       first == last ? "" : fmt::format(" .. rank_{}.log", last)));
    }
  }

  void open_stdin() {
    // Ranks run in their own process groups, in the background of the terminal: one reading the terminal
    // would be stopped by SIGTTIN and hang the job. They read end-of-file instead.
    devnull_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (devnull_.get() < 0) DPT_THROW(IoError, "opening /dev/null failed: {}", std::strerror(errno));
  }

  void start(int local) {
    Rank& r = ranks_.emplace_back();
    r.local = local;
    r.global = global_rank(opts_, local);

    ChildSpec spec;
    spec.argv = opts_.command;
    Environment env = rank_environment(opts_, local, inherited_, restarts_);
    if (!reason_dir_.empty()) env["DPT_REASON_FILE"] = reason_dir_ + "/reason";  // see make_reason_dir
    for (const auto& [name, value] : env) {
      spec.env.push_back(name + "=" + value);
    }
    spec.stdin_fd = devnull_.get();

    Fd log;
    Pipe out, err;
    if (!opts_.log_dir.empty()) {
      r.log_path = fmt::format("{}/rank_{}.log", opts_.log_dir, r.global);
      // A restarted rank's output goes after the earlier attempts', below a line that says so.
      const int mode = restarts_ == 0 ? O_TRUNC : O_APPEND;
      log = Fd(::open(r.log_path.c_str(), O_WRONLY | O_CREAT | mode | O_CLOEXEC, 0644));
      if (log.get() < 0) DPT_THROW(IoError, "cannot open {}: {}", r.log_path, std::strerror(errno));
      if (restarts_ > 0) {
        (void)write_fully(log.get(), fmt::format("dprun: restart {} of {} (DPT_RESTART_COUNT={})\n", restarts_,
                                                 opts_.max_restarts, restarts_));
      }
      spec.stdout_fd = spec.stderr_fd = log.get();
    } else {
      out = make_pipe();
      err = make_pipe();
      spec.stdout_fd = out.write.get();
      spec.stderr_fd = err.write.get();
    }

    Spawned s = spawn(spec, signals_);
    r.pid = s.pid;
    if (!opts_.log_dir.empty()) {
      log.reset();
    } else {
      // Only the child holds the write ends now, so end of file means it (and all it started) is done.
      out.write.reset();
      err.write.reset();
      std::string prefix = fmt::format("[rank {}] ", r.global);
      r.out = std::make_unique<RankStream>(nonblocking(std::move(out.read)), prefix, stdout_);
      r.err = std::make_unique<RankStream>(nonblocking(std::move(err.read)), prefix, stderr_);
    }
    if (!s.error.empty()) {
      r.ended = r.reaped = true;
      r.status = ExitStatus{false, kExecFailedCode, false};
      exec_failed_ = true;
      fail({&r}, {s.error + fmt::format(" (exit code {})", kExecFailedCode)});
    }
  }

  static int nonblocking(Fd fd) {
    int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) < 0) {
      DPT_THROW(IoError, "fcntl(O_NONBLOCK) on a rank's pipe failed: {}", std::strerror(errno));
    }
    return fd.release();
  }

  bool all_ended() const {
    return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.ended; });
  }

  void monitor() {
    std::vector<pollfd> fds;
    std::vector<RankStream*> streams;  // streams[i] goes with fds[i + 1]
    while (!all_ended()) {
      fds.assign(1, pollfd{signals_.fd(), POLLIN, 0});
      streams.clear();
      for (Rank& r : ranks_) {
        for (RankStream* s : {r.out.get(), r.err.get()}) {
          if (s && s->open()) {
            fds.push_back(pollfd{s->fd(), POLLIN, 0});
            streams.push_back(s);
          }
        }
      }
      int timeout_ms = -1;
      if (phase_ == Phase::kStopping) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<decltype(left)>(left, 0, 1000 * 1000));
      }
      int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) DPT_THROW(IoError, "poll failed: {}", std::strerror(errno));
      if (n > 0) {
        // Signals first: they are served on every wake-up however busy the pipes are. (A rank's last words
        // still come before dprun's line about its end: check_ranks drains its pipes before that line.)
        if (fds[0].revents != 0) handle_signals();
        // Then one bounded read per ready pipe, so a rank that writes without pause cannot starve the loop.
        // A stream closed by handle_signals is skipped by pump().
        for (std::size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents != 0) streams[i - 1]->pump();
        }
      }
      if (phase_ == Phase::kStopping && Clock::now() >= deadline_) kill_remaining();
    }
  }

  void handle_signals() {
    bool child_ended = false;
    for (int sig : signals_.take()) {
      if (sig == SIGCHLD) {
        child_ended = true;
      } else {
        on_stop_signal(sig);
      }
    }
    if (child_ended) check_ranks();
  }

  // Signals coalesce: one SIGCHLD may stand for several ranks, so every running rank is asked. Ranks found ended
  // badly together are named killed-by-a-signal first: such a rank died at once (kill -9, the OOM killer, a
  // crash), while one that exited with a code is most likely reacting to it (its peer's connection reset), and
  // the first named is the job's failure (its exit code, its reason).
  void check_ranks() {
    std::vector<Rank*> ended;
    for (Rank& r : ranks_) {
      if (r.ended) continue;
      std::optional<ExitStatus> st = peek_exit(r.pid);
      if (!st) continue;
      r.ended = true;
      r.status = *st;
      ended.push_back(&r);
    }
    std::stable_partition(ended.begin(), ended.end(), [](const Rank* r) { return r->status.signaled; });
    std::vector<Rank*> failed;
    std::vector<std::string> why;
    for (Rank* r : ended) {
      for (RankStream* s : {r->out.get(), r->err.get()}) {
        if (s) s->drain();  // its last words, before the line about its end
      }
      if (!r->status.signaled && r->status.code == kPreemptedCode) {
        on_preempted_exit(*r);
        continue;
      }
      if (!r->status.ok()) {
        failed.push_back(r);
        why.push_back(r->status.describe() + (r->log_path.empty() ? "" : fmt::format("; see {}", r->log_path)));
      }
    }
    if (!failed.empty()) fail(failed, why);
  }

  // Ranks ended badly on their own. The first failure names the culprits and starts the teardown; ranks that
  // end while it is under way were most likely stopped by it and are not reported.
  void fail(const std::vector<Rank*>& failed, const std::vector<std::string>& why) {
    if (phase_ != Phase::kRunning) return;
    for (std::size_t i = 0; i < failed.size(); ++i) {
      const Rank& r = *failed[i];
      note(fmt::format("rank {} (pid {}) {}", r.global, r.pid, why[i]));
    }
    exit_code_ = failed.front()->status.exit_code();
    failed_rank_ = failed.front()->global;
    failed_status_ = failed.front()->status;
    begin_stop(SIGTERM, /*received=*/false);
  }

  static bool is_preemption(int sig) { return sig == SIGUSR1 || sig == SIGTERM; }

  void on_stop_signal(int sig) {
    stop_requested_ = true;  // whenever it comes: no restart after it
    const int first = received_signal_;
    if (received_signal_ == 0) received_signal_ = sig;
    if (phase_ == Phase::kRunning) {
      exit_code_ = 128 + sig;
      preempting_ = is_preemption(sig);
      begin_stop(sig, /*received=*/true);
    } else if (phase_ == Phase::kStopping && preempting_ && (sig == SIGUSR1 || (sig == SIGTERM && first != SIGTERM))) {
      // The ranks are checkpointing: SIGUSR1 again, or SIGTERM after a SIGUSR1 (Slurm's warning, then its time
      // limit) must not cut that short. It is forwarded (a rank keeps only the first) and the deadline stays.
      // SIGTERM twice, SIGINT or SIGHUP still mean "now", below.
      note(fmt::format("received {} while the ranks stop for preemption: forwarded; the stop timeout stays", signal_name(sig)));
      signal_all(sig);
    } else if (phase_ == Phase::kStopping) {
      note(fmt::format("received {} again: not waiting for the grace period", signal_name(sig)));
      kill_remaining();
    }
  }

  // Sends `sig` to every rank's process group (a rank that has ended may have left processes behind in
  // it), then gives the ranks the grace period before SIGKILL. `received`: dprun was sent `sig` itself.
  void begin_stop(int sig, bool received) {
    phase_ = Phase::kStopping;
    const double wait_s = preempting_ ? opts_.stop_timeout_s : opts_.grace_period_s;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
    std::string why = received ? fmt::format("received {}", signal_name(sig)) : "stopping the other ranks";
    std::vector<int> running = running_ranks();
    if (!running.empty()) {
      note(fmt::format("{}: sending {} to {}; SIGKILL after {} s to any still running", why, signal_name(sig),
                       join_ranks(running), wait_s));
    } else if (received) {
      note(why);
    }
    signal_all(sig);
    // A stopped rank (SIGSTOP, Ctrl-Z) would see `sig` only when continued, i.e. at the SIGKILL: continue it now.
    signal_all(SIGCONT);
  }

  // DPT_REASON_FILE, given to every rank: a private temporary directory's "reason", where the rank that diagnoses
  // a failure (a hang report names the stuck rank) writes one line, first writer wins. Without the directory the
  // ranks get no variable, and the job runs all the same.
  void make_reason_dir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string path = fmt::format("{}/dprun.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (::mkdtemp(path.data())) {
      reason_dir_ = path;
    } else {
      note(fmt::format("cannot create a temporary directory {} for the ranks' failure reason: {}", path,
                       std::strerror(errno)));
    }
  }

  // After an attempt has ended: when it failed, "dprun: reason: ...", once: the line a rank left (failure_reason:
  // after the name and signal of a rank killed by one, which could leave none); the file is removed so that a
  // restart starts without one.
  void print_reason() {
    if (reason_dir_.empty()) return;
    const std::string path = reason_dir_ + "/reason";
    std::string line;
    if (Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)); fd.get() >= 0) {
      char buf[4096];
      const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
      if (n > 0) line.assign(buf, static_cast<std::size_t>(n));
      line = line.substr(0, line.find('\n'));
    }
    if (exit_code_ != 0) {
      // A rank's own failure names it (a signal it could not report), else the line written is the reason.
      const std::string reason = failed_rank_ ? failure_reason(*failed_rank_, failed_status_, line) : line;
      if (!reason.empty()) note("reason: " + reason);
    }
    ::unlink(path.c_str());
  }

  // A rank exited kPreemptedCode: it stopped for a stop signal after all ranks agreed on the step and rank 0's
  // checkpoint was written (dptrain), so the others are about to do the same. Not a failure: no teardown, but
  // a deadline (the stop timeout) for the rest.
  void on_preempted_exit(const Rank& r) {
    preempted_exit_ = true;
    if (phase_ != Phase::kRunning) return;
    note(fmt::format("rank {} stopped for preemption (exit code {}); waiting up to {} s for the others",
                     r.global, kPreemptedCode, opts_.stop_timeout_s));
    phase_ = Phase::kStopping;
    preempting_ = true;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(opts_.stop_timeout_s));
  }

  // After every rank has ended: when some rank stopped for preemption and every rank exited 0 or 75, the job
  // was preempted (75); when some did not, the first of those is the job's failure.
  void settle_preemption() {
    if (!preempted_exit_) return;
    const Rank* bad = nullptr;
    for (const Rank& r : ranks_) {
      const bool clean = !r.status.signaled && (r.status.code == 0 || r.status.code == kPreemptedCode);
      if (!clean && !bad) bad = &r;
    }
    if (!bad) {
      exit_code_ = kPreemptedCode;
      note(fmt::format("the ranks stopped for preemption with a checkpoint; exit code {}", kPreemptedCode));
    } else if (exit_code_ == 0) {
      exit_code_ = bad->status.exit_code();
      note(fmt::format("rank {} {} while the others stopped for preemption", bad->global, bad->status.describe()));
    }
  }

  void kill_remaining() {
    phase_ = Phase::kKilling;
    std::vector<int> running = running_ranks();
    if (!running.empty()) note(fmt::format("sending SIGKILL to {}", join_ranks(running)));
    signal_all(SIGKILL);
  }

  std::vector<int> running_ranks() const {
    std::vector<int> out;
    for (const Rank& r : ranks_) {
      if (!r.ended) out.push_back(r.global);
    }
    return out;
  }

  void signal_all(int sig) {
    for (const Rank& r : ranks_) {
      if (r.reaped) continue;
      int err = signal_group(r.pid, sig);
      // ESRCH: the group is empty. (A group holding only the zombie rank takes the signal without complaint.)
      if (err != 0 && err != ESRCH) {
        note(fmt::format("cannot send {} to rank {} (process group {}): {}", signal_name(sig), r.global, r.pid,
                         std::strerror(err)));
      }
    }
  }

  void finish() {
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

  Options opts_;  // master_port may change between attempts
  Environment inherited_;
  const bool port_given_;
  SignalCatcher signals_;  // before any fork: a signal arriving during the spawning stays pending
  OutputSink stdout_, stderr_;
  Fd devnull_;
  std::string reason_dir_;  // DPT_REASON_FILE's directory; empty: none (make_reason_dir)
  std::vector<Rank> ranks_;
  Phase phase_ = Phase::kRunning;
  Clock::time_point deadline_{};
  int exit_code_ = 0;
  // The attempt under way: restarts so far (its DPT_RESTART_COUNT), and the rank whose failure ended it.
  int restarts_ = 0;
  std::optional<int> failed_rank_;
  ExitStatus failed_status_;
  bool stop_requested_ = false;  // dprun received SIGINT, SIGTERM, SIGHUP or SIGUSR1
  int received_signal_ = 0;      // the first stop signal dprun received
  bool preempting_ = false;      // the stop under way is for preemption (SIGUSR1/SIGTERM, or a rank exited 75)
  bool preempted_exit_ = false;  // a rank exited kPreemptedCode
  bool exec_failed_ = false;     // the program could not be started: a restart would fail the same way
};

}  // namespace

int launch(const Options& given) {
  Options opts = resolve(given);
  ensure_standard_fds();
  Environment inherited = current_environment();
  // One token for the whole job, every attempt of it: the Job keeps these options across restarts.
  opts.store_token = job_store_token(opts, inherited);
  if (!inherited.contains("OMP_NUM_THREADS")) {
    note("setting OMP_NUM_THREADS=1 for every rank, so that the ranks do not overload the machine; set it "
         "yourself to tune it");
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
