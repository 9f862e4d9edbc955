// trainer/config.cpp: the config schema (one table: key, type, default, help, check) and the TOML reader.
#include "trainer/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <sstream>
#include <type_traits>

#include "core/check.h"
#include "core/edit_distance.h"
#include "trainer/model_registry.h"

namespace dpt::trainer {
namespace {

// ---- value conversion per C++ type ------------------------------------------------------------------

template <class T> struct Kind;

template <> struct Kind<int64_t> {
  static constexpr const char* name = "integer";
  static std::optional<int64_t> read(const toml::node& n) { return n.is_integer() ? n.value<int64_t>() : std::nullopt; }
  static std::string show(int64_t v) { return std::to_string(v); }
};
template <> struct Kind<double> {
  static constexpr const char* name = "float";
  static std::optional<double> read(const toml::node& n) {
    if (n.is_floating_point() || n.is_integer()) return n.value<double>();
    return std::nullopt;
  }
  static std::string show(double v) {
    std::string s = fmt::format("{}", v);
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stay a TOML float
    return s;
  }
};
template <> struct Kind<bool> {
  static constexpr const char* name = "boolean";
  static std::optional<bool> read(const toml::node& n) { return n.is_boolean() ? n.value<bool>() : std::nullopt; }
  static std::string show(bool v) { return v ? "true" : "false"; }
};
template <> struct Kind<std::string> {
  static constexpr const char* name = "string";
  static std::optional<std::string> read(const toml::node& n) {
    // Words like true/false are strings too where a key takes a word (dist.overlap = false).
    if (n.is_boolean()) return *n.value<bool>() ? "true" : "false";
    return n.is_string() ? n.value<std::string>() : std::nullopt;
  }
  static std::string show(const std::string& v) {
    // toml++ writes a string with a line break as a multi-line literal ('''\n'''), whose first line break a reader
    // drops: such strings (data.eos_token = "\n") are written as basic strings with escapes here instead.
    if (std::none_of(v.begin(), v.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; })) {
      std::ostringstream os;
      os << toml::value<std::string>(v);  // quoted and escaped as TOML
      return os.str();
    }
    std::string out = "\"";
    for (const char ch : v) {
      const auto u = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') out += {'\\', ch};
      else if (ch == '\n') out += "\\n";
      else if (ch == '\t') out += "\\t";
      else if (ch == '\r') out += "\\r";
      else if (u < 0x20 || u == 0x7f) out += fmt::format("\\u{:04X}", u);
      else out += ch;
    }
    return out + "\"";
  }
};
template <> struct Kind<std::vector<int64_t>> {
  static constexpr const char* name = "array of integers";
  static std::optional<std::vector<int64_t>> read(const toml::node& n) {
    const toml::array* a = n.as_array();
    if (!a) return std::nullopt;
    std::vector<int64_t> out;
    for (const auto& e : *a) {
      if (!e.is_integer()) return std::nullopt;
      out.push_back(*e.value<int64_t>());
    }
    return out;
  }
  static std::string show(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }
};

// An array of strings; one string is an array of one (data.jsonl = "a.jsonl", or data.jsonl=a.jsonl on the command line).
template <> struct Kind<std::vector<std::string>> {
  static constexpr const char* name = "array of strings";
  static std::optional<std::vector<std::string>> read(const toml::node& n) {
    if (n.is_string()) return std::vector<std::string>{*n.value<std::string>()};
    const toml::array* a = n.as_array();
    if (!a) return std::nullopt;
    std::vector<std::string> out;
    for (const auto& e : *a) {
      if (!e.is_string()) return std::nullopt;
      out.push_back(*e.value<std::string>());
    }
    return out;
  }
  static std::string show(const std::vector<std::string>& v) {
    std::vector<std::string> parts;
    for (const std::string& s : v) parts.push_back(Kind<std::string>::show(s));
    return fmt::format("[{}]", fmt::join(parts, ", "));
  }
};

template <> struct Kind<std::vector<double>> {
  static constexpr const char* name = "array of numbers";
  static std::optional<std::vector<double>> read(const toml::node& n) {
    const toml::array* a = n.as_array();
    if (!a) return std::nullopt;
    std::vector<double> out;
    for (const auto& e : *a) {
      if (!e.is_floating_point() && !e.is_integer()) return std::nullopt;
      out.push_back(*e.value<double>());
    }
    return out;
  }
  static std::string show(const std::vector<double>& v) {
    std::vector<std::string> parts;
    for (double d : v) parts.push_back(Kind<double>::show(d));
    return fmt::format("[{}]", fmt::join(parts, ", "));
  }
};

// A choice: written as one of its words; printed as that word, quoted.
template <Choice E> struct Kind<E> {
  static constexpr const char* name = "string";
  static std::string show(E v) { return Kind<std::string>::show(choice_name(v)); }
};

// A node as TOML text, for error messages. Arrays and tables are printed here, element by element: toml++'s own
// formatter (3.3) measures an array's elements to decide on line breaks with a size_t cast of log10(|x|), undefined
// for a float under 0.1 (fuzz_config found `hidden = [828, 28e-80]`) and an overflow for INT64_MIN.
std::string node_text(const toml::node& n) {
  if (const toml::array* a = n.as_array()) {
    std::vector<std::string> parts;
    for (const toml::node& e : *a) parts.push_back(node_text(e));
    return fmt::format("[{}]", fmt::join(parts, ", "));
  }
  if (const toml::table* t = n.as_table()) {
    std::vector<std::string> parts;
    for (auto&& [k, v] : *t) parts.push_back(fmt::format("{} = {}", k.str(), node_text(v)));
    return fmt::format("{{{}}}", fmt::join(parts, ", "));
  }
  if (n.is_floating_point()) return Kind<double>::show(*n.value<double>());  // the shortest text that reads back
  std::ostringstream os;
  n.visit([&](const auto& v) { os << v; });
  return os.str();
}

std::string describe(const toml::node& n) {
  const std::string s = node_text(n);
  const char* type = n.is_string() ? "string" : n.is_integer() ? "integer" : n.is_floating_point() ? "float"
                     : n.is_boolean() ? "boolean" : n.is_array() ? "array" : n.is_table() ? "table" : "value";
  return fmt::format("{} {}", type, s);
}

// ---- the schema ---------------------------------------------------------------------------------------

struct Field {
  std::string key, type, help;
  std::function<std::string(const Config&)> show;
  // Sets the value from a TOML node; returns false when the node has the wrong type, and leaves in `problem`
  // what is wrong with a value of the right type that the key cannot take (a choice that is not one of its words).
  std::function<bool(Config&, const toml::node&, std::string& problem)> set;
  // Returns "" when the value is valid, else what is wrong with it.
  std::function<std::string(const Config&)> check;
};

template <class T>
using Check = std::function<std::string(const T&)>;

template <class S, class T>
Field field(std::string key, S Config::*section, T S::*member, std::string help, Check<T> check = {}) {
  Field f;
  f.key = std::move(key);
  f.type = Kind<T>::name;
  f.help = std::move(help);
  f.show = [=](const Config& c) { return Kind<T>::show(c.*section.*member); };
  f.set = [=](Config& c, const toml::node& n, std::string& problem) {
    if constexpr (Choice<T>) {
      const auto word = Kind<std::string>::read(n);
      if (!word) return false;
      const auto& names = ChoiceNames<T>::names;
      const auto it = std::find(names.begin(), names.end(), *word);
      if (it == names.end()) {
        problem = fmt::format("must be one of: {}", fmt::join(names, ", "));
        return true;
      }
      c.*section.*member = static_cast<T>(it - names.begin());
    } else {
      // A TOML boolean reads as the word for a key that takes words (dist.overlap = false), not for a free string:
      // checkpoint.dir = true in a file once wrote checkpoints to a folder named "true".
      if constexpr (std::is_same_v<T, std::string>)
        if (n.is_boolean() && (!check || check(std::string("\x01")).empty())) return false;
      auto v = Kind<T>::read(n);
      if (!v) return false;
      c.*section.*member = std::move(*v);
    }
    return true;
  };
  f.check = [=](const Config& c) {
    // No key takes an infinity or a NaN: `lr = inf` once trained to NaN and exited 0. Refused before the key's
    // own check, whose comparisons a NaN would slip through.
    if constexpr (std::is_same_v<T, double>) {
      if (!std::isfinite(c.*section.*member)) return std::string("must be a finite number");
    } else if constexpr (std::is_same_v<T, std::vector<double>>) {
      const auto& v = c.*section.*member;
      if (!std::all_of(v.begin(), v.end(), [](double d) { return std::isfinite(d); }))
        return std::string("values must be finite numbers");
    }
    return check ? check(c.*section.*member) : std::string{};
  };
  return f;
}

template <class T>
Check<T> at_least(T lo) {
  return [lo](const T& v) { return v >= lo ? "" : fmt::format("must be >= {}", lo); };
}
Check<std::vector<int64_t>> all_positive() {
  return [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [](int64_t w) { return w >= 1; }) ? "" : std::string("values must be >= 1");
  };
}
Check<double> positive() {
  return [](const double& v) { return v > 0 ? "" : std::string("must be > 0"); };
}
Check<double> in_range(double lo_incl, double hi_excl) {
  return [=](const double& v) {
    return v >= lo_incl && v < hi_excl ? "" : fmt::format("must be in [{}, {})", lo_incl, hi_excl);
  };
}
Check<std::string> one_of(std::vector<std::string> choices) {
  return [choices](const std::string& v) {
    return std::find(choices.begin(), choices.end(), v) != choices.end()
               ? ""
               : fmt::format("must be one of: {}", fmt::join(choices, ", "));
  };
}

