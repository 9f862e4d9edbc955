// launcher/process.cpp: fork/exec of a rank tied to dprun's life, the signalfd, waiting and signalling.
#include "launcher/process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/check.h"

namespace dpt::launcher {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) DPT_THROW(IoError, "pipe2 failed: {}", std::strerror(errno));
  return Pipe{Fd(fds[0]), Fd(fds[1])};
}

namespace {
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

bool ignored_now(int sig) {
  struct sigaction sa {};
  if (::sigaction(sig, nullptr, &sa) != 0) return false;
  return sa.sa_handler == SIG_IGN;
}
}  // namespace

SignalCatcher::SignalCatcher() {
  sigset_t catching;
  sigemptyset(&catching);
  sigaddset(&catching, SIGCHLD);
  for (int sig : kStopSignals) {
    if (!ignored_now(sig)) sigaddset(&catching, sig);
  }
  if (::sigprocmask(SIG_BLOCK, &catching, &old_mask_) != 0) {
    DPT_THROW(IoError, "sigprocmask failed: {}", std::strerror(errno));
  }
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  if (::sigaction(SIGPIPE, &ign, &old_pipe_) != 0 || ::sigaction(SIGCHLD, &dfl, &old_chld_) != 0) {
    int err = errno;
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    DPT_THROW(IoError, "sigaction failed: {}", std::strerror(err));
  }
  int fd = ::signalfd(-1, &catching, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::sigaction(SIGCHLD, &old_chld_, nullptr);
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    DPT_THROW(IoError, "signalfd failed: {}", std::strerror(err));
  }
  fd_ = Fd(fd);
}

SignalCatcher::~SignalCatcher() {
  fd_.reset();
  ::sigaction(SIGPIPE, &old_pipe_, nullptr);
  ::sigaction(SIGCHLD, &old_chld_, nullptr);
  // A stop signal still pending now is delivered here, with the action dprun was started with: that is what
  // would have happened without dprun in between.
  ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
}

