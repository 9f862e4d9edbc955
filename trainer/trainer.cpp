// trainer/trainer.cpp: the training loop.
#include "trainer/trainer.h"

#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <limits>
#include <cstdlib>
#include <random>
#include <sstream>
#include <thread>

#include "core/cuda.h"
#include "core/logging.h"
#include "core/memory.h"
#include "data/augmented.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/subset.h"
#include "data/synthetic.h"
#include "data/token_dataset.h"
#include "models/kernels/cpu/cpu_kernels.h"
#include "models/kernels/elementwise.h"
#include "models/model.h"
#include "trainer/build_model.h"
#include "trainer/checkpoint.h"
#include "trainer/task.h"
#include "trainer/loss_scaler.h"
#include "trainer/feeder.h"
#include "trainer/metrics.h"
#include "trainer/optimizer.h"
#include "trainer/plot.h"
#include "trainer/preemption.h"
#include "trainer/reducer.h"
#include "trainer/run_report.h"
#include "trainer/schedule.h"

namespace dpt::trainer {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Fault injection for tests of failure handling and resume: DPT_DEBUG_FAIL_AT_STEP=N makes rank
// DPT_DEBUG_FAIL_RANK (default 0) throw once it has finished optimizer step N.
// DPT_DEBUG_DIVERGE_RANK=R makes rank R nudge one parameter after its first step, so that the replica
// check has something to find; DPT_DEBUG_PERTURB_BUFFERS_RANK=R makes rank R scale its buffers before the
// initial broadcast, which must undo it; DPT_DEBUG_INF_AT_STEP=N makes rank 0 put an inf into the loss
// gradient of optimizer step N (1-based), an overflow that fp16 loss scaling must skip (tests only).
// DPT_DEBUG_SLOW_RANK=R with DPT_DEBUG_SLOW_MS=M makes rank R sleep M ms in each step's compute (a straggler).
struct FailureInjection {
  int64_t step = -1;
  int rank = 0;
  int diverge_rank = -1;
  int perturb_buffers_rank = -1;
  int64_t inf_step = -1;
  int slow_rank = -1;
  int slow_ms = 0;
  static FailureInjection from_env() {
    FailureInjection f;
    if (const char* s = std::getenv("DPT_DEBUG_SLOW_RANK")) f.slow_rank = std::atoi(s);
    if (const char* s = std::getenv("DPT_DEBUG_SLOW_MS")) f.slow_ms = std::atoi(s);
    if (const char* s = std::getenv("DPT_DEBUG_INF_AT_STEP")) f.inf_step = std::atoll(s);
    if (const char* b = std::getenv("DPT_DEBUG_PERTURB_BUFFERS_RANK")) f.perturb_buffers_rank = std::atoi(b);
    if (const char* s = std::getenv("DPT_DEBUG_FAIL_AT_STEP")) f.step = std::atoll(s);
    if (const char* r = std::getenv("DPT_DEBUG_FAIL_RANK")) f.rank = std::atoi(r);
    if (const char* d = std::getenv("DPT_DEBUG_DIVERGE_RANK")) f.diverge_rank = std::atoi(d);
    return f;
  }
};

struct Datasets {
  std::unique_ptr<data::Dataset> train, test;
};

// The first `limit` examples of an evenly strided pass over `d` (image folders are sorted by class: every
// class keeps its share).
std::unique_ptr<data::Dataset> limited(std::unique_ptr<data::Dataset> d, int64_t limit) {
  if (limit <= 0 || static_cast<size_t>(limit) >= d->size()) return d;
  const size_t stride = d->size() / static_cast<size_t>(limit);
  return std::make_unique<data::Subset>(std::shared_ptr<data::Dataset>(std::move(d)), 0, static_cast<size_t>(limit),
                                        stride);
}

Datasets make_datasets(const DataConfig& d, const ModelConfig& m, uint64_t seed) {
  Datasets ds;
  const auto mode = data::parse_transform_mode(d.augment);
  if (d.dataset == "fashion-mnist") {
    if (mode == data::TransformMode::random_resized_crop)
      DPT_THROW(ConfigError, "data.augment = random_resized_crop is for image folders; Fashion-MNIST takes none or crop_flip");
    auto train = data::load_fashion_mnist(d.dir, true, static_cast<size_t>(d.train_limit));
    if (mode == data::TransformMode::crop_flip) {
      const auto options = data::AugmentedDataset::crop_flip(*train, d.padding, seed);
      ds.train = std::make_unique<data::AugmentedDataset>(std::move(train), options);
    } else {
      ds.train = std::move(train);
    }
    ds.test = data::load_fashion_mnist(d.dir, false, static_cast<size_t>(d.test_limit));
  } else if (d.dataset == "tokens") {
    ds.train = limited(std::make_unique<data::TokenWindowDataset>(d.dir, "train", m.block_size, m.vocab_size),
                       d.train_limit);
    ds.test = limited(std::make_unique<data::TokenWindowDataset>(d.dir, "val", m.block_size, m.vocab_size),
                      d.test_limit);
  } else if (d.dataset == "imagefolder") {
    data::ImageFolderOptions o;
    o.dir = d.dir;
    o.image_size = d.image_size;
    o.resize = d.resize;
    o.padding = d.padding;
    o.augment = mode;
    o.mean.assign(d.mean.begin(), d.mean.end());
    o.std.assign(d.std.begin(), d.std.end());
    o.channels = static_cast<int>(d.channels);
    o.skip_bad_images = d.skip_bad_images;
    o.seed = seed;
    ds.train = limited(data::make_image_folder(o, true), d.train_limit);
    ds.test = limited(data::make_image_folder(o, false), d.test_limit);
  } else {
    // One synthetic set split in two: the same labelling function, disjoint examples.
    const auto n_train = static_cast<size_t>(d.synthetic_train_size), n_test = static_cast<size_t>(d.synthetic_test_size);
    int64_t features = 1;
    for (int64_t dim : d.synthetic_shape) features *= dim;
    auto all = std::make_shared<data::SyntheticDataset>(n_train + n_test, static_cast<size_t>(features), 10, seed,
                                                        d.synthetic_shape);
    ds.train = std::make_unique<data::Subset>(all, 0, n_train);
    ds.test = std::make_unique<data::Subset>(all, n_train, n_test);
  }
  return ds;
}

struct EvalResult {
  double loss = 0, acc = 0;
  double rows = 0;  // examples or tokens evaluated, over all ranks
};

// Loss and accuracy over the whole test set: each rank evaluates its exact shard, the sums are reduced.
EvalResult evaluate(models::Model& model, Task& task, const data::Dataset& test, const TrainConfig& t,
                    size_t workers, comm::ProcessGroup& pg) {
  const Device device = model.device();
  data::LoaderOptions lo{.batch_size = static_cast<size_t>(t.eval_batch_size), .drop_last = false, .prefetch = 2,
                         .pin_memory = device.is_cuda(), .workers = workers};
  data::Loader loader(test, data::eval_shard(test.size(), pg.rank(), pg.size()), lo);
  Feeder feeder(device, model.kernels().stream());
  models::SoftmaxCrossEntropy loss;
  Tensor stats = Tensor::zeros({2}, DType::F64, device);  // loss sum, correct: accumulated on the device
  double count = 0;
  model.set_training(false);  // BatchNorm: running statistics
  struct BackToTraining {
    models::Model& m;
    ~BackToTraining() { m.set_training(true); }
  } back{model};
  while (auto host = loader.next()) {
    const data::Batch& batch = feeder.put(std::move(*host), loader);
    task.prepare(batch);
    loss.accumulate(model.forward(task.input()), task.targets(), model.kernels(), stats, /*backward=*/false);
    feeder.step_done();
    count += static_cast<double>(task.rows());
  }
  feeder.release(loader);
  Tensor sums = Tensor::empty({3}, DType::F64);
  const Tensor host_stats = stats.to(Device::cpu());
  double* s = sums.data<double>();
  s[0] = host_stats.data<double>()[0];
  s[1] = host_stats.data<double>()[1];
  s[2] = count;
  pg.allreduce(sums, {.op = comm::ReduceOp::Sum, .what = "eval stats"})->wait();
  DPT_CHECK_GT(s[2], 0.0);
  return {s[0] / s[2], s[1] / s[2], s[2]};
}

// Where a step's time goes. CPU: host clocks around the phases. GPU: CUDA events on the compute stream,
// read two steps later: the host waits for step N-2's last event, so it runs at most two steps ahead of
// the GPU (enough to overlap the next batch's copy with the current step).
class StepTimer {
 public:
  explicit StepTimer(const models::Model& model) : stream_(model.kernels().stream()) {
    if (model.device().is_cuda())
      for (auto& e : events_)
        for (auto& ev : e.ev) ev = std::make_unique<cuda::Event>(/*timing=*/true);
  }
  // Marks: step start, backward done (comm starts), comm done (optimizer starts), step end.
  void mark(int phase) {
    if (!stream_) {
      host_[phase] = Clock::now();
      if (phase == 3) {
        compute_s_ += std::chrono::duration<double>(host_[1] - host_[0]).count() +
                      std::chrono::duration<double>(host_[3] - host_[2]).count();
        comm_s_ += std::chrono::duration<double>(host_[2] - host_[1]).count();
      }
      return;
    }
    Slot& s = events_[step_ % 2];
    if (phase == 0 && s.recorded) collect(s);
    s.ev[phase]->record(stream_);
    if (phase == 3) {
      s.recorded = true;
      ++step_;
    }
  }
  // The totals so far (GPU: waits for the last steps' events).
  double compute_s() { flush(); return compute_s_; }
  double comm_s() { flush(); return comm_s_; }
  void reset() {
    flush();
    compute_s_ = comm_s_ = 0;
  }

