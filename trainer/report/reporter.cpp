// trainer/report/reporter.cpp: the run's lines and records (trainer/report/reporter.h).
#include "trainer/report/reporter.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "core/cuda.h"
#include "core/logging.h"
#include "core/memory.h"
#include "trainer/report/plot.h"

namespace dpt::trainer {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string bytes_text(double v) { return format_bytes(static_cast<size_t>(std::max(v, 0.0))); }

void add_memory(nlohmann::json& j, const MemoryFigures& m) {
  j["rss_bytes"] = m.rss;
  j["peak_rss_bytes"] = m.peak_rss;
  j["tensor_bytes"] = m.tensors;
  j["tensor_peak_bytes"] = m.tensors_peak;
  if (m.device_total > 0) {
    j["device_used_bytes"] = m.device_used;
    j["device_total_bytes"] = m.device_total;
  }
}

std::string memory_text(const MemoryFigures& m) {
  auto b = [](int64_t v) { return format_bytes(static_cast<size_t>(std::max<int64_t>(v, 0))); };
  std::string s = fmt::format("tensors {} (peak {}), host RSS {} (peak {})", b(m.tensors), b(m.tensors_peak), b(m.rss),
                              b(m.peak_rss));
  if (m.device_total > 0) s += fmt::format(", device {} of {} used", b(m.device_used), b(m.device_total));
  return s;
}

}  // namespace

Reporter::Reporter(const Config& cfg, comm::ProcessGroup& pg, Device device, const LossScaler& scaler,
                   MemoryFigures& model_memory, const ReportSetup& setup)
    : cfg_(cfg),
      pg_(pg),
      device_(device),
      scaler_(scaler),
      model_memory_(model_memory),
      setup_(setup),
      lead_(pg.rank() == 0),
      rate_key_(setup.unit + "_per_s") {
  if (lead_) metrics_ = MetricsLog::for_run(cfg, setup.start_step, setup.job);
}

Reporter::~Reporter() = default;

void Reporter::epoch_started() { progress_t_ = Clock::now(); }

bool Reporter::progress_due() {
  if (!lead_ || seconds_since(progress_t_) < cfg_.train.progress_interval_s) return false;
  progress_t_ = Clock::now();
  return true;
}

void Reporter::progress(const Progress& p) {
  const TrainConfig& t = cfg_.train;
  const double rate = static_cast<double>(p.rows) * pg_.size() / p.elapsed_s;
  const double epoch_pct = 100.0 * static_cast<double>(p.batch) / static_cast<double>(p.batches);
  const MemoryFigures mem = cfg_.log.memory ? memory_now() : MemoryFigures{};
  // The optimizer steps of the epoch, as the records' step counts them; under gradient accumulation the
  // micro-batches too (the records' batch and batches).
  const std::string where = p.epoch_steps > 0 && p.epoch_steps != p.batches
                                ? fmt::format("step {}/{} (batch {}/{}, {:.0f}%)", p.epoch_step, p.epoch_steps, p.batch,
                                              p.batches, epoch_pct)
                                : fmt::format("step {}/{} ({:.0f}%)", p.batch, p.batches, epoch_pct);
  const std::string line = fmt::format(
      "epoch {}/{} {} loss {:.4f} lr {:.4g}{}{} {}/s {:.0f}{} eta {} (run {}){}", p.epoch + 1, t.epochs, where,
      p.loss, p.lr,
      t.clip_grad_norm > 0 ? fmt::format(" grad_norm {:.4g}", p.grad_norm) : "",
      scaler_.enabled() ? fmt::format(" loss_scale {:g} skipped {}", scaler_.scale(), scaler_.skipped()) : "",
      setup_.unit, rate, mfu_text(rate), format_duration(p.eta.epoch_s), format_duration(p.eta.run_s),
      cfg_.log.memory ? "; " + memory_text(mem) : "");
  if (live_line_enabled())
    show_live_line(line);
  else
    spdlog::info("{}", line);
  nlohmann::json j = record("progress", p.step, p.epoch);
  j["batch"] = p.batch;
  j["batches"] = p.batches;
  j["pct"] = epoch_pct;
  j["loss"] = p.loss;
  j["lr"] = p.lr;
  if (t.clip_grad_norm > 0) j["grad_norm"] = p.grad_norm;
  j[rate_key_] = rate;
  if (const double pct = mfu_pct(rate); pct > 0) j["mfu_pct"] = pct;
  if (p.eta.epoch_s >= 0) {
    j["eta_epoch_s"] = p.eta.epoch_s;
    j["eta_run_s"] = p.eta.run_s;
  }
  if (cfg_.log.memory) add_memory(j, mem);
  metrics_->write(j);
}

