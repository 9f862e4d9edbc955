// tests/unit/launcher/test_launch.cpp: launch() in-process on small shell jobs: exit codes, log files, a
// program that cannot be started, the signal state given back afterwards.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "launcher/launcher.h"
#include "launcher/process.h"

using namespace dpt::launcher;
namespace fs = std::filesystem;

namespace {
// A fresh directory removed at the end of the test.
struct TempDir {
  fs::path path = fs::temp_directory_path() / fmt::format("dpt_launch_test_{}_{}", ::getpid(), counter++);
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
  static inline int counter = 0;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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
    std::string log = slurp(dir.path / "logs" / fmt::format("rank_{}.log", r));
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

TEST_CASE("ExitStatus names exit codes and signals", "[launcher]") {
  CHECK(ExitStatus{false, 3, false}.describe() == "exited with code 3");
  CHECK(ExitStatus{true, SIGKILL, false}.describe() == "was killed by signal 9 (SIGKILL)");
  CHECK(ExitStatus{true, SIGSEGV, true}.describe() == "was killed by signal 11 (SIGSEGV), core dumped");
  CHECK(ExitStatus{true, SIGTERM, false}.exit_code() == 143);
  CHECK(ExitStatus{false, 0, false}.ok());
  CHECK(signal_name(SIGINT) == "SIGINT");
}
