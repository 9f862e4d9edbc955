// trainer/build_model.cpp: model.* config -> a Model; model.init_from -> its starting weights.
#include "trainer/build_model.h"

#include <algorithm>
#include <map>
#include <set>

#include "models/gpt/gpt.h"
#include "models/gpt/weights.h"
#include "models/resnet.h"
#include "trainer/safetensors.h"

namespace dpt::trainer {

std::unique_ptr<models::Model> build_model(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                           int64_t data_classes, Device device) {
  const int64_t classes = m.num_classes > 0 ? m.num_classes : data_classes;
  if (m.name == "mlp") {
    int64_t features = 1;
    for (int64_t d : sample_shape) features *= d;
    if (m.in_channels > 0 && sample_shape.size() == 3 && m.in_channels != sample_shape[0])
      DPT_THROW(ConfigError, "model.in_channels = {}, but the data has {} channel(s)", m.in_channels, sample_shape[0]);
    return models::make_mlp(features, m.hidden, classes, device);
  }
  if (m.name == "gpt") {
    // The data set's examples are windows of block_size + 1 tokens (inputs and the shifted targets).
    DPT_CHECK(sample_shape.size() == 1 && sample_shape[0] == m.block_size + 1,
              "gpt with model.block_size = {} got examples of shape [{}]", m.block_size, fmt::join(sample_shape, ", "));
    const models::GptOptions o{.n_layer = m.n_layer, .n_head = m.n_head, .n_embd = m.n_embd,
                               .vocab_size = m.vocab_size, .block_size = m.block_size, .recompute = m.recompute};
    return models::make_gpt(o, device);
  }
  DPT_CHECK(m.name == "resnet", "model.name = {}", m.name);
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

std::string load_pretrained(models::Model& model, const std::string& path) {
  SafetensorsFile file;
  try {
    file = read_safetensors(path);
  } catch (const Error& e) {
    DPT_THROW(ConfigError, "model.init_from: {}", e.what());
  }
  const auto state = model.state();
  const auto* gpt = dynamic_cast<const models::Gpt*>(&model.root());
  std::string layout;
  if (gpt) file.tensors = models::gpt_import_weights(file.tensors, path, gpt->options(), &layout);
  std::set<std::string> wanted;
  for (const auto& nt : state) wanted.insert(nt.name);
  for (const auto& nt : file.tensors)
    if (!wanted.count(nt.name))
      DPT_THROW(ConfigError, "model.init_from {}: tensor {} is not in this model ({}): a different architecture?",
                path, nt.name, model.summary());
  // The classifier head: the last parameter pair. A different class count there keeps the fresh head.
  const auto& params = model.named_params();
  std::set<std::string> head;
  if (params.size() >= 2 && !gpt) {
    head.insert(params[params.size() - 2].name);
    head.insert(params.back().name);
  }
  std::vector<std::string> reinit;
  for (const auto& nt : state) {
    const Tensor* src = file.find(nt.name);
    if (src && head.count(nt.name) && src->shape() != nt.tensor.shape() && src->ndim() == nt.tensor.ndim() &&
        src->ndim() >= 1 && std::equal(src->shape().begin() + 1, src->shape().end(), nt.tensor.shape().begin() + 1))
      reinit.push_back(nt.name);
  }
  std::map<std::string, Tensor> keep;  // the fresh head, standing in for the file's
  for (const auto& name : reinit)
    for (const auto& nt : state)
      if (nt.name == name) keep[name] = nt.tensor.to(Device::cpu());
  try {
    model.load_state(
        [&](const std::string& name) -> const Tensor* {
          auto it = keep.find(name);
          return it != keep.end() ? &it->second : file.find(name);
        },
        "model.init_from " + path);
  } catch (const CheckpointError& e) {
    DPT_THROW(ConfigError, "{}", e.what());
  }
  if (gpt) return fmt::format("{} layout", layout);
  if (reinit.empty()) return "";
  const Tensor* w = file.find(reinit.front());
  return fmt::format("{} has {} classes in {}, the model {}: {} re-initialised (fine-tuning)", reinit.front(),
                     w->dim(0), path, params.back().param.dim(0), fmt::join(reinit, " and "));
}

double train_flops_per_row(const models::Model& model) {
  const auto* gpt = dynamic_cast<const models::Gpt*>(&model.root());
  return gpt ? models::gpt_flops_per_token(gpt->options(), gpt->options().block_size) : 0.0;
}

models::Precision parse_precision(const std::string& p) {
  if (p == "bf16") return models::Precision::BF16;
  if (p == "fp16") return models::Precision::F16;
  DPT_CHECK(p == "fp32", "train.precision = {}", p);
  return models::Precision::F32;
}

}  // namespace dpt::trainer
