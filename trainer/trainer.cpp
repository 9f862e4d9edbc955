// trainer/trainer.cpp: the training loop, as a Trainer whose phases read top to bottom (run()): set up (the data,
// the model and its optimizer, resume, the replicas, the step machinery), then each epoch: its steps, evaluation,
// reports, a checkpoint; finish. What a run reports goes through report/reporter.h.
#include "trainer/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <utility>

#include "core/cuda.h"
#include "core/memory.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "models/kernels/cpu/cpu_info.h"
#include "models/kernels/elementwise.h"
#include "models/model.h"
#include "trainer/build_model.h"
#include "trainer/checkpoint.h"
#include "trainer/config_check.h"
#include "trainer/datasets.h"
#include "trainer/dir_lock.h"
#include "trainer/evaluate.h"
#include "trainer/fault_injection.h"
#include "trainer/feeder.h"
#include "trainer/loss_scaler.h"
#include "trainer/model_registry.h"
#include "trainer/optimizer.h"
#include "trainer/parallel/factory.h"
#include "trainer/preemption.h"
#include "trainer/report/reporter.h"
#include "trainer/report/run_report.h"
#include "trainer/schedule.h"
#include "trainer/step_graph.h"
#include "trainer/step_timer.h"
#include "trainer/task.h"