 private:
  struct Slot {
    std::array<std::unique_ptr<cuda::Event>, 4> ev;
    bool recorded = false;
  };
  void collect(Slot& s) {
    s.ev[3]->synchronize();
    compute_s_ += (s.ev[1]->elapsed_ms_since(*s.ev[0]) + s.ev[3]->elapsed_ms_since(*s.ev[2])) / 1000.0;
    comm_s_ += s.ev[2]->elapsed_ms_since(*s.ev[1]) / 1000.0;
    s.recorded = false;
  }
  void flush() {
    for (auto& s : events_)
      if (s.recorded) collect(s);
  }
  StreamHandle stream_;
  std::array<Clock::time_point, 4> host_{};
  std::array<Slot, 2> events_;
  size_t step_ = 0;
  double compute_s_ = 0, comm_s_ = 0;
};

void copy_named(const std::vector<NamedTensor>& into, const SafetensorsFile& from, const std::string& what,
                const std::string& path) {
  if (from.tensors.size() != into.size())
    DPT_THROW(CheckpointError, "{}: {} has {} tensors, this run expects {} (model or optimizer config changed?)", path,
              what, from.tensors.size(), into.size());
  for (const auto& nt : into) {
    const Tensor* src = from.find(nt.name);
    if (!src) DPT_THROW(CheckpointError, "{}: {} lacks tensor {} (model or optimizer config changed?)", path, what, nt.name);
    if (src->shape() != nt.tensor.shape() || src->dtype() != nt.tensor.dtype())
      DPT_THROW(CheckpointError, "{}: {} has {} {} {}, this model expects {} {}", path, what, nt.name,
                dtype_name(src->dtype()), src->shape_str(), dtype_name(nt.tensor.dtype()), nt.tensor.shape_str());
    Tensor dst = nt.tensor;
    dst.copy_from(*src);
  }
}

// Host copies of device tensors, for the checkpoint writer (host tensors pass through).
std::vector<NamedTensor> on_host(std::vector<NamedTensor> tensors) {
  for (auto& nt : tensors) nt.tensor = nt.tensor.to(Device::cpu());
  return tensors;
}

// Clips the global L2 norm (the square root of `sum_squares`) of the (averaged, so identical on every rank)
// gradients to max_norm, as torch.nn.utils.clip_grad_norm_: scaled by max_norm / (norm + 1e-6) when that is
// below 1. Returns the norm.
double clip_gradients(models::Model& model, double max_norm, double sum_squares) {
  const double coef = models::elementwise::clip_coefficient(sum_squares, max_norm);
  if (coef < 1.0) model.kernels().scale(model.grads().data<float>(), model.num_params(), static_cast<float>(coef));
  return std::sqrt(sum_squares);
}

models::Precision parse_precision(const std::string& p) {
  if (p == "bf16") return models::Precision::BF16;
  if (p == "fp16") return models::Precision::F16;
  DPT_CHECK(p == "fp32", "train.precision = {}", p);
  return models::Precision::F32;
}

// DDP's promise, checked once an epoch: every rank holds bit-identical parameters (a CRC32 of them,
// compared through a Max all-reduce of it and of its negation); at the start, after the broadcast, the
// buffers too (later each rank's forward moves its own BatchNorm statistics).
void check_replicas(const models::Model& model, comm::ProcessGroup& pg, int64_t epoch, bool with_buffers = false) {
  if (pg.size() == 1) return;
  const Tensor host = model.params().to(Device::cpu());
  uLong crc_value = crc32(0L, static_cast<const Bytef*>(host.raw()), static_cast<uInt>(host.bytes()));
  if (with_buffers && model.buffers().numel()) {
    const Tensor b = model.buffers().to(Device::cpu());
    crc_value = crc32(crc_value, static_cast<const Bytef*>(b.raw()), static_cast<uInt>(b.bytes()));
  }
  const auto crc = static_cast<int64_t>(crc_value);
  Tensor c = Tensor::empty({2}, DType::I64);
  c.data<int64_t>()[0] = crc;
  c.data<int64_t>()[1] = -crc;
  pg.allreduce(c, {.op = comm::ReduceOp::Max, .what = "replica check"})->wait();
  if (c.data<int64_t>()[0] != -c.data<int64_t>()[1])
    DPT_THROW(InternalError, "[rank {}] parameters{} differ between ranks {} (CRC32 {:08x} here)", pg.rank(),
              with_buffers ? " or buffers" : "", epoch > 0 ? fmt::format("after epoch {}", epoch) : "at the start",
              static_cast<uint32_t>(crc));
}

std::string bucket_summary(const std::vector<Bucket>& buckets) {
  std::vector<std::string> parts;
  for (const auto& b : buckets) parts.push_back(fmt::format("{:.2f} MB", static_cast<double>(b.count) * 4 / 1e6));
  return fmt::format("sizes {} (last layers first)", fmt::join(parts, ", "));
}

// Whether any rank received a stop signal (trainer/preemption.h), the same answer on every rank. The ranks ask at
// agreed step boundaries about every kInterval seconds (every step when a step takes longer), so that a short
// step does not pay for a collective each time: one all-reduce of {signal, -(steps to the next check)} with
// MAX gives every rank the signal (the largest number if several) and the smallest proposed interval. With one
// rank it asks every step, for free. A stopped run's checkpoint is of the step it stopped at, so when the
// checks happen changes nothing but how soon a run stops.
class StopAgreement {
 public:
  static constexpr double kInterval = 0.2;  // seconds between checks

