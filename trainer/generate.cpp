// trainer/generate.cpp: see generate.h.
#include "trainer/generate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "data/bpe.h"
#include "models/module.h"
#include "trainer/build_model.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/trainer.h"

namespace dpt::trainer {

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
  double u = models::uniform(rng, 0.0f, 1.0f) * sum;
  for (size_t i = 0; i < order.size(); ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order.back();  // u landed on the rounding at the very end
}

std::vector<int32_t> generate(models::Model& model, int64_t block_size, std::vector<int32_t> prompt, int64_t count,
                              const SampleOptions& o, uint64_t seed) {
  DPT_CHECK(!prompt.empty() && count >= 0, "generate: {} prompt tokens, {} new", prompt.size(), count);
  std::mt19937_64 rng(seed);
  model.set_training(false);
  std::vector<int32_t> tokens = std::move(prompt);
  for (int64_t n = 0; n < count; ++n) {
    const int64_t t = std::min<int64_t>(static_cast<int64_t>(tokens.size()), block_size);
    Tensor x = Tensor::empty({1, t}, DType::I32);
    std::copy(tokens.end() - t, tokens.end(), x.data<int32_t>());
    const Tensor& logits = model.forward(x);  // [t, vocab]; the last row predicts the next token
    const int64_t vocab = logits.dim(1);
    tokens.push_back(sample_token(logits.data<float>() + (t - 1) * vocab, vocab, o, rng));
  }
  return tokens;
}

GptCheckpoint load_gpt_checkpoint(const std::string& path, const std::string& tokenizer_dir) {
  const EvalTarget target = eval_target(path, {});
  const LoadedCheckpoint& ck = target.checkpoint;
  const Config& cfg = target.config;
  if (cfg.model.name != "gpt")
    DPT_THROW(ConfigError, "{} holds a {} model: generate needs a GPT (model.name = gpt)", ck.path, cfg.model.name);
  GptCheckpoint g;
  if (!tokenizer_dir.empty()) {
    const std::filesystem::path dir(tokenizer_dir);
    g.tokenizer = std::make_unique<data::Gpt2Bpe>(dir / data::kBpeVocabFile, dir / data::kBpeMergesFile);
    g.tokenizer_from = tokenizer_dir;
  } else {
    g.tokenizer = data::load_tokenizer(cfg.data.dir);
    g.tokenizer_from = cfg.data.dir;
  }
  if (g.tokenizer->vocab_size() > cfg.model.vocab_size) {
    DPT_THROW(ConfigError, "{}: the model's vocab_size is {}, but the tokenizer from {}, {}, has {} ids: not the "
              "tokenizer it was trained with (--tokenizer DIR names the directory of that vocab.json and merges.txt)",
              ck.path, cfg.model.vocab_size, g.tokenizer_from, g.tokenizer->describe(), g.tokenizer->vocab_size());
  }
  g.model = build_model(cfg.model, {cfg.model.block_size + 1}, cfg.model.vocab_size, Device::cpu());
  g.model->load_state([&](const std::string& name) { return ck.model.find(name); }, ck.path);
  g.block_size = cfg.model.block_size;
  g.vocab_size = cfg.model.vocab_size;
  g.from = ck.path;
  return g;
}

}  // namespace dpt::trainer
