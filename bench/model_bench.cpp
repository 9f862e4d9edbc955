// bench/model_bench.cpp: dpt-model-bench, the training-step throughput of one model on one device, in the
// manner of nccl-tests: a harness owning warm-up, timing, a sanity check and a fixed-width table row.
//
// The model comes from the same config as dptrain's (a TOML file and key=value overrides: model.*,
// train.device, train.precision, train.optimizer, train.lr, ...) through trainer::build_model. One random
// batch is made once, directly in the device's memory, so the timed loop is the step alone: forward, softmax
// cross-entropy, backward, optimizer step (trainer::Optimizer), with no data loading, host-to-device copies or
// collectives. After --warmup untimed steps, --steps steps are timed: on a GPU with CUDA events on the model's
// compute stream (device time, kernel-launch gaps included), on the CPU with steady_clock. The check: the
// mean loss over the timed steps must be finite (exit 1 otherwise).
//
//   images (model.name = mlp | resnet): a batch [N, C, H, W] (--shape) of standard normal values with labels
//       uniform in [0, --classes); images/s = batch * steps / time. PyTorch's twin:
//       tests/support/python/torch_resnet.py.
//   tokens (model.name = gpt): windows of model.block_size + 1 tokens uniform in [0, model.vocab_size): the
//       model reads tokens [B, T] (int32) and predicts the next ones ([B * T] targets), as dptrain's language
//       model task feeds it; tokens/s = B * T * steps / time, and on a GPU whose dense bf16 peak is known
//       (cuda::dense_bf16_peak_flops) MFU = tokens/s * models::gpt_flops_per_token / peak. AdamW's weight decay
//       reaches the matrices only, as dptrain's for a GPT (train.weight_decay_params = auto). PyTorch's twin:
//       tests/support/python/torch_gpt.py (scripts/bench/gpt_bench.sh runs both).
//
// --phase-steps N: after the timed steps, N more steps with a clock read (CUDA events on a GPU) between the
// phases: where a step's time goes (forward, loss, backward, optimizer), printed as a comment line and in the
// JSON. Separate from the timed steps, which stay untouched. --cuda-profiler-range: the timed steps between
// cudaProfilerStart and cudaProfilerStop, for `nsys profile --capture-range=cudaProfilerApi` (per-kernel
// times of the timed steps only).
//
// --kernel-steps N: after those, N more steps on the model switched to models::TimedKernels (the same kernel set,
// every call between two clock reads: CUDA events on a GPU): the time per step of each operation and shape of the
// kernel set ("matmul_bf16: M 16384 N 2304 K 768 B^T, bias, bf16 D"), most first, and the rest of each step's span
// (other GPU work, the GPU idle), as comment lines and in the JSON. A breakdown by call of the kernel set (one call
// may launch several kernels) that needs no profiler, and only a few more steps of device time. Each row also gets
// its work (TimedKernels's Work: FLOPs of its products, bytes it must move), the rates it reached, and, where the
// device's peaks are known (the bf16 table and the memory's clock and bus on a GPU; --peak-tflops, --peak-gbps),
// its floor: how far each operation, cuBLASLt's and cuDNN's included, sits from the roofline.
//
// --lt-sweep N: after those, each cuBLASLt plan the run made called again on scratch operands with each of the first N
// algorithms cuBLASLt's heuristic proposes and split-K variants of the first few, against the one it runs
// (Kernels::sweep_library_choices): whether the heuristic's first choice leaves a GEMM's time on the table; then each
// cuDNN attention graph with up to N (at most 4) of the plans cuDNN proposes for it. A line each (and the JSON's
// library_sweep).
//
// --trace-steps N (GPU): last (after --lt-sweep), N more steps, launched call by call, with CUPTI's activity records
// on (bench/kernel_trace.h): each kernel, copy and memset by name with its device time per step, most first, as
// torch.profiler tabulates PyTorch's (the same format: gpt_bench.sh sets the two side by side); the library calls'
// own kernels by name (cuBLASLt's kernel per product, cuDNN's inside an attention call). Without CUPTI a line says
// why; the run's numbers stand.
//
// --cuda-graph (GPU): the timed steps replay one CUDA graph of a step's zeroing, forward, loss and backward, captured
// after the warm-up (and --lt-tune), and with AdamW its fused update too (the learning rate and bias corrections
// copied to the device before each launch: trainer::Optimizer::stage), so one launch is the whole step; SGD's update
// is launched after it as in the other steps: what a graph saves in launches and gaps between kernels against the
// same step launched call by call (gpt_bench.sh's fastgraph row). Only for the transformer fast path
// (train.bf16_activations), the one path whose capture the tests check. A call of the step that cannot be captured
// fails the run (a checked call naming itself).
//
// stdout carries only the table (logs go to stderr); --json FILE writes the result for scripts.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#ifdef DPT_WITH_CUDA
#include <cuda_profiler_api.h>
#endif

#include "core/check.h"
#include "core/cli_checks.h"
#include "core/cuda.h"
#include "core/logging.h"
#include "bench/kernel_trace.h"
#include "core/tensor.h"
#include "models/gpt/gpt.h"
#include "models/kernels/cpu/cpu_info.h"
#include "models/kernels/timed_kernels.h"
#include "models/layers.h"
#include "models/model.h"
#include "trainer/build_model.h"
#include "trainer/config.h"
#include "trainer/model_registry.h"
#include "trainer/optimizer.h"
#include "trainer/trainer.h"

