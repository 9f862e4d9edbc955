// data/jsonl.cpp: one JSON Lines record (see jsonl.h), read with nlohmann/json.
#include "data/jsonl.h"

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace dpt::data {
namespace {

// nlohmann's message without its "[json.exception.parse_error.101] " tag.
std::string json_message(const nlohmann::json::exception& e) {
  std::string m = e.what();
  if (m.starts_with("[json.exception.")) {
    const size_t close = m.find("] ");
    if (close != std::string::npos) m.erase(0, close + 2);
  }
  return m;
}

std::string string_value(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j[key];
  if (!v.is_string())
    DPT_THROW(ConfigError, "\"{}\" is {}, not a string", key, v.is_null() ? "null" : v.type_name());
  return v.get<std::string>();
}

// parse_jsonl_record, or with `completion_optional` also {"prompt": ...} alone (text then empty).
std::optional<JsonlRecord> parse_record(std::string_view line, bool completion_optional) {
  if (line.find_first_not_of(" \t\r\n") == std::string_view::npos) return std::nullopt;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    DPT_THROW(ConfigError, "not JSON: {}", json_message(e));
  }
  if (!j.is_object()) DPT_THROW(ConfigError, "a record is a JSON object, got {}", j.type_name());
  const bool text = j.contains("text"), prompt = j.contains("prompt"), completion = j.contains("completion");
  if (text && (prompt || completion))
    DPT_THROW(ConfigError, "a record has \"text\", or \"prompt\" and \"completion\", not both kinds");
  JsonlRecord r;
  if (text) {
    r.text = string_value(j, "text");
    return r;
  }
  if (prompt != completion && !(completion_optional && prompt))
    DPT_THROW(ConfigError, "\"{}\" without \"{}\"", prompt ? "prompt" : "completion", prompt ? "completion" : "prompt");
  if (prompt) {
    r.prompt = string_value(j, "prompt");
    if (completion) r.text = string_value(j, "completion");
    return r;
  }
  if (j.contains("messages"))
    DPT_THROW(ConfigError, "a chat record (\"messages\") is not read: write it as \"prompt\" and \"completion\" "
              "in the model's chat format");
  std::string keys;
  for (const auto& [key, value] : j.items()) keys += (keys.empty() ? "" : ", ") + nlohmann::json(key).dump();
  DPT_THROW(ConfigError, "no \"text\" and no \"prompt\"/\"completion\" (the record has {})",
            keys.empty() ? "no keys" : keys);
}

}  // namespace

std::optional<JsonlRecord> parse_jsonl_record(std::string_view line) { return parse_record(line, false); }

std::optional<std::string> parse_jsonl_prompt(std::string_view line) {
  std::optional<JsonlRecord> r = parse_record(line, true);
  if (!r) return std::nullopt;
  if (!r->prompt)
    DPT_THROW(ConfigError, "a {{\"text\": ...}} record holds no prompt: a prompt record is {{\"prompt\": ...}} (a "
              "\"completion\" beside it is ignored)");
  if (r->prompt->empty()) DPT_THROW(ConfigError, "an empty \"prompt\" (the text starts from the prompt's tokens)");
  return std::move(r->prompt);
}

}  // namespace dpt::data
