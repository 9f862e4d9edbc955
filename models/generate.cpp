// models/generate.cpp: sampling and autoregressive generation from a language model (see generate.h).
#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "models/kv_cache.h"
#include "models/module.h"

namespace dpt::models {

namespace {

// The ids of the k largest logits, largest first, ties in id order: the first k of a stable sort by descending
// logit, in O(vocab) for k = 1, O(vocab log k) for a smaller k, and otherwise one sort of 64-bit keys (a stable
// sort's indirect comparisons over Llama 3's 128,256 ids took 20 ms a token, most of a small model's step).
std::vector<int32_t> most_likely(const float* logits, int64_t vocab, int64_t k) {
  if (k == 1) {  // greedy: the first of the largest
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    return {static_cast<int32_t>(best)};
  }
  if (k < vocab) {
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (!(logits[b] > logits[a]) && a < b);
    });
    order.resize(static_cast<size_t>(k));
    return order;
  }
  // Every id: keys that sort ascending as (logit descending, id ascending). A float's bits, sign-flipped into an order
  // of unsigned integers, then complemented; -0 taken as +0, as the comparison > takes them.
  std::vector<uint64_t> keys(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = logits[i] == 0.0f ? 0.0f : logits[i];
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // ascending with the float
    keys[static_cast<size_t>(i)] = (static_cast<uint64_t>(~bits) << 32) | static_cast<uint64_t>(i);
  }
  std::sort(keys.begin(), keys.end());
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (size_t i = 0; i < keys.size(); ++i) order[i] = static_cast<int32_t>(keys[i] & 0xffffffffu);
  return order;
}

}  // namespace

void apply_repetition_penalty(float* logits, int64_t vocab, std::span<const int32_t> seen, double penalty) {
  DPT_CHECK(penalty > 0 && std::isfinite(penalty), "repetition_penalty {}: must be > 0", penalty);
  if (penalty == 1) return;
  const auto p = static_cast<float>(penalty);
  std::vector<bool> done(static_cast<size_t>(std::max<int64_t>(vocab, 0)), false);
  for (const int32_t id : seen) {
    if (id < 0 || id >= vocab || done[static_cast<size_t>(id)]) continue;
    done[static_cast<size_t>(id)] = true;
    float& l = logits[id];
    l = l < 0 ? l * p : l / p;
  }
}

void ban_repeated_ngrams(float* logits, int64_t vocab, std::span<const int32_t> seen, int64_t ngram) {
  DPT_CHECK(ngram >= 0, "no_repeat_ngram_size {}: must be >= 0", ngram);
  const auto n = static_cast<size_t>(ngram);
  if (n == 0 || seen.size() + 1 < n) return;
  const std::span<const int32_t> prefix = seen.last(n - 1);  // what the next token would follow
  for (size_t j = 0; j + n <= seen.size(); ++j)
    if (std::equal(prefix.begin(), prefix.end(), seen.begin() + static_cast<std::ptrdiff_t>(j))) {
      const int32_t id = seen[j + n - 1];
      if (id >= 0 && id < vocab) logits[id] = -INFINITY;
    }
}

std::string penalties_str(const SampleOptions& o) {
  std::string s;
  if (o.repetition_penalty != 1) s += fmt::format("repetition_penalty {}, ", o.repetition_penalty);
  if (o.no_repeat_ngram_size != 0) s += fmt::format("no_repeat_ngram_size {}, ", o.no_repeat_ngram_size);
  if (o.min_new_tokens != 0) s += fmt::format("min_new_tokens {}, ", o.min_new_tokens);
  return s;
}

