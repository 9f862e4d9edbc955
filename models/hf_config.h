// models/hf_config.h: what the readers of a Hugging Face config.json share (models/gpt/weights.cpp: GPT-2's;
// models/llama/hf.cpp: the Llama family's): PretrainedConfig's keys that leave a network's arithmetic alone, and reads
// of one key whose ConfigError names the file and the key.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace dpt::models::hf {

// PretrainedConfig's keys that leave the network's arithmetic alone: names, versions, token ids, dtypes, output
// switches, the generation defaults of older configs. A family adds its own.
const std::set<std::string>& pretrained_config_keys();

// Every key of config.json `j` is in `read` (what the family's reader reads or checks) or `harmless` (keys that leave
// its arithmetic alone: pretrained_config_keys() and the family's own); ConfigError naming the first other key, since
// an unknown key may change the arithmetic (quantization_config and auto_map are named for what they are).
void refuse_unread_keys(const nlohmann::json& j, const std::set<std::string>& read,
                        const std::set<std::string>& harmless, const std::string& source);

// config.json's text parsed (`source` names it in errors): ConfigError when it is not JSON or not an object.
nlohmann::json parse_object(const std::string& json_text, const std::string& source);

// The value of `key`, nullptr when it is absent or null.
const nlohmann::json* get(const nlohmann::json& j, const char* key);
// A positive integer; ConfigError when missing or another value.
int64_t size_key(const nlohmann::json& j, const char* key, const std::string& source);
// A number, `fallback` when absent or null; ConfigError for another value.
double number_key(const nlohmann::json& j, const char* key, double fallback, const std::string& source);
// true or false, `fallback` when absent or null; ConfigError for another value.
bool bool_key(const nlohmann::json& j, const char* key, bool fallback, const std::string& source);

}  // namespace dpt::models::hf
