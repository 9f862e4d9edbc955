// launcher/job_ranks.cpp: the Job's ranks: start them, relay their output, watch them end, fail the attempt (launcher/job.h).
#include "launcher/job.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/check.h"

namespace dpt::launcher {

namespace {
// `sig` to rank `r`'s process group, saying so when that fails.
void send_to(const Rank& r, int sig) {
  const int err = signal_group(r.pid, sig);
  // ESRCH: the group is empty. (A group holding only the zombie rank takes the signal without complaint.)
  if (err != 0 && err != ESRCH) {
    note(fmt::format("cannot send {} to rank {} (process group {}): {}", signal_name(sig), r.global, r.pid,
                     std::strerror(err)));
  }
}
}  // namespace

void Job::open_stdin() {
  // Ranks run in their own process groups, in the background of the terminal: one reading the terminal
  // would be stopped by SIGTTIN and hang the job. They read end-of-file instead.
  devnull_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (devnull_.get() < 0) DPT_THROW(IoError, "opening /dev/null failed: {}", std::strerror(errno));
}

void Job::start(int local) {
  Rank& r = ranks_.emplace_back();
  r.local = local;
  r.global = placement_.first_rank + local;

  ChildSpec spec;
  spec.argv = opts_.command;
  Environment env = rank_environment(opts_, placement_, local, inherited_, restarts_);
  if (!reason_dir_.empty()) env["DPT_REASON_FILE"] = reason_dir_ + "/reason";  // see make_reason_dir
  for (const auto& [name, value] : env) {
    spec.env.push_back(name + "=" + value);
  }
  spec.stdin_fd = devnull_.get();

  Fd log;
  Pipe out, err;
  if (!opts_.log_dir.empty()) {
    // Elastic: a folder per round (make_elastic_log_dir), each file written by one rank of one round only.
    const std::string dir = elastic_ ? fmt::format("{}/attempt_{}", log_run_dir_, restarts_) : opts_.log_dir;
    if (elastic_ && local == 0 && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      DPT_THROW(IoError, "cannot create {}: {}", dir, std::strerror(errno));
    r.log_path = fmt::format("{}/rank_{}.log", dir, r.global);
    // A restarted rank's output goes after the earlier attempts', below a line that says so.
    const int mode = restarts_ == 0 || elastic_ ? O_TRUNC : O_APPEND;
    log = Fd(::open(r.log_path.c_str(), O_WRONLY | O_CREAT | mode | O_CLOEXEC, 0644));
    if (log.get() < 0) DPT_THROW(IoError, "cannot open {}: {}", r.log_path, std::strerror(errno));
    if (restarts_ > 0 && !elastic_) {
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
  r.started = JobClock::now();
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

int Job::nonblocking(Fd fd) {
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) < 0) {
    DPT_THROW(IoError, "fcntl(O_NONBLOCK) on a rank's pipe failed: {}", std::strerror(errno));
  }
  return fd.release();
}

bool Job::all_ended() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.ended; });
}

void Job::monitor() {
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
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - JobClock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<decltype(left)>(left, 0, 1000 * 1000));
    }
    if (elastic_) {  // to look for other nodes' failures, and count up the keep-alive (in a teardown too)
      const int poll_ms = static_cast<int>(kRendezvousPoll.count());
      timeout_ms = timeout_ms < 0 ? poll_ms : std::min(timeout_ms, poll_ms);
    }
    if (send_held()) {  // a rank still starting: look again soon
      const int poll_ms = static_cast<int>(kStartingPoll.count());
      timeout_ms = timeout_ms < 0 ? poll_ms : std::min(timeout_ms, poll_ms);
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
    if (phase_ == Phase::kStopping && JobClock::now() >= deadline_) kill_remaining();
    if (elastic_) keep_alive();
    if (elastic_ && phase_ == Phase::kRunning) check_other_nodes();
  }
}

void Job::handle_signals() {
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

void Job::check_ranks() {
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
  // Then a rank that refused its configuration: its peers' errors (the connection it closed) follow from it.
  std::stable_partition(std::find_if(ended.begin(), ended.end(), [](const Rank* r) { return !r->status.signaled; }),
                        ended.end(), [](const Rank* r) { return is_config_error(r->status); });
  const bool others_on = !running_ranks().empty() ||
                        std::any_of(ended.begin(), ended.end(), [](const Rank* r) { return !r->status.ok(); });
  if (phase_ == Phase::kRunning && !early_exit_rank_ && others_on) {
    for (const Rank* r : ended) {
      if (!r->status.ok()) continue;
      early_exit_rank_ = r->global;
      break;
    }
  }
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

void Job::fail(const std::vector<Rank*>& failed, const std::vector<std::string>& why) {
  if (phase_ != Phase::kRunning) return;
  for (std::size_t i = 0; i < failed.size(); ++i) {
    const Rank& r = *failed[i];
    note(fmt::format("rank {} (pid {}) {}", r.global, r.pid, why[i]));
  }
  exit_code_ = failed.front()->status.exit_code();
  failed_rank_ = failed.front()->global;
  failed_status_ = failed.front()->status;
  failure_ = fmt::format("{}: rank {} failed ({})", elastic_ ? describe(rdzv_->self()) : "this node", *failed_rank_,
                         brief(failed_status_));
  // A configuration error ends the job on every node: the others print the rank's line too (it wrote it before
  // it exited, so it is there now).
  if (elastic_ && rdzv_ && !reported_ && is_config_error(failed_status_)) {
    if (const std::string line = reason_line(); !line.empty())
      rdzv_->publish_reason(plan_.round, fmt::format("{}: {}", describe(rdzv_->self()), line));
  }
  report_failure_once(exit_code_, failure_, failed_status_.signaled);
  begin_stop(SIGTERM, "stopping the other ranks", /*always_note=*/false);
}

void Job::kill_remaining() {
  phase_ = Phase::kKilling;
  std::vector<int> running = running_ranks();
  if (!running.empty()) note(fmt::format("sending SIGKILL to {}", join_ranks(running)));
  signal_all(SIGKILL);
}

bool Job::send_held() {
  bool holding = false;
  for (Rank& r : ranks_) {
    if (r.held.empty()) continue;
    if (r.ended || r.reaped) {
      r.held.clear();
      continue;
    }
    if (JobClock::now() - r.started < kStartingGrace && !signal_handled(r.pid, r.held.front())) {
      holding = true;
      continue;
    }
    for (int sig : r.held) send_to(r, sig);
    r.held.clear();
  }
  return holding;
}

std::vector<int> Job::running_ranks() const {
  std::vector<int> out;
  for (const Rank& r : ranks_) {
    if (!r.ended) out.push_back(r.global);
  }
  return out;
}

void Job::signal_all(int sig) {
  const bool stop = preempting_ && is_preemption(sig);
  for (Rank& r : ranks_) {
    if (r.reaped) continue;
    if (sig == SIGKILL) r.held.clear();
    if (stop && !r.ended && (!r.held.empty() || (JobClock::now() - r.started < kStartingGrace &&
                                                  !signal_handled(r.pid, sig)))) {
      r.held.push_back(sig);  // in order, after any held before it
      continue;
    }
    send_to(r, sig);
  }
}

}  // namespace dpt::launcher