void Reporter::first_step(int64_t step) {
  MemoryFigures m = memory_now();
  m.activations = thread_allocations().peak;
  stop_thread_allocations();
  model_memory_.activations = m.activations;
  const auto all = gather_per_rank({static_cast<double>(m.activations), static_cast<double>(m.tensors_peak),
                                    static_cast<double>(m.rss)},
                                   pg_, "memory report");
  if (!lead_) return;
  spdlog::info("memory per rank: parameters {}, gradients {}, optimizer state {}{}, activations {} (what the first "
               "step allocated at most: activations, their gradients, workspace); {}",
               bytes_text(m.params), bytes_text(m.grads), bytes_text(m.optimizer),
               m.buffers ? ", buffers " + bytes_text(m.buffers) : "", bytes_text(m.activations), memory_text(m));
  for (int r = 1; r < pg_.size(); ++r)
    if (std::abs(all[r][0] - all[0][0]) > 0.05 * all[0][0] || std::abs(all[r][1] - all[0][1]) > 0.05 * all[0][1])
      spdlog::info("memory of rank {}: activations {}, tensors peak {}, host RSS {}", r, bytes_text(all[r][0]),
                   bytes_text(all[r][1]), bytes_text(all[r][2]));
  nlohmann::json j = record("memory", step, setup_.start_epoch);
  j["param_bytes"] = m.params;
  j["grad_bytes"] = m.grads;
  j["optimizer_bytes"] = m.optimizer;
  j["buffer_bytes"] = m.buffers;
  j["activation_bytes"] = m.activations;
  add_memory(j, m);
  std::vector<int64_t> acts, peaks;
  for (const auto& r : all) {
    acts.push_back(static_cast<int64_t>(r[0]));
    peaks.push_back(static_cast<int64_t>(r[1]));
  }
  j["rank_activation_bytes"] = acts;
  j["rank_tensor_peak_bytes"] = peaks;
  metrics_->write(j);
}

void Reporter::epoch_measured(const RankTiming& mine) {
  epoch_memory_ = memory_now();
  per_rank_ = gather_per_rank({mine.compute_s, mine.data_wait_s, mine.comm_s, static_cast<double>(mine.steps),
                               static_cast<double>(epoch_memory_.rss), static_cast<double>(epoch_memory_.tensors_peak)},
                              pg_, "rank timings");
  reset_peak_tensor_memory(device_);  // the next epoch's peak starts from here
}

void Reporter::epoch_done(const EpochEnd& e) {
  if (!lead_) return;
  const TrainConfig& t = cfg_.train;
  const EpochStats& es = e.stats;
  spdlog::info("epoch {}/{} loss {:.4f} test_loss {:.4f} test_acc {:.4f} {}/s {:.0f}{} lr {:.4g} "
               "time {:.2f}s (compute {:.2f}s comm {:.2f}s data wait {:.2f}s)",
               es.epoch, t.epochs, es.train_loss, es.test_loss, es.test_acc, setup_.unit, es.samples_per_s,
               mfu_text(es.samples_per_s), e.lr, e.epoch_s, es.compute_s, es.comm_s, es.data_s);
  if (e.evaluated_after_resume)
    spdlog::info("epoch {}/{}: evaluated after the resume (a stop signal came at its last step): its test figures "
                 "are this run's, the others the stopped run's", es.epoch, t.epochs);
  if (scaler_.enabled())
    spdlog::info("fp16 loss scale {:g}; {} step(s) skipped so far for inf/NaN gradients", scaler_.scale(),
                 scaler_.skipped());
  if (e.max_steps_reached) spdlog::info("stopped at step {} (train.max_steps = {})", e.step, t.max_steps);
  nlohmann::json j = record("epoch", e.step, es.epoch - 1);
  j["train_loss"] = es.train_loss;
  j["test_loss"] = es.test_loss;
  j["test_acc"] = es.test_acc;
  j["lr"] = e.lr;
  j[rate_key_] = es.samples_per_s;
  if (const double pct = mfu_pct(es.samples_per_s); pct > 0) j["mfu_pct"] = pct;
  j["epoch_time_s"] = e.epoch_s;
  j["compute_s"] = es.compute_s;
  j["comm_s"] = es.comm_s;
  j["data_wait_s"] = es.data_s;
  if (e.evaluated_after_resume) {
    j["evaluated_after_resume"] = true;
    metrics_->write(j);
    draw_curves();
    return;
  }
  add_memory(j, epoch_memory_);
  metrics_->write(j);
  spdlog::info("epoch {}/{} memory: {}", es.epoch, t.epochs, memory_text(epoch_memory_));
  report_ranks(e.step, es.epoch - 1);
  draw_curves();
}

void Reporter::checkpoint_failed(const RunResult& r, int64_t epoch) {
  checkpoint_failures_ = r.checkpoint_failures;
  if (!lead_) return;
  spdlog::warn("{}; training goes on (checkpoint.on_error = warn): the newest checkpoint is still {}; {} failed "
               "write(s) in this run",
               r.checkpoint_error, newest_checkpoint(r), r.checkpoint_failures);
  nlohmann::json j = record("checkpoint_failed", r.failed_checkpoint_step, epoch);
  j["error"] = r.checkpoint_error;
  metrics_->write(j);
}

void Reporter::stopped() { draw_curves(); }

