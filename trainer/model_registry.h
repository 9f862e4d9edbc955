// trainer/model_registry.h: one entry per model family (model.name): everything the trainer, the tools and the
// config need to know of a family, so that adding one is a folder under models/ plus an entry here (a card in this
// header, its functions in model_registry.cpp), and no other file compares model.name.
//
// An entry is a card (the table below: its name, what it trains on, so its task and what `predict` feeds it, how
// train.weight_decay_params = auto groups its parameters, whether model.init_from re-initialises a classifier head
// of another class count, as fine-tuning needs, and whether it generates text: `generate`, `predict` on prompts,
// `export-weights`) and its functions (model_registry.cpp: how to build it from its model.* keys, the weight layouts
// model.init_from reads, its training FLOPs for the MFU).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"
#include "models/model.h"
#include "trainer/model_config.h"

namespace dpt::models {
struct GptOptions;
struct LlamaOptions;
}

namespace dpt::trainer {

// What the config and the tools read of a family: the card. A table in this header, so that the config layer (and its
// fuzz target) knows the names without linking any model.
struct ModelCard {
  std::string_view name;  // model.name
  std::string_view note;  // said after the names in model.name's help (empty: nothing)
  ModelInput input = ModelInput::examples;
  // train.weight_decay_params = auto: only parameters of 2 or more dimensions decay (nanoGPT's grouping), or all.
  bool decay_matrices_only = false;
  // model.init_from: a classifier head (the last parameter pair) of another class count keeps its fresh
  // initialisation (fine-tuning).
  bool reinit_head = false;
  // `generate`, `predict` on prompts and `export-weights` take it (models/gpt: generation, weight layouts out).
  bool generates = false;
  // train.bf16_activations: its modules run the transformer fast path (Module::supports_bf16_activations).
  bool bf16_activations = false;
  // Its positions reach model.max_position_embeddings (RoPE), which may exceed the training window model.block_size:
  // `generate` and `predict` then run over that longer context, as transformers' generate() does.
  bool generates_past_block_size = false;
};

// Every family, in the order model.name's help lists them; each has its functions in model_registry.cpp.
inline constexpr std::array<ModelCard, 4> kModelCards{{
    {.name = "mlp", .reinit_head = true},
    {.name = "resnet", .reinit_head = true},
    {.name = "gpt",
     .note = "GPT-2 as nanoGPT: needs data.dataset = tokens; its GPU kernels passed their tests on an H200",
     .input = ModelInput::tokens,
     .decay_matrices_only = true,
     .generates = true,
     .bf16_activations = true},
    {.name = "llama",
     .note = "Hugging Face's LlamaForCausalLM (Llama 2 and 3, SmolLM, TinyLlama; Qwen2): needs data.dataset = "
             "tokens or jsonl; its GPU kernels, float32 and its transformer fast path (train.bf16_activations), "
             "passed their tests on an H200",
     .input = ModelInput::tokens,
     .decay_matrices_only = true,
     .generates = true,
     .bf16_activations = true,
     .generates_past_block_size = true},
}};

// The names, and the names of the families that train on `input`, as a config's help and errors list them:
// {"mlp", "resnet", "gpt"}, {"gpt"}.
inline std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelCard& c : kModelCards) names.emplace_back(c.name);
  return names;
}
inline std::vector<std::string> model_names(ModelInput input) {
  std::vector<std::string> names;
  for (const ModelCard& c : kModelCards)
    if (c.input == input) names.emplace_back(c.name);
  return names;
}
// The families with the transformer fast path (train.bf16_activations).
inline std::vector<std::string> bf16_activation_models() {
  std::vector<std::string> names;
  for (const ModelCard& c : kModelCards)
    if (c.bf16_activations) names.emplace_back(c.name);
  return names;
}
// The card of `name`; ConfigError naming the choices for another.
inline const ModelCard& model_card(std::string_view name) {
  for (const ModelCard& c : kModelCards)
    if (c.name == name) return c;
  DPT_THROW(ConfigError, "model.name = '{}': must be one of: {}", name, fmt::join(model_names(), ", "));
}
// model.name's help: the names, each followed by its family's note.
inline std::string model_name_help() {
  std::vector<std::string> parts;
  for (const ModelCard& c : kModelCards)
    parts.push_back(c.note.empty() ? std::string(c.name) : fmt::format("{} ({})", c.name, c.note));
  return fmt::format("{}", fmt::join(parts, " | "));
}

