// trainer/gpt_checkpoint.cpp: a GPT checkpoint for `dptrain generate` and `dptrain export-weights` (see gpt_checkpoint.h).
#include "trainer/gpt_checkpoint.h"

#include <fmt/ranges.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/safetensors.h"
#include "data/bpe.h"
#include "data/load_tokenizer.h"
#include "models/gpt/gpt.h"
#include "trainer/build_model.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/saved_run.h"
#include "trainer/model_registry.h"

namespace dpt::trainer {

namespace fs = std::filesystem;

namespace {

// Writes `file` whole or not at all: write(file.tmp), then the rename; the .tmp removed when either fails.
template <class Write>
void write_whole(const fs::path& file, Write&& write) {
  const std::string tmp = file.string() + ".tmp";
  try {
    write(tmp);
    fs::rename(tmp, file);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

// ConfigError unless the checkpoint's model family generates text (a GPT).
void require_generating(const SavedRun& target, const char* who) {
  if (!model_card(target.config.model.name).generates)
    DPT_THROW(ConfigError, "{} holds a {} model: {} needs a GPT (model.name = {})", target.checkpoint.path,
              target.config.model.name, who, fmt::join(model_names(ModelInput::tokens), " or "));
}

// The checkpoint's GPT on `device`; ConfigError for another model.
std::unique_ptr<models::Model> gpt_of(const SavedRun& target, Device device, const char* who) {
  const LoadedCheckpoint& ck = target.checkpoint;
  const Config& cfg = target.config;
  require_generating(target, who);
  auto model = build_model(cfg.model, {cfg.model.block_size + 1}, cfg.model.vocab_size, device);
  model->load_state([&](const std::string& name) { return ck.model.find(name); }, ck.path);
  return model;
}

}  // namespace

bool export_is_folder(const std::string& out) {
  return fs::is_directory(out) || !fs::path(out).filename().string().ends_with(".safetensors");
}

std::string export_weights(const std::string& path, const std::string& layout, const std::string& out) {
  const SavedRun target = load_saved_run(path, {});
  const ModelFamily& family = model_family(target.config.model.name);
  if (!family.export_weights)
    DPT_THROW(ConfigError, "{} holds a {} model: export-weights needs a GPT (model.name = {})", target.checkpoint.path,
              target.config.model.name, fmt::join(exporting_model_names(), " or "));
  const auto model = gpt_of(target, Device::cpu(), "export-weights");
  const ExportedWeights w = family.export_weights(*model, target.config.model, layout);
  const bool folder = export_is_folder(out);
  const fs::path weights = folder ? fs::path(out) / kExportWeightsFile : fs::path(out);
  try {
    if (folder) fs::create_directories(out);
    write_whole(weights, [&](const std::string& tmp) { write_safetensors(tmp, w.tensors); });
    if (folder && !w.config_json.empty()) {
      write_whole(fs::path(out) / kHfConfigFile, [&](const std::string& tmp) {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f << w.config_json;
        f.close();
        if (!f) DPT_THROW(IoError, "writing {}: {}", tmp, std::strerror(errno));
      });
    }
  } catch (const std::exception& e) {
    DPT_THROW(IoError, "export-weights: writing {}: {}", out, e.what());
  }
  return fmt::format("{}: {} from {} in {} layout (vocabulary {}){}", folder ? (fs::path(out) / "").string() : out,
                     model->summary(), target.checkpoint.path, w.layout, target.config.model.vocab_size,
                     !folder                  ? ""
                     : w.config_json.empty() ? "; model.safetensors"
                                              : "; model.safetensors and config.json: " + w.loader);
}

GptCheckpoint load_gpt_checkpoint(const std::string& path, const std::string& tokenizer_dir, Device device) {
  const SavedRun target = load_saved_run(path, {});
  const LoadedCheckpoint& ck = target.checkpoint;
  const Config& cfg = target.config;
  require_generating(target, "generate");
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