// The schema's table, one row per key, in four parts (each a table of its own section's keys, long on purpose).
// train.*: the loop, the optimizer and its schedule.
std::vector<Field> train_fields() {
  using C = Config;
  return {
      field("train.epochs", &C::train, &TrainConfig::epochs, "passes over the training set", at_least<int64_t>(1)),
      field("train.batch_size", &C::train, &TrainConfig::batch_size, "examples per step PER RANK (global = this x world size)", at_least<int64_t>(1)),
      field("train.device", &C::train, &TrainConfig::device, "auto (cuda:LOCAL_RANK when GPUs exist, else cpu with a warning) | cpu | cuda (error without a GPU)"),
      field("train.precision", &C::train, &TrainConfig::precision, "fp32 | bf16 | fp16: the arithmetic of matrix products and convolutions (operands rounded, float32 accumulation); master weights, optimizer state, loss, norms and BatchNorm statistics stay fp32; fp16 adds dynamic loss scaling (GradScaler's: 65536, halve and skip on inf/NaN, double after 2000 clean steps). On the CPU, bf16 convolutions run in oneDNN's bf16 kernels where the CPU has AVX-512; the rest of bf16 and all of fp16 are emulated (float32 arithmetic on rounded operands, slower than fp32)"),
      field("train.bf16_activations", &C::train, &TrainConfig::bf16_activations, "the transformer fast path (model.name = gpt or llama, with train.precision = bf16): in training, the activations between layers stay bf16 (matmuls with their bias and GELU fused, the fused flash attention, the fused softmax cross-entropy over bf16 logits; cuBLASLt and cuDNN on a GPU), the matmuls read a bf16 copy of the parameters rounded at each step, and parameters, gradients, optimizer state, LayerNorm/RMSNorm statistics and the loss stay float32; evaluation runs the float32 path. Not with dist.zero = 3. On a GPU the GPT's and the Llama's (grouped-query attention, bf16 RMSNorm, SwiGLU and RoPE) ran on an H200 and matched the CPU (docs/gpus.md)"),
      field("train.deterministic", &C::train, &TrainConfig::deterministic, "on a GPU: true keeps to library algorithms that give the same bits on every run (cuDNN's deterministic attention backward and convolution algorithms); false lets cuDNN take faster ones that add in a varying order (atomics), as PyTorch does by default, so two runs may differ in the last bits. No effect on the CPU (always deterministic) or on the cuBLAS/cuBLASLt matmuls (deterministic either way). Both ran on an H200 (false: the GPT-2 124M step 1% faster)"),
      field("train.autotune", &C::train, &TrainConfig::autotune, "on a GPU: after the first training step, each cuBLASLt matmul plan made so far (the transformer fast path's) is timed on scratch operands with the first 8 algorithms cuBLASLt's heuristic proposes and split-K variants (2-16 parts) of the first three, and one 3% faster than the heuristic's first choice (timed twice) is kept for the rest of the run; a weight gradient's plan is also timed against its bias gradient apart (the plain product, then our column sums instead of cuBLASLt's bias-gradient epilogue) and switched where that is 3% faster; then each cuDNN fused-attention graph likewise with up to 4 of the plans cuDNN proposes (a deterministic backward's plans are all deterministic); then each convolution's forward, backward-data and backward-filter algorithm against every other one cuDNN has for it that the run may use (deterministic ones unless train.deterministic = false; no TF32 in fp32), as PyTorch's cudnn.benchmark; the log names each switch. Each algorithm gives the same bits on every call, but which one wins may differ between runs and ranks, so two runs may differ in the last bits. No effect on the CPU. Ran on an H200 on 2026-11-29: inside dptrain for a GPT's fast path (cuBLASLt and attention plans), and the convolution part in dpt-model-bench --lt-tune (docs/gpus.md)"),
      field("train.autotune_bf16_grads", &C::train, &TrainConfig::autotune_bf16_grads, "with train.autotune = true on a GPU's transformer fast path: each weight gradient's product (float32, added into the gradient) is also timed as torch.autocast computes it (the same product rounded to bf16 into scratch, its split-K parts added in any type as cuBLAS may for PyTorch, then added into the float32 gradient) and switched to that where 3% faster (timed twice); a weight with a bias switches only where its bias gradient apart (that product, then our column sums) also beats cuBLASLt's fused bias-gradient epilogue. The log names each switch. The switched gradients carry the bf16 rounding of each product, as PyTorch's under torch.autocast do; the rest of the run's arithmetic is unchanged. Needs train.autotune = true. Ran on an H200 on 2026-11-29 (docs/gpus.md)"),
      field("train.cuda_graph", &C::train, &TrainConfig::cuda_graph, "on a GPU with the transformer fast path (train.bf16_activations = true) and one rank: each step's zero_grad, forward, loss and backward are captured once as a CUDA graph (after an eager step that makes every allocation) and launched as one unit, so that the step's hundreds of kernels cost one launch; with train.optimizer = adamw the graph also holds the gradient clipping (its norm and factor computed on the device) and the fused update, whose learning rate and bias corrections for the step are copied to the device before each launch (no host synchronisation inside the step); SGD's update runs after the launch as usual. Captured again after anything that may move the step's buffers (an epoch's start and evaluation, train.autotune, a checkpoint, a batch of another size, which runs eagerly). The same losses and parameters, bit for bit, as without it. Refused on the CPU, with more than one rank, with dist.zero > 0 and with gradient accumulation. Ran on an H200 on 2026-11-29 with a GPT (docs/gpus.md)"),
      field("train.optimizer", &C::train, &TrainConfig::optimizer, "sgd | adamw"),
      field("train.lr", &C::train, &TrainConfig::lr, "learning rate (the peak, when a schedule is used)", positive()),
      field("train.momentum", &C::train, &TrainConfig::momentum, "SGD momentum", in_range(0.0, 1.0)),
      field("train.nesterov", &C::train, &TrainConfig::nesterov, "SGD Nesterov momentum (needs train.momentum > 0)"),
      field("train.weight_decay", &C::train, &TrainConfig::weight_decay, "L2 penalty (SGD) or decoupled decay (AdamW)", at_least(0.0)),
      field("train.weight_decay_params", &C::train, &TrainConfig::weight_decay_params, weight_decay_params_help()),
      field("train.beta1", &C::train, &TrainConfig::beta1, "AdamW beta1", in_range(0.0, 1.0)),
      field("train.beta2", &C::train, &TrainConfig::beta2, "AdamW beta2", in_range(0.0, 1.0)),
      field("train.eps", &C::train, &TrainConfig::eps, "AdamW epsilon", positive()),
      field("train.schedule", &C::train, &TrainConfig::schedule, "constant | step (x gamma every step_size epochs) | cosine (to min_lr, per step)"),
      field("train.warmup_epochs", &C::train, &TrainConfig::warmup_epochs, "linear warm-up from 0, in epochs (fractions allowed)", at_least(0.0)),
      field("train.warmup_steps", &C::train, &TrainConfig::warmup_steps, "linear warm-up from 0, in optimizer steps (instead of warmup_epochs)", at_least<int64_t>(0)),
      field("train.step_size", &C::train, &TrainConfig::step_size, "epochs between decays (schedule = step)", at_least<int64_t>(1)),
      field("train.gamma", &C::train, &TrainConfig::gamma, "decay factor (schedule = step)", positive()),
      field("train.min_lr", &C::train, &TrainConfig::min_lr, "final learning rate (schedule = cosine; at most train.lr)", at_least(0.0)),
      field("train.seed", &C::train, &TrainConfig::seed, "seed of the initialisation and of the data order", at_least<int64_t>(0)),
      field("train.drop_last", &C::train, &TrainConfig::drop_last, "drop the tail instead of padding shards, and the last partial batch"),
      field("train.max_steps", &C::train, &TrainConfig::max_steps, "stop after this many optimizer steps (0: no limit)", at_least<int64_t>(0)),
      field("train.accum_steps", &C::train, &TrainConfig::accum_steps, "micro-batches per optimizer step (gradient accumulation; no communication on the first K-1)", at_least<int64_t>(1)),
      field("train.global_batch_size", &C::train, &TrainConfig::global_batch_size, "samples per optimizer step, kept whatever the world size (0: off, train.batch_size x train.accum_steps x ranks): each rank takes global_batch_size / ranks per step, as the fewest micro-batches of at most train.batch_size (train.accum_steps is then derived, not set). A job resized mid-run (elastic dprun, a resume at another world size) then goes on with the same steps, learning-rate schedule and loss curve. Must divide among the ranks", at_least<int64_t>(0)),
      field("train.clip_grad_norm", &C::train, &TrainConfig::clip_grad_norm, "clip the global gradient L2 norm (after averaging) to this; 0: off", at_least(0.0)),
      field("train.eval_batch_size", &C::train, &TrainConfig::eval_batch_size, "batch size for evaluation", at_least<int64_t>(1)),
      field("train.progress_interval_s", &C::train, &TrainConfig::progress_interval_s, "seconds between rank 0's progress lines within an epoch", positive()),
  };
}

