// trainer/schedule.h: learning-rate schedules as a pure function of the optimizer step, and the step's geometry
// under train.global_batch_size.
#pragma once

#include <cstdint>

#include "trainer/config.h"

namespace dpt::trainer {

// The learning rate for optimizer step `step` (0-based): linear warm-up over warmup_steps (or warmup_epochs), then
// constant, step (x gamma every step_size epochs, as StepLR stepped per epoch) or cosine from lr down to
// min_lr at `total_steps`.
double lr_at(const TrainConfig& cfg, int64_t step, int64_t steps_per_epoch, int64_t total_steps);

// The optimizer steps of `epochs` epochs of `steps_per_epoch`, saturated at INT64_MAX: train.epochs takes any int64,
// and a product that wrapped (train.epochs = 2^63 - 1 with train.max_steps, "train by steps") once went negative and
// ran the cosine schedule at min_lr from the first step.
int64_t run_steps(int64_t steps_per_epoch, int64_t epochs);

// The examples one optimizer step takes over all ranks (batch x accumulation steps x ranks), saturated at INT64_MAX
// as run_steps: train.accum_steps = 2^62 once wrapped it to 0, and the run died on a division by it (SIGFPE).
int64_t samples_per_step(int64_t batch_size, int64_t accum_steps, int world);

// train.global_batch_size: `global_batch` samples per optimizer step whatever the world size, as a per-rank
// micro-batch times accumulation steps: the fewest micro-batches (accum_steps) that fit train.batch_size
// (`max_micro_batch`), each rank taking global_batch / world samples per step. ConfigError when global_batch does not
// divide among `world` ranks, naming the nearest sizes that do.
struct StepGeometry {
  int64_t micro_batch = 0;  // per rank
  int64_t accum_steps = 1;
};
StepGeometry global_batch_geometry(int64_t global_batch, int64_t max_micro_batch, int world);

// The train config a run of `world` ranks uses: `t` itself, or with train.global_batch_size its batch_size and
// accum_steps derived by global_batch_geometry.
TrainConfig with_step_geometry(TrainConfig t, int world);

}  // namespace dpt::trainer
