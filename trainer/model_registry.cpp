// trainer/model_registry.cpp: the model families: the MLP, torchvision's ResNets, GPT-2, the Llama family.
#include "trainer/model_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "models/gpt/gpt.h"
#include "models/gpt/weights.h"
#include "models/llama/hf.h"
#include "models/llama/llama.h"
#include "models/resnet.h"

namespace dpt::trainer {

models::GptOptions gpt_options(const ModelConfig& m) {
  return {.n_layer = m.n_layer, .n_head = m.n_head, .n_embd = m.n_embd, .vocab_size = m.vocab_size,
          .block_size = m.block_size, .recompute = m.recompute};
}

int64_t default_intermediate_size(int64_t n_embd) { return (8 * n_embd / 3 + 63) / 64 * 64; }

models::LlamaOptions llama_options(const ModelConfig& m) {
  models::LlamaOptions o;
  o.n_layer = m.n_layer;
  o.n_head = m.n_head;
  o.n_kv_head = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  o.n_embd = m.n_embd;
  if (m.head_dim == 0 && m.n_embd % m.n_head != 0)
    DPT_THROW(ConfigError, "model.n_embd = {} is not a multiple of model.n_head = {}: set model.head_dim (the width of "
              "each head) or another n_embd", m.n_embd, m.n_head);
  o.head_dim = m.head_dim > 0 ? m.head_dim : m.n_embd / m.n_head;
  o.intermediate_size = m.intermediate_size > 0 ? m.intermediate_size : default_intermediate_size(m.n_embd);
  o.vocab_size = m.vocab_size;
  o.max_positions = m.block_size;
  o.rms_norm_eps = m.rms_norm_eps;
  o.rope_theta = m.rope_theta;
  if (!m.rope_scaling.empty())
    o.rope_scaling = {.type = m.rope_scaling, .factor = m.rope_factor, .low_freq_factor = m.rope_low_freq_factor,
                      .high_freq_factor = m.rope_high_freq_factor,
                      .original_max_position_embeddings = m.rope_original_max_positions};
  o.tie_embeddings = m.tie_embeddings;
  o.qkv_bias = m.attention_bias != "none";
  o.o_bias = m.attention_bias == "all";
  o.mlp_bias = m.mlp_bias;
  return o;
}

namespace {

namespace fs = std::filesystem;

// The config.json a GPT's or a llama's keys come from: model.hf_config (a file, or a folder holding config.json),
// else the folder model.init_from names when it holds one; empty when neither.
std::string hf_config_path(const ModelConfig& m) {
  std::error_code ec;  // an unreadable path is "not there": the error below, or none (no config.json to take)
  if (!m.hf_config.empty()) {
    const fs::path p =
        fs::is_directory(m.hf_config, ec) ? fs::path(m.hf_config) / "config.json" : fs::path(m.hf_config);
    if (!fs::is_regular_file(p, ec)) DPT_THROW(ConfigError, "model.hf_config = {}: no file {}", m.hf_config, p.string());
    return p.string();
  }
  if (!m.init_from.empty() && fs::is_directory(m.init_from, ec) &&
      fs::is_regular_file(fs::path(m.init_from) / "config.json", ec))
    return (fs::path(m.init_from) / "config.json").string();
  return "";
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  if (!f) DPT_THROW(ConfigError, "reading {}", path);
  return s.str();
}

// take(field, value, key, json_key): model.`key` (m.*field) gets config.json's value of `json_key`; a key the config
// set (m.given) must agree instead.
auto key_taker(ModelConfig& m, const std::string& path) {
  return [&m, &path](auto ModelConfig::*field, auto value, const char* key, const char* json_key) {
    using T = std::remove_reference_t<decltype(m.*field)>;
    const T v = static_cast<T>(value);
    if (m.given.count(key) && m.*field != v)
      DPT_THROW(ConfigError, "model.{} = {}, but {} says {} = {}: leave model.{} unset (config.json gives the model's "
                "shape) or give the other config.json", key, m.*field, path, json_key, v, key);
    m.*field = v;
  };
}

// A GPT's keys from its Hugging Face GPT-2 config.json; none to take (the keys stand as given) when there is none, as
// for nanoGPT's files and lone state dicts.
std::string resolve_gpt(ModelConfig& m) {
  const std::string path = hf_config_path(m);
  if (path.empty()) return "";
  const models::GptOptions o = models::parse_hf_gpt2_config(read_text(path), path);
  const auto take = key_taker(m, path);
  take(&ModelConfig::n_layer, o.n_layer, "n_layer", "n_layer");
  take(&ModelConfig::n_head, o.n_head, "n_head", "n_head");
  take(&ModelConfig::n_embd, o.n_embd, "n_embd", "n_embd");
  take(&ModelConfig::vocab_size, o.vocab_size, "vocab_size", "vocab_size");
  // A shorter context than n_positions is the model cropped (nanoGPT's crop_block_size: wpe's first rows, the causal
  // attention of the first positions unchanged); a longer one has no positions to embed.
  std::string cropped;
  if (m.given.count("block_size") && m.block_size < o.block_size)
    cropped = fmt::format(" (n_positions {} cropped to model.block_size)", o.block_size);
  else if (m.given.count("block_size") && m.block_size > o.block_size)
    DPT_THROW(ConfigError, "model.block_size = {}, but {} says n_positions = {}: the model embeds no position past "
              "{}; give model.block_size <= {} (a shorter context crops the model) or leave it unset", m.block_size,
              path, o.block_size, o.block_size, o.block_size);
  else
    take(&ModelConfig::block_size, o.block_size, "block_size", "n_positions");
  const models::GptOptions resolved = gpt_options(m);
  models::check_gpt_options(resolved);
  return fmt::format("model.* keys from {} (gpt2): gpt L{} H{} C{} V{} T{}{}, {} parameters", path, resolved.n_layer,
                     resolved.n_head, resolved.n_embd, resolved.vocab_size, resolved.block_size, cropped,
                     models::gpt_num_params(resolved));
}

// A llama's keys from its config.json. Each key the config sets to a value other than its default must agree.
std::string resolve_llama(ModelConfig& m) {
  const std::string path = hf_config_path(m);
  if (path.empty()) return "";
  const models::HfLlamaConfig hf = models::parse_hf_llama_config(read_text(path), path);
  const models::LlamaOptions& o = hf.options;
  const auto take = key_taker(m, path);
  take(&ModelConfig::n_layer, o.n_layer, "n_layer", "num_hidden_layers");
  take(&ModelConfig::n_head, o.n_head, "n_head", "num_attention_heads");
  take(&ModelConfig::n_kv_head, o.n_kv_head, "n_kv_head", "num_key_value_heads");
  take(&ModelConfig::n_embd, o.n_embd, "n_embd", "hidden_size");
  take(&ModelConfig::head_dim, o.head_dim, "head_dim", "head_dim");
  take(&ModelConfig::intermediate_size, o.intermediate_size, "intermediate_size", "intermediate_size");
  take(&ModelConfig::vocab_size, o.vocab_size, "vocab_size", "vocab_size");
  take(&ModelConfig::rms_norm_eps, o.rms_norm_eps, "rms_norm_eps", "rms_norm_eps");
  take(&ModelConfig::rope_theta, o.rope_theta, "rope_theta", "rope_theta");
  take(&ModelConfig::rope_scaling, o.rope_scaling.type, "rope_scaling", "rope_scaling's type");
  if (!o.rope_scaling.type.empty()) {
    take(&ModelConfig::rope_factor, o.rope_scaling.factor, "rope_factor", "rope_scaling's factor");
    take(&ModelConfig::rope_low_freq_factor, o.rope_scaling.low_freq_factor, "rope_low_freq_factor",
         "rope_scaling's low_freq_factor");
    take(&ModelConfig::rope_high_freq_factor, o.rope_scaling.high_freq_factor, "rope_high_freq_factor",
         "rope_scaling's high_freq_factor");
    take(&ModelConfig::rope_original_max_positions, o.rope_scaling.original_max_position_embeddings,
         "rope_original_max_positions", "rope_scaling's original_max_position_embeddings");
  }
  take(&ModelConfig::max_position_embeddings, o.max_positions, "max_position_embeddings", "max_position_embeddings");
  take(&ModelConfig::tie_embeddings, o.tie_embeddings, "tie_embeddings", "tie_word_embeddings");
  take(&ModelConfig::attention_bias, std::string(o.o_bias ? "all" : o.qkv_bias ? "qkv" : "none"), "attention_bias",
       "the attention's biases");
  take(&ModelConfig::mlp_bias, o.mlp_bias, "mlp_bias", "mlp_bias");
  if (m.block_size > o.max_positions)
    DPT_THROW(ConfigError, "model.block_size = {} is longer than the {} positions {} says the model takes "
              "(max_position_embeddings)", m.block_size, o.max_positions, path);
  const models::LlamaOptions resolved = llama_options(m);
  models::check_llama_options(resolved);
  return fmt::format("model.* keys from {} ({}): {}, {} parameters", path, hf.model_type,
                     models::llama_shape_name(resolved), models::llama_num_params(resolved));
}

// A classifier's outputs: model.num_classes, which must equal the data's class count when both are known (0: the
// data's). Another count would train labels the head has no output for, or outputs no label names.
int64_t classifier_outputs(const ModelConfig& m, int64_t data_classes) {
  if (m.num_classes > 0 && data_classes > 0 && m.num_classes != data_classes)
    DPT_THROW(ConfigError, "model.num_classes = {}, but the data has {} classes: leave model.num_classes = 0 (the "
              "data's count) or set it to {}; a pretrained head of another class count (model.init_from) is "
              "re-initialised for the data's", m.num_classes, data_classes, data_classes);
  return m.num_classes > 0 ? m.num_classes : data_classes;
}

std::unique_ptr<models::Model> build_mlp(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                         int64_t data_classes, Device device) {
  const int64_t classes = classifier_outputs(m, data_classes);
  int64_t features = 1;
  for (int64_t d : sample_shape) features *= d;
  if (m.in_channels > 0 && sample_shape.size() == 3 && m.in_channels != sample_shape[0])
    DPT_THROW(ConfigError, "model.in_channels = {}, but the data has {} channel(s)", m.in_channels, sample_shape[0]);
  return models::make_mlp(features, m.hidden, classes, device);
}

std::unique_ptr<models::Model> build_resnet(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                            int64_t data_classes, Device device) {
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
  o.num_classes = classifier_outputs(m, data_classes);
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

std::unique_ptr<models::Model> build_llama(const ModelConfig& m, const std::vector<int64_t>& sample_shape, int64_t,
                                           Device device) {
  DPT_CHECK(sample_shape.size() == 1 && sample_shape[0] == m.block_size + 1,
            "llama with model.block_size = {} got examples of shape [{}]", m.block_size, fmt::join(sample_shape, ", "));
  if (m.max_position_embeddings > 0 && m.block_size > m.max_position_embeddings)
    DPT_THROW(ConfigError, "model.block_size = {} is longer than model.max_position_embeddings = {}", m.block_size,
              m.max_position_embeddings);
  return models::make_llama(llama_options(m), device);
}

double llama_flops(const ModelConfig& m) { return models::llama_flops_per_token(llama_options(m), m.block_size); }

// A Hugging Face folder's tensors (models/llama/hf.h).
std::vector<NamedTensor> llama_weights(const std::vector<NamedTensor>& tensors, const std::string& path,
                                       const ModelConfig& m, std::string* layout) {
  return models::llama_import_weights(tensors, path, llama_options(m), layout);
}

// LlamaForCausalLM's (or Qwen2ForCausalLM's) folder: the weights and config.json.
ExportedWeights llama_export(const models::Model& model, const ModelConfig& m, std::string_view layout) {
  if (layout != "hf") DPT_THROW(ConfigError, "weight layout '{}': a llama exports in hf (Hugging Face's) only", layout);
  const models::LlamaOptions o = llama_options(m);
  std::string config = models::llama_hf_config_json(
      o, m.max_position_embeddings > 0 ? m.max_position_embeddings : m.block_size);
  const bool qwen2 = config.find("Qwen2ForCausalLM") != std::string::npos;
  return {.tensors = models::llama_export_weights(model),
          .config_json = std::move(config),
          .layout = qwen2 ? "Hugging Face's Qwen2" : "Hugging Face's Llama",
          .loader = qwen2 ? "Qwen2ForCausalLM.from_pretrained(folder)" : "LlamaForCausalLM.from_pretrained(folder)"};
}

// The functions of each card of kModelCards, in its order: build, import_weights, file_name, flops_per_row,
// export_weights, resolve.
struct Functions {
  decltype(ModelFamily::build) build;
  decltype(ModelFamily::import_weights) import_weights;
  decltype(ModelFamily::file_name) file_name;
  decltype(ModelFamily::flops_per_row) flops_per_row;
  decltype(ModelFamily::export_weights) export_weights;
  decltype(ModelFamily::resolve) resolve;
};
const std::array<Functions, kModelCards.size()>& functions() {
  static const std::array<Functions, kModelCards.size()> table{{
      {.build = build_mlp},                                                        // mlp
      {.build = build_resnet},                                                     // resnet
      {.build = build_gpt, .import_weights = gpt_weights, .file_name = models::gpt_file_name,
       .flops_per_row = gpt_flops, .export_weights = gpt_export, .resolve = resolve_gpt},  // gpt
      {.build = build_llama, .import_weights = llama_weights, .flops_per_row = llama_flops,
       .export_weights = llama_export, .resolve = resolve_llama},  // llama
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
      out.push_back({kModelCards[i], f.build, f.import_weights, f.file_name, f.flops_per_row, f.export_weights,
                     f.resolve});
    }
    return out;
  }();
  const ModelCard& card = model_card(name);  // ConfigError for a name no family has
  return families[static_cast<size_t>(&card - kModelCards.data())];
}

std::string resolve_model_config(ModelConfig& m) {
  const ModelFamily& family = model_family(m.name);
  return family.resolve ? family.resolve(m) : "";
}

std::vector<std::string> exporting_model_names() {
  std::vector<std::string> names;
  for (const ModelCard& c : kModelCards)
    if (model_family(c.name).export_weights) names.emplace_back(c.name);
  return names;
}

}  // namespace dpt::trainer
