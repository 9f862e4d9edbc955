// trainer/report/reporter.h: everything a run says about itself besides its errors, behind one object the training
// loop calls at fixed events: the progress line (one live line on a terminal), the epoch line, the memory report
// after the first step, every rank's step time and memory each epoch (rank 0 names a straggler), and what rank 0
// keeps: RUN/metrics.jsonl (report/metrics.h), TensorBoard event files with log.tensorboard
// (report/tensorboard.h), curves.png redrawn with log.curves (report/plot.h). Which of those are on is the
// reporter's business, not the loop's.
//
// Events, in the order a run meets them: progress_due()/progress() at optimizer steps, first_step() once,
// epoch_measured() then epoch_done() after each epoch, checkpoint_failed() when a checkpoint write fails under
// checkpoint.on_error = warn, stopped() when a stop signal ends the run, finished() last. The ones marked
// collective gather from every rank: every rank calls them at the same point.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "trainer/config.h"
#include "trainer/loss_scaler.h"
#include "trainer/report/metrics.h"
#include "trainer/report/run_report.h"
#include "trainer/run_result.h"

namespace dpt::trainer {

struct ReportSetup {
  int64_t start_step = 0;   // the step this invocation starts from (records after it are dropped)
  int64_t start_epoch = 0;  // 0-based
  std::string unit;         // "samples" | "tokens": what a row is
  double row_flops = 0;     // training FLOPs per row (0: no MFU)
  double peak_flops = 0;    // the device's dense bf16 peak (0 on a CPU: no MFU)
  std::string job;          // TrainState::job: names the metrics file's writer (MetricsLog::for_run)
};

// One progress line's figures. `loss` is this rank's mean over the epoch so far.
struct Progress {
  int64_t step = 0;
  int64_t epoch = 0;  // 0-based
  int64_t batch = 0, batches = 0;  // batches done in the epoch, of
  int64_t epoch_step = 0, epoch_steps = 0;  // optimizer steps done in the epoch, of (with train.accum_steps: fewer)
  double loss = 0, lr = 0;
  double grad_norm = -1;  // with train.clip_grad_norm; -1: not clipping
  int64_t rows = 0;       // rows this rank trained this epoch
  double elapsed_s = 0;   // since the epoch began
  Eta eta;
};

// One epoch's figures, the same on every rank.
struct EpochEnd {
  int64_t step = 0;
  EpochStats stats;
  double lr = 0;
  double epoch_s = 0;
  bool max_steps_reached = false;  // the run stops after this epoch (train.max_steps)
  // A resumed run's evaluation of the epoch its checkpoint's stop signal ended (TrainState::pending_epoch): the
  // training figures are the stopped run's; no per-rank timings or memory of that epoch here.
  bool evaluated_after_resume = false;
};

class Reporter {
 public:
  // `model_memory`: the model's state in bytes (what an out-of-memory message quotes too); the first step's
  // report fills in its activations. Rank 0 opens the metrics file (IoError when it cannot).
  Reporter(const Config& cfg, comm::ProcessGroup& pg, Device device, const LossScaler& scaler,
           MemoryFigures& model_memory, const ReportSetup& setup);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // A new epoch's steps begin.
  void epoch_started();
  // Whether a progress line is due (train.progress_interval_s since the last one or the epoch's start); always
  // false but on rank 0. The loop gathers a Progress (a host synchronisation) only then.
  bool progress_due();
  void progress(const Progress& p);
  // Collective, after the first optimizer step of this invocation: the memory report (the activations are the
  // peak the training thread allocated during that step).
  void first_step(int64_t step);
  // Collective, after an epoch's steps: this rank's step times (rank 0 names a straggler) and memory.
  void epoch_measured(const RankTiming& mine);
  // The epoch line and records (rank 0), after epoch_measured and evaluation.
  void epoch_done(const EpochEnd& e);
  // A checkpoint write failed and the run goes on (checkpoint.on_error = warn): rank 0 warns, naming the step, the
  // cause and the newest checkpoint, and writes a "checkpoint_failed" record; every record from now on counts the
  // failures (checkpoint_failures). `epoch`: 0-based, the epoch of r.failed_checkpoint_step.
  void checkpoint_failed(const RunResult& r, int64_t epoch);
  // A stop signal ended the run (rank 0 redraws the curves).
  void stopped();
  // The run is over; rank 0 says so when it had nothing left to train (resumed at its end).
  void finished(const RunResult& r);

 private:
  MemoryFigures memory_now() const;
  nlohmann::json record(const char* kind, int64_t step, int64_t epoch) const;
  void report_ranks(int64_t step, int64_t epoch);
  void draw_curves();
  double mfu_pct(double global_rows_per_s) const;
  std::string mfu_text(double global_rows_per_s) const;

  using Clock = std::chrono::steady_clock;
  const Config& cfg_;
  comm::ProcessGroup& pg_;
  const Device device_;
  const LossScaler& scaler_;
  MemoryFigures& model_memory_;
  const ReportSetup setup_;
  const bool lead_;
  const std::string rate_key_;  // samples_per_s | tokens_per_s
  std::unique_ptr<MetricsLog> metrics_;  // rank 0
  Clock::time_point run_t0_ = Clock::now();
  Clock::time_point progress_t_ = Clock::now();
  MemoryFigures epoch_memory_;                  // this rank's, when the epoch's steps ended
  std::vector<std::vector<double>> per_rank_;   // every rank's epoch figures (epoch_measured)
  bool curves_failed_ = false;
  int64_t checkpoint_failures_ = 0;  // in this invocation (checkpoint.on_error = warn)
};

}  // namespace dpt::trainer
