// trainer/preemption.h: stopping a run cleanly when the cluster asks (Slurm's --signal=USR1@T, scancel, a spot
// reclaim's SIGTERM, dprun forwarding either).
//
// SIGUSR1 and SIGTERM do not end the process: the handler records the first one (later ones are ignored, so a
// second signal during the checkpoint cannot cut it short). At optimizer step boundaries they agree on (about
// every 0.2 s: trainer.cpp's StopAgreement) the ranks find out through one small MAX all-reduce whether any of
// them got one (a rank blocked in a collective is never interrupted); if so, rank 0 writes a checkpoint of that step, every rank waits for it, and the run returns
// with RunResult::stop_signal set. main() then exits with kExitPreempted, and the next start resumes from that
// exact step. SIGINT (Ctrl-C) still ends the process at once.
#pragma once

#include <cstdint>

namespace dpt::trainer {

// The exit code of a preempted run: EX_TEMPFAIL, "try again". The sbatch scripts requeue the job on it.
inline constexpr int kExitPreempted = 75;

// Installs the SIGUSR1 and SIGTERM handlers (idempotent).
void install_stop_handlers();
// The first stop signal received, 0 when none.
int stop_signal();
// Seconds since it was received (0 when none).
double seconds_since_stop_signal();
// As if `sig` had been received now (tests); 0 forgets it.
void set_stop_signal(int sig);

}  // namespace dpt::trainer
