// trainer/config.h: the experiment configuration: typed structs with defaults, read from a TOML file plus
// `key=value` overrides, validated once, printed by rank 0, stored in checkpoints.
//
// Every key is defined once, in the schema in config.cpp (key, type, default, help, check): the parser, the
// validation, the printed effective config and `dptrain --help` all come from that one table, so the help
// cannot drift from the parser.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/kernels/kernel_params.h"
#include "trainer/choice.h"
#include "trainer/model_config.h"

namespace dpt::trainer {

// ---- choices: parsed once, here, into enums; the rest of the code switches on them -----------------------------

enum class OptimizerKind { sgd, adamw };
enum class ScheduleKind { constant, step, cosine };
enum class DecayParams { automatic, all, matrices };  // train.weight_decay_params: auto | all | matrices
enum class GradDtype { fp32, bf16 };
enum class OnCheckpointError { stop, warn };
enum class DeviceChoice { automatic, cpu, cuda };  // train.device: auto | cpu | cuda
enum class DatasetKind { fashion_mnist, imagefolder, synthetic, tokens, jsonl };  // data.dataset
// Token shards a language model reads: data.dataset = tokens, or jsonl (tokenized into token shards in data.dir).
inline bool token_data(DatasetKind k) { return k == DatasetKind::tokens || k == DatasetKind::jsonl; }

// The words a choice is written with in a config (and printed with), in the enum's order (trainer/choice.h).
template <> struct ChoiceNames<OptimizerKind> { static constexpr std::array<std::string_view, 2> names{"sgd", "adamw"}; };
template <> struct ChoiceNames<ScheduleKind> {
  static constexpr std::array<std::string_view, 3> names{"constant", "step", "cosine"};
};
template <> struct ChoiceNames<DecayParams> { static constexpr std::array<std::string_view, 3> names{"auto", "all", "matrices"}; };
template <> struct ChoiceNames<GradDtype> { static constexpr std::array<std::string_view, 2> names{"fp32", "bf16"}; };
template <> struct ChoiceNames<OnCheckpointError> { static constexpr std::array<std::string_view, 2> names{"stop", "warn"}; };
template <> struct ChoiceNames<DeviceChoice> { static constexpr std::array<std::string_view, 3> names{"auto", "cpu", "cuda"}; };
template <> struct ChoiceNames<DatasetKind> {
  static constexpr std::array<std::string_view, 5> names{"fashion-mnist", "imagefolder", "synthetic", "tokens", "jsonl"};
};
// train.precision: the models' Precision (F32, BF16, F16) as a config writes it.
template <> struct ChoiceNames<models::Precision> {
  static constexpr std::array<std::string_view, 3> names{"fp32", "bf16", "fp16"};
};

struct TrainConfig {
  int64_t epochs = 10;
  int64_t batch_size = 64;  // per rank
  DeviceChoice device = DeviceChoice::automatic;
  models::Precision precision = models::Precision::F32;  // GEMM and convolution arithmetic; fp16 adds loss scaling
  bool bf16_activations = false;  // the transformer fast path (GPT, Llama): bf16 activations in training; needs precision bf16
  bool deterministic = true;  // GPU: only library algorithms that give the same bits on every run (Kernels::set_deterministic)
  bool autotune = false;  // GPU: after the first step, each cuBLASLt plan timed with its candidates, the fastest kept
  bool autotune_bf16_grads = false;  // with autotune: weight gradients may switch to bf16 products (torch.autocast's)
  bool cuda_graph = false;  // GPU fast path, 1 rank: each step (AdamW: its clip and update too) as one CUDA graph
  OptimizerKind optimizer = OptimizerKind::sgd;
  double lr = 0.05;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  // all | matrices (2-D and up) | auto (matrices for gpt and llama)
  DecayParams weight_decay_params = DecayParams::automatic;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  ScheduleKind schedule = ScheduleKind::cosine;
  double warmup_epochs = 0.0;
  int64_t warmup_steps = 0;  // the warm-up in optimizer steps instead (at most one of the two)
  int64_t step_size = 3;  // epochs between decays (schedule = step)
  double gamma = 0.1;     // decay factor (schedule = step)
  double min_lr = 0.0;    // floor of the cosine schedule
  int64_t seed = 42;
  bool drop_last = false;
  int64_t max_steps = 0;  // stop after this many optimizer steps (0: no limit)
  int64_t accum_steps = 1;      // micro-batches per optimizer step (gradient accumulation)
  // Samples per optimizer step whatever the world size (0: batch_size x accum_steps x world size): batch_size
  // becomes the largest micro-batch, and the micro-batch and accum_steps are derived per world size.
  int64_t global_batch_size = 0;
  double clip_grad_norm = 0.0;  // clip the global gradient L2 norm to this (0: off)
  int64_t eval_batch_size = 1000;
  double progress_interval_s = 10.0;
};

struct DataConfig {
  DatasetKind dataset = DatasetKind::fashion_mnist;
  std::string dir = "/usr/share/datasets/fashion-mnist";
  // Training transform: fashion-mnist: none | crop_flip; imagefolder: also random_resized_crop.
  std::string augment = "none";
  int64_t padding = 2;        // crop_flip: zero padding before the random crop
  int64_t image_size = 224;   // imagefolder: output height = width
  int64_t resize = 256;       // imagefolder: shorter side resized to this before the (center) crop; 0: none
  int64_t channels = 3;       // imagefolder: 1 (grey) or 3 (RGB)
  std::vector<double> mean = {0.485, 0.456, 0.406};  // imagefolder: per-channel normalisation
  std::vector<double> std = {0.229, 0.224, 0.225};
  bool skip_bad_images = false;  // imagefolder: skip unreadable images with a warning instead of failing
  int64_t workers = 1;        // threads decoding and transforming examples for the loader
  int64_t train_limit = 0;  // use only N training examples (0: all): Fashion-MNIST's first N, others spread evenly
  int64_t test_limit = 0;
  int64_t prefetch = 4;     // batches the loader prepares ahead
  int64_t synthetic_train_size = 8192;
  int64_t synthetic_test_size = 2048;
  std::vector<int64_t> synthetic_shape = {784};  // one example's shape: [F] or [C, H, W]
  // jsonl: fine-tuning records (data/jsonl.h), tokenized once into token shards with loss masks in `dir`.
  std::vector<std::string> jsonl;  // files, or directories of *.jsonl files
  std::string tokenizer;           // "": model.init_from's folder when it holds one, else bytes
  std::string eos_token;           // "": the tokenizer's
  bool skip_bad_lines = false;
  int64_t val_every = 10;          // every Nth record is validation
};

struct DistConfig {
  std::string backend = "auto";  // auto | gloo | mpi | nccl
  double timeout_s = 300.0;
  double bucket_cap_mb = 25.0;  // gradient bucket size (the first bucket is at most 1 MB)
  // auto | true | false: all-reduce buckets while backward runs (false: one all-reduce after it); auto: true when
  // the model trains on a GPU, false on the CPU (where no core is idle for the overlap).
  std::string overlap = "auto";
  bool broadcast_buffers = true;  // rank 0's buffers (BatchNorm running statistics) to every rank each step
  GradDtype grad_dtype = GradDtype::fp32;  // what the gradient all-reduce carries (bf16: half the bytes)
  int64_t zero = 0;               // 0: DDP; 1: ZeRO stage 1, the optimizer state sharded over the ranks; 2: gradients too; 3: parameters too
  std::string interface = "";     // gloo: the network interface to listen on ("": the one routing to the master)
};

struct CheckpointConfig {
  std::string dir = "checkpoints";
  int64_t keep = 3;
  int64_t every_epochs = 1;
  int64_t every_steps = 0;  // also every N optimizer steps (0: only at epoch ends)
  OnCheckpointError on_error = OnCheckpointError::stop;  // a failed write: stop (the run fails) | warn (goes on)
};

struct LogConfig {
  std::string level = "info";
  std::string dir = "";  // where rank 0 appends metrics.jsonl ("": the folder holding checkpoint.dir)
  bool tensorboard = false;  // also TensorBoard event files in that folder (trainer/report/tensorboard.h)
  bool memory = false;       // memory figures on every progress line and progress record, not only per epoch
  bool curves = false;       // rank 0 redraws curves.png beside metrics.jsonl after each epoch (trainer/report/plot.h)
};

struct Config {
  TrainConfig train;
  DataConfig data;
  ModelConfig model;
  DistConfig dist;
  CheckpointConfig checkpoint;
  LogConfig log;
};

// Reads `path` (empty: defaults only), applies `overrides` ("train.lr=0.1", "model.hidden=[256,256]",
// "dist.backend=gloo"), validates. Throws ConfigError naming the file/line, key and the problem; unknown
// keys list the valid ones.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);
// Parses a config from TOML text (for checkpoints and tests), then applies `overrides`; same checks.
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

// The keys `c` sets to another value than their default that its model, data set, optimizer or schedule does not
// read (model.n_kv_head with model.name = gpt, train.momentum with adamw, data.eos_token with data.dataset = tokens):
// one line each, naming the key and what it applies to. Rank 0 warns with them when training starts.
std::vector<std::string> unread_keys(const Config& c);

// The effective config as TOML, every key, in schema order.
std::string to_toml(const Config& c);
// A short stable hash of to_toml(c), hex.
std::string config_hash(const Config& c);
// Help text listing every key: "  train.lr  float  0.05  learning rate (peak when a schedule is used)".
std::string config_keys_help();
// The configuration reference as a Markdown page, from the same schema: one table per section (train, data,
// model, dist, checkpoint, log) with every key's type, default and meaning. `dptrain config-reference` prints
// it; docs/configuration.md is its output, and a unit test fails when the committed file differs.
std::string config_reference_markdown();

}  // namespace dpt::trainer