namespace {

using namespace dpt;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

[[noreturn]] void die(int code, const std::string& what) { dpt::exit_with_error(code, what); }

// The command line, parsed once (parse_options), then read-only.
struct Options {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t batch = 0;  // 0: train.batch_size
  std::vector<int64_t> shape = {3, 32, 32};
  int64_t classes = 10;
  int warmup = 5;
  int steps = 20;
  int phase_steps = 0;
  int kernel_steps = 0;
  int kernel_lines = 30;
  int lt_sweep = 0;  // --lt-sweep: cuBLASLt's first N algorithms per plan, timed after the steps; 0: none
  int lt_tune = 0;   // --lt-tune: the same after the warm-up steps, the fastest kept (train.autotune); 0: none
  int trace_steps = 0;  // --trace-steps: steps traced with CUPTI after the others; 0: none
  double peak_tflops = 0;  // 0: the device's from cuda::dense_bf16_peak_flops's table
  double peak_gbps = 0;    // 0: the device's from its memory clock and bus width
  bool profiler_range = false;
  bool cuda_graph = false;  // --cuda-graph: the timed steps' forward, loss and backward replayed as one CUDA graph
  std::string json_path;
};

// --lt-sweep's timed calls per algorithm (after one untimed).
constexpr int kSweepReps = 5;

// The phases of a step, in order; --phase-steps times each.
constexpr std::array<const char*, 4> kPhases = {"forward", "loss", "backward", "optimizer"};

struct Result {
  std::string model;     // "resnet18", "gpt-L12-C768"
  int64_t params = 0;
  std::string precision;  // train.precision: fp32 | bf16 | fp16
  std::string device;     // "cpu", "cuda:0"
  std::string device_name;
  double ms_per_step = 0;
  double images_per_s = 0;  // examples (images, or token windows) per second
  double loss = 0;          // mean over the timed steps' loss rows (examples, or tokens)
  std::array<double, kPhases.size()> phase_ms{};  // per step, over the --phase-steps steps
  // GPT only.
  bool tokens = false;
  int64_t seq = 0;  // T
  int64_t vocab = 0, padded_vocab = 0;
  int64_t params_no_wpe = 0;  // N of MFU's 6 N
  double tokens_per_s = 0;
  double flops_per_token = 0;
  double peak_flops = 0;  // dense bf16 peak of the device; 0: unknown (no MFU)
  double mfu = 0;
  std::vector<std::string> library_choices;  // Kernels::library_choices() after the run
  std::vector<std::string> library_sweep;    // Kernels::sweep_library_choices() after that (--lt-sweep)
  std::vector<std::string> library_tune;     // its adopting run after the warm-up steps (--lt-tune)
  size_t graph_nodes = 0;                    // --cuda-graph: the nodes of the captured step
  // --trace-steps: CUPTI's rows (summed over the traced steps), and a line saying what the trace was or why none.
  std::vector<bench::KernelTrace::Row> trace;
  std::string trace_note;
  // --kernel-steps: TimedKernels's rows, and its span and time between calls, per step.
  std::vector<models::TimedKernels::Row> kernels;
  double kernel_total_ms = 0, kernel_between_ms = 0;
  // The device's peaks for the rows' floors (TimedKernels::floor_ms): dense bf16 FLOP/s and memory bytes/s; 0 where
  // not known (the CPU, a GPU not in the table).
  double tensor_peak_flops = 0, peak_bytes_per_s = 0;
};

// A row's floor in ms per step (negative: not known).
double kernel_floor_ms(const models::TimedKernels::Row& k, const Result& r, double steps) {
  const double f = models::TimedKernels::floor_ms(k, r.tensor_peak_flops, r.peak_bytes_per_s);
  return f < 0 ? f : f / steps;
}

// Over the rows whose floor is known: the floors' sum and the time those rows took, per step; and how many rows
// have none.
struct FloorSums {
  double floor_ms = 0, ms = 0;
  int64_t unknown = 0;
};
FloorSums floor_sums(const Result& r, double steps) {
  FloorSums f;
  for (const auto& k : r.kernels) {
    const double floor = kernel_floor_ms(k, r, steps);
    if (floor < 0) {
      ++f.unknown;
    } else {
      f.floor_ms += floor;
      f.ms += k.ms / steps;
    }
  }
  return f;
}

// "resnet18: 11181642 parameters" -> "resnet18"; "resnet18 (small stem): ..." -> "resnet18-small"; a
// name with spaces (model.blocks) keeps its first word.
std::string short_model_name(const models::Model& m) {
  std::string s = m.summary();
  s = s.substr(0, s.find(':'));
  const bool small = s.find("(small stem)") != std::string::npos;
  s = s.substr(0, s.find(' '));
  return small ? s + "-small" : s;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

// The table, shared with tests/support/python/torch_resnet.py (same columns, same widths).
void print_header() {
  fmt::print("#{:>11}  {:>10}  {:>10}  {:>5}  {:>9}  {:>6}  {:>5}  {:>9}  {:>9}  {:>7}\n", "program", "model", "shape",
             "batch", "precision", "device", "ranks", "time/step", "images/s", "loss");
  fmt::print("#{:>11}  {:>10}  {:>10}  {:>5}  {:>9}  {:>6}  {:>5}  {:>9}  {:>9}  {:>7}\n", "", "", "", "", "", "", "",
             "(ms)", "(1/s)", "(mean)");
}

void print_row(const Result& r, const Options& o) {
  fmt::print("{:>12}  {:>10}  {:>10}  {:>5}  {:>9}  {:>6}  {:>5}  {:>9.2f}  {:>9.1f}  {:>7.4f}\n", "dptrain", r.model,
             shape_str(o.shape), o.batch, r.precision, r.device.substr(0, r.device.find(':')), 1, r.ms_per_step,
             r.images_per_s, r.loss);
  std::fflush(stdout);
}

// The GPT table, shared with tests/support/python/torch_gpt.py (same columns, same widths). MFU "-" when the peak of
// the device is not known (the CPU, a GPU not in cuda::dense_bf16_peak_flops's table).
void print_gpt_header() {
  fmt::print("#{:>11}  {:>7}  {:>12}  {:>5}  {:>5}  {:>9}  {:>6}  {:>9}  {:>10}  {:>5}  {:>7}\n", "program", "mode",
             "model", "seq", "batch", "precision", "device", "time/step", "tokens/s", "MFU", "loss");
  fmt::print("#{:>11}  {:>7}  {:>12}  {:>5}  {:>5}  {:>9}  {:>6}  {:>9}  {:>10}  {:>5}  {:>7}\n", "", "", "", "", "",
             "", "", "(ms)", "(1/s)", "(%)", "(mean)");
}

void print_gpt_row(const Result& r, const Options& o) {
  const std::string mfu = r.peak_flops > 0 ? fmt::format("{:.1f}", 100 * r.mfu) : "-";
  fmt::print("{:>12}  {:>7}  {:>12}  {:>5}  {:>5}  {:>9}  {:>6}  {:>9.2f}  {:>10.0f}  {:>5}  {:>7.4f}\n", "dptrain",
             "step", r.model, r.seq, o.batch, r.precision, r.device.substr(0, r.device.find(':')), r.ms_per_step,
             r.tokens_per_s, mfu, r.loss);
  std::fflush(stdout);
}

void write_json(const std::string& path, const Result& r, const Options& o) {
  nlohmann::json j{{"program", "dptrain"},
                   {"model", r.model},
                   {"params", r.params},
                   {"batch", o.batch},
                   {"precision", r.precision},
                   {"device", r.device},
                   {"device_name", r.device_name},
                   {"ranks", 1},
                   {"warmup", o.warmup},
                   {"steps", o.steps},
                   {"ms_per_step", r.ms_per_step},
                   {"images_per_s", r.images_per_s},
                   {"loss", r.loss},
                   {"overrides", o.overrides}};
  if (r.tokens) {  // token windows, not images: their rate under its own name
    j.erase("images_per_s");
    j["sequences_per_s"] = r.images_per_s;
    j["mode"] = "step";
    j["seq"] = r.seq;
    j["vocab"] = r.vocab;
    j["padded_vocab"] = r.padded_vocab;
    j["params_no_wpe"] = r.params_no_wpe;
    j["tokens_per_s"] = r.tokens_per_s;
    j["flops_per_token"] = r.flops_per_token;
    j["peak_flops"] = r.peak_flops;
    j["mfu"] = r.peak_flops > 0 ? nlohmann::json(r.mfu) : nlohmann::json(nullptr);
  } else {
    j["shape"] = o.shape;
    j["classes"] = o.classes;
  }
  if (o.cuda_graph) j["cuda_graph_nodes"] = r.graph_nodes;
  if (o.trace_steps > 0) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& t : r.trace)
      rows.push_back({{"name", t.name}, {"calls_per_step", static_cast<double>(t.calls) / o.trace_steps},
                      {"ms_per_step", t.ms / o.trace_steps}});
    j["trace_steps"] = o.trace_steps;
    j["trace"] = rows;
    j["trace_note"] = r.trace_note;
  }
  if (o.phase_steps > 0) {
    nlohmann::json ph;
    for (size_t i = 0; i < kPhases.size(); ++i) ph[kPhases[i]] = r.phase_ms[i];
    j["phase_steps"] = o.phase_steps;
    j["phase_ms_per_step"] = ph;
  }
  if (o.kernel_steps > 0) {
    const double n = o.kernel_steps;
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& k : r.kernels) {
      const double floor = kernel_floor_ms(k, r, n);
      rows.push_back({{"op", k.op},
                      {"shape", k.shape},
                      {"calls_per_step", k.calls / n},
                      {"ms_per_step", k.ms / n},
                      {"flops_per_step", k.flops / n},
                      {"bytes_per_step", k.bytes / n},
                      {"tensor_cores", k.tensor},
                      {"floor_ms_per_step", floor < 0 ? nlohmann::json(nullptr) : nlohmann::json(floor)}});
    }
    j["kernel_steps"] = o.kernel_steps;
    j["kernels"] = rows;
    j["kernel_total_ms_per_step"] = r.kernel_total_ms / n;
    j["kernel_between_ms_per_step"] = r.kernel_between_ms / n;
    j["tensor_peak_flops"] = r.tensor_peak_flops;
    j["peak_bytes_per_s"] = r.peak_bytes_per_s;
    const FloorSums fs = floor_sums(r, n);
    j["kernel_floor_ms_per_step"] = fs.floor_ms;       // the known floors' sum
    j["kernel_floor_rows_ms_per_step"] = fs.ms;        // the time of the rows with a floor
    j["kernel_floor_unknown_rows"] = fs.unknown;
  }
  if (!r.library_choices.empty()) j["library_choices"] = r.library_choices;
  if (o.lt_sweep > 0) j["library_sweep"] = r.library_sweep;
  if (o.lt_tune > 0) j["library_tune"] = r.library_tune;
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) DPT_THROW(IoError, "--json {}: cannot write it", path);
}

