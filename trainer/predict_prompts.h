// trainer/predict_prompts.h: `dptrain predict` over a GPT's prompts: batches of one window length formed over all
// the prompts and dealt to the ranks in turn (why: trainer/predict.h), a line per prompt in input order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "models/generate.h"
#include "trainer/predict.h"
#include "trainer/saved_run.h"

namespace dpt::trainer {

// The batches prompts are generated in (models::generate_batch): prompts whose windows min(tokens, block_size) are
// of one length, in input order, cut into chunks of at most batch_size; the batches ordered by their first prompt.
// Every prompt is in exactly one batch. They depend on the prompts alone, not on the ranks: batch j is rank
// j mod world's (as image_batches), so every batch has the same rows whatever the rank count, and so the same logits.
std::vector<std::vector<size_t>> prompt_batches(const std::vector<size_t>& token_counts, int64_t block_size,
                                                int64_t batch_size);

// A prompts file's prompts, in order. A *.jsonl file: each record's "prompt" (data::parse_jsonl_prompt: the
// fine-tuning records' format, so a prompt may span lines, "Q: ...\nA:"; a "completion" beside it ignored; blank lines
// skipped; a malformed line a ConfigError naming FILE:LINE). Any other file: one prompt a line (a trailing '\r'
// removed), lines empty or of white space alone skipped. `skipped` counts the blank lines either way (a prompt of
// white space alone needs a .jsonl file). ConfigError when `path` is missing or a directory, IoError when it cannot be
// read.
struct PromptFile {
  std::vector<std::string> prompts;
  size_t skipped = 0;
  bool jsonl = false;
};
PromptFile read_prompts(const std::string& path);

struct PromptOptions {
  std::string input, out;     // the prompts file (read_prompts), in input order
  std::string tokenizer;      // as `dptrain generate --tokenizer` (empty: the checkpoint's data.dir)
  int64_t tokens = 200;       // new tokens per prompt
  models::SampleOptions sampling;  // temperature, top_k (vocab_limit: the tokenizer's, set here)
  bool stop_at_eos = true;    // a text ends at the tokenizer's end-of-text token, left out of it (generate's default)
  uint64_t seed = 42;         // every prompt: the text `dptrain generate --seed` gives for it
  bool kv_cache = true;
  int64_t batch_size = 64;    // prompts generated side by side (prompt_batches)
  PredictFormat format = PredictFormat::jsonl;
  double progress_interval_s = 10.0;  // rank 0's progress line (train.progress_interval_s), in generated tokens/s
  // The arithmetic of the products (models::Model::set_precision); none: float32, as `dptrain generate` computes.
  std::optional<models::Precision> precision;
};

// Completes every prompt of o.input with the GPT of `target` (its config's overrides applied: data.dir, ...) on every
// rank of `pg`, in the batches of
// prompt_batches (rank r: batches r, r + world, ...), each sequence sampled from its own generator seeded with
// o.seed; rank 0 writes one line per prompt in input order: jsonl {"prompt": P, "text": T} (T: what
// `dptrain generate --prompt P` prints: the prompt and what follows it; see models::generate_batch for the
// rounding of a batch's logits), or csv prompt,text. Collective.
PredictSummary predict_prompts(const SavedRun& target, const PromptOptions& o, comm::ProcessGroup& pg,
                               Device device);

}  // namespace dpt::trainer
