// models/llama/hf.h: a Llama as Hugging Face ships it, both ways: the config.json that LlamaForCausalLM,
// Qwen2ForCausalLM or MistralForCausalLM reads, and the weights in their names (which are this model's own names:
// models/llama/llama.h). Reading and writing files and building the model are the trainer's
// (trainer/model_registry.cpp, trainer/build_model.h: load_pretrained; trainer/gpt_checkpoint.h: export_weights).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/llama/llama.h"
#include "models/model.h"

namespace dpt::models {

// What a config.json says: the options (max_positions = max_position_embeddings) and the ids of its special tokens
// (-1: none; an export does not carry them yet: its config.json says null).
struct HfLlamaConfig {
  LlamaOptions options;
  std::string model_type;  // llama | qwen2 | mistral
  int64_t bos_token_id = -1, eos_token_id = -1;
};

// Parses config.json's text (`source` names it in errors). Reads model_type llama, qwen2 or mistral (gpt2: an error
// saying model.name = gpt) and the keys that make the arithmetic: hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_theta, rope_scaling (none, "default" or
// "llama3" with each of its four numbers; transformers 5's rope_parameters too; "type" and "rope_type" must agree),
// max_position_embeddings, vocab_size, tie_word_embeddings, attention_bias (Llama's: q, k, v and o), mlp_bias;
// Qwen2's q/k/v biases; SmolLM2's is_llama_config (a marker) and rope_interleaved = false (the RoPE computed here).
// ConfigError, naming the key: a missing size, hidden_act other than silu, rope_interleaved = true, a nonzero
// attention_dropout, a sliding window (Qwen2's use_sliding_window, Mistral's sliding_window below
// max_position_embeddings, 4096 when absent), use_mrope = true, quantization_config, auto_map (custom code), another
// rope type or an incomplete llama3 one, and any key that is neither read here nor one of PretrainedConfig's that
// leave the network's arithmetic alone (names, ids, dtypes, generation defaults): what it would change cannot be
// known, so it is not ignored.
HfLlamaConfig parse_hf_llama_config(const std::string& json_text, const std::string& source);

// LlamaForCausalLM's config.json for `o` (Qwen2ForCausalLM's when the biases are Qwen2's: q, k, v only, and
// head_dim = n_embd / n_head; rope_scaling either way), with max_position_embeddings `max_positions` and the special
// token ids (-1: null). Indented JSON text ending in a newline. ConfigError for biases no Hugging Face class builds.
std::string llama_hf_config_json(const LlamaOptions& o, int64_t max_positions, int64_t bos_token_id = -1,
                                 int64_t eos_token_id = -1);

// A Hugging Face folder's tensors (`path` names them in errors) as this model's: the names are the same; rotary
// inv_freq buffers that older checkpoints saved are dropped (the tables are computed from the options); lm_head.weight
// of a tied model is dropped when it equals model.embed_tokens.weight (what the tie means), ConfigError otherwise.
// `layout` gets "Hugging Face layout". GPT-2's names (wte.weight, transformer.wte.weight) are a ConfigError saying
// model.name = gpt.
std::vector<NamedTensor> llama_import_weights(const std::vector<NamedTensor>& tensors, const std::string& path,
                                              const LlamaOptions& o, std::string* layout);

// The model's weights as host float32 tensors in LlamaForCausalLM's names (no lm_head.weight when tied, as
// save_pretrained writes a tied model). ConfigError when `model` is not a Llama.
std::vector<NamedTensor> llama_export_weights(const Model& model);

}  // namespace dpt::models
