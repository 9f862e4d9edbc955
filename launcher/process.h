// launcher/process.h: the POSIX side of dprun: starting a rank in its own process group, tied to dprun's life;
// catching dprun's signals through a signalfd; watching, signalling and reaping the ranks; naming how one ended.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace dpt::launcher {

// What a child that cannot be started exits with: what a shell reports for "command not found".
inline constexpr int kExecFailedCode = 127;

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// A pipe whose ends are close-on-exec. Throws IoError.
struct Pipe {
  Fd read, write;
};
Pipe make_pipe();

// While alive, SIGCHLD and the stop signals (SIGINT, SIGTERM, SIGHUP; each only when it was not ignored when
// dprun started, so `nohup dprun` and `dprun &` keep their meaning) are blocked and readable from fd() instead;
// SIGPIPE is ignored (a closed stdout must not kill the job); SIGCHLD has its default action (so the ranks
// can be waited for). The destructor restores all of it. Children restore it with restore_in_child().
class SignalCatcher {
 public:
  SignalCatcher();
  ~SignalCatcher();
  SignalCatcher(const SignalCatcher&) = delete;
  SignalCatcher& operator=(const SignalCatcher&) = delete;

  int fd() const { return fd_.get(); }
  // The signals received since the last call (SIGCHLD included), in arrival order. Never blocks.
  std::vector<int> take();
  // In a forked child before exec: the signal mask and dispositions dprun was started with. Async-signal-safe.
  void restore_in_child() const noexcept;

 private:
  Fd fd_;
  sigset_t old_mask_;
  struct sigaction old_pipe_ {};
  struct sigaction old_chld_ {};
};

// How to start one rank. The fds are dup2'ed onto 0, 1 and 2 in the child.
struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH
  std::vector<std::string> env;   // "NAME=value"
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
};

struct Spawned {
  pid_t pid = -1;
  // Empty when the program is running; otherwise why it could not be started (the child has exited with
  // kExecFailedCode and has been reaped already).
  std::string error;
};

// Forks and execs one rank. The child puts itself in its own process group (setpgid(0, 0), so a signal to
// the group reaches what the rank starts too) and asks for SIGKILL when dprun dies (PR_SET_PDEATHSIG, checking
// getppid() for a dprun that died before the request). Returns once the exec has succeeded or failed.
// Throws IoError when fork or the set-up pipe fails.
Spawned spawn(const ChildSpec& spec, const SignalCatcher& signals);

// How a process ended.
struct ExitStatus {
  bool signaled = false;  // killed by a signal rather than exited
  int code = 0;           // exit code, or the signal number
  bool core_dumped = false;

  bool ok() const { return !signaled && code == 0; }
  // What a shell would report: the code, or 128 + signal.
  int exit_code() const { return signaled ? 128 + code : code; }
  // "exited with code 3", "was killed by signal 9 (SIGKILL)".
  std::string describe() const;
};

// "SIGKILL" for 9; "signal 77" for a number with no name.
std::string signal_name(int sig);

// The failure reason dprun prints once after a failed attempt ("dprun: reason: ..."; empty: nothing to print).
// `rank` failed first, ending as `status`; `written` is the line a rank left in DPT_REASON_FILE (first writer wins;
// empty: none). A rank killed by a signal (SIGKILL, SIGSEGV) cannot write, so a line there is then another rank's
// symptom of its death, such as "rank 0: ... Connection reset by peer": the reason names the killed rank and its
// signal, and gives that line after it as context. Otherwise the written line is the reason: the cause as the rank
// that diagnosed it put it (its own error, a hang naming the stuck rank), or the signalled rank's own line.
std::string failure_reason(int rank, const ExitStatus& status, const std::string& written);

// Has the child `pid` ended? Leaves it a zombie (waitid WNOWAIT), so its pid and process group id cannot be
// reused while dprun may still signal the group. Throws IoError on an unexpected waitid failure.
std::optional<ExitStatus> peek_exit(pid_t pid);
// Reaps the ended (or ending) child `pid`, blocking until it has ended. Throws IoError.
ExitStatus reap(pid_t pid);

// kill(-pgid, sig). Returns 0, or the errno (ESRCH: the group is empty).
int signal_group(pid_t pgid, int sig);

// Does process `pid` block, ignore or catch `sig` now (/proc/PID/status: SigBlk, SigIgn, SigCgt)? A process that
// does none of these dies of it. True when /proc cannot tell (the process is gone): nothing to wait for.
bool signal_handled(pid_t pid, int sig);

}  // namespace dpt::launcher
