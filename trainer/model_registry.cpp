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

std::unique_ptr<models::Model> build_mlp(const ModelConfig& m, const std::vector<int64_t>& sample_shape, int64_t classes,
                                         Device device) {
  int64_t features = 1;
  for (int64_t d : sample_shape) features *= d;
  if (m.in_channels > 0 && sample_shape.size() == 3 && m.in_channels != sample_shape[0])
    DPT_THROW(ConfigError, "model.in_channels = {}, but the data has {} channel(s)", m.in_channels, sample_shape[0]);
  return models::make_mlp(features, m.hidden, classes, device);
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
  o.small_stem = m.stem == ResNetStem::small;
  const std::string name =
      m.blocks.empty() ? fmt::format("resnet{}{}", m.depth, o.small_stem ? " (small stem)" : "")
                       : fmt::format("resnet {} [{}] x [{}]{}", choice_name(o.block), fmt::join(o.blocks, ", "),
                                     fmt::join(o.widths, ", "), o.small_stem ? " (small stem)" : "");
  return models::make_resnet(o, name, device);
}

std::unique_ptr<models::Model> build_gpt(const ModelConfig& m, const std::vector<int64_t>& sample_shape, int64_t,
                                         Device device) {
  // The data set's examples are windows of block_size + 1 tokens (inputs and the shifted targets).
  DPT_CHECK(sample_shape.size() == 1 && sample_shape[0] == m.block_size + 1,
            "gpt with model.block_size = {} got examples of shape [{}]", m.block_size, fmt::join(sample_shape, ", "));
  return models::make_gpt(gpt_options(m), device);
}

double gpt_flops(const ModelConfig& m) { return models::gpt_flops_per_token(gpt_options(m), m.block_size); }

// nanoGPT's layout or Hugging Face's GPT2LMHeadModel (models/gpt/weights.h).
std::vector<NamedTensor> gpt_weights(const std::vector<NamedTensor>& tensors, const std::string& path,
                                     const ModelConfig& m, std::string* layout) {
  return models::gpt_import_weights(tensors, path, gpt_options(m), layout);
}

// nanoGPT's state_dict or Hugging Face's GPT2LMHeadModel folder (models/gpt/weights.h).
ExportedWeights gpt_export(const models::Model& model, const ModelConfig& m, std::string_view layout) {
  const models::GptLayout l = models::parse_gpt_layout(std::string(layout));
  const bool hf = l == models::GptLayout::HuggingFace;
  return {.tensors = models::gpt_export_weights(model, l),
          .config_json = hf ? models::gpt_hf_config_json(gpt_options(m)) : "",
          .layout = hf ? "Hugging Face's GPT-2" : "nanoGPT's",
          .loader = hf ? "GPT2LMHeadModel.from_pretrained(folder)" : ""};
}

// The functions of each card of kModelCards, in its order: build, import_weights, flops_per_row, export_weights.
struct Functions {
  decltype(ModelFamily::build) build;
  decltype(ModelFamily::import_weights) import_weights;
  decltype(ModelFamily::flops_per_row) flops_per_row;
  decltype(ModelFamily::export_weights) export_weights;
};
const std::array<Functions, kModelCards.size()>& functions() {
  static const std::array<Functions, kModelCards.size()> table{{
      {.build = build_mlp},                                                        // mlp
      {.build = build_resnet},                                                     // resnet
      {.build = build_gpt, .import_weights = gpt_weights, .flops_per_row = gpt_flops, .export_weights = gpt_export},  // gpt
  }};
  return table;
}

}  // namespace

const ModelFamily& model_family(std::string_view name) {
  static const std::vector<ModelFamily> families = [] {
    std::vector<ModelFamily> out;
    for (size_t i = 0; i < kModelCards.size(); ++i) {
      const Functions& f = functions()[i];
      DPT_CHECK(f.build != nullptr, "model family {} has a card but no build function", kModelCards[i].name);
      out.push_back({kModelCards[i], f.build, f.import_weights, f.flops_per_row, f.export_weights});
    }
    return out;
  }();
  const ModelCard& card = model_card(name);  // ConfigError for a name no family has
  return families[static_cast<size_t>(&card - kModelCards.data())];
}

std::vector<std::string> exporting_model_names() {
  std::vector<std::string> names;
  for (const ModelCard& c : kModelCards)
    if (model_family(c.name).export_weights) names.emplace_back(c.name);
  return names;
}

}  // namespace dpt::trainer
