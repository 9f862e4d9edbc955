// trainer/loss_scaler.h: dynamic loss scaling for fp16 training, with torch.cuda.amp.GradScaler's semantics.
//
// The loss gradient is multiplied by scale() before backward, so small fp16 gradients do not flush to zero;
// after the all-reduce the gradients are divided by it again. A step whose gradients hold an inf or NaN
// (an overflow) is skipped and the scale halves; after growth_interval clean steps in a row it doubles.
// Every rank sees the same all-reduced gradients, so every rank makes the same decision without talking.
#pragma once

#include <cstdint>

namespace dpt::trainer {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  // Disabled: scale() is 1 and update() always applies the step.
  explicit LossScaler(bool enabled, LossScalerOptions opts = {});
  bool enabled() const { return enabled_; }
  double scale() const { return enabled_ ? scale_ : 1.0; }
  // After a step's unscaled gradients were checked: returns whether to apply the step (false: skip it), and
  // moves the scale (halved on an overflow; doubled after growth_interval clean steps).
  bool update(bool found_inf);
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t skipped() const { return skipped_; }
  // Checkpointed state.
  void restore(double scale, int64_t growth_tracker, int64_t skipped);

 private:
  bool enabled_;
  LossScalerOptions opts_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace dpt::trainer