// data.*: the data sets and their loading.
std::vector<Field> data_fields() {
  using C = Config;
  return {
      field("data.dataset", &C::data, &DataConfig::dataset, "fashion-mnist | imagefolder (DIR/train/<class>/*.png|jpg and DIR/val/...; `dptrain export-images` writes one) | synthetic | tokens (llm.c .bin token shards in DIR, split by the words train and val in their names; `dptrain tokenize` writes them; for model.name = gpt or llama) | jsonl (fine-tuning records, data.jsonl, tokenized once by rank 0 into token shards with loss masks in data.dir, then read as tokens; for model.name = gpt or llama)"),
      field("data.dir", &C::data, &DataConfig::dir, "fashion-mnist: directory of the IDX .gz files; imagefolder: the folder holding train/ and val/; tokens: the directory of the shards; jsonl: where its shards are written (reused while data.jsonl, the tokenizer and the options are unchanged: DIR/jsonl_source.json records them)"),
      field("data.jsonl", &C::data, &DataConfig::jsonl, "jsonl: JSON Lines files (or directories of *.jsonl files), one record a line: {\"text\": ...} (every token trained) or {\"prompt\": ..., \"completion\": ...} (the completion's tokens trained, the prompt's context only); each document is [BOS] prompt completion EOS, packed end to end into windows of model.block_size"),
      field("data.tokenizer", &C::data, &DataConfig::tokenizer, "jsonl: the tokenizer: a Hugging Face tokenizer.json (with its tokenizer_config.json beside it for the EOS and BOS), or a folder holding one, or vocab.json and merges.txt; empty: model.init_from's folder when it holds one, else bytes (then data.eos_token must name a byte)"),
      field("data.eos_token", &C::data, &DataConfig::eos_token, "jsonl: the token that ends each document, as text; empty: the tokenizer's (tokenizer_config.json's eos_token, else <|endoftext|>)"),
      field("data.skip_bad_lines", &C::data, &DataConfig::skip_bad_lines, "jsonl: skip a malformed line with a warning, counted (false: stop with an error naming its file and line)"),
      field("data.val_every", &C::data, &DataConfig::val_every, "jsonl: every Nth record goes to the val split (the evaluation's held-out documents)", at_least<int64_t>(2)),
      field("data.augment", &C::data, &DataConfig::augment, "training transform: none | crop_flip (pad + random crop + horizontal flip) | random_resized_crop (imagefolder: torchvision's RandomResizedCrop + flip); drawn from (seed, epoch, index)", one_of({"none", "crop_flip", "random_resized_crop"})),
      field("data.padding", &C::data, &DataConfig::padding, "crop_flip: zero pixels added on each side before the random crop", at_least<int64_t>(0)),
      field("data.image_size", &C::data, &DataConfig::image_size, "imagefolder: height = width of the images the model sees (training crop, evaluation center crop)", at_least<int64_t>(1)),
      field("data.resize", &C::data, &DataConfig::resize, "imagefolder: shorter side resized to this before the evaluation center crop (and before crop_flip); 0: no resize", at_least<int64_t>(0)),
      field("data.channels", &C::data, &DataConfig::channels, "imagefolder: 1 (grey) or 3 (RGB); images are converted", Check<int64_t>([](const int64_t& v) {
              return v == 1 || v == 3 ? "" : std::string("must be 1 or 3");
            })),
      field("data.mean", &C::data, &DataConfig::mean, "imagefolder: per-channel mean of x/255 (ImageNet's by default)"),
      field("data.std", &C::data, &DataConfig::std, "imagefolder: per-channel standard deviation of x/255", Check<std::vector<double>>([](const std::vector<double>& v) {
              return std::all_of(v.begin(), v.end(), [](double d) { return d > 0; }) ? "" : std::string("values must be > 0");
            })),
      field("data.skip_bad_images", &C::data, &DataConfig::skip_bad_images, "imagefolder: skip an unreadable or corrupt image with a warning (false: stop with an error naming it)"),
      field("data.workers", &C::data, &DataConfig::workers, "threads reading, decoding and transforming examples for the loader (at most 1024)", Check<int64_t>([](const int64_t& v) { return v >= 1 && v <= 1024 ? "" : std::string("must be in [1, 1024] (threads of one process)"); })),
      field("data.train_limit", &C::data, &DataConfig::train_limit, "use only N training examples (0: all): Fashion-MNIST's first N; for image folders and token shards N spread evenly over the set (example floor(i * size / N) for i < N, so each class of a folder keeps its share)", at_least<int64_t>(0)),
      field("data.test_limit", &C::data, &DataConfig::test_limit, "use only N test examples (0: all), chosen as data.train_limit chooses them", at_least<int64_t>(0)),
      field("data.prefetch", &C::data, &DataConfig::prefetch, "batches the loader thread prepares ahead", at_least<int64_t>(1)),
      field("data.synthetic_train_size", &C::data, &DataConfig::synthetic_train_size, "training examples (dataset = synthetic)", at_least<int64_t>(1)),
      field("data.synthetic_test_size", &C::data, &DataConfig::synthetic_test_size, "test examples (dataset = synthetic)", at_least<int64_t>(1)),
      field("data.synthetic_shape", &C::data, &DataConfig::synthetic_shape, "one example's shape (dataset = synthetic): [features], or [channels, height, width] for images", Check<std::vector<int64_t>>([](const std::vector<int64_t>& v) {
              const bool positive = std::all_of(v.begin(), v.end(), [](int64_t d) { return d >= 1; });
              if (!(v.size() == 1 || v.size() == 3) || !positive)
                return std::string("must be [F] or [C, H, W], every value >= 1");
              // Its product is the features of an example: [16, 2^60 + 1, 1] once wrapped to 16 and trained an MLP
              // of 16 inputs without a word, [4, 2^31, 2^31] to 0 ("features must be >= 1").
              int64_t features = 1;
              for (int64_t d : v)
                if (__builtin_mul_overflow(features, d, &features) || features > (int64_t{1} << 32))
                  return std::string("its product, the features of one example, must be at most 2^32 (4294967296)");
              return std::string();
            })),
  };
}

