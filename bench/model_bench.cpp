// bench/model_bench.cpp: dpt-model-bench, the training-step throughput of one model on one device, in the
// manner of nccl-tests: a harness owning warm-up, timing, a sanity check and a fixed-width table row.
//
// The model comes from the same config as dptrain's (a TOML file and key=value overrides: model.*,
// train.device, train.precision, train.optimizer, train.lr, ...) through trainer::build_model. One random
// batch [N, C, H, W] with random labels is made once, directly in the device's memory, so the timed loop is
// the step alone: forward, softmax cross-entropy, backward, optimizer step (trainer::Optimizer), with no data
// loading, host-to-device copies or collectives. After --warmup untimed steps, --steps steps are timed: on a
// GPU with CUDA events on the model's compute stream (device time, kernel-launch gaps included), on the CPU
// with steady_clock. images/s = batch * steps / time. The check: the mean loss over the timed steps must be
// finite (exit 1 otherwise). The PyTorch reference prints the same row: scripts/bench/torch_resnet.py.
//
// stdout carries only the table (logs go to stderr); --json FILE writes the result for scripts.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/check.h"
#include "core/cuda.h"
#include "core/logging.h"
#include "core/tensor.h"
#include "models/kernels/cpu/cpu_kernels.h"
#include "models/layers.h"
#include "models/model.h"
#include "trainer/build_model.h"
#include "trainer/config.h"
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
  std::string json_path;
};

struct Result {
  std::string model;     // "resnet18"
  int64_t params = 0;
  std::string precision;  // train.precision: fp32 | bf16 | fp16
  std::string device;     // "cpu", "cuda:0"
  std::string device_name;
  double ms_per_step = 0;
  double images_per_s = 0;
  double loss = 0;  // mean over the timed steps' examples
};

