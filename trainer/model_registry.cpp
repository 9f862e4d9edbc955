// trainer/model_registry.cpp: the model families: the MLP, torchvision's ResNets, GPT-2.
#include "trainer/model_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.h"
#include "models/gpt/gpt.h"
#include "models/gpt/weights.h"
#include "models/resnet.h"

namespace dpt::trainer {

models::GptOptions gpt_options(const ModelConfig& m) {
  return {.n_layer = m.n_layer, .n_head = m.n_head, .n_embd = m.n_embd, .vocab_size = m.vocab_size,
          .block_size = m.block_size, .recompute = m.recompute};
}

namespace {

ModelFamily mlp() {
  return {.name = "mlp",
          .build = [](const ModelConfig& m, const std::vector<int64_t>& sample_shape, int64_t classes, Device device) {
            int64_t features = 1;
            for (int64_t d : sample_shape) features *= d;
            if (m.in_channels > 0 && sample_shape.size() == 3 && m.in_channels != sample_shape[0])
              DPT_THROW(ConfigError, "model.in_channels = {}, but the data has {} channel(s)", m.in_channels,
                        sample_shape[0]);
            return models::make_mlp(features, m.hidden, classes, device);
          },
          .reinit_head = true};
}

std::unique_ptr<models::Model> build_resnet(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                            int64_t classes, Device device) {
  if (sample_shape.size() != 3)
    DPT_THROW(ConfigError, "model.name = resnet needs images [C, H, W]; the data set gives examples of shape [{}]",
              fmt::join(sample_shape, ", "));
  models::ResNetOptions o = m.blocks.empty() ? models::resnet_preset(m.depth) : models::ResNetOptions{};
  if (!m.blocks.empty()) {
    o.blocks = m.blocks;
    o.block = m.block;
  }
  o.widths = m.widths;
  if (o.widths.size() != o.blocks.size())
    DPT_THROW(ConfigError, "model.widths has {} value(s) but the ResNet has {} stage(s) ({}): give one width per stage",
              o.widths.size(), o.blocks.size(),
              m.blocks.empty() ? fmt::format("model.depth = {}", m.depth) : "model.blocks");
  o.in_channels = m.in_channels > 0 ? m.in_channels : sample_shape[0];
  if (o.in_channels != sample_shape[0])
    DPT_THROW(ConfigError, "model.in_channels = {}, but the data has {} channel(s)", o.in_channels, sample_shape[0]);
  o.num_classes = classes;
  o.small_stem = m.stem == "small";
  const std::string name =
      m.blocks.empty() ? fmt::format("resnet{}{}", m.depth, o.small_stem ? " (small stem)" : "")
                       : fmt::format("resnet {} [{}] x [{}]{}", o.block, fmt::join(o.blocks, ", "),
                                     fmt::join(o.widths, ", "), o.small_stem ? " (small stem)" : "");
  return models::make_resnet(o, name, device);
}

ModelFamily resnet() { return {.name = "resnet", .build = build_resnet, .reinit_head = true}; }

ModelFamily gpt() {
  return {
      .name = "gpt",
      .note = "GPT-2 as nanoGPT: needs data.dataset = tokens; its GPU kernels are compiled but not yet run on a GPU",
      .input = ModelInput::tokens,
      .decay_matrices_only = true,
      .build = [](const ModelConfig& m, const std::vector<int64_t>& sample_shape, int64_t, Device device) {
        // The data set's examples are windows of block_size + 1 tokens (inputs and the shifted targets).
        DPT_CHECK(sample_shape.size() == 1 && sample_shape[0] == m.block_size + 1,
                  "gpt with model.block_size = {} got examples of shape [{}]", m.block_size,
                  fmt::join(sample_shape, ", "));
        return models::make_gpt(gpt_options(m), device);
      },
      // nanoGPT's layout or Hugging Face's GPT2LMHeadModel (models/gpt/weights.h).
      .import_weights = [](const std::vector<NamedTensor>& tensors, const std::string& path, const ModelConfig& m,
                           std::string* layout) { return models::gpt_import_weights(tensors, path, gpt_options(m), layout); },
      .flops_per_row = [](const ModelConfig& m) { return models::gpt_flops_per_token(gpt_options(m), m.block_size); },
      .generates = true};
}

}  // namespace

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families{mlp(), resnet(), gpt()};
  return families;
}

const ModelFamily& model_family(std::string_view name) {
  for (const ModelFamily& f : model_families())
    if (f.name == name) return f;
  DPT_THROW(ConfigError, "model.name = '{}': must be one of: {}", name, fmt::join(model_names(), ", "));
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelFamily& f : model_families()) names.push_back(f.name);
  return names;
}

std::vector<std::string> model_names(ModelInput input) {
  std::vector<std::string> names;
  for (const ModelFamily& f : model_families())
    if (f.input == input) names.push_back(f.name);
  return names;
}

std::string model_name_help() {
  std::string help = fmt::format("{}", fmt::join(model_names(), " | "));
  for (const ModelFamily& f : model_families())
    if (!f.note.empty()) help += fmt::format(" ({})", f.note);
  return help;
}

}  // namespace dpt::trainer
