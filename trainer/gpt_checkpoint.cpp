// trainer/gpt_checkpoint.cpp: a GPT checkpoint for `dptrain generate` and `dptrain export-weights` (see gpt_checkpoint.h).
#include "trainer/gpt_checkpoint.h"

#include <filesystem>

#include "data/bpe.h"
#include "trainer/build_model.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/safetensors.h"
#include "trainer/evaluate.h"
#include "trainer/trainer.h"

namespace dpt::trainer {

namespace {

// The checkpoint's GPT on `device`; ConfigError for another model.
std::unique_ptr<models::Model> gpt_of(const EvalTarget& target, Device device, const char* who) {
  const LoadedCheckpoint& ck = target.checkpoint;
  const Config& cfg = target.config;
  if (cfg.model.name != "gpt")
    DPT_THROW(ConfigError, "{} holds a {} model: {} needs a GPT (model.name = gpt)", ck.path, cfg.model.name, who);
  auto model = build_model(cfg.model, {cfg.model.block_size + 1}, cfg.model.vocab_size, device);
  model->load_state([&](const std::string& name) { return ck.model.find(name); }, ck.path);
  return model;
}

}  // namespace

std::string export_gpt_weights(const std::string& path, models::GptLayout layout, const std::string& out) {
  const EvalTarget target = eval_target(path, {});
  const auto model = gpt_of(target, Device::cpu(), "export-weights");
  const std::string tmp = out + ".tmp";
  try {
    write_safetensors(tmp, models::gpt_export_weights(*model, layout));
    std::filesystem::rename(tmp, out);
  } catch (const std::exception& e) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    DPT_THROW(IoError, "export-weights: writing {}: {}", out, e.what());
  }
  return fmt::format("{}: {} from {} in {} layout (vocabulary {})", out, model->summary(), target.checkpoint.path, layout == models::GptLayout::HuggingFace ? "Hugging Face's GPT-2" : "nanoGPT's", target.config.model.vocab_size);
}

GptCheckpoint load_gpt_checkpoint(const std::string& path, const std::string& tokenizer_dir, Device device) {
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
  g.model = gpt_of(target, device, "generate");
  g.block_size = cfg.model.block_size;
  g.vocab_size = cfg.model.vocab_size;
  g.from = ck.path;
  return g;
}

}  // namespace dpt::trainer
