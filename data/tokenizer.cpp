// data/tokenizer.cpp: ByteTokenizer (see tokenizer.h).
#include "data/tokenizer.h"

#include <system_error>

#include "core/check.h"

namespace dpt::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > 255) DPT_THROW(ConfigError, "token id {} is not a byte (byte-level tokens, vocab 256)", ids[i]);
    text[i] = static_cast<char>(ids[i]);
  }
  return text;
}

std::optional<int32_t> ByteTokenizer::token_id(std::string_view token) const {
  if (token.size() != 1) return std::nullopt;
  return static_cast<uint8_t>(token[0]);
}

}  // namespace dpt::data
