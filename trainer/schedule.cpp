// trainer/schedule.cpp: learning-rate schedules.
#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace dpt::trainer {

double lr_at(const TrainConfig& cfg, int64_t step, int64_t steps_per_epoch, int64_t total_steps) {
  const double warmup = cfg.warmup_steps > 0 ? static_cast<double>(cfg.warmup_steps)
                                              : cfg.warmup_epochs * static_cast<double>(steps_per_epoch);
  if (warmup > 0 && static_cast<double>(step) < warmup) return cfg.lr * static_cast<double>(step + 1) / warmup;
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

}  // namespace dpt::trainer
