// trainer/commands/common.cpp: what the commands share (trainer/commands/commands.h).
#include "trainer/commands/commands.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>

#include "comm/env.h"
#include "core/check.h"
#include "core/cli_checks.h"
#include "core/logging.h"
#include "data/output_dir.h"

namespace dpt::trainer::commands {

void die(int code, const std::string& what) { dpt::exit_with_error(code, what); }

int run_alone(const std::function<void()>& body) {
  init_logging(0, 1);
  // Started as N copies by a launcher (dprun, torchrun, mpirun, srun), each would do the whole work: N texts
  // printed, N writers racing on one OUT.tmp. Rank 0 does it; the others end at once.
  int rank = 0, world = 1;
  try {
    const comm::DistEnv env = comm::detect_env(comm::process_env());
    rank = env.rank;
    world = env.world_size;
  } catch (const Error&) {  // a placement training would refuse: not this command's concern
  }
  if (world > 1 && rank != 0) return 0;
  if (world > 1)
    spdlog::warn("this command runs in one process: the launcher started {}, and {} at once without doing anything "
                 "(start it alone, without the launcher)", world,
                 world == 2 ? std::string("rank 1 exits") : fmt::format("ranks 1 to {} exit", world - 1));
  try {
    body();
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    die(kExitError, e.what());
  }
  return 0;
}

int run_writer(const char* name, const std::string& out, bool force, const std::vector<std::string>& inputs,
               const std::string& input_name, const std::function<void()>& body) {
  return run_alone([&] {
    try {  // before the non-empty check: its advice, --force, would delete the input
      data::check_output_apart(out, inputs, data::FolderRead::named_files, "--out", input_name);
    } catch (const ConfigError& e) {
      die(kExitUsage, fmt::format("{}: {}", name, e.what()));
    }
    if (!force && data::non_empty_directory(out))
      die(kExitUsage, fmt::format("{}: {} is not empty: refusing to overwrite it (--force replaces it)", name, out));
    body();
  });
}

void add_checkpoint_option(CLI::App& cmd, std::string& path) {
  cmd.add_option("--checkpoint", path, "a checkpoint (step-N/) or a checkpoint directory (its newest valid one)")
      ->required();
}

void add_print_config_flag(CLI::App& cmd, bool& print_config) {
  cmd.add_flag("--print-config", print_config,
               "print the effective config (the checkpoint's, with the overrides) as TOML and exit");
}

void add_out_dir_option(CLI::App& cmd, std::string& out) {
  cmd.add_option("--out", out,
                 "output directory (never an input nor a folder holding one); written as OUT.tmp, renamed to OUT when "
                 "complete")->required();
}

void add_force_flag(CLI::App& cmd, bool& force) {
  cmd.add_flag("--force", force, "replace OUT when it exists and is not empty (else refused)");
}

void add_sampling_options(CLI::App& cmd, SamplingArgs& s, const std::string& top_k_flag, const std::string& top_p_flag,
                          const std::string& prefix, const std::string& seed_help) {
  cmd.add_option("--tokens", s.tokens, prefix + "new tokens to sample" + (prefix.empty() ? "" : " per prompt"))
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  // Temperature 0 is greedy elsewhere (llama.cpp, OpenAI's API); transformers refuses it too, pointing at greedy.
  const CLI::Validator temperature(
      [top_k_flag](std::string& v) {
        std::string error = dpt::cli::Positive(v);
        if (!error.empty() && std::strtod(v.c_str(), nullptr) == 0)
          error += ": greedy decoding (temperature 0 elsewhere, transformers' do_sample=False) is " + top_k_flag + " 1";
        return error;
      },
      "POSITIVE");
  cmd.add_option("--temperature", s.temperature, prefix + "divides the logits: below 1 sharper, above 1 flatter")
      ->check(temperature)
      ->capture_default_str();
  cmd.add_option(top_k_flag, s.top_k,
                 prefix + "sample among the k most likely tokens only, and any tied with the k-th as in transformers "
                          "(0: all; 1: greedy)" + (top_k_flag == "--top-k" ? "" : ": generate's --top-k"))
      ->check(dpt::cli::NonNegative)
      ->capture_default_str();
  cmd.add_option(top_p_flag, s.top_p,
                 prefix + "then sample among the fewest most likely tokens whose probabilities add up to at least P "
                          "(nucleus sampling, after top-k, as Hugging Face's top_p; 1: all)" +
                     (top_p_flag == "--top-p" ? "" : ": generate's --top-p"))
      ->check(dpt::cli::Fraction)
      ->capture_default_str();
  cmd.add_option("--repetition-penalty", s.repetition_penalty,
                 prefix + "divides the logit of every token already in the text (the prompt's too) where it is "
                          "positive and multiplies it where negative, before --temperature, top-k and top-p, as "
                          "Hugging Face's repetition_penalty (1: off; above 1 repeats less; > 0)")
      ->check(dpt::cli::Positive)
      ->capture_default_str();
  cmd.add_option("--no-repeat-ngram-size", s.no_repeat_ngram_size,
                 prefix + "never sample a token that would repeat an N-gram already in the text (the prompt's too), "
                          "as Hugging Face's no_repeat_ngram_size (0: off)")
      ->check(dpt::cli::NonNegative)
      ->capture_default_str();
  cmd.add_option("--min-new-tokens", s.min_new_tokens,
                 prefix + "never end a text at the tokenizer's end-of-text token before this many new tokens (its "
                          "logit -inf until then), as Hugging Face's min_new_tokens (0: off)")
      ->check(dpt::cli::NonNegative)
      ->capture_default_str();
  cmd.add_option("--seed", s.seed, prefix + seed_help + " (a whole number in [0, 2^64 - 1])")
      ->check(whole_number())
      ->capture_default_str();
  cmd.add_flag("--no-kv-cache", s.no_kv_cache,
               prefix + "run the whole window for every token (a sliding window) instead of caching keys and values");
  cmd.add_flag("--ignore-eos", s.ignore_eos,
               prefix + "go on past the tokenizer's end-of-text token (by default a text ends there, left out of the "
                        "output, as Hugging Face's generate() ends at eos_token_id)");
  cmd.add_option("--tokenizer", s.tokenizer,
                 prefix + "a directory with the tokenizer.json, or the vocab.json and merges.txt (GPT-2 BPE), the model "
                          "was trained with, or the tokenizer.json itself (default: the checkpoint's data.dir, where "
                          "`dptrain tokenize` copies them, resolved against the current directory; missing there, it "
                          "is an error for a model with more ids than bytes)");
}

CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& v) {
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
          return "must be a whole number >= 0, got '" + v + "'";
        errno = 0;
        std::strtoull(v.c_str(), nullptr, 10);
        if (errno == ERANGE) return "must be at most 18446744073709551615 (2^64 - 1), got " + v;
        return std::string();
      },
      "");
}

}  // namespace dpt::trainer::commands
