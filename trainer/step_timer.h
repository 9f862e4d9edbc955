// trainer/step_timer.h: where a training step's time goes: compute (forward, backward, the optimizer) and the
// part of the gradient all-reduce that backward did not hide (plus, under ZeRO, the parameter all-gather after the
// optimizer), summed over an epoch.
//
// CPU: host clocks around the phases. GPU: CUDA events on the compute stream, read two steps later: the host
// waits for step N-2's last event, so it runs at most two steps ahead of the GPU (enough to overlap the next
// batch's copy with the current step).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>

#include "core/cuda.h"
#include "models/model.h"

namespace dpt::trainer {

class StepTimer {
 public:
  // The marks of one optimizer step, in this order.
  enum Mark { kStepStart = 0, kBackwardDone = 1, kCommDone = 2, kUpdateDone = 3, kStepEnd = 4 };

  explicit StepTimer(const models::Model& model);
  void mark(Mark m);
  // The totals so far (GPU: waits for the last steps' events).
  double compute_s();
  double comm_s();
  void reset();

 private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    std::array<std::unique_ptr<cuda::Event>, 5> ev;
    bool recorded = false;
  };
  void collect(Slot& s);
  void flush();

  StreamHandle stream_;
  std::array<Clock::time_point, 5> host_{};
  std::array<Slot, 2> events_;
  size_t step_ = 0;
  double compute_s_ = 0, comm_s_ = 0;
};

}  // namespace dpt::trainer