namespace dpt::trainer {

Device choose_device(DeviceChoice requested, int local_rank, int device_count, const std::string& why_none,
                     const std::string& option) {
  if (requested == DeviceChoice::cpu) return Device::cpu();
  if (device_count > 0) return Device::cuda(std::max(local_rank, 0) % device_count);
  const std::string sep = option.starts_with("--") ? " " : " = ";  // a command-line option or a config key
  if (requested == DeviceChoice::cuda)
    DPT_THROW(ConfigError, "{}{}cuda, but there is no usable GPU ({}); use {}{}auto or cpu", option, sep, why_none,
              option, sep);
  return Device::cpu();
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Where a run is and what it holds, for the out-of-memory message (out_of_memory_advice).
struct RunContext {
  std::string phase = "loading the data";  // empty while training: `step` says where
  int64_t step = 0;                          // the optimizer step under way
  std::string where() const { return phase.empty() ? fmt::format("in training step {}", step) : phase; }
  MemoryFigures memory;
};

// What an epoch's steps share. Batches are numbered in this run's geometry (world size, batch, accumulation): an
// epoch resumed mid-way (at any geometry: data/sampler.h) begins at batch first_batch, the optimizer steps of its
// first sample0 examples, and goes on to end_batch.
struct Epoch {
  int64_t index = 0;        // 0-based
  int64_t first_batch = 0;  // > 0 when it resumes mid-epoch: a multiple of the accumulation steps
  int64_t end_batch = 0;    // the epoch's batches, per rank
  int64_t last_rows = 0;    // the rows of its last batch (train.batch_size, or fewer: the partial one)
  int64_t sample0 = 0;      // the examples of the epoch's order consumed before first_batch (by the whole job)
  int64_t first_step = 0;   // the optimizer steps done when it began
  std::vector<size_t> indices;  // this rank's examples from first_batch on, kept for DPT_DEBUG_SAMPLE_LOG only
  Tensor stats;             // summed loss, correct, targets counted: on the device, no synchronisation per step
  const data::Loader* loader = nullptr;  // its loader (the time spent waiting for batches)
  // Resumed mid-epoch: the summed loss and counted targets of every rank's steps before the checkpoint (TrainState).
  double carried_loss = 0, carried_count = 0;
  int64_t seen = 0;         // rows this rank trained (tokens: every position, masked ones too)
  Clock::time_point t0 = Clock::now();
  double lr = 0, grad_norm = 0;
  // The last step's gradient sum of squares, on the device: clipping without fp16 reads it only there (no host
  // synchronisation per step), the progress line when it prints.
  Tensor grad_ss;
  bool grad_ss_fresh = false;
  // The summed loss and the targets it counts (a host synchronisation).
  std::pair<double, double> loss_and_count() const {
    const Tensor host = stats.to(Device::cpu());
    return {host.data<double>()[0], host.data<double>()[2]};
  }
};

class Trainer {
 public:
  // `cfg`: the run's config, train.global_batch_size resolved for this world size (with_step_geometry); `user_cfg`:
  // the one given, which checkpoints record.
  Trainer(const Config& cfg, const Config& user_cfg, const RunOptions& opts, comm::ProcessGroup& pg, RunContext& ctx)
      : cfg_(cfg), user_cfg_(user_cfg), t_(cfg.train), opts_(opts), pg_(pg), ctx_(ctx), rank_(pg.rank()), world_(pg.size()),
        lead_(rank_ == 0), device_(opts.device), faults_(pg.rank()), rng_(static_cast<uint64_t>(cfg.train.seed)),
        scaler_(cfg.train.precision == models::Precision::F16) {}

  RunResult run() {
    check_cuda_graph();
    load_data();
    build_model_and_optimizer();
    resume();
    sync_replicas();
    prepare_steps();
    if (start_.pending_epoch.epoch > 0) report_pending_epoch();
    for (int64_t epoch = start_.epoch; epoch < t_.epochs && !stopped_ && !result_.stop_signal; ++epoch)
      train_epoch(epoch);
    finish();
    return result_;
  }

 private:
  // ---- set up
  void check_cuda_graph();  // train.cuda_graph = true: refused where it cannot apply (ConfigError), else step_graph_
  void load_data();
  void build_model_and_optimizer();
  void build_data_parallel();
  // dist.overlap: true or false as given; auto: true when the model trains on a GPU (the collectives overlap the
  // GPU's compute), false on the CPU (with a rank per core no core is idle for the communication thread).
  bool wanted_overlap() const {
    return cfg_.dist.overlap == "true" || (cfg_.dist.overlap == "auto" && model_->device().is_cuda());
  }
  void resume();
  std::optional<LoadedCheckpoint> choose_checkpoint(const CheckpointManager& ckpt);
  LoadedCheckpoint load_resume_path(const std::string& path) const;
  std::string resume_path_of_step(int64_t step) const;
  void restore(const LoadedCheckpoint& loaded);
  void sync_replicas();
  void prepare_steps();
  // ---- an epoch
  void train_epoch(int64_t epoch);
  bool train_batch(Epoch& ep, const data::Batch& batch);  // true: the run stops here
  void begin_step(Epoch& ep, int64_t batch);
  void forward_backward(Epoch& ep, const data::Batch& batch, int64_t group_rows, bool first_micro, bool last_micro);
  bool update(Epoch& ep);  // false: fp16 skipped the step
  void update_staged(Epoch& ep);  // train.cuda_graph with AdamW: update()'s device work, in the step's graph
  bool after_step(Epoch& ep, int64_t next_batch);  // true: the run stops here
  int64_t batches_for(size_t samples) const;       // a rank's batches in `samples` examples of an epoch
  int64_t samples_at(const Epoch& ep, int64_t next_batch) const;  // the epoch's examples the job has consumed
  Progress progress(Epoch& ep, int64_t next_batch);
  void carry_epoch_loss(const Epoch& ep);
  void autotune();
  // An epoch's end: its figures (measure_epoch: collective), the replicas checked, the evaluation, its line, and a
  // checkpoint when one is due. report_pending_epoch: a resumed run's evaluation and line of the epoch its
  // checkpoint's stop signal ended (TrainState::pending_epoch).
  PendingEpoch measure_epoch(Epoch& ep);
  void end_epoch(Epoch& ep);
  void report_pending_epoch();
  void evaluate_and_report(const PendingEpoch& m, bool after_resume);
  EvalResult evaluate_saved_model();
  // ---- checkpoints, the end
  // A checkpoint to continue with batch `next_batch` of `epoch`, `samples` of its examples consumed.
  void save(int64_t epoch, int64_t next_batch, int64_t samples);
  [[noreturn]] void throw_nonfinite(const std::string& name, size_t count) const;
  void stop_for_signal(int sig, int64_t epoch, int64_t next_batch, int64_t samples);
  void finish();

  const Config& cfg_;
  const Config& user_cfg_;
  const TrainConfig& t_;
  const RunOptions& opts_;
  comm::ProcessGroup& pg_;
  RunContext& ctx_;
  const int rank_, world_;
  const bool lead_;
  const Device device_;
  const FaultInjector faults_;  // DPT_DEBUG_* (trainer/fault_injection.h): a no-op unless a test sets one
  std::mt19937_64 rng_;
  LossScaler scaler_;
  // Set up, in this order.
  Datasets ds_;
  std::vector<int64_t> sample_shape_;
  std::unique_ptr<models::Model> model_;
  std::unique_ptr<Task> task_;
  StreamHandle stream_{};  // the compute stream (nullptr on the CPU)
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<CheckpointManager> ckpt_;
  std::optional<DirLock> dir_lock_;  // rank 0: checkpoint.dir is this run's (dir_lock.h)
  std::string set_aside_reason_ = "invalid";  // what resume() names the checkpoints newer than the chosen one
  std::pair<double, double> epoch_loss_carry_{0.0, 0.0};  // carry_epoch_loss's, for a mid-epoch save()
  TrainState start_;
  bool overlap_ = true, sync_buffers_ = false;
  std::optional<data::DistributedSampler> sampler_;
  data::LoaderOptions loader_options_;
  int64_t spe_ = 0;  // batches per epoch (per rank), from an epoch's beginning
  // With gradient accumulation an optimizer step takes K = train.accum_steps batches (fewer at an epoch's end); the
  // schedule, max_steps and every_steps count optimizer steps. step_samples_: the examples a step takes, all ranks
  // together (the global batch; fewer at an epoch's end).
  int64_t K_ = 1, steps_per_epoch_ = 0, total_steps_ = 0, step_samples_ = 0;
  std::unique_ptr<DataParallel> dp_;  // the data-parallel strategy (trainer/parallel/)
  models::SoftmaxCrossEntropy loss_;
  std::unique_ptr<Feeder> feeder_;
  std::unique_ptr<StepTimer> timer_;
  std::unique_ptr<StepGraph> step_graph_;  // train.cuda_graph (trainer/step_graph.h); null without it
  // train.cuda_graph with AdamW: the clipping's sum of squares and the update are in the step's graph too, their
  // per-step constants staged (Optimizer::stage) before each step; else (SGD) they run after it, as without a graph.
  bool graph_update_ = false;
  std::unique_ptr<StopAgreement> stop_agreement_;
  std::unique_ptr<Reporter> reporter_;
  // Where the run is. saved_at_: the step of the last checkpoint tried (written, or failed under
  // checkpoint.on_error = warn): each step's is tried once.
  int64_t step_ = 0, saved_at_ = -1;
  bool first_step_ = true;  // of this invocation: it measures the activations
  bool stopped_ = false;    // train.max_steps reached
  double last_eval_s_ = 0;  // the last evaluation's time, for the run's ETA
  PendingEpoch pending_epoch_;  // for the stop signal's checkpoint at an epoch's end
  RunResult result_;
};

// ---- set up -------------------------------------------------------------------------------------------------

void Trainer::check_cuda_graph() {
  if (!t_.cuda_graph) return;
  const std::string why = cuda_graph_refusal(device_, world_, t_.accum_steps);
  // train.device = auto without a GPU: why there is none.
  const std::string none = device_.is_cpu() && t_.device != DeviceChoice::cpu
                               ? fmt::format(" (no usable GPU: {})", cuda::unavailable_reason())
                               : "";
  if (!why.empty()) DPT_THROW(ConfigError, "train.cuda_graph = true: {}{}; set train.cuda_graph = false", why, none);
  step_graph_ = std::make_unique<StepGraph>();
}

void Trainer::load_data() {
  ctx_.phase = "preparing the data";
  prepare_data(cfg_, pg_, /*records_may_be_gone=*/false);
  ds_ = make_datasets(cfg_.data, cfg_.model, static_cast<uint64_t>(t_.seed));
  check_same_data(ds_, cfg_.data, pg_);  // a stale copy on one node: caught here, not as a hang or silently
  if (lead_)
    spdlog::info("data: {} train / {} test examples ({}), {} per rank per step, {} global{}", ds_.train->size(),
                 ds_.test->size(), ds_.train->name(), t_.batch_size * t_.accum_steps,
                 t_.batch_size * t_.accum_steps * world_,
                 t_.global_batch_size > 0 ? fmt::format(" (train.global_batch_size: {} rank(s) x {} micro-batch(es) "
                                                        "of {})", world_, t_.accum_steps, t_.batch_size)
                 : t_.accum_steps > 1 ? fmt::format(" ({} micro-batches of {})", t_.accum_steps, t_.batch_size) : "");
  if (lead_ && t_.global_batch_size > 0 && 2 * t_.batch_size <= user_cfg_.train.batch_size)
    spdlog::warn("train.global_batch_size {} on {} rank(s): {} per rank splits into micro-batches of at most "
                 "train.batch_size {} only as {} of {}; a global batch with more divisors fills them better",
                 t_.global_batch_size, world_, t_.global_batch_size / world_, user_cfg_.train.batch_size, t_.accum_steps,
                 t_.batch_size);
  sample_shape_ = ds_.train->sample_shape();
}

void Trainer::build_model_and_optimizer() {
  ctx_.phase = "building the model";
  model_ = build_model(cfg_.model, sample_shape_, ds_.train->num_classes(), device_);
  task_ = make_task(model_card(cfg_.model.name).input, cfg_.model.block_size, sample_shape_, device_);
  model_->init(rng_());
  try {
    model_->set_precision(t_.precision);
    model_->set_deterministic(t_.deterministic);
  } catch (const UnsupportedError& e) {
    DPT_THROW(ConfigError, "train.precision = {} on {}: {}; use train.precision = fp32 there", choice_name(t_.precision),
              device_.str(), e.what());
  }
  if (t_.bf16_activations) {  // the transformer fast path (config validation checked the model and the precision)
    try {
      model_->set_bf16_activations(true);
    } catch (const UnsupportedError& e) {
      DPT_THROW(ConfigError, "train.bf16_activations = true: {}", e.what());
    }
    if (lead_)
      spdlog::info("activations: bf16 in training (the transformer fast path){}",
                   device_.is_cpu() ? "; on the CPU its kernels are the plain reference loops, slower than fp32" : "");
  }
  if (lead_ && device_.is_cpu()) spdlog::info("precision: {}", models::describe_cpu_arithmetic(model_->precision()));
  if (!cfg_.model.init_from.empty()) {
    const std::string note = load_pretrained(*model_, cfg_.model, cfg_.model.init_from);
    if (lead_) spdlog::info("model: weights from {}{}", cfg_.model.init_from, note.empty() ? "" : "; " + note);
  }
  stream_ = model_->kernels().stream();
  const bool decay_matrices_only =
      t_.weight_decay_params == DecayParams::matrices ||
      (t_.weight_decay_params == DecayParams::automatic && model_card(cfg_.model.name).decay_matrices_only);
  ctx_.memory.params = static_cast<int64_t>(model_->params().bytes());
  ctx_.memory.buffers = static_cast<int64_t>(model_->buffers().bytes());
  build_data_parallel();
  ctx_.memory.grads = static_cast<int64_t>(dp_->gradient_bytes());
  ctx_.memory.params = static_cast<int64_t>(dp_->param_bytes());
  ctx_.phase = "allocating the optimizer state";
  optimizer_ = std::make_unique<Optimizer>(t_, *model_, decay_matrices_only, dp_->owned(), dp_->shard_grads(),
                                           dp_->shard_params());
  graph_update_ = step_graph_ && optimizer_->can_stage() && !scaler_.enabled();
  ctx_.memory.optimizer = static_cast<int64_t>(optimizer_->state_bytes());
  if (lead_)
    for (const std::string& line : dp_->shard_lines(optimizer_->state_bytes(), t_.accum_steps)) spdlog::info("{}", line);
  ctx_.phase = "loading the checkpoint";
  if (lead_) spdlog::info("model: {} on {}", model_->summary(), model_->device().str());
}

// The data-parallel strategy (trainer/parallel/data_parallel.h): DDP's all-reduce, or ZeRO's reduce-scatter whose
// shard the optimizer then updates. Overlap with backward unless SyncBatchNorm's all-reduces would interleave with it
// (sync_replicas).
void Trainer::build_data_parallel() {
  ctx_.phase = "setting up the gradient buckets";
  overlap_ = wanted_overlap() && !(cfg_.model.sync_bn && world_ > 1 && !pg_.asynchronous());
  dp_ = make_data_parallel(
      pg_, *model_, stream_,
      DataParallelOptions{.bucket_cap_bytes = static_cast<size_t>(cfg_.dist.bucket_cap_mb * 1024 * 1024),
                          .first_bucket_cap_bytes = size_t{1} << 20,
                          .overlap = overlap_,
                          .grad_dtype = cfg_.dist.grad_dtype == GradDtype::bf16 ? DType::BF16 : DType::F32,
                          .zero = static_cast<int>(cfg_.dist.zero)});
  if (lead_) {
    for (const std::string& line : dp_->setup_lines()) spdlog::info("{}", line);
    if (world_ > 1 && cfg_.dist.overlap == "auto" && !overlap_ && model_->device().is_cpu())
      spdlog::info("reducer: after backward, as dist.overlap = auto chooses on the CPU (no core is idle for an "
                   "overlap; dist.overlap = true runs it)");
  }
}

// Rank 0 chooses the checkpoint to continue from; every rank loads the same one itself. --resume never: rank 0's
// first checkpoint replaces the earlier run's (CheckpointManager::replace_earlier_on_next_write), so that a run which
// fails before it has one (bad data found in the first epoch) leaves them as they were.
void Trainer::resume() {
  // Before anything in checkpoint.dir is read, deleted (--resume never) or set aside: another run's are not ours.
  if (lead_) dir_lock_.emplace(cfg_.checkpoint.dir, opts_.job);
  ckpt_ = std::make_unique<CheckpointManager>(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
  faults_.checkpoints_opened(*ckpt_);
  // A write killed midway (kill -9, a launcher gone) left its temporary folder, as big as a checkpoint, which nothing
  // else removes unless that very step is written again; this run holds the directory, so none is under way.
  if (lead_ && dir_lock_->held())
    for (const std::string& name : ckpt_->remove_leftovers())
      spdlog::warn("removed {}/{}: {}", cfg_.checkpoint.dir, name,
                   name.starts_with(".tmp-") ? "the temporary folder of a checkpoint write that did not finish (a run "
                                               "killed while writing it); it was never a checkpoint"
                                             : "an earlier run's checkpoint that --resume never replaced, left when "
                                               "that run was killed before it had deleted it");
  std::optional<LoadedCheckpoint> loaded = choose_checkpoint(*ckpt_);
  if (loaded) {
    try {
      restore(*loaded);  // a checkpoint this run cannot continue from throws here, with nothing moved
    } catch (const CheckpointError& e) {
      // Another model or optimizer than the checkpoint's: a config error that every restart would meet again (exit
      // 2: dprun --max-restarts does not restart it; as exit 1 it once restarted, failing the same way each time).
      DPT_THROW(ConfigError, "{}: this run's model or optimizer config cannot continue from it. Give it the "
                "checkpoint's settings (its state.json holds its config), or start afresh in another checkpoint.dir "
                "(or with --resume never, which deletes these checkpoints once this run's first is written)", e.what());
    }
  }
  // Checkpoints newer than the one we continue from (invalid ones skipped by auto, or those of the run that --resume
  // PATH abandons) must neither be loaded by a later --resume auto nor outrank the new run's checkpoints when
  // pruning: keep them, under another name. Only once the chosen one has loaded.
  // (Not for a fresh start: its first checkpoint replaces them all.)
  const bool fresh = opts_.resume == "never" && !loaded;
  if (lead_ && !fresh) ckpt_->set_aside_after(loaded ? loaded->state.step : -1, set_aside_reason_);
  if (lead_ && fresh) ckpt_->replace_earlier_on_next_write();
  if (loaded) result_.resumed_from_step = start_.step;
}

// --resume PATH, on rank 0: the checkpoint PATH (a step-N folder), or, where PATH holds checkpoints instead (a
// checkpoint.dir), the newest valid one in it, as --resume auto takes checkpoint.dir's, saying which.
LoadedCheckpoint Trainer::load_resume_path(const std::string& path) const {
  if (!std::filesystem::exists(std::filesystem::path(path) / "COMPLETE")) {
    const CheckpointManager dir(path, 1);
    if (!dir.complete().empty()) {
      std::optional<LoadedCheckpoint> newest = dir.load_latest();
      if (!newest)
        DPT_THROW(ConfigError, "--resume {}: a checkpoint directory whose checkpoints are all invalid (the "
                  "warnings above say why)", path);
      spdlog::info("--resume {}: a checkpoint directory; continuing from its newest valid checkpoint, {}", path,
                   newest->path);
      return std::move(*newest);
    }
  }
  try {
    return CheckpointManager::load(path);
  } catch (const CheckpointError& e) {
    // A bad command line (exit 2), which a restart would meet again: as exit 1, dprun --max-restarts restarted it.
    DPT_THROW(ConfigError, "--resume {}: not a valid checkpoint: {} (--resume with its checkpoint directory takes the "
              "newest valid one there)", path, e.what());
  }
}

// On the other ranks: the checkpoint of `step` that load_resume_path chose.
std::string Trainer::resume_path_of_step(int64_t step) const {
  if (std::filesystem::exists(std::filesystem::path(opts_.resume) / "COMPLETE")) return opts_.resume;
  return CheckpointManager(opts_.resume, 1).path_of_step(step);
}

std::optional<LoadedCheckpoint> Trainer::choose_checkpoint(const CheckpointManager& ckpt) {
  std::optional<LoadedCheckpoint> loaded;
  const bool path_given = opts_.resume != "auto" && opts_.resume != "never";
  // A launcher's restart of a job started with --resume never or PATH: those were the first attempt's. This attempt
  // goes on from the job's own newest checkpoint (TrainState::job) when there is one, else does as the first did
  // (which may have failed before it got here).
  const bool restarted = opts_.restart > 0 && opts_.resume != "auto";
  // A PATH that is no directory is a bad command line (exit 2), on every rank before anything is loaded.
  if (path_given && !restarted) {
    std::error_code ec;
    if (!std::filesystem::is_directory(opts_.resume, ec))
      DPT_THROW(ConfigError, "--resume {}: no such checkpoint directory (--resume takes auto, never, or the path of a "
                "step-N checkpoint or of a checkpoint directory){}", opts_.resume,
                ec ? ": " + ec.message() : std::string());
  }
  // The chosen checkpoint is checkpoint.dir's (else PATH's): --resume auto, or a PATH that is checkpoint.dir.
  std::error_code same_ec;
  bool from_dir = opts_.resume == "auto" ||
                  (path_given && std::filesystem::equivalent(opts_.resume, cfg_.checkpoint.dir, same_ec));
  if (lead_) {
    if (restarted && !opts_.job.empty()) loaded = ckpt.load_latest_of_job(opts_.job, opts_.job_family);
    if (loaded) {
      from_dir = true;
      spdlog::info("restart {}: --resume {} applied to the job's first attempt; this one goes on from {}, the job's "
                   "newest checkpoint", opts_.restart, opts_.resume, loaded->path);
    } else {
      if (restarted)
        spdlog::info("restart {}: no checkpoint of this job in {}{}: --resume {} as in the first attempt",
                     opts_.restart, ckpt.dir(), opts_.job.empty() ? " (the launcher names no job)" : "", opts_.resume);
      if (opts_.resume == "never") {
        if (const size_t n = ckpt.complete().size())
          spdlog::info("--resume never: starting afresh; the {} checkpoint(s) of an earlier run in {} are deleted once "
                       "this run's first checkpoint is written (a run that fails before then leaves them)", n,
                       ckpt.dir());
      } else if (opts_.resume == "auto") {
        loaded = ckpt.load_latest();
      } else {
        loaded = load_resume_path(opts_.resume);
      }
    }
  }
  // Rank 0's choice, to every rank: the step, and whether it is checkpoint.dir's.
  Tensor chosen = Tensor::empty({2}, DType::I64);
  chosen.data<int64_t>()[0] = loaded ? loaded->state.step : -1;
  chosen.data<int64_t>()[1] = from_dir ? 1 : 0;
  pg_.broadcast(chosen, {.what = "resume step"})->wait();
  const int64_t chosen_step = chosen.data<int64_t>()[0];
  from_dir = chosen.data<int64_t>()[1] != 0;
  if (chosen_step >= 0 && !lead_)
    loaded = CheckpointManager::load(from_dir ? ckpt.path_of_step(chosen_step) : resume_path_of_step(chosen_step));
  if (loaded) DPT_CHECK_EQ(loaded->state.step, chosen_step);
  set_aside_reason_ = from_dir ? "invalid" : "abandoned";
  return loaded;
}

// The model, optimizer, loss scale and RNG of `loaded`, and where its run stood (start_); ConfigError when this run
// cannot continue where it stopped.
void Trainer::restore(const LoadedCheckpoint& loaded) {
  check_same_classes(loaded.path, loaded.state.classes, ds_.classes);
  if (loaded.model.tensors.size() != model_->state().size())
    DPT_THROW(CheckpointError, "{}: model.safetensors has {} tensors, this model has {} (model config changed?)",
              loaded.path, loaded.model.tensors.size(), model_->state().size());
  dp_->with_full_params([&] {  // ZeRO stage 3: gathered, loaded, this rank's pieces kept
    model_->load_state([&](const std::string& name) { return loaded.model.find(name); },
                       loaded.path + "/model.safetensors");
  }, /*changed=*/true);
  OptimizerShard state = optimizer_->shard();  // views of the optimizer's state: this rank's pieces, or all of it
  load_optimizer_shard(loaded, model_->named_params(), state);
  start_ = loaded.state;
  optimizer_->set_steps(start_.optimizer_steps >= 0 ? start_.optimizer_steps : start_.step);
  if (scaler_.enabled() && start_.loss_scale > 0)
    scaler_.restore(start_.loss_scale, start_.scale_growth_tracker, start_.skipped_steps);
  std::istringstream(start_.rng) >> rng_;
  // Mid-epoch, the job goes on with the rest of the epoch's order at whatever world size and batch it has now
  // (data/sampler.h); the order itself must be the same.
  const auto examples = static_cast<int64_t>(ds_.train->size());
  if (start_.samples_in_epoch > 0 && (start_.seed != t_.seed || start_.dataset_size != examples))
    DPT_THROW(ConfigError,
              "{} stopped mid-epoch ({} of the epoch's examples consumed) with seed {} and {} examples; continuing "
              "mid-epoch needs the same data order (now seed {}, {} examples). Resume from a checkpoint at an epoch "
              "end, or restore those settings.",
              loaded.path, start_.samples_in_epoch, start_.seed, start_.dataset_size, t_.seed, examples);
  if (start_.samples_in_epoch >= examples && start_.samples_in_epoch > 0)
    DPT_THROW(CheckpointError, "{}: its position, {} examples into the epoch, is past the epoch's {}", loaded.path,
              start_.samples_in_epoch, examples);
  if (lead_) {
    spdlog::info("resumed from {} (step {}, epoch {}, batch {})", loaded.path, start_.step, start_.epoch + 1,
                 start_.batch_in_epoch);
    const int64_t step_samples = samples_per_step(t_.batch_size, t_.accum_steps, world_);
    if (start_.samples_in_epoch > 0)
      spdlog::info("resumed mid-epoch: {} of epoch {}'s {} examples done; the {} left go on in its order, dealt to "
                   "{} rank(s) x batch {}{}", start_.samples_in_epoch, start_.epoch + 1, examples,
                   examples - start_.samples_in_epoch, world_, t_.batch_size,
                   start_.world_size != world_ || start_.batch_size != t_.batch_size
                       ? fmt::format(" (another geometry: it was {} x {})", start_.world_size, start_.batch_size)
                       : "");
    // Not when nothing is left to train (the run already complete): no step is taken at the new size.
    const bool done = start_.epoch >= t_.epochs || (t_.max_steps > 0 && start_.step >= t_.max_steps);
    if (!done && start_.step_samples > 0 && start_.step_samples != step_samples)
      spdlog::warn("the global batch is now {} examples per optimizer step (it was {}): the steps, the learning-rate "
                   "schedule and the loss curve change with it; train.global_batch_size keeps it whatever the world "
                   "size", step_samples, start_.step_samples);
    if (start_.config_hash != config_hash(user_cfg_)) {
      // Which keys, not only the hashes: a resume that forgot an override of the first run's says which.
      std::vector<std::string> changed = config_changes(to_toml(user_cfg_), start_.config_toml, "the checkpoint");
      const size_t listed = std::min<size_t>(changed.size(), 12);
      spdlog::warn("the config differs from the checkpoint's (hash {} vs {}){}{}{}; continuing with the new one",
                   config_hash(user_cfg_), start_.config_hash, listed > 0 ? ": " : "",
                   fmt::join(changed.begin(), changed.begin() + static_cast<std::ptrdiff_t>(listed), ", "),
                   changed.size() > listed ? fmt::format(" and {} more", changed.size() - listed) : "");
    }
  }
}

// Every rank starts from rank 0's parameters and buffers (identical already; this makes it a guarantee, as DDP's
// broadcast of the module's state at construction); SyncBatchNorm's all-reduce is wired in.
void Trainer::sync_replicas() {
  faults_.replicas_syncing(*model_);
  model_->params_written();  // the broadcast below writes through param_storage()
  dp_->with_full_params([&] {  // ZeRO stage 3: the whole model, for the broadcast and the check
    for (Tensor& part : model_->param_storage())
      pg_.broadcast(part, {.root = 0, .stream = stream_, .what = "initial params"})->wait();
    if (model_->buffers().numel())
      pg_.broadcast(model_->buffers(), {.root = 0, .stream = stream_, .what = "initial buffers"})->wait();
    check_replicas(*model_, pg_, 0, /*with_buffers=*/true);
  }, /*changed=*/true);
  sync_buffers_ = world_ > 1 && cfg_.dist.broadcast_buffers && model_->buffers().numel() > 0;
  if (!cfg_.model.sync_bn || world_ == 1) return;
  // SyncBatchNorm's all-reduces run on this thread in the middle of backward; the host groups' bucket all-reduces
  // would run at the same time on the strategy's communication thread, and two threads may not interleave collectives on one
  // group: buckets are then reduced after backward.
  comm::ProcessGroup& pg = pg_;
  const StreamHandle stream = stream_;
  const size_t n = model_->set_batch_norm_sync([&pg, stream](Tensor& sums) {
    pg.allreduce(sums, {.op = comm::ReduceOp::Sum, .stream = stream, .what = "sync batchnorm"})->block(stream);
  });
  if (lead_)
    spdlog::info("model: SyncBatchNorm in {} layer(s){}", n,
                 overlap_ == wanted_overlap()
                     ? ""
                     : fmt::format("; gradient buckets reduced after backward (no overlap with SyncBatchNorm on {})",
                                   pg_.backend()));
}

// The sampler and the step geometry, and what each step uses.
void Trainer::prepare_steps() {
  sampler_.emplace(data::SamplerOptions{.dataset_size = ds_.train->size(), .rank = rank_, .world_size = world_,
                                        .seed = static_cast<uint64_t>(t_.seed), .shuffle = true,
                                        .drop_last = t_.drop_last});
  loader_options_ = {.batch_size = static_cast<size_t>(t_.batch_size), .drop_last = t_.drop_last,
                     .prefetch = static_cast<size_t>(cfg_.data.prefetch), .pin_memory = device_.is_cuda(),
                     .workers = static_cast<size_t>(cfg_.data.workers)};
  K_ = t_.accum_steps;
  step_samples_ = samples_per_step(t_.batch_size, K_, world_);
  const size_t per_rank = sampler_->num_samples();
  spe_ = batches_for(per_rank);
  if (spe_ == 0)
    DPT_THROW(ConfigError, "no full {}: {} examples per rank, train.batch_size {}{} and train.drop_last = true",
              K_ > 1 ? "step" : "batch", per_rank, t_.batch_size,
              K_ > 1 ? fmt::format(" x {} micro-batches", K_) : "");
  steps_per_epoch_ = (spe_ + K_ - 1) / K_;
  // The schedule's position: epoch x steps_per_epoch_ + the epoch's steps so far, in this run's geometry (an epoch
  // resumed mid-way counts its consumed examples as steps of this geometry's global batch). It ends at total_steps_.
  total_steps_ = run_steps(steps_per_epoch_, t_.epochs);
  const int64_t resumed_at = start_.epoch * steps_per_epoch_ + std::max<int64_t>(start_.samples_in_epoch, 0) / step_samples_;
  if (start_.samples_in_epoch > 0 && start_.epoch == t_.epochs - 1) {
    // Resumed in the last epoch, perhaps at another geometry: the run ends after its remaining examples' steps (as
    // many as an uninterrupted epoch's when nothing changed, or with train.global_batch_size).
    const int64_t after = (batches_for(sampler_->num_samples(static_cast<size_t>(start_.samples_in_epoch))) + K_ - 1) / K_;
    total_steps_ = resumed_at + after;
  }
  // train.max_steps counts the steps taken; after a resume at another geometry those and the schedule's position
  // differ by a constant (the position it resumed at less the steps done).
  int64_t max_total = 0;
  if (t_.max_steps > 0 && !__builtin_add_overflow(t_.max_steps, resumed_at - start_.step, &max_total))
    total_steps_ = std::min(total_steps_, max_total);
  // A warm-up longer than the run (a longer run's train.warmup_epochs, a short train.max_steps trial): the learning
  // rate never reaches train.lr. Said, not refused: a run may be meant to stop early and go on later.
  const double warmup = t_.warmup_steps > 0 ? static_cast<double>(t_.warmup_steps)
                                            : t_.warmup_epochs * static_cast<double>(steps_per_epoch_);
  if (lead_ && warmup > static_cast<double>(total_steps_) && total_steps_ > resumed_at)
    spdlog::warn("the warm-up ({}) is longer than the run's {} optimizer steps: the learning rate never reaches "
                 "train.lr = {} (at most {:.4g}, at the last step)",
                 t_.warmup_steps > 0 ? fmt::format("train.warmup_steps = {}", t_.warmup_steps)
                                     : fmt::format("train.warmup_epochs = {:g}: {:g} steps", t_.warmup_epochs, warmup),
                 total_steps_, t_.lr, lr_at(t_, total_steps_ - 1, steps_per_epoch_, total_steps_));

  ctx_.phase = "setting up training (the data loader)";
  feeder_ = std::make_unique<Feeder>(device_, stream_);
  timer_ = std::make_unique<StepTimer>(*model_);
  step_ = start_.step;
  stop_agreement_ = std::make_unique<StopAgreement>(pg_, step_);
  reporter_ = std::make_unique<Reporter>(
      cfg_, pg_, device_, scaler_, ctx_.memory,
      ReportSetup{.start_step = start_.step, .start_epoch = start_.epoch, .unit = task_->unit(),
                  .row_flops = train_flops_per_row(cfg_.model),
                  .peak_flops = device_.is_cuda() ? cuda::dense_bf16_peak_flops(cuda::device_name(device_.index)) : 0.0,
                  .job = opts_.job});
  stopped_ = t_.max_steps > 0 && step_ >= t_.max_steps;  // resumed at or past the limit: nothing to do
}

// ---- an epoch -----------------------------------------------------------------------------------------------

// A rank's batches in `samples` of its examples: the last partial one dropped or kept (train.drop_last); with
// train.global_batch_size and drop_last, whole optimizer steps only, so that the steps are the same at any world size.
int64_t Trainer::batches_for(size_t samples) const {
  const auto batch = static_cast<size_t>(t_.batch_size);
  auto n = static_cast<int64_t>(t_.drop_last ? samples / batch : (samples + batch - 1) / batch);
  if (t_.global_batch_size > 0 && t_.drop_last) n = n / K_ * K_;
  return n;
}

int64_t Trainer::samples_at(const Epoch& ep, int64_t next_batch) const {
  return ep.sample0 + (next_batch - ep.first_batch) * t_.batch_size * world_;
}

void Trainer::train_epoch(int64_t epoch) {
  // Resumed mid-epoch: the rest of the epoch's order from the examples the job consumed (data/sampler.h), numbered
  // from the optimizer steps those took in this geometry.
  const int64_t sample0 = epoch == start_.epoch ? std::max<int64_t>(start_.samples_in_epoch, 0) : 0;
  const int64_t first_batch = sample0 / step_samples_ * K_;
  std::vector<size_t> indices = sampler_->indices(epoch, static_cast<size_t>(sample0));
  const int64_t batches = batches_for(indices.size());
  indices.resize(std::min(indices.size(), static_cast<size_t>(batches * t_.batch_size)));  // whole steps only
  ds_.train->set_epoch(epoch);  // the epoch's random transforms
  Epoch ep{.index = epoch, .first_batch = first_batch, .end_batch = first_batch + batches,
           .last_rows = batches > 0 ? static_cast<int64_t>(indices.size()) - (batches - 1) * t_.batch_size : 0,
           .sample0 = sample0, .first_step = step_, .stats = Tensor::zeros({3}, DType::F64, device_),
           .carried_loss = sample0 > 0 ? start_.epoch_loss_sum : 0.0,
           .carried_count = sample0 > 0 ? start_.epoch_loss_count : 0.0,
           .grad_ss = Tensor::zeros({1}, DType::F64, device_)};
  if (batches == 0) {  // resumed where drop_last leaves no full batch (or step) of the epoch at this geometry
    if (lead_)
      spdlog::info("epoch {}: its {} examples left make no full {} at {} rank(s) x batch {} (train.drop_last): the "
                   "epoch ends with the steps before the checkpoint", epoch + 1,
                   static_cast<int64_t>(ds_.train->size()) - sample0, t_.global_batch_size > 0 ? "step" : "batch",
                   world_, t_.batch_size);
    // It ends all the same, as an uninterrupted epoch does: its line (the training figures the checkpoint carried,
    // the learning rate of its last step), its evaluation, its checkpoint.
    ep.lr = lr_at(t_, std::max<int64_t>(epoch * steps_per_epoch_ + first_batch / K_ - 1, 0), steps_per_epoch_,
                  total_steps_);
    timer_->reset();
    reporter_->epoch_started();
    end_epoch(ep);
    return;
  }
  if (faults_.logs_samples()) ep.indices = indices;
  data::Loader loader(*ds_.train, std::move(indices), loader_options_);
  ep.loader = &loader;
  DPT_CHECK_EQ(static_cast<int64_t>(loader.num_batches()), batches);
  if (step_graph_) step_graph_->invalidate();  // this epoch's loss sums; the evaluation before it
  timer_->reset();
  reporter_->epoch_started();
  while (std::optional<data::Batch> host_batch = loader.next()) {
    const data::Batch& batch = feeder_->put(std::move(*host_batch), loader);
    if (train_batch(ep, batch)) break;
  }
  feeder_->release(loader);
  if (result_.stop_signal) {
    reporter_->stopped();
    return;
  }
  end_epoch(ep);
}

// One micro-batch; after the last of an optimizer step's, the step itself.
bool Trainer::train_batch(Epoch& ep, const data::Batch& batch) {
  const int64_t b = ep.first_batch + static_cast<int64_t>(batch.index);
  const int64_t group_first = b / K_ * K_;  // this optimizer step's micro-batches: [group_first, + group_size)
  const int64_t group_size = std::min(K_, ep.end_batch - group_first);
  const bool last_micro = b == group_first + group_size - 1;
  if (b == group_first) begin_step(ep, b);
  // The step's rows: group_size full micro-batches, less what the epoch's last one lacks when it is in this group.
  const int64_t group_rows = group_size * t_.batch_size -
                             (group_first + group_size == ep.end_batch ? t_.batch_size - ep.last_rows : 0);
  forward_backward(ep, batch, group_rows, b == group_first, last_micro);
  if (!ep.indices.empty())  // DPT_DEBUG_SAMPLE_LOG: which examples this micro-batch trained
    faults_.samples_trained(start_.step, step_ + 1, ep.index, world_,
                            ep.indices.data() + batch.index * static_cast<size_t>(t_.batch_size), batch.size);
  if (!last_micro) return false;
  faults_.backward_done();
  timer_->mark(StepTimer::kBackwardDone);
  dp_->finish_backward();
  timer_->mark(StepTimer::kCommDone);
  const bool applied = update(ep);
  timer_->mark(StepTimer::kUpdateDone);
  if (applied) dp_->after_update();  // ZeRO stages 1, 2: every rank's updated pieces, to every rank
  timer_->mark(StepTimer::kStepEnd);
  ++step_;
  return after_step(ep, b + 1);
}

void Trainer::begin_step(Epoch& ep, int64_t batch) {
  if (first_step_) {
    reset_thread_allocations(device_);
    dp_->reset_gathered_peak();  // ZeRO stage 3: what a step gathers at once (not the start's whole model)
    ctx_.phase = fmt::format("in the first training step (batch {} per rank)", t_.batch_size);
  }
  timer_->mark(StepTimer::kStepStart);
  pg_.set_step(step_ + 1);  // the step these collectives belong to (a hang report names it)
  // The schedule follows the position in this run's epochs, not the raw step count: after a resume at an epoch end
  // with another world size, steps per epoch differ from the checkpoint's run.
  ep.lr = lr_at(t_, ep.index * steps_per_epoch_ + batch / K_, steps_per_epoch_, total_steps_);
  if (!step_graph_) model_->zero_grad();  // (train.cuda_graph: inside the step's graph, forward_backward)
  // DDP's broadcast_buffers: every rank's forward sees rank 0's BatchNorm running statistics.
  if (sync_buffers_) pg_.broadcast(model_->buffers(), {.root = 0, .stream = stream_, .what = "buffers"})->block(stream_);
}

void Trainer::forward_backward(Epoch& ep, const data::Batch& batch, int64_t group_rows, bool first_micro,
                               bool last_micro) {
  task_->prepare(batch);
  // Each micro-batch's loss is a mean over its batch; the step's is the mean over all the step's rows (`group_rows`),
  // so each micro-batch weighs its rows' share: an epoch's last, partial micro-batch beside full ones too, as one
  // batch of them all (for full ones the factor is 1/K exactly). fp16: times the loss scale, so small gradients
  // survive fp16's range.
  const double grad_factor =
      scaler_.scale() * static_cast<double>(batch.size) / static_cast<double>(group_rows);
  const auto gradients = [&] {
    if (step_graph_) model_->zero_grad();  // (else begin_step's)
    loss_.accumulate(model_->forward(task_->input()), task_->targets(), model_->kernels(), ep.stats,
                     /*backward=*/true, grad_factor);
    faults_.loss_grad_ready(step_ + 1, first_micro, loss_.grad(), stream_);
    dp_->begin_backward(/*sync=*/last_micro);  // the first K-1 micro-batches only accumulate
    model_->backward(loss_.grad(), [this](size_t first, size_t end) { dp_->grads_ready(first, end); });
    if (graph_update_) update_staged(ep);  // (one rank: finish_backward has nothing to do)
  };
  // train.cuda_graph: one rank, one micro-batch a step (check_cuda_graph), so that the host work the graph leaves out
  // at a launch (zero_grad's and the forward's decisions, the reducer's bookkeeping) is the same every step. With
  // AdamW the update is in the graph too: this step's learning rate and step count staged on the stream before it.
  if (step_graph_) {
    if (graph_update_) optimizer_->stage(ep.lr, stream_);
    step_graph_->run(*model_, stream_, task_->rows(), faults_.poisons_loss_grad(step_ + 1, first_micro), gradients);
    if (graph_update_) {
      optimizer_->staged_done();  // after run()'s params_written(): the update wrote the bf16 copy
      ep.grad_ss_fresh = t_.clip_grad_norm > 0;
    }
  } else {
    gradients();
  }
  feeder_->step_done();
  ep.seen += task_->rows();
}

// train.cuda_graph with AdamW: update()'s clipping and update as device work only (captured in the step's graph),
// reading the constants Optimizer::stage wrote: the same bits as update().
void Trainer::update_staged(Epoch& ep) {
  const double* clip_ss = nullptr;
  if (t_.clip_grad_norm > 0) {
    dp_->sum_squares_to(model_->kernels(), ep.grad_ss);
    clip_ss = ep.grad_ss.data<double>();
  }
  optimizer_->step_staged(clip_ss, t_.clip_grad_norm);
}

// The averaged gradients (this rank's pieces under ZeRO): clipped, unscaled (fp16, which may skip the step), applied.
// (train.cuda_graph with AdamW: done by the step's graph, update_staged.)
bool Trainer::update(Epoch& ep) {
  if (graph_update_) return true;
  auto& k = model_->kernels();
  auto scale_grads = [&](double alpha) {  // this rank's averaged gradients (all of them, or its ZeRO pieces)
    dp_->for_each_owned([&](float* g, size_t n) { k.scale(g, n, static_cast<float>(alpha)); });
  };
  bool apply = true;
  const double* clip_ss = nullptr;  // clipping in the optimizer's pass (AdamW: inside its fused update)
  if (!scaler_.enabled() && t_.clip_grad_norm > 0) {
    dp_->sum_squares_to(k, ep.grad_ss);
    clip_ss = ep.grad_ss.data<double>();
    ep.grad_ss_fresh = true;
  } else if (scaler_.enabled()) {  // fp16: whether to apply the step is decided on the host
    scale_grads(1.0 / scaler_.scale());
    const double ss = dp_->sum_squares(k);  // host sync
    apply = scaler_.update(/*found_inf=*/!std::isfinite(ss));
    if (t_.clip_grad_norm > 0) {  // as torch.nn.utils.clip_grad_norm_
      // A skipped step's too (inf or NaN, as clip_grad_norm_ returns it; fabs: "nan", not "-nan", in the log).
      ep.grad_norm = std::sqrt(std::fabs(ss));
      const double coef = apply ? models::elementwise::clip_coefficient(ss, t_.clip_grad_norm) : 1.0;
      if (coef < 1.0) scale_grads(coef);
    }
  }
  if (apply) optimizer_->step(ep.lr, clip_ss, t_.clip_grad_norm);
  return apply;
}

// After an optimizer step: reports, checkpoints, and whether the run stops here (train.max_steps, a stop signal).
bool Trainer::after_step(Epoch& ep, int64_t next_batch) {
  const bool epoch_done = next_batch == ep.end_batch;
  if (first_step_) {
    first_step_ = false;
    // ZeRO stage 3: the parameters a rank holds in a step are its shard plus the buckets gathered at once (measured:
    // the first step's most; a checkpoint or the epoch's replica check gathers the whole model for a moment);
    // otherwise the gathered peak is 0.
    ctx_.memory.params = static_cast<int64_t>(dp_->param_bytes() + dp_->gathered_peak_bytes());
    reporter_->first_step(step_);
    if (t_.autotune) autotune();
    if (step_graph_) step_graph_->invalidate();  // the adopted plans' workspaces; the memory measured once
  }
  ctx_.phase.clear();  // no formatting on the hot path: where() formats the step only for an error
  ctx_.step = step_ + 1;
  if (reporter_->progress_due()) reporter_->progress(progress(ep, next_batch));
  if (cfg_.checkpoint.every_steps > 0 && step_ % cfg_.checkpoint.every_steps == 0 && !epoch_done) {
    carry_epoch_loss(ep);
    save(ep.index, next_batch, samples_at(ep, next_batch));
  }
  faults_.step_done(step_, *model_);
  const int64_t save_epoch = epoch_done ? ep.index + 1 : ep.index, save_batch = epoch_done ? 0 : next_batch;
  const int64_t save_samples = epoch_done ? 0 : samples_at(ep, next_batch);
  if (t_.max_steps > 0 && step_ >= t_.max_steps) {
    stopped_ = true;
    if (save_samples > 0) carry_epoch_loss(ep);
    save(save_epoch, save_batch, save_samples);
    return true;
  }
  // Preemption: did any rank get SIGUSR1 or SIGTERM? The ranks ask at the same step boundaries, so they all stop
  // after the same step, none of them inside a collective.
  if (const int sig = stop_agreement_->poll(step_)) {
    if (save_samples > 0) carry_epoch_loss(ep);
    // At the epoch's last step: its figures go into the checkpoint, its evaluation to the resumed run (an
    // evaluation now could outlast the signal's grace period: the launcher's --stop-timeout, Slurm's USR1@T).
    if (epoch_done) pending_epoch_ = measure_epoch(ep);
    stop_for_signal(sig, save_epoch, save_batch, save_samples);
    return true;
  }
  return false;
}

// train.autotune, after this process's first step (every plan of a training step made): each rank times its
// cuBLASLt plans' candidates, its cuDNN attention graphs' plans and its convolutions' algorithms on scratch operands
// and keeps the faster ones (Kernels::sweep_library_choices).
void Trainer::autotune() {
  constexpr int kCandidates = 8, kReps = 5;
  const auto t0 = Clock::now();
  model_->kernels().set_autotune_bf16_grads(t_.autotune_bf16_grads);
  const std::vector<std::string> lines =
      model_->kernels().sweep_library_choices(kCandidates, kReps, models::Kernels::kTuneMargin);
  if (lines.empty()) {
    spdlog::info("train.autotune: no library plan to tune on {}", model_->kernels().device().str());
    return;
  }
  int64_t timed = 0, adopted = 0;
  for (const std::string& line : lines) {
    // A sticky CUDA error stopped the sweep: the device is unusable, and the run stops here, saying why.
    if (line.find(" sweep stopped: ") != std::string::npos) DPT_THROW(DeviceError, "train.autotune: {}", line);
    if (line.find(": failed: ") != std::string::npos) spdlog::warn("train.autotune: {}", line);
    if (line.find(": chosen ") != std::string::npos) ++timed;
    if (line.find("; adopted") == std::string::npos) continue;
    ++adopted;
    spdlog::info("train.autotune: {}", line);
  }
  spdlog::info("train.autotune: {} of {} plan(s) timed with up to {} candidates each (a convolution's direction: every "
               "algorithm cuDNN has for it) in {:.1f} s; {} now run a faster one", timed, lines.size(), kCandidates,
               seconds_since(t0), adopted);
}

// Before a mid-epoch checkpoint, on every rank (a collective, at a step boundary all ranks share): the epoch's
// summed loss and counted targets over every rank so far, with what a resume carried in, for save()'s TrainState.
void Trainer::carry_epoch_loss(const Epoch& ep) {
  const auto [loss_sum, counted] = ep.loss_and_count();
  Tensor t = Tensor::empty({2}, DType::F64);
  t.data<double>()[0] = loss_sum;
  t.data<double>()[1] = counted;
  pg_.allreduce(t, {.op = comm::ReduceOp::Sum, .what = "the epoch's loss for the checkpoint"})->wait();
  epoch_loss_carry_ = {t.data<double>()[0] + ep.carried_loss, t.data<double>()[1] + ep.carried_count};
}

// The progress line's figures (a host synchronisation: the loss so far, and the gradient norm when clipping).
Progress Trainer::progress(Epoch& ep, int64_t next_batch) {
  if (ep.grad_ss_fresh) ep.grad_norm = std::sqrt(ep.grad_ss.to(Device::cpu()).data<double>()[0]);
  const double elapsed = seconds_since(ep.t0);
  // The batches left in the epoch and the run, and the evaluations to come, capped by train.max_steps.
  const WorkLeft left = work_left(step_, ep.index, t_.epochs, next_batch, ep.end_batch, spe_, K_, t_.max_steps);
  // Resumed mid-epoch: the epoch's steps before the checkpoint count too (as in the epoch's train_loss), so the
  // running mean goes on where the interrupted run left it.
  auto [loss_sum, counted] = ep.loss_and_count();
  loss_sum += ep.carried_loss;
  counted += ep.carried_count;
  return {.step = step_, .epoch = ep.index, .batch = next_batch, .batches = ep.end_batch,
          .epoch_step = (next_batch + K_ - 1) / K_, .epoch_steps = (ep.end_batch + K_ - 1) / K_,
          .loss = counted > 0 ? loss_sum / counted : 0.0, .lr = ep.lr,
          .grad_norm = t_.clip_grad_norm > 0 ? ep.grad_norm : -1.0, .rows = ep.seen, .elapsed_s = elapsed,
          .eta = estimate_eta(next_batch - ep.first_batch, elapsed, left.epoch_batches, left.run_batches,
                              left.evaluations, last_eval_s_)};
}

// After an epoch's steps: its figures from every rank, the replica check, evaluation, the reports, a checkpoint.
// The epoch's figures but the evaluation's: training loss over every rank's counted targets, throughput over every
// rank's rows, rank 0's time split; every rank's timings gathered (Reporter::epoch_measured). Collective.
PendingEpoch Trainer::measure_epoch(Epoch& ep) {
  const auto [loss_sum, counted] = ep.loss_and_count();  // waits for the epoch's last step
  const double compute_s = timer_->compute_s(), comm_s = timer_->comm_s();
  const double data_wait_s = ep.loader ? ep.loader->wait_seconds() : 0.0;
  const double epoch_s = seconds_since(ep.t0);
  reporter_->epoch_measured(
      {.compute_s = compute_s, .data_wait_s = data_wait_s, .comm_s = comm_s, .steps = step_ - ep.first_step});
  Tensor tl = Tensor::empty({3}, DType::F64);
  tl.data<double>()[0] = loss_sum;
  tl.data<double>()[1] = static_cast<double>(ep.seen);
  tl.data<double>()[2] = counted;
  pg_.allreduce(tl, {.op = comm::ReduceOp::Sum, .what = "loss stats"})->wait();
  tl.data<double>()[0] += ep.carried_loss;  // resumed mid-epoch: the steps before the checkpoint too
  tl.data<double>()[2] += ep.carried_count;
  const double global_seen = tl.data<double>()[1], global_counted = tl.data<double>()[2];
  // Loss masks that mask every target (a mask file of zeros) train nothing, and the loss reads 0: said, not hidden.
  if (lead_ && global_seen > 0 && global_counted == 0)
    spdlog::warn("epoch {} trained no target: the loss masks beside the training shards mask every token of its "
                 "windows, so nothing was learned (its loss reads 0); check the .mask files in {}", ep.index + 1,
                 cfg_.data.dir);
  return {.epoch = ep.index + 1, .train_loss = global_counted > 0 ? tl.data<double>()[0] / global_counted : 0.0,
          .samples_per_s = epoch_s > 0 ? global_seen / epoch_s : 0.0, .compute_s = compute_s, .comm_s = comm_s,
          .data_s = data_wait_s, .lr = ep.lr, .epoch_s = epoch_s};
}

void Trainer::end_epoch(Epoch& ep) {
  ctx_.phase = fmt::format("evaluating after epoch {} (train.eval_batch_size {})", ep.index + 1, t_.eval_batch_size);
  const PendingEpoch m = measure_epoch(ep);
  check_replicas(*model_, pg_, ep.index + 1, /*with_buffers=*/false, dp_.get());
  evaluate_and_report(m, /*after_resume=*/false);
  const bool last_epoch = ep.index + 1 == t_.epochs;
  const bool epoch_due = cfg_.checkpoint.every_epochs > 0 && (ep.index + 1) % cfg_.checkpoint.every_epochs == 0;
  const bool step_due = cfg_.checkpoint.every_steps > 0 && step_ % cfg_.checkpoint.every_steps == 0;
  if (!stopped_ && (last_epoch || epoch_due || step_due)) save(ep.index + 1, 0, 0);
}

// Resumed from a stop signal's checkpoint at an epoch's end: that epoch's evaluation (of the model the checkpoint
// holds, which the epoch ended with) and its line, with the training figures the stopped run measured. No
// checkpoint: the one resumed from is this one.
void Trainer::report_pending_epoch() {
  const PendingEpoch& p = start_.pending_epoch;
  ctx_.phase = fmt::format("evaluating epoch {}, which a stop signal ended (train.eval_batch_size {})", p.epoch,
                           t_.eval_batch_size);
  evaluate_and_report(p, /*after_resume=*/true);
  ctx_.phase.clear();
}

// An epoch's evaluation (collective), with its training figures `m`: the run's result, its line and record.
void Trainer::evaluate_and_report(const PendingEpoch& m, bool after_resume) {
  const auto eval_t0 = Clock::now();
  const EvalResult ev = evaluate_saved_model();
  last_eval_s_ = seconds_since(eval_t0);
  const EpochStats es{.epoch = m.epoch, .train_loss = m.train_loss, .test_loss = ev.loss, .test_acc = ev.acc,
                      .samples_per_s = m.samples_per_s, .compute_s = m.compute_s, .comm_s = m.comm_s,
                      .data_s = m.data_s};
  result_.epochs.push_back(es);
  result_.final_test_acc = ev.acc;
  result_.final_test_loss = ev.loss;
  reporter_->epoch_done({.step = step_, .stats = es, .lr = m.lr, .epoch_s = m.epoch_s, .max_steps_reached = stopped_,
                         .evaluated_after_resume = after_resume});
}

// The test figures of the model a checkpoint holds: rank 0's parameters and rank 0's buffers. Parameters are equal
// on every rank (checked above), but BatchNorm's running statistics are not: each rank updates its own from its own
// batches (with dist.broadcast_buffers, during the last step since the broadcast before it; without, all run long),
// so every rank first takes rank 0's, whatever dist.broadcast_buffers says (as DDP's forward would for an
// evaluation through the DDP module with broadcast_buffers on, but also with it off: rank 0's are the ones saved).
// No training step changes: in training mode BatchNorm normalises with batch statistics (SyncBatchNorm: the ranks'
// together) and only folds them into the running ones, which nothing but an evaluation reads; and only rank 0's are
// saved. (Without dist.broadcast_buffers rank r's statistics go on from rank 0's after each evaluation, as they
// would after a resume.)
EvalResult Trainer::evaluate_saved_model() {
  if (world_ > 1 && model_->buffers().numel() > 0)
    pg_.broadcast(model_->buffers(), {.root = 0, .stream = stream_, .what = "buffers for evaluation"})->block(stream_);
  return evaluate(*model_, *task_, *ds_.test, t_, static_cast<size_t>(cfg_.data.workers), pg_);
}

// ---- checkpoints, the end -----------------------------------------------------------------------------------

// A checkpoint of this step (once), to continue with batch `next_batch` of `epoch` (0-based): rank 0 writes it under
// DDP; under ZeRO every rank writes its optimizer shard beside rank 0's model (collective). A write that fails stops
// the run (checkpoint.on_error = stop), or is reported and training goes on (warn; under ZeRO every rank gets the
// same CheckpointError, so every rank goes on).
void Trainer::save(int64_t epoch, int64_t next_batch, int64_t samples) {
  const bool sharded = optimizer_->sharded();
  if ((!lead_ && !sharded) || saved_at_ == step_) return;
  saved_at_ = step_;
  if (step_graph_) step_graph_->invalidate();  // (the writer reads the model; nothing it touches is trusted to stay)
  TrainState st{.step = step_, .epoch = epoch, .batch_in_epoch = next_batch, .samples_in_epoch = samples,
                .world_size = world_, .batch_size = t_.batch_size, .step_samples = step_samples_, .seed = t_.seed, .dataset_size = static_cast<int64_t>(ds_.train->size()),
                .drop_last = t_.drop_last, .rng = "", .optimizer_steps = optimizer_->steps(),
                .loss_scale = scaler_.enabled() ? scaler_.scale() : 0.0,
                .scale_growth_tracker = scaler_.growth_tracker(), .skipped_steps = scaler_.skipped(),
                .config_toml = to_toml(user_cfg_), .config_hash = config_hash(user_cfg_), .classes = ds_.classes,
                .epoch_loss_sum = samples > 0 ? epoch_loss_carry_.first : 0.0,
                .epoch_loss_count = samples > 0 ? epoch_loss_carry_.second : 0.0, .job = opts_.job,
                .pending_epoch = std::exchange(pending_epoch_, PendingEpoch{})};
  epoch_loss_carry_ = {0.0, 0.0};  // used once: a mid-epoch save without carry_epoch_loss before it stores 0
  std::ostringstream os;
  os << rng_;
  st.rng = os.str();
  const auto t0 = Clock::now();
  std::string written;
  try {
    if (sharded) {
      OptimizerShard shard = optimizer_->shard();
      shard.slots = on_host(std::move(shard.slots));
      std::vector<NamedTensor> model_state = dp_->model_state_on_host(lead_);
      // Every rank writes a part: they agree first (rank 0 holds the whole model) that the weights are finite.
      Tensor bad = Tensor::empty({1}, DType::F64);
      const auto [name, count] = first_nonfinite(model_state);
      bad.data<double>()[0] = static_cast<double>(count);
      pg_.allreduce(bad, {.op = comm::ReduceOp::Max, .what = "whether the weights are finite"})->wait();
      if (bad.data<double>()[0] > 0) throw_nonfinite(name, static_cast<size_t>(bad.data<double>()[0]));
      written = ckpt_->save_sharded(std::move(model_state), shard, st, pg_);
    } else {
      std::vector<NamedTensor> model_state = on_host(model_->state());
      if (const auto [name, count] = first_nonfinite(model_state); count > 0) throw_nonfinite(name, count);
      written = ckpt_->save(std::move(model_state), on_host(optimizer_->state()), st);
    }
  } catch (const CheckpointError& e) {
    if (cfg_.checkpoint.on_error != OnCheckpointError::warn)
      DPT_THROW(CheckpointError, "{}; the run stops (checkpoint.on_error = stop; with warn it would train on without "
                "this checkpoint)", e.what());
    ++result_.checkpoint_failures;
    result_.failed_checkpoint_step = step_;
    result_.checkpoint_error = e.what();
    reporter_->checkpoint_failed(result_, next_batch == 0 ? epoch - 1 : epoch);
    return;
  }
  result_.last_checkpoint = written;
  result_.last_checkpoint_step = step_;
  if (lead_) spdlog::info("checkpoint {} ({:.2f} s)", result_.last_checkpoint, seconds_since(t0));
}

// A diverged run (the loss went NaN: train.lr too high, no clipping) is not checkpointed: its weights would push good
// checkpoints out (checkpoint.keep) and nothing could resume from them. checkpoint.on_error decides the rest: stop
// (the run ends with exit 1, the earlier checkpoints kept) or warn (training goes on, no checkpoint written).
void Trainer::throw_nonfinite(const std::string& name, size_t count) const {
  DPT_THROW(CheckpointError, "checkpoint of step {} not written: the weights are not finite ({}{} holds {} NaN or "
            "infinite value(s)): the training diverged; the earlier checkpoints are kept. Lower train.lr, or clip "
            "the gradients (train.clip_grad_norm), or warm up (train.warmup_steps)", step_,
            name.empty() ? "on another rank: " : "", name.empty() ? "a tensor" : name, count);
}

// Some rank got SIGUSR1 or SIGTERM: rank 0 checkpoints this step, and nobody leaves before it is written.
void Trainer::stop_for_signal(int sig, int64_t epoch, int64_t next_batch, int64_t samples) {
  result_.stop_signal = sig;
  save(epoch, next_batch, samples);
  pg_.barrier()->wait();
  if (lead_)
    spdlog::info("stopping for {} at step {} ({}; {})",
                 sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : std::to_string(sig), step_,
                 stop_signal() ? fmt::format("{:.2f} s after the signal", seconds_since_stop_signal())
                               : "another rank received it",
                 result_.failed_checkpoint_step == step_ ? std::string("its checkpoint not written")
                                                         : "checkpoint " + result_.last_checkpoint);
}

void Trainer::finish() {
  result_.steps = step_;
  if (lead_ && model_->bf16_activations())  // AdamW writes the copy in its pass (Model::params16_written)
    spdlog::debug("the fast path's bf16 copy of the parameters: rounded by {} training forward(s) in this run; the "
                  "others read the copy the optimizer's update wrote", model_->params16_roundings());
  if (step_graph_) {
    result_.cuda_graph_launches = step_graph_->launches();
    result_.cuda_graph_captures = step_graph_->captures();
  }
  if (lead_ && step_graph_)
    spdlog::info("train.cuda_graph: {} step(s) launched from a CUDA graph ({} capture(s), {} nodes; {}), {} eager "
                 "(the first after an epoch's start, a checkpoint or train.autotune, and at a change of batch size or "
                 "of whether the forward reads the update's bf16 copy)",
                 step_graph_->launches(), step_graph_->captures(), step_graph_->nodes(),
                 graph_update_ ? "the clipping and AdamW inside, their lr and step staged per launch"
                               : "the optimizer's update after each launch",
                 step_graph_->eager_steps());
  if (result_.epochs.empty() && !result_.stop_signal) {
    // Nothing left to train (resumed at the end): where the model stands.
    const EvalResult ev = evaluate_saved_model();
    result_.final_test_acc = ev.acc;
    result_.final_test_loss = ev.loss;
  }
  reporter_->finished(result_);
}

}  // namespace

RunResult train(const Config& cfg, const RunOptions& opts, comm::ProcessGroup& pg) {
  RunContext ctx;
  Config run_cfg = cfg;
  run_cfg.train = with_step_geometry(cfg.train, pg.size());  // train.global_batch_size, for this world size
  try {
    return Trainer(run_cfg, cfg, opts, pg, ctx).run();
  } catch (const OutOfMemoryError& e) {
    const TrainConfig& t = run_cfg.train;
    DPT_THROW(OutOfMemoryError, "{} {}", e.what(),
              out_of_memory_advice(ctx.where(), ctx.memory, t.batch_size, t.eval_batch_size, t.accum_steps,
                                   t.precision, pg.size(), cfg.dist.zero, t.global_batch_size, cfg.train.batch_size));
  }
}

}  // namespace dpt::trainer