// model.*: the model families' keys (trainer/model_registry.h).
std::vector<Field> model_fields() {
  using C = Config;
  return {
      field("model.name", &C::model, &ModelConfig::name, model_name_help(), one_of(model_names())),
      field("model.hidden", &C::model, &ModelConfig::hidden, "hidden layer widths of the MLP", all_positive()),
      field("model.depth", &C::model, &ModelConfig::depth, "resnet: 18 | 34 (basic blocks) | 50 (bottlenecks), torchvision's block counts; ignored when model.blocks is set", Check<int64_t>([](const int64_t& v) {
              return v == 18 || v == 34 || v == 50 ? "" : std::string("must be 18, 34 or 50 (or set model.blocks)");
            })),
      field("model.blocks", &C::model, &ModelConfig::blocks, "resnet: blocks per stage, e.g. [1, 1, 1]; overrides model.depth (one width per stage in model.widths)", all_positive()),
      field("model.block", &C::model, &ModelConfig::block, "resnet with model.blocks: basic | bottleneck"),
      field("model.widths", &C::model, &ModelConfig::widths, "resnet: planes per stage (torchvision: [64, 128, 256, 512])", all_positive()),
      field("model.stem", &C::model, &ModelConfig::stem, "resnet: imagenet (7x7 stride-2 conv + max pool, torchvision's) | small (3x3 stride-1 conv, no pool: 28x28 and 32x32 images)"),
      field("model.in_channels", &C::model, &ModelConfig::in_channels, "input channels (0: the data set's)", at_least<int64_t>(0)),
      field("model.num_classes", &C::model, &ModelConfig::num_classes, "mlp, resnet: output classes (0: the data set's; another value must equal its class count)", at_least<int64_t>(0)),
      field("model.n_layer", &C::model, &ModelConfig::n_layer, "gpt, llama: transformer blocks", at_least<int64_t>(1)),
      field("model.n_head", &C::model, &ModelConfig::n_head, "gpt, llama: attention heads (a gpt's model.n_embd must be a multiple)", at_least<int64_t>(1)),
      field("model.n_embd", &C::model, &ModelConfig::n_embd, "gpt, llama: embedding width (hidden_size)", at_least<int64_t>(1)),
      field("model.vocab_size", &C::model, &ModelConfig::vocab_size, "gpt, llama: vocabulary (256 for `dptrain tokenize`'s bytes, 50257 for GPT-2's BPE, 128256 for Llama 3's: past 65536 the shards are llm.c's uint32 form); a larger token in the shards is an error", Check<int64_t>([](const int64_t& v) { return v >= 1 && v <= 16777216 ? "" : std::string("must be in [1, 16777216] (token windows travel as float32, exact up to 2^24)"); })),
      field("model.block_size", &C::model, &ModelConfig::block_size, "gpt, llama: tokens per training window (the context length; a gpt's rows of transformer.wpe)", at_least<int64_t>(1)),
      field("model.recompute", &C::model, &ModelConfig::recompute, "gpt: recompute the attention probabilities and GELU outputs in backward instead of keeping them per layer (less memory, a little more compute)"),
      field("model.n_kv_head", &C::model, &ModelConfig::n_kv_head, "llama: key/value heads (grouped-query attention: model.n_head must be a multiple); 0: model.n_head (multi-head)", at_least<int64_t>(0)),
      field("model.head_dim", &C::model, &ModelConfig::head_dim, "llama: width of each attention head (even); 0: model.n_embd / model.n_head", Check<int64_t>([](const int64_t& v) { return v == 0 || (v >= 2 && v % 2 == 0) ? "" : std::string("must be 0 or an even number (the rotary embeddings rotate pairs)"); })),
      field("model.intermediate_size", &C::model, &ModelConfig::intermediate_size, "llama: the SwiGLU MLP's width; 0: 8/3 model.n_embd rounded up to a multiple of 64 (Llama's sizing)", at_least<int64_t>(0)),
      field("model.rms_norm_eps", &C::model, &ModelConfig::rms_norm_eps, "llama: RMSNorm's epsilon", Check<double>([](const double& v) { return v > 0 && v < 1 ? "" : std::string("must be in (0, 1)"); })),
      field("model.rope_theta", &C::model, &ModelConfig::rope_theta, "llama: the rotary embeddings' base (Llama 2: 10000, Llama 3: 500000)", Check<double>([](const double& v) { return v > 0 ? "" : std::string("must be positive"); })),
      field("model.rope_scaling", &C::model, &ModelConfig::rope_scaling, "llama: \"\" (none) | llama3 (Llama 3.1's long-context frequencies: model.rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_positions)", one_of({"", "llama3"})),
      field("model.rope_factor", &C::model, &ModelConfig::rope_factor, "llama, rope_scaling = llama3: factor", Check<double>([](const double& v) { return v > 0 ? "" : std::string("must be positive"); })),
      field("model.rope_low_freq_factor", &C::model, &ModelConfig::rope_low_freq_factor, "llama, rope_scaling = llama3: low_freq_factor", Check<double>([](const double& v) { return v > 0 ? "" : std::string("must be positive"); })),
      field("model.rope_high_freq_factor", &C::model, &ModelConfig::rope_high_freq_factor, "llama, rope_scaling = llama3: high_freq_factor (above low_freq_factor)", Check<double>([](const double& v) { return v > 0 ? "" : std::string("must be positive"); })),
      field("model.rope_original_max_positions", &C::model, &ModelConfig::rope_original_max_positions, "llama, rope_scaling = llama3: original_max_position_embeddings", at_least<int64_t>(1)),
      field("model.max_position_embeddings", &C::model, &ModelConfig::max_position_embeddings, "llama: the longest sequence the model is made for, what an exported config.json says, and the context generate and predict run over (model.block_size, the training window, must not exceed it); 0: model.block_size", at_least<int64_t>(0)),
      field("model.tie_embeddings", &C::model, &ModelConfig::tie_embeddings, "llama: the LM head is the token embedding (no lm_head.weight of its own)"),
      field("model.attention_bias", &C::model, &ModelConfig::attention_bias, "llama: none | qkv (biases on q_proj, k_proj, v_proj: Qwen2) | all (also o_proj: Llama's attention_bias = true)", one_of({"none", "qkv", "all"})),
      field("model.mlp_bias", &C::model, &ModelConfig::mlp_bias, "llama: biases on gate_proj, up_proj and down_proj"),
      field("model.hf_config", &C::model, &ModelConfig::hf_config, "gpt, llama: a Hugging Face config.json, or a folder holding one: for a gpt GPT2LMHeadModel's (model_type gpt2), that gives model.n_layer, n_head, n_embd, vocab_size and block_size (n_positions; a shorter model.block_size crops the model to its first positions, as nanoGPT's crop_block_size); for a llama LlamaForCausalLM's, Qwen2ForCausalLM's or MistralForCausalLM's without a sliding window, that gives every llama key above and model.n_layer, n_head, n_embd, vocab_size; a key it sets that the config also sets to another value is an error, and a key of config.json that would change the arithmetic and that dptrain does not read is refused by name. Empty: the config.json of the folder model.init_from names, if it has one"),
      field("model.sync_bn", &C::model, &ModelConfig::sync_bn, "SyncBatchNorm: batch statistics over all ranks' batches (all-reduced each forward and backward)"),
      field("model.init_from", &C::model, &ModelConfig::init_from, "weights to start from, in safetensors or in PyTorch's torch.save format (a .pth, a pytorch_model.bin: read without running any of its code): a dptrain checkpoint's model.safetensors; for a ResNet a torchvision state_dict (fc is re-initialised when its class count differs); for a GPT nanoGPT's or Hugging Face's GPT-2 layout (the hub's model.safetensors or pytorch_model.bin, or the folder holding it and its config.json, which gives the shape: model.hf_config); for a llama a Hugging Face model folder (config.json beside model.safetensors, or model.safetensors.index.json and its shards, or pytorch_model.bin, or their shards with an index), LlamaForCausalLM's names, fp32, bf16 or fp16"),
  };
}

