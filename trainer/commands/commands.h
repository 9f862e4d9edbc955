// trainer/commands/commands.h: dptrain's subcommands, one file each. Each adds its options to the command line
// (so that its help text and its parser are one) and returns how to run it; main.cpp only parses and dispatches.
// A command returns the process's exit code, or ends the process itself on an error (die(): only commands decide
// how the process dies, never library code).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dpt::trainer::commands {

// Exit codes every command shares (`dptrain --help` lists them; a preempted run: trainer/preemption.h's 75).
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitHang = 3;  // a collective outlived dist.timeout_s: the message names the rank it waited for

struct Command {
  CLI::App* app = nullptr;   // where its options live: a subcommand, or the root for train
  std::function<int()> run;  // after a successful parse
};

// train (no subcommand, commands/train.cpp): the root's own options: --config, --resume, --print-config, overrides.
// `print_config` is the root's --print-config, which eval and predict honour too, and take after their name as well.
Command add_train(CLI::App& root, std::shared_ptr<bool> print_config);
Command add_eval(CLI::App& root, std::shared_ptr<bool> print_config);  // commands/eval.cpp
Command add_generate(CLI::App& root);                                          // commands/generate.cpp
Command add_predict(CLI::App& root, std::shared_ptr<bool> print_config);  // commands/predict.cpp
Command add_tokenize(CLI::App& root);                                          // commands/tokenize.cpp
Command add_export_images(CLI::App& root);                                     // commands/export_images.cpp
Command add_export_weights(CLI::App& root);                                    // commands/export_weights.cpp
Command add_plot(CLI::App& root);                                              // commands/plot.cpp
Command add_config_reference(CLI::App& root);                                  // commands/config_reference.cpp

// ---- shared by the commands (commands/common.cpp) ------------------------------------------------------------

// Logs `what` with the rank and ends the process with `code` at once (core/logging.h's exit_with_error).
[[noreturn]] void die(int code, const std::string& what);

// A command of one process that is not part of a job (generate, export-weights, plot): logging for rank 0 of 1,
// then `body`; a ConfigError ends the process with kExitUsage, any other error with kExitError. Started as several
// ranks by a launcher, rank 0 runs `body` (warning that the others do nothing) and the others return 0 at once.
int run_alone(const std::function<void()>& body);

// A command that writes a data set to OUT and trains nothing (export-images, tokenize): run_alone; an OUT that is or
// holds one of `inputs` (named `input_name` in the message: "--input") is refused whatever `force` says
// (data/output_dir.h's check_output_apart; OutputDir checks the rest), and a non-empty OUT unless `force`.
int run_writer(const char* name, const std::string& out, bool force, const std::vector<std::string>& inputs,
               const std::string& input_name, const std::function<void()>& body);

// The options several commands share, defined once so that their help cannot drift apart:
// --checkpoint PATH (required; a checkpoint or a checkpoint directory), --out DIR (required; a data set written
// as OUT.tmp, then renamed) and --force (replace a non-empty OUT).
void add_checkpoint_option(CLI::App& cmd, std::string& path);
void add_out_dir_option(CLI::App& cmd, std::string& out);
void add_force_flag(CLI::App& cmd, bool& force);
// eval's and predict's --print-config: the checkpoint's config with the overrides as TOML, then exit (the root's
// --print-config before the subcommand sets the same flag; after it, it once read as a misspelt config key).
void add_print_config_flag(CLI::App& cmd, bool& print_config);

// Sampling text from a GPT (generate, and predict with a file of prompts), one set of options so that the two
// commands give the same text for the same flags: --tokens, --temperature, the top-k option (`top_k_flag`:
// generate's --top-k, predict's --sample-top-k, its --top-k being the classes per image), the top-p option,
// --repetition-penalty, --no-repeat-ngram-size, --min-new-tokens, --seed (`seed_help`),
// --no-kv-cache and --tokenizer. `prefix` begins each help text (predict's "GPT: ").
struct SamplingArgs {
  std::string tokenizer;  // a directory with vocab.json + merges.txt; empty: the checkpoint's data.dir
  int64_t tokens = 200;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  double repetition_penalty = 1.0;  // transformers' repetition_penalty: 1 off
  int64_t no_repeat_ngram_size = 0;  // transformers' no_repeat_ngram_size: 0 off
  int64_t min_new_tokens = 0;        // transformers' min_new_tokens: 0 off
  uint64_t seed = 42;
  bool no_kv_cache = false;
  bool ignore_eos = false;  // sample past the tokenizer's end-of-text token
};
void add_sampling_options(CLI::App& cmd, SamplingArgs& s, const std::string& top_k_flag, const std::string& top_p_flag,
                          const std::string& prefix, const std::string& seed_help);

// A `--limit`-like option's check: digits only (a size_t option would take "-3" as 2^64 - 3), at most 2^64 - 1.
CLI::Validator whole_number();

}  // namespace dpt::trainer::commands
