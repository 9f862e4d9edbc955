// models/llama/hf.cpp: a Llama's config.json and weights as Hugging Face has them (see hf.h).
#include "models/llama/hf.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "models/hf_config.h"

namespace dpt::models {
namespace {

using nlohmann::json;

using hf::bool_key;
using hf::get;
using hf::number_key;
using hf::size_key;

// PretrainedConfig's keys that leave the network's arithmetic alone (hf::pretrained_config_keys), and the families'
// own: Llama's pretraining_tp, nanotron's is_llama_config (SmolLM2's configs: a marker transformers ignores), and the
// sliding-window sizes that only matter when a window is on (checked separately).
const std::set<std::string>& harmless_keys() {
  static const std::set<std::string> keys = [] {
    std::set<std::string> k = hf::pretrained_config_keys();
    k.insert({"pretraining_tp",  // Llama's: splits its matmuls into slices, the same sums
              "is_llama_config",
              "max_window_layers", "sliding_window", "use_sliding_window", "layer_types", "use_mrope"});  // below
    return k;
  }();
  return keys;
}

int64_t token_id(const json& j, const char* key) {
  const json* v = get(j, key);
  if (v && v->is_number_integer()) return v->get<int64_t>();
  if (v && v->is_array() && !v->empty() && (*v)[0].is_number_integer()) return (*v)[0].get<int64_t>();  // Llama 3.1
  return -1;
}

// rope_scaling (or transformers 5's rope_parameters) into o's scaling; its rope_theta too when it carries one.
void read_rope(const json& j, LlamaOptions& o, const std::string& source) {
  const json* r = get(j, "rope_parameters");
  const char* name = "rope_parameters";
  if (!r) {
    r = get(j, "rope_scaling");
    name = "rope_scaling";
  }
  if (!r) return;
  if (!r->is_object()) DPT_THROW(ConfigError, "{}: {} = {} must be an object or null", source, name, r->dump());
  const auto text = [](const json* t) { return t ? t->is_string() ? t->get<std::string>() : t->dump() : ""; };
  const json* rope_type = get(*r, "rope_type");
  const json* old_type = get(*r, "type");
  // transformers 4.45 copies the older "type" over "rope_type" when both are there; a config whose two say different
  // things is refused rather than read either way.
  if (rope_type && old_type && *rope_type != *old_type)
    DPT_THROW(ConfigError, "{}: {} has rope_type {} and type {}, which disagree (transformers 4.45 takes type, others "
              "rope_type): give one", source, name, rope_type->dump(), old_type->dump());
  const std::string type = rope_type ? text(rope_type) : old_type ? text(old_type) : "default";
  o.rope_theta = number_key(*r, "rope_theta", o.rope_theta, source);
  if (type == "default") return;
  if (type != "llama3")
    DPT_THROW(ConfigError, "{}: {} type '{}' is not one dptrain computes (it reads none, default and llama3)", source,
              name, type);
  // Each of llama3's numbers must be there: transformers refuses the config without one (a KeyError), and a default
  // filled in here would be a model nobody trained.
  const auto required = [&](const char* key) {
    const json* v = get(*r, key);
    if (!v)
      DPT_THROW(ConfigError, "{}: {} of type llama3 lacks {} (it needs factor, low_freq_factor, high_freq_factor and "
                "original_max_position_embeddings)", source, name, key);
    if (!v->is_number()) DPT_THROW(ConfigError, "{}: {}'s {} = {} must be a number", source, name, key, v->dump());
    return v->get<double>();
  };
  o.rope_scaling.type = "llama3";
  o.rope_scaling.factor = required("factor");
  o.rope_scaling.low_freq_factor = required("low_freq_factor");
  o.rope_scaling.high_freq_factor = required("high_freq_factor");
  const double original = required("original_max_position_embeddings");
  if (original < 1 || original != static_cast<double>(static_cast<int64_t>(original)))
    DPT_THROW(ConfigError, "{}: {}'s original_max_position_embeddings = {} must be a positive integer", source, name,
              get(*r, "original_max_position_embeddings")->dump());
  o.rope_scaling.original_max_position_embeddings = static_cast<int64_t>(original);
}

// ConfigError for a config.json whose sliding-window attention would be on for some sequence the model takes.
void refuse_sliding_window(const json& j, const std::string& type, int64_t max_positions, const std::string& source) {
  if (type == "qwen2" && bool_key(j, "use_sliding_window", false, source))
    DPT_THROW(ConfigError, "{}: use_sliding_window = true: dptrain's attention is over the whole causal window", source);
  if (type == "mistral") {
    // MistralConfig's default window, when the key is absent, is 4096.
    const json* w = get(j, "sliding_window");
    const bool absent = j.find("sliding_window") == j.end();
    if ((w && (!w->is_number_integer() || w->get<int64_t>() < max_positions)) || (absent && max_positions > 4096))
      DPT_THROW(ConfigError, "{}: sliding_window = {} below max_position_embeddings {}: dptrain's attention is over "
                "the whole causal window", source, w ? w->dump() : "4096 (MistralConfig's default)", max_positions);
  }
  if (bool_key(j, "use_mrope", false, source))
    DPT_THROW(ConfigError, "{}: use_mrope = true (multimodal rotary embeddings): dptrain's RoPE is one-dimensional",
              source);
  if (const json* layers = get(j, "layer_types"); layers && layers->is_array())
    for (const json& l : *layers)
      if (!l.is_string() || l.get<std::string>() != "full_attention")
        DPT_THROW(ConfigError, "{}: layer_types holds {}: dptrain's layers are all full attention", source, l.dump());
}

}  // namespace

HfLlamaConfig parse_hf_llama_config(const std::string& json_text, const std::string& source) {
  const json j = hf::parse_object(json_text, source);
  HfLlamaConfig c;
  const json* type = get(j, "model_type");
  c.model_type = type && type->is_string() ? type->get<std::string>() : "";
  if (c.model_type == "gpt2")
    DPT_THROW(ConfigError, "{}: model_type 'gpt2' is GPT-2, not a model of the Llama family: set model.name = gpt "
              "(model.name = llama reads the config.json of llama, qwen2 and mistral)", source);
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "mistral")
    DPT_THROW(ConfigError, "{}: model_type '{}' is not one of the Llama family's dptrain builds (llama, qwen2, "
              "mistral)", source, c.model_type);
  static const std::set<std::string> read{
      "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
      "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
      "vocab_size", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "attention_dropout",
      "rope_interleaved"};
  hf::refuse_unread_keys(j, read, harmless_keys(), source);
  LlamaOptions& o = c.options;
  o.n_embd = size_key(j, "hidden_size", source);
  o.intermediate_size = size_key(j, "intermediate_size", source);
  o.n_layer = size_key(j, "num_hidden_layers", source);
  o.n_head = size_key(j, "num_attention_heads", source);
  o.n_kv_head = get(j, "num_key_value_heads") ? size_key(j, "num_key_value_heads", source) : o.n_head;
  o.head_dim = get(j, "head_dim") ? size_key(j, "head_dim", source) : o.n_embd / o.n_head;
  o.vocab_size = size_key(j, "vocab_size", source);
  o.max_positions = size_key(j, "max_position_embeddings", source);
  o.rms_norm_eps = number_key(j, "rms_norm_eps", 1e-6, source);
  o.rope_theta = number_key(j, "rope_theta", 10000.0, source);
  read_rope(j, o, source);
  o.tie_embeddings = bool_key(j, "tie_word_embeddings", false, source);  // LlamaConfig's, Qwen2Config's default
  if (c.model_type == "qwen2") {
    o.qkv_bias = true;  // Qwen2Attention: q, k, v with bias, o_proj without
  } else {
    o.qkv_bias = o.o_bias = bool_key(j, "attention_bias", false, source);
  }
  o.mlp_bias = bool_key(j, "mlp_bias", false, source);
  if (const json* act = get(j, "hidden_act"); act && (!act->is_string() || act->get<std::string>() != "silu"))
    DPT_THROW(ConfigError, "{}: hidden_act = {}: dptrain's Llama MLP is SwiGLU (silu)", source, act->dump());
  // nanotron's converter (SmolLM2's config.json) writes rope_interleaved: false is the rotate_half RoPE transformers
  // and dptrain compute (transformers ignores the key); true would pair adjacent elements instead.
  if (bool_key(j, "rope_interleaved", false, source))
    DPT_THROW(ConfigError, "{}: rope_interleaved = true: dptrain's RoPE is Hugging Face's rotate_half form (the two "
              "halves of each head paired), not the interleaved one", source);
  if (number_key(j, "attention_dropout", 0.0, source) != 0.0)
    DPT_THROW(ConfigError, "{}: attention_dropout = {}: dptrain's Llama has no dropout", source,
              get(j, "attention_dropout")->dump());
  refuse_sliding_window(j, c.model_type, o.max_positions, source);
  c.bos_token_id = token_id(j, "bos_token_id");
  c.eos_token_id = token_id(j, "eos_token_id");
  check_llama_options(o);
  return c;
}

