// launcher/job.h: the Job behind launch() (launcher.h), internal to dprun: one class over the ranks of this node and
// their attempts, its members defined in four files by what they do:
//   job.cpp          the attempts: run them, restart after a failure, tear down; launch()
//   job_ranks.cpp    the ranks: start them, relay their output, watch them end, fail the attempt
//   job_stop.cpp     stopping: stop signals, preemption, the grace period, the failure's reason
//   job_elastic.cpp  elastic jobs: the rendezvous rounds (launcher/rendezvous.h), keep-alives, other nodes' failures
//
// One thread, one poll loop over a signalfd (SIGCHLD and the stop signals) and the ranks' output pipes; each
// wake-up serves the signals first and reads each ready pipe at most once, so no rank can starve the loop.
// Ranks that end are observed with waitid(WNOWAIT) and reaped only at the very end: a zombie keeps its pid,
// hence its process group id, reserved, so signalling a rank's group can never hit an unrelated process.
// A restart begins only after every rank of the failed attempt has been reaped, with a fresh set of ranks.
// An elastic job (is_elastic) goes through a rendezvous round (launcher/rendezvous.h) before each attempt, and
// while its ranks run the loop also looks, every kRendezvousPoll, for a failure another node published.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/tcp_store.h"
#include "launcher/launcher.h"
#include "launcher/output.h"
#include "launcher/process.h"
#include "launcher/rendezvous.h"

namespace dpt::launcher {

using JobClock = std::chrono::steady_clock;

// Elastic jobs: how often dprun looks at the rendezvous store while it waits or its ranks run (one small
// request each time), and the longest the master node waits for the others' goodbyes when it was told to stop.
inline constexpr std::chrono::milliseconds kRendezvousPoll{100};
// How often a node's dprun counts up its keep-alive (at most: a third of --rdzv-timeout when that is shorter), and
// node 0 looks at the others'.
inline constexpr std::chrono::milliseconds kKeepAliveEvery{1000};
inline constexpr std::chrono::seconds kStoppedLinger{10};
// The longest a node but the master waits, once connected, for node 0's mark on the store (Rendezvous::mark_elastic).
inline constexpr std::chrono::seconds kMarkWait{5};
// The longest a node whose ranks failed waits for the others' reports, to name one whose ranks had all exited 0.
inline constexpr std::chrono::seconds kFinishedReportWait{2};
// A stop signal for preemption (SIGUSR1, SIGTERM) that would reach a rank before it blocks or catches it (the
// dynamic loader's tens of milliseconds before dptrain's first instruction, which holds them) would kill it: dprun
// holds it back until the rank does, looking every kStartingPoll, for at most kStartingGrace after the rank started.
inline constexpr std::chrono::milliseconds kStartingGrace{1000};
inline constexpr std::chrono::milliseconds kStartingPoll{5};

// dprun's own messages: one line on stderr, best effort.
void note(std::string_view msg);
// "exit code 3", "killed by SIGKILL": how a rank ended, for the restart line.
std::string brief(const ExitStatus& st);
// "rank 1", "ranks 0, 2".
std::string join_ranks(const std::vector<int>& ranks);
// A rank that exited kConfigErrorCode refused its configuration: no restart (plain or elastic) can help.
inline bool is_config_error(const ExitStatus& st) { return !st.signaled && st.code == kConfigErrorCode; }
inline constexpr const char* kConfigErrorWhy =
    "exit code 2 is a configuration error (dptrain: a bad option, config or data), which a restart would meet again";

struct Rank {
  int local = 0;
  int global = 0;
  pid_t pid = -1;            // also its process group id
  bool ended = false;        // seen ended (a zombie until reaped)
  bool reaped = false;
  ExitStatus status;
  JobClock::time_point started{};
  std::vector<int> held;     // stop signals held back while it starts (kStartingGrace)
  std::string log_path;      // with --log-dir
  std::unique_ptr<RankStream> out, err;  // without --log-dir
};

class Job {
 public:
  // `port_given`: the user chose opts.master_port (a restart keeps it whatever happens).
  Job(const Options& opts, Environment inherited, bool port_given);
  // The safety net: whatever happened (an exception included), nothing dprun started outlives it.
  ~Job();
  int run();

 private:
  enum class Phase { kRunning, kStopping, kKilling };

  // ---- the attempts (job.cpp): run them, restart after a failure, tear down
  // Attempts until one ends the job: start the ranks, watch them, tear down, then restart or not.
  int run_attempts();
  void reset_attempt();
  // After an attempt has ended and every rank is reaped: starts the next one if it should be (a rank failed,
  // dprun was not told to stop, restarts are left) and returns true; otherwise returns false.
  bool restart();
  void announce();
  // Elastic jobs with --log-dir: this node's folder for this run of dprun (log_run_dir_), made and announced.
  void make_elastic_log_dir();
  void finish();

