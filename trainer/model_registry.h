// trainer/model_registry.h: one entry per model family (model.name): everything the trainer, the tools and the
// config need to know of a family, so that adding one is a folder under models/ plus an entry in
// model_registry.cpp, and no other file compares model.name.
//
// An entry says how to build the model from its model.* keys, what it trains on (its task, and what `predict`
// feeds it), how train.weight_decay_params = auto groups its parameters, the weight layouts model.init_from reads
// (and whether a classifier head of another class count is re-initialised, as fine-tuning needs), its training
// FLOPs for the MFU, and whether it generates text (`generate`, `predict` on prompts, `export-weights`).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "models/model.h"
#include "trainer/model_config.h"

namespace dpt::models {
struct GptOptions;
}

namespace dpt::trainer {

struct ModelFamily {
  std::string name;  // model.name
  std::string note;  // said after the names in model.name's help (empty: nothing)
  ModelInput input = ModelInput::examples;
  // train.weight_decay_params = auto: only parameters of 2 or more dimensions decay (nanoGPT's grouping), or all.
  bool decay_matrices_only = false;
  // The model for examples of `sample_shape` ({C, H, W}, {F}; tokens: {block_size + 1}) and `classes` outputs.
  // ConfigError when it cannot take the data.
  std::function<std::unique_ptr<models::Model>(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                               int64_t classes, Device device)>
      build;
  // model.init_from: the file's tensors renamed and reshaped into the model's own names; `*layout` names the layout
  // it found. Empty: the file holds the model's own names.
  std::function<std::vector<NamedTensor>(const std::vector<NamedTensor>& tensors, const std::string& path,
                                         const ModelConfig& m, std::string* layout)>
      import_weights;
  // model.init_from: a classifier head (the last parameter pair) of another class count keeps its fresh
  // initialisation (fine-tuning).
  bool reinit_head = false;
  // Training FLOPs (forward and backward) per loss row, for the progress line's MFU. Empty: no estimate.
  std::function<double(const ModelConfig& m)> flops_per_row;
  // `generate`, `predict` on prompts and `export-weights` take it (models/gpt: generation, weight layouts out).
  bool generates = false;
};

// Every family, in the order model.name's help lists them.
const std::vector<ModelFamily>& model_families();
// The family named `name`; ConfigError naming the choices for another.
const ModelFamily& model_family(std::string_view name);
// The names, and the names of the families that train on `input`, as a config's help and errors list them:
// "mlp | resnet | gpt", "gpt".
std::vector<std::string> model_names();
std::vector<std::string> model_names(ModelInput input);
// model.name's help: the names, each family's note after them.
std::string model_name_help();

// The GPT family's options from its model.* keys (for the tools made for it: generation, its benchmark table).
models::GptOptions gpt_options(const ModelConfig& m);

}  // namespace dpt::trainer