// dist.*, checkpoint.*, log.*: the job around the model.
std::vector<Field> run_fields() {
  using C = Config;
  return {
      field("dist.backend", &C::dist, &DistConfig::backend, "auto (nccl with a GPU per rank, else mpi under Open MPI's mpirun or srun with PMI, else gloo) | gloo | mpi | nccl", one_of({"auto", "gloo", "mpi", "nccl"})),
      field("dist.timeout_s", &C::dist, &DistConfig::timeout_s, "rendezvous and collective timeout, seconds. Longer than any time a rank spends between two collectives, its checkpoint writes included: the other ranks wait for it in the next collective, and past this they stop as for a hang (exit 3) naming it stuck", Check<double>([](const double& v) {
              // Kept in whole milliseconds: a value under one would be a timeout of 0 ms, every connection failing.
              return v >= 1e-3 && v <= 1e7 ? "" : std::string("must be in [0.001, 10000000] seconds");
            })),
      field("dist.bucket_cap_mb", &C::dist, &DistConfig::bucket_cap_mb, "gradient bucket size in MB (reverse parameter order; the first bucket at most 1 MB)", Check<double>([](const double& v) {
              // Kept in whole bytes (MB x 2^20): a value under one byte would be a cap of 0 bytes.
              return v >= 1e-6 && v <= 1e6 ? "" : std::string("must be in [0.000001, 1000000] MB");
            })),
      field("dist.overlap", &C::dist, &DistConfig::overlap, "auto (true when the model trains on a GPU, false on the CPU) | true: all-reduce each bucket as soon as backward has produced it | false: one all-reduce after backward (faster on the CPU: no core is idle for the overlap; docs/data-parallel.md)", one_of({"auto", "true", "false"})),
      field("dist.broadcast_buffers", &C::dist, &DistConfig::broadcast_buffers, "broadcast rank 0's buffers (BatchNorm running statistics) to every rank at the start of each step, as DDP's broadcast_buffers (evaluation uses rank 0's, the saved ones, either way)"),
      field("dist.grad_dtype", &C::dist, &DistConfig::grad_dtype, "fp32 | bf16: what the gradient all-reduce carries. bf16 (PyTorch DDP's bf16_compress_hook): each bucket is divided by the world size and rounded to bfloat16 (nearest even), summed in bfloat16 (each addition in fp32, rounded back), and widened back to fp32: half the bytes on the wire, gradients good to about 3 significant digits (relative 2^-8 per rounding). Parameters, optimizer state and everything else stay fp32. Every backend (gloo, mpi, nccl). With one rank nothing is all-reduced, so it has no effect"),
      field("dist.zero", &C::dist, &DistConfig::zero, "0 | 1 | 2 | 3: sharded data parallelism (ZeRO). 0: DDP, every rank holds the whole optimizer state and gradients. 1 (stage 1): each rank holds the optimizer state of 1/N of the parameters: every gradient bucket is reduce-scattered (not all-reduced) during backward, each rank updates its shard, and the parameters are all-gathered after the step; AdamW's 8 bytes per parameter become 8/N. 2 (stage 2): also the gradients: a rank keeps only its shard's averaged gradients (4/N bytes per parameter), each bucket's full gradients being held only from the moment backward reaches it to its reduce-scatter (with train.accum_steps > 1, over the whole accumulation, as FSDP's no_sync). 3 (stage 3, FSDP's full shard): also the parameters: a rank keeps only its shard (4/N bytes per parameter); each gradient bucket's parameters are all-gathered just before the first module using them runs forward, and again before backward, the next bucket's gather prefetched while the current one computes, and released once their modules are done; checkpoints, the start's broadcast and the replica check gather the whole model for a moment. Stages 1 to 3 compute the same numbers, bit for bit (DDP's too on 2 ranks; on more, within float32 rounding: the additions run in another order). Checkpoints hold the optimizer state as one file per rank and load at any world size and dist.zero. With one rank nothing is sharded (the same numbers as 0), though a combination refused with a stage (train.bf16_activations with 3) stays refused", Check<int64_t>([](const int64_t& v) {
        return v >= 0 && v <= 3 ? "" : std::string("must be 0, 1, 2 or 3"); })),
      field("dist.interface", &C::dist, &DistConfig::interface, "gloo: the network interface each rank listens on (e.g. eth0, ib0), the same name on every node; empty (the default): the interface whose address routes to MASTER_ADDR (loopback for a one-node job, whatever this names). Under Open MPI's mpirun without MASTER_ADDR, rank 0 also gives the other ranks its address on this interface as its store's. GLOO_SOCKET_IFNAME in the environment does the same and is used when this is empty. A name this host lacks is an error (exit 2)"),
      field("checkpoint.dir", &C::checkpoint, &CheckpointConfig::dir, "where rank 0 writes checkpoints (step-NNNNNNNN/)", Check<std::string>([](const std::string& s) { return s.empty() ? "must not be empty" : ""; })),
      field("checkpoint.keep", &C::checkpoint, &CheckpointConfig::keep, "keep the newest K checkpoints", at_least<int64_t>(1)),
      field("checkpoint.every_epochs", &C::checkpoint, &CheckpointConfig::every_epochs, "write one every N epochs (0: at no epoch end but the last: the run's last epoch always ends with one)", at_least<int64_t>(0)),
      field("checkpoint.every_steps", &C::checkpoint, &CheckpointConfig::every_steps, "also write one every N optimizer steps (0: off)", at_least<int64_t>(0)),
      field("checkpoint.on_error", &C::checkpoint, &CheckpointConfig::on_error, "what a checkpoint write that fails (a full disk, permissions; weights that are no longer finite: a diverged run) does; its temporary folder is removed either way. stop: the run fails with the error (exit 1). warn: a warning naming the step and the cause, and training goes on; the previous checkpoint stays the newest (none is pruned for the failed one), the failures are counted in the metrics file (checkpoint_failures) and in the line that ends the run, which says when the newest checkpoint is older than the run's end. Under dist.zero every rank takes the same decision"),
      field("log.level", &C::log, &LogConfig::level, "trace | debug | info | warn | error; DPT_LOG_LEVEL in the environment, where set, takes precedence over it (a switch for debugging a run without editing its config)", one_of({"trace", "debug", "info", "warn", "error"})),
      field("log.dir", &C::log, &LogConfig::dir, "where rank 0 appends metrics.jsonl, one JSON object per progress line and per epoch (docs/watching.md: Metrics file); empty (the default): the folder that holds checkpoint.dir"),
      field("log.tensorboard", &C::log, &LogConfig::tensorboard, "rank 0 also writes the metrics.jsonl records as TensorBoard event files (events.out.tfevents.*) in the same folder, one scalar \"<kind>/<key>\" per number (docs/watching.md: TensorBoard); `tensorboard --logdir` that folder"),
      field("log.memory", &C::log, &LogConfig::memory, "every progress line (and progress record) also shows memory: dptrain's tensors on the training device now and at peak, host RSS, and a GPU's used memory; without it they come once per epoch"),
      field("log.curves", &C::log, &LogConfig::curves, "rank 0 redraws curves.png beside metrics.jsonl after every epoch and when the run stops early, as `dptrain plot` does (needs gnuplot; a failure to draw is a warning, not an error)"),
  };
}

const std::vector<Field>& schema() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> all;
    for (std::vector<Field> (*part)() : {train_fields, data_fields, model_fields, run_fields}) {
      std::vector<Field> rows = part();
      all.insert(all.end(), std::make_move_iterator(rows.begin()), std::make_move_iterator(rows.end()));
    }
    return all;
  }();
  return fields;
}

