// trainer/schedule.cpp: learning-rate schedules.
#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace dpt::trainer {

double lr_at(const TrainConfig& cfg, int64_t step, int64_t steps_per_epoch, int64_t total_steps) {
  const double warmup = cfg.warmup_steps > 0 ? static_cast<double>(cfg.warmup_steps)
                                              : cfg.warmup_epochs * static_cast<double>(steps_per_epoch);
  // (step + 1) / warmup, at most 1: a fractional warm-up (train.warmup_epochs = 0.5 of 5 steps: 2.5) would otherwise
  // give its last step (step 2: 3 / 2.5) a learning rate above the peak.
  if (warmup > 0 && static_cast<double>(step) < warmup)
    return cfg.lr * std::min(1.0, static_cast<double>(step + 1) / warmup);
  if (cfg.schedule == ScheduleKind::step) {
    const int64_t epoch = steps_per_epoch > 0 ? step / steps_per_epoch : 0;
    return cfg.lr * std::pow(cfg.gamma, static_cast<double>(epoch / cfg.step_size));
  }
  if (cfg.schedule == ScheduleKind::cosine) {
    const double span = std::max(1.0, static_cast<double>(total_steps) - warmup);
    const double t = std::clamp((static_cast<double>(step) - warmup) / span, 0.0, 1.0);
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + std::cos(std::numbers::pi * t));
  }
  return cfg.lr;  // constant
}

int64_t run_steps(int64_t steps_per_epoch, int64_t epochs) {
  int64_t out = 0;
  if (__builtin_mul_overflow(steps_per_epoch, epochs, &out)) return INT64_MAX;
  return out;
}

int64_t samples_per_step(int64_t batch_size, int64_t accum_steps, int world) {
  int64_t out = 0;
  if (__builtin_mul_overflow(batch_size, accum_steps, &out) || __builtin_mul_overflow(out, int64_t{world}, &out))
    return INT64_MAX;
  return out;
}

StepGeometry global_batch_geometry(int64_t global_batch, int64_t max_micro_batch, int world) {
  DPT_CHECK(global_batch >= 1 && max_micro_batch >= 1 && world >= 1, "bad geometry {} {} {}", global_batch,
            max_micro_batch, world);
  if (global_batch % world != 0) {
    const int64_t below = global_batch / world * world, above = below + world;
    DPT_THROW(ConfigError, "train.global_batch_size = {} does not divide among {} ranks; the nearest that do are {}",
              global_batch, world, below > 0 ? fmt::format("{} and {}", below, above) : std::to_string(above));
  }
  const int64_t per_rank = global_batch / world;
  // The micro-batch: per_rank's largest divisor of at most max_micro_batch. Counting the accumulation steps up one by
  // one from the fewest that fit took up to per_rank trials (train.global_batch_size = 2^63 - 1 never started).
  // Instead: the steps a counted up only while the micro-batch per_rank / a stays above sqrt(per_rank), then the
  // micro-batch counted down from min(max_micro_batch, sqrt(per_rank)): at most sqrt(per_rank) and, but for a
  // max_micro_batch of sqrt(per_rank) or more, about max_micro_batch trials.
  auto root = static_cast<int64_t>(std::sqrt(static_cast<double>(per_rank)));
  while (root > 1 && root > per_rank / root) --root;
  while (root + 1 <= per_rank / (root + 1)) ++root;
  int64_t micro = 0;
  for (int64_t a = per_rank / max_micro_batch + (per_rank % max_micro_batch != 0); a <= root && micro == 0; ++a)
    if (per_rank % a == 0) micro = per_rank / a;
  for (int64_t m = std::min(max_micro_batch, root); micro == 0; --m)  // ends at 1 at the latest
    if (per_rank % m == 0) micro = m;
  return {.micro_batch = micro, .accum_steps = per_rank / micro};
}

TrainConfig with_step_geometry(TrainConfig t, int world) {
  if (t.global_batch_size <= 0) return t;
  const StepGeometry g = global_batch_geometry(t.global_batch_size, t.batch_size, world);
  t.batch_size = g.micro_batch;
  t.accum_steps = g.accum_steps;
  return t;
}

}  // namespace dpt::trainer
