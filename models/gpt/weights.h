// models/gpt/weights.h: a GPT's weights in other programs' layouts, both ways: nanoGPT's state_dict (our own
// names: transformer.*, nn.Linear [out, in], lm_head.weight tied to wte) and Hugging Face's GPT2LMHeadModel
// (no "transformer." prefix on the hub's model.safetensors, Conv1D projection weights [in, out], causal-mask
// buffers), and the config.json that GPT2LMHeadModel.from_pretrained reads beside it. Reading and writing files
// and building the model are the trainer's (trainer/build_model.h: load_pretrained; trainer/gpt_checkpoint.h).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/gpt/gpt.h"
#include "models/model.h"

namespace dpt::models {

// Layouts a GPT's weights can be written in for other programs (gpt_export_weights).
enum class GptLayout {
  NanoGpt,      // nanoGPT's state_dict: transformer.* names, nn.Linear [out, in], lm_head.weight (a copy of wte)
  HuggingFace,  // the hub's GPT-2 model.safetensors: no "transformer." prefix, Conv1D weights [in, out], no lm_head
};
GptLayout parse_gpt_layout(const std::string& name);  // "nanogpt" | "hf"; ConfigError otherwise

// A GPT's weights as this model names and lays them out (nanoGPT's), from `tensors` (a file's, `path` names it in
// errors) in nanoGPT's or Hugging Face's GPT2LMHeadModel layout: names with or without the "transformer." prefix;
// the four projection weights of each block transposed when they come from HF's Conv1D ([in, out], recognised by
// c_attn's [C, 3C] shape); HF's causal-mask buffers (attn.bias, attn.masked_bias) dropped; lm_head.weight dropped
// when it equals transformer.wte.weight (the tie), a ConfigError otherwise; wte of vocab_size rows padded with 0
// to the model's (padded_vocab); wpe of more positions than block_size cut to its first block_size (nanoGPT's
// crop_block_size). `layout` gets "nanoGPT layout" or "Hugging Face layout", and the crop when there was one. A Llama's
// names (model.embed_tokens.weight) are a ConfigError saying model.name = llama.
std::vector<NamedTensor> gpt_import_weights(const std::vector<NamedTensor>& tensors, const std::string& path,
                                            const GptOptions& o, std::string* layout);

// For model.init_from's errors: this GPT's tensor `name` as a file whose tensors are `file_names` names it, with
// dptrain's name beside it: "h.0.ln_1.weight (dptrain's transformer.h.0.ln_1.weight)" when the file has the hub's
// names without "transformer." (wte.weight, h.0.*), else `name` as it is.
std::string gpt_file_name(const std::vector<std::string>& file_names, const std::string& name);

// A GPT's weights (host tensors, float32) in `layout`, wte cut to the real vocabulary (vocab_size rows): loads
// into nanoGPT's GPT(strict) or transformers' GPT2LMHeadModel.from_pretrained, and back through
// gpt_import_weights. ConfigError when `model` is not a GPT.
std::vector<NamedTensor> gpt_export_weights(const Model& model, GptLayout layout);

// The options a Hugging Face GPT-2 config.json gives (GPT2Config, model_type gpt2; `source` names it in errors):
// n_layer, n_head, n_embd, vocab_size, and n_positions as block_size (the rows of wpe), GPT2Config's defaults for the
// ones it leaves out. ConfigError, naming the key, for what dptrain's GPT does not compute: another model_type (a
// Llama family's says model.name = llama), n_inner other than null or 4 n_embd, activation_function other than
// gelu_new (or gelu_pytorch_tanh, the same function), layer_norm_epsilon other than 1e-5, scale_attn_weights false,
// scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn true, tie_word_embeddings false, quantization_config,
// auto_map, and any key that is neither GPT2Config's nor one of PretrainedConfig's that leave the arithmetic alone.
// Dropout (resid_pdrop, embd_pdrop, attn_pdrop) is accepted: it acts in training only, where dptrain has none.
GptOptions parse_hf_gpt2_config(const std::string& json_text, const std::string& source);

// Hugging Face's config.json for a GPT of options `o` (transformers' GPT2Config, model_type gpt2,
// GPT2LMHeadModel): the sizes (n_positions = n_ctx = block_size, vocab_size the real vocabulary, n_inner 4 n_embd),
// activation_function gelu_new (GELU(tanh), this GPT's), layer_norm_epsilon kGptLayerNormEps, no dropout, the head
// tied to wte, and <|endoftext|> (50256) as bos and eos for GPT-2's vocabulary of 50257 (none for another).
// Indented JSON text, ending in a newline.
std::string gpt_hf_config_json(const GptOptions& o);

}  // namespace dpt::models
