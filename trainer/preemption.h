// trainer/preemption.h: stopping a run cleanly when the cluster asks (Slurm's --signal=USR1@T, scancel, a spot
// reclaim's SIGTERM, dprun forwarding either).
//
// SIGUSR1 and SIGTERM do not end the process: the handler records the first one (later ones are ignored, so a
// second signal during the checkpoint cannot cut it short). At optimizer step boundaries they agree on (about
// every 0.2 s: StopAgreement below) the ranks find out through one small MAX all-reduce whether any of
// them got one (a rank blocked in a collective is never interrupted); if so, rank 0 writes a checkpoint of that step, every rank waits for it, and the run returns
// with RunResult::stop_signal set. main() then exits with kExitPreempted, and the next start resumes from that
// exact step. SIGINT (Ctrl-C) still ends the process at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/process_group.h"
#include "core/check.h"

namespace dpt::trainer {

// The exit code of a preempted run: EX_TEMPFAIL, "try again". The sbatch scripts requeue the job on it.
inline constexpr int kExitPreempted = 75;

// A stop signal acted on before the first training step, by a wait at start-up that gives up on it (data.dir's lock,
// held by another job: trainer/datasets.h): nothing was trained and there is no checkpoint to write. dptrain exits
// kExitPreempted, as a stopped run does, and the same command starts the run again. `signal`: the one received.
class StoppedBeforeTraining : public Error {
 public:
  StoppedBeforeTraining(int signal, const std::string& what) : Error(what), signal(signal) {}
  int signal;
};

// main() blocks SIGUSR1 and SIGTERM first thing (hold_stop_signals), before its slow start-up and the re-exec for
// OpenBLAS (execv keeps the signal mask and what is pending): a stop signal in the first tens of milliseconds once
// killed the process (exit 138 or 143). One that arrives meanwhile stays pending until install_stop_handlers()
// (a run that stops cleanly) or release_stop_signals() (every other command, which ends on them as by default).
void hold_stop_signals();
void release_stop_signals();
// Installs the SIGUSR1 and SIGTERM handlers, then unblocks them in this thread (idempotent): a signal held since
// hold_stop_signals() is recorded now.
void install_stop_handlers();
// The first stop signal received, 0 when none.
int stop_signal();
// Seconds since it was received (0 when none).
double seconds_since_stop_signal();
// As if `sig` had been received now (tests); 0 forgets it.
void set_stop_signal(int sig);

// While this rank waits for the others at the rendezvous (TcpStore connects and waits, Gloo's connections, MPI_Init,
// NCCL's set-up: none looks at the stop flag, and each may wait up to dist.timeout_s), a thread of its own looks at
// the flag about every kPoll and calls on_stop(signal), which must end the process: before the first step there is
// nothing to checkpoint or agree on. A stop once waited for the whole dist.timeout_s (under dprun, the whole
// --stop-timeout, then SIGKILL). From construction until disarm() (or destruction); a signal received before
// construction (held during the start-up) calls on_stop in the constructor. (A rendezvous that fails because a
// peer stopped first, before this rank's thread looked, is the caller's to tell: trainer/commands/job.cpp.)
class RendezvousStopWatch {
 public:
  static constexpr std::chrono::milliseconds kPoll{20};

  explicit RendezvousStopWatch(std::function<void(int)> on_stop);
  ~RendezvousStopWatch();
  RendezvousStopWatch(const RendezvousStopWatch&) = delete;
  RendezvousStopWatch& operator=(const RendezvousStopWatch&) = delete;
  // The rendezvous is over: a later signal is the training's (StopAgreement). Joins the thread.
  void disarm();

 private:
  std::function<void(int)> on_stop_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = true;
  std::thread thread_;
};

// Whether any rank received a stop signal, the same answer on every rank. The ranks ask at
// agreed step boundaries about every kInterval seconds (every step when a step takes longer), so that a short
// step does not pay for a collective each time: one all-reduce of {signal, -(steps to the next check)} with
// MAX gives every rank the signal (the largest number if several) and the smallest proposed interval. With one
// rank it asks every step, for free. A stopped run's checkpoint is of the step it stopped at, so when the
// checks happen changes nothing but how soon a run stops.
class StopAgreement {
 public:
  static constexpr double kInterval = 0.2;  // seconds between checks

  StopAgreement(comm::ProcessGroup& pg, int64_t step);
  // Called at every optimizer step boundary with the steps done so far; 0 or the signal.
  int poll(int64_t step);

 private:
  comm::ProcessGroup& pg_;
  int64_t next_;       // the step boundary of the next check
  int64_t last_step_;  // and of the last one
  std::chrono::steady_clock::time_point last_t_ = std::chrono::steady_clock::now();
};

}  // namespace dpt::trainer