// train.weight_decay_params' help: what auto means, from the cards (the families that decay matrices only).
inline std::string weight_decay_params_help() {
  std::vector<std::string> matrices;
  for (const ModelCard& c : kModelCards)
    if (c.decay_matrices_only) matrices.emplace_back(c.name);
  return fmt::format("which parameters train.weight_decay applies to: all | matrices (those of 2 or more dimensions: "
                     "weights and embeddings, not biases or normalisation gains, as nanoGPT) | auto (matrices for {}, "
                     "all otherwise, as PyTorch's optimizers)", fmt::join(matrices, " and "));
}

// export-weights: a model's weights for another program.
struct ExportedWeights {
  std::vector<NamedTensor> tensors;  // host, float32, named and shaped as the layout has them
  std::string config_json;           // what goes beside them in a folder as config.json; empty: nothing
  std::string layout;                // "Hugging Face's GPT-2": the layout, for the line export-weights prints
  std::string loader;                // "GPT2LMHeadModel.from_pretrained(folder)": what loads the folder
};

// A family: its card and what it does (model_registry.cpp).
struct ModelFamily : ModelCard {
  // The model for examples of `sample_shape` ({C, H, W}, {F}; tokens: {block_size + 1}) of `classes` classes (a
  // classifier's outputs; model.num_classes, when set, must equal it). ConfigError when it cannot take the data.
  std::function<std::unique_ptr<models::Model>(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                               int64_t classes, Device device)>
      build;
  // model.init_from: the file's tensors renamed and reshaped into the model's own names; `*layout` names the layout
  // it found ("Hugging Face layout") and any change beyond names and layouts (a crop). Empty: the file holds the
  // model's own names.
  std::function<std::vector<NamedTensor>(const std::vector<NamedTensor>& tensors, const std::string& path,
                                         const ModelConfig& m, std::string* layout)>
      import_weights;
  // model.init_from's errors: the model's tensor `name` as a file whose tensors are `file_names` (before
  // import_weights) names it. Empty: the model's own name.
  std::function<std::string(const std::vector<std::string>& file_names, const std::string& name)> file_name;
  // Training FLOPs (forward and backward) per loss row, for the progress line's MFU. Empty: no estimate.
  std::function<double(const ModelConfig& m)> flops_per_row;
  // export-weights: the model's weights in `layout` (a word of export-weights' --layout; ConfigError for one the
  // family lacks). Empty: the family has no layout out.
  std::function<ExportedWeights(const models::Model& model, const ModelConfig& m, std::string_view layout)>
      export_weights;
  // At start-up, before anything reads `m`: completes the model.* keys from elsewhere (a GPT's or a llama's from a
  // Hugging Face config.json) and returns a line saying what it took from where (empty: nothing). ConfigError for a
  // source that cannot be read or that disagrees with a key the config sets. Empty: the keys are complete as given.
  std::function<std::string(ModelConfig& m)> resolve;
};

// The family's resolve on `m` (resolve_model_config(cfg.model) right after the config is loaded, on every rank);
// returns its line, empty when it did nothing.
std::string resolve_model_config(ModelConfig& m);

// The names of the families that export-weights takes (those with export_weights).
std::vector<std::string> exporting_model_names();

// The family named `name`; ConfigError naming the choices for another.
const ModelFamily& model_family(std::string_view name);

// The GPT family's options from its model.* keys (for the tools made for it: generation, its benchmark table).
models::GptOptions gpt_options(const ModelConfig& m);
// The Llama family's options from its (resolved) model.* keys: a 0 of n_kv_head, head_dim, intermediate_size or
// max_position_embeddings takes its default; the RoPE tables cover model.block_size positions.
models::LlamaOptions llama_options(const ModelConfig& m);
// model.intermediate_size = 0: 8/3 n_embd rounded up to a multiple of 64 (Llama's sizing of the SwiGLU MLP).
int64_t default_intermediate_size(int64_t n_embd);

}  // namespace dpt::trainer