int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, std::mt19937_64& rng) {
  if (o.vocab_limit > 0) vocab = std::min(vocab, o.vocab_limit);
  DPT_CHECK(vocab > 0 && o.temperature > 0 && o.top_k >= 0 && o.top_p > 0 && o.top_p <= 1,
            "sampling: vocab {}, temperature {}, top_k {}, top_p {}", vocab, o.temperature, o.top_k, o.top_p);
  int64_t k = o.top_k == 0 ? vocab : std::min(o.top_k, vocab);
  std::vector<int32_t> order = most_likely(logits, vocab, k);
  if (k == 1) return order[0];
  if (k < vocab) {  // every token tied with the k-th stays, as TopKLogitsWarper removes only those below it
    const float kth = logits[order.back()];
    const auto tied = std::count_if(logits, logits + vocab, [&](float l) { return l >= kth; });
    if (tied > k) order = most_likely(logits, vocab, k = tied);
  }
  std::vector<double> p(order.size());
  const double top = logits[order[0]];
  // All -inf (no_repeat_ngram_size banned every token), or a model's inf or NaN: no distribution to draw from, where
  // the draw below would return the last token in silence (torch.multinomial refuses such probabilities too).
  if (top == -INFINITY && o.no_repeat_ngram_size > 0)
    DPT_THROW(ConfigError, "sampling: every token is banned (no_repeat_ngram_size {}: every n-gram it could end is "
              "in the text already): nothing to draw from; a larger no_repeat_ngram_size, or fewer tokens",
              o.no_repeat_ngram_size);
  if (!std::isfinite(top))
    DPT_THROW(Error, "sampling: the model's largest logit is {}: no distribution to draw from", top);
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  if (o.top_p < 1) {  // the nucleus: a token stays while the mass above it is below top_p
    double above = 0;
    size_t kept = 0;
    while (kept < p.size() && (kept == 0 || above < o.top_p * sum)) above += p[kept++];
    p.resize(kept);
    order.resize(kept);
    sum = above;
  }
  double u = uniform(rng, 0.0f, 1.0f) * sum;
  for (size_t i = 0; i < order.size(); ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order.back();  // u landed on the rounding at the very end
}

namespace {

// The token sampled from one sequence's row of logits, after the repetition penalty and the n-gram ban over its text
// where they are on, and with the stop token banned while fewer than min_new_tokens (`made`) are new (on a copy in
// `scratch`: the row is the model's output).
int32_t next_token(const float* row, int64_t vocab, std::span<const int32_t> text, int64_t made,
                   const SampleOptions& o, std::mt19937_64& rng, std::vector<float>& scratch) {
  const bool early = o.stop_token >= 0 && o.stop_token < vocab && made < o.min_new_tokens;
  if (o.repetition_penalty != 1 || o.no_repeat_ngram_size != 0 || early) {
    scratch.assign(row, row + vocab);
    apply_repetition_penalty(scratch.data(), vocab, text, o.repetition_penalty);
    ban_repeated_ngrams(scratch.data(), vocab, text, o.no_repeat_ngram_size);
    if (early) scratch[static_cast<size_t>(o.stop_token)] = -INFINITY;  // MinNewTokensLengthLogitsProcessor's
    row = scratch.data();
  }
  return sample_token(row, vocab, o, rng);
}

}  // namespace

std::vector<int32_t> generate(Model& model, int64_t block_size, std::vector<int32_t> prompt, int64_t count,
                              const SampleOptions& o, uint64_t seed, bool kv_cache) {
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(std::move(prompt));
  return std::move(generate_batch(model, block_size, std::move(prompts), count, o, {seed}, kv_cache).front());
}

std::vector<std::vector<int32_t>> generate_batch(Model& model, int64_t block_size,
                                                 std::vector<std::vector<int32_t>> prompts, int64_t count,
                                                 const SampleOptions& o, const std::vector<uint64_t>& seeds,
                                                 bool kv_cache, const GenerateProgress& progress) {
  const size_t batch = prompts.size();
  DPT_CHECK(batch >= 1 && seeds.size() == batch && count >= 0 && block_size >= 1 && o.min_new_tokens >= 0,
            "generate: {} prompts, {} seeds, {} new tokens, block_size {}, min_new_tokens {}", batch, seeds.size(),
            count, block_size, o.min_new_tokens);
  const auto bs = static_cast<size_t>(block_size);
  // Every sequence's window min(size, block_size) is the same: the min of it with any cut at most block_size is
  // then the same too, so sequence 0's sizes stand for all.
  for (const auto& p : prompts)
    DPT_CHECK(!p.empty() && std::min(p.size(), bs) == std::min(prompts[0].size(), bs),
              "generate: prompts of {} and {} tokens in one batch (block_size {}): their windows differ", p.size(),
              prompts[0].size(), block_size);
  std::vector<std::mt19937_64> rngs(seeds.begin(), seeds.end());
  model.set_training(false);
  auto* gpt = dynamic_cast<KvCachedLm*>(&model.root());
  DPT_CHECK(gpt, "generate needs a language model with a KV cache (a GPT, a Llama), not {}", model.summary());
  const auto rows = static_cast<int64_t>(batch);
  // Feeds the last t tokens of every sequence ([batch, t]) and appends to each the token sampled from the logits
  // of its last position: row (i + 1) t - 1 of [batch t, vocab].
  Tensor x, last;
  std::vector<float> scratch;
  std::vector<size_t> starts;  // each prompt's length: where its new tokens start
  for (const auto& p : prompts) starts.push_back(p.size());
  const auto draw = [&](const float* row, int64_t vocab, size_t i) {
    const auto made = static_cast<int64_t>(prompts[i].size() - starts[i]);
    return next_token(row, vocab, prompts[i], made, o, rngs[i], scratch);
  };
  auto step = [&](size_t t) {
    const auto tt = static_cast<int64_t>(t);
    x = Tensor::empty({rows, tt}, DType::I32);
    for (size_t i = 0; i < batch; ++i)
      std::copy(prompts[i].end() - static_cast<std::ptrdiff_t>(t), prompts[i].end(), x.data<int32_t>() + i * t);
    const Tensor& logits = model.forward(x.to(model.device()));
    const int64_t vocab = logits.dim(1);
    if (t == 1) {  // every row is a last one: one copy
      last = logits.to(Device::cpu());  // waits for the stream
      for (size_t i = 0; i < batch; ++i)
        prompts[i].push_back(draw(last.data<float>() + static_cast<int64_t>(i) * vocab, vocab, i));
      return;
    }
    for (size_t i = 0; i < batch; ++i) {
      const auto row = static_cast<int64_t>(i + 1) * tt - 1;
      last = logits.view(static_cast<size_t>(row * vocab), {vocab}).to(Device::cpu());
      prompts[i].push_back(draw(last.data<float>(), vocab, i));
    }
  };
  // The cache holds what the text will reach, the window and the new tokens, up to block_size (a long-context model's
  // short text keeps a small cache); it restarts at block_size only, which a smaller one never reaches.
  const size_t window = std::min(prompts[0].size(), bs);
  const auto positions = static_cast<int64_t>(std::min(bs, window + static_cast<size_t>(count)));
  if (kv_cache) gpt->begin_kv_cache(rows, model.device(), positions);
  size_t unfed = 0;  // tokens at the end of every sequence not in the cache yet (while it holds some)
  // A sequence that sampled the stop token steps on with the others (they share the windows and the cache); what it
  // samples after it is cut off below.
  std::vector<bool> stopped(batch, false);
  size_t running = batch;
  try {
    for (int64_t n = 0; n < count && running > 0; ++n) {
      const size_t end = prompts[0].size();
      size_t t = std::min(end, bs);  // the sliding window
      if (kv_cache && gpt->kv_cache_len() > 0) {
        if (static_cast<size_t>(gpt->kv_cache_len()) + unfed > bs) {
          gpt->begin_kv_cache(rows, model.device(), positions);  // full: again from the last half window
          t = std::min(end, static_cast<size_t>(std::max<int64_t>(block_size / 2, 1)));
        } else {
          t = unfed;
        }
      }
      step(t);
      unfed = 1;
      if (progress) progress(rows);
      if (o.stop_token >= 0)
        for (size_t i = 0; i < batch; ++i)
          if (!stopped[i] && prompts[i].back() == o.stop_token) {
            stopped[i] = true;
            --running;
          }
    }
  } catch (...) {
    if (kv_cache) gpt->end_kv_cache();
    throw;
  }
  if (kv_cache) gpt->end_kv_cache();
  if (o.stop_token >= 0)
    for (size_t i = 0; i < batch; ++i) {
      const auto from = prompts[i].begin() + static_cast<std::ptrdiff_t>(starts[i]);
      const auto stop = std::find(from, prompts[i].end(), o.stop_token);
      if (stop != prompts[i].end()) prompts[i].erase(stop + 1, prompts[i].end());
    }
  return prompts;
}

}  // namespace dpt::models
