// trainer/gpt_checkpoint.h: a trained GPT out of a checkpoint, for `dptrain generate` (text through models::generate,
// models/generate.h: sampling, the KV cache) and `dptrain export-weights` (models/gpt/weights.h's layouts).
// The prompt and the output are token ids of the checkpoint's tokenizer (data/tokenizer.h: the one its data set
// was written with, bytes or GPT-2 BPE).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "models/generate.h"
#include "models/gpt/weights.h"
#include "models/model.h"
#include "trainer/config.h"
#include "trainer/saved_run.h"

namespace dpt::trainer {

// The GPT a checkpoint holds, on `device`, and the tokenizer of its text.
// The special tokens a run's documents were written with: eos, data.eos_token's id when it names one, else the
// tokenizer's eos_id(); bos, for data.dataset = jsonl (whose documents begin with it), the tokenizer's bos_id(). -1
// where there is none. What generation stops at and prompts begin with, and what an export's config.json says.
struct SpecialTokens {
  int32_t eos = -1, bos = -1;
};

struct GptCheckpoint {
  std::unique_ptr<models::Model> model;
  int64_t block_size = 0;                     // the context generation uses: the model's block_size, or a
                                              // Llama's max_position_embeddings where longer
  std::string context_key = "block_size";     // the config key of that context, as messages name it
  int64_t vocab_size = 0;                     // the model's (model.vocab_size)
  std::string from;                           // the checkpoint loaded
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::string tokenizer_from;                 // the directory it was read from
  SpecialTokens special;                      // the run's (run_special_tokens)
};

SpecialTokens run_special_tokens(const Config& cfg, const data::Tokenizer& tokenizer);

// `path` is a checkpoint (step-N/) or a checkpoint directory (its newest valid one); the checkpoint's effective
// config says what to build. The tokenizer: `tokenizer_dir`'s when given (data::open_tokenizer: a tokenizer.json, or
// a folder holding one, or vocab.json and merges.txt), else the one the config's data.dir holds, resolved against the
// current directory (data::load_tokenizer: bytes when it holds none of those files). ConfigError for anything but a
// GPT, a tokenizer whose vocabulary the model's does not cover, a --tokenizer path holding no tokenizer, a data.dir
// missing or without tokenizer files for a model with more ids than bytes (unless its shards are bytes_*: bytes
// then), or no valid checkpoint.
GptCheckpoint load_gpt_checkpoint(const std::string& path, const std::string& tokenizer_dir = "",
                                  Device device = Device::cpu());
// The same for a checkpoint already loaded, with its config as given (overrides applied: its data.dir is read).
GptCheckpoint load_gpt_checkpoint(const SavedRun& target, const std::string& tokenizer_dir = "",
                                  Device device = Device::cpu());

// ConfigError when a token of `prompt` (`what`: "generate: the prompt") is outside the model's vocabulary: byte-level
// tokens for a model of fewer than 256 ids (an ASCII corpus) give a prompt byte from vocab_size up such an id.
void check_prompt(const GptCheckpoint& ck, std::span<const int32_t> prompt, const std::string& what);
// What happens to a text that goes past the model's context (ck.block_size positions: its window of the prompt and
// the new tokens): "when the KV cache is full it starts again from the last N / 2 tokens ...", or the sliding window
// without the cache. Said by `generate` and `predict` when a text will go past it (transformers' generate() of a
// Llama would go on with every token in view).
std::string past_context_note(const GptCheckpoint& ck, bool kv_cache);
// The ids sampling draws among (models::SampleOptions::vocab_limit): the tokenizer's and the model's alike.
int64_t sampled_vocab(const GptCheckpoint& ck);

// `dptrain export-weights`: the model of checkpoint `path` (as load_gpt_checkpoint finds it) written as safetensors
// in `layout` by its family's export_weights (trainer/model_registry.h; a GPT: models::gpt_export_weights, nanoGPT's
// or Hugging Face's names and shapes, the real vocabulary). `out` is a folder (export_is_folder) that receives
// model.safetensors and, when the layout has one, config.json (a GPT in Hugging Face's layout:
// models::gpt_hf_config_json, the folder GPT2LMHeadModel.from_pretrained reads); or a FILE.safetensors, the weights
// alone. ConfigError for a family without layouts out. Each file goes through FILE.tmp renamed into place, so it is whole or absent. Returns a line saying what it
// wrote.
inline constexpr const char* kExportWeightsFile = "model.safetensors";
inline constexpr const char* kHfConfigFile = "config.json";
bool export_is_folder(const std::string& out);  // an existing folder, or a name not ending in .safetensors
// In a folder, weights over `max_shard_bytes` go into shards model-0000I-of-0000N.safetensors with
// model.safetensors.index.json, as save_pretrained writes them (its max_shard_size, 5 GB by default).
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;
std::string export_weights(const std::string& path, const std::string& layout, const std::string& out,
                           uint64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace dpt::trainer