std::string llama_hf_config_json(const LlamaOptions& o, int64_t max_positions, int64_t bos_token_id,
                                 int64_t eos_token_id) {
  // Qwen2ForCausalLM: biases on q, k and v only, head_dim = hidden_size / heads (Qwen2Config has no head_dim); its
  // rotary embedding reads rope_scaling as Llama's does (transformers 4.45: llama3 included).
  const bool qwen2 = o.qkv_bias && !o.o_bias && !o.mlp_bias && o.head_dim * o.n_head == o.n_embd;
  if (o.qkv_bias != o.o_bias && !qwen2)
    DPT_THROW(ConfigError, "a Llama with biases on {} but not on {}{}{}: no Hugging Face class builds that (Llama's "
              "attention_bias puts them on all four projections, Qwen2's on q, k and v with head_dim = hidden_size / "
              "heads and no MLP biases)", o.qkv_bias ? "q, k, v" : "o_proj", o.qkv_bias ? "o_proj" : "q, k, v",
              o.mlp_bias ? " and MLP biases" : "",
              o.qkv_bias && o.head_dim * o.n_head != o.n_embd
                  ? fmt::format(", head_dim {} x {} heads != hidden_size {}", o.head_dim, o.n_head, o.n_embd)
                  : "");
  const auto id = [](int64_t v) { return v >= 0 ? json(v) : json(nullptr); };
  json config = {
      {"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", qwen2 ? "qwen2" : "llama"},
      {"hidden_size", o.n_embd},
      {"intermediate_size", o.intermediate_size},
      {"num_hidden_layers", o.n_layer},
      {"num_attention_heads", o.n_head},
      {"num_key_value_heads", o.n_kv_head},
      {"max_position_embeddings", max_positions},
      {"vocab_size", o.vocab_size},
      {"rms_norm_eps", o.rms_norm_eps},
      {"rope_theta", o.rope_theta},
      {"tie_word_embeddings", o.tie_embeddings},
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
      {"initializer_range", o.initializer_range},
      {"bos_token_id", id(bos_token_id)},
      {"eos_token_id", id(eos_token_id)},
      {"torch_dtype", "float32"},
      {"use_cache", true},
  };
  if (!qwen2) {
    config["head_dim"] = o.head_dim;
    config["attention_bias"] = o.qkv_bias;
    config["mlp_bias"] = o.mlp_bias;
    config["pretraining_tp"] = 1;
  } else {
    config["use_sliding_window"] = false;
  }
  if (o.rope_scaling.type == "llama3")
    config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", o.rope_scaling.factor},
                              {"low_freq_factor", o.rope_scaling.low_freq_factor},
                              {"high_freq_factor", o.rope_scaling.high_freq_factor},
                              {"original_max_position_embeddings", o.rope_scaling.original_max_position_embeddings}};
  else
    config["rope_scaling"] = nullptr;
  return config.dump(2) + "\n";
}

