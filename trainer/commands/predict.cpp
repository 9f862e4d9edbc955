// trainer/commands/predict.cpp: `dptrain predict --checkpoint C --input PATH --out FILE`: a checkpoint's predictions
// for many inputs on every rank of the job, rank 0 writing FILE (trainer/predict.h): the same bytes on any number
// of ranks (for the same threads per rank).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "trainer/commands/commands.h"
#include "trainer/commands/job.h"
#include "trainer/model_registry.h"
#include "trainer/predict.h"
#include "trainer/predict_images.h"
#include "trainer/predict_prompts.h"

namespace dpt::trainer::commands {
namespace {

struct PredictArgs {
  std::string checkpoint, input, out;
  int64_t batch_size = 64;
  int64_t top_k = 5;
  std::string precision;  // empty: the checkpoint's train.precision
  std::string format = "jsonl";
  bool skip_bad = false;
  SamplingArgs sampling;  // prompts (a GPT checkpoint): generate's options
  std::vector<std::string> overrides;
  std::shared_ptr<const bool> print_config;
  std::vector<std::string> given;  // the options given on the command line (as "--top-k"), for check_options
};

// The options that apply to one kind of checkpoint only: given with the other kind, they would be accepted and
// ignored, so they are refused.
constexpr const char* kImageOptions[] = {"--top-k", "--skip-bad"};
constexpr const char* kPromptOptions[] = {"--tokens", "--temperature", "--sample-top-k", "--sample-top-p",
                                          "--repetition-penalty", "--no-repeat-ngram-size",
                                          "--min-new-tokens", "--seed",
                                          "--no-kv-cache", "--ignore-eos", "--tokenizer"};

// ConfigError naming an option given that `target`'s checkpoint does not use, and the one meant where there is one.
void check_options(const PredictArgs& a, const SavedRun& target) {
  const bool prompts = model_card(target.config.model.name).input == ModelInput::tokens;
  auto given = [&](const char* name) { return std::find(a.given.begin(), a.given.end(), name) != a.given.end(); };
  const std::string model = fmt::format("{} holds a {} model", target.checkpoint.path, target.config.model.name);
  if (prompts) {
    if (given("--top-k"))
      DPT_THROW(ConfigError, "predict: --top-k is the classes per image, and {}: its sampling among the k most likely "
                "tokens is --sample-top-k (generate's --top-k)", model);
    if (given("--skip-bad"))
      DPT_THROW(ConfigError, "predict: --skip-bad skips unreadable images, and {}, whose prompts file has none to "
                "skip; leave it out", model);
    return;
  }
  for (const char* name : kPromptOptions)
    if (given(name))
      DPT_THROW(ConfigError, "predict: {} samples text from a GPT or Llama's prompts, and {}, which predicts the "
                "classes of images; leave it out", name, model);
}

// Whether the command line asked for an arithmetic (--precision, or a train.precision= override): prompts then run
// in it, else in float32, generate's, whatever the checkpoint trained in.
bool precision_asked(const PredictArgs& a) {
  return !a.precision.empty() || std::any_of(a.overrides.begin(), a.overrides.end(), [](const std::string& o) {
           return o.starts_with("train.precision=");
         });
}

int predict_job(const PredictArgs& a) {
  std::optional<SavedRun> target;  // the checkpoint, and its config
  return run_job({
      .name = "dptrain predict",
      .print_config = *a.print_config,
      .overrides = a.overrides,
      .load_config =
          [&](std::string& origin) {
            std::vector<std::string> overrides = a.overrides;
            if (!a.precision.empty()) overrides.push_back("train.precision=" + a.precision);
            target = load_saved_run(a.checkpoint, overrides);
            check_options(a, *target);
            origin = target->checkpoint.path + "'s";
            return target->config;
          },
      .work =
          [&](Job& job) {
            const PredictFormat format = parse_predict_format(a.format);
            // A bad --out (a directory, a folder that cannot be made), said before anything is computed.
            if (job.env.rank == 0) check_output_path(a.out, a.input);
            const bool prompts = model_card(target->config.model.name).input == ModelInput::tokens;
            PredictSummary s;
            if (prompts) {
              const SamplingArgs& g = a.sampling;
              const PromptOptions o{.input = a.input, .out = a.out, .tokenizer = g.tokenizer, .tokens = g.tokens,
                                    .sampling = {.temperature = g.temperature, .top_k = g.top_k, .top_p = g.top_p,
                                                 .repetition_penalty = g.repetition_penalty,
                                                 .no_repeat_ngram_size = g.no_repeat_ngram_size,
                                                 .min_new_tokens = g.min_new_tokens},
                                    .stop_at_eos = !g.ignore_eos,
                                    .seed = g.seed, .kv_cache = !g.no_kv_cache, .batch_size = a.batch_size,
                                    .format = format,
                                    .progress_interval_s = target->config.train.progress_interval_s,
                                    .precision = precision_asked(a)
                                                     ? std::optional(target->config.train.precision)
                                                     : std::nullopt};
              s = predict_prompts(*target, o, *job.pg, job.device);
            } else {
              const PredictOptions o{.input = a.input, .out = a.out, .batch_size = a.batch_size, .top_k = a.top_k,
                                     .format = format, .skip_bad = a.skip_bad};
              s = predict_images(*target, o, *job.pg, job.device);
            }
            if (job.env.rank == 0)
              spdlog::info("predict: wrote {} lines{} to {} in {:.1f} s: {:.1f} {}/s{} on {} rank(s) ({}, step {})",
                           s.inputs, prompts ? "" : fmt::format(" ({} unreadable image(s))", s.errors), a.out, s.seconds,
                           static_cast<double>(s.inputs) / s.seconds, prompts ? "prompts" : "images",
                           prompts ? fmt::format(", {} tokens generated, {:.1f} tokens/s", s.tokens,
                                                     static_cast<double>(s.tokens) / s.seconds) : "",
                           job.env.world_size, target->checkpoint.path, target->checkpoint.state.step);
            return 0;
          },
  });
}

}  // namespace

Command add_predict(CLI::App& root, std::shared_ptr<bool> print_config) {
  auto a = std::make_shared<PredictArgs>();
  a->print_config = print_config;
  CLI::App* cmd = root.add_subcommand(
      "predict",
      "predict the classes of many images with a checkpoint's classifier on every rank of the job, the sorted inputs "
      "in batches of --batch-size dealt to the ranks in turn, with the checkpoint's evaluation preprocessing; rank 0 "
      "writes one line per image, in sorted path order, to --out (as OUT.tmp, renamed when complete): the same bytes "
      "on any number of ranks, for the same CPU kernels and threads per rank (1 thread and 2 or more give other last "
      "digits: one thread runs the products in oneDNN's sgemm, more in OpenBLAS; the run's 'device cpu: threads' line "
      "says how many); trains nothing. With a GPT or Llama checkpoint --input is a text file of prompts, one a line, "
      "or a .jsonl file of {\"prompt\": ...} records (the fine-tuning format: a prompt may span lines), "
      "and each line of OUT is {\"prompt\": P, \"text\": T}, T what `dptrain generate` prints for P with the same options and seed; "
      "prompts of one token length (past the context, the block size or a Llama's max_position_embeddings: as the "
      "context) are generated --batch-size at a time with "
      "one KV cache, the batches dealt to the ranks in turn (a batch's products may round the logits' last bits "
      "otherwise, which rarely turns a draw; --batch-size 1: exactly generate's text)");
  cmd->footer(
      "Start it as training starts (dprun, mpirun, srun). A jsonl line: {\"path\": \"3_dress/0017.png\", \"top\": "
      "[{\"index\": 3, \"class\": \"3_dress\", \"prob\": 0.912345}, ...]} (the path relative to a folder --input, "
      "the class names the checkpoint was trained with, probabilities with 6 decimals); an unreadable image with "
      "--skip-bad: {\"path\": ..., \"error\": ...}.\n"
      // Listed from the tables check_options refuses by (a hand-written list once left out three of the GPT's).
      "Options by checkpoint: images: " + fmt::format("{}", fmt::join(kImageOptions, ", ")) + "; GPT or Llama: " +
      fmt::format("{}", fmt::join(kPromptOptions, ", ")) + "; both: --batch-size, --precision, --format. An option of "
      "the other kind is refused (exit 2).\n"
      "Example: dprun --nproc-per-node 2 -- dptrain predict --checkpoint runs/fmnist_mlp/checkpoints --input "
      "/tmp/fmnist-images/val --out preds.jsonl");
  add_checkpoint_option(*cmd, a->checkpoint);
  add_print_config_flag(*cmd, *print_config);
  cmd->add_option("--input", a->input,
                  "a folder of images (recursively: .png, .jpg, .jpeg in any case), one image (so named, or a file "
                  "starting as a PNG or JPEG does) or a list file (one path a line, relative to the working directory; "
                  "blank lines and # comments skipped); GPT: a file of prompts, one a line (lines blank or of white "
                  "space alone skipped, and counted), or FILE.jsonl: a record a line, its \"prompt\" the prompt "
                  "(data.dataset = jsonl's records; a \"completion\" ignored; a malformed line named FILE:LINE)")
      ->required();
  cmd->add_option("--out", a->out,
                  "the output file (its folder created if need be); written as OUT.tmp, renamed to OUT (replacing it) "
                  "when complete. Checked before anything is computed: a directory, or the --input file itself, is "
                  "refused (exit 2)")
      ->required();
  cmd->add_option("--batch-size", a->batch_size,
                  "images per forward pass (batches formed over all the images, the last one padded, dealt to the "
                  "ranks in turn); GPT: prompts generated side by side (those of one token length; the KV cache "
                  "holds 2 x n_layer x batch x positions x n_embd floats, positions the prompts' window and --tokens "
                  "up to block_size (a Llama: up to max_position_embeddings, with n_kv_head x head_dim in place of "
                  "n_embd)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--top-k", a->top_k,
                  "images: most likely classes per image (at most the class count); a GPT's is --sample-top-k")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--precision", a->precision,
                  "fp32 | bf16 | fp16: the arithmetic of matrix products and convolutions (default: the checkpoint's "
                  "train.precision; GPT: fp32, generate's, unless given)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--format", a->format, "jsonl (a JSON object a line) | csv (a header, then a row per image)")
      ->check(CLI::IsMember({"jsonl", "csv"}))
      ->capture_default_str();
  cmd->add_flag("--skip-bad", a->skip_bad,
                "images: an image that cannot be read gets a line with its error and the run goes on (else the run "
                "fails naming it, and writes nothing)");
  // Prompts: the options of `dptrain generate`, under the same names (--top-k is taken: --sample-top-k).
  add_sampling_options(*cmd, a->sampling, "--sample-top-k", "--sample-top-p", "GPT: ",
                       "every prompt is sampled from this seed: its text is `dptrain generate --prompt P --seed S`'s "
                       "(exactly so with --batch-size 1)");
  cmd->add_option("overrides", a->overrides,
                  "overrides of the checkpoint's config, key=value (e.g. train.device=cpu, data.dir=... for a "
                  "checkpoint written before class names were saved)");
  return {cmd, [a, cmd] {
            for (const CLI::Option* o : cmd->get_options())
              if (o->count() > 0 && !o->get_lnames().empty()) a->given.push_back("--" + o->get_lnames().front());
            return predict_job(*a);
          }};
}

}  // namespace dpt::trainer::commands
