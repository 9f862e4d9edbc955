// trainer/main.cpp: the dptrain program: parse the command line, find this rank in the job, join the
// process group, train. The only place that decides how the process dies: an error is logged with the rank
// and the process exits non-zero at once, so the launcher (dprun, mpirun, srun) tears the job down.
// Subcommands that train nothing: `dptrain export-images` writes Fashion-MNIST out as an image folder,
// `dptrain tokenize` writes text as token shards (train / val; byte-level, or GPT-2 BPE from a vocab.json and
// merges.txt), `dptrain generate` samples text from a GPT checkpoint, and `dptrain eval` evaluates a
// checkpoint on every rank of a job; `dptrain plot` draws a run's curves from its metrics file.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <functional>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include <unistd.h>

#include "comm/env.h"
#include "comm/init.h"
#include "core/check.h"
#include "core/cuda.h"
#include "core/logging.h"
#include "data/bpe.h"
#include "data/export.h"
#include "data/idx.h"
#include "data/output_dir.h"
#include "data/tokenize.h"
#include "models/kernels/cpu/cpu_kernels.h"
#include "trainer/config.h"
#include "trainer/config_check.h"
#include "trainer/generate.h"
#include "trainer/plot.h"
#include "trainer/preemption.h"
#include "trainer/trainer.h"

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitHang = 3;  // a collective outlived dist.timeout_s: the message names the rank it waited for

[[noreturn]] void die(int code, const std::string& what) { dpt::exit_with_error(code, what); }

struct ExportArgs {
  std::string out;
  std::string data_dir = dpt::data::kFashionMnistDir;
  std::string format = "png";
  size_t limit = 0;
  bool force = false;
};

// A subcommand that writes a data set to OUT and trains nothing (export-images, tokenize): one process; a
// non-empty OUT is refused unless --force; errors end the process as main's do (2: bad input, 1: failed).
int run_writer(const char* name, const std::string& out, bool force, const std::function<void()>& body) {
  using namespace dpt;
  init_logging(0, 1);
  try {
    if (!force && data::non_empty_directory(out))
      die(kExitError, fmt::format("{}: {} is not empty: refusing to overwrite it (--force replaces it)", name, out));
    body();
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    die(kExitError, e.what());
  }
  return 0;
}

// dptrain export-images: Fashion-MNIST as OUT/{train,val}/<class>/<index>.png, for the image-folder path.
int export_images(const ExportArgs& a) {
  using namespace dpt;
  return run_writer("export-images", a.out, a.force, [&] {
    const auto start = std::chrono::steady_clock::now();
    auto train = data::load_fashion_mnist(a.data_dir, true);
    auto test = data::load_fashion_mnist(a.data_dir, false);
    data::ExportOptions o;
    o.out_dir = a.out;
    o.format = a.format == "png" ? data::ImageFormat::png : data::ImageFormat::jpeg;
    o.limit = a.limit;
    o.force = a.force;
    o.class_names = data::fashion_mnist_class_folders();
    o.progress = [](const std::string& split, size_t done, size_t total) {
      spdlog::info("export-images: {} {}/{} images", split, done, total);
    };
    const data::ExportSummary s = data::export_image_folder(*train, *test, o);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string size = s.bytes < 1000000 ? fmt::format("{:.1f} kB", s.bytes / 1e3) : fmt::format("{:.1f} MB", s.bytes / 1e6);
    spdlog::info("export-images: wrote {} train + {} val {} images of {} classes ({}) to {} in {:.1f} s", s.train_images,
                 s.val_images, a.format == "png" ? "PNG" : "JPEG", s.classes, size, s.out_dir, seconds);
  });
}

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string out;
  std::string vocab, merges;  // GPT-2 BPE when given (both), else bytes
  size_t val_every = 10;
  bool force = false;
};

