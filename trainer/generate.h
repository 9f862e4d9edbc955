// trainer/generate.h: text from a trained GPT (`dptrain generate`): autoregressive sampling with temperature
// and top-k, seeded, so the same seed gives the same text. The prompt and the output are byte-level tokens
// (the `dptrain tokenize` vocabulary). No KV cache yet: each new token runs the model over the last
// block_size tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/model.h"

namespace dpt::trainer {

struct SampleOptions {
  double temperature = 1.0;  // > 0; logits are divided by it
  int64_t top_k = 0;         // sample among the k most likely tokens only (0: all)
};

// One token drawn from softmax(logits / temperature) restricted to the top_k largest logits (ties broken by
// the lower index). top_k = 1 is argmax.
int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, std::mt19937_64& rng);

// `count` new tokens after `prompt` (at least one token), from `model` (a GPT with this block_size).
std::vector<int32_t> generate(models::Model& model, int64_t block_size, std::vector<int32_t> prompt, int64_t count,
                              const SampleOptions& o, uint64_t seed);

// The GPT a checkpoint holds, on the CPU: `path` is a checkpoint (step-N/) or a checkpoint directory (its
// newest valid one); the checkpoint's effective config says what to build. Sets *block_size and *from (the
// checkpoint loaded). ConfigError for anything but a byte-level GPT, or no valid checkpoint.
std::unique_ptr<models::Model> load_gpt_checkpoint(const std::string& path, int64_t* block_size, std::string* from);

}  // namespace dpt::trainer
