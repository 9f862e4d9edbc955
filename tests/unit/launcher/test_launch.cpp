// tests/unit/launcher/test_launch.cpp: launch() in-process on small shell jobs: exit codes, log files, a
// program that cannot be started, the signal state given back afterwards, restarts.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "launcher/launcher.h"
#include "launcher/process.h"
#include "tests/support/temp_dir.h"

using namespace dpt::launcher;
namespace fs = std::filesystem;
using dpt::test::TempDir;
using dpt::test::read_file;

namespace {
Options shell_job(int nproc, const std::string& script, const fs::path& log_dir) {
  Options o;
  o.nproc_per_node = nproc;
  o.grace_period_s = 1;
  o.log_dir = log_dir.string();
  o.command = {"sh", "-c", script};
  return o;
}

sigset_t blocked_now() {
  sigset_t s;
  sigemptyset(&s);
  REQUIRE(::sigprocmask(SIG_BLOCK, nullptr, &s) == 0);
  return s;
}
}  // namespace

TEST_CASE("launch: every rank exits 0 -> 0, each rank's output in its log file", "[launcher][process]") {
  TempDir dir;
  sigset_t before = blocked_now();
  int rc = launch(shell_job(3, "echo \"out $RANK/$WORLD_SIZE $DPT_RANK_PREFIXED\"; echo \"err $LOCAL_RANK\" >&2",
                            dir.path / "logs"));
  REQUIRE(rc == 0);
  for (int r = 0; r < 3; ++r) {
    std::string log = read_file(dir.path / "logs" / fmt::format("rank_{}.log", r));
    CHECK(log == fmt::format("out {}/3 \nerr {}\n", r, r));  // stdout and stderr together, unprefixed
  }
  // The signal mask is given back as it was.
  sigset_t after = blocked_now();
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) CHECK(sigismember(&after, sig) == sigismember(&before, sig));
}

TEST_CASE("launch: a failing rank's code is the job's, the others are stopped", "[launcher][process]") {
  TempDir dir;
  // Rank 1 fails; ranks 0 and 2 would sleep long past the test's patience.
  int rc = launch(shell_job(3, "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 30", dir.path));
  REQUIRE(rc == 3);
  rc = launch(shell_job(2, "if [ \"$RANK\" = 0 ]; then kill -KILL $$; fi; exec sleep 30", dir.path));
  REQUIRE(rc == 128 + SIGKILL);
}

TEST_CASE("launch: a program that cannot be started -> 127", "[launcher][process]") {
  TempDir dir;
  Options o = shell_job(2, "", dir.path);
  o.command = {"/nonexistent/dpt-no-such-program"};
  REQUIRE(launch(o) == kExecFailedCode);
}

TEST_CASE("launch: --max-restarts restarts every rank after a failure, with DPT_RESTART_COUNT and the same port",
          "[launcher][process]") {
  TempDir dir;
  // Attempt 0: rank 1 fails, rank 0 would sleep (and is stopped); attempt 1: both succeed.
  Options o = shell_job(2,
                        "echo \"attempt $DPT_RESTART_COUNT port $MASTER_PORT\"; "
                        "if [ \"$DPT_RESTART_COUNT\" = 0 ]; then [ \"$RANK\" = 1 ] && exit 3; exec sleep 30; fi",
                        dir.path);
  o.max_restarts = 2;
  o.master_port = dpt::find_free_port();
  REQUIRE(launch(o) == 0);
  // The log continues across attempts, with dprun's line between them. (Rank 0 may have been stopped before
  // its first echo: its first attempt is not checked.)
  const std::string second = fmt::format("dprun: restart 1 of 2 (DPT_RESTART_COUNT=1)\nattempt 1 port {}\n",
                                         *o.master_port);
  CHECK(read_file(dir.path / "rank_1.log") == fmt::format("attempt 0 port {}\n", *o.master_port) + second);
  CHECK_THAT(read_file(dir.path / "rank_0.log"), Catch::EndsWith(second));
}

TEST_CASE("launch: every rank gets one made-up DPT_STORE_TOKEN, kept across restarts, or the user's",
          "[launcher][process]") {
  TempDir dir;
  ::unsetenv("DPT_STORE_TOKEN");  // launch() reads this process's environment
  Options o = shell_job(2,
                        "echo \"attempt $DPT_RESTART_COUNT token $DPT_STORE_TOKEN\"; "
                        "[ \"$DPT_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ] && exit 3; exit 0",
                        dir.path);
  o.max_restarts = 1;
  REQUIRE(launch(o) == 0);
  const std::string log = read_file(dir.path / "rank_1.log");
  const auto token_of = [&](const std::string& attempt) {
    const std::string tag = "attempt " + attempt + " token ";
    const auto at = log.find(tag);
    REQUIRE(at != std::string::npos);
    return log.substr(at + tag.size(), log.find('\n', at) - at - tag.size());
  };
  const std::string first = token_of("0");
  CHECK(first.size() == 32);
  CHECK(token_of("1") == first);
  CHECK_THAT(read_file(dir.path / "rank_0.log"), Catch::Contains("token " + first));
  // The next job gets another one; a token the user exported is passed on as it is.
  o.max_restarts = 0;
  o.command = {"sh", "-c", "echo \"token $DPT_STORE_TOKEN\""};
  REQUIRE(launch(o) == 0);
  CHECK_THAT(read_file(dir.path / "rank_1.log"), !Catch::Contains(first) && Catch::StartsWith("token "));
  ::setenv("DPT_STORE_TOKEN", "exported-by-the-user", 1);
  REQUIRE(launch(o) == 0);
  ::unsetenv("DPT_STORE_TOKEN");
  CHECK(read_file(dir.path / "rank_1.log") == "token exported-by-the-user\n");
}