  StopAgreement(comm::ProcessGroup& pg, int64_t step) : pg_(pg), next_(step + 1), last_step_(step) {}

  // Called at every optimizer step boundary with the steps done so far; 0 or the signal.
  int poll(int64_t step) {
    if (pg_.size() == 1) return stop_signal();
    if (step < next_) return 0;
    const double per_step = seconds_since(last_t_) / static_cast<double>(std::max<int64_t>(1, step - last_step_));
    const int64_t propose = per_step > 0 ? std::clamp<int64_t>(static_cast<int64_t>(kInterval / per_step), 1, 1000) : 1;
    Tensor t = Tensor::empty({2}, DType::I64);
    t.data<int64_t>()[0] = stop_signal();
    t.data<int64_t>()[1] = -propose;
    pg_.allreduce(t, {.op = comm::ReduceOp::Max, .what = "stop signal"})->wait();
    next_ = step - t.data<int64_t>()[1];
    last_step_ = step;
    last_t_ = Clock::now();
    return static_cast<int>(t.data<int64_t>()[0]);
  }

 private:
  comm::ProcessGroup& pg_;
  int64_t next_;       // the step boundary of the next check
  int64_t last_step_;  // and of the last one
  Clock::time_point last_t_ = Clock::now();
};

}  // namespace

Device choose_device(const std::string& requested, int local_rank, int device_count, const std::string& why_none) {
  if (requested == "cpu") return Device::cpu();
  if (requested != "auto" && requested != "cuda")
    DPT_THROW(ConfigError, "train.device = '{}': must be one of auto, cpu, cuda", requested);
  if (device_count > 0) return Device::cuda(std::max(local_rank, 0) % device_count);
  if (requested == "cuda")
    DPT_THROW(ConfigError, "train.device = cuda, but there is no usable GPU ({}); use train.device = auto or cpu",
              why_none);
  return Device::cpu();
}

namespace {

// Where a run is and what it holds, for the out-of-memory message (out_of_memory_advice).
struct RunContext {
  std::string phase = "loading the data";  // empty while training: `step` says where
  int64_t step = 0;                          // the optimizer step under way
  std::string where() const { return phase.empty() ? fmt::format("in training step {}", step) : phase; }
  MemoryFigures memory;
};

RunResult train_run(const Config& cfg, const RunOptions& opts, comm::ProcessGroup& pg, RunContext& ctx);

}  // namespace

RunResult train(const Config& cfg, const RunOptions& opts, comm::ProcessGroup& pg) {
  RunContext ctx;
  try {
    return train_run(cfg, opts, pg, ctx);
  } catch (const OutOfMemoryError& e) {
    const TrainConfig& t = cfg.train;
    DPT_THROW(OutOfMemoryError, "{} {}", e.what(),
              out_of_memory_advice(ctx.where(), ctx.memory, t.batch_size, t.eval_batch_size, t.accum_steps, t.precision));
  }
}