std::vector<NamedTensor> llama_import_weights(const std::vector<NamedTensor>& tensors, const std::string& path,
                                              const LlamaOptions& o, std::string* layout) {
  *layout = "Hugging Face layout";
  std::vector<NamedTensor> out;
  const Tensor* head = nullptr;
  const Tensor* embed = nullptr;
  for (const auto& nt : tensors)
    if (nt.name == "wte.weight" || nt.name == "transformer.wte.weight")
      DPT_THROW(ConfigError, "model.init_from {}: {} is GPT-2's token embedding (nanoGPT's or GPT2LMHeadModel's "
                "names), not a Llama's: set model.name = gpt", path, nt.name);
  for (const auto& nt : tensors) {
    if (nt.name.ends_with(".rotary_emb.inv_freq")) continue;  // a buffer older transformers saved: recomputed here
    if (nt.name == "model.embed_tokens.weight") embed = &nt.tensor;
    if (nt.name == "lm_head.weight" && o.tie_embeddings) {
      head = &nt.tensor;
      continue;
    }
    out.push_back(nt);
  }
  if (head && (!embed || embed->shape() != head->shape() || embed->dtype() != head->dtype() ||
               std::memcmp(embed->raw(), head->raw(), head->bytes()) != 0))
    DPT_THROW(ConfigError, "model.init_from {}: lm_head.weight differs from model.embed_tokens.weight, but the model "
              "ties its head to the embedding (tie_word_embeddings / model.tie_embeddings)", path);
  return out;
}

std::vector<NamedTensor> llama_export_weights(const Model& model) {
  if (!dynamic_cast<const Llama*>(&model.root()))
    DPT_THROW(ConfigError, "{} is not a Llama: only a Llama's weights export in LlamaForCausalLM's layout",
              model.summary());
  std::vector<NamedTensor> out;
  for (const auto& nt : model.state())
    if (nt.tensor.dtype() == DType::F32) out.push_back({nt.name, nt.tensor.to(Device::cpu())});
  return out;
}

}  // namespace dpt::models
