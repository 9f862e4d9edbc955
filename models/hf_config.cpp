// models/hf_config.cpp: reading a Hugging Face config.json (see hf_config.h).
#include "models/hf_config.h"

#include "core/check.h"

namespace dpt::models::hf {

using nlohmann::json;

const std::set<std::string>& pretrained_config_keys() {
  static const std::set<std::string> keys{
      "_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache", "bos_token_id",
      "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "initializer_range", "model_type",
      "tokenizer_class", "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
      "is_encoder_decoder", "is_decoder", "add_cross_attention", "tie_encoder_decoder", "id2label", "label2id",
      "problem_type", "chunk_size_feed_forward", "pruned_heads", "finetuning_task", "prefix", "task_specific_params",
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
      "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
      "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
      "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "cross_attention_hidden_size",
      "_attn_implementation_autoset", "attn_implementation"};
  return keys;
}

void refuse_unread_keys(const json& j, const std::set<std::string>& read, const std::set<std::string>& harmless,
                        const std::string& source) {
  for (const auto& [key, value] : j.items()) {
    if (key == "quantization_config")
      DPT_THROW(ConfigError, "{}: quantization_config: dptrain reads full-precision weights (bf16, fp32), not "
                "quantized ones", source);
    if (key == "auto_map")
      DPT_THROW(ConfigError, "{}: auto_map: the model comes with its own modelling code, which dptrain does not run",
                source);
    if (!read.count(key) && !harmless.count(key))
      DPT_THROW(ConfigError, "{}: key '{}' = {} is not one dptrain reads, and it may change the model's arithmetic: "
                "refused rather than ignored (remove it if it does not)", source, key, value.dump());
  }
}

json parse_object(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    DPT_THROW(ConfigError, "{}: not valid JSON: {}", source, e.what());
  }
  if (!j.is_object()) DPT_THROW(ConfigError, "{}: a config.json holds an object", source);
  return j;
}

const json* get(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t size_key(const json& j, const char* key, const std::string& source) {
  const json* v = get(j, key);
  if (!v) DPT_THROW(ConfigError, "{}: {} is missing", source, key);
  if (!v->is_number_integer() || v->get<int64_t>() < 1)
    DPT_THROW(ConfigError, "{}: {} = {} must be a positive integer", source, key, v->dump());
  return v->get<int64_t>();
}

double number_key(const json& j, const char* key, double fallback, const std::string& source) {
  const json* v = get(j, key);
  if (!v) return fallback;
  if (!v->is_number()) DPT_THROW(ConfigError, "{}: {} = {} must be a number", source, key, v->dump());
  return v->get<double>();
}

bool bool_key(const json& j, const char* key, bool fallback, const std::string& source) {
  const json* v = get(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) DPT_THROW(ConfigError, "{}: {} = {} must be true or false", source, key, v->dump());
  return v->get<bool>();
}

}  // namespace dpt::models::hf
