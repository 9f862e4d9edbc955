// data/tokenizer.cpp: ByteTokenizer and load_tokenizer (see tokenizer.h).
#include "data/tokenizer.h"

#include <system_error>

#include "core/check.h"
#include "data/bpe.h"

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

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir) {
  std::error_code ec;
  const std::filesystem::path vocab = dir / kBpeVocabFile, merges = dir / kBpeMergesFile;
  const bool has_vocab = std::filesystem::exists(vocab, ec), has_merges = std::filesystem::exists(merges, ec);
  if (has_vocab && has_merges) return std::make_unique<Gpt2Bpe>(vocab, merges);
  if (has_vocab || has_merges) {
    DPT_THROW(ConfigError, "{} holds {} but no {}: GPT-2 BPE needs both", dir.string(),
              has_vocab ? kBpeVocabFile : kBpeMergesFile, has_vocab ? kBpeMergesFile : kBpeVocabFile);
  }
  return std::make_unique<ByteTokenizer>();
}

}  // namespace dpt::data