const Field* find_field(std::string_view key) {
  for (const auto& f : schema())
    if (f.key == key) return &f;
  return nullptr;
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& where) {
  const Field* best = nullptr;
  size_t best_d = 4;  // suggest only close names
  std::vector<std::string> keys;
  for (const auto& f : schema()) {
    keys.push_back(f.key);
    // The distance is at least the difference in length: a key that long off is never suggested, and a long
    // unknown key (a pasted line, say) costs no quadratic work against every field.
    const size_t longer = std::max(key.size(), f.key.size()), shorter = std::min(key.size(), f.key.size());
    if (longer - shorter >= best_d) continue;
    size_t d = edit_distance(key, f.key);
    if (d < best_d) best_d = d, best = &f;
  }
  // A key of that name in another section (lr, epochs, model.seed: Hugging Face's and nanoGPT's flat names, or the
  // wrong section) is what was meant, rather than the key fewest edits away (model.stem for model.seed).
  std::vector<std::string> same_name;
  const std::string name = key.substr(key.rfind('.') + 1);
  for (const std::string& k : keys)
    if (k.substr(k.find('.') + 1) == name) same_name.push_back("'" + k + "'");
  // Names other trainers give these keys (Hugging Face's TrainingArguments, nanoGPT's train.py), far from ours in
  // edits: learning_rate=3e-5 once got no hint at all.
  static const std::vector<std::pair<std::string, std::string>> elsewhere = {
      {"learning_rate", "train.lr"}, {"num_train_epochs", "train.epochs"}, {"max_iters", "train.max_steps"},
      {"per_device_train_batch_size", "train.batch_size"}, {"gradient_accumulation_steps", "train.accum_steps"},
      {"max_grad_norm", "train.clip_grad_norm"}, {"grad_clip", "train.clip_grad_norm"},
      {"warmup_iters", "train.warmup_steps"}, {"lr_scheduler_type", "train.schedule"}, {"adam_beta1", "train.beta1"},
      {"adam_beta2", "train.beta2"}, {"adam_epsilon", "train.eps"},
      {"per_device_eval_batch_size", "train.eval_batch_size"}, {"output_dir", "checkpoint.dir"},
      {"out_dir", "checkpoint.dir"}, {"save_total_limit", "checkpoint.keep"},
      {"save_steps", "checkpoint.every_steps"}, {"num_hidden_layers", "model.n_layer"},
      {"num_attention_heads", "model.n_head"}, {"hidden_size", "model.n_embd"}};
  std::string hint;
  const auto alias = std::find_if(elsewhere.begin(), elsewhere.end(), [&](const auto& a) { return a.first == name; });
  if (same_name.empty() && alias != elsewhere.end())
    hint = fmt::format(" (did you mean '{}'? {} is another trainer's name for it)", alias->second, name);
  else if (same_name.size() == 1) hint = fmt::format(" (did you mean {}?)", same_name.front());
  else if (!same_name.empty())
    hint = fmt::format(" (did you mean {} or {}?)", fmt::join(same_name.begin(), same_name.end() - 1, ", "),
                       same_name.back());
  else if (best) hint = fmt::format(" (did you mean '{}'?)", best->key);
  DPT_THROW(ConfigError, "{}unknown config key '{}'{}; valid keys: {}", where, key, hint, fmt::join(keys, ", "));
}

void set_field(Config& c, const Field& f, const toml::node& n, const std::string& where) {
  std::string problem;
  if (!f.set(c, n, problem)) DPT_THROW(ConfigError, "{}{}: expected {}, got {}", where, f.key, f.type, describe(n));
  if (!problem.empty()) DPT_THROW(ConfigError, "{}{} = {}: {}", where, f.key, node_text(n), problem);
  if (f.key.starts_with("model.")) c.model.given.insert(f.key.substr(6));  // what a model's resolve must not overrule
}

std::string where_of(const toml::node& n) {
  const auto& src = n.source();
  if (src.path && src.begin.line) return fmt::format("{}:{}: ", *src.path, src.begin.line);
  return "";
}

// Applies every leaf of `table` (nested tables and dotted keys both work) to the config.
void apply_table(Config& c, const toml::table& table, const std::string& prefix) {
  for (auto&& [k, v] : table) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = v.as_table()) {
      apply_table(c, *sub, key);
      continue;
    }
    const Field* f = find_field(key);
    if (!f) unknown_key(key, where_of(v));
    set_field(c, *f, v, where_of(v));
  }
}

toml::table parse_toml(const std::string& text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    DPT_THROW(ConfigError, "{}:{}:{}: {}", source, e.source().begin.line, e.source().begin.column, e.description());
  }
}

// TOML text is UTF-8; a bare-word override is taken as it is, so it is checked here (a byte like 0xFF would be
// printed as \u00FF and read back as another string: found by tests/fuzz/fuzz_config).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min = n == 2 ? 0x80 : n == 3 ? 0x800 : n == 4 ? 0x10000 : 0;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;  // overlong, too big, surrogate
    i += n;
  }
  return true;
}

// Why an override's value that TOML refused is not what the key takes, for the values people write for it elsewhere
// (Python's .1, 1. and True, an array of bare words); "" for any other.
std::string override_value_hint(const std::string& type, const std::string& value) {
  const auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  const std::string v = !value.empty() && (value[0] == '+' || value[0] == '-') ? value.substr(1) : value;
  const size_t dot = v.find('.');
  if ((type == "float" || type == "integer") && dot != std::string::npos &&
      (dot == 0 || dot + 1 == v.size() || !digit(v[dot - 1]) || !digit(v[dot + 1])))
    return " (a TOML number has digits on both sides of its point: 0.1, 1.0)";
  if (type == "boolean" && (value == "True" || value == "False" || value == "TRUE" || value == "FALSE" ||
                            value == "yes" || value == "no" || value == "on" || value == "off"))
    return " (a TOML boolean: true or false)";
  return "";
}

void apply_override(Config& c, const std::string& item) {
  auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0)
    DPT_THROW(ConfigError, "override '{}' is not key=value (e.g. train.lr=0.1)", item);
  std::string key = item.substr(0, eq), value = item.substr(eq + 1);
  const Field* f = find_field(key);
  if (!f) unknown_key(key, "");
  const std::string where = fmt::format("override '{}': ", item);
  toml::table t;
  bool parsed = true;
  try {
    t = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = false;
  }
  const bool strings = f->type == std::string(Kind<std::vector<std::string>>::name);
  // An array of bare words (data.jsonl=[a.jsonl,b.jsonl]) is no TOML, and was once taken as one file of that name.
  if (strings && !parsed && value.starts_with('[') && value.ends_with(']'))
    DPT_THROW(ConfigError, "{}{}: {} is not a TOML array: its strings need quotes ('{}=[\"a.jsonl\", \"b.jsonl\"]'), "
              "or give one file or folder as a bare word", where, f->key, value, f->key);
  if ((f->type == std::string(Kind<std::string>::name) && (!parsed || !t["v"].is_string())) ||
      (strings && (!parsed || !(t["v"].is_string() || t["v"].is_array())))) {
    // Bare words are strings: dist.backend=gloo; for an array of strings, one: data.jsonl=train.jsonl.
    if (!valid_utf8(value)) DPT_THROW(ConfigError, "{}{}: the value is not valid UTF-8", where, f->key);
    set_field(c, *f, toml::value<std::string>(value), where);
    return;
  }
  if (!parsed)
    DPT_THROW(ConfigError, "{}{}: expected {}, got '{}'{}", where, f->key, f->type, value,
              override_value_hint(f->type, value));
  set_field(c, *f, *t.get("v"), where);
}

// `source` names where the values came from (the file, "<defaults>"); `overrides` are the command line's key=value
// overrides applied on top: a key one of them set is the command line's, not the file's.
// train.cuda_graph = true: what the config alone rules out (the device and the world size are the Trainer's:
// trainer/step_graph.h).
void check_cuda_graph_config(const Config& c, const std::string& source) {
  const std::string where = source.empty() ? "" : source + ": ";
  if (!c.train.bf16_activations)
    DPT_THROW(ConfigError, "{}train.cuda_graph = true needs train.bf16_activations = true: a graph replays the "
              "transformer fast path's step, the one whose capture is tested (model.name = {}, train.precision = bf16)",
              where, fmt::join(bf16_activation_models(), " or "));
  if (c.dist.zero != 0)
    DPT_THROW(ConfigError, "{}train.cuda_graph = true with dist.zero = {}: ZeRO's buckets are allocated and reduced "
              "inside the step, which a graph cannot replay; use dist.zero = 0", where, c.dist.zero);
  if (c.train.accum_steps != 1)
    DPT_THROW(ConfigError, "{}train.cuda_graph = true with train.accum_steps = {}: the graph replays one whole step "
              "(zero_grad, forward, backward); use train.accum_steps = 1", where, c.train.accum_steps);
}

