// trainer/generate.h: text from a trained GPT (`dptrain generate`): autoregressive sampling with temperature
// and top-k, seeded, so the same seed gives the same text. The prompt and the output are token ids of the
// checkpoint's tokenizer (data/tokenizer.h: the one its data set was written with, bytes or GPT-2 BPE).
// With the KV cache (the default) each new token costs one position's forward: the prompt's last block_size
// tokens go through once, then one token at a time. When the cache is full (block_size positions), it starts
// again from the last block_size / 2 tokens, so a long text keeps at least half a window of context. Without
// the cache each token runs the model over the last block_size tokens (a sliding window); up to block_size
// tokens in all the two give the same text.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "models/model.h"
#include "trainer/build_model.h"

namespace dpt::trainer {

struct SampleOptions {
  double temperature = 1.0;  // > 0; logits are divided by it
  int64_t top_k = 0;         // sample among the k most likely tokens only (0: all)
  int64_t vocab_limit = 0;   // sample among ids below this only (0: all): the tokenizer's vocabulary, when the
                             // model's is larger (padded)
};

// One token drawn from softmax(logits / temperature) restricted to the top_k largest logits (ties broken by
// the lower index). top_k = 1 is argmax.
int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, std::mt19937_64& rng);

// `count` new tokens after `prompt` (at least one token), from `model` (a GPT with this block_size, on any
// device: the logits come back to the host for sampling).
std::vector<int32_t> generate(models::Model& model, int64_t block_size, std::vector<int32_t> prompt, int64_t count,
                              const SampleOptions& o, uint64_t seed, bool kv_cache = true);

// The GPT a checkpoint holds, on `device`, and the tokenizer of its text.
struct GptCheckpoint {
  std::unique_ptr<models::Model> model;
  int64_t block_size = 0;
  int64_t vocab_size = 0;                     // the model's (model.vocab_size)
  std::string from;                           // the checkpoint loaded
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::string tokenizer_from;                 // the directory it was read from
};

// `path` is a checkpoint (step-N/) or a checkpoint directory (its newest valid one); the checkpoint's effective
// config says what to build. The tokenizer: GPT-2 BPE from `tokenizer_dir`'s vocab.json and merges.txt when
// given, else the one the config's data.dir holds (data::load_tokenizer: bytes when it holds neither file).
// ConfigError for anything but a GPT, a tokenizer whose vocabulary the model's does not cover, or no valid
// checkpoint.
GptCheckpoint load_gpt_checkpoint(const std::string& path, const std::string& tokenizer_dir = "",
                                  Device device = Device::cpu());

// `dptrain export-weights`: the GPT of checkpoint `path` (as load_gpt_checkpoint finds it) written to `out` as
// safetensors in `layout` (gpt_export_weights: nanoGPT's or Hugging Face's names and shapes, the real vocabulary),
// through out.tmp renamed into place, so `out` is whole or absent. Returns a line saying what it wrote.
std::string export_gpt_weights(const std::string& path, GptLayout layout, const std::string& out);

}  // namespace dpt::trainer