void Reporter::finished(const RunResult& r) {
  if (!lead_ || !r.epochs.empty() || r.stop_signal) return;
  const TrainConfig& t = cfg_.train;
  // Not setup_.start_epoch: a mid-epoch checkpoint's, whose rest of the epoch may have made no full batch (drop_last
  // on more ranks) and so no epoch line, while no epoch is left.
  const bool by_steps = t.max_steps > 0 && r.steps >= t.max_steps;
  const std::string why = by_steps ? fmt::format("train.max_steps = {} already reached", t.max_steps)
                                   : fmt::format("all {} epoch(s) done", t.epochs);
  // What to do instead: a first-day user ran the README's command after scripts/run.sh had trained to the end.
  spdlog::info("training already complete at step {} ({}): test_loss {:.4f} test_acc {:.4f}; to train more, raise {} "
               "(the run goes on from here), or start afresh with --resume never (or another checkpoint.dir)",
               r.steps, why, r.final_test_loss, r.final_test_acc, by_steps ? "train.max_steps" : "train.epochs");
}

// This rank's memory now (the model's state is model_memory_'s already): the training device's tensors, the host
// process, and a GPU as its driver counts it.
MemoryFigures Reporter::memory_now() const {
  MemoryFigures m = model_memory_;
  const TensorMemory tm = tensor_memory(device_);
  m.tensors = static_cast<int64_t>(tm.current);
  m.tensors_peak = static_cast<int64_t>(tm.peak);
  const HostMemory host = host_memory();
  m.rss = static_cast<int64_t>(host.rss);
  m.peak_rss = static_cast<int64_t>(host.peak_rss);
  if (device_.is_cuda()) {
    const cuda::MemInfo info = cuda::mem_info(device_.index);
    m.device_used = static_cast<int64_t>(info.total - info.free);
    m.device_total = static_cast<int64_t>(info.total);
  }
  return m;
}

nlohmann::json Reporter::record(const char* kind, int64_t step, int64_t epoch) const {
  nlohmann::json j;
  j["kind"] = kind;
  j["step"] = step;
  j["epoch"] = epoch + 1;
  j["epochs"] = cfg_.train.epochs;
  j["time_s"] = seconds_since(run_t0_);
  j["unix_time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (scaler_.enabled()) {
    j["loss_scale"] = scaler_.scale();
    j["skipped_steps"] = scaler_.skipped();
  }
  if (cfg_.checkpoint.on_error == OnCheckpointError::warn) j["checkpoint_failures"] = checkpoint_failures_;
  return j;
}

// Each epoch: every rank's step time (rank 0 names a straggler) and memory, into the metrics file.
void Reporter::report_ranks(int64_t step, int64_t epoch) {
  std::vector<RankTiming> timings;
  nlohmann::json j = record("ranks", step, epoch);
  std::vector<double> step_time, compute, data_wait, comm;
  std::vector<int64_t> rss, peak;
  for (const auto& r : per_rank_) {
    timings.push_back({.compute_s = r[0], .data_wait_s = r[1], .comm_s = r[2], .steps = static_cast<int64_t>(r[3])});
    step_time.push_back(timings.back().step_time_s());
    compute.push_back(r[0]);
    data_wait.push_back(r[1]);
    comm.push_back(r[2]);
    rss.push_back(static_cast<int64_t>(r[4]));
    peak.push_back(static_cast<int64_t>(r[5]));
  }
  j["rank_step_time_s"] = step_time;
  j["rank_compute_s"] = compute;
  j["rank_data_wait_s"] = data_wait;
  j["rank_comm_s"] = comm;
  j["rank_rss_bytes"] = rss;
  j["rank_tensor_peak_bytes"] = peak;
  if (const auto s = find_straggler(timings)) {
    const RankTiming& slow = timings[static_cast<size_t>(s->rank)];
    spdlog::warn("{}", straggler_warning(*s, slow, cfg_.dist.zero));
    j["straggler"] = s->rank;
    j["straggler_lag_pct"] = 100 * s->lag;
  }
  metrics_->write(j);
}

// log.curves: rank 0 redraws RUN/curves.png from the metrics file (report/plot.h); drawing is a nicety, so a failure
// (no gnuplot) is a warning once, and the run goes on.
void Reporter::draw_curves() {
  if (!lead_ || !cfg_.log.curves || curves_failed_) return;
  try {
    const PlotReport r = plot_run({.run = metrics_->dir(), .size = PlotSize{900, 600}});
    spdlog::info("curves: {}", r.out);
  } catch (const std::exception& e) {
    curves_failed_ = true;
    spdlog::warn("log.curves: cannot draw the curves ({}); training goes on without them", e.what());
  }
}

// Model FLOPs utilisation per device, against its dense bf16 peak: shown for a GPU only.
double Reporter::mfu_pct(double global_rows_per_s) const {
  return setup_.row_flops > 0 && setup_.peak_flops > 0
             ? 100.0 * global_rows_per_s / pg_.size() * setup_.row_flops / setup_.peak_flops
             : 0.0;
}

std::string Reporter::mfu_text(double global_rows_per_s) const {
  const double pct = mfu_pct(global_rows_per_s);
  return pct > 0 ? fmt::format(" mfu {:.1f}%", pct) : std::string();
}

}  // namespace dpt::trainer
