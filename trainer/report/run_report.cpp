// trainer/report/run_report.cpp: progress estimates, per-rank timing and memory figures (trainer/report/run_report.h).
#include "trainer/report/run_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/memory.h"

namespace dpt::trainer {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  return fmt::format("{}d{:02}h", s / 86400, s % 86400 / 3600);
}

Eta estimate_eta(int64_t done, double elapsed_s, int64_t epoch_left, int64_t run_left, int64_t evals_left,
                 double eval_s) {
  if (done <= 0 || elapsed_s <= 0) return {};
  const double per_batch = elapsed_s / static_cast<double>(done);
  return {per_batch * static_cast<double>(std::max<int64_t>(epoch_left, 0)),
          per_batch * static_cast<double>(std::max<int64_t>(run_left, 0)) +
              static_cast<double>(std::max<int64_t>(evals_left, 0)) * std::max(eval_s, 0.0)};
}

WorkLeft work_left(int64_t step, int64_t epoch, int64_t epochs, int64_t next_batch, int64_t end_batch,
                   int64_t later_batches, int64_t k, int64_t max_steps) {
  k = std::max<int64_t>(k, 1);
  auto steps_of = [k](int64_t batches) { return (std::max<int64_t>(batches, 0) + k - 1) / k; };
  WorkLeft w;
  w.epoch_batches = std::max<int64_t>(end_batch - next_batch, 0);
  // Saturated: train.epochs takes any int64 (2^63 - 1 with train.max_steps once wrapped to a negative count).
  int64_t later = 0;
  if (__builtin_mul_overflow(std::max<int64_t>(epochs - epoch - 1, 0), std::max<int64_t>(later_batches, 0), &later) ||
      __builtin_add_overflow(w.epoch_batches, later, &w.run_batches))
    w.run_batches = INT64_MAX;
  w.evaluations = std::max<int64_t>(epochs - epoch, 0);
  if (max_steps <= 0) return w;
  const int64_t steps_left = std::max<int64_t>(max_steps - step, 0);
  // The steps left after this epoch's, and the epochs they reach into: each ends with an evaluation, and so
  // does the stop at max_steps.
  const int64_t after = steps_left - steps_of(w.epoch_batches), later_steps = steps_of(later_batches);
  if (after <= 0)
    w.evaluations = std::min<int64_t>(w.evaluations, 1);
  else if (later_steps > 0)
    w.evaluations = std::min(w.evaluations, 1 + (after + later_steps - 1) / later_steps);
  int64_t max_batches = 0;
  if (__builtin_mul_overflow(steps_left, k, &max_batches)) max_batches = INT64_MAX;
  w.run_batches = std::min(w.run_batches, max_batches);
  w.epoch_batches = std::min(w.epoch_batches, w.run_batches);
  return w;
}

std::optional<Straggler> find_straggler(const std::vector<RankTiming>& ranks, double threshold, double min_lost_s) {
  if (ranks.size() < 2) return std::nullopt;
  size_t slow = 0;
  for (size_t r = 1; r < ranks.size(); ++r)
    if (ranks[r].step_time_s() > ranks[slow].step_time_s()) slow = r;
  std::vector<double> others;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (r != slow) others.push_back(ranks[r].step_time_s());
  std::sort(others.begin(), others.end());
  const size_t n = others.size();
  const double median = n % 2 ? others[n / 2] : (others[n / 2 - 1] + others[n / 2]) / 2;
  if (median <= 0) return std::nullopt;
  const double lag = ranks[slow].step_time_s() / median - 1.0;
  const double lost = (ranks[slow].step_time_s() - median) * static_cast<double>(ranks[slow].steps);
  if (lag <= threshold || lost < min_lost_s) return std::nullopt;
  return Straggler{static_cast<int>(slow), lag, median, lost};
}

std::string straggler_warning(const Straggler& s, const RankTiming& slow, int64_t zero) {
  const double steps = static_cast<double>(std::max<int64_t>(slow.steps, 1));
  // Under ZeRO the gradients are reduce-scattered and the parameters all-gathered (stage 3: also before forward
  // and backward): no all-reduce carries them.
  const char* where = zero == 0   ? "the gradient all-reduce"
                      : zero < 3 ? "the gradient reduce-scatter and parameter all-gather (ZeRO)"
                                 : "the parameter all-gathers and gradient reduce-scatter (ZeRO-3)";
  return fmt::format("straggler: rank {} took {:.1f} ms per step (compute {:.1f} ms, data wait {:.1f} ms), {:.0f}% "
                     "more than the other ranks' median {:.1f} ms; they waited {:.1f} s for it in {} this epoch",
                     s.rank, 1e3 * slow.step_time_s(), 1e3 * slow.compute_s / steps, 1e3 * slow.data_wait_s / steps,
                     100 * s.lag, 1e3 * s.others_median_s, s.lost_s, where);
}

std::vector<std::vector<double>> gather_per_rank(const std::vector<double>& mine, comm::ProcessGroup& pg,
                                                 const char* what) {
  const size_t n = mine.size(), world = static_cast<size_t>(pg.size());
  Tensor all = Tensor::zeros({static_cast<int64_t>(n * world)}, DType::F64);
  std::copy(mine.begin(), mine.end(), all.data<double>() + static_cast<size_t>(pg.rank()) * n);
  if (world > 1) pg.allreduce(all, {.op = comm::ReduceOp::Sum, .what = what})->wait();
  std::vector<std::vector<double>> out(world);
  for (size_t r = 0; r < world; ++r) out[r].assign(all.data<double>() + r * n, all.data<double>() + (r + 1) * n);
  return out;
}

std::string out_of_memory_advice(const std::string& phase, const MemoryFigures& m, int64_t batch_size,
                                 int64_t eval_batch_size, int64_t accum_steps, models::Precision precision,
                                 int world, int64_t zero, int64_t global_batch_size, int64_t max_micro_batch) {
  auto b = [](int64_t v) { return format_bytes(static_cast<size_t>(std::max<int64_t>(v, 0))); };
  std::string s = fmt::format("while {}. This rank's tensors: parameters {}, gradients {}, optimizer state {}, ", phase,
                              b(m.params), b(m.grads), b(m.optimizer));
  s += m.activations >= 0 ? fmt::format("activations {} (what the first step allocated at most)", b(m.activations))
                          : std::string("activations not measured yet (the first step had not finished)");
  if (m.device_total > 0) s += fmt::format("; the device holds {} of {} in all", b(m.device_used), b(m.device_total));
  if (global_batch_size > 0)
    s += fmt::format(". To fit, lower train.batch_size, the largest micro-batch (now {}: micro-batches of {}, {} per "
                     "step; train.global_batch_size {} stays, in more of them)",
                     max_micro_batch, batch_size, accum_steps, global_batch_size);
  else
    s += fmt::format(". To fit, lower train.batch_size (now {}; raise train.accum_steps, now {}, to keep the global "
                     "batch)",
                     batch_size, accum_steps);
  if (phase.find("evaluat") != std::string::npos)
    s += fmt::format(" or train.eval_batch_size (now {})", eval_batch_size);
  if (precision == models::Precision::F32) s += ", use train.precision = bf16 (half the activation bytes)";
  if (world > 1 && zero < 3)
    s += fmt::format(", shard the model's state over the {} ranks with dist.zero = 3 (now {}; 1 shards the optimizer "
                     "state, 2 also the gradients, 3 also the parameters)",
                     world, zero);
  s += ", or train a smaller model";
  return s;
}

}  // namespace dpt::trainer
