// trainer/report/run_report.h: what a run says about itself besides its loss: how far the epoch is and when it and the
// run will end (the progress line), how long each rank takes per step (rank 0 names a straggler), and how much
// memory each rank holds (a report after the first step, figures each epoch, an out-of-memory message that
// says what to lower). The pure parts are here so that tests can pin them; the loop calls them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "models/kernels/kernel_params.h"

namespace dpt::trainer {

// "45s", "3m05s", "2h04m", "3d02h"; "?" for a negative or non-finite time.
std::string format_duration(double seconds);

// When the epoch and the run end, from the pace of this epoch so far: `done` batches took `elapsed_s`;
// `epoch_left` batches remain in this epoch and `run_left` in the run (every later epoch, capped by
// train.max_steps); each later epoch also pays one evaluation of `eval_s`. -1 while nothing is done yet.
struct Eta {
  double epoch_s = -1, run_s = -1;
};
Eta estimate_eta(int64_t done, double elapsed_s, int64_t epoch_left, int64_t run_left, int64_t evals_left,
                 double eval_s);

// What is left of the run after batch `next_batch` of `end_batch` (per rank) of epoch `epoch` (0-based) of
// `epochs`, `step` optimizer steps done, `k` micro-batches a step, `later_batches` in each later epoch: the batches
// left in this epoch and in the run, and the evaluations (one per epoch end) still to come. train.max_steps
// (`max_steps` > 0) caps all three: the run, and so this epoch, ends at its step, after one last evaluation.
struct WorkLeft {
  int64_t epoch_batches = 0, run_batches = 0, evaluations = 0;
};
WorkLeft work_left(int64_t step, int64_t epoch, int64_t epochs, int64_t next_batch, int64_t end_batch,
                   int64_t later_batches, int64_t k, int64_t max_steps);

// One rank's epoch: time computing (forward, backward, optimizer), waiting for data, and waiting in the
// gradient all-reduce beyond what backward hid, over `steps` optimizer steps.
struct RankTiming {
  double compute_s = 0, data_wait_s = 0, comm_s = 0;
  int64_t steps = 0;
  // The rank's own work per step: compute and data wait. In synchronous data parallelism every rank's wall
  // time per step is the same (the fast ones wait in the all-reduce), so this, not wall time, tells who is slow.
  double step_time_s() const { return steps > 0 ? (compute_s + data_wait_s) / static_cast<double>(steps) : 0.0; }
};

// The slowest rank when it takes more than `threshold` (0.10: 10%) longer per step than the median of the
// other ranks, and the others lost at least `min_lost_s` waiting for it over the epoch (its extra time per step
// times its steps): on a busy machine ranks of millisecond steps differ by 20% from scheduling alone, which
// costs nobody anything worth a warning. None with one rank.
struct Straggler {
  int rank = -1;
  double lag = 0;            // its step time over the others' median, minus 1 (0.35: 35% slower)
  double others_median_s = 0;
  double lost_s = 0;         // (its step time - the median) x its steps
};
std::optional<Straggler> find_straggler(const std::vector<RankTiming>& ranks, double threshold = 0.10,
                                        double min_lost_s = 1.0);
// Rank 0's warning for straggler `s` (`slow`: its timing), naming the collective the others waited in: the gradient
// all-reduce under DDP (`zero` 0), the gradient reduce-scatter and parameter all-gather under ZeRO stages 1 to 3.
std::string straggler_warning(const Straggler& s, const RankTiming& slow, int64_t zero);

// Each rank's `mine` (the same length on every rank), every rank's in rank order: one Sum all-reduce of a slot
// per rank, so any backend serves it. Collective: every rank calls it at the same point.
std::vector<std::vector<double>> gather_per_rank(const std::vector<double>& mine, comm::ProcessGroup& pg,
                                                 const char* what);

// One rank's memory, in bytes. The model's state (parameters, gradients, optimizer state, buffers) is what
// it allocates; activations are the rest of the first training step's peak (activations, batches, workspace).
struct MemoryFigures {
  int64_t params = 0, grads = 0, optimizer = 0, buffers = 0, activations = -1;  // -1: not measured yet
  int64_t tensors = 0, tensors_peak = 0;  // dptrain's tensors on the training device now, and at most
  int64_t rss = 0, peak_rss = 0;          // the process on the host (VmRSS, VmHWM)
  int64_t device_used = -1, device_total = -1;  // a GPU, as the driver counts it (every context); -1 on a CPU
};

// What an out-of-memory error adds: where the run was, this rank's figures, and what to lower; with `world` > 1 ranks
// and `zero` < 3, the ZeRO stage that would shard more of the model's state. `batch_size` and `accum_steps`: the run's
// micro-batch and accumulation; with `global_batch_size` > 0 they were derived from it, and train.batch_size (the
// largest micro-batch, `max_micro_batch`) is what to lower.
std::string out_of_memory_advice(const std::string& phase, const MemoryFigures& m, int64_t batch_size,
                                 int64_t eval_batch_size, int64_t accum_steps, models::Precision precision,
                                 int world = 1, int64_t zero = 0, int64_t global_batch_size = 0,
                                 int64_t max_micro_batch = 0);

}  // namespace dpt::trainer