// dptrain tokenize: text files as token shards in llm.c's format: OUT/bytes_{train,val}_000000.bin, or with GPT-2
// BPE OUT/gpt2_{train,val}_000000.bin beside a copy of its vocab.json and merges.txt.
int tokenize(const TokenizeArgs& a) {
  using namespace dpt;
  return run_writer("tokenize", a.out, a.force, [&] {
    const auto start = std::chrono::steady_clock::now();
    data::TokenizeOptions o;
    o.inputs = a.inputs;
    o.out_dir = a.out;
    o.val_every = a.val_every;
    o.force = a.force;
    auto last = start;
    o.progress = [&](size_t done, size_t total, uint64_t bytes) {
      const auto now = std::chrono::steady_clock::now();
      if (done == total || now - last > std::chrono::seconds(2)) {
        last = now;
        spdlog::info("tokenize: {}/{} files, {:.1f} MB", done, total, bytes / 1e6);
      }
    };
    std::unique_ptr<data::Tokenizer> tokenizer;
    if (a.vocab.empty()) {
      tokenizer = std::make_unique<data::ByteTokenizer>();
    } else {
      tokenizer = std::make_unique<data::Gpt2Bpe>(a.vocab, a.merges);
    }
    const data::TokenizeSummary s = data::tokenize_text(o, *tokenizer);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const size_t skipped = s.skipped_dat + s.skipped_binary;
    spdlog::info("tokenize: {} files, {} bytes{}", s.files, s.bytes,
                 skipped == 0 ? std::string()
                              : fmt::format("; skipped {} files ({} *.dat index files, {} binary with a NUL byte)",
                                            skipped, s.skipped_dat, s.skipped_binary));
    if (s.skipped_links != 0) spdlog::info("tokenize: did not follow {} symlinks inside the input directories", s.skipped_links);
    spdlog::info("tokenize: wrote {} train tokens ({} shards) + {} val tokens ({} shards), {}, to {} in {:.2f} s",
                 s.train_tokens, s.train_shards.size(), s.val_tokens, s.val_shards.size(), s.tokenizer, s.out_dir,
                 seconds);
  });
}
struct GenerateArgs {
  std::string checkpoint, prompt = "\n";
  std::string tokenizer;  // a directory with vocab.json + merges.txt; empty: the checkpoint's data.dir
  int64_t tokens = 200;
  double temperature = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 42;
  std::string device = "auto";
  bool no_kv_cache = false;
};

struct ExportWeightsArgs {
  std::string checkpoint, layout = "hf", out;
};

// dptrain export-weights: a GPT checkpoint as a safetensors file other programs load.
int export_weights(const ExportWeightsArgs& a) {
  using namespace dpt;
  init_logging(0, 1);
  try {
    spdlog::info("export-weights: wrote {}", trainer::export_gpt_weights(a.checkpoint, models::parse_gpt_layout(a.layout), a.out));
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    die(kExitError, e.what());
  }
  return 0;
}

struct PlotArgs {
  std::string run, out, size = "1200x900", script;
};

// dptrain plot: a run's curves from RUN/metrics.jsonl, as one PNG drawn by gnuplot.
int plot(const PlotArgs& a) {
  using namespace dpt;
  init_logging(0, 1);
  try {
    const trainer::PlotSize size = trainer::parse_plot_size(a.size);
    const trainer::PlotReport r = trainer::plot_run({.run = a.run, .out = a.out, .size = size, .script = a.script});
    if (r.malformed > 0)
      spdlog::warn("plot: skipped {} malformed line(s) of {} (the first: line {})", r.malformed, r.metrics,
                   r.first_malformed);
    if (!r.gnuplot_output.empty()) spdlog::warn("plot: gnuplot said: {}", r.gnuplot_output);
    spdlog::info("plot: {} record{} of {} \u2192 {} ({}x{})", r.records, r.records == 1 ? "" : "s", r.metrics, r.out,
                 size.width, size.height);
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    die(kExitError, e.what());
  }
  return 0;
}

