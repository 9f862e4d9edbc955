// models/gpt/weights.cpp: a GPT's weights from and to nanoGPT's and Hugging Face's layouts (see weights.h).
#include "models/gpt/weights.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "models/hf_config.h"

namespace dpt::models {
namespace {

bool ends_with(const std::string& s, const std::string& tail) { return s.size() >= tail.size() && s.ends_with(tail); }

// The projection weights that Hugging Face's Conv1D stores [in, out], transposed from nn.Linear's [out, in].
bool is_conv1d_weight(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

// A Conv1D weight's shape in Hugging Face's layout, [in, out], for a GPT n_embd wide (an MLP 4 n_embd wide).
std::vector<int64_t> conv1d_shape(const std::string& name, int64_t n_embd) {
  if (ends_with(name, ".attn.c_attn.weight")) return {n_embd, 3 * n_embd};
  if (ends_with(name, ".attn.c_proj.weight")) return {n_embd, n_embd};
  if (ends_with(name, ".mlp.c_fc.weight")) return {n_embd, 4 * n_embd};
  return {4 * n_embd, n_embd};  // .mlp.c_proj.weight
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

// A name of Hugging Face's GPT2LMHeadModel without its "transformer." prefix, as the hub's files have them.
bool hf_top_name(const std::string& n) {
  return n.starts_with("wte.") || n.starts_with("wpe.") || n.starts_with("h.") || n.starts_with("ln_f.");
}

// The tensor of `tensors` named `name`, or nullptr.
const Tensor* find(const std::vector<NamedTensor>& tensors, const std::string& name) {
  for (const auto& nt : tensors)
    if (nt.name == name) return &nt.tensor;
  return nullptr;
}

}  // namespace

GptLayout parse_gpt_layout(const std::string& name) {
  if (name == "nanogpt") return GptLayout::NanoGpt;
  if (name == "hf") return GptLayout::HuggingFace;
  DPT_THROW(ConfigError, "weight layout '{}': nanogpt or hf", name);
}

std::vector<NamedTensor> gpt_import_weights(const std::vector<NamedTensor>& tensors, const std::string& path,
                                            const GptOptions& o, std::string* layout) {
  // Hugging Face's names without the prefix (the hub's files) get it; any other name stays the file's, so that an
  // error names what the file holds.
  auto full = [](const std::string& n) { return hf_top_name(n) ? "transformer." + n : n; };
  for (const auto& nt : tensors)
    if (nt.name == "model.embed_tokens.weight")
      DPT_THROW(ConfigError, "model.init_from {}: {} is the token embedding of a Llama family's model "
                "(LlamaForCausalLM's, Qwen2ForCausalLM's names), not GPT-2's: set model.name = llama", path, nt.name);
  const int64_t n_embd = o.n_embd;
  const Tensor* c_attn = nullptr;
  for (const auto& nt : tensors)
    if (full(nt.name) == "transformer.h.0.attn.c_attn.weight") c_attn = &nt.tensor;
  const bool hf = c_attn && c_attn->ndim() == 2 && c_attn->dim(0) == n_embd && c_attn->dim(1) == 3 * n_embd;
  *layout = hf ? "Hugging Face layout" : "nanoGPT layout";
  std::vector<NamedTensor> out;
  const Tensor* head = nullptr;
  for (const auto& nt : tensors) {
    const std::string name = full(nt.name);
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;  // HF's mask buffers
    if (name == "lm_head.weight") {
      head = &nt.tensor;
      continue;
    }
    const bool f32_matrix = nt.tensor.ndim() == 2 && nt.tensor.dtype() == DType::F32;
    if (hf && is_conv1d_weight(name)) {
      // Checked in the file's terms (Conv1D's [in, out]), before the transpose would make the shape dptrain's.
      const std::vector<int64_t> want = conv1d_shape(name, n_embd);
      if (!f32_matrix || nt.tensor.shape() != want)
        DPT_THROW(ConfigError, "model.init_from {}: {} is {} {}, this model expects float32 [{}] (Hugging Face's "
                  "Conv1D layout, [in, out])", path, nt.name, dtype_name(nt.tensor.dtype()), nt.tensor.shape_str(),
                  fmt::join(want, ", "));
      out.push_back({name, transposed(nt.tensor)});
    } else if (name == "transformer.wte.weight" && f32_matrix && nt.tensor.dim(0) != o.vocab_size &&
               nt.tensor.dim(0) != models::padded_vocab(o)) {
      // Said in the vocabulary's terms: the load would name the padded shape the model holds, not vocab_size.
      DPT_THROW(ConfigError, "model.init_from {}: {} has {} rows (tokens), but the model's vocab_size is {} "
                "(model.vocab_size, or config.json's vocab_size): not this model's vocabulary", path, nt.name,
                nt.tensor.dim(0), o.vocab_size);
    } else if (name == "transformer.wte.weight" && f32_matrix && nt.tensor.dim(0) == o.vocab_size &&
               models::padded_vocab(o) != o.vocab_size) {
      out.push_back({name, with_rows(nt.tensor, models::padded_vocab(o))});  // the real vocabulary: pad
    } else if (name == "transformer.wpe.weight" && f32_matrix && nt.tensor.dim(0) > o.block_size &&
               nt.tensor.dim(1) == n_embd) {
      // A shorter context than the file's: its first block_size positions, as nanoGPT's crop_block_size.
      *layout += fmt::format(", {} cropped to its first {} of {} positions (model.block_size)", nt.name,
                             o.block_size, nt.tensor.dim(0));
      out.push_back({name, with_rows(nt.tensor, o.block_size)});
    } else {
      out.push_back({name, nt.tensor});
    }
  }
  if (head) {
    const Tensor* wte = find(tensors, "transformer.wte.weight");
    if (!wte) wte = find(tensors, "wte.weight");
    if (!wte || wte->shape() != head->shape() || std::memcmp(wte->raw(), head->raw(), head->bytes()) != 0)
      DPT_THROW(ConfigError, "model.init_from {}: lm_head.weight differs from transformer.wte.weight: this GPT ties "
                "its head to the token embedding", path);
  }
  return out;
}

std::string gpt_file_name(const std::vector<std::string>& file_names, const std::string& name) {
  const std::string prefix = "transformer.";
  if (!name.starts_with(prefix) || !std::any_of(file_names.begin(), file_names.end(), hf_top_name)) return name;
  return fmt::format("{} (dptrain's {})", name.substr(prefix.size()), name);
}

std::vector<NamedTensor> gpt_export_weights(const Model& model, GptLayout layout) {
  const auto* gpt = dynamic_cast<const Gpt*>(&model.root());
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

GptOptions parse_hf_gpt2_config(const std::string& json_text, const std::string& source) {
  using nlohmann::json;
  const json j = hf::parse_object(json_text, source);
  const json* type = hf::get(j, "model_type");
  const std::string model_type = type && type->is_string() ? type->get<std::string>() : "";
  if (model_type == "llama" || model_type == "qwen2" || model_type == "mistral")
    DPT_THROW(ConfigError, "{}: model_type '{}' is a model of the Llama family, not GPT-2: set model.name = llama "
              "(model.name = gpt reads GPT-2's config.json, model_type gpt2)", source, model_type);
  if (model_type != "gpt2")
    DPT_THROW(ConfigError, "{}: model_type '{}' is not GPT-2 (gpt2), the one model.name = gpt builds", source,
              model_type);
  // GPT2Config's keys that dptrain reads or checks below; its summary_* keys configure the heads of
  // GPT2DoubleHeadsModel and GPT2ForSequenceClassification, not the LM head; n_ctx is a key of older configs that
  // transformers no longer reads (n_positions is the context); dropout acts in training only, and dptrain's GPT trains
  // without it (nanoGPT's fine-tuning default too), so the hub's 0.1 is accepted; _num_labels and
  // gradient_checkpointing are older configs' switches with no effect on the arithmetic.
  static const std::set<std::string> read{
      "n_layer", "n_head", "n_embd", "vocab_size", "n_positions", "n_inner", "activation_function",
      "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
      "tie_word_embeddings", "resid_pdrop", "embd_pdrop", "attn_pdrop", "n_ctx", "summary_type", "summary_use_proj",
      "summary_activation", "summary_proj_to_labels", "summary_first_dropout", "_num_labels",
      "gradient_checkpointing"};
  hf::refuse_unread_keys(j, read, hf::pretrained_config_keys(), source);
  // GPT2Config's defaults for the keys a config.json may leave out (GPT-2 124M's sizes).
  const auto size_or = [&](const char* key, int64_t fallback) {
    return hf::get(j, key) ? hf::size_key(j, key, source) : fallback;
  };
  GptOptions o;
  o.n_layer = size_or("n_layer", 12);
  o.n_head = size_or("n_head", 12);
  o.n_embd = size_or("n_embd", 768);
  o.vocab_size = size_or("vocab_size", 50257);
  o.block_size = size_or("n_positions", 1024);
  if (const json* inner = hf::get(j, "n_inner"); inner && (!inner->is_number_integer() ||
                                                            inner->get<int64_t>() != 4 * o.n_embd))
    DPT_THROW(ConfigError, "{}: n_inner = {}: dptrain's GPT MLP is 4 n_embd = {} wide (n_inner null)", source,
              inner->dump(), 4 * o.n_embd);
  // gelu_new is GELU(tanh), gelu_pytorch_tanh the same function through torch's kernel; gelu would be GELU(erf).
  if (const json* act = hf::get(j, "activation_function");
      act && (!act->is_string() || (act->get<std::string>() != "gelu_new" &&
                                    act->get<std::string>() != "gelu_pytorch_tanh")))
    DPT_THROW(ConfigError, "{}: activation_function = {}: dptrain's GPT computes GELU(tanh) (gelu_new) only", source,
              act->dump());
  // The LayerNorms compute in float32, so an epsilon that rounds to the same float is the same arithmetic.
  const double eps = hf::number_key(j, "layer_norm_epsilon", 1e-5, source);
  if (static_cast<float>(eps) != kGptLayerNormEps)
    DPT_THROW(ConfigError, "{}: layer_norm_epsilon = {}: dptrain's GPT LayerNorms use 1e-05 (GPT-2's)", source,
              hf::get(j, "layer_norm_epsilon")->dump());
  if (!hf::bool_key(j, "scale_attn_weights", true, source))
    DPT_THROW(ConfigError, "{}: scale_attn_weights = false: dptrain's GPT scales the attention scores by "
              "1 / sqrt(head size)", source);
  if (hf::bool_key(j, "scale_attn_by_inverse_layer_idx", false, source))
    DPT_THROW(ConfigError, "{}: scale_attn_by_inverse_layer_idx = true: dptrain's GPT does not scale the attention "
              "scores by 1 / (layer + 1)", source);
  if (hf::bool_key(j, "reorder_and_upcast_attn", false, source))
    DPT_THROW(ConfigError, "{}: reorder_and_upcast_attn = true: dptrain's GPT does not compute the attention that "
              "way", source);
  if (!hf::bool_key(j, "tie_word_embeddings", true, source))
    DPT_THROW(ConfigError, "{}: tie_word_embeddings = false: dptrain's GPT ties its LM head to the token embedding "
              "(wte)", source);
  check_gpt_options(o);
  return o;
}

std::string gpt_hf_config_json(const GptOptions& o) {
  // GPT-2's vocabulary ends in <|endoftext|>, its bos and eos; a byte-level or other vocabulary has none (GPT2Config's
  // default of 50256 would name a token that does not exist).
  constexpr int64_t kGpt2Vocab = 50257, kEndOfText = 50256;
  // The epsilon as the decimal it is (the float widened would print as 9.999999747378752e-06).
  constexpr double kLayerNormEps = 1e-5;
  static_assert(static_cast<float>(kLayerNormEps) == kGptLayerNormEps);
  const nlohmann::json end_of_text = o.vocab_size == kGpt2Vocab ? nlohmann::json(kEndOfText) : nlohmann::json(nullptr);
  const nlohmann::json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", o.vocab_size},  // the exported wte's rows (gpt_export_weights), not the padded ones
      {"n_positions", o.block_size},
      {"n_ctx", o.block_size},
      {"n_embd", o.n_embd},
      {"n_layer", o.n_layer},
      {"n_head", o.n_head},
      {"n_inner", nullptr},  // 4 n_embd, as GptMlp
      // Hugging Face's "gelu_new" is GELU(tanh) (NewGELUActivation), our Gelu layer and its kernels; "gelu" would be
      // GELU(erf), a different function.
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", kLayerNormEps},
      {"resid_pdrop", 0.0},  // dptrain's GPT has no dropout
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},  // scores / sqrt(head size)
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", true},  // lm_head is wte
      {"bos_token_id", end_of_text},
      {"eos_token_id", end_of_text},
      {"torch_dtype", "float32"},
  };
  return config.dump(2) + "\n";
}

}  // namespace dpt::models