// One random batch of images, made on the host once and copied to the device: standard normal images and
// labels uniform in [0, classes).
std::pair<Tensor, Tensor> random_images(const Options& o, Device device, uint64_t seed) {
  std::vector<int64_t> xshape{o.batch};
  xshape.insert(xshape.end(), o.shape.begin(), o.shape.end());
  Tensor x = Tensor::empty(xshape, DType::F32), y = Tensor::empty({o.batch}, DType::I32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int32_t> label(0, static_cast<int32_t>(o.classes - 1));
  for (size_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = normal(rng);
  for (size_t i = 0; i < y.numel(); ++i) y.data<int32_t>()[i] = label(rng);
  return {x.to(device), y.to(device)};
}

// One random batch of token windows, as dptrain's language-model task makes them from a data set's windows of
// T + 1 tokens: inputs [B, T] (int32) and the next tokens [B * T] (row b * T + t), tokens uniform in
// [0, vocab).
std::pair<Tensor, Tensor> random_tokens(int64_t batch, int64_t T, int64_t vocab, Device device, uint64_t seed) {
  Tensor x = Tensor::empty({batch, T}, DType::I32), y = Tensor::empty({batch * T}, DType::I32);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> window(static_cast<size_t>(T + 1));
  for (int64_t b = 0; b < batch; ++b) {
    for (auto& t : window) t = token(rng);
    for (int64_t t = 0; t < T; ++t) {
      x.data<int32_t>()[b * T + t] = window[t];
      y.data<int32_t>()[b * T + t] = window[t + 1];
    }
  }
  return {x.to(device), y.to(device)};
}

// A clock for the phases: CUDA events on the compute stream (device time), or steady_clock on the CPU (whose
// kernels run on the calling thread). mark(i) ends phase i - 1 and starts phase i.
class PhaseClock {
 public:
  PhaseClock(bool cuda, StreamHandle stream) : cuda_(cuda), stream_(stream) {
    if (cuda_)
      for (auto& e : events_) e = std::make_unique<cuda::Event>(/*timing=*/true);
  }
  void mark(size_t i) {
    if (cuda_) events_[i]->record(stream_);
    else times_[i] = std::chrono::steady_clock::now();
  }
  // Adds the last step's phases (milliseconds) to `ms`; waits for the stream on a GPU.
  void add(std::array<double, kPhases.size()>& ms) {
    if (cuda_) events_.back()->synchronize();
    for (size_t i = 0; i < kPhases.size(); ++i)
      ms[i] += cuda_ ? events_[i + 1]->elapsed_ms_since(*events_[i])
                     : std::chrono::duration<double, std::milli>(times_[i + 1] - times_[i]).count();
  }

 private:
  bool cuda_;
  StreamHandle stream_;
  std::array<std::unique_ptr<cuda::Event>, kPhases.size() + 1> events_;
  std::array<std::chrono::steady_clock::time_point, kPhases.size() + 1> times_;
};

void profiler_range(bool start) {
#ifdef DPT_WITH_CUDA
  // Only nsys (--capture-range=cudaProfilerApi) listens; without a profiler these are no-ops.
  (void)(start ? cudaProfilerStart() : cudaProfilerStop());
#else
  (void)start;
#endif
}

// What runs, for the table and the JSON: the model, device and precision; a GPT's sizes, FLOPs and the device's peak.
Result describe_run(const models::Model& model, const trainer::Config& cfg, Device device, bool gpt) {
  Result r;
  r.model = short_model_name(model);
  r.params = static_cast<int64_t>(model.num_params());
  r.precision = trainer::choice_name(cfg.train.precision);
  r.device = device.str();
  r.device_name = device.is_cuda() ? cuda::device_description(device.index)
                                   : fmt::format("cpu (matrix products in {})", models::describe_cpu_gemm());
  if (device.is_cuda()) {
    r.tensor_peak_flops = cuda::dense_bf16_peak_flops(cuda::device_name(device.index));
    r.peak_bytes_per_s = cuda::memory_bandwidth_bytes_per_s(device.index);
  }
  if (gpt) {  // a language model: the GPT, or another family (a llama) with its own FLOPs from the registry
    r.tokens = true;
    r.seq = cfg.model.block_size;
    r.vocab = cfg.model.vocab_size;
    r.peak_flops = device.is_cuda() ? cuda::dense_bf16_peak_flops(cuda::device_name(device.index)) : 0.0;
    if (dynamic_cast<const models::Gpt*>(&model.root())) {
      const models::GptOptions go = trainer::gpt_options(cfg.model);
      r.model = fmt::format("gpt-L{}-C{}", go.n_layer, go.n_embd);
      r.padded_vocab = models::padded_vocab(go);
      r.params_no_wpe = models::gpt_num_params(go, /*with_wpe=*/false);
      r.flops_per_token = models::gpt_flops_per_token(go, go.block_size);
    } else {
      r.model = fmt::format("{}-L{}-C{}", cfg.model.name, cfg.model.n_layer, cfg.model.n_embd);
      r.padded_vocab = r.vocab;
      r.flops_per_token = trainer::train_flops_per_row(cfg.model);
    }
  }
  return r;
}

// Seconds for o.steps calls of `step`, after the warm-up: CUDA events around them on an idle stream (and the
// profiler's range with --profiler-range) on a GPU, the host clock on the CPU.
double time_steps(const std::function<void()>& step, const Options& o, Device device, StreamHandle stream) {
  if (!device.is_cuda()) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.steps; ++i) step();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  cuda::Event start(/*timing=*/true), end(/*timing=*/true);
  cuda::stream_synchronize(stream);  // the warm-up done: the clock starts on an idle stream
  if (o.profiler_range) profiler_range(true);
  start.record(stream);
  for (int i = 0; i < o.steps; ++i) step();
  end.record(stream);
  end.synchronize();
  if (o.profiler_range) profiler_range(false);
  return end.elapsed_ms_since(start) / 1e3;
}

// --trace-steps: o.trace_steps calls of `step` under CUPTI's activity records, into r.trace; what happened (or why
// there is no trace) into r.trace_note. Never fails the run: the trace is a diagnostic.
void trace_kernels(Result& r, const Options& o, Device device, StreamHandle stream, const std::function<void()>& step) {
  if (!device.is_cuda()) {
    r.trace_note = "kernel trace: none on the CPU (CUPTI records GPU work)";
    return;
  }
  bench::KernelTrace trace;
  if (!trace.ok()) {
    r.trace_note = "kernel trace: " + trace.why();
    return;
  }
  try {
    cuda::device_synchronize();  // the steps before stay out of it
    trace.start();
    for (int i = 0; i < o.trace_steps; ++i) step();
    cuda::device_synchronize();  // every stream's work in, before the flush
    trace.stop();
  } catch (const std::exception& e) {
    r.trace_note = fmt::format("kernel trace: failed: {}", e.what());
    return;
  }
  r.trace = trace.rows();
  double ms = 0;
  for (const auto& t : r.trace) ms += t.ms;
  r.trace_note = fmt::format("kernel trace, {} more step(s) ({}): {:.3f} ms/step of GPU work under {} name(s)",
                             o.trace_steps, trace.version(), ms / o.trace_steps, r.trace.size());
  if (trace.unreadable() > 0)
    r.trace_note += fmt::format("; {} record(s) unreadable (another CUPTI's record layout?)", trace.unreadable());
  if (trace.untimed() > 0)
    r.trace_note += fmt::format("; {} record(s) without timestamps (left out)", trace.untimed());
  if (trace.dropped() > 0) r.trace_note += fmt::format("; {} record(s) dropped by CUPTI", trace.dropped());
}

// The timed steps' rates into r: ms per step, examples/s, and for a GPT tokens/s and MFU.
void add_rates(Result& r, const Options& o, double seconds, int64_t rows_per_step) {
  r.ms_per_step = seconds * 1e3 / o.steps;
  r.images_per_s = static_cast<double>(o.batch * o.steps) / seconds;
  if (r.tokens) {
    r.tokens_per_s = static_cast<double>(rows_per_step * o.steps) / seconds;
    if (r.peak_flops > 0) r.mfu = r.tokens_per_s * r.flops_per_token / r.peak_flops;
  }
}

// --kernel-steps: o.kernel_steps calls of `step` with `model` on models::TimedKernels over its kernel set (every call
// between two clock reads), into r's rows; the model's own set again after.
void time_operations(Result& r, const Options& o, models::Model& model, const std::function<void()>& step) {
  models::Kernels& k = model.kernels();
  models::TimedKernels timed(k);
  model.set_kernels(timed);
  for (int i = 0; i < o.kernel_steps; ++i) {
    timed.begin_step();  // the span from here: zeroing the gradients and the bf16 copy count, between calls
    step();
    timed.collect();
  }
  model.set_kernels(k);
  r.kernels = timed.rows();
  r.kernel_total_ms = timed.total_ms();
  r.kernel_between_ms = timed.between_ms();
}

// The model as dptrain's trainer sets it up (init, training mode, precision, determinism, bf16 activations) on
// `device`; ConfigError for a precision or fast path the model or device does not support.
std::unique_ptr<models::Model> bench_model(const Options& o, const trainer::Config& cfg,
                                           const std::vector<int64_t>& sample_shape, Device device) {
  auto model = trainer::build_model(cfg.model, sample_shape, o.classes, device);
  model->init(static_cast<uint64_t>(cfg.train.seed));
  model->set_training(true);
  try {
    model->set_precision(cfg.train.precision);
  } catch (const UnsupportedError& e) {
    DPT_THROW(ConfigError, "train.precision = {} on {}: {}", trainer::choice_name(cfg.train.precision), device.str(), e.what());
  }
  model->set_deterministic(cfg.train.deterministic);  // as dptrain's trainer sets it
  if (cfg.train.bf16_activations) {
    try {
      model->set_bf16_activations(true);  // the transformer fast path, as dptrain's trainer sets it
    } catch (const UnsupportedError& e) {
      DPT_THROW(ConfigError, "train.bf16_activations = true: {}", e.what());
    }
    spdlog::info("activations: bf16 (the transformer fast path)");
  }
  if (cfg.train.precision == models::Precision::F16)
    spdlog::warn("train.precision = fp16: no loss scaling here (timing only; dptrain's fp16 step also unscales and "
                 "checks the gradients)");
  return model;
}

// The kernel set's library sweep (--lt-sweep: margin nullopt) or tuning (--lt-tune: a margin), its lines; a failure,
// or nothing to sweep, said in a line (a diagnostic: never the run's failure).
std::vector<std::string> library_lines(models::Kernels& k, int candidates, std::optional<double> margin,
                                       Device device) {
  const char* what = margin ? "library tune" : "library sweep";
  try {
    std::vector<std::string> lines = k.sweep_library_choices(candidates, kSweepReps, margin);
    if (lines.empty()) lines.push_back(fmt::format("{}: no library plan to {} on {}", what, margin ? "tune" : "sweep",
                                                   device.str()));
    return lines;
  } catch (const std::exception& e) {
    return {fmt::format("{}: failed: {}", what, e.what())};
  }
}

// --cuda-graph: a step's zeroing, forward, loss and backward (`gradients`; with AdamW the optimizer's update too,
// reading the constants Optimizer::stage copies to the device before each launch) captured once, after one more
// eager `step` (whatever the warm-up's last plans, --lt-tune's, allocate on first use is made before the capture,
// which takes every buffer at the address it has then), and launched as one unit each step; SGD's update after it.
class StepGraph {
 public:
  StepGraph(trainer::Optimizer& optimizer, double lr, bool graph)
      : optimizer_(optimizer), lr_(lr), staged_(graph && optimizer.can_stage()) {}
  void capture(models::Model& model, StreamHandle stream, const std::function<void()>& step,
               const std::function<void()>& gradients) {
    step();
    if (staged_) optimizer_.stage(lr_, stream);  // (the block exists before the capture takes its address)
    reads_copy_ = model.params16_current();  // what the forward decides while captured, fixed in the graph
    graph_ = cuda::Graph::capture(stream, [&] {
      gradients();
      if (staged_) optimizer_.step_staged(nullptr, 0.0);
    });
    // Capturing ran nothing, but the captured forward marked the copy used (Model::forward): the warm-up update's
    // copy is still what the first launch reads.
    if (reads_copy_) model.params16_written();
    spdlog::info("CUDA graph: a step's zeroing, forward, loss and backward{} captured: {} nodes",
                 staged_ ? " and AdamW's update" : "", graph_.nodes());
  }
  // One step from the graph (with AdamW: its constants staged first), then the update's host part (SGD: the whole
  // update). The graph holds the forward's choice made while capturing, so a graph that reads the bf16 copy of the
  // parameters must find one the last update wrote before every launch (then used up, as the forward would:
  // params_written).
  void step(models::Model& model, StreamHandle stream) {
    DPT_CHECK(!reads_copy_ || model.params16_current(), "--cuda-graph: the captured forward reads the bf16 copy of "
              "the parameters, and the last update did not write it");
    if (staged_) optimizer_.stage(lr_, stream);
    graph_.launch(stream);
    if (reads_copy_) model.params_written();
    if (staged_)
      optimizer_.staged_done();
    else
      optimizer_.step(lr_);
  }
  bool defined() const { return graph_.defined(); }
  size_t nodes() const { return graph_.nodes(); }

 private:
  trainer::Optimizer& optimizer_;
  double lr_;
  bool staged_;  // AdamW: the update is in the graph
  cuda::Graph graph_;
  bool reads_copy_ = false;  // the captured forward reads the update's bf16 copy (no rounding pass)
};

// The options this program refuses with this config on this device (ConfigError: a usage error).
void check_options(const Options& o, const trainer::Config& cfg, const Device& device) {
  if (o.cuda_graph && !cfg.train.bf16_activations)
    DPT_THROW(ConfigError, "--cuda-graph is for the transformer fast path (train.bf16_activations = true), the one "
                           "whose capture is tested (a float32 step, BatchNorm's host-side counters, are not)");
  // train.autotune_bf16_grads widens the tuning, which here is --lt-tune's (train.autotune itself, which the config
  // check asks for with it, means nothing to this program).
  if (cfg.train.autotune_bf16_grads && o.lt_tune == 0)
    DPT_THROW(ConfigError, "train.autotune_bf16_grads = true widens --lt-tune's tuning: give --lt-tune N");
  if (o.cuda_graph && !device.is_cuda())
    DPT_THROW(ConfigError, "--cuda-graph captures a GPU step: the run is on {} ({})", device.str(),
              cfg.train.device == trainer::DeviceChoice::cpu ? "train.device = cpu" : cuda::unavailable_reason());
}

Result run(const Options& o, const trainer::Config& cfg) {
  const Device device =
      trainer::choose_device(cfg.train.device, 0, cuda::device_count(), cuda::unavailable_reason());
  check_options(o, cfg, device);
  if (device.is_cuda()) cuda::set_device(device.index);
  const trainer::ModelCard& family = trainer::model_card(cfg.model.name);
  const bool gpt = family.input == trainer::ModelInput::tokens;  // token windows in, the GPT table out
  const int64_t T = cfg.model.block_size;
  const std::vector<int64_t> sample_shape = gpt ? std::vector<int64_t>{T + 1} : o.shape;
  auto model = bench_model(o, cfg, sample_shape, device);
  // Weight decay as dptrain's training loop decides it (trainer.cpp): the family's grouping under auto.
  const bool decay_matrices_only =
      cfg.train.weight_decay_params == trainer::DecayParams::matrices ||
      (cfg.train.weight_decay_params == trainer::DecayParams::automatic && family.decay_matrices_only);
  trainer::Optimizer optimizer(cfg.train, *model, decay_matrices_only);
  models::SoftmaxCrossEntropy loss;
  models::Kernels& k = model->kernels();
  const StreamHandle stream = k.stream();  // nullptr on the CPU
  const uint64_t data_seed = static_cast<uint64_t>(cfg.train.seed) + 1;
  auto [x, y] = gpt ? random_tokens(o.batch, T, cfg.model.vocab_size, device, data_seed)
                    : random_images(o, device, data_seed);
  Tensor stats = Tensor::zeros({3}, DType::F64, device);  // summed loss, correct: on the device

  Result r = describe_run(*model, cfg, device, gpt);
  if (o.peak_tflops > 0) {  // the user's peak over the table's: for MFU and the floors
    r.tensor_peak_flops = o.peak_tflops * 1e12;
    if (gpt) r.peak_flops = r.tensor_peak_flops;
  }
  if (o.peak_gbps > 0) r.peak_bytes_per_s = o.peak_gbps * 1e9;
  const int64_t rows_per_step = gpt ? o.batch * T : o.batch;  // loss rows: examples, or tokens
  const std::string example = gpt ? fmt::format("{}", T) : fmt::format("{}", fmt::join(o.shape, ", "));
  spdlog::info("{} on {}, precision {}, batch [{}, {}], {} warm-up + {} timed steps", model->summary(),
               r.device_name, r.precision, o.batch, example, o.warmup, o.steps);

  const double lr = cfg.train.lr;  // constant: the schedule costs nothing and would only blur the comparison
  PhaseClock clock(device.is_cuda(), stream);
  // The step up to the optimizer's update (what --cuda-graph captures), then the update.
  auto gradients = [&](PhaseClock* c) {
    if (c) c->mark(0);
    model->zero_grad();
    const Tensor& logits = model->forward(x);
    if (c) c->mark(1);
    loss.accumulate(logits, y, model->kernels(), stats, /*backward=*/true);  // k, or --kernel-steps' TimedKernels
    if (c) c->mark(2);
    model->backward(loss.grad());
    if (c) c->mark(3);
  };
  auto step = [&](PhaseClock* c) {
    gradients(c);
    optimizer.step(lr);
    if (c) c->mark(4);
  };

  for (int i = 0; i < o.warmup; ++i) step(nullptr);
  // As train.autotune after a first step: the timed steps run what it kept.
  if (o.lt_tune > 0) {
    k.set_autotune_bf16_grads(cfg.train.autotune_bf16_grads);
    r.library_tune = library_lines(k, o.lt_tune, models::Kernels::kTuneMargin, device);
    // One more step before the clock: what the switched plans allocate on first use (a larger convolution
    // workspace, a bf16 scratch) is not timed, as PyTorch's cudnn.benchmark rows' warm-up makes theirs.
    if (!o.cuda_graph) step(nullptr);  // (--cuda-graph's capture runs one itself)
  }
  StepGraph graph(optimizer, lr, o.cuda_graph);
  if (o.cuda_graph) {
    graph.capture(*model, stream, [&] { step(nullptr); }, [&] { gradients(nullptr); });
    r.graph_nodes = graph.nodes();
    graph.step(*model, stream);  // once before the clock (capturing ran nothing)
  }
  stats.zero_(stream);
  const double seconds = time_steps(
      [&] {
        if (graph.defined())
          graph.step(*model, stream);
        else
          step(nullptr);
      },
      o, device, stream);
  const Tensor s = stats.to(Device::cpu());  // synchronous
  r.loss = s.data<double>()[0] / static_cast<double>(rows_per_step * o.steps);
  add_rates(r, o, seconds, rows_per_step);
  // The row's number on file before the diagnostics after it (a crash or a hang there, in code a GPU may not have
  // run yet, then costs the report its diagnostics, not the number); written again, whole, at the end.
  if (!o.json_path.empty() && std::isfinite(r.loss)) write_json(o.json_path, r, o);

  // Where the time goes, after the timed steps (their clock reads would otherwise sit inside the timing).
  for (int i = 0; i < o.phase_steps; ++i) {
    step(&clock);
    clock.add(r.phase_ms);
  }
  for (double& ms : r.phase_ms) ms /= std::max(o.phase_steps, 1);
  // Then by operation: the same steps on the kernel set with a clock around every call (timed_kernels.h).
  if (o.kernel_steps > 0) time_operations(r, o, *model, [&] { step(nullptr); });
  r.library_choices = k.library_choices();
  // Diagnostics only, on scratch operands.
  if (o.lt_sweep > 0) r.library_sweep = library_lines(k, o.lt_sweep, std::nullopt, device);
  // Last: CUPTI stays loaded once used, so nothing timed comes after it.
  if (o.trace_steps > 0) trace_kernels(r, o, device, stream, [&] { step(nullptr); });
  return r;
}

// --kernel-steps's lines: per step, the span, the time in the kernel set's calls and outside them, then the
// operations, most time first, each with its achieved arithmetic and memory rates and its time over its floor
// (TimedKernels::floor_ms: "-" where a peak is not known), and the floors' sum against those rows' time.
void print_kernels(const Result& r, const Options& o) {
  const double n = o.kernel_steps, span = r.kernel_total_ms / n;
  const auto share = [&](double ms) { return span > 0 ? 100 * ms / span : 0.0; };
  double in_calls = 0;
  for (const auto& k : r.kernels) in_calls += k.ms / n;
  const FloorSums fs = floor_sums(r, n);
  fmt::print("# kernels, mean of {} more steps ({}): a step's span {:.3f} ms: {:.3f} ms in {} operation(s) of the "
             "kernel set, {:.3f} ms ({:.1f}%) outside them\n",
             o.kernel_steps, r.device.starts_with("cuda") ? "CUDA events around each call" : "steady_clock", span,
             in_calls, r.kernels.size(), r.kernel_between_ms / n, share(r.kernel_between_ms / n));
  if (r.peak_bytes_per_s > 0 && fs.floor_ms > 0)
    fmt::print("# kernels' floors: {:.3f} ms/step for {} operation(s) at the device's peaks ({} dense bf16, "
               "{:.4g} GB/s){}: they took {:.3f} ms/step, {:.2f}x that\n",
               fs.floor_ms, static_cast<int64_t>(r.kernels.size()) - fs.unknown,
               r.tensor_peak_flops > 0 ? fmt::format("{:.4g} TFLOP/s", r.tensor_peak_flops / 1e12) : "- TFLOP/s",
               r.peak_bytes_per_s / 1e9, fs.unknown ? fmt::format(", {} without one", fs.unknown) : std::string(),
               fs.ms, fs.ms / fs.floor_ms);
  fmt::print("# kernel {:>9} {:>6} {:>6} {:>8} {:>8} {:>7}  {}\n", "ms/step", "%", "calls", "TFLOP/s", "GB/s",
             "x floor", "operation: shape");
  const auto rate = [](double amount, double ms, double unit) {
    return amount > 0 && ms > 0 ? fmt::format("{:.4g}", amount / (ms * 1e-3) / unit) : std::string("-");
  };
  const size_t shown = std::min(r.kernels.size(), static_cast<size_t>(o.kernel_lines));
  for (size_t i = 0; i < shown; ++i) {
    const auto& k = r.kernels[i];
    const double floor = kernel_floor_ms(k, r, n);
    fmt::print("# kernel {:>9.3f} {:>6.1f} {:>6g} {:>8} {:>8} {:>7}  {}: {}\n", k.ms / n, share(k.ms / n), k.calls / n,
               rate(k.flops, k.ms, 1e12), rate(k.bytes, k.ms, 1e9),
               floor > 0 ? fmt::format("{:.2f}", k.ms / n / floor) : std::string("-"), k.op, k.shape);
  }
  if (shown < r.kernels.size()) {
    double rest = 0;
    for (size_t i = shown; i < r.kernels.size(); ++i) rest += r.kernels[i].ms / n;
    fmt::print("# kernel {:>9.3f} {:>6.1f} {:>6}  the other {} operation(s) (--kernel-lines; all in the JSON)\n", rest,
               share(rest), "", r.kernels.size() - shown);
  }
}

// --trace-steps's lines: what the trace was, then its rows in torch_gpt.py --profile-out's columns (ms/step, %,
// calls/step, kernel: its first 140 characters, as there; whole in the JSON), the first --kernel-lines of them.
void print_trace(const Result& r, const Options& o) {
  fmt::print("# {}\n", r.trace_note);
  if (r.trace.empty()) return;
  double total = 0;
  for (const auto& t : r.trace) total += t.ms;
  fmt::print("# trace {:>8} {:>6} {:>11}  {}\n", "ms/step", "%", "calls/step", "kernel");
  const size_t shown = std::min(r.trace.size(), static_cast<size_t>(o.kernel_lines));
  for (size_t i = 0; i < shown; ++i) {
    const auto& t = r.trace[i];
    fmt::print("# trace {:>8.3f} {:>6.1f} {:>11.1f}  {}\n", t.ms / o.trace_steps, total > 0 ? 100 * t.ms / total : 0.0,
               static_cast<double>(t.calls) / o.trace_steps, t.name.substr(0, 140));
  }
}

// Parses the command line into `o`; returns the exit code when the program should stop (help, usage error).
std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "dpt-model-bench: training-step throughput of one dptrain model on one device (no data loading, no\n"
      "collectives): one random batch made on the device, --warmup untimed steps, then --steps timed steps of\n"
      "forward + softmax cross-entropy + backward + optimizer step. Prints one table row (time per step,\n"
      "images/s or, for a GPT, tokens/s and MFU, the mean loss) on stdout; the model, device and precision come\n"
      "from dptrain's config keys."};
  app.add_option("-c,--config", o.config_path, "TOML experiment file, as dptrain's (optional)")
      ->check(CLI::ExistingFile);
  app.add_option("--batch", o.batch, "examples (a GPT: sequences) per step (default: train.batch_size)")
      ->check(dpt::cli::Positive);
  // One argument "C,H,W" (a list option would also take the config overrides after it as its values).
  app.add_option_function<std::string>(
         "--shape",
         [&o](const std::string& text) {
           const auto bad = [&] {
             return CLI::ValidationError("--shape", fmt::format("'{}' is not C,H,W (three positive integers)", text));
           };
           std::vector<int64_t> dims;
           std::istringstream in(text);
           for (std::string part; std::getline(in, part, ',');) {
             size_t used = 0;
             int64_t v = 0;
             try {
               v = std::stoll(part, &used);
             } catch (const std::exception&) {
               throw bad();
             }
             if (used != part.size() || v < 1) throw bad();
             dims.push_back(v);
           }
           if (dims.size() != 3 || text.back() == ',') throw bad();
           o.shape = dims;
         },
         "one example's shape C,H,W (images; a GPT reads model.block_size tokens)")
      ->default_str(fmt::format("{}", fmt::join(o.shape, ",")));
  app.add_option("--classes", o.classes,
                 "label classes, the model's outputs (model.num_classes, when set, must equal it; not a GPT's)")
      ->check(dpt::cli::Positive)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first (allocations, algorithm choices, caches)")
      ->check(dpt::cli::NonNegative)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->check(dpt::cli::Positive)->capture_default_str();
  app.add_option("--phase-steps", o.phase_steps,
                 "after the timed steps, this many steps timed phase by phase (forward, loss, backward, optimizer)")
      ->check(dpt::cli::NonNegative)
      ->capture_default_str();
  app.add_option("--kernel-steps", o.kernel_steps,
                 "after those, this many steps with a clock around every kernel-set call: time per operation and "
                 "shape (CUDA events on a GPU)")
      ->check(dpt::cli::NonNegative)
      ->capture_default_str();
  app.add_option("--kernel-lines", o.kernel_lines, "the operations --kernel-steps prints, most time first (the JSON "
                 "has them all)")
      ->check(dpt::cli::Positive)
      ->capture_default_str();
  app.add_option("--lt-sweep", o.lt_sweep,
                 "after the steps, each cuBLASLt plan the run made timed again on scratch operands with the first N "
                 "algorithms cuBLASLt's heuristic proposes (at most 16) and split-K variants of the one it runs "
                 "and the next two (2-16 parts), " + std::to_string(kSweepReps) +
                     " calls each, against the one it runs: whether another would pay; then each cuDNN attention "
                     "graph with up to N (at most 4) of the plans cuDNN proposes, and each convolution's directions "
                     "with every other algorithm cuDNN has for them (GPU; 0: none)")
      ->check(dpt::cli::NonNegative)
      ->capture_default_str();
  app.add_option("--lt-tune", o.lt_tune,
                 "after the warm-up steps, the same as --lt-sweep, and a plan whose fastest candidate is 3% faster "
                 "(timed twice) runs it in the timed steps: train.autotune's tuning, as cudnn.benchmark for the "
                 "convolutions; with train.autotune=true train.autotune_bf16_grads=true a weight gradient may also "
                 "switch to torch.autocast's bf16 product (GPU; 0: none)")
      ->check(dpt::cli::NonNegative)
      ->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops,
                 "the device's dense bf16 peak in TFLOP/s, for MFU and --kernel-steps' floors (default: dptrain's "
                 "table of H100, H200, H800, A100 and A800; other devices have none, and no MFU)")
      ->check(dpt::cli::Positive);
  app.add_option("--peak-gbps", o.peak_gbps,
                 "the device's memory bandwidth in GB/s, for --kernel-steps' floors (default on a GPU: its memory "
                 "clock x bus width x 2; none on the CPU)")
      ->check(dpt::cli::Positive);
  app.add_flag("--cuda-profiler-range", o.profiler_range,
               "the timed steps between cudaProfilerStart/Stop (nsys profile --capture-range=cudaProfilerApi)");
  app.add_option("--trace-steps", o.trace_steps,
                 "last, this many steps (launched call by call, also with --cuda-graph) with CUPTI's activity "
                 "records on: each GPU kernel, copy and memset by name with its time per step, as torch.profiler's "
                 "table (GPU; CUPTI loaded at run time, DPT_CUPTI_LIB names its file; 0: none)")
      ->check(dpt::cli::NonNegative)
      ->capture_default_str();
  app.add_flag("--cuda-graph", o.cuda_graph,
               "the timed steps replay one CUDA graph of a step's zeroing, forward, loss and backward, captured after "
               "the warm-up (and --lt-tune), with AdamW its update too (its lr and step copied to the device before "
               "each launch); SGD's update launched after it (GPU)");
  app.add_option("--json", o.json_path, "also write the result to this file as JSON");
  app.add_option("overrides", o.overrides,
                 "dptrain config overrides, key=value: model.name=resnet model.depth=18 train.device=cuda "
                 "train.precision=bf16 ... (`dptrain --help` lists the keys)");
  app.footer(
      "Examples:\n"
      "  dpt-model-bench --batch 256 --shape 3,32,32 --classes 10 model.name=resnet model.depth=18\n"
      "  dpt-model-bench --batch 128 --shape 3,224,224 --classes 1000 model.name=resnet model.depth=34 \\\n"
      "      train.device=cuda train.precision=bf16 --json resnet34.json\n"
      "  dpt-model-bench --config configs/gpt2_124m.toml --batch 16 train.device=cuda   # GPT-2 124M, T 1024\n"
      "  dpt-model-bench --config configs/gpt2_124m.toml --batch 16 --kernel-steps 3 train.device=cuda \\\n"
      "      train.precision=bf16 train.bf16_activations=true   # the fast path, and its time by operation\n"
      "Exit status: 0 on success, 1 when the step failed or the loss was not finite, 2 for a usage or config "
      "error.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help (rc 0) or the error and usage
    return rc == 0 ? 0 : kExitUsage;
  }
  return std::nullopt;
}