void validate(const Config& c, const std::string& file, const std::vector<std::string>& overrides) {
  std::set<std::string> overridden;
  for (const std::string& o : overrides) overridden.insert(o.substr(0, o.find('=')));
  for (const auto& f : schema()) {
    std::string problem = f.check(c);
    if (problem.empty()) continue;
    const std::string from = overridden.contains(f.key) ? "the command line" : file;
    DPT_THROW(ConfigError, "{}{} = {}: {}", from.empty() ? "" : from + ": ", f.key, f.show(c), problem);
  }
  // The checks across keys: the file's values with the command line's on top.
  const std::string source = overrides.empty() || file.empty() ? file : file + " with the command line's overrides";
  if (c.train.warmup_epochs > 0 && c.train.warmup_steps > 0)
    DPT_THROW(ConfigError, "{}train.warmup_epochs = {} and train.warmup_steps = {}: give the warm-up one way, not both",
              source.empty() ? "" : source + ": ", c.train.warmup_epochs, c.train.warmup_steps);
  if (c.model.rope_scaling == "llama3" && !(c.model.rope_low_freq_factor < c.model.rope_high_freq_factor))
    DPT_THROW(ConfigError, "{}model.rope_low_freq_factor = {} and model.rope_high_freq_factor = {}: Llama 3's rope "
              "scaling needs low < high", source.empty() ? "" : source + ": ",
              Kind<double>::show(c.model.rope_low_freq_factor), Kind<double>::show(c.model.rope_high_freq_factor));
  if (c.train.optimizer == OptimizerKind::sgd && c.train.nesterov && c.train.momentum == 0)
    DPT_THROW(ConfigError, "{}train.nesterov = true needs train.momentum > 0 (it is 0.0): Nesterov's look-ahead is "
              "along the momentum, and without one it would be plain SGD (torch.optim.SGD refuses it too)",
              source.empty() ? "" : source + ": ");
  if (c.train.schedule == ScheduleKind::cosine && c.train.min_lr > c.train.lr)
    DPT_THROW(ConfigError, "{}train.min_lr = {} is above train.lr = {}: the cosine schedule goes from train.lr down to "
              "train.min_lr, and would raise the learning rate instead; set train.min_lr <= train.lr",
              source.empty() ? "" : source + ": ", Kind<double>::show(c.train.min_lr), Kind<double>::show(c.train.lr));
  if (c.train.global_batch_size > 0 && c.train.accum_steps != 1)
    DPT_THROW(ConfigError, "{}train.global_batch_size = {} with train.accum_steps = {}: with a global batch the "
              "accumulation steps are derived per world size (train.batch_size is the largest micro-batch); leave "
              "train.accum_steps unset", source.empty() ? "" : source + ": ", c.train.global_batch_size,
              c.train.accum_steps);
  if (c.train.autotune_bf16_grads && !c.train.autotune)
    DPT_THROW(ConfigError, "{}train.autotune_bf16_grads = true needs train.autotune = true: it widens what the tuning "
              "may switch to", source.empty() ? "" : source + ": ");
  if (c.train.cuda_graph) check_cuda_graph_config(c, source);
  if (c.train.bf16_activations) {
    const std::string where = source.empty() ? "" : source + ": ";
    if (!model_card(c.model.name).bf16_activations)
      DPT_THROW(ConfigError, "{}train.bf16_activations = true with model.name = {}: bf16 activations are the "
                "transformer fast path (model.name = {})", where, c.model.name, fmt::join(bf16_activation_models(), " or "));
    if (c.train.precision != models::Precision::BF16)
      DPT_THROW(ConfigError, "{}train.bf16_activations = true needs train.precision = bf16 (it is {})", where,
                choice_name(c.train.precision));
    if (c.dist.zero == 3)
      DPT_THROW(ConfigError, "{}train.bf16_activations = true with dist.zero = 3: the bf16 copy of the parameters "
                "needs them whole on every rank; use dist.zero = 0, 1 or 2", where);
  }
  if ((model_card(c.model.name).input == ModelInput::tokens) != token_data(c.data.dataset))
    DPT_THROW(ConfigError,
              "{}model.name = {} with data.dataset = {}: a language model trains on token shards and token shards "
              "train only a language model (model.name = {} goes with data.dataset = tokens or jsonl)",
              source.empty() ? "" : source + ": ", c.model.name, choice_name(c.data.dataset),
              fmt::join(model_names(ModelInput::tokens), " or "));
  if (c.data.dataset == DatasetKind::jsonl) {
    const std::string where = source.empty() ? "" : source + ": ";
    if (c.data.jsonl.empty())
      DPT_THROW(ConfigError, "{}data.dataset = jsonl needs data.jsonl: the JSON Lines files to read", where);
    if (c.data.dir == DataConfig{}.dir)
      DPT_THROW(ConfigError, "{}data.dataset = jsonl writes its token shards to data.dir: set it (data.dir = "
                "runs/my_data, say)", where);
  }
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  Config c;
  apply_table(c, parse_toml(toml_text, source_name), "");
  for (const auto& o : overrides) apply_override(c, o);
  validate(c, source_name, overrides);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  if (!path.empty()) {
    toml::table t;
    try {
      t = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      const auto& src = e.source();
      if (src.begin.line == 0 && src.begin.column == 0)  // file-level problem (missing, unreadable)
        DPT_THROW(ConfigError, "config file '{}': {}", path, e.description());
      DPT_THROW(ConfigError, "{}:{}:{}: {}", path, src.begin.line, src.begin.column, e.description());
    }
    apply_table(c, t, "");
  }
  for (const auto& o : overrides) apply_override(c, o);
  validate(c, path, overrides);
  return c;
}

std::string to_toml(const Config& c) {
  std::string out, section;
  for (const auto& f : schema()) {
    auto dot = f.key.find('.');
    std::string sec = f.key.substr(0, dot);
    if (sec != section) {
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", sec);
      section = sec;
    }
    out += fmt::format("{} = {}\n", f.key.substr(dot + 1), f.show(c));
  }
  return out;
}