std::vector<int> SignalCatcher::take() {
  std::vector<int> sigs;
  for (;;) {
    signalfd_siginfo info;
    ssize_t n = ::read(fd_.get(), &info, sizeof info);
    if (n == static_cast<ssize_t>(sizeof info)) {
      sigs.push_back(static_cast<int>(info.ssi_signo));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    DPT_THROW(IoError, "reading the signalfd failed: {}", n < 0 ? std::strerror(errno) : "short read");
  }
  return sigs;
}

void SignalCatcher::restore_in_child() const noexcept {
  ::sigaction(SIGPIPE, &old_pipe_, nullptr);
  ::sigaction(SIGCHLD, &old_chld_, nullptr);
  ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
}

namespace {
// What the child reports through the set-up pipe when a step before or at exec fails.
enum class ChildStep : int { kSetpgid, kPdeathsig, kRedirect, kExec };

struct ChildFailure {
  ChildStep step;
  int err;
};

[[noreturn]] void child_fail(int report_fd, ChildStep step) {
  ChildFailure f{step, errno};
  // Nothing useful to do if this write fails: the parent then sees a plain exit 127.
  ssize_t ignored = ::write(report_fd, &f, sizeof f);
  (void)ignored;
  ::_exit(kExecFailedCode);
}

// Runs in the forked child: only async-signal-safe calls from here to exec.
[[noreturn]] void child_main(const ChildSpec& spec, char* const* argv, char* const* envp, pid_t parent,
                             int report_fd, const SignalCatcher& signals) {
  if (::setpgid(0, 0) != 0) child_fail(report_fd, ChildStep::kSetpgid);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail(report_fd, ChildStep::kPdeathsig);
  // dprun may have died between fork and prctl; the death signal would then never come.
  if (::getppid() != parent) ::_exit(kExecFailedCode);
  if (::dup2(spec.stdin_fd, STDIN_FILENO) < 0 || ::dup2(spec.stdout_fd, STDOUT_FILENO) < 0 ||
      ::dup2(spec.stderr_fd, STDERR_FILENO) < 0) {
    child_fail(report_fd, ChildStep::kRedirect);
  }
  signals.restore_in_child();
  ::execvpe(argv[0], argv, envp);
  child_fail(report_fd, ChildStep::kExec);
}

std::vector<char*> c_strings(const std::vector<std::string>& strs) {
  std::vector<char*> out;
  out.reserve(strs.size() + 1);
  for (const auto& s : strs) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}
}  // namespace

Spawned spawn(const ChildSpec& spec, const SignalCatcher& signals) {
  DPT_CHECK(!spec.argv.empty());
  DPT_CHECK(spec.stdin_fd >= 0 && spec.stdout_fd >= 0 && spec.stderr_fd >= 0);
  // Everything the child needs is prepared before fork, so the child only makes system calls.
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);
  Pipe report = make_pipe();  // close-on-exec: end of file here means the exec succeeded
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) DPT_THROW(IoError, "fork failed: {}", std::strerror(errno));
  if (pid == 0) child_main(spec, argv.data(), envp.data(), parent, report.write.get(), signals);

  report.write.reset();
  ChildFailure failure{};
  ssize_t n;
  do {
    n = ::read(report.read.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return Spawned{pid, {}};

  // The child failed before or at exec and has exited (or is exiting) with kExecFailedCode.
  ExitStatus status = reap(pid);
  std::string error;
  if (n != static_cast<ssize_t>(sizeof failure)) {
    error = fmt::format("the child failed before exec ({})",
                        n < 0 ? fmt::format("reading its report: {}", std::strerror(errno)) : status.describe());
  } else {
    const char* why = std::strerror(failure.err);
    switch (failure.step) {
      case ChildStep::kExec: error = fmt::format("cannot run '{}': {}", spec.argv[0], why); break;
      case ChildStep::kSetpgid: error = fmt::format("setpgid failed in the child: {}", why); break;
      case ChildStep::kPdeathsig: error = fmt::format("prctl(PR_SET_PDEATHSIG) failed in the child: {}", why); break;
      case ChildStep::kRedirect: error = fmt::format("dup2 of stdin/stdout/stderr failed in the child: {}", why); break;
    }
  }
  return Spawned{pid, std::move(error)};
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string ExitStatus::describe() const {
  if (!signaled) return fmt::format("exited with code {}", code);
  return fmt::format("was killed by signal {} ({}){}", code, signal_name(code), core_dumped ? ", core dumped" : "");
}

std::string failure_reason(int rank, const ExitStatus& status, const std::string& written) {
  if (!status.signaled || written.starts_with(fmt::format("rank {}:", rank))) return written;
  const std::string killed = fmt::format("rank {} {}", rank, status.describe());
  return written.empty() ? killed : fmt::format("{}; after it, {}", killed, written);
}

std::optional<ExitStatus> peek_exit(pid_t pid) {
  siginfo_t info{};
  for (;;) {
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0) break;
    if (errno == EINTR) continue;
    DPT_THROW(IoError, "waitid(pid {}) failed: {}", pid, std::strerror(errno));
  }
  if (info.si_pid == 0) return std::nullopt;  // still running
  ExitStatus s;
  s.signaled = info.si_code != CLD_EXITED;
  s.code = info.si_status;
  s.core_dumped = info.si_code == CLD_DUMPED;
  return s;
}

ExitStatus reap(pid_t pid) {
  int wstatus = 0;
  for (;;) {
    if (::waitpid(pid, &wstatus, 0) == pid) break;
    if (errno == EINTR) continue;
    DPT_THROW(IoError, "waitpid(pid {}) failed: {}", pid, std::strerror(errno));
  }
  ExitStatus s;
  if (WIFSIGNALED(wstatus)) {
    s.signaled = true;
    s.code = WTERMSIG(wstatus);
    s.core_dumped = WCOREDUMP(wstatus);
  } else {
    s.code = WEXITSTATUS(wstatus);
  }
  return s;
}

int signal_group(pid_t pgid, int sig) {
  DPT_CHECK_GT(pgid, 1);  // never kill(0) or kill(-1)
  return ::kill(-pgid, sig) == 0 ? 0 : errno;
}

bool signal_handled(pid_t pid, int sig) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  int seen = 0;
  const std::uint64_t bit = std::uint64_t{1} << (sig - 1);
  while (std::getline(in, line)) {
    for (const char* field : {"SigBlk:", "SigIgn:", "SigCgt:"}) {
      if (!line.starts_with(field)) continue;
      ++seen;
      if (std::strtoull(line.c_str() + std::strlen(field), nullptr, 16) & bit) return true;
    }
  }
  return seen < 3;  // no such process (or no such fields): nothing to wait for
}

}  // namespace dpt::launcher