// dptrain generate: text from a GPT checkpoint, on the GPU if there is one, to stdout (the prompt, then what
// follows it).
int generate(const GenerateArgs& a) {
  using namespace dpt;
  spdlog::set_default_logger(spdlog::stderr_color_mt("generate"));  // stdout carries the text alone
  init_logging(0, 1);
  try {
    const Device device = trainer::choose_device(a.device, 0, cuda::device_count(), cuda::unavailable_reason());
    if (device.is_cuda()) cuda::set_device(device.index);
    const trainer::GptCheckpoint ck = trainer::load_gpt_checkpoint(a.checkpoint, a.tokenizer, device);
    const data::Tokenizer& tokenizer = *ck.tokenizer;
    spdlog::info("generate: {} from {} on {}; {} tokens, temperature {}, top_k {}, seed {}{}", ck.model->summary(),
                 ck.from, device.str(), a.tokens, a.temperature, a.top_k, a.seed, a.no_kv_cache ? ", no KV cache" : "");
    spdlog::info("generate: tokenizer {} from {}", tokenizer.describe(), ck.tokenizer_from);
    if (tokenizer.name() == "bytes" && ck.vocab_size != 256) {
      spdlog::warn("generate: byte-level tokens for a model of vocab_size {}: {} holds no vocab.json and merges.txt; "
                   "if it was trained on GPT-2 BPE shards, --tokenizer DIR names their directory",
                   ck.vocab_size, ck.tokenizer_from);
    }
    if (a.prompt.empty()) DPT_THROW(ConfigError, "generate: --prompt must not be empty (it is where the text starts)");
    const std::vector<int32_t> prompt = tokenizer.encode(a.prompt);
    const auto out = models::generate(*ck.model, ck.block_size, prompt, a.tokens,
                                      {.temperature = a.temperature, .top_k = a.top_k,
                                       .vocab_limit = tokenizer.vocab_size()},
                                      a.seed, /*kv_cache=*/!a.no_kv_cache);
    const std::string text = tokenizer.decode(out);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    die(kExitError, e.what());
  }
  return 0;
}
}  // namespace

// OpenBLAS chooses its kernels when it loads, from the CPU model; on CPUs it does not know (many cloud VMs)
// it runs Prescott (SSE3) kernels, about 4x slower than the AVX-512 ones the CPU has. The only fix is
// OPENBLAS_CORETYPE in the environment of a new process, so dptrain restarts itself once with it (same pid,
// same arguments), unless the user set OPENBLAS_CORETYPE or DPT_NO_BLAS_REEXEC. The note is logged later.
void reexec_for_fast_blas(char** argv) {
  if (std::getenv("DPT_NO_BLAS_REEXEC") || std::getenv("DPT_BLAS_REEXEC_FROM")) return;
  const std::string core = dpt::models::blas_core_upgrade();
  if (core.empty()) return;
  const std::string from = dpt::models::blas_core();
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  setenv("DPT_BLAS_REEXEC_FROM", from.c_str(), 1);
  execv("/proc/self/exe", argv);
  // execv failed: carry on with the slow kernels (the note below says so).
  unsetenv("OPENBLAS_CORETYPE");
}

