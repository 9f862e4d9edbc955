// trainer/step_timer.cpp: step timings from host clocks or CUDA events (trainer/step_timer.h).
#include "trainer/step_timer.h"

namespace dpt::trainer {

StepTimer::StepTimer(const models::Model& model) : stream_(model.kernels().stream()) {
  if (model.device().is_cuda())
    for (auto& e : events_)
      for (auto& ev : e.ev) ev = std::make_unique<cuda::Event>(/*timing=*/true);
}

void StepTimer::mark(Mark m) {
  if (!stream_) {
    host_[m] = Clock::now();
    if (m == kStepEnd) {
      auto s = [&](Mark from, Mark to) { return std::chrono::duration<double>(host_[to] - host_[from]).count(); };
      compute_s_ += s(kStepStart, kBackwardDone) + s(kCommDone, kUpdateDone);
      comm_s_ += s(kBackwardDone, kCommDone) + s(kUpdateDone, kStepEnd);
    }
    return;
  }
  Slot& s = events_[step_ % 2];
  if (m == kStepStart && s.recorded) collect(s);
  s.ev[m]->record(stream_);
  if (m == kStepEnd) {
    s.recorded = true;
    ++step_;
  }
}

double StepTimer::compute_s() {
  flush();
  return compute_s_;
}

double StepTimer::comm_s() {
  flush();
  return comm_s_;
}

void StepTimer::reset() {
  flush();
  compute_s_ = comm_s_ = 0;
}

void StepTimer::collect(Slot& s) {
  s.ev[kStepEnd]->synchronize();
  auto ms = [&](Mark from, Mark to) { return s.ev[to]->elapsed_ms_since(*s.ev[from]); };
  compute_s_ += (ms(kStepStart, kBackwardDone) + ms(kCommDone, kUpdateDone)) / 1000.0;
  comm_s_ += (ms(kBackwardDone, kCommDone) + ms(kUpdateDone, kStepEnd)) / 1000.0;
  s.recorded = false;
}

void StepTimer::flush() {
  for (auto& s : events_)
    if (s.recorded) collect(s);
}

}  // namespace dpt::trainer
