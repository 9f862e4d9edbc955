// trainer/commands/generate.cpp: `dptrain generate`: text from a GPT or Llama checkpoint, on the GPU if there is one, to
// stdout (the prompt, then what follows it); the log goes to stderr.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <span>

#include "core/check.h"
#include "core/cuda.h"
#include "trainer/commands/commands.h"
#include "trainer/gpt_checkpoint.h"
#include "trainer/predict.h"
#include "trainer/trainer.h"

namespace dpt::trainer::commands {
namespace {

struct GenerateArgs {
  std::string checkpoint, prompt = "\n";
  SamplingArgs sampling;
  std::string device = "auto";
};

void generate_text(const GenerateArgs& args) {
  const SamplingArgs& a = args.sampling;
  const std::optional<DeviceChoice> requested = parse_choice<DeviceChoice>(args.device);
  DPT_CHECK(requested.has_value(), "--device {}", args.device);  // CLI11 let only the choice's words through
  // Before the checkpoint loads (a large model takes a while): an empty prompt has nowhere to start.
  if (args.prompt.empty()) DPT_THROW(ConfigError, "generate: --prompt must not be empty (it is where the text starts)");
  const Device device = choose_device(*requested, 0, cuda::device_count(), cuda::unavailable_reason(), "--device");
  if (device.is_cuda()) cuda::set_device(device.index);
  const GptCheckpoint ck = load_gpt_checkpoint(args.checkpoint, a.tokenizer, device);
  const data::Tokenizer& tokenizer = *ck.tokenizer;
  const models::SampleOptions sampling{.temperature = a.temperature, .top_k = a.top_k, .top_p = a.top_p,
                                       .vocab_limit = sampled_vocab(ck),
                                       .stop_token = a.ignore_eos ? -1 : ck.special.eos,
                                       .repetition_penalty = a.repetition_penalty,
                                       .no_repeat_ngram_size = a.no_repeat_ngram_size,
                                       .min_new_tokens = a.min_new_tokens};
  spdlog::info("generate: {} from {} on {}; {} tokens, temperature {}, top_k {}, top_p {}, {}seed {}{}",
               ck.model->summary(), ck.from, device.str(), a.tokens, a.temperature, a.top_k, a.top_p,
               models::penalties_str(sampling), a.seed, a.no_kv_cache ? ", no KV cache" : "");
  spdlog::info("generate: tokenizer {} from {}", tokenizer.describe(), ck.tokenizer_from);
  if (a.min_new_tokens > 0 && sampling.stop_token < 0)
    spdlog::warn("generate: --min-new-tokens {} does nothing: {}", a.min_new_tokens,
                 a.ignore_eos ? "--ignore-eos samples past the end-of-text token anyway"
                              : "the tokenizer has no end-of-text token to keep out (bytes)");
  if (tokenizer.name() == "bytes" && ck.vocab_size > 256) {  // byte shards (load_gpt_checkpoint refuses others)
    spdlog::info("generate: byte-level tokens for a model of vocab_size {} (its data.dir's shards are bytes_*): ids "
                 "from 256 up are never sampled", ck.vocab_size);
  } else if (tokenizer.name() == "bytes" && ck.vocab_size < 256) {
    spdlog::info("generate: byte-level tokens for a model of vocab_size {}: bytes from {} up are never sampled, and "
                 "refused in the prompt", ck.vocab_size, ck.vocab_size);
  }
  std::vector<int32_t> prompt = tokenizer.encode(args.prompt);
  if (const uint64_t dropped = tokenizer.dropped_bytes(); dropped > 0)
    spdlog::warn("generate: left out {} byte{} of the prompt that the vocabulary has no token for, as Hugging Face "
                 "tokenizers leaves them out", dropped, dropped == 1 ? "" : "s");
  if (ck.special.bos >= 0) prompt.insert(prompt.begin(), ck.special.bos);  // the run's documents began with it (jsonl)
  check_prompt(ck, prompt, "generate: the prompt");
  if (std::ssize(prompt) > ck.block_size)
    spdlog::warn("generate: the prompt is {} tokens, more than the model's context ({} {}): the text continues "
                 "from its last {} tokens, and the model never sees the first {}", prompt.size(), ck.context_key,
                 ck.block_size, ck.block_size, std::ssize(prompt) - ck.block_size);
  // The last token sampled is never fed: the window and all but one new token are the positions the model runs over.
  if (const int64_t positions = std::min<int64_t>(std::ssize(prompt), ck.block_size) + a.tokens - 1;
      positions > ck.block_size)
    spdlog::info("generate: {} tokens after a window of {} run over {} positions: {}", a.tokens,
                 std::min<int64_t>(std::ssize(prompt), ck.block_size), positions,
                 past_context_note(ck, !a.no_kv_cache));
  auto out = models::generate(*ck.model, ck.block_size, prompt, a.tokens, sampling, a.seed,
                              /*kv_cache=*/!a.no_kv_cache);
  if (const int32_t eos = sampling.stop_token; eos >= 0 && out.size() > prompt.size() && out.back() == eos) {
    spdlog::info("generate: the end-of-text token (id {}) after {} new tokens: the text ends there (--ignore-eos goes on)",
                 eos, out.size() - prompt.size());
    out.pop_back();
  }
  // Bytes that are no UTF-8 (a character cut by --tokens, a byte model's stray byte) as U+FFFD, as predict writes them
  // and transformers' decode() gives them: the text is valid UTF-8.
  const std::string text = valid_utf8(tokenizer.decode(std::span(out).subspan(ck.special.bos >= 0 ? 1 : 0)));
  // A text that does not reach stdout (a full disk, a closed stdout) fails the command rather than exit 0 without it.
  errno = 0;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    DPT_THROW(IoError, "generate: writing the text to stdout failed: {}",
              errno != 0 ? std::strerror(errno) : "an error on the stream");
}

}  // namespace

Command add_generate(CLI::App& root) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = root.add_subcommand(
      "generate", "sample text from a GPT or Llama checkpoint (on the GPU when there is one) and print it; trains nothing. The "
                  "prompt is encoded and the output decoded with the tokenizer of the checkpoint's data set (a "
                  "tokenizer.json's BPE, or GPT-2 BPE when data.dir holds vocab.json and merges.txt, else bytes), or "
                  "--tokenizer's");
  cmd->footer("Example: dptrain generate --checkpoint runs/gpt_tiny/checkpoints --prompt \"Q: \" --tokens 300");
  add_checkpoint_option(*cmd, a->checkpoint);
  cmd->add_option("--prompt", a->prompt, "the text to continue; not empty (the default is one newline)")
      ->default_str("\"\\n\"");
  cmd->add_option("--device", a->device, "auto (cuda if available, else cpu) | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  add_sampling_options(*cmd, a->sampling, "--top-k", "--top-p", "", "the same seed gives the same text");
  return {cmd, [a] {
            spdlog::set_default_logger(spdlog::stderr_color_mt("generate"));  // stdout carries the text alone
            return run_alone([&] { generate_text(*a); });
          }};
}

}  // namespace dpt::trainer::commands
