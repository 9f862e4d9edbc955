// launcher/job_stop.cpp: stopping the Job: stop signals, preemption, the grace period, the failure's reason (launcher/job.h).
#include "launcher/job.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/logging.h"

namespace dpt::launcher {

void Job::on_stop_signal(int sig) {
  stop_requested_ = true;  // whenever it comes: no restart after it
  const int first = received_signal_;
  if (received_signal_ == 0) received_signal_ = sig;
  if (phase_ == Phase::kRunning) {
    exit_code_ = 128 + sig;
    if (elastic_) {
      failure_ = fmt::format("{}: its dprun received {}", describe(rdzv_->self()), signal_name(sig));
      report_failure_once(exit_code_, failure_, /*by_signal=*/false, /*stop=*/true);
    }
    preempting_ = is_preemption(sig);
    begin_stop(sig, fmt::format("received {}", signal_name(sig)), /*always_note=*/true);
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

void Job::begin_stop(int sig, const std::string& why, bool always_note) {
  phase_ = Phase::kStopping;
  const double wait_s = preempting_ ? opts_.stop_timeout_s : opts_.grace_period_s;
  deadline_ = JobClock::now() + std::chrono::duration_cast<JobClock::duration>(std::chrono::duration<double>(wait_s));
  std::vector<int> running = running_ranks();
  if (!running.empty()) {
    note(fmt::format("{}: sending {} to {}; SIGKILL after {} s to any still running", why, signal_name(sig),
                     join_ranks(running), wait_s));
  } else if (always_note) {
    note(why);
  }
  signal_all(sig);
  // A stopped rank (SIGSTOP, Ctrl-Z) would see `sig` only when continued, i.e. at the SIGKILL: continue it now.
  signal_all(SIGCONT);
}

void Job::make_reason_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = fmt::format("{}/dprun.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (::mkdtemp(path.data())) {
    reason_dir_ = path;
  } else {
    note(fmt::format("cannot create a temporary directory {} for the ranks' failure reason: {}", path,
                     std::strerror(errno)));
  }
}

std::string Job::reason_line() const {
  std::string line;
  if (reason_dir_.empty()) return line;
  const std::string path = reason_dir_ + "/reason";
  if (Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)); fd.get() >= 0) {
    char buf[4096];
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n > 0) line.assign(buf, static_cast<std::size_t>(n));
    line = line.substr(0, line.find('\n'));
  }
  return line;
}

void Job::print_reason(const std::string& first) {
  if (reason_dir_.empty()) return;
  const std::string path = reason_dir_ + "/reason";
  const std::string line = reason_line();
  if (exit_code_ != 0) {
    // A rank's own failure names it (a signal it could not report), else the line written is the reason.
    std::string reason = failed_rank_ ? failure_reason(*failed_rank_, failed_status_, line) : line;
    // A rank that ended with 0 while its peers trained comes first, as a killed one does: their errors follow it.
    if (failed_rank_ && early_exit_rank_ && !failed_status_.signaled && !reason.empty())
      reason = fmt::format("rank {} exited 0 before the others had finished; after it, {}", *early_exit_rank_, reason);
    if (!first.empty()) reason = reason.empty() ? first : fmt::format("{}; after it, {}", first, reason);
    if (!reason.empty()) note("reason: " + reason);
    // For ended(): the reason, else the failed rank and how it ended (a rank that wrote nothing and was not killed).
    last_reason_ = !reason.empty() || !failed_rank_
                       ? reason
                       : fmt::format("rank {} {}", *failed_rank_, failed_status_.describe());
  }
  ::unlink(path.c_str());
}

int Job::ended(int code) {
  if (code == 0 || code == kPreemptedCode) return code;
  const auto outer = inherited_.find("DPT_REASON_FILE");
  if (outer == inherited_.end() || outer->second.empty()) return code;
  const std::string why = last_reason_.empty() ? fmt::format("dprun exited {}", code) : last_reason_;
  write_reason_once(outer->second, fmt::format("node {}: {}", opts_.node_rank, why));
  return code;
}

void Job::on_preempted_exit(const Rank& r) {
  if (stopping_for_failure_ && !stop_requested_) return;  // it answers the teardown for another node's failure
  preempted_exit_ = true;
  if (phase_ != Phase::kRunning) return;
  // The others are told too, as if dprun had received SIGTERM itself. Ranks that agreed on the stop are exiting 75
  // anyway (dptrain keeps the first signal: this one changes nothing). But a rank signalled alone before the ranks
  // could agree (at the rendezvous) leaves at once, and its peers, still waiting for it there, would learn of it
  // only from dist.timeout_s or the SIGKILL after --stop-timeout (dprun then exited 137, and nothing requeued).
  preempting_ = true;
  begin_stop(SIGTERM, fmt::format("rank {} stopped for preemption (exit code {})", r.global, kPreemptedCode),
             /*always_note=*/true);
}

void Job::settle_preemption() {
  // preempting_ without preempted_exit_: dprun received SIGUSR1 or SIGTERM while the ranks ran (exit_code_ says
  // 128 + N so far), and no rank has exited 75 (yet).
  if (!preempted_exit_ && !preempting_) return;
  const Rank* bad = nullptr;
  for (const Rank& r : ranks_) {
    const bool clean = !r.status.signaled && (r.status.code == 0 || r.status.code == kPreemptedCode);
    if (!clean && !bad) bad = &r;
  }
  if (!bad && (preempted_exit_ || elastic_)) {
    // An elastic job published the stop as the round's end (on_stop_signal): the other nodes' ranks stopped for it
    // and their dprun exits 75, so this node's does too, even if its own ranks had all finished.
    exit_code_ = kPreemptedCode;
    if (preempted_exit_)
      note(fmt::format("the ranks stopped for preemption (their log says whether a checkpoint was written); exit "
                       "code {}", kPreemptedCode));
    else
      note(fmt::format("every rank exited 0 after {}, which ended the round on every node; exit code {}",
                       received_signal_ != 0 ? signal_name(received_signal_) : "another node's stop",
                       kPreemptedCode));
  } else if (!bad) {
    // Every rank exited 0 after the stop signal: the job completed (it was ending, or the program finished its
    // work): nothing to resume, nothing to requeue. It once exited 128 + N, as if a rank had been killed.
    exit_code_ = 0;
    note(fmt::format("every rank exited 0 after {}: the job completed; exit code 0", signal_name(received_signal_)));
  } else if (exit_code_ == 0) {
    exit_code_ = bad->status.exit_code();
    note(fmt::format("rank {} {} while the others stopped for preemption", bad->global, bad->status.describe()));
  }
}

}  // namespace dpt::launcher