// OpenBLAS picks its kernels when it loads; on CPUs it does not recognise it runs slow Prescott kernels, and
// only OPENBLAS_CORETYPE in a new process's environment changes that. As dptrain (trainer/main.cpp), restart
// once with it, unless the user set OPENBLAS_CORETYPE or DPT_NO_BLAS_REEXEC.
void reexec_for_fast_blas(char** argv) {
  if (std::getenv("DPT_NO_BLAS_REEXEC") || std::getenv("DPT_BLAS_REEXEC_FROM")) return;
  const std::string core = models::blas_core_upgrade();
  if (core.empty()) return;
  const std::string from = models::blas_core();
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  setenv("DPT_BLAS_REEXEC_FROM", from.c_str(), 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // execv failed: carry on with the slow kernels
}

}  // namespace

int main(int argc, char** argv) {
  reexec_for_fast_blas(argv);
  Options o;
  if (auto rc = parse_options(argc, argv, o)) return *rc;
  // Logs on stderr: stdout carries only the table, so `> result.txt` keeps it clean.
  spdlog::set_default_logger(spdlog::stderr_color_mt("dpt-model-bench"));
  init_logging(0, 1);

  trainer::Config cfg;
  try {
    // The config check pairs a language model (model.name = gpt) with data.dataset = tokens; this program reads no
    // data set, so naming such a family on the command line brings the dataset key with it.
    std::vector<std::string> overrides = o.overrides;
    const auto has = [&](const std::string& prefix) {
      return std::any_of(overrides.begin(), overrides.end(),
                         [&](const std::string& kv) { return kv.starts_with(prefix); });
    };
    const std::vector<std::string> token_models = trainer::model_names(trainer::ModelInput::tokens);
    const bool token_model = std::any_of(token_models.begin(), token_models.end(),
                                         [&](const std::string& name) { return has("model.name=" + name); });
    if (token_model && !has("data.dataset=")) overrides.insert(overrides.begin(), "data.dataset=tokens");
    cfg = trainer::load_config(o.config_path, overrides);
    if (const std::string resolved = trainer::resolve_model_config(cfg.model); !resolved.empty()) spdlog::info("{}", resolved);
    if (!std::getenv("DPT_LOG_LEVEL")) spdlog::set_level(parse_log_level(cfg.log.level));
    if (o.batch == 0) o.batch = cfg.train.batch_size;
  } catch (const Error& e) {
    die(kExitUsage, e.what());
  }
  if (const char* from = std::getenv("DPT_BLAS_REEXEC_FROM"))
    spdlog::info("OpenBLAS: {} kernels (OPENBLAS_CORETYPE; it had chosen {} for this CPU)", models::blas_core(), from);

  try {
    const Result r = run(o, cfg);
    fmt::print("# dpt-model-bench: {} ({} parameters) on {}; step = forward + softmax cross-entropy + backward + "
               "{} (lr {}), one batch made on the device\n",
               r.model, r.params, r.device_name, trainer::choice_name(cfg.train.optimizer), cfg.train.lr);
    const std::string peak =
        r.peak_flops > 0 ? fmt::format("{:.4g} TFLOP/s", r.peak_flops / 1e12) : std::string("- (unknown here)");
    if (r.tokens && r.params_no_wpe > 0)
      fmt::print("# tokens: vocab {} (padded to {}), T {}; {:.4g} FLOP/token (6 N + 12 L T C, N = {} without wpe); "
                 "MFU against a dense bf16 peak of {}\n",
                 r.vocab, r.padded_vocab, r.seq, r.flops_per_token, r.params_no_wpe, peak);
    else if (r.tokens)
      fmt::print("# tokens: vocab {}, T {}; {:.4g} FLOP/token (the family's estimate); MFU against a dense bf16 "
                 "peak of {}\n", r.vocab, r.seq, r.flops_per_token, peak);
    fmt::print("# warmup {} steps, timed {} steps ({})\n", o.warmup, o.steps,
               r.device.starts_with("cuda") ? "CUDA events on the compute stream" : "steady_clock");
    if (o.cuda_graph)
      fmt::print("# CUDA graph: each timed step one launch of a graph of {} nodes (zeroing, forward, loss, backward "
                 "and AdamW's update, its lr and step staged before the launch; SGD's update after it; captured after "
                 "the warm-up)\n", r.graph_nodes);
    if (o.phase_steps > 0) {
      double total = 0;
      for (double ms : r.phase_ms) total += ms;
      std::string parts;
      for (size_t i = 0; i < kPhases.size(); ++i)
        parts += fmt::format("{}{} {:.2f} ms ({:.0f}%)", i ? ", " : "", kPhases[i], r.phase_ms[i],
                             total > 0 ? 100 * r.phase_ms[i] / total : 0.0);
      fmt::print("# phases, mean of {} more steps: {}; sum {:.2f} ms\n", o.phase_steps, parts, total);
    }
    if (o.kernel_steps > 0) print_kernels(r, o);
    if (o.trace_steps > 0) print_trace(r, o);
    for (const std::string& c : r.library_choices) fmt::print("# {}\n", c);
    for (const std::string& c : r.library_tune) fmt::print("# tune: {}\n", c);
    for (const std::string& c : r.library_sweep) fmt::print("# {}\n", c);
    fmt::print("#\n");
    if (r.tokens) {
      print_gpt_header();
      print_gpt_row(r, o);
    } else {
      print_header();
      print_row(r, o);
    }
    if (!o.json_path.empty()) write_json(o.json_path, r, o);
    if (!std::isfinite(r.loss)) {
      spdlog::error("the mean loss over the timed steps is {}: the step computed garbage", r.loss);
      return kExitError;
    }
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    die(kExitError, e.what());
  }
  return 0;
}
