// models/gpt/generate.cpp: sampling and autoregressive generation from a GPT (see generate.h).
#include "models/gpt/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "models/gpt/gpt.h"
#include "models/module.h"

namespace dpt::models {

int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, std::mt19937_64& rng) {
  if (o.vocab_limit > 0) vocab = std::min(vocab, o.vocab_limit);
  DPT_CHECK(vocab > 0 && o.temperature > 0 && o.top_k >= 0, "sampling: vocab {}, temperature {}, top_k {}", vocab,
            o.temperature, o.top_k);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = o.top_k == 0 ? vocab : std::min(o.top_k, vocab);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  order.resize(static_cast<size_t>(k));
  if (k == 1) return order[0];
  std::vector<double> p(order.size());
  const double top = logits[order[0]];
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  double u = uniform(rng, 0.0f, 1.0f) * sum;
  for (size_t i = 0; i < order.size(); ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order.back();  // u landed on the rounding at the very end
}

std::vector<int32_t> generate(Model& model, int64_t block_size, std::vector<int32_t> prompt, int64_t count,
                              const SampleOptions& o, uint64_t seed, bool kv_cache) {
  DPT_CHECK(!prompt.empty() && count >= 0, "generate: {} prompt tokens, {} new", prompt.size(), count);
  std::mt19937_64 rng(seed);
  model.set_training(false);
  auto* gpt = dynamic_cast<Gpt*>(&model.root());
  DPT_CHECK(gpt, "generate needs a GPT, not {}", model.summary());
  std::vector<int32_t> tokens = std::move(prompt);
  // The model's next-token logits after feeding tokens[first, end): the last row of [end - first, vocab].
  Tensor x, last;
  auto next_token = [&](size_t first, size_t end) {
    const auto t = static_cast<int64_t>(end - first);
    x = Tensor::empty({1, t}, DType::I32);
    std::copy(tokens.begin() + static_cast<std::ptrdiff_t>(first), tokens.begin() + static_cast<std::ptrdiff_t>(end),
              x.data<int32_t>());
    const Tensor& logits = model.forward(x.to(model.device()));
    const int64_t vocab = logits.dim(1);
    last = logits.view(static_cast<size_t>((t - 1) * vocab), {vocab}).to(Device::cpu());  // waits for the stream
    return sample_token(last.data<float>(), vocab, o, rng);
  };
  if (kv_cache) gpt->begin_kv_cache(1, model.device());
  size_t fed = 0;  // tokens[0, fed) are in the cache
  try {
    for (int64_t n = 0; n < count; ++n) {
      const size_t end = tokens.size();
      size_t first = end - std::min<size_t>(end, static_cast<size_t>(block_size));
      if (kv_cache) {
        if (gpt->kv_cache_len() > 0 && gpt->kv_cache_len() + static_cast<int64_t>(end - fed) > block_size) {
          gpt->begin_kv_cache(1, model.device());  // full: again from the last half window
          first = end - std::min<size_t>(end, static_cast<size_t>(std::max<int64_t>(block_size / 2, 1)));
        } else if (gpt->kv_cache_len() > 0) {
          first = fed;
        }
        fed = end;
      }
      tokens.push_back(next_token(first, end));
    }
  } catch (...) {
    if (kv_cache) gpt->end_kv_cache();
    throw;
  }
  if (kv_cache) gpt->end_kv_cache();
  return tokens;
}

}  // namespace dpt::models