std::vector<std::string> unread_keys(const Config& c) {
  const std::string model = c.model.name;
  const std::string dataset(choice_name(c.data.dataset));
  const auto is_model = [&](std::initializer_list<const char*> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return model == n; });
  };
  struct Scope {
    std::vector<const char*> keys;
    bool applies;
    std::string to, now;  // what the keys apply to; what this run has instead
  };
  const std::string model_now = "model.name = " + model, data_now = "data.dataset = " + dataset;
  const std::vector<Scope> scopes = {
      {{"data.jsonl", "data.tokenizer", "data.eos_token", "data.skip_bad_lines", "data.val_every"},
       c.data.dataset == DatasetKind::jsonl, "data.dataset = jsonl", data_now},
      {{"data.image_size", "data.resize", "data.channels", "data.mean", "data.std", "data.skip_bad_images"},
       c.data.dataset == DatasetKind::imagefolder, "data.dataset = imagefolder", data_now},
      {{"data.synthetic_train_size", "data.synthetic_test_size", "data.synthetic_shape"},
       c.data.dataset == DatasetKind::synthetic, "data.dataset = synthetic", data_now},
      {{"data.augment"}, c.data.dataset == DatasetKind::fashion_mnist || c.data.dataset == DatasetKind::imagefolder,
       "data.dataset = fashion-mnist or imagefolder", data_now},
      {{"data.padding"}, c.data.augment == "crop_flip", "data.augment = crop_flip", "data.augment = " + c.data.augment},
      {{"model.hidden"}, is_model({"mlp"}), "model.name = mlp", model_now},
      {{"model.depth", "model.blocks", "model.block", "model.widths", "model.stem", "model.sync_bn"},
       is_model({"resnet"}), "model.name = resnet", model_now},
      {{"model.in_channels", "model.num_classes"}, is_model({"mlp", "resnet"}), "model.name = mlp or resnet",
       model_now},
      {{"model.n_layer", "model.n_head", "model.n_embd", "model.vocab_size", "model.block_size", "model.hf_config"},
       is_model({"gpt", "llama"}), "model.name = gpt or llama", model_now},
      {{"model.recompute"}, is_model({"gpt"}), "model.name = gpt", model_now},
      {{"model.n_kv_head", "model.head_dim", "model.intermediate_size", "model.rms_norm_eps", "model.rope_theta",
        "model.rope_scaling", "model.rope_factor", "model.rope_low_freq_factor", "model.rope_high_freq_factor",
        "model.rope_original_max_positions", "model.max_position_embeddings", "model.tie_embeddings",
        "model.attention_bias", "model.mlp_bias"},
       is_model({"llama"}), "model.name = llama", model_now},
      // Within a family: keys that another key of it switches off (the other families' runs: the scopes above).
      {{"model.depth"}, !is_model({"resnet"}) || c.model.blocks.empty(), "model.blocks = [] (the stages from depth)",
       "model.blocks sets them"},
      {{"model.block"}, !is_model({"resnet"}) || !c.model.blocks.empty(), "model.blocks = [...]",
       "model.blocks = []: model.depth chooses the block"},
      {{"model.rope_factor", "model.rope_low_freq_factor", "model.rope_high_freq_factor",
        "model.rope_original_max_positions"},
       !is_model({"llama"}) || c.model.rope_scaling == "llama3", "model.rope_scaling = llama3",
       "model.rope_scaling = ''"},
      {{"train.momentum", "train.nesterov"}, c.train.optimizer == OptimizerKind::sgd, "train.optimizer = sgd",
       fmt::format("train.optimizer = {}", choice_name(c.train.optimizer))},
      {{"train.beta1", "train.beta2", "train.eps"}, c.train.optimizer == OptimizerKind::adamw,
       "train.optimizer = adamw", fmt::format("train.optimizer = {}", choice_name(c.train.optimizer))},
      {{"train.step_size", "train.gamma"}, c.train.schedule == ScheduleKind::step, "train.schedule = step",
       fmt::format("train.schedule = {}", choice_name(c.train.schedule))},
      {{"train.min_lr"}, c.train.schedule == ScheduleKind::cosine, "train.schedule = cosine",
       fmt::format("train.schedule = {}", choice_name(c.train.schedule))},
      {{"train.weight_decay_params"}, c.train.weight_decay > 0, "train.weight_decay > 0", "train.weight_decay = 0"},
  };
  static const Config defaults;
  std::vector<std::string> out;
  for (const Scope& s : scopes) {
    if (s.applies) continue;
    for (const char* key : s.keys) {
      const Field* f = find_field(key);
      DPT_CHECK(f, "unread_keys: no key {}", key);
      if (f->show(c) != f->show(defaults))
        out.push_back(fmt::format("{} = {} is not read: it applies to {} ({})", key, f->show(c), s.to, s.now));
    }
  }
  return out;
}

std::string config_hash(const Config& c) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char ch : to_toml(c)) h = (h ^ ch) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

std::string config_keys_help() {
  Config defaults;
  size_t w = 0, tw = 0, dw = 0;
  for (const auto& f : schema()) {
    w = std::max(w, f.key.size());
    tw = std::max(tw, f.type.size());
    dw = std::max(dw, f.show(defaults).size());
  }
  std::string out;
  for (const auto& f : schema())
    out += fmt::format("  {:<{}}  {:<{}}  {:<{}}  {}\n", f.key, w, f.type, tw, f.show(defaults), dw, f.help);
  return out;
}

namespace {

// Text for a Markdown table cell: `|` escaped everywhere (GFM splits cells before it reads code spans); outside
// code spans also `<`, `>` (else read as HTML) and `*` (else emphasis).
std::string markdown_cell(const std::string& text) {
  std::string out;
  bool code = false;
  for (char ch : text) {
    if (ch == '`') code = !code;
    if (ch == '|') out += "\\|";
    else if (!code && ch == '<') out += "&lt;";
    else if (!code && ch == '>') out += "&gt;";
    else if (!code && ch == '*') out += "\\*";
    else out += ch;
  }
  return out;
}

// One line under each section's heading: what its keys decide, and the guide that tells more.
std::string section_intro(const std::string& section) {
  if (section == "train")
    return "What training does: epochs, the batch per rank, the optimizer and its learning-rate schedule, gradient "
           "accumulation and clipping, the arithmetic ([mixed precision](mixed-precision.md)) and the device "
           "([GPUs](gpus.md)).";
  if (section == "data")
    return "Where the examples come from and how they are read: Fashion-MNIST, image folders, token shards or "
           "synthetic data, their transforms, the loader ([models and data](models-and-data.md)).";
  if (section == "model")
    return "What is trained: the MLP, a ResNet or a GPT, its shape, and the weights it starts from "
           "([models and data](models-and-data.md)).";
  if (section == "dist")
    return "How the ranks talk: the backend, the timeout that names a hung rank, and how gradients are averaged "
           "([launching](launching.md), [gradient averaging](data-parallel.md)).";
  if (section == "checkpoint")
    return "Where rank 0 writes checkpoints, how often, and how many it keeps ([checkpoints](checkpoints.md)).";
  if (section == "log")
    return "What the run reports besides its log lines: the metrics file, TensorBoard, memory figures, curves "
           "([watching a run](watching.md)).";
  return "";
}

}  // namespace

std::string config_reference_markdown() {
  const Config defaults;
  std::vector<std::string> sections;
  for (const auto& f : schema()) {
    const std::string sec = f.key.substr(0, f.key.find('.'));
    if (std::find(sections.begin(), sections.end(), sec) == sections.end()) sections.push_back(sec);
  }
  std::vector<std::string> links;
  for (const auto& sec : sections) links.push_back(fmt::format("[{0}](#{0})", sec));

  std::string out =
      "# Configuration reference\n"
      "\n"
      "<!-- Generated by `dptrain config-reference` from the config schema in trainer/config.cpp; do not edit.\n"
      "     Regenerate: build/trainer/dptrain config-reference > docs/configuration.md -->\n"
      "\n"
      "This page is generated by `dptrain config-reference` from the config schema (`trainer/config.cpp`), the one\n"
      "table that the parser, the validation, `--print-config` and `dptrain --help` also come from. Do not edit it:\n"
      "after changing a key, run `build/trainer/dptrain config-reference > docs/configuration.md` (a unit test\n"
      "fails while the committed page differs from the program's).\n"
      "\n"
      "An experiment is a TOML file (`configs/*.toml`) with one table per section below; any key can also be set\n"
      "on the command line as `section.key=value`, after the file:\n"
      "\n"
      "```bash\n"
      "build/trainer/dptrain --config configs/fmnist_mlp.toml train.lr=0.1 model.hidden=[256,256] dist.backend=gloo\n"
      "build/trainer/dptrain --config configs/fmnist_mlp.toml --print-config     # the effective config, then exit\n"
      "```\n"
      "\n"
      "An unknown key or a value of the wrong type is an error naming the key (exit code 2). Rank 0 prints the\n"
      "effective config at the start, every checkpoint stores it, and right after the rendezvous the ranks compare\n"
      "its hash: a rank started with another config stops the job before the first step. A key set to another value\n"
      "than its default that the run's model, data set, optimizer or schedule does not read (`train.momentum` with\n"
      "`train.optimizer = adamw`, `model.n_kv_head` with `model.name = gpt`) is named in a warning at the start.\n"
      "Defaults are shown as TOML values. A relative path (`data.dir`, `data.jsonl`, `data.tokenizer`,\n"
      "`checkpoint.dir`, `log.dir`, `model.init_from`, `model.hf_config`) is taken from the current directory, where\n"
      "dptrain runs (as every rank does), not from the folder of the config file that names it.\n"
      "\n";
  out += fmt::format("Sections: {}.\n", fmt::join(links, ", "));
  for (const auto& sec : sections) {
    out += fmt::format("\n## {}\n\n", sec);
    if (const std::string intro = section_intro(sec); !intro.empty()) out += intro + "\n\n";
    out += "| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
    for (const auto& f : schema()) {
      if (f.key.substr(0, f.key.find('.')) != sec) continue;
      std::string value;  // in a code span: only `|` needs escaping there
      for (char ch : f.show(defaults)) value += ch == '|' ? std::string("\\|") : std::string(1, ch);
      out += fmt::format("| `{}` | {} | `{}` | {} |\n", f.key, f.type, value, markdown_cell(f.help));
    }
  }
  return out;
}

}  // namespace dpt::trainer
