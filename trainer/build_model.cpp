// trainer/build_model.cpp: model.* config -> a Model; model.init_from -> its starting weights.
#include "trainer/build_model.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "models/gpt.h"
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

namespace {

bool ends_with(const std::string& s, const std::string& tail) { return s.size() >= tail.size() && s.ends_with(tail); }

// A GPT's weights as this model names and lays them out (nanoGPT's), from a file in nanoGPT's or Hugging
// Face's GPT2LMHeadModel layout: names with or without the "transformer." prefix (the hub's model.safetensors
// has none); the four projection weights of each block transposed when they come from HF's Conv1D ([in, out],
// recognised by c_attn's [C, 3C] shape); HF's causal-mask buffers (attn.bias, attn.masked_bias) dropped;
// lm_head.weight dropped when it equals transformer.wte.weight (the tie), an error otherwise. `layout` gets
// "nanoGPT" or "Hugging Face".
bool is_conv1d_weight(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

// A 2-D float32 tensor transposed, on the host.
Tensor transposed(const Tensor& t) {
  const Tensor src = t.to(Device::cpu());
  const int64_t rows = src.dim(0), cols = src.dim(1);
  Tensor out = Tensor::empty({cols, rows});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out.data<float>()[c * rows + r] = src.data<float>()[r * cols + c];
  return out;
}

// The first `rows` rows of a 2-D host tensor, zero-filled up to `rows` when it has fewer.
Tensor with_rows(const Tensor& t, int64_t rows) {
  const Tensor src = t.to(Device::cpu());
  Tensor out = Tensor::zeros({rows, src.dim(1)});
  const int64_t n = std::min(rows, src.dim(0)) * src.dim(1);
  std::copy_n(src.data<float>(), n, out.data<float>());
  return out;
}

// A GPT's tensors from nanoGPT's or Hugging Face's layout into ours: full names, Conv1D weights transposed,
// mask buffers dropped, the tied lm_head checked, wte padded to the model's rows.
std::vector<NamedTensor> gpt_weights(const SafetensorsFile& file, const std::string& path,
                                     const models::GptOptions& o, std::string* layout) {
  auto full = [](const std::string& n) { return n.starts_with("transformer.") || n == "lm_head.weight" ? n : "transformer." + n; };
  const int64_t n_embd = o.n_embd;
  const Tensor* c_attn = nullptr;
  for (const auto& nt : file.tensors)
    if (full(nt.name) == "transformer.h.0.attn.c_attn.weight") c_attn = &nt.tensor;
  const bool hf = c_attn && c_attn->ndim() == 2 && c_attn->dim(0) == n_embd && c_attn->dim(1) == 3 * n_embd;
  *layout = hf ? "Hugging Face" : "nanoGPT";
  std::vector<NamedTensor> out;
  const Tensor* head = nullptr;
  for (const auto& nt : file.tensors) {
    const std::string name = full(nt.name);
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;  // HF's mask buffers
    if (name == "lm_head.weight") {
      head = &nt.tensor;
      continue;
    }
    const bool f32_matrix = nt.tensor.ndim() == 2 && nt.tensor.dtype() == DType::F32;
    if (hf && is_conv1d_weight(name)) {
      DPT_CHECK(f32_matrix, "{}: {} is {} {}", path, nt.name, dtype_name(nt.tensor.dtype()), nt.tensor.shape_str());
      out.push_back({name, transposed(nt.tensor)});
    } else if (name == "transformer.wte.weight" && f32_matrix && nt.tensor.dim(0) == o.vocab_size &&
               models::padded_vocab(o) != o.vocab_size) {
      out.push_back({name, with_rows(nt.tensor, models::padded_vocab(o))});  // the real vocabulary: pad
    } else {
      out.push_back({name, nt.tensor});
    }
  }
  if (head) {
    const Tensor* wte = file.find("transformer.wte.weight");
    if (!wte) wte = file.find("wte.weight");
    if (!wte || wte->shape() != head->shape() || std::memcmp(wte->raw(), head->raw(), head->bytes()) != 0)
      DPT_THROW(ConfigError, "model.init_from {}: lm_head.weight differs from transformer.wte.weight: this GPT ties "
                "its head to the token embedding", path);
  }
  return out;
}

}  // namespace

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
  if (gpt) file.tensors = gpt_weights(file, path, gpt->options(), &layout);
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

GptLayout parse_gpt_layout(const std::string& name) {
  if (name == "nanogpt") return GptLayout::NanoGpt;
  if (name == "hf") return GptLayout::HuggingFace;
  DPT_THROW(ConfigError, "weight layout '{}': nanogpt or hf", name);
}

std::vector<NamedTensor> gpt_export_weights(const models::Model& model, GptLayout layout) {
  const auto* gpt = dynamic_cast<const models::Gpt*>(&model.root());
  if (!gpt) DPT_THROW(ConfigError, "{} is not a GPT: only a GPT's weights export to nanoGPT's or Hugging Face's layout", model.summary());
  const int64_t vocab = gpt->options().vocab_size;
  std::vector<NamedTensor> out;
  Tensor wte;
  for (const auto& nt : model.state()) {
    if (nt.tensor.dtype() != DType::F32) continue;  // counters: none in a GPT, and no place in these layouts
    Tensor t = nt.name == "transformer.wte.weight" ? with_rows(nt.tensor, vocab) : nt.tensor.to(Device::cpu());
    if (nt.name == "transformer.wte.weight") wte = t;
    if (layout == GptLayout::NanoGpt) {
      out.push_back({nt.name, t});
    } else {
      DPT_CHECK(nt.name.starts_with("transformer."), "GPT tensor {} outside transformer.", nt.name);
      out.push_back({nt.name.substr(std::string("transformer.").size()), is_conv1d_weight(nt.name) ? transposed(t) : t});
    }
  }
  if (layout == GptLayout::NanoGpt) {
    Tensor head = Tensor::empty(wte.shape());
    head.copy_from(wte);
    out.push_back({"lm_head.weight", head});  // nanoGPT's state_dict names the tied weight twice
  }
  return out;
}

models::Precision parse_precision(const std::string& p) {
  if (p == "bf16") return models::Precision::BF16;
  if (p == "fp16") return models::Precision::F16;
  DPT_CHECK(p == "fp32", "train.precision = {}", p);
  return models::Precision::F32;
}

}  // namespace dpt::trainer
