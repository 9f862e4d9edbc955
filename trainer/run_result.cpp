// trainer/run_result.cpp: the phrases made from a run's result (trainer/run_result.h).
#include "trainer/run_result.h"

#include <fmt/format.h>

namespace dpt::trainer {

std::string newest_checkpoint(const RunResult& r) {
  if (!r.last_checkpoint.empty()) return fmt::format("{} (step {})", r.last_checkpoint, r.last_checkpoint_step);
  if (r.resumed_from_step >= 0) return fmt::format("the one this run resumed from (step {})", r.resumed_from_step);
  return "none (this run has written none)";
}

std::string checkpoint_failure_summary(const RunResult& r) {
  if (r.checkpoint_failures == 0) return "";
  const std::string count =
      fmt::format("{} checkpoint write(s) failed in this run (checkpoint.on_error = warn)", r.checkpoint_failures);
  if (r.failed_checkpoint_step > r.last_checkpoint_step)
    return fmt::format("the newest checkpoint is older than the run's end (step {}): {}; the newest is {}. {}", r.steps,
                       r.checkpoint_error, newest_checkpoint(r), count);
  return fmt::format("{}, the last: {}; the newest checkpoint, {}, is the run's last", count, r.checkpoint_error,
                     newest_checkpoint(r));
}

}  // namespace dpt::trainer
