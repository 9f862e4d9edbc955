// trainer/loss_scaler.cpp: GradScaler's update rule.
#include "trainer/loss_scaler.h"

#include "core/check.h"

namespace dpt::trainer {

LossScaler::LossScaler(bool enabled, LossScalerOptions opts) : enabled_(enabled), opts_(opts), scale_(opts.init_scale) {
  DPT_CHECK(opts_.init_scale > 0 && opts_.growth_factor > 1 && opts_.backoff_factor > 0 && opts_.backoff_factor < 1 &&
                opts_.growth_interval > 0,
            "loss scaler options: scale {} growth {} backoff {} interval {}", opts_.init_scale, opts_.growth_factor,
            opts_.backoff_factor, opts_.growth_interval);
}

bool LossScaler::update(bool found_inf) {
  if (!enabled_) return true;
  if (found_inf) {
    scale_ *= opts_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_;
    return false;
  }
  if (++growth_tracker_ == opts_.growth_interval) {
    scale_ *= opts_.growth_factor;
    growth_tracker_ = 0;
  }
  return true;
}

void LossScaler::restore(double scale, int64_t growth_tracker, int64_t skipped) {
  if (!enabled_) return;
  DPT_CHECK(scale > 0 && growth_tracker >= 0 && growth_tracker < opts_.growth_interval && skipped >= 0,
            "loss scaler state: scale {} growth tracker {} skipped {}", scale, growth_tracker, skipped);
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  skipped_ = skipped;
}

}  // namespace dpt::trainer