int main(int argc, char** argv) {
  using namespace dpt;
  reexec_for_fast_blas(argv);
  CLI::App app{
      "dptrain: data-parallel training, one process per GPU or CPU slot.\n"
      "Start N copies with `dprun --nproc-per-node N -- dptrain ...`, `mpirun -np N dptrain ...` or `srun`; each\n"
      "finds its rank from the environment (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, OMPI_COMM_WORLD_*, or\n"
      "SLURM_*). A single process started by hand trains alone.\n"
      "SIGUSR1 or SIGTERM to any rank (Slurm's --signal, scancel, dprun forwarding): the ranks stop together after\n"
      "the current step, rank 0 writes a checkpoint, and every rank exits with 75; the same command resumes.\n"
      "Exit codes: 0 done, 1 failed, 2 bad command line or config, 3 hang (a collective outlived dist.timeout_s; the\n"
      "message names the stuck rank), 75 preempted (checkpoint written)."};
  std::string config_path;
  std::string resume = "auto";
  bool print_config = false;
  std::vector<std::string> overrides;
  app.add_option("-c,--config", config_path, "TOML experiment file (e.g. configs/fmnist_mlp.toml); without it, the defaults below")
      ->check(CLI::ExistingFile);
  app.add_option("--resume", resume,
                 "auto: continue from the newest valid checkpoint in checkpoint.dir if there is one; never: start "
                 "fresh and DELETE the checkpoints in checkpoint.dir; PATH: continue from that checkpoint")
      ->capture_default_str();
  app.add_flag("--print-config", print_config, "print the effective config as TOML and exit");
  app.add_option("overrides", overrides, "config overrides, key=value (e.g. train.lr=0.1 model.hidden=[256,256])");
  app.footer("Config keys (section.key  type  default  meaning):\n" + trainer::config_keys_help());

  ExportArgs export_args;
  CLI::App* export_cmd = app.add_subcommand(
      "export-images",
      "write Fashion-MNIST as an image folder in torchvision's ImageFolder layout (OUT/train/<class>/<index>.png "
      "and OUT/val/..., class folders 0_tshirt_top ... 9_ankle_boot, grey 28x28), then exit; trains nothing");
  export_cmd->footer("Example: dptrain export-images --out /tmp/fmnist-images --limit 1000");
  export_cmd->add_option("--out", export_args.out,
                         "output directory; written as OUT.tmp, renamed to OUT when complete")
      ->required();
  export_cmd->add_option("--data-dir", export_args.data_dir, "directory of the Fashion-MNIST IDX .gz files")
      ->capture_default_str();
  export_cmd->add_option("--format", export_args.format, "png (lossless: reads back identical) | jpg (quality 95)")
      ->check(CLI::IsMember({"png", "jpg"}))
      ->capture_default_str();
  export_cmd->add_option("--limit", export_args.limit,
                         "images per split, spread evenly over the 10 classes (0: all 60000 + 10000; else >= 10)")
      ->check(CLI::Validator(  // digits only: a size_t would take "-3" as 2^64 - 3
          [](std::string& v) {
            return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos
                       ? std::string()
                       : "must be a whole number >= 0, got '" + v + "'";
          },
          ""))
      ->capture_default_str();
  export_cmd->add_flag("--force", export_args.force, "replace OUT when it exists and is not empty (else refused)");

  TokenizeArgs tok_args;
  CLI::App* tokenize_cmd = app.add_subcommand(
      "tokenize",
      "write text as token shards in llm.c's .bin format, then exit; trains nothing. Byte-level by default (token = "
      "byte, vocab 256): OUT/bytes_train_000000.bin and OUT/bytes_val_000000.bin; GPT-2 BPE with --vocab and "
      "--merges: OUT/gpt2_*.bin, and the two files copied into OUT");
  tokenize_cmd->footer(
      "The inputs are read in order (a directory: its regular files recursively, sorted by path; *.dat files and\n"
      "files with a NUL byte skipped) and cut into blocks of 4096 tokens; every Nth block goes to val, the rest to\n"
      "train. Shards hold at most 100M tokens each. With GPT-2 BPE each file is encoded on its own.\n"
      "Example: dptrain tokenize --input /usr/share/games/fortunes --out runs/fortunes\n"
      "         dptrain tokenize --input corpus/ --vocab gpt2/vocab.json --merges gpt2/merges.txt --out runs/corpus");
  tokenize_cmd->add_option("--input", tok_args.inputs, "a text file or a directory of them (repeatable)")->required();
  tokenize_cmd->add_option("--out", tok_args.out, "output directory; written as OUT.tmp, renamed to OUT when complete")
      ->required();
  tokenize_cmd->add_option("--val-every", tok_args.val_every, "every Nth block of 4096 tokens goes to the val split")
      ->check(CLI::Range(size_t{2}, size_t{1} << 40))
      ->capture_default_str();
  tokenize_cmd->add_flag("--force", tok_args.force, "replace OUT when it exists and is not empty (else refused)");
  CLI::Option* vocab_opt = tokenize_cmd->add_option(
      "--vocab", tok_args.vocab, "GPT-2 BPE: its vocab.json (token -> id; ids must fit uint16), with --merges");
  CLI::Option* merges_opt =
      tokenize_cmd->add_option("--merges", tok_args.merges, "GPT-2 BPE: its merges.txt (one merge a line), with --vocab");
  vocab_opt->needs(merges_opt);
  merges_opt->needs(vocab_opt);
  GenerateArgs gen_args;
  CLI::App* generate_cmd = app.add_subcommand(
      "generate", "sample text from a GPT checkpoint (on the GPU when there is one) and print it; trains nothing. The prompt is encoded "
                  "and the output decoded with the tokenizer of the checkpoint's data set (GPT-2 BPE when data.dir "
                  "holds vocab.json and merges.txt, else bytes), or --tokenizer's");
  generate_cmd->footer("Example: dptrain generate --checkpoint runs/gpt_tiny/checkpoints --prompt \"Q: \" --tokens 300");
  generate_cmd->add_option("--checkpoint", gen_args.checkpoint, "a checkpoint (step-N/) or a checkpoint directory (its newest valid one)")
      ->required();
  generate_cmd->add_option("--prompt", gen_args.prompt, "the text to continue")->capture_default_str();
  generate_cmd->add_option("--tokens", gen_args.tokens, "new tokens to sample")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  generate_cmd->add_option("--temperature", gen_args.temperature, "divides the logits: below 1 sharper, above 1 flatter")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  generate_cmd->add_option("--top-k", gen_args.top_k, "sample among the k most likely tokens only (0: all; 1: greedy)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  generate_cmd->add_option("--seed", gen_args.seed, "the same seed gives the same text")->capture_default_str();
  generate_cmd->add_option("--device", gen_args.device, "auto (cuda if available, else cpu) | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  generate_cmd->add_flag("--no-kv-cache", gen_args.no_kv_cache,
                         "run the whole window for every token (a sliding window) instead of caching keys and values");
  generate_cmd->add_option("--tokenizer", gen_args.tokenizer,
                           "a directory with the vocab.json and merges.txt (GPT-2 BPE) the model was trained with "
                           "(default: the checkpoint's data.dir, where `dptrain tokenize` copies them)");
  ExportWeightsArgs ew_args;
  CLI::App* export_weights_cmd = app.add_subcommand(
      "export-weights", "write a GPT checkpoint's weights as one safetensors file for other programs: Hugging Face's "
                        "GPT-2 layout (transformers' GPT2LMHeadModel.from_pretrained) or nanoGPT's state_dict; trains nothing");
  export_weights_cmd->footer(
      "Example: dptrain export-weights --checkpoint runs/gpt_tiny/checkpoints --out gpt_tiny.safetensors\n"
      "model.init_from reads either layout back.");
  export_weights_cmd->add_option("--checkpoint", ew_args.checkpoint,
                                 "a checkpoint (step-N/) or a checkpoint directory (its newest valid one)")
      ->required();
  export_weights_cmd->add_option("--layout", ew_args.layout,
                                 "hf: no transformer. prefix, Conv1D weights [in, out], no lm_head; nanogpt: nn.Linear "
                                 "weights [out, in], lm_head.weight a copy of wte")
      ->check(CLI::IsMember({"hf", "nanogpt"}))
      ->capture_default_str();
  export_weights_cmd->add_option("--out", ew_args.out, "the .safetensors file (written whole: OUT.tmp, then renamed)")
      ->required();
  struct {
    std::string checkpoint;
    std::vector<std::string> overrides;
  } eval_args;
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "evaluate a checkpoint on its test split (a GPT: the val shards) on every rank of the job, each its "
              "exact share: loss (and perplexity for a GPT) and accuracy; trains nothing");
  eval_cmd->footer(
      "Start it as training starts (dprun, mpirun, srun); the result does not depend on the number of ranks.\n"
      "Example: dprun --nproc-per-node 2 -- dptrain eval --checkpoint runs/gpt_tiny/checkpoints data.dir=runs/fortunes");
  eval_cmd->add_option("--checkpoint", eval_args.checkpoint,
                       "a checkpoint (step-N/) or a checkpoint directory (its newest valid one)")
      ->required();
  eval_cmd->add_option("overrides", eval_args.overrides,
                       "overrides of the checkpoint's config, key=value (e.g. data.dir=... train.eval_batch_size=64)");
  PlotArgs plot_args;
  CLI::App* plot_cmd = app.add_subcommand(
      "plot", "draw a run's curves from RUN/metrics.jsonl into one PNG with gnuplot, then exit; trains nothing. "
              "Four panels against the optimizer step: loss (train: the progress lines' running mean of the epoch "
              "and each epoch's mean; test), test accuracy (a GPT: test perplexity), learning rate, throughput "
              "(samples/s or tokens/s of all ranks; MFU on a right axis when recorded)");
  plot_cmd->footer(
      "Works during a run too: it draws what the file holds so far. Needs gnuplot with its pngcairo terminal\n"
      "(Debian: gnuplot-nox, installed by scripts/setup.sh); GNUPLOT=PATH chooses another.\n"
      "Exit codes: 0 drawn, 1 gnuplot missing or failed (its output in the message), 2 no metrics file, an empty\n"
      "one or one without progress or epoch records, or a bad option.\n"
      "Example: dptrain plot runs/fmnist_mlp          (writes runs/fmnist_mlp/curves.png)\n"
      "         dptrain plot runs/gpt_tiny/metrics.jsonl --out /tmp/gpt.png --size 900x600");
  plot_cmd->add_option("run", plot_args.run,
                       "a run folder (the one holding metrics.jsonl: log.dir, by default the folder of "
                       "checkpoint.dir) or the path of a metrics file")
      ->required();
  plot_cmd->add_option("--out", plot_args.out,
                       "the PNG (written whole: OUT.tmp, then renamed); default: curves.png beside the metrics file");
  plot_cmd->add_option("--size", plot_args.size, "WIDTHxHEIGHT in pixels, each 200 to 10000")->capture_default_str();
  plot_cmd->add_option("--script", plot_args.script, "also write the gnuplot script (data inline) to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help (rc 0) or the error and usage
    return rc == 0 ? 0 : kExitUsage;
  }
  if (*export_cmd) return export_images(export_args);
  if (*tokenize_cmd) return tokenize(tok_args);
  if (*generate_cmd) return generate(gen_args);
  if (*export_weights_cmd) return export_weights(ew_args);
  if (*plot_cmd) return plot(plot_args);

  comm::DistEnv env;
  try {
    env = comm::detect_env(comm::process_env());
    init_logging(env.rank, env.world_size);
    if (env.rank == 0) {
      if (const char* from = std::getenv("DPT_BLAS_REEXEC_FROM"))
        spdlog::info("OpenBLAS: {} kernels (OPENBLAS_CORETYPE; it had chosen {} for this CPU)", models::blas_core(), from);
      else if (const std::string better = models::blas_core_upgrade(); !better.empty())
        spdlog::warn("OpenBLAS runs {} kernels on a CPU that supports {}: set OPENBLAS_CORETYPE={} for faster GEMMs",
                     models::blas_core(), better, better);
    }
  } catch (const Error& e) {
    std::cerr << "dptrain: " << e.what() << "\n";
    return kExitUsage;
  }

  // Training stops cleanly on SIGUSR1 or SIGTERM (a checkpoint, then exit 75; trainer/preemption.h). Installed
  // before the process group exists, so that a signal during start-up is not fatal either.
  if (!*eval_cmd) trainer::install_stop_handlers();

  trainer::Config cfg;
  std::optional<trainer::EvalTarget> eval;  // dptrain eval: the checkpoint, and its config
  try {
    if (*eval_cmd) {
      eval = trainer::eval_target(eval_args.checkpoint, eval_args.overrides);
      cfg = eval->config;
    } else {
      cfg = trainer::load_config(config_path, overrides);
    }
    if (print_config) {
      std::cout << trainer::to_toml(cfg);
      return 0;
    }
    if (!std::getenv("DPT_LOG_LEVEL")) spdlog::set_level(parse_log_level(cfg.log.level));
  } catch (const Error& e) {
    die(kExitUsage, e.what());
  }

  // The process group outlives the try block: the error that ends this rank is logged (and the process gone,
  // by _Exit) before anything closes its connections. Were it destroyed during unwinding, the peers would see
  // the connection drop first, fail with "connection reset", and could be reported, and the launcher could stop
  // this rank, before the real cause was printed.
  std::unique_ptr<comm::ProcessGroup> pg;
  try {
    if (env.rank == 0)
      spdlog::info("dptrain{}: {} rank(s) via {}; config {} (hash {}):\n{}", eval ? " eval" : "", env.world_size,
                   comm::launcher_name(env.launcher),
                   eval ? eval->checkpoint.path + "'s" : config_path.empty() ? "<defaults>" : config_path,
                   trainer::config_hash(cfg), trainer::to_toml(cfg));
    // The device first: "cuda if available else cpu", one GPU per local rank; the backend follows from it.
    const Device device = trainer::choose_device(cfg.train.device, env.local_rank, cuda::device_count(),
                                                 cuda::unavailable_reason());
    if (device.is_cuda()) {
      cuda::set_device(device.index);
      spdlog::info("device {}: {}", device.str(), cuda::device_description(device.index));
    } else if (cfg.train.device == "auto" && env.rank == 0) {
      spdlog::warn("no GPU ({}): training on the CPU", cuda::unavailable_reason());
    }
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
    pg = comm::init_process_group(
        env, {.backend = cfg.dist.backend, .timeout = timeout, .device = device, .interface = cfg.dist.interface,
              .on_fatal = [](const std::string& why) {
                if (why.starts_with(comm::kHangPrefix)) die(kExitHang, why);
                die(kExitError, "collective failed: " + why);
              }});
    trainer::check_same_config(cfg, *pg);  // every rank: the same config and build, or ConfigError (exit 2)
    if (eval) {
      const trainer::EvalReport r = trainer::evaluate_checkpoint(*eval, *pg, device);
      if (env.rank == 0)
        spdlog::info("eval: {} (step {}, {}): loss {:.4f}{} accuracy {:.4f} over {:.0f} {} ({}) on {} rank(s)",
                     eval->checkpoint.path, eval->checkpoint.state.step, r.model, r.loss,
                     r.unit == "tokens" ? fmt::format(" perplexity {:.3f}", std::exp(r.loss)) : "", r.acc, r.rows,
                     r.unit, cfg.data.dataset == "tokens" ? "the val shards" : "the test split", env.world_size);
    } else {
      auto result = trainer::train(cfg, {.resume = resume, .device = device}, *pg);
      if (result.stop_signal) {
        pg.reset();
        if (env.rank == 0)
          spdlog::info("preempted: checkpoint of step {} written; exiting with {} (the same command resumes from it)",
                       result.steps, trainer::kExitPreempted);
        spdlog::default_logger()->flush();
        return trainer::kExitPreempted;
      }
      if (env.rank == 0)
        spdlog::info("done: {} steps, test_acc {:.4f}, test_loss {:.4f}{}", result.steps, result.final_test_acc,
                     result.final_test_loss,
                     result.last_checkpoint.empty() ? "" : ", checkpoint " + result.last_checkpoint);
    }
    pg.reset();  // orderly shutdown of the backend (MPI_Finalize and the like)
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    die(kExitError, e.what());
  }
  return 0;
}
