// trainer/schedule.h: learning-rate schedules as a pure function of the optimizer step.
#pragma once

#include <cstdint>

#include "trainer/config.h"

namespace dpt::trainer {

// The learning rate for optimizer step `step` (0-based): linear warm-up over warmup_steps (or warmup_epochs), then
// constant, step (x gamma every step_size epochs, as StepLR stepped per epoch) or cosine from lr down to
// min_lr at `total_steps`.
double lr_at(const TrainConfig& cfg, int64_t step, int64_t steps_per_epoch, int64_t total_steps);

}  // namespace dpt::trainer
