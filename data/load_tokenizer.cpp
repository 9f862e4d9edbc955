// data/load_tokenizer.cpp: bytes, GPT-2 BPE or a tokenizer.json, from what a directory holds (see load_tokenizer.h).
#include "data/load_tokenizer.h"

#include "core/check.h"
#include "data/bpe.h"

namespace dpt::data {

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir / kHfTokenizerFile, ec)) return std::make_unique<Gpt2Bpe>(dir / kHfTokenizerFile);
  const std::filesystem::path vocab = dir / kBpeVocabFile, merges = dir / kBpeMergesFile;
  const bool has_vocab = std::filesystem::exists(vocab, ec), has_merges = std::filesystem::exists(merges, ec);
  if (has_vocab && has_merges) return std::make_unique<Gpt2Bpe>(vocab, merges);
  if (has_vocab || has_merges) {
    DPT_THROW(ConfigError, "{} holds {} but no {}: GPT-2 BPE needs both", dir.string(),
              has_vocab ? kBpeVocabFile : kBpeMergesFile, has_vocab ? kBpeMergesFile : kBpeVocabFile);
  }
  return std::make_unique<ByteTokenizer>();
}

std::unique_ptr<Tokenizer> open_tokenizer(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return std::make_unique<Gpt2Bpe>(path);
  if (!std::filesystem::is_directory(path, ec))
    DPT_THROW(ConfigError, "tokenizer {}: no such file or directory", path.string());
  const std::filesystem::path vocab = path / kBpeVocabFile, merges = path / kBpeMergesFile;
  if (!std::filesystem::exists(path / kHfTokenizerFile, ec) && !std::filesystem::exists(vocab, ec) &&
      !std::filesystem::exists(merges, ec))
    DPT_THROW(ConfigError, "tokenizer {}: the directory holds no {}, and no {} with {}", path.string(),
              kHfTokenizerFile, kBpeVocabFile, kBpeMergesFile);
  return load_tokenizer(path);
}

}  // namespace dpt::data