  // ---- the ranks (job_ranks.cpp): start them, relay their output, watch them end, fail the attempt
  void open_stdin();
  void start(int local);
  static int nonblocking(Fd fd);
  bool all_ended() const;
  void monitor();
  void handle_signals();
  // Signals coalesce: one SIGCHLD may stand for several ranks, so every running rank is asked. Ranks found ended
  // badly together are named killed-by-a-signal first: such a rank died at once (kill -9, the OOM killer, a
  // crash), while one that exited with a code is most likely reacting to it (its peer's connection reset), and
  // the first named is the job's failure (its exit code, its reason).
  void check_ranks();
  // Ranks ended badly on their own. The first failure names the culprits and starts the teardown; ranks that
  // end while it is under way were most likely stopped by it and are not reported.
  void fail(const std::vector<Rank*>& failed, const std::vector<std::string>& why);
  void kill_remaining();
  std::vector<int> running_ranks() const;
  // Sends `sig` to every rank's process group; a preemption's SIGUSR1 or SIGTERM to a rank still starting, which it
  // does not handle yet, is held back (kStartingGrace) and sent by send_held().
  void signal_all(int sig);
  // The held signals of ranks that handle them now, or whose kStartingGrace is over; true while some are held.
  bool send_held();

  // ---- stopping (job_stop.cpp): stop signals, preemption, the grace period, the failure's reason
  static bool is_preemption(int sig) { return sig == SIGUSR1 || sig == SIGTERM; }
  void on_stop_signal(int sig);
  // Sends `sig` to every rank's process group (a rank that has ended may have left processes behind in
  // it), then gives the ranks the grace period (the stop timeout when preempting_) before SIGKILL. `why` starts
  // dprun's line about it ("received SIGUSR1"), which is printed even with no rank running when `always_note`.
  void begin_stop(int sig, const std::string& why, bool always_note);
  // DPT_REASON_FILE, given to every rank: a private temporary directory's "reason", where the rank that diagnoses
  // a failure (a hang report names the stuck rank) writes one line, first writer wins. Without the directory the
  // ranks get no variable, and the job runs all the same.
  void make_reason_dir();
  // After an attempt has ended: when it failed, "dprun: reason: ...", once: the line a rank left (failure_reason:
  // after the name and signal of a rank killed by one, which could leave none); the file is removed so that a
  // restart starts without one. `first`: what came before this node's failure (elastic: another node's rank killed
  // by a signal, the round's failure), named ahead of it.
  void print_reason(const std::string& first = {});
  // The line a rank left in DPT_REASON_FILE so far (empty: none).
  std::string reason_line() const;
  // The job's end, `code`: when it is a failure (neither 0 nor kPreemptedCode) and dprun itself was given a
  // DPT_REASON_FILE (a batch script's, as scripts/slurm/dprun.sbatch gives each node's dprun), "node N: <reason>"
  // goes there, first writer wins: srun reports the highest exit code, and a node whose ranks stopped for the
  // others' teardown exits 75, which alone would read as a preemption. Returns `code`.
  int ended(int code);
  // A rank exited kPreemptedCode: it stopped for a stop signal, after all ranks agreed on the step and rank 0's
  // checkpoint was written (dptrain), so the others are about to do the same; or alone, before the ranks could
  // agree (at the rendezvous: dptrain's RendezvousStopWatch), so the others would wait for it. Not a failure (no
  // restart), but a preemption of the rest: SIGTERM to each rank, as on SIGTERM to dprun, and the stop timeout.
  void on_preempted_exit(const Rank& r);
  // After every rank has ended: when some rank stopped for preemption and every rank exited 0 or 75, the job
  // was preempted (75); when some did not, the first of those is the job's failure. After SIGUSR1 or SIGTERM to
  // dprun with every rank exiting 0, the job completed (0; an elastic job's stop ended the round everywhere: 75).
  void settle_preemption();