models::Precision parse_precision(const std::string& p) {
  if (p == "bf16") return models::Precision::BF16;
  if (p == "fp16") return models::Precision::F16;
  if (p != "fp32") DPT_THROW(ConfigError, "train.precision = {}: must be one of fp32, bf16, fp16", p);
  return models::Precision::F32;
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

// The table, shared with scripts/bench/torch_resnet.py (same columns, same widths).
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

void write_json(const std::string& path, const Result& r, const Options& o) {
  nlohmann::json j{{"program", "dptrain"},
                   {"model", r.model},
                   {"params", r.params},
                   {"shape", o.shape},
                   {"batch", o.batch},
                   {"classes", o.classes},
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
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) DPT_THROW(IoError, "--json {}: cannot write it", path);
}

// One random batch, made on the host once and copied to the device: standard normal images and labels
// uniform in [0, classes).
std::pair<Tensor, Tensor> random_batch(const Options& o, Device device, uint64_t seed) {
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

Result run(const Options& o, const trainer::Config& cfg) {
  const Device device =
      trainer::choose_device(cfg.train.device, 0, cuda::device_count(), cuda::unavailable_reason());
  if (device.is_cuda()) cuda::set_device(device.index);
  auto model = trainer::build_model(cfg.model, o.shape, o.classes, device);
  model->init(static_cast<uint64_t>(cfg.train.seed));
  model->set_training(true);
  try {
    model->set_precision(parse_precision(cfg.train.precision));
  } catch (const UnsupportedError& e) {
    DPT_THROW(ConfigError, "train.precision = {} on {}: {}", cfg.train.precision, device.str(), e.what());
  }
  if (cfg.train.precision == "fp16")
    spdlog::warn("train.precision = fp16: no loss scaling here (timing only; dptrain's fp16 step also unscales and "
                 "checks the gradients)");
  trainer::Optimizer optimizer(cfg.train, *model);
  models::SoftmaxCrossEntropy loss;
  models::Kernels& k = model->kernels();
  const StreamHandle stream = k.stream();  // nullptr on the CPU
  auto [x, y] = random_batch(o, device, static_cast<uint64_t>(cfg.train.seed) + 1);
  Tensor stats = Tensor::zeros({2}, DType::F64, device);  // summed loss, correct: on the device

  Result r;
  r.model = short_model_name(*model);
  r.params = static_cast<int64_t>(model->num_params());
  r.precision = cfg.train.precision;
  r.device = device.str();
  r.device_name = device.is_cuda() ? cuda::device_description(device.index)
                                   : fmt::format("cpu (OpenBLAS {} kernels)", models::blas_core());
  spdlog::info("{} on {}, precision {}, batch [{}, {}], {} warm-up + {} timed steps", model->summary(),
               r.device_name, r.precision, o.batch, fmt::join(o.shape, ", "), o.warmup, o.steps);

  const double lr = cfg.train.lr;  // constant: the schedule costs nothing and would only blur the comparison
  auto step = [&] {
    model->zero_grad();
    loss.accumulate(model->forward(x), y, k, stats, /*backward=*/true);
    model->backward(loss.grad());
    optimizer.step(lr);
  };

  for (int i = 0; i < o.warmup; ++i) step();
  stats.zero_(stream);
  double seconds = 0;
  if (device.is_cuda()) {
    cuda::Event start(/*timing=*/true), end(/*timing=*/true);
    cuda::stream_synchronize(stream);  // the warm-up done: the clock starts on an idle stream
    start.record(stream);
    for (int i = 0; i < o.steps; ++i) step();
    end.record(stream);
    end.synchronize();
    seconds = end.elapsed_ms_since(start) / 1e3;
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.steps; ++i) step();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const Tensor s = stats.to(Device::cpu());  // synchronous
  r.loss = s.data<double>()[0] / static_cast<double>(o.batch * o.steps);
  r.ms_per_step = seconds * 1e3 / o.steps;
  r.images_per_s = static_cast<double>(o.batch * o.steps) / seconds;
  return r;
}

// Parses the command line into `o`; returns the exit code when the program should stop (help, usage error).
std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "dpt-model-bench: training-step throughput of one dptrain model on one device (no data loading, no\n"
      "collectives): one random batch made on the device, --warmup untimed steps, then --steps timed steps of\n"
      "forward + softmax cross-entropy + backward + optimizer step. Prints one table row (time per step,\n"
      "images/s, the mean loss) on stdout; the model, device and precision come from dptrain's config keys."};
  app.add_option("-c,--config", o.config_path, "TOML experiment file, as dptrain's (optional)")
      ->check(CLI::ExistingFile);
  app.add_option("--batch", o.batch, "examples per step (default: train.batch_size)")->check(CLI::PositiveNumber);
  app.add_option("--shape", o.shape, "one example's shape C,H,W")
      ->delimiter(',')
      ->expected(3)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--classes", o.classes, "label classes (the model's unless model.num_classes is set)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first (allocations, algorithm choices, caches)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--json", o.json_path, "also write the result to this file as JSON");
  app.add_option("overrides", o.overrides,
                 "dptrain config overrides, key=value: model.name=resnet model.depth=18 train.device=cuda "
                 "train.precision=bf16 ... (`dptrain --help` lists the keys)");
  app.footer(
      "Examples:\n"
      "  dpt-model-bench --batch 256 --shape 3,32,32 --classes 10 model.name=resnet model.depth=18\n"
      "  dpt-model-bench --batch 128 --shape 3,224,224 --classes 1000 model.name=resnet model.depth=34 \\\n"
      "      train.device=cuda train.precision=bf16 --json resnet34.json\n"
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
    cfg = trainer::load_config(o.config_path, o.overrides);
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
               r.model, r.params, r.device_name, cfg.train.optimizer, cfg.train.lr);
    fmt::print("# warmup {} steps, timed {} steps ({})\n#\n", o.warmup, o.steps,
               r.device.starts_with("cuda") ? "CUDA events on the compute stream" : "steady_clock");
    print_header();
    print_row(r, o);
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