namespace {

RunResult train_run(const Config& cfg, const RunOptions& opts, comm::ProcessGroup& pg, RunContext& ctx) {
  const int rank = pg.rank(), world = pg.size();
  const bool lead = rank == 0;
  const TrainConfig& t = cfg.train;
  RunResult result;

  Datasets ds = make_datasets(cfg.data, cfg.model, static_cast<uint64_t>(t.seed));
  if (lead)
    spdlog::info("data: {} train / {} test examples ({}), {} per rank per step, {} global", ds.train->size(),
                 ds.test->size(), ds.train->name(), t.batch_size, t.batch_size * world);

  std::mt19937_64 rng(static_cast<uint64_t>(t.seed));
  const Device device = opts.device;
  const std::vector<int64_t> sample_shape = ds.train->sample_shape();
  ctx.phase = "building the model";
  auto model = build_model(cfg.model, sample_shape, ds.train->num_classes(), device);
  std::unique_ptr<Task> task = make_task(cfg.model.name, cfg.model.block_size, sample_shape, device);
  model->init(rng());
  try {
    model->set_precision(parse_precision(t.precision));
  } catch (const UnsupportedError& e) {
    DPT_THROW(ConfigError, "train.precision = {} on {}: {}; use train.precision = fp32 there", t.precision,
              device.str(), e.what());
  }
  if (lead && device.is_cpu()) spdlog::info("precision: {}", models::describe_cpu_arithmetic(model->precision()));
  LossScaler scaler(t.precision == "fp16");
  if (!cfg.model.init_from.empty()) {
    const std::string note = load_pretrained(*model, cfg.model.init_from);
    if (lead) spdlog::info("model: weights from {}{}", cfg.model.init_from, note.empty() ? "" : "; " + note);
  }
  const StreamHandle stream = model->kernels().stream();  // the compute stream (nullptr on the CPU)
  const bool decay_matrices_only =
      t.weight_decay_params == "matrices" || (t.weight_decay_params == "auto" && cfg.model.name == "gpt");
  ctx.memory.params = static_cast<int64_t>(model->params().bytes());
  ctx.memory.grads = static_cast<int64_t>(model->grads().bytes());
  ctx.memory.buffers = static_cast<int64_t>(model->buffers().bytes());
  ctx.phase = "allocating the optimizer state";
  Optimizer optimizer(t, *model, decay_matrices_only);
  for (const auto& nt : optimizer.state()) ctx.memory.optimizer += static_cast<int64_t>(nt.tensor.bytes());
  ctx.phase = "loading the checkpoint";
  if (lead) spdlog::info("model: {} on {}", model->summary(), model->device().str());
  // Model FLOPs utilisation per device, against its dense bf16 peak: shown for a GPU in the table only.
  const double row_flops = train_flops_per_row(*model);
  const double peak_flops = device.is_cuda() ? cuda::dense_bf16_peak_flops(cuda::device_name(device.index)) : 0.0;
  auto mfu_pct = [&](double global_rows_per_s) {
    return row_flops > 0 && peak_flops > 0 ? 100.0 * global_rows_per_s / world * row_flops / peak_flops : 0.0;
  };
  auto mfu = [&](double global_rows_per_s) {
    const double pct = mfu_pct(global_rows_per_s);
    return pct > 0 ? fmt::format(" mfu {:.1f}%", pct) : std::string();
  };

  // ---- resume ----------------------------------------------------------------------------------------
  CheckpointManager ckpt(cfg.checkpoint.dir, cfg.checkpoint.keep);
  TrainState start;
  std::optional<LoadedCheckpoint> loaded;
  if (opts.resume == "never") {
    if (lead) {
      size_t n = ckpt.remove_all();
      if (n) spdlog::warn("--resume never: deleted {} checkpoint(s) of an earlier run in {}", n, ckpt.dir());
    }
  } else if (lead) {
    loaded = opts.resume == "auto" ? ckpt.load_latest() : CheckpointManager::load(opts.resume);
    // Checkpoints newer than the one we continue from (invalid ones skipped by auto, or those of the run
    // that --resume PATH abandons) must neither be loaded by a later --resume auto nor outrank the new
    // run's checkpoints when pruning: keep them, under another name.
    ckpt.set_aside_after(loaded ? loaded->state.step : -1, opts.resume == "auto" ? "invalid" : "abandoned");
  }
  // Rank 0 chooses; everyone loads the same checkpoint (each rank reads it itself).
  Tensor chosen = Tensor::empty({1}, DType::I64);
  chosen.data<int64_t>()[0] = loaded ? loaded->state.step : -1;
  pg.broadcast(chosen, {.what = "resume step"})->wait();
  const int64_t chosen_step = chosen.data<int64_t>()[0];
  if (chosen_step >= 0 && !lead)
    loaded = CheckpointManager::load(opts.resume == "auto" ? ckpt.path_for_step(chosen_step) : opts.resume);
  if (loaded) {
    DPT_CHECK_EQ(loaded->state.step, chosen_step);
    if (loaded->model.tensors.size() != model->state().size())
      DPT_THROW(CheckpointError, "{}: model.safetensors has {} tensors, this model has {} (model config changed?)",
                loaded->path, loaded->model.tensors.size(), model->state().size());
    model->load_state([&](const std::string& name) { return loaded->model.find(name); },
                      loaded->path + "/model.safetensors");
    copy_named(optimizer.state(), loaded->optimizer, "optimizer.safetensors", loaded->path);
    start = loaded->state;
    optimizer.set_steps(start.optimizer_steps >= 0 ? start.optimizer_steps : start.step);
    if (scaler.enabled() && start.loss_scale > 0)
      scaler.restore(start.loss_scale, start.scale_growth_tracker, start.skipped_steps);
    std::istringstream(start.rng) >> rng;
    if (start.batch_in_epoch % t.accum_steps != 0)
      DPT_THROW(ConfigError,
                "{} stopped mid-epoch at batch {}, which does not start an optimizer step of train.accum_steps = {} "
                "micro-batches; resume with the accum_steps it was written with, or from a checkpoint at an epoch end",
                loaded->path, start.batch_in_epoch, t.accum_steps);
    if (start.batch_in_epoch > 0 &&
        (start.world_size != world || start.batch_size != t.batch_size || start.seed != t.seed ||
         start.dataset_size != static_cast<int64_t>(ds.train->size()) || start.drop_last != t.drop_last))
      DPT_THROW(ConfigError,
                "{} stopped mid-epoch (batch {}) with {} ranks x batch {}, seed {}, {} examples, drop_last {}; "
                "continuing mid-epoch needs the same data order (now {} x {}, seed {}, {} examples, drop_last {}). "
                "Resume from a checkpoint at an epoch end, or restore those settings.",
                loaded->path, start.batch_in_epoch, start.world_size, start.batch_size, start.seed,
                start.dataset_size, start.drop_last, world, t.batch_size, t.seed, ds.train->size(), t.drop_last);
    if (lead) {
      spdlog::info("resumed from {} (step {}, epoch {}, batch {})", loaded->path, start.step, start.epoch + 1,
                   start.batch_in_epoch);
      if (start.config_hash != config_hash(cfg))
        spdlog::warn("the config differs from the checkpoint's (hash {} vs {}); continuing with the new one",
                     config_hash(cfg), start.config_hash);
    }
    result.resumed_from_step = start.step;
    loaded.reset();  // free the host copies
  }
  // Every rank starts from rank 0's parameters and buffers (identical already; this makes it a guarantee,
  // as DDP's broadcast of the module's state at construction).
  const FailureInjection inject = FailureInjection::from_env();
  if (rank == inject.perturb_buffers_rank && model->buffers().numel()) {
    Tensor b = model->buffers().to(Device::cpu());
    for (size_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = b.data<float>()[i] * 1.5f + 0.25f;
    model->buffers().copy_from(b);
  }
  pg.broadcast(model->params(), {.root = 0, .stream = stream, .what = "initial params"})->wait();
  if (model->buffers().numel())
    pg.broadcast(model->buffers(), {.root = 0, .stream = stream, .what = "initial buffers"})->wait();
  check_replicas(*model, pg, 0, /*with_buffers=*/true);
  bool overlap = cfg.dist.overlap;
  const bool sync_buffers = world > 1 && cfg.dist.broadcast_buffers && model->buffers().numel() > 0;
  if (cfg.model.sync_bn && world > 1) {
    // SyncBatchNorm's all-reduces run on this thread in the middle of backward; the host groups' bucket
    // all-reduces would run at the same time on the reducer's thread, and two threads may not interleave
    // collectives on one group: buckets are then reduced after backward.
    const size_t n = model->set_batch_norm_sync([&pg, stream](Tensor& sums) {
      pg.allreduce(sums, {.op = comm::ReduceOp::Sum, .stream = stream, .what = "sync batchnorm"})->block(stream);
    });
    if (overlap && !pg.asynchronous()) overlap = false;
    if (lead) spdlog::info("model: SyncBatchNorm in {} layer(s){}", n,
                   overlap == cfg.dist.overlap
                       ? ""
                       : fmt::format("; gradient buckets reduced after backward (no overlap with SyncBatchNorm on {})",
                                     pg.backend()));
  }

  // ---- the loop ---------------------------------------------------------------------------------------
  data::DistributedSampler sampler({.dataset_size = ds.train->size(), .rank = rank, .world_size = world,
                                    .seed = static_cast<uint64_t>(t.seed), .shuffle = true, .drop_last = t.drop_last});
  const data::LoaderOptions lo{.batch_size = static_cast<size_t>(t.batch_size), .drop_last = t.drop_last,
                               .prefetch = static_cast<size_t>(cfg.data.prefetch), .pin_memory = device.is_cuda(),
                               .workers = static_cast<size_t>(cfg.data.workers)};
  const int64_t spe = t.drop_last ? static_cast<int64_t>(sampler.num_samples() / lo.batch_size)
                                  : static_cast<int64_t>((sampler.num_samples() + lo.batch_size - 1) / lo.batch_size);
  if (spe == 0)
    DPT_THROW(ConfigError, "no full batch: {} examples per rank, train.batch_size {} and train.drop_last = true",
              sampler.num_samples(), t.batch_size);
  // With gradient accumulation an optimizer step takes K = train.accum_steps batches (fewer at an epoch's
  // end); the schedule, max_steps and every_steps count optimizer steps.
  const int64_t K = t.accum_steps;
  const int64_t steps_per_epoch = (spe + K - 1) / K;
  int64_t total_steps = steps_per_epoch * t.epochs;
  if (t.max_steps > 0) total_steps = std::min(total_steps, t.max_steps);

  ctx.phase = "setting up training (gradient buckets, the data loader)";
  Reducer reducer(pg, *model, stream,
                  {.bucket_cap_bytes = static_cast<size_t>(cfg.dist.bucket_cap_mb * 1024 * 1024),
                   .first_bucket_cap_bytes = size_t{1} << 20,
                   .overlap = overlap,
                   .grad_dtype = cfg.dist.grad_dtype == "bf16" ? DType::BF16 : DType::F32});
  if (lead && world > 1)
    spdlog::info("reducer: {} bucket(s) of gradients{}, {}", reducer.buckets().size(),
                 overlap ? " all-reduced during backward" : ", all-reduced after backward",
                 bucket_summary(reducer.buckets()));
  if (lead && cfg.dist.grad_dtype == "bf16") {
    if (world > 1)
      spdlog::info("reducer: gradients all-reduced in bf16 (dist.grad_dtype = bf16): divided by the {} ranks, rounded "
                   "to bfloat16, summed in bfloat16, widened back to fp32; half the bytes of fp32", world);
    else
      spdlog::info("reducer: dist.grad_dtype = bf16 has no effect with one rank (nothing is all-reduced)");
  }
  models::SoftmaxCrossEntropy loss;
  Feeder feeder(device, stream);
  StepTimer timer(*model);
  int64_t step = start.step;
  int64_t last_saved = -1;
  auto save = [&](int64_t epoch, int64_t next_batch) {
    if (!lead || last_saved == step) return;
    TrainState st{.step = step, .epoch = epoch, .batch_in_epoch = next_batch, .world_size = world,
                  .batch_size = t.batch_size, .seed = t.seed, .dataset_size = static_cast<int64_t>(ds.train->size()),
                  .drop_last = t.drop_last, .rng = "", .optimizer_steps = optimizer.steps(),
                  .loss_scale = scaler.enabled() ? scaler.scale() : 0.0, .scale_growth_tracker = scaler.growth_tracker(),
                  .skipped_steps = scaler.skipped(), .config_toml = to_toml(cfg), .config_hash = config_hash(cfg)};
    std::ostringstream os;
    os << rng;
    st.rng = os.str();
    auto t0 = Clock::now();
    result.last_checkpoint = ckpt.save(on_host(model->state()), on_host(optimizer.state()), st);
    last_saved = step;
    spdlog::info("checkpoint {} ({:.2f} s)", result.last_checkpoint, seconds_since(t0));
  };

  StopAgreement stop_agreement(pg, step);
  // Rank 0's metrics file (trainer/metrics.h): the progress and epoch lines as JSON, appended.
  std::optional<MetricsLog> metrics;
  if (lead) metrics.emplace(metrics_dir(cfg), start.step, cfg.log.tensorboard);
  const auto run_t0 = Clock::now();
  const std::string rate_key = std::string(task->unit()) + "_per_s";  // samples_per_s | tokens_per_s
  auto record = [&](const char* kind, int64_t epoch) {
    nlohmann::json j;
    j["kind"] = kind;
    j["step"] = step;
    j["epoch"] = epoch + 1;
    j["epochs"] = t.epochs;
    j["time_s"] = seconds_since(run_t0);
    j["unix_time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (scaler.enabled()) {
      j["loss_scale"] = scaler.scale();
      j["skipped_steps"] = scaler.skipped();
    }
    return j;
  };
  // This rank's memory now (the model's state is ctx.memory's already): the training device's tensors, the host
  // process, and a GPU as its driver counts it.
  auto memory_now = [&] {
    MemoryFigures m = ctx.memory;
    const TensorMemory tm = tensor_memory(device);
    m.tensors = static_cast<int64_t>(tm.current);
    m.tensors_peak = static_cast<int64_t>(tm.peak);
    const HostMemory host = host_memory();
    m.rss = static_cast<int64_t>(host.rss);
    m.peak_rss = static_cast<int64_t>(host.peak_rss);
    if (device.is_cuda()) {
      const cuda::MemInfo info = cuda::mem_info(device.index);
      m.device_used = static_cast<int64_t>(info.total - info.free);
      m.device_total = static_cast<int64_t>(info.total);
    }
    return m;
  };
  auto add_memory = [&](nlohmann::json& j, const MemoryFigures& m) {
    j["rss_bytes"] = m.rss;
    j["peak_rss_bytes"] = m.peak_rss;
    j["tensor_bytes"] = m.tensors;
    j["tensor_peak_bytes"] = m.tensors_peak;
    if (m.device_total > 0) {
      j["device_used_bytes"] = m.device_used;
      j["device_total_bytes"] = m.device_total;
    }
  };
  auto memory_text = [](const MemoryFigures& m) {
    auto b = [](int64_t v) { return format_bytes(static_cast<size_t>(std::max<int64_t>(v, 0))); };
    std::string s = fmt::format("tensors {} (peak {}), host RSS {} (peak {})", b(m.tensors), b(m.tensors_peak),
                                b(m.rss), b(m.peak_rss));
    if (m.device_total > 0) s += fmt::format(", device {} of {} used", b(m.device_used), b(m.device_total));
    return s;
  };
  // The first step of this invocation measures the activations: the peak of what the training thread allocated
  // during it (the loader's threads, allocating batches meanwhile, do not count). Every rank then reports its figures to rank 0, which prints them (and the metrics file keeps them).
  bool first_step = true;
  auto report_memory = [&] {
    MemoryFigures m = memory_now();
    m.activations = thread_allocations().peak;
    stop_thread_allocations();

    ctx.memory.activations = m.activations;
    const auto all = gather_per_rank({static_cast<double>(m.activations), static_cast<double>(m.tensors_peak),
                                      static_cast<double>(m.rss)}, pg, "memory report");
    if (!lead) return;
    auto b = [](double v) { return format_bytes(static_cast<size_t>(std::max(v, 0.0))); };
    spdlog::info("memory per rank: parameters {}, gradients {}, optimizer state {}{}, activations {} (what the first "
                 "step allocated at most: activations, their gradients, workspace); {}",
                 b(m.params), b(m.grads), b(m.optimizer), m.buffers ? ", buffers " + b(m.buffers) : "",
                 b(m.activations), memory_text(m));
    for (int r = 1; r < world; ++r)
      if (std::abs(all[r][0] - all[0][0]) > 0.05 * all[0][0] || std::abs(all[r][1] - all[0][1]) > 0.05 * all[0][1])
        spdlog::info("memory of rank {}: activations {}, tensors peak {}, host RSS {}", r, b(all[r][0]), b(all[r][1]),
                     b(all[r][2]));
    nlohmann::json j = record("memory", start.epoch);
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
    metrics->write(j);
  };
  // Each epoch: every rank's step time (rank 0 names a straggler) and memory, into the metrics file.
  auto report_ranks = [&](const std::vector<std::vector<double>>& all, int64_t epoch) {
    std::vector<RankTiming> timings;
    nlohmann::json j = record("ranks", epoch);
    std::vector<double> step_time, compute, data_wait, comm;
    std::vector<int64_t> rss, peak;
    for (const auto& r : all) {
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
      spdlog::warn("straggler: rank {} took {:.1f} ms per step (compute {:.1f} ms, data wait {:.1f} ms), {:.0f}% more "
                   "than the other ranks' median {:.1f} ms; they waited {:.1f} s for it in the gradient all-reduce "
                   "this epoch",
                   s->rank, 1e3 * slow.step_time_s(), 1e3 * slow.compute_s / static_cast<double>(slow.steps),
                   1e3 * slow.data_wait_s / static_cast<double>(slow.steps), 100 * s->lag, 1e3 * s->others_median_s,
                   s->lost_s);
      j["straggler"] = s->rank;
      j["straggler_lag_pct"] = 100 * s->lag;
    }
    metrics->write(j);
  };
  // log.curves: rank 0 redraws RUN/curves.png from the metrics file (trainer/plot.h); drawing is a nicety, so a
  // failure (no gnuplot) is a warning once, and the run goes on.
  bool curves_failed = false;
  auto draw_curves = [&] {
    if (!lead || !cfg.log.curves || curves_failed) return;
    try {
      const PlotReport r = plot_run({.run = metrics_dir(cfg), .size = PlotSize{900, 600}});
      spdlog::info("curves: {}", r.out);
    } catch (const std::exception& e) {
      curves_failed = true;
      spdlog::warn("log.curves: cannot draw the curves ({}); training goes on without them", e.what());
    }
  };
  double last_eval_s = 0;  // the last evaluation's time, for the run's ETA
  bool stopped = t.max_steps > 0 && step >= t.max_steps;  // resumed at or past the limit: nothing to do
  for (int64_t epoch = start.epoch; epoch < t.epochs && !stopped; ++epoch) {
    const size_t first_batch = epoch == start.epoch ? static_cast<size_t>(start.batch_in_epoch) : 0;
    ds.train->set_epoch(epoch);  // the epoch's random transforms
    data::Loader loader(*ds.train, sampler.indices(epoch), lo, first_batch);
    DPT_CHECK_EQ(static_cast<int64_t>(loader.num_batches()), spe);
    Tensor stats = Tensor::zeros({2}, DType::F64, device);  // summed loss, correct: on the device, no sync per step
    auto loss_so_far = [&] { return stats.to(Device::cpu()).data<double>()[0]; };
    timer.reset();
    const int64_t epoch_first_step = step;
    int64_t seen = 0;
    const auto epoch_t0 = Clock::now();
    auto progress_t = epoch_t0;
    double lr = 0, grad_norm = 0;
    // The last step's gradient sum of squares, on the device: clipping without fp16 reads it only there (no host
    // synchronisation per step), the progress line when it prints.
    Tensor grad_ss = Tensor::zeros({1}, DType::F64, device);
    bool grad_ss_fresh = false;
    while (true) {
      std::optional<data::Batch> host_batch = loader.next();
      if (!host_batch) break;
      const data::Batch& batch = feeder.put(std::move(*host_batch), loader);
      const auto b = static_cast<int64_t>(batch.index);
      const int64_t group_first = b / K * K;  // this optimizer step's micro-batches: [group_first, + group_size)
      const int64_t group_size = std::min(K, spe - group_first);
      const bool last_micro = b == group_first + group_size - 1;
      if (b == group_first) {
        if (first_step) {
          reset_thread_allocations(device);
          ctx.phase = fmt::format("in the first training step (batch {} per rank)", t.batch_size);
        }
        timer.mark(0);
        pg.set_step(step + 1);  // the step these collectives belong to (a hang report names it)
        // The schedule follows the position in this run's epochs, not the raw step count: after a resume at
        // an epoch end with another world size, steps per epoch differ from the checkpoint's run.
        lr = lr_at(t, epoch * steps_per_epoch + b / K, steps_per_epoch, total_steps);
        model->zero_grad();
        // DDP's broadcast_buffers: every rank's forward sees rank 0's BatchNorm running statistics.
        if (sync_buffers)
          pg.broadcast(model->buffers(), {.root = 0, .stream = stream, .what = "buffers"})->block(stream);
      }
      task->prepare(batch);
      loss.accumulate(model->forward(task->input()), task->targets(), model->kernels(), stats, /*backward=*/true);
      // Each micro-batch's loss is a mean over its batch; the step's is the mean over all of them. fp16: times
      // the loss scale, so small gradients survive fp16's range.
      const double grad_factor = scaler.scale() / static_cast<double>(group_size);
      if (grad_factor != 1.0)
        model->kernels().scale(loss.grad().data<float>(), loss.grad().numel(), static_cast<float>(grad_factor));
      if (step + 1 == inject.inf_step && rank == 0 && b == group_first) {
        Tensor first = loss.grad().view(0, {1});
        Tensor inf = Tensor::empty({1});
        inf.data<float>()[0] = std::numeric_limits<float>::infinity();
        first.copy_from(inf, stream);
      }
      reducer.begin(/*sync=*/last_micro);  // the first K-1 micro-batches only accumulate
      model->backward(loss.grad(), [&](size_t first, size_t end) { reducer.grads_ready(first, end); });
      feeder.step_done();
      seen += task->rows();
      if (!last_micro) continue;
      if (rank == inject.slow_rank && inject.slow_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(inject.slow_ms));
      timer.mark(1);
      reducer.finish();
      timer.mark(2);
      bool apply = true;
      if (!scaler.enabled() && t.clip_grad_norm > 0) {
        auto& k = model->kernels();
        k.sum_squares_to(model->grads().data<float>(), model->num_params(), grad_ss.data<double>());
        k.clip_by_norm(model->grads().data<float>(), model->num_params(), grad_ss.data<double>(), t.clip_grad_norm);
        grad_ss_fresh = true;
      } else if (scaler.enabled()) {  // fp16: whether to apply the step is decided on the host
        auto& k = model->kernels();
        if (scaler.enabled()) k.scale(model->grads().data<float>(), model->num_params(), static_cast<float>(1.0 / scaler.scale()));
        const double ss = k.sum_squares(model->grads().data<float>(), model->num_params());  // host sync
        apply = scaler.update(/*found_inf=*/!std::isfinite(ss));
        if (apply && t.clip_grad_norm > 0) grad_norm = clip_gradients(*model, t.clip_grad_norm, ss);
      }
      if (apply) optimizer.step(lr);
      timer.mark(3);
      ++step;
      const int64_t next_batch = static_cast<int64_t>(batch.index) + 1;
      const bool epoch_done = next_batch == spe;
      if (first_step) {
        first_step = false;
        report_memory();
      }
      ctx.phase.clear();  // no formatting on the hot path: where() formats the step only for an error
      ctx.step = step + 1;
      if (lead && seconds_since(progress_t) >= t.progress_interval_s) {
        progress_t = Clock::now();
        if (grad_ss_fresh) grad_norm = std::sqrt(grad_ss.to(Device::cpu()).data<double>()[0]);
        const double elapsed = seconds_since(epoch_t0);
        const double rate = static_cast<double>(seen) * world / elapsed;
        // The run's batches left: this epoch's, then every later epoch's, capped by train.max_steps.
        const int64_t epoch_left = spe - next_batch;
        int64_t run_left = epoch_left + (t.epochs - epoch - 1) * spe;
        if (t.max_steps > 0) run_left = std::min(run_left, (t.max_steps - step) * K);
        const int64_t evals_left = t.max_steps > 0 && step + epoch_left / K >= t.max_steps ? 1 : t.epochs - epoch;
        const Eta eta = estimate_eta(next_batch - static_cast<int64_t>(first_batch), elapsed, epoch_left, run_left,
                                     evals_left, last_eval_s);
        const double epoch_pct = 100.0 * static_cast<double>(next_batch) / static_cast<double>(spe);
        const MemoryFigures mem = cfg.log.memory ? memory_now() : MemoryFigures{};
        const std::string line = fmt::format(
            "epoch {}/{} step {}/{} ({:.0f}%) loss {:.4f} lr {:.4g}{}{} {}/s {:.0f}{} eta {} (run {}){}", epoch + 1,
            t.epochs, next_batch, spe, epoch_pct, loss_so_far() / static_cast<double>(seen), lr,
            t.clip_grad_norm > 0 ? fmt::format(" grad_norm {:.4g}", grad_norm) : "",
            scaler.enabled() ? fmt::format(" loss_scale {:g} skipped {}", scaler.scale(), scaler.skipped()) : "",
            task->unit(), rate, mfu(rate), format_duration(eta.epoch_s), format_duration(eta.run_s),
            cfg.log.memory ? "; " + memory_text(mem) : "");
        if (live_line_enabled())
          show_live_line(line);
        else
          spdlog::info("{}", line);
        nlohmann::json j = record("progress", epoch);
        j["batch"] = next_batch;
        j["batches"] = spe;
        j["pct"] = epoch_pct;
        j["loss"] = loss_so_far() / static_cast<double>(seen);
        j["lr"] = lr;
        if (t.clip_grad_norm > 0) j["grad_norm"] = grad_norm;
        j[rate_key] = rate;
        if (const double pct = mfu_pct(rate); pct > 0) j["mfu_pct"] = pct;
        if (eta.epoch_s >= 0) {
          j["eta_epoch_s"] = eta.epoch_s;
          j["eta_run_s"] = eta.run_s;
        }
        if (cfg.log.memory) add_memory(j, mem);
        metrics->write(j);
      }
      if (cfg.checkpoint.every_steps > 0 && step % cfg.checkpoint.every_steps == 0 && !epoch_done)
        save(epoch, next_batch);
      if (step == 1 && rank == inject.diverge_rank) {
        Tensor first = model->params().view(0, {1});
        Tensor nudged = first.to(Device::cpu());
        nudged.data<float>()[0] += 1e-3f;
        first.copy_from(nudged);
      }
      if (step == inject.step && rank == inject.rank)
        DPT_THROW(InternalError, "injected failure after step {} (DPT_DEBUG_FAIL_AT_STEP)", step);
      if (t.max_steps > 0 && step >= t.max_steps) {
        stopped = true;
        save(epoch_done ? epoch + 1 : epoch, epoch_done ? 0 : next_batch);
        break;
      }
      // Preemption: did any rank get SIGUSR1 or SIGTERM? The ranks ask at the same step boundaries, so they all
      // stop after the same step, none of them inside a collective.
      if (const int sig = stop_agreement.poll(step)) {
        result.stop_signal = sig;
        save(epoch_done ? epoch + 1 : epoch, epoch_done ? 0 : next_batch);
        pg.barrier()->wait();  // nobody exits before rank 0's checkpoint is complete
        if (lead)
          spdlog::info("stopping for {} at step {} ({}; checkpoint {})",
                       sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : std::to_string(sig), step,
                       stop_signal() ? fmt::format("{:.2f} s after the signal", seconds_since_stop_signal())
                                     : "another rank received it",
                       result.last_checkpoint);
        break;
      }
    }
    feeder.release(loader);
    if (result.stop_signal) {
      draw_curves();
      break;
    }
    const double loss_sum = loss_so_far();  // waits for the epoch's last step
    const double compute_s = timer.compute_s(), comm_s = timer.comm_s();
    const double epoch_s = seconds_since(epoch_t0);
    const double data_s = loader.wait_seconds();
    ctx.phase = fmt::format("evaluating after epoch {} (train.eval_batch_size {})", epoch + 1, t.eval_batch_size);
    // Every rank's own step time and memory, gathered on every rank (rank 0 reports them).
    const int64_t epoch_steps = step - epoch_first_step;
    const MemoryFigures mem = memory_now();
    const auto per_rank = gather_per_rank({compute_s, data_s, comm_s, static_cast<double>(epoch_steps),
                                           static_cast<double>(mem.rss), static_cast<double>(mem.tensors_peak)},
                                          pg, "rank timings");
    reset_peak_tensor_memory(device);  // the next epoch's peak starts from here

    // Training loss averaged over every rank's examples.
    Tensor tl = Tensor::empty({2}, DType::F64);
    tl.data<double>()[0] = loss_sum;
    tl.data<double>()[1] = static_cast<double>(seen);
    pg.allreduce(tl, {.op = comm::ReduceOp::Sum, .what = "loss stats"})->wait();
    const double global_seen = tl.data<double>()[1];
    check_replicas(*model, pg, epoch + 1);
    const auto eval_t0 = Clock::now();
    EvalResult ev = evaluate(*model, *task, *ds.test, t, static_cast<size_t>(cfg.data.workers), pg);
    last_eval_s = seconds_since(eval_t0);
    EpochStats es{.epoch = epoch + 1, .train_loss = global_seen > 0 ? tl.data<double>()[0] / global_seen : 0.0,
                  .test_loss = ev.loss, .test_acc = ev.acc,
                  .samples_per_s = epoch_s > 0 ? global_seen / epoch_s : 0.0,
                  .compute_s = compute_s, .comm_s = comm_s, .data_s = data_s};
    result.epochs.push_back(es);
    result.final_test_acc = ev.acc;
    result.final_test_loss = ev.loss;
    if (lead) {
      spdlog::info("epoch {}/{} loss {:.4f} test_loss {:.4f} test_acc {:.4f} {}/s {:.0f}{} lr {:.4g} "
                   "time {:.2f}s (compute {:.2f}s comm {:.2f}s data wait {:.2f}s)",
                   es.epoch, t.epochs, es.train_loss, es.test_loss, es.test_acc, task->unit(), es.samples_per_s,
                   mfu(es.samples_per_s), lr, epoch_s, compute_s, comm_s, data_s);
      if (scaler.enabled())
        spdlog::info("fp16 loss scale {:g}; {} step(s) skipped so far for inf/NaN gradients", scaler.scale(),
                     scaler.skipped());
      if (stopped) spdlog::info("stopped at step {} (train.max_steps = {})", step, t.max_steps);
      nlohmann::json j = record("epoch", epoch);
      j["train_loss"] = es.train_loss;
      j["test_loss"] = es.test_loss;
      j["test_acc"] = es.test_acc;
      j["lr"] = lr;
      j[rate_key] = es.samples_per_s;
      if (const double pct = mfu_pct(es.samples_per_s); pct > 0) j["mfu_pct"] = pct;
      j["epoch_time_s"] = epoch_s;
      j["compute_s"] = compute_s;
      j["comm_s"] = comm_s;
      j["data_wait_s"] = data_s;
      add_memory(j, mem);
      metrics->write(j);
      spdlog::info("epoch {}/{} memory: {}", es.epoch, t.epochs, memory_text(mem));
      report_ranks(per_rank, epoch);
      draw_curves();
    }
    const bool last_epoch = epoch + 1 == t.epochs;
    const bool epoch_due = cfg.checkpoint.every_epochs > 0 && (epoch + 1) % cfg.checkpoint.every_epochs == 0;
    const bool step_due = cfg.checkpoint.every_steps > 0 && step % cfg.checkpoint.every_steps == 0;
    if (!stopped && (last_epoch || epoch_due || step_due)) save(epoch + 1, 0);
  }

  if (result.epochs.empty() && !result.stop_signal) {
    // Nothing left to train (resumed at the end): report where the model stands.
    EvalResult ev = evaluate(*model, *task, *ds.test, t, static_cast<size_t>(cfg.data.workers), pg);
    result.final_test_acc = ev.acc;
    result.final_test_loss = ev.loss;
    if (lead) {
      const std::string why = t.max_steps > 0 && step >= t.max_steps
                                  ? fmt::format("train.max_steps = {} already reached", t.max_steps)
                                  : fmt::format("epoch {}/{}", start.epoch, t.epochs);
      spdlog::info("training already complete at step {} ({}): test_loss {:.4f} test_acc {:.4f}", step, why,
                   ev.loss, ev.acc);
    }
  }
  result.steps = step;
  return result;
}

}  // namespace

// ---- dptrain eval ---------------------------------------------------------------------------------------------

EvalTarget eval_target(const std::string& path, const std::vector<std::string>& overrides) {
  LoadedCheckpoint ck = CheckpointManager::load_given(path);
  Config cfg = parse_config(ck.state.config_toml, ck.path + "/state.json", overrides);
  return {std::move(ck), std::move(cfg)};
}

EvalReport evaluate_checkpoint(const EvalTarget& target, comm::ProcessGroup& pg, Device device) {
  const Config& cfg = target.config;
  const LoadedCheckpoint& ck = target.checkpoint;
  Datasets ds = make_datasets(cfg.data, cfg.model, static_cast<uint64_t>(cfg.train.seed));
  const std::vector<int64_t> sample_shape = ds.test->sample_shape();
  auto model = build_model(cfg.model, sample_shape, ds.test->num_classes(), device);
  model->load_state([&](const std::string& name) { return ck.model.find(name); }, ck.path);
  model->set_precision(parse_precision(cfg.train.precision));
  std::unique_ptr<Task> task = make_task(cfg.model.name, cfg.model.block_size, sample_shape, device);
  const EvalResult ev = evaluate(*model, *task, *ds.test, cfg.train, static_cast<size_t>(cfg.data.workers), pg);
  return {ev.loss, ev.acc, ev.rows, task->unit(), model->summary()};
}

}  // namespace dpt::trainer
