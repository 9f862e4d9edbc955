// trainer/predict_prompts.cpp: `dptrain predict` over a GPT's prompts (trainer/predict_prompts.h).
#include "trainer/predict_prompts.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/check.h"
#include "data/jsonl.h"
#include "trainer/choice.h"
#include "trainer/config_check.h"
#include "trainer/gpt_checkpoint.h"

namespace dpt::trainer {

std::vector<std::vector<size_t>> prompt_batches(const std::vector<size_t>& token_counts, int64_t block_size,
                                                int64_t batch_size) {
  DPT_CHECK(block_size >= 1 && batch_size >= 1, "prompt batches: block_size {}, batch_size {}", block_size, batch_size);
  std::vector<std::vector<size_t>> batches;
  std::map<size_t, size_t> open;  // window length -> its batch being filled
  for (size_t i = 0; i < token_counts.size(); ++i) {
    const size_t window = std::min(token_counts[i], static_cast<size_t>(block_size));
    auto it = open.find(window);
    if (it == open.end() || batches[it->second].size() == static_cast<size_t>(batch_size)) {
      open[window] = batches.size();
      batches.emplace_back();
    }
    batches[open[window]].push_back(i);
  }
  return batches;
}

PromptFile read_prompts(const std::string& path) {
  std::error_code ec;  // a wrong --input is the command line's fault (exit 2), as for images
  if (!std::filesystem::exists(path, ec)) DPT_THROW(ConfigError, "predict: --input {} not found", path);
  if (std::filesystem::is_directory(path, ec))
    DPT_THROW(ConfigError, "predict: --input {} is a directory: a GPT's or Llama's prompts are a file (one a line, or "
              "a .jsonl of {{\"prompt\": ...}} records)", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) DPT_THROW(IoError, "{}: cannot open: {}", path, std::strerror(errno));
  PromptFile f;
  f.jsonl = std::filesystem::path(path).extension() == ".jsonl";
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (f.jsonl) {
      std::optional<std::string> prompt;
      try {
        prompt = data::parse_jsonl_prompt(line);
      } catch (const ConfigError& e) {
        DPT_THROW(ConfigError, "predict: {}:{}: {}", path, line_no, e.what());
      }
      if (prompt)
        f.prompts.push_back(std::move(*prompt));
      else
        ++f.skipped;
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t\r\v\f") == std::string::npos)
      ++f.skipped;
    else
      f.prompts.push_back(std::move(line));
  }
  if (in.bad()) DPT_THROW(IoError, "{}: read failed: {}", path, std::strerror(errno));
  return f;
}

PredictSummary predict_prompts(const SavedRun& target, const PromptOptions& o, comm::ProcessGroup& pg,
                               Device device) {
  const auto start = std::chrono::steady_clock::now();
  const GptCheckpoint ck = load_gpt_checkpoint(target, o.tokenizer, device);
  if (o.precision) ck.model->set_precision(*o.precision);
  const data::Tokenizer& tokenizer = *ck.tokenizer;
  const PromptFile file = read_prompts(o.input);
  const std::vector<std::string>& prompts = file.prompts;
  if (prompts.empty())
    DPT_THROW(ConfigError, "predict: no prompts ({}) in {}",
              file.jsonl ? "records with a \"prompt\"" : "non-blank lines", o.input);
  check_same_inputs(prompts, "prompts", "--input " + o.input, pg);
  if (file.skipped > 0 && pg.rank() == 0)
    spdlog::info("predict: skipped {} blank line{} of {}{}", file.skipped, file.skipped == 1 ? "" : "s", o.input,
                 file.jsonl ? "" : " (white space alone is no prompt there; a .jsonl prompts file, {\"prompt\": ...} "
                                   "a line, carries any prompt)");
  // Every rank encodes every prompt: the batches depend on all the token counts.
  std::vector<std::vector<int32_t>> encoded;
  std::vector<size_t> counts;
  for (const std::string& p : prompts) {
    encoded.push_back(tokenizer.encode(p));
    if (ck.special.bos >= 0) encoded.back().insert(encoded.back().begin(), ck.special.bos);  // as the run's documents began (jsonl)
    check_prompt(ck, encoded.back(), fmt::format("predict: the prompt '{}'", p));
    counts.push_back(encoded.back().size());
  }
  if (const uint64_t dropped = tokenizer.dropped_bytes(); dropped > 0 && pg.rank() == 0)
    spdlog::warn("predict: left out {} byte{} of the prompts that the vocabulary has no token for, as Hugging Face "
                 "tokenizers leaves them out", dropped, dropped == 1 ? "" : "s");
  const auto longer = static_cast<size_t>(std::count_if(
      counts.begin(), counts.end(), [&](size_t n) { return static_cast<int64_t>(n) > ck.block_size; }));
  if (longer > 0 && pg.rank() == 0)
    spdlog::warn("predict: {} of the {} prompts are more tokens than the model's context ({} {}): their texts "
                 "continue from their last {} tokens, and the model never sees the ones before", longer,
                 prompts.size(), ck.context_key, ck.block_size, ck.block_size);
  // The positions a text runs over: its window and all but its last new token (generate's).
  const auto past = static_cast<size_t>(std::count_if(counts.begin(), counts.end(), [&](size_t n) {
    return std::min<int64_t>(static_cast<int64_t>(n), ck.block_size) + o.tokens - 1 > ck.block_size;
  }));
  if (past > 0 && pg.rank() == 0)
    spdlog::info("predict: {} of the {} prompts with {} new tokens each run over more positions than the context: {}",
                 past, prompts.size(), o.tokens, past_context_note(ck, o.kv_cache));
  const std::vector<std::vector<size_t>> batches = prompt_batches(counts, ck.block_size, o.batch_size);
  const auto world = static_cast<size_t>(pg.size()), rank = static_cast<size_t>(pg.rank());
  size_t my_prompts = 0;
  for (size_t j = rank; j < batches.size(); j += world) my_prompts += batches[j].size();
  models::SampleOptions sampling = o.sampling;
  sampling.vocab_limit = sampled_vocab(ck);
  if (o.stop_at_eos) sampling.stop_token = ck.special.eos;
  if (sampling.min_new_tokens > 0 && sampling.stop_token < 0 && pg.rank() == 0)
    spdlog::warn("predict: --min-new-tokens {} does nothing: {}", sampling.min_new_tokens,
                 o.stop_at_eos ? "the tokenizer has no end-of-text token to keep out (bytes; data.eos_token names one)"
                               : "--ignore-eos samples past the end-of-text token anyway");
  const auto new_tokens = static_cast<size_t>(o.tokens);
  if (rank == 0)
    spdlog::info("predict: {} prompts in {} on {} rank(s), {} batches of up to {} (prompts of one length in the "
                 "window together); {} from {} on {}, {} products{}; {} tokens each, temperature {}, top_k {}, "
                 "top_p {}, {}seed {}{}; tokenizer {}",
                 prompts.size(), o.input, world, batches.size(), o.batch_size, ck.model->summary(), ck.from,
                 device.str(), o.precision ? choice_name(*o.precision) : "fp32",
                 o.precision ? " (as asked)" : " (generate's; --precision sets them)", o.tokens,
                 sampling.temperature, sampling.top_k, sampling.top_p,
                 models::penalties_str(sampling), o.seed,
                 o.kv_cache ? "" : ", no KV cache",
                 tokenizer.describe());
  std::vector<std::pair<size_t, std::string>> mine;
  size_t generated = 0;  // the new tokens of this rank's texts (an EOS that ended one included)
  ProgressLine progress(rank == 0, prompts.size() * new_tokens, pg.size(), o.progress_interval_s, "tokens");
  size_t done = 0;  // tokens generated here
  const auto count_tokens = [&](int64_t n) {
    done += static_cast<size_t>(n);
    progress.update(done, my_prompts * new_tokens);
  };
  for (size_t j = rank; j < batches.size(); j += world) {
    std::vector<std::vector<int32_t>> batch;
    for (size_t i : batches[j]) batch.push_back(encoded[i]);
    const std::vector<std::vector<int32_t>> out =
        models::generate_batch(*ck.model, ck.block_size, std::move(batch), o.tokens, sampling,
                               std::vector<uint64_t>(batches[j].size(), o.seed), o.kv_cache, count_tokens);
    for (size_t r = 0; r < out.size(); ++r) {
      const std::string& prompt = prompts[batches[j][r]];
      const bool eos = sampling.stop_token >= 0 && out[r].size() > encoded[batches[j][r]].size() &&
                       out[r].back() == sampling.stop_token;
      generated += out[r].size() - encoded[batches[j][r]].size();
      const size_t from = ck.special.bos >= 0 ? 1 : 0;
      const std::string text = tokenizer.decode(std::span(out[r]).subspan(from, out[r].size() - from - (eos ? 1 : 0)));
      mine.emplace_back(batches[j][r], o.format == PredictFormat::jsonl
                                           ? "{\"prompt\": " + json_string(prompt) + ", \"text\": " + json_string(text) + "}\n"
                                           : csv_field(prompt) + "," + csv_field(text) + "\n");
    }
  }
  const std::string text = gather_in_order(mine, prompts.size(), pg);
  if (rank == 0) write_file_atomically(o.out, (o.format == PredictFormat::csv ? "prompt,text\n" : "") + text);
  // The tokens generated, over the ranks: fewer than --tokens a prompt where texts ended at the EOS.
  const std::string per_rank = gather_text(fmt::format("{}\n", generated), pg);
  size_t total = 0;
  for (size_t at = 0; at < per_rank.size(); at = per_rank.find('\n', at) + 1) total += std::stoull(per_rank.substr(at));
  return {prompts.size(), 0, seconds_since(start), ck.model->summary(), total};
}

}  // namespace dpt::trainer
