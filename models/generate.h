// models/generate.h: text from a language model (a GPT, a Llama: a root that is a KvCachedLm): autoregressive sampling with temperature and top-k, seeded, so the same
// seed gives the same tokens. With the KV cache (the default) each new token costs one position's forward: the
// prompt's last block_size tokens go through once, then one token at a time. When the cache is full (block_size
// positions), it starts again from the last block_size / 2 tokens, so a long text keeps at least half a window of
// context. Without the cache each token runs the model over the last block_size tokens (a sliding window); up to
// block_size tokens in all the two compute the same logits but in products of other row counts (1 against the
// window's), which may round their last bits otherwise: the same text, save where a draw lands within that rounding
// of a boundary between two tokens (about 1e-6 of the draws). Loading a checkpoint and its tokenizer for this is the
// trainer's (trainer/gpt_checkpoint.h, `dptrain generate`).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "models/model.h"

namespace dpt::models {

struct SampleOptions {
  double temperature = 1.0;  // > 0; logits are divided by it
  int64_t top_k = 0;         // sample among the k most likely tokens only (0: all)
  double top_p = 1.0;        // then among the fewest most likely whose probabilities reach top_p (nucleus; 1: all)
  int64_t vocab_limit = 0;   // sample among ids below this only (0: all): the tokenizer's vocabulary, when the
                             // model's is larger (padded)
  int32_t stop_token = -1;   // a sequence ends with this token once it samples it (the tokenizer's EOS); -1: none
  double repetition_penalty = 1.0;  // > 0; generate_batch applies it (apply_repetition_penalty) before the above;
                                    // 1: off
  int64_t no_repeat_ngram_size = 0;  // >= 0; generate_batch bans the tokens that would repeat an n-gram of the text
                                     // (ban_repeated_ngrams) before the above; 0: off
  int64_t min_new_tokens = 0;  // >= 0; generate_batch never samples stop_token as one of a sequence's first
                               // min_new_tokens new tokens (transformers' min_new_tokens); 0: off
};

// Hugging Face's RepetitionPenaltyLogitsProcessor: the logit of every id in `seen` (each id once, however often it
// occurs; ids outside [0, vocab) ignored) divided by `penalty` where it is positive (0 stays 0), multiplied by it where
// negative, in float as transformers computes it; a penalty above 1 makes every token already in the text less likely.
// generate_batch applies it to each sequence's logits, its whole text (the prompt included) as `seen`, before
// temperature, top-k and top-p, as transformers' generate(repetition_penalty=...) does.
void apply_repetition_penalty(float* logits, int64_t vocab, std::span<const int32_t> seen, double penalty);

// Hugging Face's NoRepeatNGramLogitsProcessor: the logit of every token that would end an n-gram (n = `ngram`) already
// in `seen` set to -inf: wherever the last n - 1 tokens of `seen` occur in it followed by a token, that token (n = 1:
// every token of `seen`); nothing while `seen` has fewer than n - 1 tokens, or for ngram = 0. generate_batch applies it
// as the repetition penalty (the whole text, before sampling), as generate(no_repeat_ngram_size=...) does; where it
// bans every token, greedy decoding takes id 0, as torch's argmax of all -inf does, and sampling is refused.
void ban_repeated_ngrams(float* logits, int64_t vocab, std::span<const int32_t> seen, int64_t ngram);

// "repetition_penalty P, no_repeat_ngram_size N, min_new_tokens M, " for those of `o` that are on (for the logs); ""
// for none.
std::string penalties_str(const SampleOptions& o);

// One token drawn from softmax(logits / temperature) restricted to the top_k largest logits and every logit equal to
// the k-th (so more than k where they tie, as Hugging Face's TopKLogitsWarper keeps them), in descending order, ties
// by the lower index, then to the nucleus: the most likely of those while the mass of the ones above them is below
// top_p (the token that reaches top_p included; at least one), as its TopPLogitsWarper after the TopKLogitsWarper.
// top_k = 1 is argmax (greedy, as generate(do_sample=False): the lower index on a tie).
int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, std::mt19937_64& rng);

// `count` new tokens after `prompt` (at least one token), from `model` (a GPT or a Llama with this block_size, on any
// device: the logits come back to the host for sampling); fewer when o.stop_token is sampled, which then ends the
// sequence (as Hugging Face's generate() ends at eos_token_id). generate_batch of this one prompt.
std::vector<int32_t> generate(Model& model, int64_t block_size, std::vector<int32_t> prompt, int64_t count,
                              const SampleOptions& o, uint64_t seed, bool kv_cache = true);

// Called after every step of generate_batch with the tokens it added (one per sequence).
using GenerateProgress = std::function<void(int64_t tokens)>;

// `count` new tokens after each of `prompts`, sampled side by side: every step is one forward of [batch, t] (with
// the KV cache: one cache of the batch), sequence i drawing from its own generator seeded with seeds[i]. The prompts'
// windows must be of one length (min(tokens, block_size) equal; checked), so that the sequences move
// in lockstep: the same positions, the same cache restarts; sequence i then follows exactly generate's steps for
// prompts[i] and seeds[i]. Its text is generate's whenever the logits are: a GEMM of more rows may round their
// last bits differently (OpenBLAS does), which changes a token only where a draw lands within that rounding of a
// boundary between two tokens. A sequence that samples o.stop_token ends with it (the batch stops stepping once every
// sequence has); the others go on, their tokens unchanged.
std::vector<std::vector<int32_t>> generate_batch(Model& model, int64_t block_size,
                                                 std::vector<std::vector<int32_t>> prompts, int64_t count,
                                                 const SampleOptions& o, const std::vector<uint64_t>& seeds,
                                                 bool kv_cache = true, const GenerateProgress& progress = {});

}  // namespace dpt::models