TEST_CASE("launch: restarts used up -> the failed rank's code, no restart for a program that cannot start",
          "[launcher][process]") {
  TempDir dir;
  Options o = shell_job(2, "echo \"attempt $DPT_RESTART_COUNT\"; [ \"$RANK\" = 1 ] && exit 5; exit 0", dir.path);
  o.max_restarts = 2;
  REQUIRE(launch(o) == 5);
  std::string log = read_file(dir.path / "rank_1.log");
  CHECK_THAT(log, Catch::Contains("attempt 2"));  // the first attempt and two restarts
  CHECK_THAT(log, !Catch::Contains("attempt 3"));

  o = shell_job(2, "", dir.path);
  o.command = {"/nonexistent/dpt-no-such-program"};
  o.max_restarts = 3;
  REQUIRE(launch(o) == kExecFailedCode);
}

TEST_CASE("launch: a rank exiting 75 alone stops the others with SIGTERM -> 75, at once, no restart",
          "[launcher][process]") {
  // dptrain's rank signalled alone while the ranks wait at the rendezvous exits 75 at once; its peers, waiting for
  // it there, learn of it only from dprun. Rank 1 exits 75 once rank 0 waits (its trap set: it stands for dptrain's
  // handler); rank 0 stops only on the signal dprun forwards. It once got none: dprun waited the whole
  // --stop-timeout, then SIGKILLed it and exited 137.
  TempDir dir;
  const std::string ready = (dir.path / "rank0-waits").string();
  Options o = shell_job(2,
                        fmt::format("echo \"attempt $DPT_RESTART_COUNT\"; if [ \"$RANK\" = 1 ]; then "
                                    "while [ ! -e '{0}' ]; do sleep 0.01; done; exit 75; fi; "
                                    "trap 'echo got TERM; exit 75' TERM; touch '{0}'; sleep 30 & wait",
                                    ready),
                        dir.path / "logs");
  o.stop_timeout_s = 8;
  o.max_restarts = 2;  // a 75 is no failure to restart from
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(launch(o) == kPreemptedCode);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(read_file(dir.path / "logs" / "rank_0.log") == "attempt 0\ngot TERM\n");
  CHECK(read_file(dir.path / "logs" / "rank_1.log") == "attempt 0\n");
}

TEST_CASE("signal_handled: blocked or ignored or caught counts and the default action does not",
          "[launcher][process]") {
  // SIGUSR2 (no handler of Catch's): with its default action here, then blocked; ignored in a child.
  struct sigaction old {};
  REQUIRE(::sigaction(SIGUSR2, nullptr, &old) == 0);
  REQUIRE(old.sa_handler == SIG_DFL);
  const sigset_t now = blocked_now();
  REQUIRE_FALSE(sigismember(&now, SIGUSR2));
  CHECK_FALSE(signal_handled(::getpid(), SIGUSR2));  // a process still in the dynamic loader looks like this
  sigset_t usr2, before;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, &before);
  CHECK(signal_handled(::getpid(), SIGUSR2));
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(SIGUSR2, SIG_IGN);
    ::pause();
    ::_exit(0);
  }
  bool seen = false;  // once the child has run its first line
  for (int i = 0; i < 500 && !seen; ++i) {
    seen = signal_handled(child, SIGUSR2);
    if (!seen) ::usleep(2000);
  }
  CHECK(seen);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK(signal_handled(child, SIGUSR2));  // gone: nothing to wait for
}

TEST_CASE("ExitStatus names exit codes and signals", "[launcher]") {
  CHECK(ExitStatus{false, 3, false}.describe() == "exited with code 3");
  CHECK(ExitStatus{true, SIGKILL, false}.describe() == "was killed by signal 9 (SIGKILL)");
  CHECK(ExitStatus{true, SIGSEGV, true}.describe() == "was killed by signal 11 (SIGSEGV), core dumped");
  CHECK(ExitStatus{true, SIGTERM, false}.exit_code() == 143);
  CHECK(ExitStatus{false, 0, false}.ok());
  CHECK(signal_name(SIGINT) == "SIGINT");
}

TEST_CASE("failure_reason: a rank killed by a signal is the reason, a peer's line only its context", "[launcher]") {
  const ExitStatus killed{true, SIGKILL, false}, exited{false, 1, false};
  const std::string peer = "rank 0: recv from rank 1: Connection reset by peer";
  // kill -9 of rank 1: it wrote nothing; rank 0's symptom follows as context.
  CHECK(failure_reason(1, killed, peer) ==
        "rank 1 was killed by signal 9 (SIGKILL); after it, rank 0: recv from rank 1: Connection reset by peer");
  CHECK(failure_reason(1, killed, "") == "rank 1 was killed by signal 9 (SIGKILL)");
  CHECK(failure_reason(12, ExitStatus{true, SIGSEGV, true}, "") ==
        "rank 12 was killed by signal 11 (SIGSEGV), core dumped");
  // The killed rank's own line (written before its signal) stays the reason; so does "rank 1:" for rank 12.
  CHECK(failure_reason(1, killed, "rank 1: out of memory") == "rank 1: out of memory");
  CHECK(failure_reason(12, killed, "rank 1: x") == "rank 12 was killed by signal 9 (SIGKILL); after it, rank 1: x");
  // A rank that exited with a code: the line written is the reason (a hang report names the stuck rank), or none.
  CHECK(failure_reason(0, exited, "hang: rank 1 stuck before allreduce #9") == "hang: rank 1 stuck before allreduce #9");
  CHECK(failure_reason(0, exited, "").empty());
}