  // ---- elastic jobs (job_elastic.cpp): the rendezvous rounds (launcher/rendezvous.h), keep-alives, other nodes' failures
  // Node 0 hosts the rendezvous store at --master-port; every node (node 0 too) is a client of it. A node that
  // starts before node 0 keeps trying to connect for --rdzv-timeout.
  void connect_rendezvous();
  // Calls `done` every kRendezvousPoll until it returns true (then true), `limit` has passed or a stop signal
  // arrives meanwhile (then false; stop_requested_ says which). Serves dprun's signals while it waits.
  bool wait_for(const std::function<bool()>& done, std::optional<JobClock::duration> limit = std::nullopt);
  // Joins rounds from `round` on until one places this node: returns nullopt with the attempt's placement set,
  // or the exit code when the job ended there (`own_code` when this node's last attempt failed, else the
  // master's) or dprun was told to stop while waiting.
  std::optional<int> enter_round(int round, int own_code);
  // Node 0: closes `round` when decide_round says so, and returns its plan (nullopt: keep waiting).
  std::optional<RoundPlan> master_close(int round, bool timed_out);
  // Node 0, ending the job: waits until the nodes that join `round` (less itself, `self_joined`), and at least
  // `expected` of them, have read its end, for at most `limit`: the store must outlive their last request.
  void linger(int round, int self_joined, int expected, JobClock::duration limit);
  // This node's outcome in the store, once per round: the first failure's text is what every node prints.
  void report_failure_once(int code, const std::string& what, bool by_signal = false, bool stop = false);
  // Every node but the master: counts up its keep-alive, every keep_alive_every_ (called on every wake-up of its
  // waits and of the ranks' watch).
  void keep_alive();
  // The master, while its ranks run: publishes as the round's failure a node whose keep-alive has stopped for
  // --rdzv-timeout and that has not reported (done, or failed) in this round. Its ranks' peers may be blocked on
  // it for dist.timeout_s; this is the bounded time.
  void watch_keep_alives();
  // Between polls of the ranks: has another node published a failure in this round (or, on the master, gone
  // silent)? Then stop this node's ranks.
  void check_other_nodes();
  // After an elastic attempt: node 0 ends the job or every node joins the next round. Returns the exit code,
  // or nullopt when this node runs the next attempt.
  std::optional<int> after_elastic_attempt();
  // The failure of `round` as every node names it (Rendezvous::failure); on a node but the master, nullopt when the
  // master has ended the job and is gone.
  std::optional<std::pair<int, std::string>> round_failure(int round);
  // After this node's attempt of `round` failed: the other nodes whose ranks had all exited 0 ("node 1 (...): its
  // rank 1 exited 0 before the others had finished"), waiting up to kFinishedReportWait for their reports; empty:
  // none.
  std::string finished_early(int round);
  // A node but the master that ends the job after `round` failed: tells node 0 (finish_as_master) not to wait for it.
  void give_up(int round);
  // Node 0's last duty: wait (up to --rdzv-timeout) until every node of `round` has reported its outcome, end
  // round + 1 for whoever joins it (nodes that failed and rejoin, late nodes), and wait for their goodbyes.
  void finish_as_master(int round, int code, const std::string& why);

  Options opts_;  // master_port may change between attempts
  Environment inherited_;
  const bool port_given_;
  const bool elastic_;                  // is_elastic(opts_): rendezvous rounds
  const JobClock::duration rdzv_timeout_;  // --rdzv-timeout
  const JobClock::duration keep_alive_every_;
  KeepAliveWatch watch_;  // the master's, over the other nodes of the round running
  SignalCatcher signals_;  // before any fork: a signal arriving during the spawning stays pending
  OutputSink stdout_, stderr_;
  Fd devnull_;
  std::string reason_dir_;  // DPT_REASON_FILE's directory; empty: none (make_reason_dir)
  std::string log_run_dir_;  // elastic jobs with --log-dir: --log-dir/node<N>_<UTC time>_<random>, one per run of dprun
  std::string last_reason_;  // the last failed attempt's reason line (print_reason), for ended()
  std::vector<Rank> ranks_;
  Phase phase_ = Phase::kRunning;
  JobClock::time_point deadline_{};
  int exit_code_ = 0;
  // The attempt under way: restarts so far (its DPT_RESTART_COUNT), and the rank whose failure ended it.
  int restarts_ = 0;
  std::optional<int> failed_rank_;
  ExitStatus failed_status_;
  // The first rank that exited 0 while others still ran, before any failure: a rank that thought training was over
  // (its peers then fail on the closed connection, and the reason names it first).
  std::optional<int> early_exit_rank_;
  bool stop_requested_ = false;  // dprun received SIGINT, SIGTERM, SIGHUP or SIGUSR1
  int received_signal_ = 0;      // the first stop signal dprun received
  bool preempting_ = false;      // the stop under way is for preemption (SIGUSR1/SIGTERM, or a rank exited 75)
  bool preempted_exit_ = false;  // a rank exited kPreemptedCode
  bool exec_failed_ = false;     // the program could not be started: a restart would fail the same way
  // Elastic: this node's ranks are being stopped for another node's failure (check_other_nodes), not for a
  // preemption: a rank that answers that SIGTERM with exit 75 (dptrain at the rendezvous) was not preempted.
  bool stopping_for_failure_ = false;
  Placement placement_;          // this attempt's ranks in the world (a round's, when elastic)
  // Elastic jobs: the store (hosted here on node 0), the rendezvous over it, the round running, and whether this
  // node's outcome of it is published; failure_: what ended the attempt, as every node prints it.
  std::unique_ptr<comm::TcpStore> store_;
  std::unique_ptr<Rendezvous> rdzv_;
  RoundPlan plan_;
  bool reported_ = false;
  bool master_gone_ = false;  // node 0's store went away after this node reported its end (keep_alive, round_failure)
  std::string failure_;
  JobClock::time_point next_check_{}, next_keep_alive_{}, next_watch_{};
};

}  // namespace dpt::launcher
